//! sandboxd under load (`bench/load.sh [--seconds N]`): its own release
//! sandboxd, 20 sandboxes, 50 concurrent clients for 60 s mixing reconnects,
//! commands read through their log streams, file writes and reads, port
//! lookups and command lists. Reports throughput, p50/p99 latency per route,
//! the count of 5xx answers (must be 0), of log streams cut before their
//! `exit` record and of commands that did not exit 0 (both must be 0), and
//! sandboxd's peak RSS.
//! Not part of `cargo test`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bollard::Docker;
use futures_util::StreamExt;
use serde_json::json;

#[path = "support.rs"]
mod support;
use support::{Res, Server, cleanup, ms, pct};

const SANDBOXES: usize = 20;
const CLIENTS: usize = 50;

const LOGS: &str = "GET …/logs (start to exit record)";

#[derive(Default)]
struct Tally {
    latencies: BTreeMap<&'static str, Vec<f64>>,
    server_errors: BTreeMap<&'static str, usize>,
    client_errors: BTreeMap<&'static str, usize>,
    /// Log streams (answered 200) that ended before their `exit` record:
    /// cut short, an error.
    cut_streams: usize,
    /// Log streams whose `exit` record gave an exit code other than 0
    /// (`echo load; seq 1 200` exits 0): an error.
    bad_exits: usize,
}

/// How a log stream ended.
enum StreamEnd {
    /// Not a 200 answer (599: the request failed).
    Status(u16),
    /// Its `exit` record came, with this exit code.
    Exit(Option<i64>),
    /// It ended (or broke, or sent a line that is not JSON) before its
    /// `exit` record.
    Cut,
}

/// Reads a command's log stream until its `exit` record.
async fn read_to_exit(server: &Server, sid: &str, cid: &str) -> StreamEnd {
    let r = match server
        .client
        .get(format!(
            "{}/v1/sandboxes/{sid}/commands/{cid}/logs",
            server.base
        ))
        .send()
        .await
    {
        Ok(r) => r,
        Err(_) => return StreamEnd::Status(599),
    };
    if r.status() != 200 {
        return StreamEnd::Status(r.status().as_u16());
    }
    let mut body = r.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut exit = None;
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else {
            return exit.map_or(StreamEnd::Cut, StreamEnd::Exit);
        };
        buf.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(i) = buf[start..].iter().position(|b| *b == b'\n') {
            let Ok(line) = serde_json::from_slice::<serde_json::Value>(&buf[start..start + i])
            else {
                return StreamEnd::Cut;
            };
            start += i + 1;
            // The stream ends after it (read on to its end, so the
            // connection is reused).
            if line["stream"] == "exit" && exit.is_none() {
                exit = Some(line["exitCode"].as_i64());
            }
        }
        buf.drain(..start);
    }
    exit.map_or(StreamEnd::Cut, StreamEnd::Exit)
}

impl Tally {
    fn record(&mut self, route: &'static str, status: u16, took: Duration) {
        self.latencies.entry(route).or_default().push(ms(took));
        if status >= 500 {
            *self.server_errors.entry(route).or_default() += 1;
        } else if status >= 400 {
            *self.client_errors.entry(route).or_default() += 1;
        }
    }
}

/// Sends a request and times it: (status, JSON body, time); 599 when the
/// request itself failed.
async fn timed(rb: reqwest::RequestBuilder) -> (u16, serde_json::Value, Duration) {
    let t = Instant::now();
    match rb.send().await {
        Ok(r) => {
            let s = r.status().as_u16();
            let v = r.json().await.unwrap_or(serde_json::Value::Null);
            (s, v, t.elapsed())
        }
        Err(_) => (599, serde_json::Value::Null, t.elapsed()),
    }
}

async fn timed_post(
    server: &Server,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value, Duration) {
    timed(
        server
            .client
            .post(format!("{}{path}", server.base))
            .json(&body),
    )
    .await
}

async fn timed_get(server: &Server, path: &str) -> (u16, serde_json::Value, Duration) {
    timed(server.client.get(format!("{}{path}", server.base))).await
}

async fn client(
    server: Arc<Server>,
    ids: Arc<Vec<String>>,
    n: usize,
    until: Instant,
    tally: Arc<Mutex<Tally>>,
) {
    let content = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; 16 * 1024]);
    let mut i = n;
    while Instant::now() < until {
        i += 1;
        let slot = (n * 7 + i) % SANDBOXES;
        let sid = &ids[slot];
        let (route, status, took) = match i % 5 {
            0 => {
                let (s, _, d) = timed_post(
                    &server,
                    "/v1/sandboxes",
                    json!({"sessionKey": format!("load-{slot}"), "ports": [3000]}),
                )
                .await;
                ("POST /v1/sandboxes (reconnect)", s, d)
            }
            1 => {
                let (s, v, d) = timed_post(
                    &server,
                    &format!("/v1/sandboxes/{sid}/commands"),
                    json!({"command": "echo load; seq 1 200"}),
                )
                .await;
                let mut total = d;
                if let Some(cid) = v["commandId"].as_str() {
                    let t = Instant::now();
                    let end = read_to_exit(&server, sid, cid).await;
                    total += t.elapsed();
                    if let Ok(mut t) = tally.lock() {
                        match end {
                            StreamEnd::Status(code) => t.record(LOGS, code, total),
                            StreamEnd::Exit(code) => {
                                t.record(LOGS, 200, total);
                                if code != Some(0) {
                                    t.bad_exits += 1;
                                }
                            }
                            StreamEnd::Cut => {
                                t.record(LOGS, 200, total);
                                t.cut_streams += 1;
                            }
                        }
                    }
                }
                ("POST …/commands", s, d)
            }
            2 => {
                let (s, _, d) = timed_post(
                    &server,
                    &format!("/v1/sandboxes/{sid}/files:write"),
                    json!({"files": [{"path": format!("load/{n}.bin"), "contentBase64": content}]}),
                )
                .await;
                ("POST …/files:write (16 KiB)", s, d)
            }
            3 => {
                let (s, _, d) = timed_get(
                    &server,
                    &format!("/v1/sandboxes/{sid}/files:read?path=load/{n}.bin"),
                )
                .await;
                ("GET …/files:read", s, d)
            }
            _ => {
                if i % 2 == 0 {
                    let (s, _, d) =
                        timed_get(&server, &format!("/v1/sandboxes/{sid}/ports/3000")).await;
                    ("GET …/ports/3000", s, d)
                } else {
                    let (s, _, d) =
                        timed_get(&server, &format!("/v1/sandboxes/{sid}/commands")).await;
                    ("GET …/commands", s, d)
                }
            }
        };
        if let Ok(mut t) = tally.lock() {
            t.record(route, status, took);
        }
    }
}

async fn run(seconds: u64) -> Res<()> {
    let docker = Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await?;
    let instance = format!("load-{}", std::process::id());
    let server = Arc::new(Server::start(&instance, None).await?);
    println!("sandboxd log: {}", server.log.display());
    let result = drive(&server, seconds).await;
    cleanup(&docker, &instance).await;
    result
}

async fn drive(server: &Arc<Server>, seconds: u64) -> Res<()> {
    let mut ids = Vec::new();
    let t = Instant::now();
    for i in 0..SANDBOXES {
        let v = server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": format!("load-{i}"), "ports": [3000]}),
            )
            .await?;
        ids.push(v["sandboxId"].as_str().ok_or("id")?.to_string());
    }
    println!(
        "created {SANDBOXES} sandboxes in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let ids = Arc::new(ids);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let until = Instant::now() + Duration::from_secs(seconds);
    let peak = Arc::new(Mutex::new(server.rss_kb()));
    let sampler = {
        let server = Arc::clone(server);
        let peak = Arc::clone(&peak);
        tokio::spawn(async move {
            while Instant::now() < until {
                if let Ok(mut p) = peak.lock() {
                    *p = (*p).max(server.rss_kb());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| {
            tokio::spawn(client(
                Arc::clone(server),
                Arc::clone(&ids),
                n,
                until,
                Arc::clone(&tally),
            ))
        })
        .collect();
    for c in clients {
        c.await?;
    }
    sampler.await?;
    let elapsed = started.elapsed().as_secs_f64();
    let tally = tally.lock().map_err(|_| "tally poisoned")?;
    let total: usize = tally.latencies.values().map(Vec::len).sum();
    let server_errors: usize = tally.server_errors.values().sum();
    let (cut, bad_exits) = (tally.cut_streams, tally.bad_exits);
    println!(
        "\n{CLIENTS} clients, {SANDBOXES} sandboxes, {elapsed:.0} s: {total} requests, {:.1} req/s, 5xx: {server_errors}, log streams cut before their exit record: {cut}, exit code not 0: {bad_exits}, peak RSS {:.1} MB",
        total as f64 / elapsed,
        *peak.lock().map_err(|_| "peak poisoned")? as f64 / 1024.0
    );
    println!(
        "{:<34} {:>7} {:>10} {:>10} {:>6} {:>6}",
        "route", "count", "p50 ms", "p99 ms", "4xx", "5xx"
    );
    for (route, lat) in &tally.latencies {
        println!(
            "{route:<34} {:>7} {:>10.1} {:>10.1} {:>6} {:>6}",
            lat.len(),
            pct(lat, 0.5),
            pct(lat, 0.99),
            tally.client_errors.get(route).copied().unwrap_or(0),
            tally.server_errors.get(route).copied().unwrap_or(0)
        );
    }
    let peak_mb = *peak.lock().map_err(|_| "peak poisoned")? as f64 / 1024.0;
    let routes: serde_json::Map<String, serde_json::Value> = tally
        .latencies
        .iter()
        .map(|(route, lat)| {
            let row = json!({
                "count": lat.len(),
                "p50Ms": pct(lat, 0.5),
                "p99Ms": pct(lat, 0.99),
                "4xx": tally.client_errors.get(route).copied().unwrap_or(0),
                "5xx": tally.server_errors.get(route).copied().unwrap_or(0),
            });
            (route.to_string(), row)
        })
        .collect();
    let mut meta = support::provenance();
    meta.insert("clients".into(), json!(CLIENTS));
    meta.insert("sandboxes".into(), json!(SANDBOXES));
    meta.insert("seconds".into(), json!(elapsed));
    let meta = serde_json::Value::Object(meta);
    let out = json!({
        "meta": meta,
        "requests": total,
        "requestsPerSecond": total as f64 / elapsed,
        "serverErrors": server_errors,
        "cutStreams": cut,
        "badExits": bad_exits,
        "peakRssMb": peak_mb,
        "routes": routes,
    });
    support::write_run(&support::run_file(&meta, Some("load")), &out)?;
    let mut errors = Vec::new();
    if server_errors > 0 {
        errors.push(format!("{server_errors} answers were 5xx"));
    }
    if cut > 0 {
        errors.push(format!("{cut} log streams ended before their exit record"));
    }
    if bad_exits > 0 {
        errors.push(format!("{bad_exits} commands exited other than 0"));
    }
    if !errors.is_empty() {
        return Err(errors.join("; ").into());
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("load: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(seconds)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
