//! The watch operations: start a watch of a directory and answer its
//! events as they come, until sandboxd stops it or the directory goes;
//! stop one. The watches of a connection are its own ([`Watches`]), at
//! most [`MAX_FILE_WATCHES`], and end with it.

use std::cell::RefCell;
use std::collections::HashMap;

use sandboxd_proto::{
    Failure, FailureKind, MAX_FILE_WATCHES, MAX_WATCH_BATCH, MAX_WATCH_DIRS, MAX_WATCH_QUEUE,
    Reply, WatchEnd, WatchEvent, WatchStart,
};
use tokio::sync::oneshot;

use super::{Agent, Answer, frame_pieces};
use crate::watch::{DirWatch, gather};

/// The watches of one connection, by the id of the request that started
/// each: dropping a sender stops its watch.
pub(crate) type Watches = RefCell<HashMap<u64, oneshot::Sender<()>>>;

pub(crate) async fn watch(agent: &Agent, watches: &Watches, start: WatchStart, answer: Answer) {
    let id = answer.id();
    let (stop_tx, mut stop) = oneshot::channel();
    // Counted from now: watches starting together cannot pass the cap.
    let counted = {
        let mut held = watches.borrow_mut();
        let room = held.len() < MAX_FILE_WATCHES;
        if room {
            held.insert(id, stop_tx);
        }
        room
    };
    if !counted {
        let f = Failure::new(
            FailureKind::TooMany,
            format!("{MAX_FILE_WATCHES} watches are running already"),
        );
        return answer.last(Reply::Error(f)).await;
    }
    let end = run(agent, start, &mut stop, &answer).await;
    watches.borrow_mut().remove(&id);
    answer.result(end.map(Reply::WatchEnded)).await
}

/// Starts the watch, answers `Watching` and then its events until `stop`
/// or the directory goes.
async fn run(
    agent: &Agent,
    start: WatchStart,
    stop: &mut oneshot::Receiver<()>,
    answer: &Answer,
) -> Result<WatchEnd, Failure> {
    let WatchStart {
        path,
        recursive,
        max_dirs,
        max_queued,
    } = start;
    // Resolved on the file thread like every path: inside the workspace.
    let root = agent.files.call(move |ws| ws.open_dir(&path)).await?;
    let max_dirs = max_dirs.min(MAX_WATCH_DIRS) as usize;
    let max_queued = max_queued.min(MAX_WATCH_QUEUE) as usize;
    let mut w = DirWatch::start(root, recursive, max_dirs, max_queued)?;
    if !answer.part(Reply::Watching).await {
        return Ok(WatchEnd::Stopped);
    }
    loop {
        let events = w.queue.take();
        if !events.is_empty() && !send(answer, events).await {
            // The connection is gone; so is whoever watched.
            return Ok(WatchEnd::Stopped);
        }
        if w.gone() {
            return Ok(WatchEnd::DirGone);
        }
        if !gather(&mut w, stop).await? {
            return Ok(WatchEnd::Stopped);
        }
    }
}

/// Sends events in parts that each fit a frame and the batch bound; false
/// when the connection is gone.
async fn send(answer: &Answer, events: Vec<WatchEvent>) -> bool {
    for piece in frame_pieces(events, |e| 16 + e.path.len()) {
        for batch in piece.chunks(MAX_WATCH_BATCH) {
            if !answer.part(Reply::WatchEvents(batch.to_vec())).await {
                return false;
            }
        }
    }
    true
}

/// Stops watch `watch` of this connection (none is fine: it ended).
pub(crate) async fn unwatch(watches: &Watches, watch: u64, answer: Answer) {
    watches.borrow_mut().remove(&watch);
    answer.last(Reply::Ok).await
}

/// Stops every watch of a connection that ended.
pub(crate) fn unwatch_all(watches: &Watches) {
    watches.borrow_mut().clear();
}
