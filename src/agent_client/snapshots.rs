//! The operations of the agent client that workspace checkpoints use: a
//! snapshot of the workspace's entries, a read of a file that must stay
//! what the snapshot saw, and for a restore permission bits set and
//! symlinks made. As in [`files`](super::files), an answer in parts hands
//! each part to the caller's `part`, which may refuse it.

use std::time::Duration;

use sandboxd_proto::{FileIdentity, NewSymlink, Op, PathMode, Reply, SnapshotEntry};

use super::{AgentConn, AgentResult, no_parts, reply_name};

impl AgentConn {
    /// Every entry under the workspace (symlinks not followed), at most
    /// `max_entries`, handed to `part` piece by piece.
    pub async fn snapshot(
        &self,
        max_entries: u32,
        limit: Duration,
        mut part: impl FnMut(Vec<SnapshotEntry>) -> Result<(), String>,
    ) -> AgentResult<()> {
        self.call_parts_within(Op::Snapshot { max_entries }, limit, |p| match p {
            Reply::Snapshot(list) => part(list),
            other => Err(format!("{} in a snapshot", reply_name(&other))),
        })
        .await
        .map(drop)
    }

    /// The content of regular file `path`, handed to `part` piece by
    /// piece, refused as changed unless the file is `expect` before and
    /// after the read.
    pub async fn read_exact(
        &self,
        path: String,
        expect: FileIdentity,
        limit: Duration,
        mut part: impl FnMut(Vec<u8>) -> Result<(), String>,
    ) -> AgentResult<()> {
        self.call_parts_within(Op::ReadExact { path, expect }, limit, |p| match p {
            Reply::Data(d) => part(d),
            other => Err(format!("{} in a file", reply_name(&other))),
        })
        .await
        .map(drop)
    }

    /// Sets each path's permission bits (a symlink is refused).
    pub async fn set_modes(&self, modes: Vec<PathMode>, limit: Duration) -> AgentResult<()> {
        self.call_parts_within(Op::SetModes { modes }, limit, no_parts)
            .await
            .map(drop)
    }

    /// Makes symlinks where nothing is.
    pub async fn make_symlinks(&self, links: Vec<NewSymlink>, limit: Duration) -> AgentResult<()> {
        self.call_parts_within(Op::MakeSymlinks { links }, limit, no_parts)
            .await
            .map(drop)
    }
}
