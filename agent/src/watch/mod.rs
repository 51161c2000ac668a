//! File watches: what sandboxd's `files:watch` sees inside the sandbox. A
//! watch is a directory under the workspace (and with `recursive` every
//! directory below it), the events inotify gives about it turned into
//! create, write, remove, rename and chmod events in order, and a bounded
//! queue of them between two sends.
//!
//! Bounded everywhere: a watch watches at most its `max_dirs` directories
//! and queues at most its `max_queued` events; one connection holds at
//! most [`MAX_FILE_WATCHES`](sandboxd_proto::MAX_FILE_WATCHES) watches
//! (`ops::watch`). Whatever is lost, the kernel's queue overflowing
//! (`IN_Q_OVERFLOW`), ours, or a directory left unwatched, an overflow
//! event says so: nothing is lost silently.
//!
//! Events gather for [`GATHER`] before they are read, the descriptor out of
//! the runtime's poll set meanwhile (as the `changes` watch does, and for
//! the same reason: a wake-up of the agent's thread per event slows the
//! command that makes them); writes to one path within it are one event.
//!
//! The parts: [`queue`] (the events waiting, folded and bounded) and
//! [`dir_watch`] (the inotify instance, its directories, and the kernel's
//! events turned into ours).

mod dir_watch;
mod queue;

use std::time::Duration;

use sandboxd_proto::{Failure, FailureKind};
use tokio::sync::oneshot;

pub(crate) use dir_watch::DirWatch;

use crate::changes::register;

/// How long events gather before they are read and sent.
pub(crate) const GATHER: Duration = Duration::from_millis(50);

/// Waits until events come (then lets them gather and reads them into the
/// watch's queue: true) or `stop` does (false).
pub(crate) async fn gather(
    w: &mut DirWatch,
    stop: &mut oneshot::Receiver<()>,
) -> Result<bool, Failure> {
    // Registered only while waiting (a registration reports what is
    // queued already).
    let waiting = match w.fd() {
        Some(fd) => fd.try_clone().and_then(register),
        None => return Ok(false),
    };
    let waiting = waiting.map_err(|e| {
        Failure::new(
            FailureKind::Other,
            format!("cannot wait for inotify events: {e}"),
        )
    })?;
    tokio::select! {
        _ = &mut *stop => return Ok(false),
        ready = waiting.readable() => {
            drop(ready.map_err(|e| Failure::new(FailureKind::Other, format!("inotify: {e}")))?);
        }
    }
    drop(waiting);
    tokio::select! {
        _ = &mut *stop => return Ok(false),
        () = tokio::time::sleep(GATHER) => {}
    }
    w.read_events();
    Ok(true)
}
