//! Every response body the API sends, as typed structs in one place (the
//! wire types; request bodies live with their routes, or in the domain
//! where it takes them as they come). Each is built from a domain value by
//! a `From` impl, so handlers only choose which shape to answer with. Field
//! names are the contract in docs/API.md: camelCase, and the compat ones
//! exactly as RemcoChat's client reads them. Each also derives its OpenAPI
//! schema (see `openapi`), so the document describes exactly what is sent.
//! This file holds the sandbox, port and terminal bodies; `checkpoints`,
//! `commands`, `files` and `tokens` the bodies of those routes.

mod checkpoints;
mod commands;
mod files;
mod tokens;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub(super) use checkpoints::*;
pub(super) use commands::*;
pub(super) use files::*;
pub(super) use tokens::*;

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
    /// What its creator gave it (`{}` when nothing).
    metadata: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct Resources {
    vcpus: u32,
    memory_mb: u32,
}

/// `running` (a stopped container is started again when looked at) or
/// `paused` (its processes frozen until `:resume`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum SandboxState {
    Running,
    Paused,
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
            state: if s.paused {
                SandboxState::Paused
            } else {
                SandboxState::Running
            },
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
            metadata: s.metadata,
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
