//! The changes section (issue 20, `--only changes`): `commands:run` of a
//! script that writes 1,000 files, with `"changes": true`; floor column:
//! the same without, in the same loop, alternating which goes first. 20
//! samples after 3 warm-ups.

use std::time::Instant;

use serde_json::json;

use crate::report::{Line, RunFigures, line, ratio_at_most};
use crate::requests::create_sandbox;
use crate::support::{Res, Server, ms};

const CHANGES: &str = "command touching 1,000 files with `\"changes\": true` (run) p50 (ms)";

pub(crate) const LINES: &[Line] = &[line(
    CHANGES,
    "≤ 1.1× without (floor column)",
    Some(|v, f| ratio_at_most(v, f, 1.1)),
)];

/// `commands:run` of a script that writes 1,000 files (in a workspace of
/// 1,000 more), with `"changes": true` and without, alternately and in
/// turns of which goes first; 20 samples of each after 3 warm-ups.
pub(crate) async fn measure(server: &Server, fig: &mut RunFigures) -> Res<()> {
    let sid = create_sandbox(
        server,
        json!({"sessionKey": "changes", "network": {"mode": "none"}}),
    )
    .await?;
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
