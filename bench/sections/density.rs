//! The density section (issue 39, `--only density`, lines `density: …`;
//! `--only burst` runs it too): what 100 idle sandboxes cost sandboxd and
//! the host. A sandboxd of its own, at its defaults with room for 120,
//! measures the same things with 1 session running (the floor column of
//! each line) and with 100: `exec true` (start + wait, 20 samples after 3
//! warm-ups, each sent after a quiet 50 ms) in the first session's sandbox,
//! a claim (5, each from a pool holding 2) and a cold create (5; in network
//! mode `none`, which no member serves), each of these sessions stopped
//! right after, every sample starting on a quiet machine (the sandboxd's
//! objects and pool unchanged for 1 s); and sandboxd's RSS. The 99 other
//! sessions are made one after another (claims or cold, as the pool
//! serves them) and sit idle. With the 100: what one idle sandbox costs on
//! the host, the median over them of its memory cgroup's usage plus the
//! RSS of the engine's shim process for it (the pool section's reading of
//! a member's).

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::ListContainersOptions;
use serde_json::json;

use super::pool::host_memory;
use crate::floor::Floor;
use crate::report::{Line, RunFigures, line, ratio_at_most};
use crate::requests::{
    claims, create_sandbox, id_of, pool_full, quiet, run_cmd, settled, stop, timed_create,
};
use crate::support::{Instance, Res, Server, median};

/// Idle sessions the heavy side of each line has running.
const SESSIONS: usize = 100;
/// Claims and cold creates timed on each side.
const CREATES: usize = 5;
/// How long the pool of 2 may take to fill.
const FILL: Duration = Duration::from_secs(60);

const RSS: &str = "density: sandboxd RSS, 100 idle sandboxes running (MB)";
const EXEC: &str = "density: `exec true` p50, 100 idle sandboxes running (ms)";
const CLAIM: &str = "density: a claim p50, 100 running (ms)";
const COLD: &str = "density: a cold create (network `none`) p50, 100 running (ms)";
const HOST: &str =
    "density: an idle sandbox on the host, its memory cgroup + the engine's shim RSS p50 (MB)";

pub(crate) const LINES: &[Line] = &[
    line(
        RSS,
        "≤ 64 MB (floor column: with 1)",
        Some(|v, _| v <= 64.0),
    ),
    line(
        EXEC,
        "≤ 1.1× with 1 (floor column)",
        Some(|v, f| ratio_at_most(v, f, 1.1)),
    ),
    line(CLAIM, "report (floor column: with 1)", None),
    line(COLD, "report (floor column: with 1)", None),
    line(HOST, "report", None),
];

/// What one side measured.
struct Side {
    exec: Vec<f64>,
    claim: Vec<f64>,
    cold: Vec<f64>,
    rss_mb: f64,
}

/// Every density line, on a sandboxd of its own.
pub(crate) async fn measure(floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    let name = format!("{}-density", floor.instance);
    // Its file is empty: sandboxd's defaults.
    let own = Instance::start(&floor.docker, &name, "", SESSIONS + 20).await?;
    let server = &own.server;
    pool_full(server, 2, FILL).await?;
    let first = create_sandbox(server, json!({"sessionKey": "density-0"})).await?;
    let one = side(server, &floor.docker, &name, &first, fig).await?;
    for i in 1..SESSIONS {
        create_sandbox(server, json!({"sessionKey": format!("density-{i}")})).await?;
    }
    let hundred = side(server, &floor.docker, &name, &first, fig).await?;
    fig.value(RSS, hundred.rss_mb, Some(one.rss_mb));
    fig.p50(EXEC, &hundred.exec, &one.exec);
    fig.p50(CLAIM, &hundred.claim, &one.claim);
    fig.p50(COLD, &hundred.cold, &one.cold);
    host_cost(server, &floor.docker, &name, fig).await
}

/// One side's measurements, with the sessions running now; `first` is
/// the sandbox the commands run in.
async fn side(
    server: &Server,
    docker: &Docker,
    instance: &str,
    first: &str,
    fig: &mut RunFigures,
) -> Res<Side> {
    let plain = json!({"cmd": "true", "login": false});
    for _ in 0..3 {
        run_cmd(server, first, plain.clone()).await?;
    }
    quiet(server, docker, instance).await?;
    let mut exec = vec![];
    for _ in 0..20 {
        exec.push(settled(run_cmd(server, first, plain.clone())).await?.0);
    }
    let running = server.get("/v1/sandboxes").await?["sandboxes"]
        .as_array()
        .map_or(0, Vec::len);
    let (hits, misses) = claims(server).await?;
    let (mut claim, mut cold) = (vec![], vec![]);
    for i in 0..CREATES {
        pool_full(server, 2, FILL).await?;
        quiet(server, docker, instance).await?;
        let key = format!("density-claim-{running}-{i}");
        let (took, id) = timed_create(server, json!({"sessionKey": key})).await?;
        claim.push(took);
        stop(server, &id).await?;
        quiet(server, docker, instance).await?;
        let key = format!("density-cold-{running}-{i}");
        let body = json!({"sessionKey": key, "network": {"mode": "none"}});
        let (took, id) = timed_create(server, body).await?;
        cold.push(took);
        stop(server, &id).await?;
    }
    let (hits_after, misses_after) = claims(server).await?;
    if hits_after - hits != CREATES as f64 || misses_after - misses != CREATES as f64 {
        fig.note(format!(
            "density with {running} running: {} claims and {} cold creates, not {CREATES} each",
            hits_after - hits,
            misses_after - misses
        ));
    }
    quiet(server, docker, instance).await?;
    Ok(Side {
        exec,
        claim,
        cold,
        rss_mb: server.rss_kb() as f64 / 1024.0,
    })
}

/// What each running session's sandbox costs on the host: its memory
/// cgroup plus its shim's RSS, the median over them.
async fn host_cost(
    server: &Server,
    docker: &Docker,
    instance: &str,
    fig: &mut RunFigures,
) -> Res<()> {
    let containers = docker
        .list_containers(Some(ListContainersOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("sandboxd.instance={instance}")],
            )])),
            ..Default::default()
        }))
        .await?;
    // A sandbox's container is named `<instance>-<sandboxId>`.
    let by_name: HashMap<String, String> = containers
        .into_iter()
        .filter_map(|c| {
            let name = c.names?.first()?.trim_start_matches('/').to_string();
            Some((name, c.id?))
        })
        .collect();
    let (mut total, mut cgroups, mut shims) = (vec![], vec![], vec![]);
    for s in server.get("/v1/sandboxes").await?["sandboxes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let sid = id_of(&s, "sandboxId")?;
        let Some(id) = by_name.get(&format!("{instance}-{sid}")) else {
            continue;
        };
        if let (Some(cgroup), Some(shim)) = host_memory(id)? {
            total.push(cgroup + shim);
            cgroups.push(cgroup);
            shims.push(shim);
        }
    }
    if total.is_empty() {
        fig.note("density: no sandbox's memory cgroup and shim found on this host".into());
        return Ok(());
    }
    fig.p50(HOST, &total, &[]);
    fig.note(format!(
        "density: of {} idle sandboxes, memory cgroup p50 {:.2} MB, shim RSS p50 {:.2} MB",
        total.len(),
        median(&cgroups),
        median(&shims)
    ));
    Ok(())
}
