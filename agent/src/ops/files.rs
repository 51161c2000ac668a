//! The operations on the workspace's files: read one, write several (the
//! content coming in pieces after the request), what paths are, a
//! directory's entries, delete, move, make a directory; and for
//! checkpoints a snapshot of the workspace, a read of a file that must not
//! change meanwhile, modes set and symlinks made. Each runs on the agent's
//! file thread.

use std::sync::mpsc as std_mpsc;

use bytes::Bytes;
use sandboxd_proto::{
    ENTRIES_PER_CHUNK, Failure, FailureKind, FileIdentity, NewFile, NewSymlink, PathMode, Reply,
};

use super::{Agent, Answer, frame_pieces};
use crate::files::read_checked;

/// A file's content goes in pieces of this size: sandboxd hashes and
/// encodes each while the next one is on its way, so what it does after
/// the last byte arrives is one piece's worth.
const READ_PIECE: usize = 256 * 1024;

pub(crate) async fn read_file(agent: &Agent, path: String, max_bytes: u64, answer: Answer) {
    let r = agent
        .files
        .call(move |ws| ws.read_file(&path, max_bytes))
        .await;
    match r {
        Ok(content) => {
            let parts = content.chunks(READ_PIECE).map(|p| Reply::Data(p.to_vec()));
            if answer.parts(parts).await {
                answer.last(Reply::Ok).await
            }
        }
        Err(f) => answer.last(Reply::Error(f)).await,
    }
}

/// `content` is where the connection routes the write's pieces.
pub(crate) async fn write_files(
    agent: &Agent,
    files: Vec<NewFile>,
    content: Option<std_mpsc::Receiver<Bytes>>,
    answer: Answer,
) {
    let Some(mut content) = content else {
        let f = Failure::new(FailureKind::Other, "a write without its content");
        return answer.last(Reply::Error(f)).await;
    };
    let r = agent
        .files
        .call(move |ws| ws.write_files(files, &mut content))
        .await;
    let r = r.map(|failed| match failed.is_empty() {
        true => Reply::Ok,
        false => Reply::PreconditionFailed(failed),
    });
    answer.result(r).await
}

/// A piece of content: the connection routes each to its write, so one
/// that comes here belongs to none.
pub(crate) async fn write_data(answer: Answer) {
    let stray = Failure::new(FailureKind::Other, "content with no write");
    answer.result(Err(stray)).await;
}

pub(crate) async fn stat(agent: &Agent, paths: Vec<String>, sha256: bool, answer: Answer) {
    let r = agent.files.call(move |ws| ws.stat(&paths, sha256)).await;
    answer.result(r.map(Reply::Stats)).await
}

pub(crate) async fn list_dir(agent: &Agent, path: String, answer: Answer) {
    let r = agent.files.call(move |ws| ws.list_dir(&path)).await;
    match r {
        Ok(entries) => {
            let parts = entries
                .chunks(ENTRIES_PER_CHUNK)
                .map(|p| Reply::Entries(p.to_vec()));
            if answer.parts(parts).await {
                answer.last(Reply::Ok).await
            }
        }
        Err(f) => answer.last(Reply::Error(f)).await,
    }
}

pub(crate) async fn rename(
    agent: &Agent,
    from: String,
    to: String,
    overwrite: bool,
    answer: Answer,
) {
    let r = agent
        .files
        .call(move |ws| ws.rename(&from, &to, overwrite))
        .await;
    answer.result(r.map(|()| Reply::Ok)).await
}

pub(crate) async fn make_dir(agent: &Agent, path: String, answer: Answer) {
    let r = agent.files.call(move |ws| ws.make_dir(&path)).await;
    answer
        .result(r.map(|created| Reply::MadeDir { created }))
        .await
}

pub(crate) async fn delete(agent: &Agent, paths: Vec<String>, recursive: bool, answer: Answer) {
    let r = agent
        .files
        .call(move |ws| ws.delete(&paths, recursive))
        .await;
    answer.result(r.map(|()| Reply::Ok)).await
}

pub(crate) async fn snapshot(agent: &Agent, max_entries: u32, answer: Answer) {
    let max = usize::try_from(max_entries).unwrap_or(usize::MAX);
    match agent.files.call(move |ws| ws.snapshot(max)).await {
        Ok(entries) => {
            let pieces = frame_pieces(entries, |e| {
                e.path.len() + e.target.as_ref().map_or(0, String::len) + 64
            });
            if answer.parts(pieces.into_iter().map(Reply::Snapshot)).await {
                answer.last(Reply::Ok).await
            }
        }
        Err(f) => answer.last(Reply::Error(f)).await,
    }
}

/// The file thread reads and hands each piece over a small channel, so a
/// large file is never held whole.
pub(crate) async fn read_exact(agent: &Agent, path: String, expect: FileIdentity, answer: Answer) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let read = agent.files.call(move |ws| {
        let file = ws.open_exact(&path, expect)?;
        read_checked(file, &path, expect, |piece| tx.blocking_send(piece).is_ok())
    });
    tokio::pin!(read);
    let mut open = true;
    let done = loop {
        tokio::select! {
            r = &mut read => break r,
            Some(piece) = rx.recv() => {
                open = open && answer.part(Reply::Data(piece)).await;
            }
        }
    };
    // The pieces sent before the read ended.
    while let Some(piece) = rx.recv().await {
        open = open && answer.part(Reply::Data(piece)).await;
    }
    if open {
        answer.result(done.map(|()| Reply::Ok)).await
    }
}

pub(crate) async fn set_modes(agent: &Agent, modes: Vec<PathMode>, answer: Answer) {
    let r = agent.files.call(move |ws| ws.set_modes(&modes)).await;
    answer.result(r.map(|()| Reply::Ok)).await
}

pub(crate) async fn make_symlinks(agent: &Agent, links: Vec<NewSymlink>, answer: Answer) {
    let r = agent.files.call(move |ws| ws.make_symlinks(&links)).await;
    answer.result(r.map(|()| Reply::Ok)).await
}
