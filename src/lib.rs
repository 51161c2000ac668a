//! sandboxd: one hardened Docker container per chat session, behind a small
//! HTTP API, so a chat backend's `bash`, `readFile`, `writeFile` and
//! `sandboxUrl` tools never run anything on the host.
//!
//! The data path: a request enters at [`api`], where it is authorised and
//! parsed into typed values; the domain ([`sandbox`]) decides what to do;
//! only [`engine`] turns that into Docker Engine API calls. Answers travel
//! back the same way, and each layer sees only the types of the one below.
//!
//! - [`config`]: defaults, TOML file, environment; validated once.
//! - [`server`]: bind, background tasks, graceful shutdown.
//! - [`app`]: the shared state handlers get.
//! - [`api`]: routes, auth, extractors, the one error type.
//! - [`sandbox`]: registry, lifecycle, labels, reaper, rehydration.
//! - [`command`]: commands, their output logs, timeouts and tree kills.
//! - [`files`]: read, write, list, delete inside the workspace, symlink-safe.
//! - [`checkpoints`]: the workspace recorded, compared and restored, kept
//!   deduplicated in the state directory.
//! - [`ports`]: relays and proxy containers that publish sandbox ports.
//! - [`pty`]: terminal sessions, their viewers and attach tickets.
//! - [`session_tokens`]: tokens scoped to one session, kept as hashes in
//!   the state directory.
//! - [`telemetry`]: Prometheus metrics and request ids.
//! - [`healthcheck`]: the `sandboxd healthcheck` subcommand.
//! - [`id`]: random identifiers.
//! - [`clock`]: wall-clock milliseconds.
//! - [`field_error`]: the one error type of request parsing.
//! - [`process_fields`]: the fields of a request to start a process.
//! - [`workspace_path`]: the lexical rules of paths in the workspace.
//! - [`subnet`]: link-network block arithmetic.
//! - [`origin_policy`]: which `Host` and `Origin` values name this server.
//! - [`engine`]: the container engine, behind a small interface.
//! - [`agent_client`]: the connection to the agent inside each sandbox, one
//!   typed method per operation.

pub mod agent_client;
pub mod api;
pub mod app;
pub mod checkpoints;
pub mod clock;
pub mod command;
pub mod config;
pub mod durable_file;
pub mod engine;
pub mod field_error;
pub mod files;
pub mod healthcheck;
pub mod id;
pub mod origin_policy;
pub mod ports;
pub mod process_fields;
pub mod pty;
pub mod sandbox;
pub mod server;
pub mod session_tokens;
pub mod subnet;
pub mod telemetry;
pub mod workspace_path;

/// The layering rules, checked against the source with the `layering` dev
/// crate (tools/layering): every import between top-level modules points at
/// a lower layer (or, between leaves, at another leaf), no modules form an
/// import cycle, the agent's envelope stays in `agent_client`; bollard appears only
/// in `engine`; the HTTP layer has no loops, spawns or engine types.
#[cfg(test)]
mod layering {
    use layering::{Layers, ModuleGraph};

    /// Top-level modules by layer, highest first. Rank 1 is the leaves.
    const LAYERS: Layers<'static> = &[
        (8, &["server", "healthcheck", "shell"]),
        (7, &["api"]),
        (6, &["app"]),
        (
            5,
            &[
                "checkpoints",
                "command",
                "files",
                "ports",
                "pty",
                "session_tokens",
            ],
        ),
        (4, &["sandbox"]),
        (3, &["engine", "agent_client"]),
        (
            1,
            &[
                "config",
                "clock",
                "durable_file",
                "id",
                "telemetry",
                "subnet",
                "field_error",
                "process_fields",
                "workspace_path",
                "origin_policy",
            ],
        ),
    ];

    fn graph() -> ModuleGraph {
        ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn imports_run_downward_without_cycles() {
        graph().assert_layered(LAYERS);
    }

    #[test]
    fn bollard_stays_in_the_engine_and_the_http_layer_only_translates() {
        for (module, file, code) in graph().sources() {
            let module = module.split("::").next().unwrap_or_default();
            if module != "engine" {
                assert!(!code.contains("bollard"), "{file} names bollard");
            }
            if module == "api" {
                for banned in ["crate::engine", "spawn(", "loop {", "while ", "for "] {
                    assert!(
                        !code.lines().any(|l| {
                            let l = l.trim_start();
                            !l.starts_with("//")
                                && (l.starts_with(banned) || banned.len() > 6 && l.contains(banned))
                        }),
                        "{file} has `{banned}`: the HTTP layer parses, calls the domain and maps"
                    );
                }
            }
        }
    }

    /// The agent protocol's envelope (`Op`, `Reply`) stays in the agent
    /// client: the domain calls its typed methods.
    #[test]
    fn the_agent_envelope_stays_in_the_agent_client() {
        for (module, file, code) in graph().sources() {
            if module.split("::").next() == Some("agent_client") {
                continue;
            }
            let named = code
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .find(|word| matches!(*word, "Op" | "Reply"));
            assert!(
                named.is_none(),
                "{file} names `{}`: only src/agent_client/ speaks the agent's envelope",
                named.unwrap_or_default()
            );
        }
    }
}
