//! The search operation: lines matching a regular expression under a
//! directory, found on the agent's search thread and answered in pieces
//! that each fit a frame.

use std::time::{Duration, Instant};

use sandboxd_proto::{CHUNK, Match, Reply, Search};

use super::{Agent, Answer};

pub(crate) async fn search(agent: &Agent, s: Search, answer: Answer) {
    // From now, not from when the thread gets to it: searches queued
    // behind one another still answer in time.
    let deadline = Instant::now() + Duration::from_millis(u64::from(s.deadline_ms));
    let r = agent
        .searches
        .call(move |ws| crate::search::search(ws, &s, deadline))
        .await;
    match r {
        Ok((matches, searched)) => {
            for piece in match_pieces(matches) {
                if !answer.part(Reply::Matches(piece)).await {
                    return;
                }
            }
            answer.last(Reply::Searched(searched)).await
        }
        Err(f) => answer.last(Reply::Error(f)).await,
    }
}

/// Matches in pieces that each fit a frame: at most about half a
/// [`CHUNK`] of text per piece.
fn match_pieces(matches: Vec<Match>) -> Vec<Vec<Match>> {
    let mut pieces = Vec::new();
    let mut piece = Vec::new();
    let mut bytes = 0usize;
    for m in matches {
        let weight = 64
            + m.path.len()
            + m.text.len()
            + m.before
                .iter()
                .chain(&m.after)
                .map(|l| l.len() + 8)
                .sum::<usize>();
        if !piece.is_empty() && bytes + weight > CHUNK / 2 {
            pieces.push(std::mem::take(&mut piece));
            bytes = 0;
        }
        bytes += weight;
        piece.push(m);
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}
