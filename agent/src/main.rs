//! `sandboxd-agent`: the process manager inside every sandbox. It runs as
//! the sandbox user from container start and owns what happens inside:
//! commands (each under a keeper that reaps and kills its whole tree),
//! their output, file I/O confined to the workspace, file watches, and
//! port relays.
//! sandboxd talks to it over one connection per sandboxd process (see
//! `sandboxd-proto`); the agent trusts sandboxd, sandboxd does not trust
//! the agent.
//!
//! The same binary is also a sandbox's way out: run in an egress
//! container, it is the HTTP proxy that enforces the sandbox's egress
//! policy.
//!
//! One static binary, six roles, chosen by the first argument:
//! - `serve` (the container's command): the agent ([`serve`]); `serve
//!   --stdio` also takes its standard input and output as sandboxd's first
//!   connection;
//! - `keep`: one command's keeper ([`keeper`]), started by the agent;
//!   `keep --ahead`, the spare keeper, also starts its command's process
//!   before the command is known;
//! - `stub`: a command's process before it `exec`s the command
//!   ([`keeper`]), started by a spare keeper;
//! - `session`: a terminal session's program on its way in ([`pty`]),
//!   started by its keeper;
//! - `bridge`: joins an exec's stdio to the agent ([`bridge`]), started by
//!   sandboxd for each connection;
//! - `egress` (an egress container's command): the egress proxy
//!   ([`egress`]).

mod bridge;
mod cgroup;
mod changes;
mod commands;
mod egress;
mod file_thread;
mod files;
mod keeper;
mod log;
mod nofollow;
mod ops;
mod pty;
mod relay;
mod search;
mod serve;
mod splice;
mod temp_name;
mod transport;
mod tree;
mod watch;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => serve::run(args.get(2).map(String::as_str) == Some("--stdio")),
        Some("keep") => keeper::run(args.get(2).map(String::as_str) == Some("--ahead")),
        Some("stub") => keeper::run_stub(),
        Some("session") => pty::run_session(),
        Some("bridge") => bridge::run(),
        Some("egress") => egress::run(),
        _ => {
            eprintln!(
                "usage: sandboxd-agent serve [--stdio] | keep [--ahead] | stub | session | bridge | egress --listen <port> [policy]"
            );
            ExitCode::from(2)
        }
    }
}

/// The layering rules, checked against the source with the `layering` dev
/// crate (tools/layering): no import cycle among the agent's modules, and
/// every import between top-level modules points at a lower layer: the
/// process roles and the connection (`serve`, `bridge`), then the
/// operations (`ops`), the parts they drive, and the process trees,
/// readings and formats those stand on.
#[cfg(test)]
mod layering {
    use layering::{Layers, ModuleGraph};

    /// Top-level modules by layer, highest first. Rank 1 is the leaves.
    const LAYERS: Layers<'static> = &[
        (7, &["serve", "bridge"]),
        (6, &["ops"]),
        (5, &["pty", "search", "file_thread"]),
        (4, &["commands", "files", "relay", "egress", "watch"]),
        (3, &["changes", "keeper", "log"]),
        (
            1,
            &[
                "tree",
                "splice",
                "cgroup",
                "transport",
                "temp_name",
                "nofollow",
            ],
        ),
    ];

    #[test]
    fn imports_run_downward_without_cycles() {
        ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR")).assert_layered(LAYERS);
    }
}
