//! Every response body the API sends, as typed structs in one place (the
//! wire types; request bodies live with their routes). Each is built from
//! a domain value by a `From` impl, so handlers only choose which shape to
//! answer with. Field names are the contract in docs/API.md: camelCase,
//! and the compat ones exactly as RemcoChat's client reads them. Each also
//! derives its OpenAPI schema (see `openapi`), so the document describes
//! exactly what is sent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::ErrorCode;
use crate::command::changes::{self, Changes};
use crate::command::log;
use crate::command::{Command, Finished, Listed, RunResult};
use crate::files::{Entry, EntryKind, FileContent, LinesRead, Mismatch, PathInfo, SearchResult};
use crate::ports::Published;
use crate::pty::PtyInfo;
use crate::sandbox::spec::NetworkMode;
use crate::sandbox::{Created, SandboxInfo};

/// `{"ok": true}`: the answer of actions that return nothing else.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Done {
    /// Always `true`.
    ok: bool,
}

impl Done {
    pub(super) fn new() -> Self {
        Done { ok: true }
    }
}

/// `GET /v1/health` when the engine answers.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Healthy {
    pub(super) ok: bool,
    pub(super) engine: &'static str,
    pub(super) version: String,
}

/// `GET /v1/health` when it does not.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Unhealthy {
    pub(super) ok: bool,
    pub(super) engine: &'static str,
    pub(super) error: String,
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxCreated {
    sandbox_id: String,
    created: bool,
}

impl From<Created> for SandboxCreated {
    fn from(c: Created) -> Self {
        SandboxCreated {
            sandbox_id: c.sandbox_id,
            created: c.created,
        }
    }
}

/// A sandbox, as `GET /v1/sandboxes/{id}` and the list show it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct Sandbox {
    sandbox_id: String,
    session_key: String,
    runtime: String,
    state: SandboxState,
    created_at: u64,
    last_used_at: u64,
    idle_ttl_ms: u64,
    expires_at: u64,
    resources: Resources,
    network: Network,
    ports: Ports,
    running_commands: usize,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct Resources {
    vcpus: u32,
    memory_mb: u32,
}

/// Always `running` in this build (a stopped container is started again
/// when looked at).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum SandboxState {
    Running,
}

#[derive(Debug, Serialize, ToSchema)]
struct Network {
    mode: Mode,
    /// Mode `allowlist`: the domains and CIDRs the request allowed
    /// (canonical; the server's `egress_allow` applies too).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allow: Vec<String>,
}

/// What the sandbox's network reaches (`default` is resolved at create):
/// `internet`: public addresses through the egress proxy, never the host,
/// private or link-local ones; `allowlist`: only the listed domains and
/// CIDRs, the same never-list on top; `open`: whatever the engine's bridge
/// reaches; `none`: loopback only.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Mode {
    None,
    Internet,
    Allowlist,
    Open,
}

impl From<NetworkMode> for Mode {
    fn from(m: NetworkMode) -> Self {
        match m {
            NetworkMode::None => Mode::None,
            NetworkMode::Internet => Mode::Internet,
            NetworkMode::Allowlist => Mode::Allowlist,
            NetworkMode::Open => Mode::Open,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
struct Ports {
    allowed: Vec<u16>,
    /// Published port (as a string key) to its host port.
    published: BTreeMap<String, u16>,
}

impl From<SandboxInfo> for Sandbox {
    fn from(s: SandboxInfo) -> Self {
        Sandbox {
            sandbox_id: s.id,
            session_key: s.session_key,
            runtime: s.runtime,
            state: SandboxState::Running,
            created_at: s.created_at,
            last_used_at: s.last_used_at,
            idle_ttl_ms: s.idle_ttl_ms,
            expires_at: s.expires_at,
            resources: Resources {
                vcpus: s.resources.vcpus,
                memory_mb: s.resources.memory_mb,
            },
            network: Network {
                mode: s.network.into(),
                allow: s.allow,
            },
            ports: Ports {
                allowed: s.ports.allowed.into_iter().collect(),
                published: s
                    .ports
                    .published
                    .into_iter()
                    .map(|(p, h)| (p.to_string(), h))
                    .collect(),
            },
            running_commands: s.running_commands,
        }
    }
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SandboxList {
    sandboxes: Vec<Sandbox>,
}

impl From<Vec<SandboxInfo>> for SandboxList {
    fn from(list: Vec<SandboxInfo>) -> Self {
        SandboxList {
            sandboxes: list.into_iter().map(Sandbox::from).collect(),
        }
    }
}

/// `POST …/commands`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct CommandStarted {
    command_id: String,
    /// The effective timeout: what was asked for, capped to the maximum.
    timeout_ms: u64,
}

impl From<&Command> for CommandStarted {
    fn from(c: &Command) -> Self {
        CommandStarted {
            command_id: c.id.clone(),
            timeout_ms: c.timeout_ms,
        }
    }
}

/// `GET …/commands/{cid}/wait`: how a command ended.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct CommandEnded {
    exit_code: i64,
    timed_out: bool,
    killed: bool,
    duration_ms: u64,
    /// The memory limit's OOM killer ended it (absent when the sandbox
    /// itself went away under the command).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    oom_killed: Option<bool>,
    /// CPU time and peak memory of its process tree (same condition).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    usage: Option<Usage>,
}

impl From<Finished> for CommandEnded {
    fn from(f: Finished) -> Self {
        CommandEnded {
            exit_code: f.exit.exit_code,
            timed_out: f.exit.timed_out,
            killed: f.exit.killed,
            duration_ms: f.duration_ms,
            oom_killed: f.oom_killed,
            usage: f.usage.map(Usage::from),
        }
    }
}

/// CPU time and peak memory of a command's processes (those ended by the
/// time it ended).
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Usage {
    cpu_user_ms: u64,
    cpu_system_ms: u64,
    max_rss_kb: u64,
}

impl From<log::Usage> for Usage {
    fn from(u: log::Usage) -> Self {
        Usage {
            cpu_user_ms: u.cpu_user_ms,
            cpu_system_ms: u.cpu_system_ms,
            max_rss_kb: u.max_rss_kb,
        }
    }
}

/// `POST …/commands:run`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct CommandRun {
    exit_code: i64,
    stdout: String,
    stderr: String,
    stdout_truncated_bytes: u64,
    stderr_truncated_bytes: u64,
    timed_out: bool,
    killed: bool,
    duration_ms: u64,
    timeout_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    oom_killed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    usage: Option<Usage>,
    /// With `output` in the request: what shaping kept of each stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    output: Option<OutputShapes>,
    /// With `changes`: what the command changed in the workspace (absent
    /// when the sandbox's agent could not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    changes: Option<WorkspaceChanges>,
}

/// The files a command created, modified and deleted in the workspace by
/// the time its own process ended, sorted by path. Directories are not
/// listed (the files in them are); ignored directories are left out.
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct WorkspaceChanges {
    /// At most `max` of them, the first by path.
    files: Vec<ChangedFile>,
    /// How many changes there are beyond `files` (exact).
    more: u64,
    /// `inotify`: events while the command ran; `scan`: the workspace at
    /// the start against the end (inotify could not be used).
    method: ChangeMethod,
    /// `false` when a change may be missing or may not be one (see
    /// docs/API.md).
    complete: bool,
}

/// One changed file.
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(deny_unknown_fields)]
pub(super) struct ChangedFile {
    /// Relative to the workspace.
    path: String,
    kind: ChangeKind,
    /// Bytes now; absent when deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    size: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(rename_all = "lowercase")]
enum ChangeKind {
    Created,
    Modified,
    Deleted,
}

#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(rename_all = "lowercase")]
enum ChangeMethod {
    Inotify,
    Scan,
}

impl From<Changes> for WorkspaceChanges {
    fn from(c: Changes) -> Self {
        WorkspaceChanges {
            files: c
                .files
                .into_iter()
                .map(|f| ChangedFile {
                    path: f.path,
                    kind: match f.kind {
                        changes::Kind::Created => ChangeKind::Created,
                        changes::Kind::Modified => ChangeKind::Modified,
                        changes::Kind::Deleted => ChangeKind::Deleted,
                    },
                    size: f.size,
                })
                .collect(),
            more: c.more,
            method: match c.method {
                changes::Method::Inotify => ChangeMethod::Inotify,
                changes::Method::Scan => ChangeMethod::Scan,
            },
            complete: c.complete,
        }
    }
}

impl From<RunResult> for CommandRun {
    fn from(r: RunResult) -> Self {
        let t = r.tails;
        CommandRun {
            exit_code: r.finished.exit.exit_code,
            stdout: t.stdout,
            stderr: t.stderr,
            stdout_truncated_bytes: t.stdout_cut,
            stderr_truncated_bytes: t.stderr_cut,
            timed_out: r.finished.exit.timed_out,
            killed: r.finished.exit.killed,
            duration_ms: r.finished.duration_ms,
            timeout_ms: r.timeout_ms,
            oom_killed: r.finished.oom_killed,
            usage: r.finished.usage.map(Usage::from),
            output: t.shapes.map(OutputShapes::from),
            changes: r.changes.map(WorkspaceChanges::from),
        }
    }
}

/// What shaping kept of each stream (`output` in the request).
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(deny_unknown_fields)]
pub(super) struct OutputShapes {
    stdout: OutputShape,
    stderr: OutputShape,
}

/// One shaped stream: `stdout` (or `stderr`) is its first `headChars`
/// characters, a line saying what was omitted (only when something was),
/// and its last `tailChars` characters. Counts other than those two are of
/// the stream's text as the log holds it (before collapsing).
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct OutputShape {
    total_chars: u64,
    /// Newlines, plus one for a last line without one.
    total_lines: u64,
    /// Bytes the stream wrote.
    total_bytes: u64,
    omitted_chars: u64,
    /// Newlines in the omitted part (whole lines, as the cuts fall on line
    /// boundaries where they can).
    omitted_lines: u64,
    /// UTF-8 bytes of the omitted part.
    omitted_bytes: u64,
    head_chars: u64,
    tail_chars: u64,
    /// Not text (a NUL byte, or more than 32 sequences that are not
    /// UTF-8): nothing of it is shown.
    binary: bool,
    /// Escape sequences or carriage returns were collapsed in what is shown.
    collapsed: bool,
    /// Where the omitted part is in the command's log, when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    middle: Option<OutputMiddle>,
}

/// The omitted part of a stream: read `GET …/commands/{commandId}/logs?after={after}`,
/// skip the first `skipChars` characters of this stream's records, then
/// take `omittedChars`; the last of them is in record `until`.
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct OutputMiddle {
    command_id: String,
    after: u64,
    until: u64,
    skip_chars: u64,
    /// The log still holds all of it (its ring keeps the newest output).
    retained: bool,
}

impl From<log::Shapes> for OutputShapes {
    fn from(s: log::Shapes) -> Self {
        OutputShapes {
            stdout: s.stdout.into(),
            stderr: s.stderr.into(),
        }
    }
}

impl From<log::Shape> for OutputShape {
    fn from(s: log::Shape) -> Self {
        OutputShape {
            total_chars: s.total_chars,
            total_lines: s.total_lines,
            total_bytes: s.total_bytes,
            omitted_chars: s.omitted_chars,
            omitted_lines: s.omitted_lines,
            omitted_bytes: s.omitted_bytes,
            head_chars: s.head_chars,
            tail_chars: s.tail_chars,
            binary: s.binary,
            collapsed: s.collapsed,
            middle: s.middle.map(|m| OutputMiddle {
                command_id: m.command_id,
                after: m.after,
                until: m.until,
                skip_chars: m.skip_chars,
                retained: m.retained,
            }),
        }
    }
}

/// One entry of `GET …/commands`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct CommandListed {
    command_id: String,
    state: CommandState,
    /// `null` while it runs (so are the other fields about its end).
    #[schema(required = true)]
    exit_code: Option<i64>,
    #[schema(required = true)]
    timed_out: Option<bool>,
    #[schema(required = true)]
    killed: Option<bool>,
    started_at: u64,
    #[schema(required = true)]
    finished_at: Option<u64>,
    #[schema(required = true)]
    duration_ms: Option<u64>,
    summary: String,
    timeout_ms: u64,
    /// Processes of its tree alive now (after its end: what it left
    /// running); `null` when the sandbox's agent did not say.
    #[schema(required = true)]
    processes: Option<u32>,
}

impl From<&Listed> for CommandListed {
    fn from(l: &Listed) -> Self {
        let c = &l.command;
        let f = c.finished();
        CommandListed {
            command_id: c.id.clone(),
            state: if f.is_some() {
                CommandState::Exited
            } else {
                CommandState::Running
            },
            exit_code: f.map(|f| f.exit.exit_code),
            timed_out: f.map(|f| f.exit.timed_out),
            killed: f.map(|f| f.exit.killed),
            started_at: c.started_at,
            finished_at: f.map(|f| f.finished_at),
            duration_ms: f.map(|f| f.duration_ms),
            summary: c.summary.clone(),
            timeout_ms: c.timeout_ms,
            processes: l.processes,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum CommandState {
    Running,
    Exited,
}

/// `GET …/commands`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CommandList {
    commands: Vec<CommandListed>,
}

impl From<Vec<Listed>> for CommandList {
    fn from(list: Vec<Listed>) -> Self {
        CommandList {
            commands: list.iter().map(CommandListed::from).collect(),
        }
    }
}

/// `GET …/files:read`: the content as standard base64 (or, with
/// `startLine`/`endLine`, a range of lines as text), or not found.
#[derive(Debug, Default, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct FileRead {
    found: bool,
    /// Standard base64 with padding; present when `found` and no lines
    /// were asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    content_base64: Option<String>,
    /// Lowercase hex SHA-256 of the whole file; present when `found`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    sha256: Option<String>,
    /// The file's size in bytes; present when lines were asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    size: Option<u64>,
    /// Lines were asked for and the file is not text (a NUL byte, or not
    /// UTF-8): no content is sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    binary: Option<bool>,
    /// The lines asked for, exactly as in the file (line endings kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    content: Option<String>,
    /// The range returned: `endLine` is lowered to the last line; past the
    /// end, `content` is empty and `endLine` is `startLine - 1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    start_line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    end_line: Option<u64>,
    /// Lines in the whole file (text after the last `\n` counts as one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    total_lines: Option<u64>,
}

impl From<Option<FileContent>> for FileRead {
    fn from(content: Option<FileContent>) -> Self {
        match content {
            None => FileRead::default(),
            Some(c) => FileRead {
                found: true,
                content_base64: Some(c.content_base64),
                sha256: Some(c.sha256),
                ..FileRead::default()
            },
        }
    }
}

/// The answer to a whole-file `files:read`: the JSON of [`FileRead`],
/// written directly when the file was found. Its base64 and hex need no
/// escaping, and serde_json would look at each of the millions of
/// characters of a large file to see that.
pub(super) fn file_read_response(content: Option<FileContent>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(c) = content else {
        return axum::Json(FileRead::default()).into_response();
    };
    let mut body = String::with_capacity(c.content_base64.len() + c.sha256.len() + 64);
    body.push_str(r#"{"found":true,"contentBase64":""#);
    body.push_str(&c.content_base64);
    body.push_str(r#"","sha256":""#);
    body.push_str(&c.sha256);
    body.push_str(r#""}"#);
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

impl From<Option<LinesRead>> for FileRead {
    fn from(lines: Option<LinesRead>) -> Self {
        match lines {
            None => FileRead::default(),
            Some(LinesRead::Binary { size, sha256 }) => FileRead {
                found: true,
                sha256: Some(sha256),
                size: Some(size),
                binary: Some(true),
                ..FileRead::default()
            },
            Some(LinesRead::Text {
                text,
                start,
                end,
                total_lines,
                size,
                sha256,
            }) => FileRead {
                found: true,
                sha256: Some(sha256),
                size: Some(size),
                binary: Some(false),
                content: Some(text),
                start_line: Some(start),
                end_line: Some(end),
                total_lines: Some(total_lines),
                ..FileRead::default()
            },
        }
    }
}

/// A file of a refused write (`precondition_failed`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedFile {
    /// As the request gave it.
    path: String,
    /// Lowercase hex SHA-256 of the file now; `null`: no file is there.
    current_sha256: Option<String>,
}

impl From<Mismatch> for FailedFile {
    fn from(m: Mismatch) -> Self {
        FailedFile {
            path: m.path,
            current_sha256: m.current_sha256,
        }
    }
}

/// `POST …/files:stat`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct StatList {
    /// One per path asked for, in the same order.
    entries: Vec<StatEntry>,
}

/// What one path is.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct StatEntry {
    /// As the request gave it.
    path: String,
    /// The final symlink is not followed.
    #[serde(rename = "type")]
    kind: StatKind,
    /// Bytes (a symlink: its target's length); 0 when missing.
    size: u64,
    /// Permission bits in octal, e.g. `"0644"`; `"0000"` when missing.
    mode: String,
    /// 0 when missing.
    mtime_ms: i64,
    /// Lowercase hex; present for a regular file when `sha256` was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    sha256: Option<String>,
}

/// `other`: a FIFO, socket or device; `missing`: nothing is there.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum StatKind {
    File,
    Dir,
    Symlink,
    Other,
    Missing,
}

impl From<Vec<PathInfo>> for StatList {
    fn from(infos: Vec<PathInfo>) -> Self {
        StatList {
            entries: infos
                .into_iter()
                .map(|i| StatEntry {
                    path: i.path,
                    kind: match i.kind {
                        None => StatKind::Missing,
                        Some(EntryKind::File) => StatKind::File,
                        Some(EntryKind::Dir) => StatKind::Dir,
                        Some(EntryKind::Symlink) => StatKind::Symlink,
                        Some(EntryKind::Other) => StatKind::Other,
                    },
                    size: i.size,
                    mode: format!("{:04o}", i.mode),
                    mtime_ms: i.mtime_ms,
                    sha256: i.sha256,
                })
                .collect(),
        }
    }
}

/// `POST …/files:search`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct SearchAnswer {
    /// In path order, then line order; at most `maxResults`.
    matches: Vec<SearchMatchDto>,
    /// Every matching line in what was searched, past the cap too.
    total_matches: u64,
    /// `matches.length`.
    returned: u64,
    files_searched: u64,
    /// Files left out as binary or larger than 16 MiB (counted by the
    /// built-in search; `rg` skips them without counting).
    files_skipped: u64,
    /// `returned < totalMatches`.
    truncated: bool,
    /// `rg` did the search; otherwise the agent's own did.
    used_rg: bool,
    /// Why `rg` was not used, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    rg_unavailable: Option<String>,
    /// The search stopped at its deadline (three quarters of
    /// `agent_timeout_ms`): the counts are what it saw by then.
    timed_out: bool,
}

/// One matching line.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SearchMatchDto {
    /// Absolute under the workspace.
    path: String,
    /// 1-based.
    line: u64,
    /// 1-based byte offset of the first match in the line.
    column: u64,
    /// The line without its ending, cut to 1024 bytes.
    text: String,
    /// Up to `context` lines before it, nearest last.
    before: Vec<String>,
    /// Up to `context` lines after it.
    after: Vec<String>,
}

impl From<SearchResult> for SearchAnswer {
    fn from(r: SearchResult) -> Self {
        SearchAnswer {
            returned: r.matches.len() as u64,
            matches: r
                .matches
                .into_iter()
                .map(|m| SearchMatchDto {
                    path: m.path,
                    line: m.line,
                    column: m.column,
                    text: m.text,
                    before: m.before,
                    after: m.after,
                })
                .collect(),
            total_matches: r.total_matches,
            files_searched: r.files_searched,
            files_skipped: r.files_skipped,
            truncated: r.truncated,
            used_rg: r.used_rg,
            rg_unavailable: r.rg_unavailable,
            timed_out: r.timed_out,
        }
    }
}

/// One entry of `GET …/files:list`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct FileEntry {
    name: String,
    #[serde(rename = "type")]
    kind: FileKind,
    size: u64,
    mtime_ms: i64,
    mode: u32,
}

/// `other`: a FIFO, socket or device. Symlinks are not followed.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// `GET …/files:list`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct FileList {
    entries: Vec<FileEntry>,
}

impl From<Vec<Entry>> for FileList {
    fn from(entries: Vec<Entry>) -> Self {
        FileList {
            entries: entries
                .into_iter()
                .map(|e| FileEntry {
                    name: e.name,
                    kind: match e.kind {
                        EntryKind::File => FileKind::File,
                        EntryKind::Dir => FileKind::Dir,
                        EntryKind::Symlink => FileKind::Symlink,
                        EntryKind::Other => FileKind::Other,
                    },
                    size: e.size,
                    mtime_ms: e.mtime_ms,
                    mode: e.mode,
                })
                .collect(),
        }
    }
}

/// `GET …/ports/{port}`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct PortUrl {
    found: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    host_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    last_output: Option<String>,
}

impl From<Option<Published>> for PortUrl {
    fn from(p: Option<Published>) -> Self {
        match p {
            None => PortUrl {
                found: false,
                host_port: None,
                url: None,
                ready: None,
                last_output: None,
            },
            Some(p) => PortUrl {
                found: true,
                host_port: Some(p.host_port),
                url: Some(p.url),
                ready: p.ready,
                last_output: p.last_output,
            },
        }
    }
}

/// Every error answer: a sentence and a stable code.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ErrorBody<'a> {
    /// A human sentence; not stable.
    pub(super) error: &'a str,
    pub(super) code: ErrorCode,
    /// `precondition_failed` only: each file whose `ifMatch` or
    /// `ifNoneMatch` did not hold, with its hash now.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub(super) failed: Option<&'a [FailedFile]>,
}

/// `POST …/ptys`: the new session.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct PtyOpened {
    pub(super) pty_id: String,
}

/// `GET …/ptys`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PtyList {
    ptys: Vec<PtyEntry>,
}

/// A terminal session.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct PtyEntry {
    pty_id: String,
    /// The command as asked for, or `(login shell)`.
    command: String,
    created_at: u64,
    /// WebSockets attached now.
    viewers: usize,
    /// `running` or `exited`.
    state: &'static str,
    /// Once exited: its exit code, or `null` when a signal ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    /// Once exited by a signal: its number.
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_ms: Option<u64>,
}

impl From<Vec<PtyInfo>> for PtyList {
    fn from(list: Vec<PtyInfo>) -> Self {
        PtyList {
            ptys: list
                .into_iter()
                .map(|p| PtyEntry {
                    pty_id: p.pty_id,
                    command: p.command,
                    created_at: p.created_at,
                    viewers: p.viewers,
                    state: if p.ended.is_some() {
                        "exited"
                    } else {
                        "running"
                    },
                    exit_code: p.ended.and_then(|e| e.exit_code),
                    signal: p.ended.and_then(|e| e.signal),
                    ended_at: p.ended.map(|e| e.ended_at_ms),
                    duration_ms: p.ended.map(|e| e.duration_ms),
                })
                .collect(),
        }
    }
}

/// `POST …/ptys/{ptyId}:ticket`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct PtyTicket {
    pub(super) ticket: String,
    pub(super) expires_in_ms: u64,
}

/// A text frame from a viewer.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(super) enum PtyControl {
    Resize { cols: u16, rows: u16 },
}

/// A text frame to a viewer.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(super) enum PtyMessage {
    /// Whether this viewer's input is typed into the session.
    Writer { writer: bool },
    /// The session's process ended; a normal close follows.
    #[serde(rename_all = "camelCase")]
    Exit {
        #[serde(skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// This viewer fell behind the scrollback: it missed this many bytes,
    /// and output goes on from the oldest byte kept.
    #[serde(rename_all = "camelCase")]
    Lagged { skipped_bytes: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer written directly is the JSON of `FileRead` for the same
    /// content, and a missing file's is too.
    #[tokio::test]
    async fn a_whole_file_read_is_the_json_of_file_read() {
        for content in [
            None,
            Some(FileContent {
                content_base64: "aGVsbG8/+w==".into(),
                sha256: "ab".repeat(32),
            }),
        ] {
            let want = serde_json::to_value(FileRead::from(content.clone())).expect("value");
            let response = file_read_response(content);
            assert_eq!(
                response.headers().get(axum::http::header::CONTENT_TYPE),
                Some(&axum::http::HeaderValue::from_static("application/json"))
            );
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            let got: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(got, want);
        }
    }
}
