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
//! - [`ports`]: relays and proxy containers that publish sandbox ports.
//! - [`pty`]: terminal sessions, their viewers and attach tickets.
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
pub mod clock;
pub mod command;
pub mod config;
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
pub mod subnet;
pub mod telemetry;
pub mod workspace_path;

/// The layering rules, checked against the source: every `crate::` path
/// in a module points at a lower layer (or, between leaves, at another
/// leaf without a cycle); bollard appears only in `engine`; the HTTP
/// layer has no loops, spawns or engine types.
#[cfg(test)]
mod layering {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// Top-level modules by layer, highest first. Rank 1 is the leaves.
    const LAYERS: &[(u8, &[&str])] = &[
        (8, &["server", "healthcheck"]),
        (7, &["api"]),
        (6, &["app"]),
        (5, &["command", "files", "ports", "pty"]),
        (4, &["sandbox"]),
        (3, &["engine", "agent_client"]),
        (
            1,
            &[
                "config",
                "clock",
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

    fn rank(module: &str) -> u8 {
        LAYERS
            .iter()
            .find(|(_, ms)| ms.contains(&module))
            .map(|(r, _)| *r)
            .unwrap_or_else(|| panic!("module {module} is in no layer; add it to LAYERS"))
    }

    /// Each source file's module and its text without unit tests.
    fn sources() -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let rel = path
                    .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
                    .expect("under src")
                    .to_string_lossy()
                    .into_owned();
                let module = rel
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches(".rs")
                    .to_string();
                if module == "lib" || module == "main" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("read file");
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                out.push((rel, module, code.to_string()));
            }
        }
        out
    }

    /// The top-level modules named after `crate::` in `code`.
    fn uses(code: &str) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                group
                    .split('}')
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(|p| p.trim().split("::").next().unwrap_or_default())
                    .collect()
            } else {
                vec![
                    rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                        .next()
                        .unwrap_or_default(),
                ]
            };
            found.extend(
                names
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .map(str::to_string),
            );
        }
        found
    }

    #[test]
    fn imports_run_downward_only_and_leaves_form_no_cycle() {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (file, module, code) in sources() {
            for used in uses(&code) {
                if used == module {
                    continue;
                }
                let (from, to) = (rank(&module), rank(&used));
                assert!(
                    from > to || (from == 1 && to == 1),
                    "{file} ({module}, layer {from}) uses crate::{used} (layer {to}): imports must run downward"
                );
                edges.entry(module.clone()).or_default().insert(used);
            }
        }
        // No cycle among what remains (leaves may use leaves).
        fn visit(
            m: &str,
            edges: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) {
            if done.contains(m) {
                return;
            }
            assert!(
                !path.iter().any(|p| p == m),
                "import cycle: {path:?} -> {m}"
            );
            path.push(m.to_string());
            for next in edges.get(m).into_iter().flatten() {
                visit(next, edges, path, done);
            }
            path.pop();
            done.insert(m.to_string());
        }
        let mut done = BTreeSet::new();
        for m in edges.keys() {
            visit(m, &edges, &mut Vec::new(), &mut done);
        }
    }

    #[test]
    fn bollard_stays_in_the_engine_and_the_http_layer_only_translates() {
        for (file, module, code) in sources() {
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
        for (file, module, code) in sources() {
            if module == "agent_client" {
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
