//! The way into a sandbox: the connection to its agent. The engine carries
//! the bytes (the agent listens on nothing any network reaches): the first
//! connection to a sandbox this sandboxd started is the agent's own stdio,
//! attached while the container started; every other one (after a
//! restart of sandboxd or of the container, or when that one closed) is
//! one exec of `sandboxd-agent bridge`. It is kept open, and made again
//! when it closes. A stopped container is started again first; a vanished
//! one makes the sandbox unknown. What the agent or its bridge prints on
//! stderr is logged, bounded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use sandboxd_proto::Hello;
use tokio::sync::mpsc;
use tokio_util::io::StreamReader;

use super::agent_delivery::AGENT_PATH;
use super::registry::Sandbox;
use super::{SandboxError, SandboxResult, Sandboxes};
use crate::agent_client::{AgentConn, AgentError};
use crate::engine::{ExecRequest, ExecSession, OutputStream};

/// How often a long call looks at its sandbox's container.
const LIVENESS_EVERY: Duration = Duration::from_secs(2);
/// How long connecting may keep trying while the agent starts up.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// How long the hello on the agent's stdio may take before a bridge is
/// tried instead (a new agent answers within milliseconds).
const STDIO_HELLO_WITHIN: Duration = Duration::from_secs(5);
/// Lines of the agent's or bridge's stderr logged per connection, at most.
const STDERR_LINES: usize = 20;
/// Bytes of one such line, at most.
const STDERR_LINE_BYTES: usize = 512;

impl Sandboxes {
    /// The connection to the sandbox's agent: the open one, or a new one.
    /// A paused sandbox's agent cannot answer: [`SandboxError::Paused`].
    pub async fn agent(&self, s: &Arc<Sandbox>) -> SandboxResult<Arc<AgentConn>> {
        if s.is_paused() {
            return Err(SandboxError::Paused(s.id.clone()));
        }
        if let Some(conn) = s.live_agent() {
            return Ok(conn);
        }
        let _connecting = s.agent_connect.lock().await;
        if let Some(conn) = s.live_agent() {
            return Ok(conn);
        }
        let deadline = Instant::now() + CONNECT_WITHIN;
        let mut delay = Duration::from_millis(10);
        let mut restarted = false;
        loop {
            match self.connect_agent(s).await {
                Ok(conn) => {
                    s.set_agent(Some(Arc::clone(&conn)));
                    return Ok(conn);
                }
                // The agent may still be starting (a container just
                // started).
                Err(SandboxError::Agent(AgentError::Closed(why))) if Instant::now() < deadline => {
                    tracing::debug!(sandbox_id = %s.id, why, "the agent is not reachable yet");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                // It takes connections but does not answer (stopped with
                // SIGSTOP, say): start the sandbox again, once. Not one
                // paused meanwhile: that is why it did not answer.
                Err(SandboxError::Agent(AgentError::Unresponsive(_))) if s.is_paused() => {
                    return Err(SandboxError::Paused(s.id.clone()));
                }
                Err(SandboxError::Agent(AgentError::Unresponsive(ms))) if !restarted => {
                    tracing::warn!(sandbox_id = %s.id, ms, "the sandbox's agent does not answer; restarting the sandbox");
                    restarted = true;
                    s.note_unexpected_stop(false);
                    self.engine
                        .restart_container(&s.container, Duration::from_secs(1))
                        .await?;
                }
                Err(e) => return Err(self.gone_or(s, e)),
            }
        }
    }

    /// Runs `call` on the sandbox's agent; when the connection turns out to
    /// be gone (the sandbox restarted under it, its bridge was killed),
    /// once more on a new one. Every call made this way must be safe to
    /// repeat.
    pub async fn with_agent<T, F, Fut>(&self, s: &Arc<Sandbox>, call: F) -> SandboxResult<T>
    where
        F: Fn(Arc<AgentConn>) -> Fut,
        Fut: std::future::Future<Output = Result<T, AgentError>>,
    {
        let conn = self.agent(s).await?;
        match self.watched(s, &conn, call(Arc::clone(&conn))).await {
            Err(AgentError::Closed(why)) => {
                tracing::debug!(sandbox_id = %s.id, why, "the agent's connection closed; trying a new one");
                let conn = self.agent(s).await?;
                self.watched(s, &conn, call(Arc::clone(&conn)))
                    .await
                    .map_err(Into::into)
            }
            other => other.map_err(Into::into),
        }
    }

    /// Runs `call` while looking at the sandbox's container every
    /// [`LIVENESS_EVERY`]: a sandbox that died under a call (gVisor's kernel
    /// out of memory, say) can leave the connection open, so its death
    /// closes the connection and the call fails as closed.
    async fn watched<T>(
        &self,
        s: &Sandbox,
        conn: &AgentConn,
        call: impl std::future::Future<Output = Result<T, AgentError>>,
    ) -> Result<T, AgentError> {
        tokio::pin!(call);
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + LIVENESS_EVERY, LIVENESS_EVERY);
        loop {
            tokio::select! {
                r = &mut call => return r,
                _ = tick.tick() => {
                    if !self.container_alive(s).await {
                        conn.close("the sandbox stopped".into());
                    }
                }
            }
        }
    }

    /// Whether the sandbox's container runs; an engine that does not
    /// answer within a second counts as alive.
    pub async fn container_alive(&self, s: &Sandbox) -> bool {
        let status = tokio::time::timeout(
            Duration::from_secs(1),
            self.engine.container_status(&s.container),
        )
        .await;
        !matches!(
            status,
            Ok(Ok(None))
                | Ok(Ok(Some(crate::engine::ContainerStatus {
                    running: false,
                    ..
                })))
        )
    }

    /// Connects in the background, so a new sandbox's first command does
    /// not wait for it.
    pub async fn warm_agent(&self, sandbox_id: &str) {
        if let Some(s) = self.registry.get(sandbox_id) {
            if let Err(e) = self.agent(&s).await {
                tracing::debug!(sandbox_id, error = %e, "could not connect to the agent yet");
            }
        }
    }

    /// A new connection: the agent's stdio if this sandboxd attached to it
    /// and has not used it yet, else (or when that gets no answer) a bridge.
    async fn connect_agent(&self, s: &Arc<Sandbox>) -> SandboxResult<Arc<AgentConn>> {
        let limit = self.config.agent_timeout;
        if let Some(session) = s.take_stdio() {
            match self
                .say_hello(s, session, limit.min(STDIO_HELLO_WITHIN))
                .await
            {
                Ok(conn) => return Ok(conn),
                // The container restarted since the attach, or the agent
                // could not take its stdio (it says why on stderr).
                Err(e) => {
                    tracing::info!(sandbox_id = %s.id, error = %e, "no connection on the agent's stdio; trying a bridge");
                }
            }
        }
        let req = ExecRequest {
            argv: vec![AGENT_PATH.to_string(), "bridge".to_string()],
            env: vec![],
            working_dir: "/".into(),
        };
        let session = self.exec(s, &req).await?;
        self.say_hello(s, session, limit).await
    }

    /// Makes a connection of an engine session (its stdout the agent's
    /// frames, its stderr the agent's or the bridge's complaints) and says
    /// hello; no answer within `limit` is an unresponsive agent.
    async fn say_hello(
        &self,
        s: &Arc<Sandbox>,
        session: ExecSession,
        limit: Duration,
    ) -> SandboxResult<Arc<AgentConn>> {
        let ExecSession { output, stdin, .. } = session;
        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(16);
        let sandbox_id = s.id.clone();
        tokio::spawn(async move {
            let mut output = output;
            let mut lines = 0;
            loop {
                // Gone with the connection's reader, not at the next output
                // (which may never come): see `AgentConn::open`.
                let item = tokio::select! {
                    item = output.next() => item,
                    () = tx.closed() => return,
                };
                let Some(item) = item else { return };
                match item {
                    Ok((OutputStream::Stdout, bytes)) => {
                        if tx.send(Ok(bytes)).await.is_err() {
                            return;
                        }
                    }
                    Ok((OutputStream::Stderr, bytes)) => {
                        if lines < STDERR_LINES {
                            lines += 1;
                            let text = String::from_utf8_lossy(
                                &bytes[..bytes.len().min(STDERR_LINE_BYTES)],
                            );
                            tracing::warn!(sandbox_id, agent = %text.trim_end(), "the sandbox's agent said");
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                        return;
                    }
                }
            }
        });
        let reader = StreamReader::new(tokio_stream(rx));
        let hello = Hello {
            version: sandboxd_proto::VERSION,
            workspace: self.config.workspace_dirs().map(str::to_string).collect(),
            kill_grace_ms: u64::try_from(self.config.kill_grace.as_millis()).unwrap_or(u64::MAX),
            output_buffer_bytes: self.config.output_buffer_bytes as u64,
            output_memory_bytes: self.agent_output_budget(s) as u64,
            max_finished: u32::try_from(self.config.max_finished_commands).unwrap_or(u32::MAX),
            pids_limit: u64::try_from(self.config.pids_limit).unwrap_or(0),
            changes_watch_budget: self.config.changes_watch_budget,
        };
        match tokio::time::timeout(limit, AgentConn::open(reader, stdin, hello)).await {
            Ok(opened) => Ok(opened?.0),
            Err(_) => Err(AgentError::Unresponsive(
                u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
            )
            .into()),
        }
    }

    /// Output all commands of a sandbox may keep in its agent: the
    /// configured budget, but never more than a quarter of the sandbox's
    /// memory (the agent shares the sandbox's memory with its commands).
    fn agent_output_budget(&self, s: &Sandbox) -> usize {
        let quarter = (s.resources.memory_mb as usize) << 18;
        self.config
            .output_memory_bytes
            .min(quarter)
            .max(self.config.output_buffer_bytes)
    }
}

/// A receiver as a stream (for `StreamReader`).
fn tokio_stream(
    mut rx: mpsc::Receiver<std::io::Result<Bytes>>,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static {
    Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}
