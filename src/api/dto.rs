//! Every response body the API sends, as typed structs in one place (the
//! wire types; request bodies are parsed by the domain's spec types). Each
//! is built from a domain value by a `From` impl, so handlers only choose
//! which shape to answer with. Field names are the contract in
//! docs/API.md: camelCase, and the compat ones exactly as RemcoChat's
//! client reads them.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Serialize;

use crate::command::log::Usage;
use crate::command::{Command, Finished, Listed, RunResult};
use crate::files::{Entry, EntryKind};
use crate::ports::Published;
use crate::sandbox::{Created, SandboxInfo};

/// `{"ok": true}`: the answer of actions that return nothing else.
#[derive(Debug, Serialize)]
pub(super) struct Done {
    ok: bool,
}

impl Done {
    pub(super) fn new() -> Self {
        Done { ok: true }
    }
}

/// `GET /v1/health` when the engine answers.
#[derive(Debug, Serialize)]
pub(super) struct Healthy {
    pub(super) ok: bool,
    pub(super) engine: &'static str,
    pub(super) version: String,
}

/// `GET /v1/health` when it does not.
#[derive(Debug, Serialize)]
pub(super) struct Unhealthy {
    pub(super) ok: bool,
    pub(super) engine: &'static str,
    pub(super) error: String,
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Serialize)]
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
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Sandbox {
    sandbox_id: String,
    session_key: String,
    runtime: String,
    state: &'static str,
    created_at: u64,
    last_used_at: u64,
    idle_ttl_ms: u64,
    expires_at: u64,
    resources: Resources,
    network: Network,
    ports: Ports,
    running_commands: usize,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Resources {
    vcpus: u32,
    memory_mb: u32,
}

#[derive(Debug, Serialize)]
struct Network {
    mode: &'static str,
}

#[derive(Debug, Serialize)]
struct Ports {
    allowed: Vec<u16>,
    published: BTreeMap<String, u16>,
}

impl From<SandboxInfo> for Sandbox {
    fn from(s: SandboxInfo) -> Self {
        Sandbox {
            sandbox_id: s.id,
            session_key: s.session_key,
            runtime: s.runtime,
            state: "running",
            created_at: s.created_at,
            last_used_at: s.last_used_at,
            idle_ttl_ms: s.idle_ttl_ms,
            expires_at: s.expires_at,
            resources: Resources {
                vcpus: s.resources.vcpus,
                memory_mb: s.resources.memory_mb,
            },
            network: Network {
                mode: s.network.as_str(),
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
#[derive(Debug, Serialize)]
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
#[derive(Debug, Serialize)]
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
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CommandEnded {
    exit_code: i64,
    timed_out: bool,
    killed: bool,
    duration_ms: u64,
    /// The memory limit's OOM killer ended it (absent when the sandbox
    /// itself went away under the command).
    #[serde(skip_serializing_if = "Option::is_none")]
    oom_killed: Option<bool>,
    /// CPU time and peak memory of its process tree (same condition).
    #[serde(skip_serializing_if = "Option::is_none")]
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
            usage: f.usage,
        }
    }
}

/// `POST …/commands:run`.
#[derive(Debug, Serialize)]
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
    oom_killed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

impl From<RunResult> for CommandRun {
    fn from(r: RunResult) -> Self {
        CommandRun {
            exit_code: r.finished.exit.exit_code,
            stdout: r.stdout,
            stderr: r.stderr,
            stdout_truncated_bytes: r.stdout_truncated_bytes,
            stderr_truncated_bytes: r.stderr_truncated_bytes,
            timed_out: r.finished.exit.timed_out,
            killed: r.finished.exit.killed,
            duration_ms: r.finished.duration_ms,
            timeout_ms: r.timeout_ms,
            oom_killed: r.finished.oom_killed,
            usage: r.finished.usage,
        }
    }
}

/// One entry of `GET …/commands`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CommandListed {
    command_id: String,
    state: &'static str,
    exit_code: Option<i64>,
    timed_out: Option<bool>,
    killed: Option<bool>,
    started_at: u64,
    finished_at: Option<u64>,
    duration_ms: Option<u64>,
    summary: String,
    timeout_ms: u64,
    /// Processes of its tree alive now (after its end: what it left
    /// running); `null` when the sandbox's agent did not say.
    processes: Option<u32>,
}

impl From<&Listed> for CommandListed {
    fn from(l: &Listed) -> Self {
        let c = &l.command;
        let f = c.finished();
        CommandListed {
            command_id: c.id.clone(),
            state: if f.is_some() { "exited" } else { "running" },
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

/// `GET …/commands`.
#[derive(Debug, Serialize)]
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

/// `GET …/files:read`: the content as standard base64, or not found.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FileRead {
    found: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_base64: Option<String>,
}

impl From<Option<Vec<u8>>> for FileRead {
    fn from(content: Option<Vec<u8>>) -> Self {
        FileRead {
            found: content.is_some(),
            content_base64: content.map(|c| base64::engine::general_purpose::STANDARD.encode(c)),
        }
    }
}

/// One entry of `GET …/files:list`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FileEntry {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    size: u64,
    mtime_ms: i64,
    mode: u32,
}

/// `GET …/files:list`.
#[derive(Debug, Serialize)]
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
                        EntryKind::File => "file",
                        EntryKind::Dir => "dir",
                        EntryKind::Symlink => "symlink",
                        EntryKind::Other => "other",
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
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PortUrl {
    found: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    host_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
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
#[derive(Debug, Serialize)]
pub(super) struct ErrorBody<'a> {
    pub(super) error: &'a str,
    pub(super) code: &'static str,
}
