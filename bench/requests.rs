//! What every section asks the sandboxd it measures, the same way each
//! time: create a sandbox (and run its first command), run a command to
//! its end, wait, read a log stream to its end, write a file, look up a
//! port, stop, read a metric (the pool's members and claims), and wait for
//! the machine to settle, for sandboxd's link networks made ahead or for a full
//! pool before a timed request.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{ListContainersOptions, ListNetworksOptions, ListVolumesOptions};
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

/// `server`'s metrics, as text.
async fn metrics_text(server: &Server) -> Res<String> {
    Ok(server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await?
        .text()
        .await?)
}

/// One series of `server`'s metrics (0 when absent).
pub(crate) async fn metric(server: &Server, series: &str) -> Res<f64> {
    let text = metrics_text(server).await?;
    let prefix = format!("{series} ");
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

/// Every series of the metric `name` in `text`: its labels and its value.
fn series_of(text: &str, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
    let mut out = Vec::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once("} ") {
                Some((labels, value)) => (labels, value),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            // Another metric whose name starts with `name`.
            None => continue,
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        // Label values here are names and states: no commas or quotes in them.
        let labels = labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            .collect();
        out.push((labels, value));
    }
    out
}

/// The sum of the series of `name` that carry every label of `with` (0
/// when none does): independent of the order of labels and of labels the
/// caller does not name.
fn sum_where(text: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    series_of(text, name)
        .into_iter()
        .filter(|(labels, _)| {
            with.iter()
                .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, v)| v)
        .sum()
}

/// Members ready in `server`'s pool for the `default` runtime:
/// `sandboxd_pool_members{runtime="default",state="ready"}`.
pub(crate) async fn pool_members(server: &Server) -> Res<usize> {
    let text = metrics_text(server).await?;
    let with = [("runtime", "default"), ("state", "ready")];
    Ok(sum_where(&text, "sandboxd_pool_members", &with) as usize)
}

/// Waits (polling every 10 ms, at most `limit`) until `server`'s pool holds
/// `n` ready members; returns how long that took (ms).
pub(crate) async fn pool_full(server: &Server, n: usize, limit: Duration) -> Res<f64> {
    let t = Instant::now();
    while pool_members(server).await? < n {
        if t.elapsed() > limit {
            return Err(format!("the pool did not reach {n} members in {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(ms(t.elapsed()))
}

/// `server`'s creates so far that were claims from the pool, and those that
/// were not (`sandboxd_pool_claims_total` by `outcome`, summed over any
/// other label).
pub(crate) async fn claims(server: &Server) -> Res<(f64, f64)> {
    let text = metrics_text(server).await?;
    let name = "sandboxd_pool_claims_total";
    Ok((
        sum_where(&text, name, &[("outcome", "hit")]),
        sum_where(&text, name, &[("outcome", "miss")]),
    ))
}

/// Waits (polling every 10 ms, at most 30 s) until `server` has all the
/// link networks it keeps ahead for the next `internet` sandboxes made,
/// which it does in the background after the creates that took them: a
/// create, and the floor's, is then timed with no such work of sandboxd's
/// going on.
pub(crate) async fn link_ready(server: &Server) -> Res<()> {
    let t = Instant::now();
    while metric(server, "sandboxd_link_networks_ready").await?
        < metric(server, "sandboxd_link_networks_wanted").await?
    {
        if t.elapsed() > Duration::from_secs(30) {
            return Err("sandboxd did not make its link networks ahead within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// How long nothing may change before [`quiet`] counts the machine quiet.
const QUIET_FOR: Duration = Duration::from_secs(1);

/// Waits (polling every 100 ms, at most 120 s) until `server` has its
/// link networks made ahead and neither the engine objects of `instance`
/// (containers and their states, volumes, networks) nor its pool's ready
/// members have changed for [`QUIET_FOR`]: the work a stop or a claim
/// leaves behind (a removal, a refill, a network made ahead) is done, and
/// whatever is timed next does not share the machine with it.
pub(crate) async fn quiet(server: &Server, docker: &Docker, instance: &str) -> Res<()> {
    link_ready(server).await?;
    let t = Instant::now();
    let state = || async {
        Ok::<_, Box<dyn std::error::Error>>((
            engine_objects(docker, instance).await?,
            pool_members(server).await?,
        ))
    };
    let mut last = state().await?;
    let mut since = Instant::now();
    while since.elapsed() < QUIET_FOR {
        if t.elapsed() > Duration::from_secs(120) {
            return Err(format!("{instance} did not become quiet in 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = state().await?;
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
    Ok(())
}

/// The engine objects labelled with `instance`: each container with its
/// state, each volume and each network, sorted.
async fn engine_objects(docker: &Docker, instance: &str) -> Res<Vec<String>> {
    let filters = Some(HashMap::from([(
        "label".to_string(),
        vec![format!("sandboxd.instance={instance}")],
    )]));
    let mut objects = Vec::new();
    for c in docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: filters.clone(),
            ..Default::default()
        }))
        .await?
    {
        objects.push(format!(
            "container {} {:?}",
            c.id.unwrap_or_default(),
            c.state
        ));
    }
    for v in docker
        .list_volumes(Some(ListVolumesOptions {
            filters: filters.clone(),
        }))
        .await?
        .volumes
        .unwrap_or_default()
    {
        objects.push(format!("volume {}", v.name));
    }
    for n in docker
        .list_networks(Some(ListNetworksOptions { filters }))
        .await?
    {
        objects.push(format!("network {}", n.id.unwrap_or_default()));
    }
    objects.sort();
    Ok(objects)
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

/// What a new session waits for before its first result: a create
/// (`body`), then `exec true` (start + wait) in it. The create's time, the
/// time to first command (both ms, from sending the create) and the id.
pub(crate) async fn first_command(server: &Server, body: Value) -> Res<FirstCommand> {
    let t = Instant::now();
    let (create, id) = timed_create(server, body).await?;
    run_cmd(server, &id, json!({"cmd": "true", "login": false})).await?;
    Ok(FirstCommand {
        create,
        first: ms(t.elapsed()),
        id,
    })
}

/// What [`first_command`] measured.
pub(crate) struct FirstCommand {
    pub(crate) create: f64,
    pub(crate) first: f64,
    pub(crate) id: String,
}

/// `POST …:stop` of `id`.
pub(crate) async fn stop(server: &Server, id: &str) -> Res<()> {
    server
        .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
        .await?;
    Ok(())
}

/// A `GET …/ports/3000` of sandbox `id` (made with `"ports": [3000]`),
/// timed to its answer, which must give the port's host port: the first
/// one after a create or a claim is where the publish work shows.
pub(crate) async fn port_get(server: &Server, id: &str) -> Res<f64> {
    let t = Instant::now();
    let v = server
        .get(&format!("/v1/sandboxes/{id}/ports/3000"))
        .await?;
    let took = ms(t.elapsed());
    if v["found"] != json!(true) || v["hostPort"].as_u64().is_none() {
        return Err(format!("port lookup answered {v}").into());
    }
    Ok(took)
}

/// FILE_BYTES of random bytes as base64: the content of a timed write,
/// made before the timing starts.
pub(crate) fn random_file_content() -> Res<String> {
    use base64::Engine as _;
    let mut raw = vec![0u8; FILE_BYTES];
    getrandom::fill(&mut raw)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(raw))
}
