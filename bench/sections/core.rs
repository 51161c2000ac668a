//! The core section (`--only core`: every line but the shaping and pool
//! sections): round trips, the log stream, a background server, files,
//! kill, create/reconnect/stop, port publish, the agent and sandboxd's
//! memory, each against the engine floor where it has one; then, in the
//! same sandboxd, the gVisor (where the engine has runsc), egress, terminal
//! and changes sections (their own files).
//!
//! What the lines measure (ratio = sandboxd / floor column):
//! - `exec true` round trip: `POST …/commands` `{"cmd":"true","login":false}`
//!   plus `GET …/wait`, 40 samples after 5 warm-ups; floor: `docker exec
//!   true` (exec create, attached start read to the end, inspect). Each
//!   round trip of these, of the next line and of the gVisor one,
//!   sandboxd's and the floor's alike, is sent after a quiet 50 ms
//!   (`requests::settled`), not into the tail of the one before it.
//! - `bash -lc true`: RemcoChat's `{"cmd":"bash","args":["-lc","true"]}`;
//!   floor: `docker exec bash -lc true`.
//! - log stream: 64 MB of base64 text, timed from sending `POST …/commands`
//!   to the `exit` record of `GET …/logs` (NDJSON parsed, every byte
//!   counted); floor: `docker exec` of the same script, from exec create to
//!   the end of its attached stream. 3 samples each; also under gVisor
//!   (gvisor.rs), and there also the same script with its output to
//!   /dev/null by `docker exec`, from exec create to its end (what it
//!   makes alone).
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
//!   sandboxd has its link networks made ahead (`link_ready`).
//! - port publish: the first `GET …/ports/3000` right after a create with
//!   `"ports": [3000]` (the publish work happens there); and the lookup on a
//!   sandbox created 1 s earlier. 5 samples each.
//! - agent: VmRSS of `/.sandboxd/sandboxd-agent serve` in a sandbox left
//!   idle after one command (its connection is the agent's stdio: no
//!   bridge process), and the size of the agent binary in it, read by
//!   `docker exec`. MB here is 2^20 bytes.
//! - memory: sandboxd's RSS at start, after the run, and its growth while a
//!   command prints 1 GB that nobody reads.

use std::time::{Duration, Instant};

use sandboxd::sandbox::agent_delivery;
use serde_json::{Value, json};

use super::{changes, egress, gvisor, pty};
use crate::floor::Floor;
use crate::report::{Line, MIB, RunFigures, line, ratio_at_most};
use crate::requests::{
    FILE_BYTES, create_sandbox, id_of, link_ready, port_get, random_file_content, read_logs,
    run_cmd, settled, wait_ok, write_file,
};
use crate::support::{Res, Server, median, ms};

/// Bytes of output the log stream lines measure.
pub(crate) const LOG_BYTES: u64 = 64 * 1024 * 1024;
/// Writes and reads (each) timed, after the warm-ups that are not.
const FILE_SAMPLES: usize = 20;
const FILE_WARMUPS: usize = 2;
const FLOOD_BYTES: u64 = 1024 * 1024 * 1024;

/// The command `kill answered` kills: it ignores SIGTERM (so does `sleep`,
/// which inherits the ignored signal), so the tree ends only by SIGKILL
/// after the grace period; the answer must not wait for that.
const KILL_TARGET: &str = "trap '' TERM; sleep 600";

const EXEC: &str = "`exec true` round trip (start + wait) p50 (ms)";
const EXEC_P95: &str = "`exec true` round trip p95 (ms)";
const EXEC_LOGIN: &str = "`bash -lc true` round trip p50 (ms)";
const LOGS: &str = "log stream, 64 MB (MB/s)";
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

/// The round trip lines (the gVisor ones follow them).
pub(crate) const EXEC_LINES: &[Line] = &[
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
];

/// The log stream line (the gVisor ones follow it).
pub(crate) const LOG_LINES: &[Line] = &[line(
    LOGS,
    "≥ 1.0× raw exec stream",
    Some(|v, f| f.is_some_and(|f| v >= f)),
)];

/// The rest of the core lines.
pub(crate) const LINES: &[Line] = &[
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
    line(
        STOP,
        "≤ 1.5× floor (issue 39)",
        Some(|v, f| ratio_at_most(v, f, 1.5)),
    ),
    line(PUBLISH, "≤ 250 ms", Some(|v, _| v <= 250.0)),
    line(PUBLISH_LATER, "", None),
    line(AGENT_RSS, "≤ 4 MB", Some(|v, _| v <= 4.0)),
    line(AGENT_SIZE, "≤ 5 MB", Some(|v, _| v <= 5.0)),
    line(IDLE_RSS, "≤ 20 MB", Some(|v, _| v <= 20.0)),
    line(AFTER_RSS, "", None),
    line(GROWTH, "< 64 MB", Some(|v, _| v < 64.0)),
    line(DRAINED, "", None),
];

/// The warm sandbox most core lines run in: sandboxd's id for it, and the
/// floor's name for its container (the floor's `docker exec`s go into the
/// very container the sandbox runs in).
#[derive(Clone, Copy)]
struct Warm<'a> {
    server: &'a Server,
    floor: &'a Floor,
    sid: &'a str,
    container: &'a str,
}

/// Every core line, and then the gVisor (where the engine has runsc),
/// egress, terminal and changes sections, in one sandboxd; see the module's
/// docs for what each line measures.
pub(crate) async fn measure(
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
    let idle = create_sandbox(server, json!({"sessionKey": "idle"})).await?;
    run_cmd(server, &idle, json!({"cmd": "true", "login": false})).await?;

    creates(server, floor, fig).await?;
    let on = Warm {
        server,
        floor,
        sid,
        container: &container,
    };
    round_trips(on, fig, profile).await?;
    background(on, fig).await?;

    // Log stream throughput: 64 MB of base64 text, timed from the request
    // that starts the command to its `exit` record, against `docker exec`
    // of the same script from exec create to the end of its stream.
    let (thr, fthr) = log_streams(server, floor, sid, &container, fig, 3).await?;
    fig.p50(LOGS, &thr, &fthr);

    files(on, fig).await?;
    kill(server, sid, fig).await?;
    publish(server, fig).await?;

    // gVisor: the same round trip and log stream in a sandbox of a runtime
    // with oci_runtime = "runsc", against `docker exec` in its container.
    if runsc {
        if let Err(e) = gvisor::measure(server, floor, fig).await {
            fig.note(format!("gVisor lines not measured: {e}"));
        }
    } else {
        fig.note("gVisor lines not measured: the engine has no runsc runtime".into());
    }

    agent(floor, &idle, fig).await?;
    memory(server, sid, idle_rss, fig).await?;
    egress::measure(server, fig).await?;
    pty::measure(server, fig).await?;
    changes::measure(server, fig).await
}

/// Create (cold), reconnect, stop, and their floors, interleaved.
async fn creates(server: &Server, floor: &Floor, fig: &mut RunFigures) -> Res<()> {
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
    Ok(())
}

/// Round trips of `true` and of RemcoChat's `bash -lc true` in `sid`, each
/// against `docker exec` of the same argv in the same container.
async fn round_trips(on: Warm<'_>, fig: &mut RunFigures, profile: bool) -> Res<()> {
    let (server, floor, sid, container) = (on.server, on.floor, on.sid, on.container);
    let (mut exec, mut fexec, mut start_part) = (vec![], vec![], vec![]);
    let (mut login, mut flogin) = (vec![], vec![]);
    let plain = json!({"cmd": "true", "login": false});
    let remcochat = json!({"cmd": "bash", "args": ["-lc", "true"]});
    for _ in 0..5 {
        run_cmd(server, sid, plain.clone()).await?;
        run_cmd(server, sid, remcochat.clone()).await?;
        floor.round_trip(container, &["true"]).await?;
        floor
            .round_trip(container, &["bash", "-lc", "true"])
            .await?;
    }
    for _ in 0..40 {
        let (total, start) = settled(run_cmd(server, sid, plain.clone())).await?;
        exec.push(total);
        start_part.push(start);
        fexec.push(settled(floor.round_trip(container, &["true"])).await?);
        login.push(settled(run_cmd(server, sid, remcochat.clone())).await?.0);
        flogin.push(settled(floor.round_trip(container, &["bash", "-lc", "true"])).await?);
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
    Ok(())
}

/// A command that leaves a server running in the background, and the
/// plain command right after it, against the plain command alone (the same
/// form: a `command` script, so a login shell). The same three through
/// `docker exec` in the same container, for comparison.
async fn background(on: Warm<'_>, fig: &mut RunFigures) -> Res<()> {
    let (server, floor, sid, container) = (on.server, on.floor, on.sid, on.container);
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
            .round_trip(container, &["bash", "-lc", "true"])
            .await?;
        let f_bg = floor
            .round_trip(container, &["bash", "-lc", &bg_script(fport)])
            .await?;
        let f_after = floor
            .round_trip(container, &["bash", "-lc", "true"])
            .await?;
        floor
            .exec(
                container,
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
    Ok(())
}

/// Files: 4 MiB write and read, what the kernel alone takes to make such
/// a file, and the first write into a sandbox created just before,
/// against the warm write.
async fn files(on: Warm<'_>, fig: &mut RunFigures) -> Res<()> {
    let (server, floor, sid, container) = (on.server, on.floor, on.sid, on.container);
    let content = random_file_content()?;
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
        &kernel_file_writes(floor, container).await?,
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
    Ok(())
}

/// Kill: the time until `:kill` answers for a command that ignores
/// SIGTERM; each must then end by SIGKILL (137, killed).
async fn kill(server: &Server, sid: &str, fig: &mut RunFigures) -> Res<()> {
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
    Ok(())
}

/// Port publish: the first GET right after the create (ports are
/// published in the background from the create on, so this GET waits for
/// that work), and a GET 1 s after the create.
async fn publish(server: &Server, fig: &mut RunFigures) -> Res<()> {
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
            out.push(port_get(server, &id).await?);
            server
                .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
                .await?;
        }
    }
    fig.p50(PUBLISH, &publish_now, &[]);
    fig.p50(PUBLISH_LATER, &publish_later, &[]);
    Ok(())
}

/// The agent: its idle RSS and its binary, read with `docker exec` in the
/// sandbox `idle`, which stayed idle after one command.
async fn agent(floor: &Floor, idle: &str, fig: &mut RunFigures) -> Res<()> {
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
    Ok(())
}

/// Memory of sandboxd itself: `idle_rss` (kB, taken at the start), now,
/// and its growth while a command in `sid` prints 1 GB that nobody reads.
async fn memory(server: &Server, sid: &str, idle_rss: u64, fig: &mut RunFigures) -> Res<()> {
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
    Ok(())
}

/// The script whose output the log stream lines measure: LOG_BYTES of
/// base64 text.
pub(crate) fn log_generator() -> String {
    format!(
        "head -c {} /dev/urandom | base64 -w 76 | head -c {LOG_BYTES}",
        LOG_BYTES * 3 / 4 + 4096
    )
}

/// `n` log streams of LOG_BYTES through sandboxd and through `docker exec`,
/// interleaved: (sandboxd MB/s, floor MB/s).
pub(crate) async fn log_streams(
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
