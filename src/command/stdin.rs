//! Input for a running command started with `stdinOpen`: bytes written to
//! its stdin pipe, in order, and the pipe's close, which the command
//! reads as the end of its input. The agent holds the pipe; sandboxd
//! checks the command is this sandbox's and still running, and bounds
//! each input.

use bytes::Bytes;
use sandboxd_proto::{FailureKind, STDIN_PIECE, STDIN_WAIT_MS};

use super::{CommandError, CommandResult, Commands};
use crate::agent_client::{AgentConn, AgentError};
use crate::field_error::FieldError;

/// Most bytes of one input.
const MAX_STDIN_BYTES: usize = STDIN_PIECE;

impl Commands {
    /// Writes `data` (at most 1 MiB) to the stdin of a
    /// running command started with `stdinOpen`; done once all of it is in
    /// the pipe. A command that does not read it within 5 s is
    /// [`CommandError::StdinNotRead`] (part of it may be in).
    pub async fn send_stdin(
        &self,
        sandbox_id: &str,
        command_id: &str,
        data: Bytes,
    ) -> CommandResult<()> {
        if data.len() > MAX_STDIN_BYTES {
            return Err(FieldError::new(
                "data",
                format!(
                    "at most {MAX_STDIN_BYTES} bytes of input at once (got {})",
                    data.len()
                ),
            )
            .into());
        }
        // The agent waits for the command to read, then answers.
        let limit = self.config.agent_timeout + std::time::Duration::from_millis(STDIN_WAIT_MS);
        self.with_stdin(sandbox_id, command_id, |conn, id| async move {
            conn.write_stdin(&id, data, limit).await
        })
        .await
    }

    /// Closes the stdin of a running command started with `stdinOpen`:
    /// it reads the end of its input.
    pub async fn close_stdin(&self, sandbox_id: &str, command_id: &str) -> CommandResult<()> {
        let limit = self.config.agent_timeout;
        self.with_stdin(sandbox_id, command_id, |conn, id| async move {
            conn.close_stdin(&id, limit).await
        })
        .await
    }

    /// Runs `op` on the stdin of a running command of `sandbox_id`, and
    /// turns the agent's refusals into the command's errors.
    async fn with_stdin<F, Fut>(
        &self,
        sandbox_id: &str,
        command_id: &str,
        op: F,
    ) -> CommandResult<()>
    where
        F: FnOnce(std::sync::Arc<AgentConn>, String) -> Fut,
        Fut: Future<Output = Result<(), AgentError>>,
    {
        let (sandbox, cmd) = self.get(sandbox_id, command_id).await?;
        let finished = || CommandError::Finished(cmd.id.clone());
        if cmd.finished().is_some() {
            return Err(finished());
        }
        let _busy = sandbox.open_request();
        let conn = self.sandboxes.agent(&sandbox).await?;
        // Another agent: the sandbox restarted, and the command with it.
        if conn.boot() != cmd.boot {
            return Err(finished());
        }
        match op(conn, cmd.id.clone()).await {
            Ok(()) => Ok(()),
            Err(AgentError::Refused(f)) => Err(match f.kind {
                // It ended meanwhile (the agent forgets only ended ones).
                FailureKind::NoSuchCommand => finished(),
                FailureKind::StdinClosed if cmd.finished().is_some() => finished(),
                FailureKind::StdinClosed => CommandError::StdinClosed(f.message),
                FailureKind::InputNotRead => CommandError::StdinNotRead(f.message),
                _ => self
                    .sandboxes
                    .gone_or(&sandbox, AgentError::Refused(f).into()),
            }),
            Err(e) => Err(self.sandboxes.gone_or(&sandbox, e.into())),
        }
    }
}
