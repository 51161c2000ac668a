//! A command run for a caller that hears of its output while it runs (an
//! MCP `bash` call): started like `commands:run`, its log followed from
//! the start and the stdout and stderr text handed to a reporter at most
//! every so often (the newest characters of it only), its whole tree
//! killed when the caller cancels or goes away before it ended.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::log::LogLine;
use super::spec::CommandRequest;
use super::{CommandResult, Commands, RunResult};

/// How a run's output reaches its caller while it runs.
#[derive(Debug)]
pub struct Progress<F> {
    /// Least time between two reports.
    pub every: Duration,
    /// Most characters one report carries (the newest).
    pub max_chars: usize,
    /// Called with the output since the last report and the bytes seen so
    /// far; answers false to stop reporting.
    pub report: F,
}

/// How a reported run ended.
#[derive(Debug)]
pub enum Reported {
    /// It ended on its own (or by its timeout): what `commands:run` answers.
    Ended(Box<RunResult>),
    /// The caller cancelled it: its whole tree was killed.
    Cancelled,
}

/// Kills a command's tree when dropped before it ended (the caller
/// cancelled, or dropped the run with its connection).
struct KillUnlessEnded {
    commands: Arc<Commands>,
    sandbox_id: String,
    command_id: String,
    ended: bool,
}

impl Drop for KillUnlessEnded {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let commands = Arc::clone(&self.commands);
        let (sid, cid) = (self.sandbox_id.clone(), self.command_id.clone());
        tokio::spawn(async move {
            if let Err(e) = commands.kill(&sid, &cid).await {
                tracing::warn!(sandbox_id = %sid, command_id = %cid, error = %e, "killing a cancelled command");
            }
        });
    }
}

impl Commands {
    /// Runs a command as [`Commands::run`] does, reporting its output
    /// through `progress` (when given) while it runs. When `cancel` fires
    /// first, or this future is dropped before the command ended, its
    /// whole tree is killed.
    pub async fn run_reporting<F, Fut>(
        self: &Arc<Self>,
        sandbox_id: &str,
        req: CommandRequest,
        shutdown: &CancellationToken,
        cancel: &CancellationToken,
        progress: Option<Progress<F>>,
    ) -> CommandResult<Reported>
    where
        F: FnMut(String, u64) -> Fut,
        Fut: Future<Output = bool>,
    {
        let cmd = self.start_run(sandbox_id, req).await?;
        let mut guard = KillUnlessEnded {
            commands: Arc::clone(self),
            sandbox_id: sandbox_id.to_string(),
            command_id: cmd.id.clone(),
            ended: false,
        };
        let following = shutdown.child_token();
        let _stop_following = following.clone().drop_guard();
        let reporting = async {
            if let Some(p) = progress {
                self.report_output(sandbox_id, &cmd.id, following, p).await;
            }
            std::future::pending::<Infallible>().await
        };
        let ended = tokio::select! {
            r = self.run_result(sandbox_id, &cmd, shutdown) => r,
            // The guard kills the tree as this returns.
            _ = cancel.cancelled() => return Ok(Reported::Cancelled),
            never = reporting => match never {},
        };
        guard.ended = true;
        ended.map(|r| Reported::Ended(Box::new(r)))
    }

    /// Follows the command's log until it ends or `stop`, calling
    /// `progress.report` with the output since the last report (its newest
    /// `max_chars` characters), at most every `every`; stops early when
    /// the report answers false.
    async fn report_output<F, Fut>(
        &self,
        sandbox_id: &str,
        command_id: &str,
        stop: CancellationToken,
        progress: Progress<F>,
    ) where
        F: FnMut(String, u64) -> Fut,
        Fut: Future<Output = bool>,
    {
        let Progress {
            every,
            max_chars,
            mut report,
        } = progress;
        let Ok(lines) = self
            .follow_lines(sandbox_id, command_id, 0, false, stop.clone())
            .await
        else {
            return;
        };
        let mut lines = std::pin::pin!(lines);
        let mut pending = String::new();
        let mut seen = 0u64;
        let mut last = Instant::now();
        loop {
            let chunk = tokio::select! {
                c = lines.next() => c,
                _ = stop.cancelled() => None,
            };
            let Some(chunk) = chunk else { break };
            for line in chunk {
                if let LogLine::Output { text, .. } = line {
                    seen += text.len() as u64;
                    pending.push_str(&text);
                    keep_newest(&mut pending, max_chars);
                }
            }
            if !pending.is_empty() && last.elapsed() >= every {
                if !report(std::mem::take(&mut pending), seen).await {
                    break;
                }
                last = Instant::now();
            }
        }
    }
}

/// Drops all but the last `max` characters of `s`.
fn keep_newest(s: &mut String, max: usize) {
    let chars = s.chars().count();
    if chars > max {
        let cut = s
            .char_indices()
            .nth(chars - max)
            .map_or(s.len(), |(i, _)| i);
        s.replace_range(..cut, "");
    }
}

#[cfg(test)]
mod tests {
    use super::keep_newest;

    #[test]
    fn keeps_the_newest_characters() {
        let mut s = "aé€b".to_string();
        keep_newest(&mut s, 2);
        assert_eq!(s, "€b");
        let mut short = "ab".to_string();
        keep_newest(&mut short, 5);
        assert_eq!(short, "ab");
    }
}
