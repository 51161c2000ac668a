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
//! What the lines measure (ratio = sandboxd / floor column):
//! - `exec true` round trip: `POST …/commands` `{"cmd":"true","login":false}`
//!   plus `GET …/wait`, 40 samples after 5 warm-ups; floor: `docker exec
//!   true` (exec create, attached start read to the end, inspect). Each
//!   round trip of these and of the next two lines, sandboxd's and the
//!   floor's alike, is sent after a quiet [`SETTLE`], not into the tail of
//!   the one before it.
//! - `bash -lc true`: RemcoChat's `{"cmd":"bash","args":["-lc","true"]}`;
//!   floor: `docker exec bash -lc true`.
//! - under gVisor: the same `exec true` in a sandbox of a runtime with
//!   `oci_runtime = "runsc"` (`"runtime": "gvisor"`), 20 samples; floor:
//!   `docker exec true` in that runsc container. Next to it, what `true`
//!   costs inside that sandbox alone: bash there starts `/bin/true` 20
//!   times (fork, exec, exit, wait), timed there by `date +%s%N`, 3 samples.
//! - log stream: 64 MB of base64 text, timed from sending `POST …/commands`
//!   to the `exit` record of `GET …/logs` (NDJSON parsed, every byte
//!   counted); floor: `docker exec` of the same script, from exec create to
//!   the end of its attached stream. 3 samples each; also under gVisor,
//!   and there also the same script with its output to /dev/null by
//!   `docker exec`, from exec create to its end (what it makes alone).
//! - background-server command: `cd /tmp && python3 -m http.server PORT
//!   --bind 127.0.0.1 >/dev/null 2>&1 &` (start + wait), and a plain
//!   `{"command":"true"}` right after it; floor column: the plain command
//!   alone, measured in the same loop. The same three by `docker exec` in
//!   the same container are reported next to them (on Docker 20.10 an exec
//!   that leaves a process behind, and the exec after it, take about 2 s:
//!   the engine waits for the leftover's I/O). 10 samples after 2 warm-ups.
//! - files: `files:write` then `files:read` of 4 MiB of random bytes, 20
//!   samples after 2 warm-ups, and what the kernel alone takes to make
//!   such a file: a Python process in the sandbox writes as many new 4
//!   MiB files the way the agent does and times each itself; the first 4
//!   MiB write into a sandbox created just before (5 samples), against
//!   the warm write. Each is timed from sending the request (a write's
//!   body made beforehand) to the last byte of the answer; the answer is
//!   parsed and checked after.
//! - kill answered: time until `POST …:kill` answers for `trap '' TERM;
//!   sleep 600` (which then ends only by SIGKILL after the grace period:
//!   checked, 137 and killed), 10 samples.
//! - create: `POST /v1/sandboxes` for a new session key, 10 samples;
//!   reconnect: the same key again; stop: `POST …:stop` (floor: container +
//!   volume removal). Each create, sandboxd's and the floor's, starts once
//!   sandboxd has the next link network made (`link_ready`).
//! - port publish: the first `GET …/ports/3000` right after a create with
//!   `"ports": [3000]` (the publish work happens there); and the lookup on a
//!   sandbox created 1 s earlier. 5 samples each.
//! - agent: VmRSS of `/.sandboxd/sandboxd-agent serve` in a sandbox left
//!   idle after one command (its connection is the agent's stdio: no
//!   bridge process), and the size of
//!   the agent binary in it, read by `docker exec`. MB here is 2^20 bytes.
//! - memory: sandboxd's RSS at start, after the run, and its growth while a
//!   command prints 1 GB that nobody reads.
//! - egress: 100 MB from a server in a network namespace on this machine
//!   (tests/it/harness/fakenet.rs; needs root), `curl` by name through the
//!   egress proxy of an `internet` sandbox; floor column: the same download
//!   by address straight out of an `open` sandbox. Each timed as one command
//!   (start + wait), 3 samples after one warm-up.
//!
//! - pool (issue 19, lines `pool: …`): the run's sandboxd has no pool
//!   (`pool_size = 0`, so every line above measures the cold path); a
//!   second sandboxd at its defaults (a pool of 2) runs next to it. Cold
//!   create (8 samples, floor: the engine's volume + container create +
//!   start) and cold create + `exec true` on the first; on the second, each
//!   from a full pool: a claim (8), a claim with 2 vCPUs / 2 GiB (5), a
//!   claim + `exec true` (time to first command), the time until the pool
//!   is full again, the first 4 MiB write after a claim against the next
//!   write (5), the first `GET …/ports/3000` after a claim with `"ports":
//!   [3000]` (5); a burst of 10 concurrent creates for new keys on each
//!   (the slowest answer; the claims among them from the pool's metrics);
//!   the memory cgroup usage of an idle member and the RSS of the engine's
//!   shim process for it on the host; and the first command in a member
//!   idle for `--idle-secs` (default 300) against one in a member made
//!   just before (2 and 4 samples, each claimed from a full pool, so that
//!   no refill runs under it), and, for comparison, the first command
//!   in a session sandbox that idled as long, measured first after the
//!   idle time (after three `GET /v1/sandboxes`).
//!
//! - shaping (issue 20, lines `shaping: …`): 100 MB of base64 text (76
//!   characters a line) run by `commands:run` with `"output": {"maxChars":
//!   20000}`, timed from the request to the answer, after checking the
//!   answer's counts; floor column: the same command streamed (`POST
//!   …/commands` to the `exit` record of `GET …/logs`, every byte read). And
//!   the same `commands:run` without `output` (1 MiB tails), for
//!   comparison. 3 samples of each, interleaved, in an offline sandbox.
//! - changes (issue 20): `commands:run` of a script that writes 1,000
//!   files, with `"changes": true`; floor column: the same without, in the
//!   same loop, alternating which goes first. 20 samples after 3 warm-ups.
//!
//! `--profile` also prints where the time of an exec round trip goes.
//! `--only core` (every line but the shaping and pool sections), `egress`,
//! `gvisor`, `pty`, `pool`, `shaping` or `changes` measures that alone (for
//! looking into one figure; the other lines say "not measured", and the
//! JSON file's name carries the section).
//! Not part of `cargo test`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{
    CreateContainerOptions, RemoveContainerOptions, RemoveVolumeOptions,
};
use futures_util::{SinkExt, StreamExt};
use sandboxd::engine::{SandboxContainer, sandbox_container_body};
use sandboxd::sandbox::agent_delivery;

#[path = "support.rs"]
mod support;
// The egress line's "internet": a network namespace on this machine.
#[path = "../tests/it/harness/fakenet.rs"]
#[allow(dead_code)]
mod fakenet;
use serde_json::{Value, json};
use support::{Res, Server, cleanup, median, ms, pct};

const LOG_BYTES: u64 = 64 * 1024 * 1024;
const FILE_BYTES: usize = 4 * 1024 * 1024;
/// Writes and reads (each) timed, after the warm-ups that are not.
const FILE_SAMPLES: usize = 20;
const FILE_WARMUPS: usize = 2;
const FLOOD_BYTES: u64 = 1024 * 1024 * 1024;
const MIB: f64 = 1024.0 * 1024.0;

/// Quiet time before each timed round trip of the `exec true`, `bash -lc
/// true` and gVisor lines, sandboxd's and the floor's alike. After a
/// `docker exec` has answered, containerd goes on working for 10–20
/// ms, and after a sandboxd command the agent makes the next command's
/// spare (30–40 ms under gVisor); on two cores a round trip sent at once
/// measures the other's tail as well as its own path (bench/RESULTS.md).
const SETTLE: Duration = Duration::from_millis(50);

/// The command `kill answered` kills: it ignores SIGTERM (so does `sleep`,
/// which inherits the ignored signal), so the tree ends only by SIGKILL
/// after the grace period; the answer must not wait for that.
const KILL_TARGET: &str = "trap '' TERM; sleep 600";

/// The engine floor: the same work through direct Engine API calls.
struct Floor {
    docker: Docker,
    instance: String,
    network: String,
}

/// One exec of the floor: until the end of its attached stream, until its
/// inspect answered (the exit code: what `wait` gives), the output bytes,
/// and the exit code.
struct FloorExec {
    stream: Duration,
    total: Duration,
    bytes: u64,
    output: Vec<u8>,
    exit: Option<i64>,
}

impl Floor {
    fn spec(&self, name: &str) -> SandboxContainer {
        SandboxContainer {
            name: name.to_string(),
            image: "sandboxd-runtime:latest".into(),
            oci_runtime: None,
            user: "1000:1000".into(),
            workspace_dir: "/workspace".into(),
            workspace_aliases: vec!["/vercel/sandbox/workspace".into()],
            workspace_nocopy: false,
            // The same mounts as a sandbox (the agent volume sandboxd made
            // exists by now); the floor's process is `sleep`.
            agent_volume: agent_delivery::agent_volume(&self.instance),
            agent_dir: agent_delivery::AGENT_DIR.into(),
            command: vec!["sleep".into(), "infinity".into()],
            volume: format!("{name}-workspace"),
            network: Some(self.network.clone()),
            network_aliases: Vec::new(),
            env: Vec::new(),
            vcpus: 1,
            memory_mb: 1024,
            pids_limit: 512,
            tmp_size_mb: 512,
            file_size_limit_mb: 1024,
            labels: [("sandboxd.instance".to_string(), self.instance.clone())].into(),
        }
    }

    /// volume + container create + start; returns the time.
    async fn create(&self, name: &str) -> Res<Duration> {
        let spec = self.spec(name);
        let t = Instant::now();
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(spec.volume.clone()),
                labels: Some(spec.labels.clone()),
                ..Default::default()
            })
            .await?;
        self.docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.to_string()),
                    platform: String::new(),
                }),
                sandbox_container_body(&spec, false),
            )
            .await?;
        self.docker
            .start_container(
                name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await?;
        Ok(t.elapsed())
    }

    /// container + volume removal.
    async fn remove(&self, name: &str) -> Res<Duration> {
        let t = Instant::now();
        self.docker
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await?;
        self.docker
            .remove_volume(
                &format!("{name}-workspace"),
                Some(RemoveVolumeOptions { force: true }),
            )
            .await?;
        Ok(t.elapsed())
    }

    /// exec create, start (attached, read to the end), inspect. `keep`
    /// keeps the output (small outputs only).
    async fn exec(&self, container: &str, cmd: &[&str], keep: bool) -> Res<FloorExec> {
        let t = Instant::now();
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(cmd.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await?;
        let mut bytes = 0u64;
        let mut output = Vec::new();
        if let StartExecResults::Attached { output: mut o, .. } = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(256 * 1024),
                }),
            )
            .await?
        {
            while let Some(chunk) = o.next().await {
                let chunk = chunk?.into_bytes();
                bytes += chunk.len() as u64;
                if keep {
                    output.extend_from_slice(&chunk);
                }
            }
        }
        let stream = t.elapsed();
        let inspect = self.docker.inspect_exec(&exec.id).await?;
        Ok(FloorExec {
            stream,
            total: t.elapsed(),
            bytes,
            output,
            exit: inspect.exit_code,
        })
    }

    /// A round trip that must exit 0; returns its time in ms.
    async fn round_trip(&self, container: &str, cmd: &[&str]) -> Res<f64> {
        let e = self.exec(container, cmd, false).await?;
        if e.exit != Some(0) {
            return Err(format!("floor exec {cmd:?}: exit {:?}", e.exit).into());
        }
        Ok(ms(e.total))
    }
}

/// One line of one run.
#[derive(Clone, Debug)]
struct Figure {
    value: f64,
    floor: Option<f64>,
    samples: Vec<f64>,
    floor_samples: Vec<f64>,
}

/// Everything one run measured.
#[derive(Default)]
struct RunFigures {
    lines: BTreeMap<&'static str, Figure>,
    notes: Vec<String>,
}

impl RunFigures {
    /// A line whose figure is the median of `samples` (floor: of
    /// `floor_samples`, when there are any).
    fn p50(&mut self, key: &'static str, samples: &[f64], floor_samples: &[f64]) {
        self.lines.insert(
            key,
            Figure {
                value: median(samples),
                floor: (!floor_samples.is_empty()).then(|| median(floor_samples)),
                samples: samples.to_vec(),
                floor_samples: floor_samples.to_vec(),
            },
        );
    }

    fn p95(&mut self, key: &'static str, samples: &[f64], floor_samples: &[f64]) {
        self.lines.insert(
            key,
            Figure {
                value: pct(samples, 0.95),
                floor: (!floor_samples.is_empty()).then(|| pct(floor_samples, 0.95)),
                samples: samples.to_vec(),
                floor_samples: floor_samples.to_vec(),
            },
        );
    }

    fn value(&mut self, key: &'static str, value: f64, floor: Option<f64>) {
        self.lines.insert(
            key,
            Figure {
                value,
                floor,
                samples: vec![],
                floor_samples: vec![],
            },
        );
    }

    fn note(&mut self, note: String) {
        println!("note: {note}");
        self.notes.push(note);
    }
}

type Check = fn(f64, Option<f64>) -> bool;

/// A line of the table: key, target, check (none: reported only).
struct Line {
    key: &'static str,
    target: &'static str,
    check: Option<Check>,
}

const EXEC: &str = "`exec true` round trip (start + wait) p50 (ms)";
const EXEC_P95: &str = "`exec true` round trip p95 (ms)";
const EXEC_LOGIN: &str = "`bash -lc true` round trip p50 (ms)";
const EXEC_GVISOR: &str = "`exec true` round trip under gVisor p50 (ms)";
const EXEC_GVISOR_ALONE: &str =
    "under gVisor, `true` run by bash in the same sandbox, by `docker exec` (ms each)";
const LOGS: &str = "log stream, 64 MB (MB/s)";
const LOGS_GVISOR: &str = "log stream under gVisor, 64 MB (MB/s)";
const LOGS_GVISOR_ALONE: &str =
    "under gVisor, the same script with its output to /dev/null, by `docker exec` (MB/s)";
const BG: &str = "background-server command round trip p50 (ms)";
const BG_AFTER: &str = "plain command right after it p50 (ms)";
const BG_FLOOR: &str = "background-server command by `docker exec` p50 (ms)";
const BG_AFTER_FLOOR: &str = "plain `docker exec` right after it p50 (ms)";
const WRITE: &str = "file write 4 MiB p50 (ms)";
const READ: &str = "file read 4 MiB p50 (ms)";
const KERNEL_WRITE: &str =
    "of a write: the same new file made by a process in the sandbox p50 (ms)";
const FIRST_WRITE: &str = "first 4 MiB write after create p50 (ms)";
const KILL: &str = "kill answered p50 (ms)";
const CREATE: &str = "create p50 (ms)";
const CREATE_P95: &str = "create p95 (ms)";
const RECONNECT: &str = "reconnect p50 (ms)";
const STOP: &str = "stop p50 (ms)";
const PUBLISH: &str = "port publish: first GET right after create p50 (ms)";
const PUBLISH_LATER: &str = "port lookup 1 s after create p50 (ms)";
const AGENT_RSS: &str = "agent idle RSS (MB)";
const AGENT_SIZE: &str = "agent binary size (MB)";
const IDLE_RSS: &str = "sandboxd idle RSS (MB)";
const AFTER_RSS: &str = "sandboxd RSS after the run (MB)";
const GROWTH: &str = "sandboxd RSS growth, 1 GB unread (MB)";
const DRAINED: &str = "1 GB unread drained (MB/s)";
const EGRESS: &str = "download 100 MB through the egress policy (MB/s)";
const EGRESS_TUNNEL: &str = "the same through a CONNECT tunnel (MB/s)";
const PTY_ECHO: &str = "terminal keystroke echo over the WebSocket p50 (ms)";
const PTY_ECHO_P95: &str = "terminal keystroke echo p95 (ms)";
const PTY_OUTPUT: &str = "terminal output a WebSocket viewer received (MB/s)";
const PTY_PROGRAM: &str = "terminal output the program wrote, 64 MiB (MB/s)";
const PTY_SKIPPED: &str = "of it, the viewer was told it skipped (MB)";
const PTY_UNACCOUNTED: &str = "of it, neither received nor told skipped (MB)";
const CHANGES: &str = "command touching 1,000 files with `\"changes\": true` (run) p50 (ms)";
const POOL_COLD: &str = "pool: cold create p50, sandboxd without a pool (ms)";
const POOL_HIT: &str = "pool: create p50, a claim (ms)";
const POOL_HIT_RESIZED: &str = "pool: create p50, a claim with 2 vCPUs / 2 GiB (ms)";
const POOL_FIRST: &str = "pool: time to first command (create + `exec true`), a claim p50 (ms)";
const POOL_REFILL: &str = "pool: back to full after a claim p50 (ms)";
const POOL_IDLE_FIRST: &str = "pool: first command in a member idle for --idle-secs p50 (ms)";
const POOL_IDLE_SESSION: &str =
    "pool: first command in a session sandbox idle as long, run first (ms)";
const POOL_BURST: &str = "pool: burst of 10 creates, pool of 2: slowest (ms)";
const POOL_BURST_HITS: &str = "pool: of that burst, claims";
const POOL_FIRST_WRITE: &str = "pool: first 4 MiB write after a claim p50 (ms)";
const POOL_PUBLISH: &str = "pool: port publish, first GET right after a claim p50 (ms)";
const POOL_MEMBER_CGROUP: &str = "pool: idle member, its memory cgroup (MB)";
const POOL_MEMBER_SHIM: &str = "pool: idle member, the engine's shim on the host, RSS (MB)";
const SHAPED_RUN: &str = "shaping: `commands:run` of 100 MB with `output` p50 (ms)";
const TAIL_RUN: &str = "shaping: the same run with 1 MiB tails, no `output` p50 (ms)";
/// Bytes of output the shaping lines measure.
const SHAPED_BYTES: u64 = 100_000_000;

fn ratio_at_most(v: f64, f: Option<f64>, r: f64) -> bool {
    f.is_some_and(|f| v <= f * r)
}

fn lines() -> Vec<Line> {
    fn line(key: &'static str, target: &'static str, check: Option<Check>) -> Line {
        Line { key, target, check }
    }
    vec![
        line(
            EXEC,
            "≤ 5 ms and ≤ 0.15× floor",
            Some(|v, f| v <= 5.0 && ratio_at_most(v, f, 0.15)),
        ),
        line(EXEC_P95, "", None),
        line(
            EXEC_LOGIN,
            "≤ 0.5× floor",
            Some(|v, f| ratio_at_most(v, f, 0.5)),
        ),
        line(EXEC_GVISOR, "≤ 10 ms", Some(|v, _| v <= 10.0)),
        line(
            EXEC_GVISOR_ALONE,
            "report (what starting `true` costs there without sandboxd)",
            None,
        ),
        line(
            LOGS,
            "≥ 1.0× raw exec stream",
            Some(|v, f| f.is_some_and(|f| v >= f)),
        ),
        line(LOGS_GVISOR, "", None),
        line(
            LOGS_GVISOR_ALONE,
            "report (what the script makes alone: the stream's ceiling)",
            None,
        ),
        line(
            BG,
            "≤ 1.2× plain command (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.2)),
        ),
        line(
            BG_AFTER,
            "≤ 1.2× plain command (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.2)),
        ),
        line(BG_FLOOR, "report (floor column: plain `docker exec`)", None),
        line(
            BG_AFTER_FLOOR,
            "report (floor column: plain `docker exec`)",
            None,
        ),
        line(WRITE, "≤ 25 ms", Some(|v, _| v <= 25.0)),
        line(READ, "≤ 25 ms", Some(|v, _| v <= 25.0)),
        line(KERNEL_WRITE, "report", None),
        line(
            FIRST_WRITE,
            "≤ 1.5× warm write (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.5)),
        ),
        line(KILL, "≤ 20 ms", Some(|v, _| v <= 20.0)),
        line(
            CREATE,
            "≤ 1.26× floor (before: 1.04–1.26×)",
            Some(|v, f| ratio_at_most(v, f, 1.26)),
        ),
        line(CREATE_P95, "", None),
        line(RECONNECT, "", None),
        line(STOP, "", None),
        line(PUBLISH, "≤ 250 ms", Some(|v, _| v <= 250.0)),
        line(PUBLISH_LATER, "", None),
        line(AGENT_RSS, "≤ 4 MB", Some(|v, _| v <= 4.0)),
        line(AGENT_SIZE, "≤ 5 MB", Some(|v, _| v <= 5.0)),
        line(IDLE_RSS, "≤ 20 MB", Some(|v, _| v <= 20.0)),
        line(AFTER_RSS, "", None),
        line(GROWTH, "< 64 MB", Some(|v, _| v < 64.0)),
        line(DRAINED, "", None),
        line(
            EGRESS,
            "≥ 0.8× direct in mode open (floor column)",
            Some(|v, f| f.is_some_and(|f| v >= 0.8 * f)),
        ),
        line(
            EGRESS_TUNNEL,
            "≥ 0.8× direct in mode open (floor column)",
            Some(|v, f| f.is_some_and(|f| v >= 0.8 * f)),
        ),
        line(PTY_ECHO, "≤ 5 ms", Some(|v, _| v <= 5.0)),
        line(PTY_ECHO_P95, "", None),
        line(PTY_OUTPUT, "report", None),
        line(PTY_PROGRAM, "report", None),
        line(PTY_SKIPPED, "report", None),
        line(PTY_UNACCOUNTED, "0", Some(|v, _| v == 0.0)),
        line(
            CHANGES,
            "≤ 1.1× without (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.1)),
        ),
        line(
            POOL_COLD,
            "≤ 1.26× floor (unchanged)",
            Some(|v, f| ratio_at_most(v, f, 1.26)),
        ),
        line(
            POOL_HIT,
            "≤ 15 ms and ≤ 0.1× cold (floor column)",
            Some(|v, f| v <= 15.0 && ratio_at_most(v, f, 0.1)),
        ),
        line(POOL_HIT_RESIZED, "≤ 40 ms", Some(|v, _| v <= 40.0)),
        line(
            POOL_FIRST,
            "≤ 25 ms (floor column: cold)",
            Some(|v, _| v <= 25.0),
        ),
        line(POOL_REFILL, "report", None),
        line(
            POOL_IDLE_FIRST,
            "≤ 1.1× a member made just before (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.1)),
        ),
        line(POOL_IDLE_SESSION, "report", None),
        line(
            POOL_BURST,
            "≤ 1.0× the same burst without a pool (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.0)),
        ),
        line(POOL_BURST_HITS, "≥ 2", Some(|v, _| v >= 2.0)),
        line(
            POOL_FIRST_WRITE,
            "≤ 1.5× warm write (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.5)),
        ),
        line(POOL_PUBLISH, "≤ 250 ms", Some(|v, _| v <= 250.0)),
        line(POOL_MEMBER_CGROUP, "report", None),
        line(POOL_MEMBER_SHIM, "report", None),
        line(
            SHAPED_RUN,
            "≤ 1.2× streaming it (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.2)),
        ),
        line(TAIL_RUN, "report (floor column: streaming it)", None),
    ]
}

/// Where the run comes from and what it ran on.
fn meta(docker_version: &bollard::models::SystemVersion, runsc: bool, runs: usize) -> Value {
    let mut meta = support::provenance();
    meta.insert(
        "docker".into(),
        json!({
            "version": docker_version.version,
            "apiVersion": docker_version.api_version,
            "runsc": runsc,
        }),
    );
    meta.insert("runs".into(), json!(runs));
    meta.insert(
        "sandboxdLogLevel".into(),
        json!("default (RUST_LOG unset: info)"),
    );
    Value::Object(meta)
}

/// A section `--only` measures alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    /// Every line but the shaping and pool sections.
    Core,
    Egress,
    Gvisor,
    Pty,
    Pool,
    Shaping,
    Changes,
}

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
    let meta = meta(&version, runsc, runs);
    print_meta(&meta);

    let mut all: Vec<RunFigures> = Vec::new();
    for r in 1..=runs {
        println!("\nrun {r} of {runs}");
        let instance = format!("bench-{}-{r}", std::process::id());
        let config = std::env::temp_dir().join(format!("{instance}.toml"));
        std::fs::write(
            &config,
            format!(
                "network_modes = [\"none\", \"internet\", \"allowlist\", \"open\"]\n\
                 egress_dns = [\"{}\"]\n\
                 pool_size = 0\n\
                 [runtimes.gvisor]\noci_runtime = \"runsc\"\n",
                fakenet::DNS
            ),
        )?;
        let server = Server::start(&instance, Some(&config)).await?;
        println!("sandboxd log: {}", server.log.display());
        let floor = Floor {
            docker: docker.clone(),
            instance: instance.clone(),
            network: format!("{instance}-net"),
        };
        let mut figures = RunFigures::default();
        let result = match only {
            None => match measure(&server, &floor, &mut figures, profile, runsc).await {
                Ok(()) => match shaping(&server, &mut figures).await {
                    Ok(()) => pool(&server, &floor, &mut figures, idle_secs).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
            Some(Section::Core) => measure(&server, &floor, &mut figures, profile, runsc).await,
            Some(Section::Shaping) => shaping(&server, &mut figures).await,
            Some(Section::Pool) => pool(&server, &floor, &mut figures, idle_secs).await,
            Some(Section::Egress) => egress(&server, &mut figures).await,
            Some(Section::Gvisor) => gvisor(&server, &floor, &mut figures).await,
            Some(Section::Pty) => terminals(&server, &mut figures).await,
            Some(Section::Changes) => changes(&server, &mut figures).await,
        };
        drop(server);
        cleanup(&docker, &instance).await;
        let _ = std::fs::remove_file(&config);
        if let Err(e) = result {
            return Err(format!("run {r}: {e}").into());
        }
        all.push(figures);
    }

    let (table, lines_json) = report(&all);
    println!();
    print_meta(&meta);
    println!(
        "\nEach figure: the median over {runs} run(s) of the run's own figure; ratio = sandboxd / floor column.\n"
    );
    println!("{table}");
    for (r, figures) in all.iter().enumerate() {
        for note in &figures.notes {
            println!("note (run {}): {note}", r + 1);
        }
    }
    let out = json!({
        "meta": meta,
        "lines": lines_json,
        "notes": all.iter().map(|f| f.notes.clone()).collect::<Vec<_>>(),
    });
    let json_out = json_out.unwrap_or_else(|| support::run_file(&meta, only_name.as_deref()));
    support::write_run(&json_out, &out)
}

fn print_meta(meta: &Value) {
    let dirty = match meta["dirty"].as_bool() {
        Some(true) => " (dirty tree)",
        Some(false) => " (clean tree)",
        None => " (tree state unknown)",
    };
    println!(
        "sandboxd benchmark: commit {}{dirty}, {}, Docker {} (API {}{}), kernel {}, {} cores, {} run(s), sandboxd at its default log level",
        meta["commit"].as_str().unwrap_or("?"),
        meta["date"].as_str().unwrap_or("?"),
        meta["docker"]["version"].as_str().unwrap_or("?"),
        meta["docker"]["apiVersion"].as_str().unwrap_or("?"),
        if meta["docker"]["runsc"] == json!(true) {
            ", runsc registered"
        } else {
            ", NO runsc"
        },
        meta["kernel"].as_str().unwrap_or("?"),
        meta["cores"],
        meta["runs"],
    );
}

/// The markdown table and the JSON of every line over all runs.
fn report(all: &[RunFigures]) -> (String, Value) {
    let mut table = String::from(
        "| measure | sandboxd | floor | ratio | target | |\n|---|---:|---:|---:|---|---|\n",
    );
    let mut out = Vec::new();
    for line in lines() {
        let figs: Vec<&Figure> = all.iter().filter_map(|r| r.lines.get(line.key)).collect();
        let missing = figs.len() < all.len();
        let value =
            (!figs.is_empty()).then(|| median(&figs.iter().map(|f| f.value).collect::<Vec<_>>()));
        let floors: Vec<f64> = figs.iter().filter_map(|f| f.floor).collect();
        let floor = (!floors.is_empty() && floors.len() == figs.len()).then(|| median(&floors));
        let ratio = value.zip(floor).map(|(v, f)| v / f);
        let ok = match (line.check, value) {
            (Some(check), Some(v)) if !missing => Some(check(v, floor)),
            // Measured in some runs only: the others failed it.
            (Some(_), Some(_)) => Some(false),
            // Not measured at all (another section's line): no verdict.
            (Some(_), None) | (None, _) => None,
        };
        let cell =
            |x: Option<f64>, digits: usize| x.map_or("–".into(), |x| format!("{x:.digits$}"));
        let digits = if line.key.contains("(MB)") { 2 } else { 1 };
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            line.key,
            if missing && value.is_none() {
                "not measured".into()
            } else {
                cell(value, digits)
            },
            cell(floor, digits),
            cell(ratio, 2),
            line.target,
            match ok {
                Some(true) => "ok",
                Some(false) => "MISSED",
                None => "",
            }
        ));
        out.push(json!({
                "measure": line.key,
                "value": value,
                "floor": floor,
                "ratio": ratio,
                "target": line.target,
                "ok": ok,
                "measuredInRuns": figs.len(),
                "runs": all.iter().map(|r| r.lines.get(line.key).map(|f| json!({
                    "value": f.value,
                    "floor": f.floor,
                    "ratio": f.floor.map(|fl| f.value / fl),
                    "samples": f.samples,
                    "floorSamples": f.floor_samples,
                }))).collect::<Vec<_>>(),
        }));
    }
    (table, Value::Array(out))
}

fn id_of(v: &Value, field: &str) -> Res<String> {
    Ok(v[field]
        .as_str()
        .ok_or_else(|| format!("no {field} in {v}"))?
        .to_string())
}

async fn measure(
    server: &Server,
    floor: &Floor,
    fig: &mut RunFigures,
    profile: bool,
    runsc: bool,
) -> Res<()> {
    let idle_rss = server.rss_kb();

    // Warm up: network, agent volume, image caches.
    let warm = server
        .post("/v1/sandboxes", json!({"sessionKey": "warm"}))
        .await?;
    let sid = id_of(&warm, "sandboxId")?;
    let sid = sid.as_str();
    let container = format!("{}-{sid}", floor.instance);
    floor
        .create(&format!("{}-floorwarm", floor.instance))
        .await?;
    floor
        .remove(&format!("{}-floorwarm", floor.instance))
        .await?;
    // A sandbox left idle for the agent's idle RSS (after one command, so
    // its connection is up).
    let idle = id_of(
        &server
            .post("/v1/sandboxes", json!({"sessionKey": "idle"}))
            .await?,
        "sandboxId",
    )?;
    run_cmd(server, &idle, json!({"cmd": "true", "login": false})).await?;

    // Create (cold), reconnect, stop, and their floors, interleaved.
    let (mut create, mut reconnect, mut stop, mut fcreate, mut fremove) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..10 {
        link_ready(server).await?;
        let t = Instant::now();
        let v = server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": format!("create-{i}")}),
            )
            .await?;
        create.push(ms(t.elapsed()));
        let id = id_of(&v, "sandboxId")?;
        let t = Instant::now();
        server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": format!("create-{i}")}),
            )
            .await?;
        reconnect.push(ms(t.elapsed()));
        let t = Instant::now();
        server
            .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
            .await?;
        stop.push(ms(t.elapsed()));
        link_ready(server).await?;
        let name = format!("{}-floor{i}", floor.instance);
        fcreate.push(ms(floor.create(&name).await?));
        fremove.push(ms(floor.remove(&name).await?));
    }
    fig.p50(CREATE, &create, &fcreate);
    fig.p95(CREATE_P95, &create, &fcreate);
    fig.p50(RECONNECT, &reconnect, &[]);
    fig.p50(STOP, &stop, &fremove);

    // Round trips of `true` and of RemcoChat's `bash -lc true`, each
    // against `docker exec` of the same argv in the same container.
    let (mut exec, mut fexec, mut start_part) = (vec![], vec![], vec![]);
    let (mut login, mut flogin) = (vec![], vec![]);
    let plain = json!({"cmd": "true", "login": false});
    let remcochat = json!({"cmd": "bash", "args": ["-lc", "true"]});
    for _ in 0..5 {
        run_cmd(server, sid, plain.clone()).await?;
        run_cmd(server, sid, remcochat.clone()).await?;
        floor.round_trip(&container, &["true"]).await?;
        floor
            .round_trip(&container, &["bash", "-lc", "true"])
            .await?;
    }
    for _ in 0..40 {
        let (total, start) = settled(run_cmd(server, sid, plain.clone())).await?;
        exec.push(total);
        start_part.push(start);
        fexec.push(settled(floor.round_trip(&container, &["true"])).await?);
        login.push(settled(run_cmd(server, sid, remcochat.clone())).await?.0);
        flogin.push(settled(floor.round_trip(&container, &["bash", "-lc", "true"])).await?);
    }
    fig.p50(EXEC, &exec, &fexec);
    fig.p95(EXEC_P95, &exec, &fexec);
    fig.p50(EXEC_LOGIN, &login, &flogin);
    if profile {
        println!(
            "profile: exec true = start (POST …/commands) {:.2} ms + until wait answers {:.2} ms (p50)",
            median(&start_part),
            median(&exec) - median(&start_part)
        );
    }

    // A command that leaves a server running in the background, and the
    // plain command right after it, against the plain command alone (the
    // same form: a `command` script, so a login shell). The same three
    // through `docker exec` in the same container, for comparison.
    let (mut bg, mut after, mut reference) = (vec![], vec![], vec![]);
    let (mut fbg, mut fafter, mut freference) = (vec![], vec![], vec![]);
    let plain_script = json!({"command": "true"});
    let bg_script = |port: u16| {
        format!("cd /tmp && python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &")
    };
    for i in 0..12u16 {
        let port = 3000 + i;
        reference.push(run_cmd(server, sid, plain_script.clone()).await?.0);
        let t = Instant::now();
        let v = server
            .post(
                &format!("/v1/sandboxes/{sid}/commands"),
                json!({"command": bg_script(port)}),
            )
            .await?;
        let cid = id_of(&v, "commandId")?;
        wait_ok(server, sid, &cid).await?;
        let bg_ms = ms(t.elapsed());
        let after_ms = run_cmd(server, sid, plain_script.clone()).await?.0;
        // The server must really be running: the command's leftovers.
        let list = server.get(&format!("/v1/sandboxes/{sid}/commands")).await?;
        let left = list["commands"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["commandId"] == json!(cid)))
            .and_then(|c| c["processes"].as_u64());
        if left.is_none_or(|n| n == 0) {
            fig.note(format!(
                "background server on port {port}: no process left running ({left:?})"
            ));
        }
        // End the server it left (`:kill` of a finished command ends its
        // leftovers).
        server
            .post(
                &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
                json!(null),
            )
            .await?;
        let fport = 3100 + i;
        let f_ref = floor
            .round_trip(&container, &["bash", "-lc", "true"])
            .await?;
        let f_bg = floor
            .round_trip(&container, &["bash", "-lc", &bg_script(fport)])
            .await?;
        let f_after = floor
            .round_trip(&container, &["bash", "-lc", "true"])
            .await?;
        floor
            .exec(
                &container,
                &["pkill", "-f", &format!("http.server {fport} ")],
                false,
            )
            .await?;
        // The first two are warm-ups (python's first start reads its files).
        if i >= 2 {
            bg.push(bg_ms);
            after.push(after_ms);
            fbg.push(f_bg);
            fafter.push(f_after);
            freference.push(f_ref);
        }
    }
    let reference = &reference[2..];
    fig.p50(BG, &bg, reference);
    fig.p50(BG_AFTER, &after, reference);
    fig.p50(BG_FLOOR, &fbg, &freference);
    fig.p50(BG_AFTER_FLOOR, &fafter, &freference);

    // Log stream throughput: 64 MB of base64 text, timed from the request
    // that starts the command to its `exit` record, against `docker exec`
    // of the same script from exec create to the end of its stream.
    let (thr, fthr) = log_streams(server, floor, sid, &container, fig, 3).await?;
    fig.p50(LOGS, &thr, &fthr);

    // Files: 4 MiB write and read.
    let content = {
        use base64::Engine as _;
        let mut raw = vec![0u8; FILE_BYTES];
        getrandom::fill(&mut raw)?;
        base64::engine::general_purpose::STANDARD.encode(raw)
    };
    let (mut wr, mut rd) = (vec![], vec![]);
    for i in 0..(FILE_WARMUPS + FILE_SAMPLES) {
        let written = write_file(server, sid, &format!("bench/f{i}.bin"), &content).await?;
        let path = format!("/v1/sandboxes/{sid}/files:read?path=bench/f{i}.bin");
        let t = Instant::now();
        let answer = server.raw(reqwest::Method::GET, &path, vec![]).await?;
        let read = ms(t.elapsed());
        let v: Value = serde_json::from_slice(&answer)?;
        if v["contentBase64"].as_str() != Some(content.as_str()) {
            return Err("file read back differs".into());
        }
        if i >= FILE_WARMUPS {
            wr.push(written);
            rd.push(read);
        }
    }
    fig.p50(WRITE, &wr, &[]);
    fig.p50(READ, &rd, &[]);
    fig.p50(
        KERNEL_WRITE,
        &kernel_file_writes(floor, &container).await?,
        &[],
    );

    // The first 4 MiB write into a sandbox created just before, against
    // the warm write.
    let mut first = vec![];
    for i in 0..5 {
        let v = server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": format!("first-write-{i}")}),
            )
            .await?;
        let id = id_of(&v, "sandboxId")?;
        first.push(write_file(server, &id, "first.bin", &content).await?);
        server
            .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
            .await?;
    }
    fig.p50(FIRST_WRITE, &first, &wr);

    // Kill: the time until `:kill` answers for a command that ignores
    // SIGTERM; each must then end by SIGKILL (137, killed).
    let mut kills = vec![];
    let mut cids = vec![];
    for _ in 0..10 {
        let v = server
            .post(
                &format!("/v1/sandboxes/{sid}/commands"),
                json!({"command": KILL_TARGET, "login": false, "timeoutMs": 120000}),
            )
            .await?;
        cids.push(id_of(&v, "commandId")?);
    }
    // Let every shell set its trap.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for cid in &cids {
        let t = Instant::now();
        let v = server
            .post(
                &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
                json!(null),
            )
            .await?;
        kills.push(ms(t.elapsed()));
        if v["ok"] != json!(true) {
            return Err(format!(":kill answered {v}").into());
        }
    }
    for cid in &cids {
        let w = server
            .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
            .await?;
        if w["exitCode"] != json!(137) || w["killed"] != json!(true) {
            fig.note(format!(
                "kill: `{KILL_TARGET}` ended with {w}, not 137 killed"
            ));
        }
    }
    fig.p50(KILL, &kills, &[]);

    // Port publish: the first GET right after the create (ports are
    // published in the background from the create on, so this GET waits
    // for that work), and a GET 1 s after the create.
    let (mut publish_now, mut publish_later) = (vec![], vec![]);
    for i in 0..5 {
        for (later, out) in [(false, &mut publish_now), (true, &mut publish_later)] {
            let key = format!("port-{later}-{i}");
            let v = server
                .post("/v1/sandboxes", json!({"sessionKey": key, "ports": [3000]}))
                .await?;
            let id = id_of(&v, "sandboxId")?;
            if later {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let t = Instant::now();
            let v = server
                .get(&format!("/v1/sandboxes/{id}/ports/3000"))
                .await?;
            out.push(ms(t.elapsed()));
            if v["found"] != json!(true) || v["hostPort"].as_u64().is_none() {
                return Err(format!("port lookup answered {v}").into());
            }
            server
                .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
                .await?;
        }
    }
    fig.p50(PUBLISH, &publish_now, &[]);
    fig.p50(PUBLISH_LATER, &publish_later, &[]);

    // gVisor: the same round trip and log stream in a sandbox of a runtime
    // with oci_runtime = "runsc", against `docker exec` in its container.
    if runsc {
        if let Err(e) = gvisor(server, floor, fig).await {
            fig.note(format!("gVisor lines not measured: {e}"));
        }
    } else {
        fig.note("gVisor lines not measured: the engine has no runsc runtime".into());
    }

    // The agent: its idle RSS and its binary, read with `docker exec` in
    // the sandbox that stayed idle.
    let idle_container = format!("{}-{idle}", floor.instance);
    let script = "for d in /proc/[0-9]*; do \
        a=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null); \
        case \"$a\" in \
          '/.sandboxd/sandboxd-agent serve '*) echo serve $(grep VmRSS $d/status) ;; \
        esac; done; echo size $(stat -c %s /.sandboxd/sandboxd-agent)";
    let e = floor
        .exec(&idle_container, &["sh", "-c", script], true)
        .await?;
    let text = String::from_utf8_lossy(&e.output).to_string();
    let field = |what: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(what))
            .and_then(|l| {
                l.split_whitespace()
                    .find(|w| w.chars().all(|c| c.is_ascii_digit()))
            })
            .and_then(|n| n.parse().ok())
    };
    match field("serve ") {
        Some(kb) => fig.value(AGENT_RSS, kb / 1024.0, None),
        None => fig.note(format!("agent RSS not found in: {text:?}")),
    }
    match field("size ") {
        Some(bytes) => fig.value(AGENT_SIZE, bytes / MIB, None),
        None => fig.note(format!("agent size not found in: {text:?}")),
    }
    if let Some(bytes) = field("size ") {
        if bytes as usize != agent_delivery::AGENT_BINARY.len() {
            fig.note(format!(
                "the agent in the sandbox has {bytes} bytes, the one embedded {}",
                agent_delivery::AGENT_BINARY.len()
            ));
        }
    }

    // Memory of sandboxd itself.
    let after_rss = server.rss_kb();
    let v = server
        .post(&format!("/v1/sandboxes/{sid}/commands"), json!({"command": format!("head -c {FLOOD_BYTES} /dev/zero | tr '\\0' x"), "timeoutMs": 600000}))
        .await?;
    let cid = id_of(&v, "commandId")?;
    let before_flood = server.rss_kb();
    let mut peak = before_flood;
    let t = Instant::now();
    loop {
        peak = peak.max(server.rss_kb());
        let list = server.get(&format!("/v1/sandboxes/{sid}/commands")).await?;
        let done = list["commands"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["commandId"] == json!(cid)))
            .is_some_and(|c| c["state"] != "running");
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let flood_secs = t.elapsed().as_secs_f64();
    fig.value(IDLE_RSS, idle_rss as f64 / 1024.0, None);
    fig.value(AFTER_RSS, after_rss as f64 / 1024.0, None);
    fig.value(
        GROWTH,
        peak.saturating_sub(before_flood) as f64 / 1024.0,
        None,
    );
    fig.value(DRAINED, FLOOD_BYTES as f64 / flood_secs / 1e6, None);
    egress(server, fig).await?;
    terminals(server, fig).await?;
    changes(server, fig).await
}

/// `commands:run` of a script that writes 1,000 files (in a workspace of
/// 1,000 more), with `"changes": true` and without, alternately and in
/// turns of which goes first; 20 samples of each after 3 warm-ups.
async fn changes(server: &Server, fig: &mut RunFigures) -> Res<()> {
    let sid = id_of(
        &server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": "changes", "network": {"mode": "none"}}),
            )
            .await?,
        "sandboxId",
    )?;
    let path = format!("/v1/sandboxes/{sid}/commands:run");
    let script = "mkdir -p touched && cd touched && for i in $(seq 1000); do echo $i > f$i; done";
    server
        .post(
            &path,
            json!({"command": "mkdir -p old && cd old && for i in $(seq 1000); do echo $i > f$i; done"}),
        )
        .await?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..23 {
        let mut pair = [0.0; 2];
        let order = if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for watched in order {
            let t = Instant::now();
            let v = server
                .post(&path, json!({"command": script, "changes": watched}))
                .await?;
            pair[usize::from(watched)] = ms(t.elapsed());
            if v["exitCode"] != 0 || (watched && v["changes"]["files"].as_array().is_none()) {
                return Err(format!("changes: {v}").into());
            }
        }
        if i >= 3 {
            without.push(pair[0]);
            with.push(pair[1]);
        }
    }
    fig.p50(CHANGES, &with, &without);
    Ok(())
}

/// 100 MB from the fake internet's "public" server: by name through the
/// egress proxy of an `internet` sandbox, against the same download by
/// address straight out of an `open` sandbox; both timed as one command
/// (start + wait), 3 samples each, interleaved.
async fn egress(server: &Server, fig: &mut RunFigures) -> Res<()> {
    const MB: f64 = 100.0;
    let _net = fakenet::FakeNet::start().await;
    let through = id_of(
        &server
            .post("/v1/sandboxes", json!({"sessionKey": "egress"}))
            .await?,
        "sandboxId",
    )?;
    let direct = id_of(
        &server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": "egress-open", "network": {"mode": "open"}}),
            )
            .await?,
        "sandboxId",
    )?;
    let get = |how: &str, url: &str| json!({"command": format!("curl -sSf {how} -o /dev/null '{url}'"), "timeoutMs": 120000});
    let url = format!("http://public.test/big?mb={MB}");
    let via_proxy = get("", &url);
    // What HTTPS takes (pip, npm, git): a CONNECT tunnel, here without the
    // TLS, whose cost both sides would share.
    let via_tunnel = get("--proxytunnel", &url);
    let straight = get("", &format!("http://{}/big?mb={MB}", fakenet::PUBLIC));
    run_cmd(server, &through, via_proxy.clone()).await?;
    run_cmd(server, &through, via_tunnel.clone()).await?;
    run_cmd(server, &direct, straight.clone()).await?;
    let (mut a, mut t, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        a.push(MB / (run_cmd(server, &through, via_proxy.clone()).await?.0 / 1000.0));
        t.push(MB / (run_cmd(server, &through, via_tunnel.clone()).await?.0 / 1000.0));
        b.push(MB / (run_cmd(server, &direct, straight.clone()).await?.0 / 1000.0));
    }
    fig.p50(EGRESS, &a, &b);
    fig.p50(EGRESS_TUNNEL, &t, &b);
    Ok(())
}

/// Terminal sessions through the WebSocket: a keystroke's echo (the
/// terminal's own, under `cat`), 10 warm-up then 100 timed, one at a
/// time; and a program's 64 MiB of output to one viewer, from attach to
/// the `exit` message (the program starts 2 s after the open, so the
/// viewer is attached before its first byte; the rates count from its
/// first byte): what the viewer received, what the program wrote (it never
/// waits for a viewer), what the viewer was told it skipped, and what is
/// neither.
async fn terminals(server: &Server, fig: &mut RunFigures) -> Res<()> {
    use tokio_tungstenite::tungstenite::protocol::Message;
    let sid = id_of(
        &server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": "pty", "network": {"mode": "none"}}),
            )
            .await?,
        "sandboxId",
    )?;
    let ws_base = server.base.replacen("http://", "ws://", 1);
    let attach = |pty: String| {
        let url = format!("{ws_base}/v1/sandboxes/{sid}/ptys/{pty}");
        async move {
            tokio_tungstenite::connect_async(url)
                .await
                .map(|(ws, _)| ws)
        }
    };
    let open = |body: Value| {
        let path = format!("/v1/sandboxes/{sid}/ptys");
        async move { id_of(&server.post(&path, body).await?, "ptyId") }
    };

    let pty = open(json!({"command": ["cat"]})).await?;
    let mut ws = attach(pty).await?;
    let mut echo = Vec::new();
    for i in 0..110u32 {
        let key = b'a' + (i % 26) as u8;
        let t = Instant::now();
        ws.send(Message::Binary(vec![key].into())).await?;
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await?
                .ok_or("the session closed")??;
            if let Message::Binary(b) = frame
                && b.contains(&key)
            {
                break;
            }
        }
        if i >= 10 {
            echo.push(ms(t.elapsed()));
        }
    }
    drop(ws);
    fig.p50(PTY_ECHO, &echo, &[]);
    fig.value(PTY_ECHO_P95, pct(&echo, 0.95), None);

    const BYTES: u64 = 64 << 20;
    let pty = open(json!({
        "command": ["bash", "-c", format!("sleep 2; head -c {BYTES} /dev/zero | tr '\\0' x")]
    }))
    .await?;
    let mut ws = attach(pty).await?;
    let mut t = None;
    let (mut got, mut skipped) = (0u64, 0u64);
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(120), ws.next())
            .await?
            .ok_or("the session closed before its exit")??;
        match frame {
            Message::Binary(b) => {
                t.get_or_insert_with(Instant::now);
                got += b.len() as u64;
            }
            Message::Text(text) => {
                let v: Value = serde_json::from_str(text.as_str())?;
                skipped += v["skippedBytes"].as_u64().unwrap_or(0);
                if v["type"] == "exit" {
                    break;
                }
            }
            _ => {}
        }
    }
    let secs = t.ok_or("no output")?.elapsed().as_secs_f64();
    fig.value(PTY_OUTPUT, got as f64 / secs / 1e6, None);
    fig.value(PTY_PROGRAM, BYTES as f64 / secs / 1e6, None);
    fig.value(PTY_SKIPPED, skipped as f64 / 1e6, None);
    // What the viewer neither got nor was told it missed: should be 0.
    fig.value(
        PTY_UNACCOUNTED,
        BYTES.saturating_sub(got + skipped) as f64 / 1e6,
        None,
    );
    server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await?;
    Ok(())
}

async fn gvisor(server: &Server, floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    let v = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "gvisor", "runtime": "gvisor"}),
        )
        .await?;
    let gid = id_of(&v, "sandboxId")?;
    let container = format!("{}-{gid}", floor.instance);
    let runtime = floor
        .docker
        .inspect_container(
            &container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await?
        .host_config
        .and_then(|h| h.runtime);
    if runtime.as_deref() != Some("runsc") {
        return Err(format!("the gvisor sandbox runs under {runtime:?}").into());
    }
    let plain = json!({"cmd": "true", "login": false});
    for _ in 0..3 {
        run_cmd(server, &gid, plain.clone()).await?;
        floor.round_trip(&container, &["true"]).await?;
    }
    let (mut exec, mut fexec) = (vec![], vec![]);
    for _ in 0..20 {
        exec.push(settled(run_cmd(server, &gid, plain.clone())).await?.0);
        fexec.push(settled(floor.round_trip(&container, &["true"])).await?);
    }
    fig.p50(EXEC_GVISOR, &exec, &fexec);
    // What `true` costs inside the sandbox without sandboxd, dockerd or
    // the agent: bash there starts it 20 times and times them itself.
    let twenty = "s=$(date +%s%N); for i in $(seq 20); do /bin/true; done; \
                  e=$(date +%s%N); echo $(( (e - s) / 20000 ))";
    let alone_true = three_alone(floor, &container, twenty)
        .await?
        .iter()
        .map(|e| {
            let us: Option<f64> = String::from_utf8_lossy(&e.output).trim().parse().ok();
            us.map(|us| us / 1000.0)
        })
        .collect::<Option<Vec<_>>>()
        .ok_or("`true` 20 times under gVisor printed no time")?;
    fig.p50(EXEC_GVISOR_ALONE, &alone_true, &[]);
    let (thr, fthr) = log_streams(server, floor, &gid, &container, fig, 3).await?;
    fig.p50(LOGS_GVISOR, &thr, &fthr);
    // The ceiling: the same script in the same sandbox, its output
    // thrown away, timed from exec create to its end.
    let alone = format!("{} > /dev/null", log_generator());
    let athr: Vec<f64> = three_alone(floor, &container, &alone)
        .await?
        .iter()
        .map(|e| LOG_BYTES as f64 / e.total.as_secs_f64() / 1e6)
        .collect();
    fig.p50(LOGS_GVISOR_ALONE, &athr, &[]);
    server
        .post(&format!("/v1/sandboxes/{gid}:stop"), json!(null))
        .await?;
    Ok(())
}

/// `script` run 3 times by `bash -c` in `container`, by `docker exec`
/// (output kept), each required to exit 0: what the sandbox does alone.
async fn three_alone(floor: &Floor, container: &str, script: &str) -> Res<Vec<FloorExec>> {
    let mut runs = Vec::with_capacity(3);
    for _ in 0..3 {
        let e = floor.exec(container, &["bash", "-c", script], true).await?;
        if e.exit != Some(0) {
            return Err(format!("`{script}` alone: exit {:?}", e.exit).into());
        }
        runs.push(e);
    }
    Ok(runs)
}

/// The script whose output the log stream lines measure: LOG_BYTES of
/// base64 text.
fn log_generator() -> String {
    format!(
        "head -c {} /dev/urandom | base64 -w 76 | head -c {LOG_BYTES}",
        LOG_BYTES * 3 / 4 + 4096
    )
}

/// `n` log streams of LOG_BYTES through sandboxd and through `docker exec`,
/// interleaved: (sandboxd MB/s, floor MB/s).
async fn log_streams(
    server: &Server,
    floor: &Floor,
    sid: &str,
    container: &str,
    fig: &mut RunFigures,
    n: usize,
) -> Res<(Vec<f64>, Vec<f64>)> {
    let generator = log_generator();
    let (mut thr, mut fthr) = (vec![], vec![]);
    for _ in 0..n {
        let t = Instant::now();
        let v = server
            .post(
                &format!("/v1/sandboxes/{sid}/commands"),
                json!({"command": generator, "login": false, "timeoutMs": 300000}),
            )
            .await?;
        let cid = id_of(&v, "commandId")?;
        let logs = read_logs(server, sid, &cid, t).await?;
        let Some(took) = logs.to_exit else {
            return Err(format!(
                "the log stream of {cid} ended without its exit record ({} bytes read)",
                logs.data
            )
            .into());
        };
        if logs.data != LOG_BYTES || logs.dropped > 0 || logs.exit_code != Some(0) {
            fig.note(format!(
                "log stream: {} data bytes of {LOG_BYTES}, {} dropped, exit {:?}",
                logs.data, logs.dropped, logs.exit_code
            ));
        }
        thr.push(logs.data as f64 / took.as_secs_f64() / 1e6);
        let e = floor
            .exec(container, &["bash", "-c", &generator], false)
            .await?;
        if e.bytes != LOG_BYTES || e.exit != Some(0) {
            fig.note(format!(
                "floor stream: {} bytes of {LOG_BYTES}, exit {:?}",
                e.bytes, e.exit
            ));
        }
        fthr.push(e.bytes as f64 / e.stream.as_secs_f64() / 1e6);
    }
    Ok((thr, fthr))
}

/// What the kernel alone takes to make a new 4 MiB file in the
/// sandbox's workspace, the way the agent makes one (a new temporary
/// name, one write, close, rename): a Python process in the sandbox makes
/// FILE_SAMPLES of them after FILE_WARMUPS and times each itself.
async fn kernel_file_writes(floor: &Floor, container: &str) -> Res<Vec<f64>> {
    let script = format!(
        "import os, time, json\n\
         data = os.urandom({FILE_BYTES})\n\
         os.makedirs('/workspace/bench-kernel', exist_ok=True)\n\
         took = []\n\
         for i in range({n}):\n\
         \x20   name = '/workspace/bench-kernel/f%d' % i\n\
         \x20   t = time.perf_counter()\n\
         \x20   fd = os.open(name + '.tmp', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n\
         \x20   assert os.write(fd, data) == len(data)\n\
         \x20   os.close(fd)\n\
         \x20   os.rename(name + '.tmp', name)\n\
         \x20   took.append((time.perf_counter() - t) * 1000)\n\
         print(json.dumps(took[{FILE_WARMUPS}:]))\n",
        n = FILE_WARMUPS + FILE_SAMPLES
    );
    let e = floor
        .exec(container, &["python3", "-c", &script], true)
        .await?;
    if e.exit != Some(0) {
        return Err(format!(
            "the in-sandbox file writes failed ({:?}): {}",
            e.exit,
            String::from_utf8_lossy(&e.output)
        )
        .into());
    }
    Ok(serde_json::from_slice(&e.output)?)
}

/// A `files:write` of `content` (base64), timed from sending its body,
/// made beforehand, to the last byte of the answer, which is checked
/// after.
async fn write_file(server: &Server, sid: &str, path: &str, content: &str) -> Res<f64> {
    let body = serde_json::to_vec(&json!({"files": [{"path": path, "contentBase64": content}]}))?;
    let route = format!("/v1/sandboxes/{sid}/files:write");
    let t = Instant::now();
    let answer = server.raw(reqwest::Method::POST, &route, body).await?;
    let took = ms(t.elapsed());
    let v: Value = serde_json::from_slice(&answer)?;
    if v["ok"] != true {
        return Err(format!("files:write answered {v}").into());
    }
    Ok(took)
}

/// `wait` for a command that must exit 0.
async fn wait_ok(server: &Server, sid: &str, cid: &str) -> Res<()> {
    let w = server
        .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
        .await?;
    if w["exitCode"] != 0 {
        return Err(format!("command {cid}: {w}").into());
    }
    Ok(())
}

/// `timed` once the machine has been left alone for [`SETTLE`].
async fn settled<T>(timed: impl std::future::Future<Output = T>) -> T {
    tokio::time::sleep(SETTLE).await;
    timed.await
}

/// start + wait of one command that must exit 0; returns (total ms, start
/// ms).
async fn run_cmd(server: &Server, sid: &str, body: Value) -> Res<(f64, f64)> {
    let t = Instant::now();
    let v = server
        .post(&format!("/v1/sandboxes/{sid}/commands"), body)
        .await?;
    let start = ms(t.elapsed());
    let cid = id_of(&v, "commandId")?;
    wait_ok(server, sid, &cid).await?;
    Ok((ms(t.elapsed()), start))
}

/// What a log stream delivered.
struct LogRead {
    data: u64,
    dropped: u64,
    exit_code: Option<i64>,
    /// From `since` to the `exit` record; `None`: the stream ended without.
    to_exit: Option<Duration>,
}

/// Reads a log stream to its end.
async fn read_logs(server: &Server, sid: &str, cid: &str, since: Instant) -> Res<LogRead> {
    let resp = server
        .client
        .get(format!(
            "{}/v1/sandboxes/{sid}/commands/{cid}/logs",
            server.base
        ))
        .send()
        .await?;
    if !resp.status().is_success() {
        return Err(format!("GET …/logs: {}", resp.status()).into());
    }
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut read = LogRead {
        data: 0,
        dropped: 0,
        exit_code: None,
        to_exit: None,
    };
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk?);
        let mut start = 0;
        while let Some(i) = buf[start..].iter().position(|b| *b == b'\n') {
            let line: Value = serde_json::from_slice(&buf[start..start + i])?;
            start += i + 1;
            match line["stream"].as_str() {
                Some("stdout") | Some("stderr") => {
                    read.data += line["data"].as_str().map(str::len).unwrap_or(0) as u64
                }
                Some("dropped") => read.dropped += line["bytes"].as_u64().unwrap_or(0),
                Some("exit") if read.to_exit.is_none() => {
                    read.to_exit = Some(since.elapsed());
                    read.exit_code = line["exitCode"].as_i64();
                }
                _ => {}
            }
        }
        buf.drain(..start);
    }
    Ok(read)
}

/// The shaping lines (see the module docs).
async fn shaping(server: &Server, fig: &mut RunFigures) -> Res<()> {
    let v = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "shaping", "network": {"mode": "none"}}),
        )
        .await?;
    let sid = id_of(&v, "sandboxId")?;
    let generator = format!(
        "head -c {} /dev/urandom | base64 -w 76 | head -c {SHAPED_BYTES}",
        SHAPED_BYTES * 3 / 4 + 4096
    );
    let body = json!({"command": generator, "login": false, "timeoutMs": 300000});
    let (mut shaped, mut tails, mut streamed) = (vec![], vec![], vec![]);
    for _ in 0..3 {
        let t = Instant::now();
        let v = server
            .post(&format!("/v1/sandboxes/{sid}/commands"), body.clone())
            .await?;
        let cid = id_of(&v, "commandId")?;
        let logs = read_logs(server, &sid, &cid, t).await?;
        match logs.to_exit {
            Some(took) if logs.data == SHAPED_BYTES => streamed.push(ms(took)),
            _ => return Err(format!("shaping: the stream read {} bytes", logs.data).into()),
        }

        let mut with_output = body.clone();
        with_output["output"] = json!({"maxChars": 20000});
        let t = Instant::now();
        let r = server
            .post(&format!("/v1/sandboxes/{sid}/commands:run"), with_output)
            .await?;
        let took = ms(t.elapsed());
        let out = &r["output"]["stdout"];
        if out["totalBytes"] != SHAPED_BYTES || out["omittedChars"].as_u64().unwrap_or(0) == 0 {
            return Err(format!("shaping: counts {out}").into());
        }
        shaped.push(took);

        let t = Instant::now();
        let r = server
            .post(&format!("/v1/sandboxes/{sid}/commands:run"), body.clone())
            .await?;
        if r["exitCode"] != 0 {
            return Err(format!("shaping: the tail run {}", r["exitCode"]).into());
        }
        tails.push(ms(t.elapsed()));
    }
    fig.p50(SHAPED_RUN, &shaped, &streamed);
    fig.p50(TAIL_RUN, &tails, &streamed);
    Ok(())
}

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
        Some("core") => Some(Section::Core),
        Some("egress") => Some(Section::Egress),
        Some("gvisor") => Some(Section::Gvisor),
        Some("pty") => Some(Section::Pty),
        Some("pool") => Some(Section::Pool),
        Some("shaping") => Some(Section::Shaping),
        Some("changes") => Some(Section::Changes),
        Some(other) => {
            eprintln!(
                "bench: --only takes core, egress, gvisor, pty, pool, shaping or changes, not {other:?}"
            );
            return std::process::ExitCode::FAILURE;
        }
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

/// Members the pool of `server` reports ready for `default`.
async fn pool_members(server: &Server) -> Res<usize> {
    Ok(metric(server, "sandboxd_pool_members{runtime=\"default\"}").await? as usize)
}

/// One series of `server`'s metrics (0 when absent).
async fn metric(server: &Server, series: &str) -> Res<f64> {
    let text = server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await?
        .text()
        .await?;
    let prefix = format!("{series} ");
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

/// Waits (polling every 10 ms, at most 10 s) until `server` has the next
/// `internet` sandbox's link network made, which it does in the background
/// after each create that took it: a create, and the floor's, is then
/// timed with no such work of sandboxd's going on.
async fn link_ready(server: &Server) -> Res<()> {
    let t = Instant::now();
    while metric(server, "sandboxd_link_networks_ready").await? < 1.0 {
        if t.elapsed() > Duration::from_secs(10) {
            return Err("sandboxd made no link network ahead within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Waits (polling every 10 ms, at most 60 s) until the pool holds `n`;
/// returns how long that took.
async fn pool_full(server: &Server, n: usize) -> Res<f64> {
    let t = Instant::now();
    while pool_members(server).await? < n {
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!("the pool did not reach {n} members").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(ms(t.elapsed()))
}

/// Creates a sandbox for `key`; (ms, id).
async fn timed_create(server: &Server, body: Value) -> Res<(f64, String)> {
    let t = Instant::now();
    let v = server.post("/v1/sandboxes", body).await?;
    Ok((ms(t.elapsed()), id_of(&v, "sandboxId")?))
}

/// `n` creates for new keys at once; the slowest answer (ms).
async fn burst(server: &Server, prefix: &str, n: usize) -> Res<f64> {
    let answers = futures_util::future::join_all(
        (0..n).map(|i| timed_create(server, json!({"sessionKey": format!("{prefix}-{i}")}))),
    )
    .await;
    let mut slowest: f64 = 0.0;
    for a in answers {
        slowest = slowest.max(a?.0);
    }
    Ok(slowest)
}

/// Memory of each idle member of `instance`: its memory cgroup's usage and
/// the RSS of the engine's shim process for it on the host (MB each;
/// `None` where this host does not show them: cgroup v1 cgroupfs paths).
async fn member_memory(docker: &Docker, instance: &str) -> Res<(Option<f64>, Option<f64>)> {
    let filter = std::collections::HashMap::from([(
        "label".to_string(),
        vec![
            format!("sandboxd.instance={instance}"),
            "sandboxd.pool=member".to_string(),
        ],
    )]);
    let list = docker
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            filters: Some(filter),
            ..Default::default()
        }))
        .await?;
    let (mut cgroup, mut shim) = (vec![], vec![]);
    for c in list {
        let Some(id) = c.id else { continue };
        if let Ok(v) = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"
        )) && let Ok(bytes) = v.trim().parse::<f64>()
        {
            cgroup.push(bytes / MIB);
        }
        for p in std::fs::read_dir("/proc")?.flatten() {
            let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.starts_with("/usr/bin/containerd-shim") && cmdline.contains(id.as_str()) {
                let status = std::fs::read_to_string(p.path().join("status")).unwrap_or_default();
                if let Some(kb) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                {
                    shim.push(kb / 1024.0);
                }
            }
        }
    }
    let med = |v: &[f64]| (!v.is_empty()).then(|| median(v));
    Ok((med(&cgroup), med(&shim)))
}

/// The warm pool (issue 19's table), in one run: a sandboxd with the
/// default pool (2) next to `cold`, this run's sandboxd with none.
async fn pool(cold: &Server, floor: &Floor, fig: &mut RunFigures, idle_secs: u64) -> Res<()> {
    let instance = format!("{}-pool", floor.instance);
    let warm = Server::start(&instance, None).await?;
    let result = pool_lines(cold, &warm, floor, &instance, fig, idle_secs).await;
    drop(warm);
    cleanup(&floor.docker, &instance).await;
    result
}

async fn pool_lines(
    cold: &Server,
    warm: &Server,
    floor: &Floor,
    instance: &str,
    fig: &mut RunFigures,
    idle_secs: u64,
) -> Res<()> {
    let plain = json!({"cmd": "true", "login": false});
    // Cold, on the sandboxd without a pool, against the engine floor:
    // create, and create + `exec true`.
    let (mut cold_create, mut cold_first, mut fcreate) = (vec![], vec![], vec![]);
    timed_create(cold, json!({"sessionKey": "pool-warmup"})).await?;
    for i in 0..8 {
        link_ready(cold).await?;
        let t = Instant::now();
        let (c, id) = timed_create(cold, json!({"sessionKey": format!("cold-{i}")})).await?;
        run_cmd(cold, &id, plain.clone()).await?;
        cold_first.push(ms(t.elapsed()));
        cold_create.push(c);
        link_ready(cold).await?;
        let name = format!("{}-poolfloor{i}", floor.instance);
        fcreate.push(ms(floor.create(&name).await?));
        floor.remove(&name).await?;
    }
    fig.p50(POOL_COLD, &cold_create, &fcreate);

    // Claims, each from a full pool: create, and create + `exec true`.
    pool_full(warm, 2).await?;
    let (mut hit, mut first, mut refill) = (vec![], vec![], vec![]);
    for i in 0..8 {
        pool_full(warm, 2).await?;
        let t = Instant::now();
        let (c, id) = timed_create(warm, json!({"sessionKey": format!("hit-{i}")})).await?;
        run_cmd(warm, &id, plain.clone()).await?;
        first.push(ms(t.elapsed()));
        hit.push(c);
        refill.push(pool_full(warm, 2).await?);
    }
    fig.p50(POOL_HIT, &hit, &cold_create);
    fig.p50(POOL_FIRST, &first, &cold_first);
    fig.p50(POOL_REFILL, &refill, &[]);
    let mut resized = vec![];
    for i in 0..5 {
        pool_full(warm, 2).await?;
        let body =
            json!({"sessionKey": format!("big-{i}"), "resources": {"vcpus": 2, "memoryMb": 2048}});
        resized.push(timed_create(warm, body).await?.0);
    }
    fig.p50(POOL_HIT_RESIZED, &resized, &[]);
    let hits = metric(warm, "sandboxd_pool_claims_total{outcome=\"hit\"}").await?;
    if hits < 13.0 {
        fig.note(format!("pool: only {hits} of 13 creates were claims"));
    }

    // What a claimed sandbox does first: a 4 MiB write (against the next,
    // warm one) and publishing a port.
    let content = {
        use base64::Engine as _;
        let mut raw = vec![0u8; FILE_BYTES];
        getrandom::fill(&mut raw)?;
        base64::engine::general_purpose::STANDARD.encode(raw)
    };
    let (mut first_write, mut warm_write, mut publish) = (vec![], vec![], vec![]);
    for i in 0..5 {
        pool_full(warm, 2).await?;
        let (_, id) = timed_create(warm, json!({"sessionKey": format!("write-{i}")})).await?;
        first_write.push(write_file(warm, &id, "first.bin", &content).await?);
        warm_write.push(write_file(warm, &id, "second.bin", &content).await?);
        pool_full(warm, 2).await?;
        let (_, id) = timed_create(
            warm,
            json!({"sessionKey": format!("port-{i}"), "ports": [3000]}),
        )
        .await?;
        let t = Instant::now();
        warm.get(&format!("/v1/sandboxes/{id}/ports/3000")).await?;
        publish.push(ms(t.elapsed()));
    }
    fig.p50(POOL_FIRST_WRITE, &first_write, &warm_write);
    fig.p50(POOL_PUBLISH, &publish, &[]);

    // A burst of 10 creates for new keys: with the pool of 2 full, against
    // the same burst on the sandboxd without a pool.
    let no_pool = burst(cold, "burst-cold", 10).await?;
    pool_full(warm, 2).await?;
    let before = metric(warm, "sandboxd_pool_claims_total{outcome=\"hit\"}").await?;
    let with_pool = burst(warm, "burst", 10).await?;
    let claimed = metric(warm, "sandboxd_pool_claims_total{outcome=\"hit\"}").await? - before;
    fig.value(POOL_BURST, with_pool, Some(no_pool));
    fig.value(POOL_BURST_HITS, claimed, None);

    // Stop every session so the members alone remain; then their memory.
    for s in warm.get("/v1/sandboxes").await?["sandboxes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let id = id_of(&s, "sandboxId")?;
        warm.post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
            .await?;
    }
    pool_full(warm, 2).await?;
    match member_memory(&floor.docker, instance).await? {
        (Some(cgroup), shim) => {
            fig.value(POOL_MEMBER_CGROUP, cgroup, None);
            match shim {
                Some(shim) => fig.value(POOL_MEMBER_SHIM, shim, None),
                None => fig.note("pool: no containerd-shim process found for a member".into()),
            }
        }
        (None, _) => {
            fig.note("pool: member memory not measured (no cgroup v1 cgroupfs path)".into())
        }
    }

    // The first command in a member that sat idle, against one in a
    // member made just before (claim both, let the pool refill, claim one
    // at once).
    let mut fresh = vec![];
    for i in 0..4 {
        pool_full(warm, 2).await?;
        for j in 0..2 {
            timed_create(warm, json!({"sessionKey": format!("drain-{i}-{j}")})).await?;
        }
        pool_full(warm, 2).await?;
        let (_, id) = timed_create(warm, json!({"sessionKey": format!("fresh-{i}")})).await?;
        fresh.push(run_cmd(warm, &id, plain.clone()).await?.0);
    }
    // A session sandbox that idles as long, for comparison: what the
    // idle time does to any sandbox, pooled or not.
    let (_, control) = timed_create(warm, json!({"sessionKey": "idle-control"})).await?;
    run_cmd(warm, &control, plain.clone()).await?;
    pool_full(warm, 2).await?;
    println!("pool: leaving the members idle for {idle_secs} s");
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    // The session sandbox's command goes first: whatever the first work
    // after a long idle costs the machine as a whole (seen at 846d76b: the
    // first command after the wait, in whichever sandbox, took about twice
    // the second) lands on it, and the members' lines show what is theirs.
    for _ in 0..3 {
        warm.get("/v1/sandboxes").await?;
    }
    let session = run_cmd(warm, &control, plain.clone()).await?.0;
    // Each claim once the pool is full again, as each fresh one was: the
    // second idle member's first command would otherwise run while the
    // first one's refill makes a container. A claim takes the oldest
    // member, so the second claim still takes the one that sat idle.
    let mut idle = vec![];
    for i in 0..2 {
        pool_full(warm, 2).await?;
        let (_, id) = timed_create(warm, json!({"sessionKey": format!("idle-{i}")})).await?;
        idle.push(run_cmd(warm, &id, plain.clone()).await?.0);
    }
    fig.value(POOL_IDLE_SESSION, session, None);
    fig.p50(POOL_IDLE_FIRST, &idle, &fresh);
    Ok(())
}
