//! The operations of the agent client that workspace checkpoints use: a
//! snapshot of the workspace's entries, a read of a file that must stay
//! what the snapshot saw, and for a restore permission bits set and
//! symlinks made. As in [`files`](super::files), an answer in parts hands
//! each part to the caller's `part`, which may refuse it; a file's content
//! goes into a channel instead, so that its reader can write it to disk
//! off the async runtime while the agent's sending waits.

use std::time::Duration;

use sandboxd_proto::{FileIdentity, NewSymlink, Op, PathMode, Reply, SnapshotEntry};
use tokio::sync::mpsc;

use super::{AgentConn, AgentError, AgentResult, Step, no_parts, reply_name};

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

    /// The content of regular file `path`, sent into `pieces` piece by
    /// piece (the agent's sending waits while `pieces` is full), refused
    /// as changed unless the file is `expect` before and after the read.
    /// A closed `pieces` ends the read with an error.
    pub async fn read_exact(
        &self,
        path: String,
        expect: FileIdentity,
        limit: Duration,
        pieces: mpsc::Sender<Vec<u8>>,
    ) -> AgentResult<()> {
        let read = async {
            let mut answer = self.answer(Op::ReadExact { path, expect }).await?;
            loop {
                match answer.next().await? {
                    Step::Part(Reply::Data(d)) => {
                        if pieces.send(d).await.is_err() {
                            return Err(AgentError::Closed("the file's reader went away".into()));
                        }
                    }
                    Step::Part(other) => {
                        return Err(AgentError::Protocol(format!(
                            "{} in a file",
                            reply_name(&other)
                        )));
                    }
                    Step::Last(_) => return Ok(()),
                }
            }
        };
        match tokio::time::timeout(limit, read).await {
            Ok(r) => r,
            Err(_) => Err(self.stuck(limit)),
        }
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
