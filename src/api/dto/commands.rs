//! The bodies of the command routes: a command started, ended, run or
//! listed, what shaping kept of its output and what it changed in the
//! workspace, and the records of its NDJSON log stream.

use serde::Serialize;
use utoipa::ToSchema;

use crate::checkpoints::CheckpointInfo;
use crate::command::changes::{self, Changes};
use crate::command::log;
use crate::command::{Command, Finished, Listed, RunResult};

/// `POST …/commands`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct CommandStarted {
    command_id: String,
    /// The effective timeout: what was asked for, capped to the maximum.
    timeout_ms: u64,
    /// The pid of its own process in the sandbox; `null` when it could
    /// not start (it ends at once with 126 or 127).
    #[schema(required = true)]
    pid: Option<u32>,
    /// With `checkpoint` in the request: the checkpoint taken just before
    /// the command started.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    checkpoint_id: Option<String>,
}

impl From<&Command> for CommandStarted {
    fn from(c: &Command) -> Self {
        CommandStarted {
            command_id: c.id.clone(),
            timeout_ms: c.timeout_ms,
            pid: c.pid,
            checkpoint_id: None,
        }
    }
}

impl CommandStarted {
    pub(in crate::api) fn with_checkpoint(self, made: Option<CheckpointInfo>) -> Self {
        CommandStarted {
            checkpoint_id: made.map(|m| m.checkpoint_id),
            ..self
        }
    }
}

/// `GET …/commands/{cid}/wait`: how a command ended.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct CommandEnded {
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
pub(in crate::api) struct Usage {
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
pub(in crate::api) struct CommandRun {
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
    /// With `checkpoint` in the request: the checkpoint taken just before
    /// the command started.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    checkpoint_id: Option<String>,
}

impl CommandRun {
    pub(in crate::api) fn with_checkpoint(self, made: Option<CheckpointInfo>) -> Self {
        CommandRun {
            checkpoint_id: made.map(|m| m.checkpoint_id),
            ..self
        }
    }
}

/// The files a command created, modified and deleted in the workspace by
/// the time its own process ended, sorted by path. Directories are not
/// listed (the files in them are); ignored directories are left out.
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(in crate::api) struct WorkspaceChanges {
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
pub(in crate::api) struct ChangedFile {
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
            checkpoint_id: None,
        }
    }
}

/// What shaping kept of each stream (`output` in the request).
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(deny_unknown_fields)]
pub(in crate::api) struct OutputShapes {
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
pub(in crate::api) struct OutputShape {
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
pub(in crate::api) struct OutputMiddle {
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

/// One line of a command's log stream (`application/x-ndjson`), told apart
/// by `stream`. The domain renders the lines; this type describes them, and
/// a test parses the domain's lines with it.
#[derive(Debug, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(tag = "stream", rename_all = "lowercase", deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "it describes lines the domain renders and is never built here"
)]
pub(in crate::api) enum LogRecord {
    /// A chunk of stdout as read from the pipe (not a line).
    Stdout { data: String, seq: u64 },
    /// A chunk of stderr as read from the pipe (not a line).
    Stderr { data: String, seq: u64 },
    /// Records this reader missed: `bytes` of raw output; `seq` is that of
    /// the last record it stands for.
    Dropped { bytes: u64, seq: u64 },
    /// Nothing new for `log_heartbeat_ms`; `seq` is the stream's position.
    Heartbeat { seq: u64 },
    /// Something outside the command happened to it.
    Error { message: String, seq: u64 },
    /// The command ended; the stream ends here unless `leftovers=true`.
    #[serde(rename_all = "camelCase")]
    Exit {
        exit_code: i64,
        timed_out: bool,
        killed: bool,
        #[serde(default)]
        #[schema(nullable = false)]
        oom_killed: Option<bool>,
        #[serde(default)]
        #[schema(nullable = false)]
        usage: Option<Usage>,
        /// With `output` in the request: each stream shaped (see
        /// `OutputShape`), when the agent still had them.
        #[serde(default)]
        #[schema(nullable = false)]
        stdout: Option<String>,
        #[serde(default)]
        #[schema(nullable = false)]
        stderr: Option<String>,
        #[serde(default)]
        #[schema(nullable = false)]
        output: Option<Box<OutputShapes>>,
        /// For a command started with `changes`: what it changed in the
        /// workspace (absent when the sandbox's agent could not say).
        #[serde(default)]
        #[schema(nullable = false)]
        changes: Option<WorkspaceChanges>,
        seq: u64,
    },
}

/// One entry of `GET …/commands`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(in crate::api) struct CommandListed {
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
    /// The pid of its own process in the sandbox; `null` when it could
    /// not start or its agent did not say.
    #[schema(required = true)]
    pid: Option<u32>,
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
            pid: c.pid,
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
pub(in crate::api) struct CommandList {
    commands: Vec<CommandListed>,
}

impl From<Vec<Listed>> for CommandList {
    fn from(list: Vec<Listed>) -> Self {
        CommandList {
            commands: list.iter().map(CommandListed::from).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines the domain renders parse as [`LogRecord`]s, unknown
    /// fields refused, so the schema lists every field they have.
    #[test]
    fn the_log_record_schema_reads_the_domain_lines() {
        use crate::command::log;
        let exit = log::ExitInfo {
            exit_code: 0,
            timed_out: false,
            killed: false,
        };
        let shape = log::Shape {
            total_chars: 10,
            total_lines: 2,
            total_bytes: 10,
            omitted_chars: 4,
            omitted_lines: 1,
            omitted_bytes: 4,
            head_chars: 2,
            tail_chars: 2,
            binary: false,
            collapsed: false,
            middle: Some(log::Middle {
                command_id: "c".into(),
                after: 1,
                until: 2,
                skip_chars: 0,
                retained: true,
            }),
        };
        let shaped = log::Shaped {
            stdout: "a\n[…]\nb\n".into(),
            stderr: String::new(),
            shapes: log::Shapes {
                stdout: shape.clone(),
                stderr: log::Shape {
                    middle: None,
                    ..shape
                },
            },
        };
        let exit_line = |oom_killed, usage, shaped, seq| {
            log::LogLine::Exit(Box::new(log::ExitRecord {
                exit,
                oom_killed,
                usage,
                shaped,
                changes: None,
                seq,
            }))
            .render()
        };
        let lines = [
            log::LogLine::Heartbeat { seq: 3 }.render(),
            log::LogLine::Error {
                message: "gone".into(),
                seq: 4,
            }
            .render(),
            exit_line(None, None, None, 5),
            exit_line(
                Some(false),
                Some(log::Usage {
                    cpu_user_ms: 1,
                    cpu_system_ms: 2,
                    max_rss_kb: 3,
                }),
                Some(shaped),
                6,
            ),
        ];
        lines.iter().for_each(|l| {
            serde_json::from_slice::<LogRecord>(l)
                .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(l)));
        });
    }
}
