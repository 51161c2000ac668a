//! Whether a system call is costly in this sandbox, measured once: under
//! gVisor (its ptrace platform here) each one is a trip into the sentry,
//! tens of microseconds, against well under one natively. A runner that
//! drains a command's output (`commands.rs`) uses it to read less often
//! and more at a time where each read, wake-up and reply is that dear;
//! natively it reads as soon as anything arrives.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Above this per call, system calls count as costly. Natively a call is
/// a fraction of a microsecond; under gVisor's platforms it is several.
const COSTLY_ABOVE: Duration = Duration::from_micros(2);
/// Calls per timed batch, and batches: the quickest batch counts, so a
/// preemption in one does not make a native kernel look slow.
const CALLS: u32 = 16;
const BATCHES: u32 = 5;

/// Whether system calls are costly here (measured on first use).
pub(crate) fn costly() -> bool {
    static COSTLY: OnceLock<bool> = OnceLock::new();
    *COSTLY.get_or_init(|| per_call() > COSTLY_ABOVE)
}

/// The quickest of [`BATCHES`] batches of [`CALLS`] `getppid` calls, per
/// call. `getppid` enters the kernel every time (no vDSO, no cache).
fn per_call() -> Duration {
    (0..BATCHES)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..CALLS {
                std::hint::black_box(rustix::process::getppid());
            }
            t.elapsed() / CALLS
        })
        .min()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit tests run natively (not under gVisor): calls are cheap,
    /// and the measure is a real one (not zero).
    #[test]
    fn native_calls_are_not_costly() {
        let each = per_call();
        assert!(each > Duration::ZERO, "{each:?}");
        assert!(each < COSTLY_ABOVE, "{each:?} per getppid natively");
        assert!(!costly());
    }
}
