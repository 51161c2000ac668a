//! The terminal-session operations of the agent client: open, read,
//! type into, resize, kill, list and wait for sessions. Each method sends
//! one `Op` and gives back the answer it is due, or [`AgentError`].
//!
//! `limit` is how long the agent may take to answer before it counts as
//! stuck and the connection is closed. An operation answered `Ok` takes
//! any answer that is not a refusal: nothing is taken from it.

use std::time::Duration;

use sandboxd_proto::{Op, PtyEnded, PtyOpen, PtyOutput, PtyState, Reply};

use super::{AgentConn, AgentResult, unexpected};

impl AgentConn {
    /// Starts a session; done once its process runs.
    pub async fn pty_open(&self, open: PtyOpen, limit: Duration) -> AgentResult<()> {
        match self.call_within(Op::PtyOpen(open), limit).await? {
            Reply::Spawned { .. } => Ok(()),
            other => Err(unexpected("a session's start", &other)),
        }
    }

    /// A session's screen output from byte `after` on, at most `max_bytes`,
    /// waiting up to `wait_ms` for some.
    pub async fn pty_read(
        &self,
        pty: &str,
        after: u64,
        max_bytes: u32,
        wait_ms: u32,
        limit: Duration,
    ) -> AgentResult<PtyOutput> {
        let op = Op::PtyRead {
            pty: pty.to_string(),
            after,
            max_bytes,
            wait_ms,
        };
        match self.call_within(op, limit).await? {
            Reply::PtyOutput(out) => Ok(out),
            other => Err(unexpected("a session's read", &other)),
        }
    }

    /// Types `data` into a session.
    pub async fn pty_write(&self, pty: &str, data: Vec<u8>, limit: Duration) -> AgentResult<()> {
        let op = Op::PtyWrite {
            pty: pty.to_string(),
            data,
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// Gives a session a new window size.
    pub async fn pty_resize(
        &self,
        pty: &str,
        cols: u16,
        rows: u16,
        limit: Duration,
    ) -> AgentResult<()> {
        let op = Op::PtyResize {
            pty: pty.to_string(),
            cols,
            rows,
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// Ends a session's process tree.
    pub async fn pty_kill(&self, pty: &str, limit: Duration) -> AgentResult<()> {
        let op = Op::PtyKill {
            pty: pty.to_string(),
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// Every session the agent holds, running and ended.
    pub async fn pty_list(&self, limit: Duration) -> AgentResult<Vec<PtyState>> {
        match self.call_within(Op::PtyList, limit).await? {
            Reply::Ptys(list) => Ok(list),
            other => Err(unexpected("a list of sessions", &other)),
        }
    }

    /// How a session's process ended, once it has: no limit, a session
    /// may run long.
    pub async fn pty_wait(&self, pty: &str) -> AgentResult<PtyEnded> {
        let op = Op::PtyWait {
            pty: pty.to_string(),
        };
        match self.call(op).await? {
            Reply::PtyEnded(ended) => Ok(ended),
            other => Err(unexpected("a session's end", &other)),
        }
    }
}
