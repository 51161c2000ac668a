//! The checkpoint tools: take a checkpoint of the session's workspace,
//! list them, see what changed since one (or between two), and restore
//! one. Each calls the domain method its `/v1/…/checkpoints` route calls
//! and words the answer for a model; `structuredContent` is that route's
//! body.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::super::dto;
use super::tools::{answer, sandbox_of};
use super::{SessionServer, error_result, tool_error};
use crate::checkpoints::{
    CheckpointInfo, Diff, DiffEntry, DiffTarget, EntryKind, TEXT_DIFF_DEFAULT_CHARS,
};
use sandboxd_proto::ShapeSpec;

/// Changed paths a text lists (the rest are counted): a model reads the
/// text, a program `structuredContent`.
const PATHS_SHOWN: usize = 200;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct CheckpointArgs {
    /// Your name for it, e.g. the turn; unique.
    label: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NoArgs {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct DiffArgs {
    checkpoint_id: String,
    /// Another checkpointId; default (or "current"): the files now.
    to: Option<String>,
    /// Also show the text files' changes as a unified diff.
    text: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RestoreArgs {
    checkpoint_id: String,
    /// End running commands first; without it, refused while any run.
    end_commands: Option<bool>,
}

/// `ID "label" · N files, B bytes`.
fn checkpoint_line(c: &CheckpointInfo) -> String {
    let label = c
        .label
        .as_deref()
        .map(|l| format!(" {l:?}"))
        .unwrap_or_default();
    format!(
        "{}{label} · {} files, {} bytes",
        c.checkpoint_id, c.files, c.bytes
    )
}

/// `created src/a.rs (12 bytes)`, `modified b (3 → 5 bytes)`, `deleted d (directory)`.
fn path_line(what: &str, e: &DiffEntry) -> String {
    let detail = match (e.kind, e.size_before, e.size_after) {
        (EntryKind::File, Some(a), Some(b)) => format!("{a} → {b} bytes"),
        (EntryKind::File, Some(n), None) | (EntryKind::File, None, Some(n)) => {
            format!("{n} bytes")
        }
        (EntryKind::File, None, None) => "file".into(),
        (EntryKind::Dir, ..) => "directory".into(),
        (EntryKind::Symlink, ..) => "symlink".into(),
    };
    format!("{what} {} ({detail})\n", e.path)
}

/// One line per changed path (at most [`PATHS_SHOWN`]), how many more
/// there are, then `[C created, M modified, D deleted{suffix}]` with the
/// exact counts.
fn changes_text(d: &Diff, suffix: &str) -> String {
    let lists = [
        ("created", &d.created),
        ("modified", &d.modified),
        ("deleted", &d.deleted),
    ];
    let lines: Vec<String> = lists
        .iter()
        .flat_map(|(what, list)| list.iter().map(move |e| path_line(what, e)))
        .take(PATHS_SHOWN)
        .collect();
    let total = d.created_count + d.modified_count + d.deleted_count;
    let mut text = lines.concat();
    let more = total.saturating_sub(lines.len() as u64);
    if more > 0 {
        text.push_str(&format!("… and {more} more\n"));
    }
    text.push_str(&format!(
        "[{} created, {} modified, {} deleted{suffix}]",
        d.created_count, d.modified_count, d.deleted_count
    ));
    text
}

#[tool_router(router = checkpoint_tools, vis = "pub(super)")]
impl SessionServer {
    #[tool(
        name = "createCheckpoint",
        description = "Save the workspace's files now, to diff against or restore later. Returns its checkpointId."
    )]
    async fn create_checkpoint(
        &self,
        Parameters(a): Parameters<CheckpointArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        match self.app.checkpoints.create(&sid, a.label, false).await {
            Err(e) => tool_error(e),
            Ok(made) => answer(
                format!(
                    "checkpoint {} ({} new bytes stored, {} ms)",
                    checkpoint_line(&made),
                    made.new_bytes,
                    made.duration_ms
                ),
                &dto::Checkpoint::from(made),
            ),
        }
    }

    #[tool(
        name = "listCheckpoints",
        description = "List the workspace's checkpoints, newest first."
    )]
    async fn list_checkpoints(
        &self,
        Parameters(NoArgs {}): Parameters<NoArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        match self.app.checkpoints.list(&sid).await {
            Err(e) => tool_error(e),
            Ok(all) => {
                let mut text: String = all
                    .iter()
                    .map(|c| format!("{}\n", checkpoint_line(c)))
                    .collect();
                text.push_str(&format!("[{} checkpoints, newest first]", all.len()));
                answer(text, &dto::CheckpointList::from(all))
            }
        }
    }

    #[tool(
        name = "diffCheckpoint",
        description = "List the files created, modified and deleted since a checkpoint (or between two)."
    )]
    async fn diff_checkpoint(
        &self,
        Parameters(a): Parameters<DiffArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        // "current", as the REST route has it, is the files now too.
        let (to, to_name) = match a.to {
            None => (DiffTarget::Current, "now".to_string()),
            Some(cp) if cp == "current" => (DiffTarget::Current, "now".to_string()),
            Some(cp) => (DiffTarget::Checkpoint(cp.clone()), cp),
        };
        // The REST route's default shaping: a model reads at most this.
        let shape = (a.text == Some(true)).then_some(ShapeSpec {
            max_chars: TEXT_DIFF_DEFAULT_CHARS,
            head_chars: TEXT_DIFF_DEFAULT_CHARS / 4,
            raw: true,
        });
        match self
            .app
            .checkpoints
            .diff(&sid, &a.checkpoint_id, to, shape)
            .await
        {
            Err(e) => tool_error(e),
            Ok(d) => {
                let mut text = changes_text(&d, &format!(" from {} to {to_name}", a.checkpoint_id));
                if let Some(t) = &d.text {
                    text = format!("{}\n{text}", t.diff);
                }
                answer(text, &dto::CheckpointDiff::from(d))
            }
        }
    }

    #[tool(
        name = "restoreCheckpoint",
        description = "Make the workspace's files exactly a checkpoint's; files made since are deleted. Returns what changed."
    )]
    async fn restore_checkpoint(
        &self,
        Parameters(a): Parameters<RestoreArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        let end_commands = a.end_commands.unwrap_or(false);
        match (self.app)
            .restore_checkpoint(&sid, &a.checkpoint_id, end_commands)
            .await
        {
            Err(e) => tool_error(e),
            Ok(d) => answer(
                changes_text(&d, &format!("; restored {}", a.checkpoint_id)),
                &dto::CheckpointDiff::from(d),
            ),
        }
    }
}
