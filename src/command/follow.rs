//! Following a command's log: its records as the agent gives them, typed (a read
//! at a time, each waiting up to a heartbeat interval for news), a
//! heartbeat line when there was none, until the `exit` record (or, for a
//! reader of the leftovers' output, until the processes the command left
//! running are gone) or shutdown. Each read tells the agent where this reader is, so the
//! command's output waits for a reader that keeps reading instead of being
//! dropped. When the sandbox died under the command, the reader gets the
//! `error` record sandboxd wrote, then the `exit` record. The stream keeps
//! its sandbox busy while it is open.

use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use sandboxd_proto::{FailureKind, ReadLog, RecordBody};
use tokio_util::sync::CancellationToken;

use super::log::{ExitRecord, LogLine, check_order};
use super::{Command, Finished};
use crate::agent_client::AgentError;
use crate::config::Config;
use crate::sandbox::registry::OpenRequest;
use crate::sandbox::{Sandbox, Sandboxes};

/// Most bytes of records one read asks for.
const READ_BYTES: u32 = 256 * 1024;
/// Pause before reading again after the agent could not be reached.
const RETRY_EVERY: Duration = Duration::from_millis(200);

/// One reader of one command's log.
pub(super) struct Follow {
    sandboxes: Arc<Sandboxes>,
    sandbox: Arc<Sandbox>,
    cmd: Arc<Command>,
    /// The last record this reader got.
    after: u64,
    /// Read past the exit record (the leftovers' output).
    past_exit: bool,
    heartbeat: Duration,
    agent_timeout: Duration,
    shutdown: CancellationToken,
    /// This reader's id at the agent.
    follower: u64,
    done: bool,
}

impl Follow {
    pub(super) fn new(
        sandboxes: Arc<Sandboxes>,
        sandbox: Arc<Sandbox>,
        cmd: Arc<Command>,
        after: u64,
        past_exit: bool,
        config: &Config,
        shutdown: CancellationToken,
    ) -> Result<Follow, crate::id::RandomUnavailable> {
        Ok(Follow {
            sandboxes,
            sandbox,
            cmd,
            after,
            past_exit,
            heartbeat: config.log_heartbeat,
            agent_timeout: config.agent_timeout,
            shutdown,
            follower: crate::id::random_u64()?,
            done: false,
        })
    }

    /// The next records; `None` at the end.
    async fn next(&mut self) -> Option<Vec<LogLine>> {
        loop {
            if self.done || self.shutdown.is_cancelled() {
                return None;
            }
            if self.cmd.ended_by_sandboxd().is_some() {
                return Some(self.ended_by_sandboxd().await);
            }
            let conn = tokio::select! {
                c = self.sandboxes.agent(&self.sandbox) => c,
                _ = self.shutdown.cancelled() => return None,
            };
            let conn = match conn {
                Ok(c) if c.boot() == self.cmd.boot => c,
                // Another agent (the sandbox restarted), or none: the
                // command's drive decides how it ended; wait for that.
                _ => {
                    tokio::select! {
                        _ = self.cmd.ended() => {}
                        _ = tokio::time::sleep(self.heartbeat) => return Some(vec![LogLine::Heartbeat { seq: self.after }]),
                        _ = self.shutdown.cancelled() => return None,
                    }
                    continue;
                }
            };
            let read = conn.read_log(
                ReadLog {
                    command: self.cmd.id.clone(),
                    follower: self.follower,
                    after: self.after,
                    max_bytes: READ_BYTES,
                    wait_ms: u32::try_from(self.heartbeat.as_millis()).unwrap_or(u32::MAX),
                    past_exit: self.past_exit,
                },
                self.heartbeat + self.agent_timeout,
            );
            let reply = tokio::select! {
                r = read => r,
                // The sandbox died under the command: what its agent held
                // went with it, and sandboxd says how it ended.
                _ = ended_by_sandboxd(&self.cmd) => continue,
                _ = self.shutdown.cancelled() => return None,
            };
            match reply {
                Ok(chunk) => {
                    let last = match check_order(self.after, &chunk.records) {
                        Ok(last) => last,
                        Err(why) => {
                            tracing::warn!(command_id = %self.cmd.id, why, "the agent sent a log out of order");
                            self.done = true;
                            return Some(vec![LogLine::Error {
                                message:
                                    "the sandbox's agent sent this log out of order; it ends here"
                                        .into(),
                                seq: self.after + 1,
                            }]);
                        }
                    };
                    self.done = chunk.complete;
                    if chunk.records.is_empty() {
                        if self.done {
                            return None;
                        }
                        return Some(vec![LogLine::Heartbeat { seq: self.after }]);
                    }
                    let mut lines = Vec::with_capacity(chunk.records.len());
                    for r in &chunk.records {
                        match &r.body {
                            // A command that asked for shaped streams or
                            // its changes has them in its exit record (the
                            // agent made them before it wrote the record).
                            RecordBody::Exit(e)
                                if self.cmd.shape.is_some() || self.cmd.changes_max.is_some() =>
                            {
                                let shaped = match self.cmd.shape {
                                    Some(_) => {
                                        super::fetch_tails(&conn, &self.cmd, self.agent_timeout)
                                            .await
                                            .shaped()
                                    }
                                    None => None,
                                };
                                let changes = self.cmd.changes(&conn, self.agent_timeout).await;
                                lines.push(LogLine::Exit(Box::new(ExitRecord::of_agent(
                                    e, r.seq, shaped, changes,
                                ))));
                            }
                            _ => lines.push(LogLine::of_record(r)),
                        }
                    }
                    self.after = last;
                    return Some(lines);
                }
                // The agent forgot it (pruned): its end is all that is left.
                Err(AgentError::Refused(f)) if f.kind == FailureKind::NoSuchCommand => {
                    self.done = true;
                    let f = self.cmd.ended().await;
                    return Some(vec![sandboxd_exit(&f, self.after + 1)]);
                }
                Err(_) => tokio::time::sleep(RETRY_EVERY).await,
            }
        }
    }

    /// The records sandboxd writes for a command whose sandbox ended under
    /// it: why, then how.
    async fn ended_by_sandboxd(&mut self) -> Vec<LogLine> {
        self.done = true;
        let f = self.cmd.ended().await;
        let message = self.cmd.ended_by_sandboxd().unwrap_or_default();
        vec![
            LogLine::Error {
                message,
                seq: self.after + 1,
            },
            sandboxd_exit(&f, self.after + 2),
        ]
    }
}

/// The `exit` record sandboxd writes from what it knows of the end.
fn sandboxd_exit(f: &Finished, seq: u64) -> LogLine {
    LogLine::Exit(Box::new(ExitRecord {
        exit: f.exit,
        oom_killed: f.oom_killed,
        usage: f.usage,
        shaped: None,
        changes: None,
        seq,
    }))
}

/// Resolves when sandboxd has ended `cmd` itself; never otherwise.
async fn ended_by_sandboxd(cmd: &Command) {
    cmd.ended().await;
    if cmd.ended_by_sandboxd().is_none() {
        std::future::pending::<()>().await;
    }
}

impl Drop for Follow {
    /// Tells the agent this reader is gone, so it holds nothing back for it.
    fn drop(&mut self) {
        let Some(conn) = self.sandbox.live_agent() else {
            return;
        };
        if conn.boot() != self.cmd.boot {
            return;
        }
        let (command, follower) = (self.cmd.id.clone(), self.follower);
        tokio::spawn(async move {
            let _ = conn
                .unfollow(&command, follower, Duration::from_secs(5))
                .await;
        });
    }
}

/// The reader as a stream of records, a read's worth at a time; `busy`
/// keeps the sandbox busy.
pub(super) fn follow(
    reader: Follow,
    busy: OpenRequest,
) -> impl Stream<Item = Vec<LogLine>> + Send + 'static {
    futures_util::stream::unfold((reader, busy), |(mut reader, busy)| async move {
        let chunk = reader.next().await?;
        Some((chunk, (reader, busy)))
    })
}
