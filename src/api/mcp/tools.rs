//! The tools' arguments (their JSON Schemas come from these types) and
//! every tool but `bash` (see `bash`) and the checkpoint tools (see
//! `checkpoints`): each parses nothing itself beyond
//! its arguments, calls the domain and words the answer for a model, as
//! text and as `structuredContent` (the REST body where there is one).

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::super::dto;
use super::bash::BashArgs;
use super::{SessionServer, error_result, tool_error};
use crate::files::{EntryKind, FileEdit, FileToWrite, LinesRead, SearchRequest};
use crate::ports::MAX_WAIT_MS;

/// The tools, by name.
const NAMES: [&str; 11] = [
    "bash",
    "readFile",
    "writeFile",
    "editFile",
    "listFiles",
    "searchFiles",
    "sandboxUrl",
    "createCheckpoint",
    "listCheckpoints",
    "diffCheckpoint",
    "restoreCheckpoint",
];

/// The tool's name as a metric label (`unknown` for any other).
pub(super) fn known_name(name: &str) -> &'static str {
    NAMES
        .iter()
        .find(|n| **n == name)
        .copied()
        .unwrap_or("unknown")
}

/// How long `sandboxUrl` waits for a server by default.
const URL_WAIT_MS: u64 = 15_000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ReadFileArgs {
    path: String,
    /// First line (1-based).
    start_line: Option<u64>,
    /// Last line (inclusive).
    end_line: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WriteFileArgs {
    path: String,
    /// UTF-8 text; replaces the file.
    content: String,
    /// sha256 from readFile: write only if unchanged.
    if_match: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct EditFileArgs {
    path: String,
    /// Exact text; must occur exactly once.
    old_text: String,
    new_text: String,
    /// sha256 from readFile: edit only if unchanged.
    if_match: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ListFilesArgs {
    /// Default: the workspace.
    path: Option<String>,
    /// Levels, 1-5; default 1.
    depth: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct SearchFilesArgs {
    /// Regular expression (ripgrep syntax).
    pattern: String,
    /// Directory; default: the workspace.
    path: Option<String>,
    /// File glob, e.g. `*.py`.
    glob: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct SandboxUrlArgs {
    port: u16,
}

/// `listFiles`' structured answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Listing {
    entries: Vec<ListedEntry>,
    /// Entries within the depth (exact).
    total: u64,
}

#[derive(Debug, Serialize)]
struct ListedEntry {
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    size: u64,
}

/// A result whose text is `text` and whose `structuredContent` is `body`.
pub(super) fn answer(text: String, body: &impl Serialize) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = serde_json::to_value(body).ok();
    r
}

/// The session and its sandbox id, or the tool error that says why not.
macro_rules! sandbox_of {
    ($server:expr, $ctx:expr) => {{
        let Some(session) = SessionServer::session(&$ctx) else {
            return error_result("no session on this request".into(), "invalid_request");
        };
        match $server.sandbox(&session).await {
            Ok(id) => (session, id),
            Err(e) => return e,
        }
    }};
}
pub(super) use sandbox_of;

#[tool_router(router = tool_router, vis = "pub(super)")]
impl SessionServer {
    #[tool(
        name = "bash",
        description = "Run a bash script in the sandbox. Returns its output (long output keeps head and tail, with exact omitted counts) and exit code."
    )]
    async fn bash(
        &self,
        Parameters(args): Parameters<BashArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sandbox_id) = sandbox_of!(self, ctx);
        super::bash::run(&self.app, &sandbox_id, args, &ctx).await
    }

    #[tool(
        name = "readFile",
        description = "Read a text file (or a line range). Returns the lines, the total line count and the file's sha256."
    )]
    async fn read_file(
        &self,
        Parameters(a): Parameters<ReadFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        let read = self
            .app
            .files
            .read_lines(&sid, &a.path, a.start_line, a.end_line)
            .await;
        match read {
            Err(e) => tool_error(e),
            Ok(None) => error_result(format!("{}: no such file", a.path), "file_not_found"),
            Ok(Some(lines)) => {
                let text = match &lines {
                    LinesRead::Binary { size, sha256 } => format!(
                        "{} is a binary file ({size} bytes, sha256 {sha256}); not shown",
                        a.path
                    ),
                    LinesRead::Text {
                        text,
                        start,
                        end,
                        total_lines,
                        sha256,
                        ..
                    } => format!(
                        "{text}{}[lines {start}-{end} of {total_lines} · sha256 {sha256}]",
                        if text.is_empty() || text.ends_with('\n') {
                            ""
                        } else {
                            "\n"
                        }
                    ),
                };
                answer(text, &dto::FileRead::from(Some(lines)))
            }
        }
    }

    #[tool(
        name = "writeFile",
        description = "Write a text file (parent directories are created). ifMatch: the sha256 readFile gave; refused if the file changed since."
    )]
    async fn write_file(
        &self,
        Parameters(a): Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        let sha256 = crate::files::text::sha256_hex(a.content.as_bytes());
        let size = a.content.len();
        let written = self
            .app
            .files
            .write(
                &sid,
                vec![FileToWrite {
                    path: a.path.clone(),
                    content: a.content.into_bytes(),
                    mode: None,
                    if_match: a.if_match,
                    if_none_match: None,
                }],
            )
            .await;
        match written {
            Err(e) => tool_error(e),
            Ok(()) => answer(
                format!("wrote {size} bytes to {} · sha256 {sha256}", a.path),
                &serde_json::json!({ "ok": true, "path": a.path, "size": size, "sha256": sha256 }),
            ),
        }
    }

    #[tool(
        name = "editFile",
        description = "Replace oldText with newText in a file. oldText must occur exactly once; otherwise nothing changes."
    )]
    async fn edit_file(
        &self,
        Parameters(a): Parameters<EditFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        let path = a.path.clone();
        let edit = FileEdit {
            path: a.path,
            old_text: a.old_text,
            new_text: a.new_text,
            if_match: a.if_match,
        };
        match self.app.files.edit(&sid, edit).await {
            Err(e) => tool_error(e),
            Ok(edited) => answer(
                format!("edited {path} · sha256 {}", edited.sha256),
                &dto::FileEdited::from(edited),
            ),
        }
    }

    #[tool(
        name = "listFiles",
        description = "List a directory, optionally its subdirectories too (depth)."
    )]
    async fn list_files(
        &self,
        Parameters(a): Parameters<ListFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        let path = a
            .path
            .unwrap_or_else(|| self.app.config.workspace_dir.clone());
        let tree = match self
            .app
            .files
            .list_tree(&sid, &path, a.depth.unwrap_or(1))
            .await
        {
            Ok(t) => t,
            Err(e) => return tool_error(e),
        };
        let entries: Vec<ListedEntry> = tree
            .entries
            .into_iter()
            .map(|e| ListedEntry {
                kind: match e.entry.kind {
                    EntryKind::File => "file",
                    EntryKind::Dir => "dir",
                    EntryKind::Symlink => "symlink",
                    EntryKind::Other => "other",
                },
                size: e.entry.size,
                path: e.path,
            })
            .collect();
        let mut text: String = entries
            .iter()
            .map(|e| match e.kind {
                "dir" => format!("{}/\n", e.path),
                "file" => format!("{} ({} bytes)\n", e.path, e.size),
                other => format!("{} ({other})\n", e.path),
            })
            .collect();
        text.push_str(&format!(
            "[{} of {} entries in {path}]",
            entries.len(),
            tree.total
        ));
        answer(
            text,
            &Listing {
                entries,
                total: tree.total,
            },
        )
    }

    #[tool(
        name = "searchFiles",
        description = "Search file contents with a regular expression. Returns path:line: text for each match and the total count."
    )]
    async fn search_files(
        &self,
        Parameters(a): Parameters<SearchFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (_, sid) = sandbox_of!(self, ctx);
        let req = SearchRequest {
            pattern: a.pattern,
            path: a.path,
            globs: a.glob.into_iter().collect(),
            max_results: None,
            context: None,
            case_insensitive: false,
            builtin: false,
        };
        match self.app.files.search(&sid, req).await {
            Err(e) => tool_error(e),
            Ok(r) => {
                let mut text: String = r
                    .matches
                    .iter()
                    .map(|m| format!("{}:{}: {}\n", m.path, m.line, m.text))
                    .collect();
                text.push_str(&format!(
                    "[{} of {} matches shown; {} files searched{}]",
                    r.matches.len(),
                    r.total_matches,
                    r.files_searched,
                    if r.timed_out {
                        "; stopped at the time limit"
                    } else {
                        ""
                    }
                ));
                answer(text, &dto::SearchAnswer::from(r))
            }
        }
    }

    #[tool(
        name = "sandboxUrl",
        description = "Get the public URL of a server listening on a port in the sandbox (bind 0.0.0.0). Waits for it to come up."
    )]
    async fn sandbox_url(
        &self,
        Parameters(a): Parameters<SandboxUrlArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (session, sid) = sandbox_of!(self, ctx);
        if a.port == 0 {
            return error_result("port: must be 1 to 65535".into(), "invalid_request");
        }
        let wait = Duration::from_millis(URL_WAIT_MS.min(MAX_WAIT_MS));
        let published = self
            .app
            .ports
            .publish(&sid, a.port, session.host.as_deref(), Some(wait))
            .await;
        match published {
            Err(e) => tool_error(e),
            Ok(None) => error_result(
                format!(
                    "port {} is not allowed for this session's sandbox; add it to the endpoint URL's ports query (e.g. ?ports={})",
                    a.port, a.port
                ),
                "port_not_allowed",
            ),
            Ok(Some(p)) if p.ready == Some(false) => {
                let mut r = error_result(
                    format!(
                        "nothing accepted connections on port {} within {} ms (is the server running, bound to 0.0.0.0?); its URL will be {}{}",
                        a.port,
                        wait.as_millis(),
                        p.url,
                        p.last_output
                            .as_deref()
                            .map(|o| format!("; the sandbox's latest output:\n{o}"))
                            .unwrap_or_default()
                    ),
                    "not_ready",
                );
                r.structured_content = serde_json::to_value(dto::PortUrl::from(Some(p))).ok();
                r
            }
            Ok(Some(p)) => answer(p.url.clone(), &dto::PortUrl::from(Some(p))),
        }
    }
}
