//! The operations on commands: start one, end its tree, read its log (and
//! let go of a reader), wait for its end, its tails, what it changed in
//! the workspace, write to its stdin or close it, forget it, list them
//! all. Long answers go in parts that each fit a frame.

use std::cell::RefCell;
use std::collections::HashSet;
use std::time::{Duration, Instant};

use sandboxd_proto::{
    CHUNK, Change, ChangesSummary, Failure, FailureKind, LogChunk, ReadLog, Reply, ShapedPart,
    Spawn, Stream, TailPart,
};

use super::{Agent, Answer, frame_pieces};

/// The (command, follower) pairs read through one connection, let go of
/// when it ends.
pub(crate) type Followers = RefCell<HashSet<(String, u64)>>;

pub(crate) async fn spawn(agent: &Agent, spec: Spawn, answer: Answer) {
    let r = agent
        .commands
        .spawn(spec)
        .await
        .map(|pid| Reply::Spawned { pid });
    answer.result(r).await
}

pub(crate) async fn kill(agent: &Agent, command: String, answer: Answer) {
    match agent.commands.get(&command) {
        Ok(cmd) => {
            cmd.kill().await;
            answer.last(Reply::Ok).await
        }
        Err(f) => answer.last(Reply::Error(f)).await,
    }
}

pub(crate) async fn read_log(agent: &Agent, followers: &Followers, r: ReadLog, answer: Answer) {
    let cmd = match agent.commands.get(&r.command) {
        Ok(c) => c,
        Err(f) => return answer.last(Reply::Error(f)).await,
    };
    followers
        .borrow_mut()
        .insert((r.command.clone(), r.follower));
    let mut changed = cmd.subscribe();
    let deadline = Instant::now() + Duration::from_millis(u64::from(r.wait_ms));
    let chunk = loop {
        changed.borrow_and_update();
        let batch = {
            let mut log = cmd.log.borrow_mut();
            log.follow(r.follower, r.after, Instant::now());
            log.read(
                r.after,
                r.max_bytes as usize,
                r.past_exit,
                cmd.output_closed(),
            )
        };
        cmd.reader_moved();
        if !batch.records.is_empty() || batch.complete || Instant::now() >= deadline {
            break LogChunk {
                records: batch.records,
                complete: batch.complete,
            };
        }
        let _ = tokio::time::timeout_at(deadline.into(), changed.changed()).await;
    };
    answer.last(Reply::Log(chunk)).await
}

pub(crate) async fn unfollow(
    agent: &Agent,
    followers: &Followers,
    command: String,
    follower: u64,
    answer: Answer,
) {
    let_go(agent, &command, follower);
    followers.borrow_mut().remove(&(command, follower));
    answer.last(Reply::Ok).await
}

/// Lets go of every reader of a connection that ended.
pub(crate) fn unfollow_all(agent: &Agent, followers: &Followers) {
    for (command, follower) in followers.take() {
        let_go(agent, &command, follower);
    }
}

/// `follower` no longer reads `command`'s log: output held back for it
/// may flow.
fn let_go(agent: &Agent, command: &str, follower: u64) {
    if let Ok(cmd) = agent.commands.get(command) {
        cmd.log.borrow_mut().unfollow(follower);
        cmd.reader_moved();
    }
}

pub(crate) async fn wait(agent: &Agent, command: String, answer: Answer) {
    let cmd = match agent.commands.get(&command) {
        Ok(c) => c,
        Err(f) => return answer.last(Reply::Error(f)).await,
    };
    let mut changed = cmd.subscribe();
    loop {
        changed.borrow_and_update();
        if let Some(ended) = cmd.ended() {
            return answer.last(Reply::Ended(ended)).await;
        }
        if changed.changed().await.is_err() {
            let f = Failure::new(FailureKind::NoSuchCommand, "the command is gone");
            return answer.last(Reply::Error(f)).await;
        }
    }
}

pub(crate) async fn tail(agent: &Agent, command: String, answer: Answer) {
    let cmd = match agent.commands.get(&command) {
        Ok(c) => c,
        Err(f) => return answer.last(Reply::Error(f)).await,
    };
    let shaped = cmd.log.borrow().shaped();
    for (stream, (text, info)) in [Stream::Stdout, Stream::Stderr]
        .into_iter()
        .zip(shaped.into_iter().flatten())
    {
        let parts = stream_pieces(&text).map(|piece| {
            Reply::Shaped(ShapedPart {
                stream,
                text: piece.to_string(),
                info,
            })
        });
        if !answer.parts(parts).await {
            return;
        }
    }
    let tails = cmd.tails();
    for (stream, (text, cut)) in [Stream::Stdout, Stream::Stderr]
        .into_iter()
        .zip(tails.into_iter().flatten())
    {
        let parts = stream_pieces(&text).map(|piece| {
            Reply::TailPart(TailPart {
                stream,
                text: piece.to_string(),
                cut_bytes: cut,
            })
        });
        if !answer.parts(parts).await {
            return;
        }
    }
    answer.last(Reply::Ok).await
}

pub(crate) async fn changes(agent: &Agent, command: String, answer: Answer) {
    let cmd = match agent.commands.get(&command) {
        Ok(c) => c,
        Err(f) => return answer.last(Reply::Error(f)).await,
    };
    let report = match (cmd.watched(), cmd.changes()) {
        (false, _) => Err(Failure::new(
            FailureKind::NotFound,
            format!("command {command} was started without changes"),
        )),
        (true, None) => Err(Failure::new(
            FailureKind::StillRunning,
            format!("command {command} is still running"),
        )),
        (true, Some(r)) => Ok(r),
    };
    let report = match report {
        Ok(r) => r,
        Err(f) => return answer.last(Reply::Error(f)).await,
    };
    let parts = change_pieces(report.changes)
        .into_iter()
        .map(Reply::ChangesPart);
    if !answer.parts(parts).await {
        return;
    }
    let summary = ChangesSummary {
        more: report.more,
        method: report.method,
        complete: report.complete,
    };
    answer.last(Reply::Changes(summary)).await
}

pub(crate) async fn write_stdin(agent: &Agent, command: String, data: &[u8], answer: Answer) {
    let r = match agent.commands.get(&command) {
        Ok(cmd) => cmd.write_stdin(data).await.map(|()| Reply::Ok),
        Err(f) => Err(f),
    };
    answer.result(r).await
}

pub(crate) async fn close_stdin(agent: &Agent, command: String, answer: Answer) {
    let r = match agent.commands.get(&command) {
        Ok(cmd) => cmd.close_stdin().await.map(|()| Reply::Ok),
        Err(f) => Err(f),
    };
    answer.result(r).await
}

pub(crate) async fn forget(agent: &Agent, command: String, answer: Answer) {
    let r = agent.commands.forget(&command).map(|()| Reply::Ok);
    answer.result(r).await
}

pub(crate) async fn list(agent: &Agent, answer: Answer) {
    answer.last(Reply::Commands(agent.commands.states())).await
}

/// A stream's text in the pieces of its parts. Every stream gets a part,
/// an empty one too: it carries the stream's info or cut.
fn stream_pieces(text: &str) -> impl Iterator<Item = &str> {
    text_chunks(text, CHUNK)
        .into_iter()
        .chain(text.is_empty().then_some(""))
}

/// `text` in pieces of at most `max` bytes, cut at character boundaries.
fn text_chunks(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(max);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            // A character longer than `max` goes whole.
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (piece, tail) = rest.split_at(end);
        out.push(piece);
        rest = tail;
    }
    out
}

/// Changes in pieces that each fit a frame.
fn change_pieces(changes: Vec<Change>) -> Vec<Vec<Change>> {
    frame_pieces(changes, |c| 32 + c.path.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_character_boundaries() {
        assert_eq!(text_chunks("abcdef", 4), ["abcd", "ef"]);
        assert_eq!(text_chunks("a€b", 2), ["a", "€", "b"]);
        assert!(text_chunks("", 4).is_empty());
    }
}
