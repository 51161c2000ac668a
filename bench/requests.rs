//! What every section asks the sandboxd it measures, the same way each
//! time: create a sandbox, run a command to its end, wait, read a log
//! stream to its end, write a file, read a metric, and wait for the
//! machine to settle or for sandboxd's next link network before a timed
//! request.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::{Res, Server, ms};

/// The size of the file the write and read lines move: 4 MiB.
pub(crate) const FILE_BYTES: usize = 4 * 1024 * 1024;

/// Quiet time before each timed round trip of the `exec true`, `bash -lc
/// true` and gVisor lines, sandboxd's and the floor's alike. After a
/// `docker exec` has answered, containerd goes on working for 10–20
/// ms, and after a sandboxd command the agent makes the next command's
/// spare (30–40 ms under gVisor); on two cores a round trip sent at once
/// measures the other's tail as well as its own path (bench/RESULTS.md).
const SETTLE: Duration = Duration::from_millis(50);

/// The string `field` of an answer (an id).
pub(crate) fn id_of(v: &Value, field: &str) -> Res<String> {
    Ok(v[field]
        .as_str()
        .ok_or_else(|| format!("no {field} in {v}"))?
        .to_string())
}

/// A `files:write` of `content` (base64), timed from sending its body,
/// made beforehand, to the last byte of the answer, which is checked
/// after.
pub(crate) async fn write_file(server: &Server, sid: &str, path: &str, content: &str) -> Res<f64> {
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
pub(crate) async fn wait_ok(server: &Server, sid: &str, cid: &str) -> Res<()> {
    let w = server
        .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
        .await?;
    if w["exitCode"] != 0 {
        return Err(format!("command {cid}: {w}").into());
    }
    Ok(())
}

/// `timed` once the machine has been left alone for [`SETTLE`].
pub(crate) async fn settled<T>(timed: impl std::future::Future<Output = T>) -> T {
    tokio::time::sleep(SETTLE).await;
    timed.await
}

/// start + wait of one command that must exit 0; returns (total ms, start
/// ms).
pub(crate) async fn run_cmd(server: &Server, sid: &str, body: Value) -> Res<(f64, f64)> {
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
pub(crate) struct LogRead {
    pub(crate) data: u64,
    pub(crate) dropped: u64,
    pub(crate) exit_code: Option<i64>,
    /// From `since` to the `exit` record; `None`: the stream ended without.
    pub(crate) to_exit: Option<Duration>,
}

/// Reads a log stream to its end.
pub(crate) async fn read_logs(
    server: &Server,
    sid: &str,
    cid: &str,
    since: Instant,
) -> Res<LogRead> {
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

/// One series of `server`'s metrics (0 when absent).
pub(crate) async fn metric(server: &Server, series: &str) -> Res<f64> {
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
pub(crate) async fn link_ready(server: &Server) -> Res<()> {
    let t = Instant::now();
    while metric(server, "sandboxd_link_networks_ready").await? < 1.0 {
        if t.elapsed() > Duration::from_secs(10) {
            return Err("sandboxd made no link network ahead within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Creates a sandbox (`body`: the create request); its id.
pub(crate) async fn create_sandbox(server: &Server, body: Value) -> Res<String> {
    id_of(&server.post("/v1/sandboxes", body).await?, "sandboxId")
}

/// Creates a sandbox for `key`; (ms, id).
pub(crate) async fn timed_create(server: &Server, body: Value) -> Res<(f64, String)> {
    let t = Instant::now();
    let v = server.post("/v1/sandboxes", body).await?;
    Ok((ms(t.elapsed()), id_of(&v, "sandboxId")?))
}

/// FILE_BYTES of random bytes as base64: the content of a timed write,
/// made before the timing starts.
pub(crate) fn random_file_content() -> Res<String> {
    use base64::Engine as _;
    let mut raw = vec![0u8; FILE_BYTES];
    getrandom::fill(&mut raw)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(raw))
}
