//! Watches held between calls, for clients that poll rather than stream
//! (E2B's `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`): a
//! [`FileWatch`] kept under a random id for the sandbox that made it, its
//! queued events handed out a batch at a time. The watch itself is
//! [`Files::watch`]'s, with its queue bound, overflow event and limit of
//! watches per sandbox. A holder that stops asking for [`HELD_IDLE`] loses
//! it: a timer per held watch drops it then (a client that went away must
//! not keep its sandbox busy), and an ended watch goes once its last
//! events were read and another watch is made.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
// The runtime's clock, which a test can pause and move.
use tokio::time::Instant;
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
pub(super) struct HeldWatches(Arc<DashMap<String, Held>>);

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
        self.held.0.retain(|_, h| !h.ended);
        let watch = self
            .watch(sandbox_id, p, recursive, shutdown.clone())
            .await?;
        let id = crate::id::random_hex(12).map_err(SandboxError::from)?;
        let held = Held {
            sandbox_id: sandbox_id.to_string(),
            watch,
            polled: Instant::now(),
            ended: false,
        };
        self.held.0.insert(id.clone(), held);
        let last_poll = |h: &Held| h.polled;
        tokio::spawn(drop_when_idle(
            Arc::clone(&self.held.0),
            id.clone(),
            last_poll,
            HELD_IDLE,
            shutdown,
        ));
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

/// Removes entry `id` of `map` once `idle` has passed since its last poll
/// (or when it is gone already, or at `shutdown`, when the watch ends by
/// itself).
async fn drop_when_idle<V>(
    map: Arc<DashMap<String, V>>,
    id: String,
    last_poll: impl Fn(&V) -> Instant,
    idle: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let Some(due) = map.get(&id).map(|v| last_poll(&v) + idle) else {
            return;
        };
        if Instant::now() >= due {
            map.remove(&id);
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(due) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_entry_goes_once_it_was_not_polled_for_the_idle_time() {
        let map: Arc<DashMap<String, Instant>> = Arc::new(DashMap::new());
        map.insert("w".into(), Instant::now());
        let idle = Duration::from_secs(600);
        let timer = tokio::spawn(drop_when_idle(
            Arc::clone(&map),
            "w".into(),
            |t: &Instant| *t,
            idle,
            CancellationToken::new(),
        ));
        tokio::time::sleep(Duration::from_secs(400)).await;
        // A poll at 400 s: it lives to 1000 s.
        map.insert("w".into(), Instant::now());
        tokio::time::sleep(Duration::from_secs(500)).await;
        assert!(map.contains_key("w"), "polled 500 s ago: kept");
        tokio::time::sleep(Duration::from_secs(101)).await;
        assert!(!map.contains_key("w"), "not polled for 601 s: dropped");
        timer.await.expect("the timer ends");
    }
}
