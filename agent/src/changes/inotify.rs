//! The inotify instance of a watch ([`Inotify`]) and what its descriptor
//! needs: telling a per-user limit from another failure, joining the
//! runtime's poll set, and a close that does not hold up the agent's
//! thread.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

use super::report::Rel;

/// The inotify instance and which directory each watch is on.
#[derive(Debug)]
pub(super) struct Inotify {
    pub(super) fd: OwnedFd,
    pub(super) dirs: HashMap<i32, Rel>,
    /// Watches the kernel holds for this instance (each taken from the
    /// budget): every watch descriptor added and not yet `IN_IGNORED`,
    /// whether or not `dirs` still names it.
    pub(super) live: HashSet<i32>,
}

/// Closes an inotify descriptor on a thread of its own. Closing the last
/// descriptor of an instance waits for the kernel's grace period before it
/// returns (4 to 16 ms measured on the test machine), and the agent's one
/// thread has this command's end to report and other requests to answer.
/// The thread lives as long as the close; when it cannot start (the
/// sandbox at its pids limit) the descriptor is closed here, as the
/// closure that holds it is dropped.
pub(crate) fn close_aside(fd: OwnedFd) {
    let _ = std::thread::Builder::new()
        .name("inotify-close".into())
        .stack_size(64 * 1024)
        .spawn(move || drop(fd));
}

/// Joins (a copy of) the inotify descriptor to the runtime's poll set,
/// until it is dropped.
#[expect(
    deprecated,
    reason = "tokio deprecated AsyncFd::new for inner types that do not own their descriptor; an OwnedFd owns it, so this is the sound case, and the replacement is unsafe, which this crate forbids"
)]
pub(crate) fn register(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::new(fd)
}

/// Whether an error says a per-user inotify limit is reached.
pub(crate) fn at_limit(e: rustix::io::Errno) -> bool {
    e == rustix::io::Errno::NOSPC || e == rustix::io::Errno::MFILE
}
