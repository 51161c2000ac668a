//! sandboxd benchmark (`bench/run.sh`): starts its own release sandboxd
//! (at its default log level, logging to a file) against the local engine
//! and measures it, and in the same run the engine floor for the same work
//! done with direct Engine API calls (`docker exec` into the very container
//! the sandbox runs in; volume + container create + start), then prints a
//! markdown table (measure | sandboxd | floor | ratio | target | ok/MISSED)
//! and writes the raw JSON of the run (default
//! `bench/runs/DATE-COMMIT[-SECTION][-dirty].json`).
//!
//! `--runs N` (default 3) repeats the whole measurement set N times, each
//! with a fresh sandboxd (own instance); every line shows the median over
//! the runs of that run's own figure (the median of its samples unless the
//! line says p95), and the JSON keeps each run's figures and samples. The
//! output and the JSON name the commit (and whether the tree was dirty),
//! the date, the engine version and whether runsc is registered.
//!
//! The sections, one file each in bench/sections/ (its `//!` says what its
//! lines measure; ratio = sandboxd / floor column): `core` (round trips,
//! log stream, background server, files, kill, create/reconnect/stop, port
//! publish, the agent, sandboxd's memory; then in the same sandboxd
//! `gvisor`, `egress`, `pty` and `changes`), `shaping`, `mcp`, `e2b`,
//! `checkpoints` (a 500 MB workspace's checkpoints, restores, diffs and
//! forks, on a sandboxd of its own), `pool` and `burst` (new sessions one
//! after another, at a rate and all at once, each on sandboxds of their
//! own; then `density`, 100 idle sandboxes). The engine floor is
//! bench/floor.rs, the requests every section makes bench/requests.rs, the
//! table and the JSON bench/report.rs.
//!
//! `--profile` also prints where the time of an exec round trip goes.
//! `--only core` (every line but the shaping, MCP, pool, burst and density
//! sections), `egress`, `gvisor`, `pty`, `pool`, `shaping`, `changes`,
//! `checkpoints`, `mcp`, `e2b`, `burst` (with density), `rate` (the
//! burst's rate lines), `sustained` (of those, the rate 4 clients
//! sustain), `sequential` (its sessions one after another),
//! `fifty` (its 50 at once) or `density` measures that alone (for looking into one figure; the other
//! lines say "not measured", and the JSON file's name carries the
//! section).
//! Not part of `cargo test`.

use std::path::PathBuf;

use bollard::Docker;

mod floor;
mod report;
mod requests;
mod sections;
#[path = "support.rs"]
mod support;
// The egress line's "internet": a network namespace on this machine.
#[path = "../tests/it/harness/fakenet.rs"]
#[allow(dead_code)]
mod fakenet;

use floor::Floor;
use report::RunFigures;
use sections::Section;
use support::{Instance, Res};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let profile = args.iter().any(|a| a == "--profile");
    let only = match value_of("--only").as_deref() {
        None => None,
        Some(name) => match Section::from_name(name) {
            Some(section) => Some(section),
            None => {
                eprintln!(
                    "bench: --only takes core, egress, gvisor, pty, pool, shaping, changes, checkpoints, mcp, e2b, burst, rate, sustained, sequential, fifty or density, not {name:?}"
                );
                return std::process::ExitCode::FAILURE;
            }
        },
    };
    let runs = match value_of("--runs").map(|r| r.parse::<usize>()) {
        None => 3,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            eprintln!("bench: --runs takes a number ≥ 1");
            return std::process::ExitCode::FAILURE;
        }
    };
    let idle_secs = match value_of("--idle-secs").map(|r| r.parse::<u64>()) {
        None => 300,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("bench: --idle-secs takes a number of seconds");
            return std::process::ExitCode::FAILURE;
        }
    };
    let json_out = value_of("--json").map(PathBuf::from);
    let only_name = value_of("--only");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(runs, profile, (only, only_name), idle_secs, json_out)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `runs` runs, each with a sandboxd of its own; then the report.
async fn run(
    runs: usize,
    profile: bool,
    (only, only_name): (Option<Section>, Option<String>),
    idle_secs: u64,
    json_out: Option<PathBuf>,
) -> Res<()> {
    let docker = Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await?;
    let version = docker.version().await?;
    let runsc = docker
        .info()
        .await?
        .runtimes
        .unwrap_or_default()
        .contains_key("runsc");
    let meta = report::meta(&version, runsc, runs);
    report::print_meta(&meta);

    let mut all: Vec<RunFigures> = Vec::new();
    for r in 1..=runs {
        println!("\nrun {r} of {runs}");
        let instance = format!("bench-{}-{r}", std::process::id());
        let own = Instance::start(
            &docker,
            &instance,
            &format!(
                "network_modes = [\"none\", \"internet\", \"allowlist\", \"open\"]\n\
                 egress_dns = [\"{}\"]\n\
                 pool_size = 0\n\
                 [runtimes.gvisor]\noci_runtime = \"runsc\"\n",
                fakenet::DNS
            ),
            100,
        )
        .await?;
        println!("sandboxd log: {}", own.server.log.display());
        let floor = Floor {
            docker: docker.clone(),
            instance: instance.clone(),
            network: format!("{instance}-net"),
        };
        let mut figures = RunFigures::default();
        let result = sections::measure(
            only,
            &own.server,
            &floor,
            &mut figures,
            profile,
            runsc,
            idle_secs,
        )
        .await;
        drop(own);
        if let Err(e) = result {
            return Err(format!("run {r}: {e}").into());
        }
        all.push(figures);
    }

    report::write(&meta, &all, json_out, only_name.as_deref())
}
