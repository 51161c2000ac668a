//! The reaper: a background task that stops sandboxes whose idle TTL ran
//! out, and ends those whose lifetime did (see `lifetime`). Busy sandboxes
//! (a command running, a stream open) are never idle-expired; a lifetime
//! ends whatever the sandbox is doing.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Sandboxes;

/// How often the reaper looks. TTLs are at least 10 s, so a second of slack
/// is well inside what a user could notice.
const TICK: Duration = Duration::from_secs(1);

/// Runs until `shutdown`.
pub async fn run_reaper(sandboxes: Arc<Sandboxes>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => sandboxes.expire_idle().await,
        }
    }
}
