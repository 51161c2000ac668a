//! The port operations of the agent client: relay a port of the sandbox to
//! the link network, and probe whether something listens on one. Each
//! method sends one `Op` and gives back the answer it is due, or
//! [`AgentError`].
//!
//! `limit` is how long the agent may take to answer before it counts as
//! stuck and the connection is closed. An operation answered `Ok` takes
//! any answer that is not a refusal: nothing is taken from it.

use std::time::Duration;

use sandboxd_proto::{Op, Reply};

use super::{AgentConn, AgentResult, unexpected};

/// What a probe found: whether something accepts connections, and the
/// sandbox's recent output (its own text, unbounded here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    pub ready: bool,
    pub recent_output: String,
}

impl AgentConn {
    /// Forwards TCP connections from `listen` (all addresses) to
    /// 127.0.0.1:`port`, for peers in `allow` (an IPv4 CIDR) only.
    /// Idempotent.
    pub async fn relay(
        &self,
        port: u16,
        listen: u16,
        allow: String,
        limit: Duration,
    ) -> AgentResult<()> {
        let op = Op::Relay {
            port,
            listen,
            allow,
        };
        self.call_within(op, limit).await.map(drop)
    }

    /// Whether something accepts connections on 127.0.0.1:`port`, waiting
    /// up to `wait_ms`.
    pub async fn probe(&self, port: u16, wait_ms: u32, limit: Duration) -> AgentResult<Probed> {
        match self.call_within(Op::Probe { port, wait_ms }, limit).await? {
            Reply::Probed {
                ready,
                recent_output,
            } => Ok(Probed {
                ready,
                recent_output,
            }),
            other => Err(unexpected("a probe", &other)),
        }
    }
}
