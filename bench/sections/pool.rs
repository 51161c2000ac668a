//! The pool section (issue 19, `--only pool`, lines `pool: …`): the run's
//! sandboxd has no pool (`pool_size = 0`, so every core line measures the
//! cold path); a second sandboxd at its defaults (a pool of 2) runs next to
//! it. Cold create (8 samples, floor: the engine's volume + container
//! create + start) and cold create + `exec true` on the first; on the
//! second, each from a full pool: a claim (8), a claim with 2 vCPUs / 2 GiB
//! (5), a claim + `exec true` (time to first command), the time until the
//! pool is full again, the first 4 MiB write after a claim against the
//! next write (5), the first `GET …/ports/3000` after a claim with
//! `"ports": [3000]` (5); a burst of 10 concurrent creates for new keys on
//! each (the slowest answer; the claims among them from the pool's
//! metrics); the memory cgroup usage of an idle member and the RSS of the
//! engine's shim process for it on the host; and the first command in a
//! member idle for `--idle-secs` (default 300) against one in a member
//! made just before (2 and 4 samples, each claimed from a full pool, so
//! that no refill runs under it), and, for comparison, the first command
//! in a session sandbox that idled as long, measured first after the idle
//! time (after three `GET /v1/sandboxes`).

use std::time::Duration;

use bollard::Docker;
use serde_json::json;

use crate::floor::Floor;
use crate::report::{Line, MIB, RunFigures, line, ratio_at_most};
use crate::requests::{
    claims, first_command, id_of, link_ready, pool_full, port_get, random_file_content, run_cmd,
    timed_create, write_file,
};
use crate::support::{Instance, Res, Server, median, ms};

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

/// How long the pool of 2 may take to fill.
const FILL: Duration = Duration::from_secs(60);

pub(crate) const LINES: &[Line] = &[
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
];

/// The warm pool (issue 19's table), in one run: a sandboxd with the
/// default pool (2) next to `cold`, this run's sandboxd with none.
pub(crate) async fn measure(
    cold: &Server,
    floor: &Floor,
    fig: &mut RunFigures,
    idle_secs: u64,
) -> Res<()> {
    let instance = format!("{}-pool", floor.instance);
    // Its file is empty: sandboxd's defaults.
    let warm = Instance::start(&floor.docker, &instance, "", 100).await?;
    pool_lines(cold, &warm.server, floor, &instance, fig, idle_secs).await
}

/// Every pool line, in the order they are measured: on `cold` (no pool)
/// and `warm` (the pool of 2, of `instance`).
async fn pool_lines(
    cold: &Server,
    warm: &Server,
    floor: &Floor,
    instance: &str,
    fig: &mut RunFigures,
    idle_secs: u64,
) -> Res<()> {
    creates(cold, warm, floor, fig).await?;
    first_work(warm, fig).await?;
    burst_and_members(cold, warm, &floor.docker, instance, fig).await?;
    idle_members(warm, fig, idle_secs).await
}

/// Cold creates against the engine floor, and claims against the cold
/// creates: create, and create + `exec true`; claims with more resources.
async fn creates(cold: &Server, warm: &Server, floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    // Cold, on the sandboxd without a pool, against the engine floor:
    // create, and create + `exec true`.
    let (mut cold_create, mut cold_first, mut fcreate) = (vec![], vec![], vec![]);
    timed_create(cold, json!({"sessionKey": "pool-warmup"})).await?;
    for i in 0..8 {
        link_ready(cold).await?;
        let f = first_command(cold, json!({"sessionKey": format!("cold-{i}")})).await?;
        cold_first.push(f.first);
        cold_create.push(f.create);
        link_ready(cold).await?;
        let name = format!("{}-poolfloor{i}", floor.instance);
        fcreate.push(ms(floor.create(&name).await?));
        floor.remove(&name).await?;
    }
    fig.p50(POOL_COLD, &cold_create, &fcreate);

    // Claims, each from a full pool: create, and create + `exec true`.
    pool_full(warm, 2, FILL).await?;
    let (mut hit, mut first, mut refill) = (vec![], vec![], vec![]);
    for i in 0..8 {
        pool_full(warm, 2, FILL).await?;
        let f = first_command(warm, json!({"sessionKey": format!("hit-{i}")})).await?;
        first.push(f.first);
        hit.push(f.create);
        refill.push(pool_full(warm, 2, FILL).await?);
    }
    fig.p50(POOL_HIT, &hit, &cold_create);
    fig.p50(POOL_FIRST, &first, &cold_first);
    fig.p50(POOL_REFILL, &refill, &[]);
    let mut resized = vec![];
    for i in 0..5 {
        pool_full(warm, 2, FILL).await?;
        let body =
            json!({"sessionKey": format!("big-{i}"), "resources": {"vcpus": 2, "memoryMb": 2048}});
        resized.push(timed_create(warm, body).await?.0);
    }
    fig.p50(POOL_HIT_RESIZED, &resized, &[]);
    let (hits, _) = claims(warm).await?;
    if hits < 13.0 {
        fig.note(format!("pool: only {hits} of 13 creates were claims"));
    }
    Ok(())
}

/// What a claimed sandbox does first: a 4 MiB write, and a port's publish.
async fn first_work(warm: &Server, fig: &mut RunFigures) -> Res<()> {
    // What a claimed sandbox does first: a 4 MiB write (against the next,
    // warm one) and publishing a port.
    let content = random_file_content()?;
    let (mut first_write, mut warm_write, mut publish) = (vec![], vec![], vec![]);
    for i in 0..5 {
        pool_full(warm, 2, FILL).await?;
        let (_, id) = timed_create(warm, json!({"sessionKey": format!("write-{i}")})).await?;
        first_write.push(write_file(warm, &id, "first.bin", &content).await?);
        warm_write.push(write_file(warm, &id, "second.bin", &content).await?);
        pool_full(warm, 2, FILL).await?;
        let (_, id) = timed_create(
            warm,
            json!({"sessionKey": format!("port-{i}"), "ports": [3000]}),
        )
        .await?;
        publish.push(port_get(warm, &id).await?);
    }
    fig.p50(POOL_FIRST_WRITE, &first_write, &warm_write);
    fig.p50(POOL_PUBLISH, &publish, &[]);
    Ok(())
}

/// A burst of creates on each sandboxd, then the memory of the members
/// alone (every session stopped).
async fn burst_and_members(
    cold: &Server,
    warm: &Server,
    docker: &Docker,
    instance: &str,
    fig: &mut RunFigures,
) -> Res<()> {
    // A burst of 10 creates for new keys: with the pool of 2 full, against
    // the same burst on the sandboxd without a pool.
    let no_pool = burst(cold, "burst-cold", 10).await?;
    pool_full(warm, 2, FILL).await?;
    let (before, _) = claims(warm).await?;
    let with_pool = burst(warm, "burst", 10).await?;
    let claimed = claims(warm).await?.0 - before;
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
    pool_full(warm, 2, FILL).await?;
    match member_memory(docker, instance).await? {
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
    Ok(())
}

/// The first command in members that sat idle for `idle_secs`, against
/// fresh ones, and in a session sandbox idle as long.
async fn idle_members(warm: &Server, fig: &mut RunFigures, idle_secs: u64) -> Res<()> {
    let plain = json!({"cmd": "true", "login": false});
    // The first command in a member that sat idle, against one in a
    // member made just before (claim both, let the pool refill, claim one
    // at once).
    let mut fresh = vec![];
    for i in 0..4 {
        pool_full(warm, 2, FILL).await?;
        for j in 0..2 {
            timed_create(warm, json!({"sessionKey": format!("drain-{i}-{j}")})).await?;
        }
        pool_full(warm, 2, FILL).await?;
        let (_, id) = timed_create(warm, json!({"sessionKey": format!("fresh-{i}")})).await?;
        fresh.push(run_cmd(warm, &id, plain.clone()).await?.0);
    }
    // A session sandbox that idles as long, for comparison: what the
    // idle time does to any sandbox, pooled or not.
    let (_, control) = timed_create(warm, json!({"sessionKey": "idle-control"})).await?;
    run_cmd(warm, &control, plain.clone()).await?;
    pool_full(warm, 2, FILL).await?;
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
        pool_full(warm, 2, FILL).await?;
        let (_, id) = timed_create(warm, json!({"sessionKey": format!("idle-{i}")})).await?;
        idle.push(run_cmd(warm, &id, plain.clone()).await?.0);
    }
    fig.value(POOL_IDLE_SESSION, session, None);
    fig.p50(POOL_IDLE_FIRST, &idle, &fresh);
    Ok(())
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
/// the RSS of the engine's shim process for it on the host (MB each, the
/// median over the members; `None` where this host does not show them).
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
    for id in list.into_iter().filter_map(|c| c.id) {
        let (c, s) = host_memory(&id)?;
        cgroup.extend(c);
        shim.extend(s);
    }
    let med = |v: &[f64]| (!v.is_empty()).then(|| median(v));
    Ok((med(&cgroup), med(&shim)))
}

/// What the container `id` (its full id) costs on the host: its memory
/// cgroup's usage and the RSS of the engine's shim process for it (MB
/// each; `None` where this host does not show them: cgroup v1 cgroupfs
/// paths, a `containerd-shim` process naming the id).
pub(crate) fn host_memory(id: &str) -> Res<(Option<f64>, Option<f64>)> {
    let cgroup = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"
    ))
    .ok()
    .and_then(|v| v.trim().parse::<f64>().ok())
    .map(|bytes| bytes / MIB);
    let mut shim = None;
    for p in std::fs::read_dir("/proc")?.flatten() {
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.starts_with("/usr/bin/containerd-shim") && cmdline.contains(id) {
            let status = std::fs::read_to_string(p.path().join("status")).unwrap_or_default();
            shim = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .map(|kb| kb / 1024.0);
        }
    }
    Ok((cgroup, shim))
}
