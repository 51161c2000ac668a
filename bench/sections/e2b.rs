//! The E2B section (issue 41, `--only e2b`): E2B's own Python SDK,
//! unchanged, against sandboxd's REST in the same run, on a sandboxd of
//! its own with its defaults (a warm pool of 2), both timed by the
//! same client process (bench/e2b_sdk.py, in the venv the tests use,
//! target/e2b-python-venv): `Sandbox.create()` + `commands.run("true")`
//! against `POST /v1/sandboxes` + `commands:run` of `true` (10 of each
//! after 2 warm-ups, alternating, each a claim from a pool of 2 refilled
//! in between), and `commands.run("true")` alone against `commands:run`
//! in one sandbox (20 of each after 3 warm-ups, alternating).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::floor::Floor;
use crate::report::{Line, RunFigures, line, ratio_at_most};
use crate::support::{Instance, Res};

const CREATE_RUN: &str = "E2B SDK `Sandbox.create()` + `commands.run(\"true\")`, a pool claim, p50 (ms; floor column: REST create + `commands:run`)";
const RUN: &str = "E2B SDK `commands.run(\"true\")` p50 (ms; floor column: REST `commands:run`)";

pub(crate) const LINES: &[Line] = &[
    line(CREATE_RUN, "≤ 50 ms", Some(|v, _| v <= 50.0)),
    line(
        RUN,
        "≤ 1.5× `commands:run` (floor column)",
        Some(|v, f| ratio_at_most(v, f, 1.5)),
    ),
];

/// Samples of each kind of call the client takes.
const CREATES: usize = 10;
const RUNS: usize = 20;

/// See the module docs.
pub(crate) async fn measure(floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    // Its file is empty: sandboxd's defaults.
    let own = Instance::start(&floor.docker, &format!("{}-e2b", floor.instance), "", 100).await?;
    let server = &own.server;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = repo.join("target/e2b-python-venv/bin/python");
    if !python.exists() {
        return Err(format!(
            "e2b: {} is missing (bench/run.sh makes it from clients/e2b-python/requirements.txt)",
            python.display()
        )
        .into());
    }
    let run = tokio::process::Command::new(python)
        .arg(repo.join("bench/e2b_sdk.py"))
        .args([CREATES.to_string(), RUNS.to_string()])
        .env("E2B_API_KEY", "e2b_bench")
        .env("E2B_API_URL", &server.base)
        .env("E2B_SANDBOX_URL", &server.base)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .map_err(|_| "e2b: the SDK client took over 10 minutes")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "e2b: the SDK client failed:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let samples: Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("e2b: no samples in the client's output:\n{stdout}"))?;
    let of = |part: &str, side: &str| -> Vec<f64> {
        samples[part][side]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    fig.p50(CREATE_RUN, &of("creates", "sdk"), &of("creates", "rest"));
    fig.p50(RUN, &of("runs", "sdk"), &of("runs", "rest"));
    Ok(())
}
