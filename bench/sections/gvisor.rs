//! The gVisor section (`--only gvisor`; part of `core` where the engine has
//! runsc): the `exec true` round trip in a sandbox of a runtime with
//! `oci_runtime = "runsc"` (`"runtime": "gvisor"`), 20 samples; floor:
//! `docker exec true` in that runsc container. Next to it, what `true`
//! costs inside that sandbox alone: bash there starts `/bin/true` 20 times
//! (fork, exec, exit, wait), timed there by `date +%s%N`, 3 samples. And
//! the 64 MB log stream there (as in core), with the same script's output
//! to /dev/null by `docker exec`, from exec create to its end (what it
//! makes alone).

use serde_json::json;

use super::core::{LOG_BYTES, log_generator, log_streams};
use crate::floor::{Floor, FloorExec};
use crate::report::{Line, RunFigures, line};
use crate::requests::{id_of, run_cmd, settled};
use crate::support::{Res, Server};

const EXEC_GVISOR: &str = "`exec true` round trip under gVisor p50 (ms)";
const EXEC_GVISOR_ALONE: &str =
    "under gVisor, `true` run by bash in the same sandbox, by `docker exec` (ms each)";
const LOGS_GVISOR: &str = "log stream under gVisor, 64 MB (MB/s)";
const LOGS_GVISOR_ALONE: &str =
    "under gVisor, the same script with its output to /dev/null, by `docker exec` (MB/s)";

/// The round trip lines, printed after runc's.
pub(crate) const EXEC_LINES: &[Line] = &[
    line(EXEC_GVISOR, "≤ 10 ms", Some(|v, _| v <= 10.0)),
    line(
        EXEC_GVISOR_ALONE,
        "report (what starting `true` costs there without sandboxd)",
        None,
    ),
];

/// The log stream lines, printed after runc's.
pub(crate) const LOG_LINES: &[Line] = &[
    line(LOGS_GVISOR, "", None),
    line(
        LOGS_GVISOR_ALONE,
        "report (what the script makes alone: the stream's ceiling)",
        None,
    ),
];

/// The gVisor lines (see the module's docs), in a sandbox of the runtime
/// `gvisor` of this run's sandboxd.
pub(crate) async fn measure(server: &Server, floor: &Floor, fig: &mut RunFigures) -> Res<()> {
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
