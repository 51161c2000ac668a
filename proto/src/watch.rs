//! File watching: the messages of [`Op::Watch`](crate::Op::Watch) and
//! [`Op::Unwatch`](crate::Op::Unwatch), and the bounds both sides keep.
//!
//! A watch is one long request: the agent answers [`Reply::Watching`]
//! (a part) once its inotify watches are in place, then
//! [`Reply::WatchEvents`] parts as things happen, and a last
//! [`Reply::WatchEnded`] when the watch ends (an [`Op::Unwatch`] naming the
//! watch's request id, or the watched directory went away). A connection
//! that closes ends all its watches. Every event's path is relative to the
//! watched directory; sandboxd checks each one (see [`MAX_WATCH_PATH`])
//! before it uses it.
//!
//! [`Reply::Watching`]: crate::Reply::Watching
//! [`Reply::WatchEvents`]: crate::Reply::WatchEvents
//! [`Reply::WatchEnded`]: crate::Reply::WatchEnded
//! [`Op::Unwatch`]: crate::Op::Unwatch

use serde::{Deserialize, Serialize};

/// Most watches one connection holds at once (each is an inotify instance,
/// and the kernel's limit on instances, 128 by default, is per user: every
/// sandbox runs as the same user). One more is refused `TooMany`.
pub const MAX_FILE_WATCHES: usize = 8;
/// Most directories one watch may watch, whatever sandboxd asks.
pub const MAX_WATCH_DIRS: u32 = 65_536;
/// Most events one watch holds between two sends, whatever sandboxd asks.
pub const MAX_WATCH_QUEUE: u32 = 65_536;
/// Most events in one [`Reply::WatchEvents`](crate::Reply::WatchEvents).
pub const MAX_WATCH_BATCH: usize = 4096;
/// Longest path of a [`WatchEvent`], in bytes.
pub const MAX_WATCH_PATH: usize = 4096;

/// A watch to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchStart {
    /// The directory, relative to the workspace like every path (a final
    /// symlink followed inside the workspace only; none below it is).
    pub path: String,
    /// Its subdirectories too, at any depth, new ones as they appear.
    pub recursive: bool,
    /// Most directories watched (at most [`MAX_WATCH_DIRS`]); one past it
    /// is not watched, and an [`WatchKind::Overflow`] says so.
    pub max_dirs: u32,
    /// Most events held before they are sent (at most
    /// [`MAX_WATCH_QUEUE`]); past it the rest are dropped until the next
    /// send, and an [`WatchKind::Overflow`] says so.
    pub max_queued: u32,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WatchKind {
    /// Created, or moved in (the new name of a rename).
    Create,
    /// Written (writes to one path close together are one event).
    Write,
    Remove,
    /// Moved away: the old name of a rename (its new name, when inside the
    /// watch, comes as a [`WatchKind::Create`]).
    Rename,
    /// Its mode, owner or times changed.
    Chmod,
    /// Events were lost (a queue overflowed, or a directory could not be
    /// watched): what is there now must be looked at again. `path` is
    /// empty.
    Overflow,
}

/// One thing that happened under the watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: WatchKind,
    /// Relative to the watched directory, '/'-separated, every component
    /// non-empty and neither `.` nor `..` (a name that is not UTF-8 has
    /// U+FFFD for its invalid bytes); empty only for an overflow.
    pub path: String,
    pub is_dir: bool,
}

/// Why a watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchEnd {
    /// sandboxd stopped it.
    Stopped,
    /// The watched directory was removed or moved away.
    DirGone,
}
