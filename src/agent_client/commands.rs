//! The command operations of the agent client: start, kill, read the log
//! of, wait for, list and forget commands, write to or close the stdin of
//! a running one, and ask what a finished one kept of its streams or
//! changed in the workspace. Each method sends one `Op` and gives back
//! the answer it is due, or [`AgentError`].
//!
//! `limit` is how long the agent may take to answer before it counts as
//! stuck and the connection is closed (`Duration::MAX`: never, for a
//! caller that bounds its wait itself). An operation answered `Ok`
//! takes any answer that is not a refusal: nothing is taken from it.

use std::time::Duration;

use bytes::Bytes;
use sandboxd_proto::{
    Change, ChangesSummary, CommandState, Ended, LogChunk, Op, ReadLog, Reply, ShapedPart, Spawn,
    TailPart,
};

use super::{AgentConn, AgentResult, reply_name, unexpected};

/// A part of a command's tails ([`AgentConn::tail`]): a plain tail, for
/// a command started with `tail_bytes`, or a piece of a shaped stream,
/// for one started with a shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailPiece {
    Plain(TailPart),
    Shaped(ShapedPart),
}

impl AgentConn {
    /// Starts a command; done once it runs. Its pid (0: it could not
    /// start), as the agent says.
    pub async fn spawn(&self, spawn: Spawn, limit: Duration) -> AgentResult<u32> {
        match self.call_within(Op::Spawn(spawn), limit).await? {
            Reply::Spawned { pid } => Ok(pid),
            other => Err(unexpected("a spawn", &other)),
        }
    }

    /// Ends a command's process tree (or what a finished one left);
    /// answered once SIGTERM is sent.
    pub async fn kill(&self, command: &str, limit: Duration) -> AgentResult<()> {
        let op = Op::Kill {
            command: command.to_string(),
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// Records of a command's log after `read.after`, waiting up to
    /// `read.wait_ms` for one.
    pub async fn read_log(&self, read: ReadLog, limit: Duration) -> AgentResult<LogChunk> {
        match self.call_within(Op::ReadLog(read), limit).await? {
            Reply::Log(chunk) => Ok(chunk),
            other => Err(unexpected("a read of a log", &other)),
        }
    }

    /// Tells the agent reader `follower` of `command` went away.
    pub async fn unfollow(&self, command: &str, follower: u64, limit: Duration) -> AgentResult<()> {
        let op = Op::Unfollow {
            command: command.to_string(),
            follower,
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// How a command ended, once it has: no limit, a command may run long.
    pub async fn wait(&self, command: &str) -> AgentResult<Ended> {
        let op = Op::Wait {
            command: command.to_string(),
        };
        match self.call(op).await? {
            Reply::Ended(e) => Ok(e),
            other => Err(unexpected("a wait", &other)),
        }
    }

    /// What a command kept of its streams, each piece handed to `part`
    /// (which may refuse it, ending the call as a protocol error).
    pub async fn tail(
        &self,
        command: &str,
        limit: Duration,
        mut part: impl FnMut(TailPiece) -> Result<(), String>,
    ) -> AgentResult<()> {
        let op = Op::Tail {
            command: command.to_string(),
        };
        self.call_parts_within(op, limit, |p| match p {
            Reply::TailPart(p) => part(TailPiece::Plain(p)),
            Reply::Shaped(p) => part(TailPiece::Shaped(p)),
            other => Err(format!("{} in a tail", reply_name(&other))),
        })
        .await
        .map(drop)
    }

    /// What a finished command changed in the workspace: the changes
    /// handed to `part` piece by piece (which may refuse one), then the
    /// summary.
    pub async fn changes(
        &self,
        command: &str,
        limit: Duration,
        mut part: impl FnMut(Vec<Change>) -> Result<(), String>,
    ) -> AgentResult<ChangesSummary> {
        let op = Op::Changes {
            command: command.to_string(),
        };
        let last = self
            .call_parts_within(op, limit, |p| match p {
                Reply::ChangesPart(piece) => part(piece),
                other => Err(format!("{} in a list of changes", reply_name(&other))),
            })
            .await?;
        match last {
            Reply::Changes(summary) => Ok(summary),
            other => Err(unexpected("a list of changes", &other)),
        }
    }

    /// Writes `data` to the stdin of a command started with it open; done
    /// once all of it is in the pipe.
    pub async fn write_stdin(
        &self,
        command: &str,
        data: Bytes,
        limit: Duration,
    ) -> AgentResult<()> {
        let op = Op::Stdin {
            command: command.to_string(),
            data,
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// Closes the stdin of a command started with it open.
    pub async fn close_stdin(&self, command: &str, limit: Duration) -> AgentResult<()> {
        let op = Op::CloseStdin {
            command: command.to_string(),
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// Drops a finished command and its log.
    pub async fn forget(&self, command: &str, limit: Duration) -> AgentResult<()> {
        let op = Op::Forget {
            command: command.to_string(),
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// Every command the agent knows.
    pub async fn list(&self, limit: Duration) -> AgentResult<Vec<CommandState>> {
        match self.call_within(Op::List, limit).await? {
            Reply::Commands(list) => Ok(list),
            other => Err(unexpected("a list of commands", &other)),
        }
    }
}
