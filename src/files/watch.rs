//! Watching a directory of the workspace ([`Files::watch`]): the events the
//! agent's inotify watch reports, checked and made relative to the
//! workspace, handed out through a [`FileWatch`] until its holder drops it
//! (the agent's watch is stopped then) or the watch ends (the directory
//! went, the sandbox went, sandboxd shuts down), which a last
//! [`WatchEvent::Ended`] says.
//!
//! A task of its own reads the agent's answers as they come, whatever the
//! holder does: the sandbox's connection to its agent waits for no slow
//! reader. Events wait for the holder in a queue of `watch_queue_events`;
//! past it they are dropped, and one [`WatchEvent::Overflow`] takes their
//! place once there is room. What the agent sends is untrusted: a batch
//! of more than [`MAX_WATCH_BATCH`] events, or a path that is not a plain
//! relative one inside the watched directory, ends the watch.
//!
//! The watch keeps its sandbox busy while it runs, as a log stream does.

use std::sync::Arc;
use std::time::Duration;

use sandboxd_proto::{MAX_WATCH_BATCH, MAX_WATCH_PATH, WatchEnd, WatchKind, WatchStart};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{FileResult, Files};
use crate::agent_client::{AgentError, AgentWatch, WatchPart};
use crate::sandbox::registry::OpenRequest;
use crate::sandbox::{Sandbox, SandboxError, Sandboxes};
use crate::workspace_path::MAX_COMPONENT_BYTES;

/// What happened to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChange {
    /// Created, or moved in (the new name of a rename).
    Create,
    /// Written; writes to one path close together (50 ms) are one event.
    Write,
    Remove,
    /// Moved away: the old name of a rename (its new name, when inside
    /// the watched directory, comes as a `Create`).
    Rename,
    /// Its mode, owner or times changed.
    Chmod,
}

/// One event of a [`FileWatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// Something happened to a path under the watched directory.
    Change {
        kind: FileChange,
        /// Relative to the workspace, like every path of the file routes.
        path: String,
        /// Relative to the watched directory.
        name: String,
        is_dir: bool,
    },
    /// Events were lost (a queue overflowed, in the sandbox or here, or a
    /// directory could not be watched): look at what is there again.
    Overflow,
    /// The watch is over; nothing follows.
    Ended(WatchEnded),
}

/// Why a watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEnded {
    /// The watched directory was removed or moved away.
    DirectoryGone,
    /// The sandbox was removed.
    SandboxGone,
    ShuttingDown,
    /// The sandbox's agent could not be reached or misbehaved.
    Failed(String),
}

impl WatchEnded {
    /// A sentence for the client.
    pub fn reason(&self) -> String {
        match self {
            WatchEnded::DirectoryGone => {
                "the watched directory was removed or moved away".to_string()
            }
            WatchEnded::SandboxGone => "the sandbox was removed".to_string(),
            WatchEnded::ShuttingDown => "sandboxd is shutting down".to_string(),
            WatchEnded::Failed(why) => why.clone(),
        }
    }
}

/// The events of a running watch; dropping it stops the watch.
#[derive(Debug)]
pub struct FileWatch {
    events: mpsc::Receiver<WatchEvent>,
}

impl FileWatch {
    /// The next event; `None` after [`WatchEvent::Ended`].
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.events.recv().await
    }

    /// The next event if one is queued now.
    pub fn try_next(&mut self) -> Option<WatchEvent> {
        self.events.try_recv().ok()
    }
}

impl Files {
    /// Watches directory `p` (absolute under the workspace or relative to
    /// it), and with `recursive` every directory below it. Answers once the
    /// watch is in place: `NotFound`, `NotDirectory` or a bad path
    /// otherwise, `TooManyWatches` when the sandbox runs
    /// [`MAX_FILE_WATCHES`](sandboxd_proto::MAX_FILE_WATCHES) already.
    pub async fn watch(
        &self,
        sandbox_id: &str,
        p: &str,
        recursive: bool,
        shutdown: CancellationToken,
    ) -> FileResult<FileWatch> {
        let path = self.parse(p)?;
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let busy = sandbox.open_request();
        let start = WatchStart {
            path: path.relative(),
            recursive,
            max_dirs: self.config.watch_max_dirs,
            max_queued: u32::try_from(self.config.watch_queue_events).unwrap_or(u32::MAX),
        };
        let limit = self.config.agent_timeout;
        let watch = self
            .sandboxes
            .with_agent(&sandbox, |conn| {
                let start = start.clone();
                async move { conn.watch(start, limit).await }
            })
            .await
            .map_err(|e| self.failure(&sandbox, e))?;
        let (tx, events) = mpsc::channel(self.config.watch_queue_events.max(1));
        let pump = Pump {
            tx,
            base: path.relative(),
            sandboxes: Arc::clone(&self.sandboxes),
            sandbox,
            limit,
            lost: false,
        };
        tokio::spawn(pump.run(watch, busy, shutdown));
        Ok(FileWatch { events })
    }
}

/// Moves one watch's events from the agent to its [`FileWatch`].
struct Pump {
    tx: mpsc::Sender<WatchEvent>,
    /// The watched directory, relative to the workspace.
    base: String,
    sandboxes: Arc<Sandboxes>,
    sandbox: Arc<Sandbox>,
    limit: Duration,
    /// Events were dropped for want of room: an overflow is due.
    lost: bool,
}

impl Pump {
    async fn run(mut self, mut watch: AgentWatch, _busy: OpenRequest, shutdown: CancellationToken) {
        let ended = loop {
            let part = tokio::select! {
                () = self.tx.closed() => {
                    // Nobody watches any more.
                    let _ = watch.stop(self.limit).await;
                    return;
                }
                () = shutdown.cancelled() => {
                    let _ = watch.stop(self.limit).await;
                    break WatchEnded::ShuttingDown;
                }
                // The overflow due goes as soon as the holder makes room,
                // not only when the next event comes.
                permit = self.tx.reserve(), if self.lost => {
                    if let Ok(permit) = permit {
                        permit.send(WatchEvent::Overflow);
                        self.lost = false;
                    }
                    continue;
                }
                part = watch.next() => part,
            };
            match part {
                Ok(WatchPart::Events(events)) => {
                    if let Err(why) = self.forward(events) {
                        tracing::warn!(sandbox_id = %self.sandbox.id, %why, "the agent sent a bad watch event");
                        let _ = watch.stop(self.limit).await;
                        break WatchEnded::Failed(format!("the sandbox's agent misbehaved: {why}"));
                    }
                }
                Ok(WatchPart::Ended(WatchEnd::DirGone)) => break WatchEnded::DirectoryGone,
                Ok(WatchPart::Ended(WatchEnd::Stopped)) => {
                    break WatchEnded::Failed("the sandbox's agent stopped the watch".into());
                }
                Err(e) => break self.why(e),
            }
        };
        // These wait for room: the holder reads on, or drops the watch.
        if self.lost {
            let _ = self.tx.send(WatchEvent::Overflow).await;
        }
        let _ = self.tx.send(WatchEvent::Ended(ended)).await;
    }

    /// Checks a batch from the agent and queues its events.
    fn forward(&mut self, events: Vec<sandboxd_proto::WatchEvent>) -> Result<(), String> {
        if events.len() > MAX_WATCH_BATCH {
            return Err(format!("{} events in one batch", events.len()));
        }
        for e in events {
            let kind = match e.kind {
                WatchKind::Overflow => {
                    self.push(WatchEvent::Overflow);
                    continue;
                }
                WatchKind::Create => FileChange::Create,
                WatchKind::Write => FileChange::Write,
                WatchKind::Remove => FileChange::Remove,
                WatchKind::Rename => FileChange::Rename,
                WatchKind::Chmod => FileChange::Chmod,
            };
            check_relative(&e.path)?;
            let path = if self.base.is_empty() {
                e.path.clone()
            } else {
                format!("{}/{}", self.base, e.path)
            };
            self.push(WatchEvent::Change {
                kind,
                path,
                name: e.path,
                is_dir: e.is_dir,
            });
        }
        Ok(())
    }

    /// Queues an event for the holder; when there is no room it is
    /// dropped, and an overflow goes first once there is.
    fn push(&mut self, event: WatchEvent) {
        if self.lost {
            if self.tx.try_send(WatchEvent::Overflow).is_err() {
                return;
            }
            self.lost = false;
            if event == WatchEvent::Overflow {
                return;
            }
        }
        if self.tx.try_send(event).is_err() {
            self.lost = true;
        }
    }

    /// Why the watch ended when its agent call failed.
    fn why(&self, e: AgentError) -> WatchEnded {
        match self.sandboxes.gone_or(&self.sandbox, SandboxError::from(e)) {
            SandboxError::NotFound(_) => WatchEnded::SandboxGone,
            other => WatchEnded::Failed(other.to_string()),
        }
    }
}

/// A path from the agent must be a plain relative one: non-empty
/// components, neither `.` nor `..`, no NUL, within the length bounds.
fn check_relative(path: &str) -> Result<(), String> {
    let plain = !path.is_empty()
        && path.len() <= MAX_WATCH_PATH
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= MAX_COMPONENT_BYTES)
        && !path.contains('\0');
    if plain {
        Ok(())
    } else {
        Err(format!(
            "{path:?} is not a path inside the watched directory"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_pass() {
        for ok in ["a", "a/b", "a b/c.txt", "\u{fffd}"] {
            assert!(check_relative(ok).is_ok(), "{ok:?}");
        }
        let long_name = "x".repeat(MAX_COMPONENT_BYTES + 1);
        let long_path = "a/".repeat(MAX_WATCH_PATH / 2 + 1);
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            ".",
            "..",
            "a/../b",
            "./a",
            "a\0b",
            long_name.as_str(),
            long_path.trim_end_matches('/'),
        ] {
            assert!(check_relative(bad).is_err(), "{bad:?}");
        }
    }
}
