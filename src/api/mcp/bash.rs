//! The `bash` tool: a command run as `commands:run` runs it (login shell,
//! output shaped to a budget), followed while it runs for progress
//! notifications, and killed with its whole process tree when the client
//! cancels (or drops) the call.

use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam};
use rmcp::service::RequestContext;
use schemars::JsonSchema;
use serde::Deserialize;

use super::super::dto;
use super::tool_error;
use crate::app::App;
use crate::command::spec::{CommandRequest, OutputRequest};
use crate::command::{Progress, Reported, RunResult};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct BashArgs {
    /// Shell script; runs in a login bash in the workspace.
    command: String,
    /// Default 120000; capped by the server.
    timeout_ms: Option<i64>,
    /// Working directory (created if missing).
    cwd: Option<String>,
    /// Also list the files it created, modified and deleted.
    changes: Option<bool>,
}

/// Characters of each stream a result keeps (head and tail).
const OUTPUT_CHARS: i64 = 16_000;
/// Default timeout when the call names none.
const DEFAULT_TIMEOUT_MS: i64 = 120_000;
/// Least time between two progress notifications.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// Most characters of output one progress notification carries (the
/// newest).
const PROGRESS_CHARS: usize = 4_000;

/// Runs `args` in the sandbox and words the end for a model.
pub(super) async fn run(
    app: &Arc<App>,
    sandbox_id: &str,
    args: BashArgs,
    ctx: &RequestContext<RoleServer>,
) -> CallToolResult {
    let req = CommandRequest {
        cmd: None,
        args: None,
        command: Some(args.command),
        shell: None,
        login: None,
        cwd: args.cwd,
        env: None,
        stdin: None,
        stdin_open: None,
        timeout_ms: Some(args.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
        detached: None,
        max_output_bytes: None,
        output: Some(OutputRequest {
            max_chars: OUTPUT_CHARS,
            head_chars: None,
            raw: None,
        }),
        changes: args.changes.filter(|c| *c).map(serde_json::Value::Bool),
        checkpoint: None,
    };
    let progress = ctx.meta.get_progress_token().map(|token| {
        let peer = ctx.peer.clone();
        Progress {
            every: PROGRESS_EVERY,
            max_chars: PROGRESS_CHARS,
            report: move |text: String, bytes: u64| {
                let (peer, token) = (peer.clone(), token.clone());
                async move {
                    let note =
                        ProgressNotificationParam::new(token, bytes as f64).with_message(text);
                    peer.notify_progress(note).await.is_ok()
                }
            },
        }
    });
    match app
        .commands
        .run_reporting(sandbox_id, req, &app.shutdown, &ctx.ct, progress)
        .await
    {
        Ok(Reported::Ended(r)) => result(*r),
        Ok(Reported::Cancelled) => super::error_result(
            "cancelled; the command's processes were ended".into(),
            "cancelled",
        ),
        Err(e) => tool_error(e),
    }
}

/// The text a model reads (the shaped output, then a status line) and the
/// `commands:run` body as `structuredContent`.
fn result(r: RunResult) -> CallToolResult {
    let f = r.finished;
    let mut text = r.tails.stdout.clone();
    if !r.tails.stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("[stderr]\n");
        text.push_str(&r.tails.stderr);
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let mut status = format!("[exit code {} · {} ms", f.exit.exit_code, f.duration_ms);
    if f.exit.timed_out {
        status.push_str(&format!(" · timed out after {} ms", r.timeout_ms));
    }
    if f.oom_killed == Some(true) {
        status.push_str(" · killed by the out-of-memory killer");
    }
    status.push(']');
    text.push_str(&status);
    if let Some(c) = &r.changes {
        let listed: Vec<String> = c
            .files
            .iter()
            .map(|f| format!("{} {}", format!("{:?}", f.kind).to_lowercase(), f.path))
            .collect();
        text.push_str(&format!("\n[changes: {}", listed.join(", ")));
        if c.more > 0 {
            text.push_str(&format!(" and {} more", c.more));
        }
        text.push(']');
    }
    let mut answer = CallToolResult::success(vec![ContentBlock::text(text)]);
    answer.structured_content = serde_json::to_value(dto::CommandRun::from(r)).ok();
    answer
}
