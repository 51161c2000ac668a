//! The user's work in flight: creates for new sessions and stops that a
//! request is waiting for. Background engine work (pool refills, between
//! their steps too; link networks made ahead; teardown after a stop's
//! answer; spare port proxies given back) asks [`Foreground::is_busy`]
//! before it starts and [`Foreground::quiet`] to wait its turn, so on a
//! machine with few cores the engine serves the request first. The user's
//! work counts as under way for [`SETTLE`] after it ended too: a client
//! making sessions one after another sends the next create a millisecond
//! after the answer, and background work started in that gap would run
//! under it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How long after the user's last create or stop ended background work
/// still waits.
pub(super) const SETTLE: Duration = Duration::from_millis(100);

/// Counts the creates and stops under way; see the module docs.
#[derive(Debug)]
pub(super) struct Foreground {
    under_way: watch::Sender<usize>,
    /// When the last one ended.
    last_end: Mutex<Option<Instant>>,
}

impl Default for Foreground {
    fn default() -> Self {
        Foreground {
            under_way: watch::channel(0).0,
            last_end: Mutex::new(None),
        }
    }
}

/// Counts one create or stop until dropped; see [`Foreground::enter`].
#[derive(Debug)]
pub(super) struct UserWork<'a>(&'a Foreground);

impl Drop for UserWork<'_> {
    fn drop(&mut self) {
        // The end time first: whoever sees the count drop sees it too.
        *self
            .0
            .last_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        self.0.under_way.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Foreground {
    /// Counts a create for a new session, or a stop, until the guard
    /// drops.
    pub(super) fn enter(&self) -> UserWork<'_> {
        self.under_way.send_modify(|n| *n += 1);
        UserWork(self)
    }

    /// Whether a create or a stop is under way, or ended less than
    /// [`SETTLE`] ago.
    pub(super) fn is_busy(&self) -> bool {
        *self.under_way.borrow() > 0 || self.settle_left().is_some()
    }

    /// How much of [`SETTLE`] is left since the last create or stop ended.
    fn settle_left(&self) -> Option<Duration> {
        let last_end = *self
            .last_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let left = SETTLE.checked_sub(last_end?.elapsed())?;
        (!left.is_zero()).then_some(left)
    }

    /// Returns once no create or stop is under way and the last one ended
    /// [`SETTLE`] ago.
    pub(super) async fn quiet(&self) {
        let mut rx = self.under_way.subscribe();
        loop {
            // The sender lives as long as `self`: the wait cannot fail.
            let _ = rx.wait_for(|n| *n == 0).await;
            match self.settle_left() {
                None => return,
                Some(left) => tokio::time::sleep(left).await,
            }
        }
    }

    /// Returns when the count next changes (a create or stop started or
    /// ended).
    pub(super) async fn changed(&self) {
        let mut rx = self.under_way.subscribe();
        let _ = rx.changed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn quiet_waits_for_every_create_to_end() {
        let fg = Foreground::default();
        assert!(!fg.is_busy());
        fg.quiet().await;
        let a = fg.enter();
        let b = fg.enter();
        assert!(fg.is_busy());
        drop(a);
        assert!(fg.is_busy(), "one is still under way");
        let waiting = fg.quiet();
        drop(b);
        let ended = Instant::now();
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .expect("quiet once both ended");
        assert!(ended.elapsed() >= SETTLE, "and settled for SETTLE");
        assert!(!fg.is_busy());
        assert!(!fg.is_busy());
    }
}
