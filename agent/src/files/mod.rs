//! File operations on the workspace (read, write, list, delete, move,
//! make a directory): what
//! sandboxd's `files:*` routes do inside the sandbox. A port of sandboxd's
//! former in-sandbox helper (`src/files/helper.py`), with the same
//! guarantees, its error codes mapped to
//! [`FailureKind`](sandboxd_proto::FailureKind) and its messages
//! kept.
//!
//! The agent runs as the sandbox user, so the kernel enforces the read-only
//! root filesystem and the user's own rights on every call here: this
//! module has no privilege to guard. What it guards is the workspace's
//! edge. Every path is walked from the workspace one component at a time,
//! each component opened relative to the directory before it with
//! `O_NOFOLLOW`. A symlink met on the way is followed by hand and only while
//! it stays inside: an absolute target under any spelling of the workspace
//! (the same volume mounted again), a relative one that never climbs above
//! the workspace root, at most [`MAX_HOPS`](resolve::MAX_HOPS) per path. A directory swapped
//! for a symlink between our check and our open makes the no-follow open
//! fail, and the answer is `Changed`. So nothing the sandbox puts in the
//! workspace can lead an operation out of it.
//!
//! The caller must keep SIGXFSZ from killing the agent (install a handler;
//! not SIG_IGN, which commands would inherit across exec): a write past
//! RLIMIT_FSIZE then fails with EFBIG and is answered `TooLarge`.
//!
//! The parts, each using only those listed before it: [`failure`] (the
//! answers of an operation that failed), [`entries`] (what an open
//! directory holds), [`resolve`] (the [`Workspace`] and the walk that
//! cannot leave it), then one part per operation family: [`read`],
//! [`list`], [`write`], [`delete`], [`rename`] and [`make_dir`]; and
//! [`snapshot`], what workspace checkpoints read and restore.

mod delete;
mod entries;
mod failure;
mod list;
mod make_dir;
mod read;
mod rename;
mod resolve;
mod snapshot;
mod write;

pub(crate) use entries::sorted_names;
pub(crate) use resolve::Workspace;
pub(crate) use snapshot::read_checked;

#[cfg(test)]
mod fixture;
