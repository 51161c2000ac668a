//! The shaping section (issue 20, `--only shaping`): 100 MB of base64 text
//! (76 characters a line) run by `commands:run` with `"output":
//! {"maxChars": 20000}`, timed from the request to the answer, after
//! checking the answer's counts; floor column: the same command streamed
//! (`POST …/commands` to the `exit` record of `GET …/logs`, every byte
//! read). And the same `commands:run` without `output` (1 MiB tails), for
//! comparison. 3 samples of each, interleaved, in an offline sandbox.

use std::time::Instant;

use serde_json::json;

use crate::report::{Line, RunFigures, line, ratio_at_most};
use crate::requests::{id_of, read_logs};
use crate::support::{Res, Server, ms};

const SHAPED_RUN: &str = "shaping: `commands:run` of 100 MB with `output` p50 (ms)";
const TAIL_RUN: &str = "shaping: the same run with 1 MiB tails, no `output` p50 (ms)";
/// Bytes of output the shaping lines measure.
const SHAPED_BYTES: u64 = 100_000_000;

pub(crate) const LINES: &[Line] = &[
    line(
        SHAPED_RUN,
        "≤ 1.2× streaming it (floor column)",
        Some(|v, f| ratio_at_most(v, f, 1.2)),
    ),
    line(TAIL_RUN, "report (floor column: streaming it)", None),
];

/// The shaping lines (see the module's docs).
pub(crate) async fn measure(server: &Server, fig: &mut RunFigures) -> Res<()> {
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
