//! What a command changed in the workspace: the files it created, modified
//! and deleted by the time its own process ended. This module owns the
//! watch of one command started with `changes` ([`Watch`]): a listing of
//! the workspace's files at the start (names only, from the directory
//! walk that also puts an inotify watch on every directory), the paths
//! inotify named while the command ran, and the [`Report`] made from both
//! at its end.
//!
//! Whether a path existed before is whether the start listing holds it;
//! what is there now is an `lstat` at the end. So a file created then
//! deleted is no change, and one deleted then created again is
//! `modified`. Directories themselves are never changes (the files in
//! them are); directories named in `ignore` are skipped at any depth.
//!
//! When inotify cannot be used (no instance or no watch left: the limits
//! are per user, and the sandbox's code runs as the agent's user), or the
//! workspace needs more watches than this sandbox's [`WatchBudget`] has
//! left, the end is a second walk compared with the start listing
//! (`Scan`): a file
//! whose ctime is after the start counts as modified. When events were
//! lost (the kernel's queue overflowed, a directory created later could
//! not be watched, more paths than this module keeps), the end is the
//! same walk, with what the events said on top. A file whose ctime is
//! within [`CLOCK_MARGIN`](watch::CLOCK_MARGIN) before the start may have changed just before
//! or just after it (file times come from a coarse clock): it is listed as
//! modified and the report says it is not `complete`.
//!
//! Everything is bounded: the paths kept (start listing and events
//! together) by [`MAX_PATHS`](watch::MAX_PATHS) and
//! [`MAX_PATH_BYTES`](watch::MAX_PATH_BYTES), the report by the
//! `max` asked for (the rest is counted). It all runs on the agent's own
//! thread, the events read as they come through the runtime.
//!
//! The parts, each using only those listed before it: [`budget`] (the
//! sandbox's share of inotify watches), [`report`] (what a report holds
//! and how it is cut to `max`), [`inotify`] (the instance and its
//! descriptor), [`watch`] (the listing, the events and the end) and
//! [`watching`] (the task that reads events while the command runs).
//! The file watches (`watch`) use the same descriptor handling.

mod budget;
mod inotify;
mod report;
mod watch;
mod watching;

pub(crate) use budget::WatchBudget;
pub(crate) use inotify::{at_limit, close_aside, register};
pub(crate) use report::Report;
pub(crate) use watch::{Watch, join};
pub(crate) use watching::Watching;
