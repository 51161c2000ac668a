//! The file watch of the agent client: a watch started in the agent
//! ([`AgentConn::watch`]) and its answers as they come ([`AgentWatch`]),
//! until it ends or is stopped. Unlike every other call it has no end the
//! caller waits for: its parts come for as long as it runs, so whoever
//! holds an [`AgentWatch`] must read it promptly (its parts wait in a small
//! channel, and the connection's reader waits for room there).

use std::sync::Arc;
use std::time::Duration;

use sandboxd_proto::{Op, Reply, Response, WatchEnd, WatchEvent, WatchStart};
use tokio::sync::mpsc;

use super::{AgentConn, AgentError, AgentResult, lock, reply_name, unexpected};

/// What a running watch answers next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchPart {
    Events(Vec<WatchEvent>),
    /// The last answer: the watch is over.
    Ended(WatchEnd),
}

/// A watch running in the agent; see [`AgentConn::watch`].
#[derive(Debug)]
pub struct AgentWatch {
    conn: Arc<AgentConn>,
    id: u64,
    rx: mpsc::Receiver<Response>,
}

impl AgentConn {
    /// Starts watching `start.path`: done once the agent's watches are in
    /// place (within `limit`), or refused (no such directory).
    pub async fn watch(
        self: &Arc<Self>,
        start: WatchStart,
        limit: Duration,
    ) -> AgentResult<AgentWatch> {
        let (id, rx) = self.send(Op::Watch(start), Vec::new()).await?;
        let mut watch = AgentWatch {
            conn: Arc::clone(self),
            id,
            rx,
        };
        let first = match tokio::time::timeout(limit, watch.rx.recv()).await {
            Ok(first) => first,
            Err(_) => return Err(self.stuck(limit)),
        };
        match first {
            Some(Response {
                more: true,
                reply: Reply::Watching,
                ..
            }) => Ok(watch),
            Some(Response {
                reply: Reply::Error(f),
                ..
            }) => Err(AgentError::Refused(f)),
            Some(r) => Err(unexpected("a watch", &r.reply)),
            None => Err(watch.closed()),
        }
    }
}

impl AgentWatch {
    /// The next answer of the watch; after [`WatchPart::Ended`] or an error
    /// nothing more comes.
    pub async fn next(&mut self) -> AgentResult<WatchPart> {
        let Some(r) = self.rx.recv().await else {
            return Err(self.closed());
        };
        match (r.more, r.reply) {
            (true, Reply::WatchEvents(events)) => Ok(WatchPart::Events(events)),
            (false, Reply::WatchEnded(end)) => Ok(WatchPart::Ended(end)),
            (_, Reply::Error(f)) => Err(AgentError::Refused(f)),
            (true, other) => Err(AgentError::Protocol(format!(
                "{} in a watch",
                reply_name(&other)
            ))),
            (false, other) => Err(unexpected("a watch", &other)),
        }
    }

    /// Stops the watch in the agent (within `limit`). Its answers are let
    /// go of first: events that come meanwhile must not hold up the
    /// connection's reader, which the stop's own answer comes through.
    pub async fn stop(self, limit: Duration) -> AgentResult<()> {
        let (conn, watch) = (Arc::clone(&self.conn), self.id);
        drop(self);
        conn.call_within(Op::Unwatch { watch }, limit)
            .await
            .map(drop)
    }

    fn closed(&self) -> AgentError {
        AgentError::Closed(
            self.conn
                .closed_because()
                .unwrap_or_else(|| "the connection closed".into()),
        )
    }
}

impl Drop for AgentWatch {
    /// Answers that still come for it are dropped.
    fn drop(&mut self) {
        lock(&self.conn.pending).remove(&self.id);
    }
}
