//! Watches held between calls, for clients that poll rather than stream
//! (E2B's `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`): a
//! [`FileWatch`] kept under a random id for the sandbox that made it, its
//! queued events handed out a batch at a time. The watch itself is
//! [`Files::watch`]'s, with its queue bound, overflow event and limit of
//! watches per sandbox. A holder that stops asking for [`HELD_IDLE`] loses
//! it: idle and ended watches are swept whenever a new one is made.

use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio_util::sync::CancellationToken;

use super::watch::{FileWatch, WatchEvent};
use super::{FileResult, Files};
use crate::sandbox::SandboxError;

/// How long a held watch lasts without a poll.
pub const HELD_IDLE: Duration = Duration::from_secs(600);
/// Most events one poll hands out (the rest wait for the next).
pub const HELD_BATCH: usize = 1024;

/// The held watches, by id.
#[derive(Debug, Default)]
pub(super) struct HeldWatches(DashMap<String, Held>);

#[derive(Debug)]
struct Held {
    sandbox_id: String,
    watch: FileWatch,
    polled: Instant,
    ended: bool,
}

impl Files {
    /// Starts a watch like [`Files::watch`] and holds it: its id.
    pub async fn hold_watch(
        &self,
        sandbox_id: &str,
        p: &str,
        recursive: bool,
        shutdown: CancellationToken,
    ) -> FileResult<String> {
        self.held
            .0
            .retain(|_, h| !h.ended && h.polled.elapsed() < HELD_IDLE);
        let watch = self.watch(sandbox_id, p, recursive, shutdown).await?;
        let id = crate::id::random_hex(12).map_err(SandboxError::from)?;
        let held = Held {
            sandbox_id: sandbox_id.to_string(),
            watch,
            polled: Instant::now(),
            ended: false,
        };
        self.held.0.insert(id.clone(), held);
        Ok(id)
    }

    /// The events of held watch `id` of the sandbox since the last poll
    /// (at most [`HELD_BATCH`]); `None` when it holds no such watch.
    pub fn held_events(&self, sandbox_id: &str, id: &str) -> Option<Vec<WatchEvent>> {
        let mut held = self.held.0.get_mut(id)?;
        if held.sandbox_id != sandbox_id {
            return None;
        }
        held.polled = Instant::now();
        let events: Vec<WatchEvent> = std::iter::from_fn(|| held.watch.try_next())
            .take(HELD_BATCH)
            .collect();
        held.ended |= events.iter().any(|e| matches!(e, WatchEvent::Ended(_)));
        Some(events)
    }

    /// Stops held watch `id` of the sandbox; whether there was one.
    pub fn release_watch(&self, sandbox_id: &str, id: &str) -> bool {
        self.held
            .0
            .remove_if(id, |_, h| h.sandbox_id == sandbox_id)
            .is_some()
    }
}
