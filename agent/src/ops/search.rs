//! The search operation: lines matching a regular expression under a
//! directory, found on the agent's search thread and answered in pieces
//! that each fit a frame.

use std::time::{Duration, Instant};

use sandboxd_proto::{Match, Reply, Search};

use super::{Agent, Answer, frame_pieces};

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
            let parts = match_pieces(matches).into_iter().map(Reply::Matches);
            if answer.parts(parts).await {
                answer.last(Reply::Searched(searched)).await
            }
        }
        Err(f) => answer.last(Reply::Error(f)).await,
    }
}

/// Matches in pieces that each fit a frame.
fn match_pieces(matches: Vec<Match>) -> Vec<Vec<Match>> {
    frame_pieces(matches, |m| {
        64 + m.path.len()
            + m.text.len()
            + m.before
                .iter()
                .chain(&m.after)
                .map(|l| l.len() + 8)
                .sum::<usize>()
    })
}
