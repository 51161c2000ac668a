//! sandboxd benchmark (`bench/run.sh`): starts its own release sandboxd
//! against the local engine and measures it, and in the same run the engine
//! floor for the same work done with direct Engine API calls, then prints a
//! table with sandboxd/floor ratios and targets, and writes JSON.
//!
//! `--profile` also prints where the time of each sandboxd operation goes.
//! Not part of `cargo test`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{
    CreateContainerOptions, RemoveContainerOptions, RemoveVolumeOptions,
};
use futures_util::StreamExt;
use sandboxd::engine::{SandboxContainer, sandbox_container_body};

#[path = "support.rs"]
mod support;
use serde_json::{Value, json};
use support::{Res, Server, cleanup, ms, pct};

const LOG_BYTES: u64 = 64 * 1024 * 1024;
const FILE_BYTES: usize = 4 * 1024 * 1024;
const FLOOD_BYTES: u64 = 1024 * 1024 * 1024;

/// The engine floor: the same work through direct Engine API calls.
struct Floor {
    docker: Docker,
    instance: String,
    network: String,
}

impl Floor {
    fn spec(&self, name: &str) -> SandboxContainer {
        SandboxContainer {
            name: name.to_string(),
            image: "sandboxd-runtime:latest".into(),
            oci_runtime: None,
            user: "1000:1000".into(),
            workspace_dir: "/workspace".into(),
            workspace_aliases: vec!["/vercel/sandbox/workspace".into()],
            workspace_nocopy: false,
            // The same mounts as a sandbox; the floor's process is `sleep`.
            agent_volume: format!("{}-floor-agent", self.instance),
            agent_dir: "/.sandboxd".into(),
            command: vec!["sleep".into(), "infinity".into()],
            volume: format!("{name}-workspace"),
            network: Some(self.network.clone()),
            vcpus: 1,
            memory_mb: 1024,
            pids_limit: 512,
            tmp_size_mb: 512,
            file_size_limit_mb: 1024,
            labels: HashMap::from([("sandboxd.instance".to_string(), self.instance.clone())]),
        }
    }

    /// volume + container create + start; returns the time.
    async fn create(&self, name: &str) -> Res<Duration> {
        let spec = self.spec(name);
        let t = Instant::now();
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(spec.volume.clone()),
                labels: Some(spec.labels.clone()),
                ..Default::default()
            })
            .await?;
        self.docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.to_string()),
                    platform: String::new(),
                }),
                sandbox_container_body(&spec, false),
            )
            .await?;
        self.docker
            .start_container(
                name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await?;
        Ok(t.elapsed())
    }

    /// container + volume removal.
    async fn remove(&self, name: &str) -> Res<Duration> {
        let t = Instant::now();
        self.docker
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await?;
        self.docker
            .remove_volume(
                &format!("{name}-workspace"),
                Some(RemoveVolumeOptions { force: true }),
            )
            .await?;
        Ok(t.elapsed())
    }

    /// exec create/start (attached, read to the end)/inspect; returns the
    /// time and the bytes read.
    async fn exec(&self, container: &str, cmd: &[&str]) -> Res<(Duration, u64)> {
        let t = Instant::now();
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(cmd.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await?;
        let mut bytes = 0u64;
        if let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(256 * 1024),
                }),
            )
            .await?
        {
            while let Some(chunk) = output.next().await {
                bytes += chunk?.into_bytes().len() as u64;
            }
        }
        self.docker.inspect_exec(&exec.id).await?;
        Ok((t.elapsed(), bytes))
    }
}

#[derive(Default)]
struct Report {
    rows: Vec<(String, f64, Option<f64>, String, bool)>,
    json: BTreeMap<String, Value>,
}

impl Report {
    fn row(&mut self, name: &str, value: f64, floor: Option<f64>, target: &str, ok: bool) {
        self.rows
            .push((name.to_string(), value, floor, target.to_string(), ok));
    }
}

async fn run(profile: bool, json_out: Option<String>) -> Res<()> {
    let docker = Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await?;
    let instance = format!("bench-{}", std::process::id());
    let server = Server::start(&instance).await?;
    let floor = Floor {
        docker: docker.clone(),
        instance: instance.clone(),
        network: format!("{instance}-net"),
    };
    let mut report = Report::default();
    let result = measure(&server, &floor, &mut report, profile).await;
    cleanup(&docker, &instance).await;
    result?;

    println!(
        "\nsandboxd benchmark ({} cores, engine {})",
        num_cpus(),
        docker.version().await?.version.unwrap_or_default()
    );
    println!(
        "{:<34} {:>12} {:>12} {:>8}  {:<22}",
        "measure", "sandboxd", "floor", "ratio", "target"
    );
    for (name, v, f, target, ok) in &report.rows {
        let (fs, rs) = match f {
            Some(f) => (format!("{f:.1}"), format!("{:.2}", v / f)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{name:<34} {v:>12.1} {fs:>12} {rs:>8}  {target:<22} {}",
            if *ok { "ok" } else { "MISS" }
        );
    }
    let json = serde_json::to_string_pretty(&report.json)?;
    if let Some(path) = json_out {
        std::fs::write(&path, &json)?;
        println!("\nJSON written to {path}");
    } else {
        println!("\n{json}");
    }
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

async fn measure(server: &Server, floor: &Floor, report: &mut Report, profile: bool) -> Res<()> {
    let idle_rss = server.rss_kb();

    // Warm up: network, image caches.
    let warm = server
        .post("/v1/sandboxes", json!({"sessionKey": "warm"}))
        .await?;
    let warm_id = warm["sandboxId"].as_str().ok_or("id")?.to_string();
    floor
        .create(&format!("{}-floorwarm", floor.instance))
        .await?;
    floor
        .remove(&format!("{}-floorwarm", floor.instance))
        .await?;

    // Create (cold), reconnect, stop — and their floors, interleaved.
    let (mut create, mut reconnect, mut stop, mut fcreate, mut fremove) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..10 {
        let t = Instant::now();
        let v = server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": format!("create-{i}")}),
            )
            .await?;
        create.push(ms(t.elapsed()));
        let id = v["sandboxId"].as_str().ok_or("id")?.to_string();
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
        let name = format!("{}-floor{i}", floor.instance);
        fcreate.push(ms(floor.create(&name).await?));
        fremove.push(ms(floor.remove(&name).await?));
    }
    let (c50, fc50) = (pct(&create, 0.5), pct(&fcreate, 0.5));
    report.row(
        "create p50 (ms)",
        c50,
        Some(fc50),
        "<= 1.15x floor",
        c50 <= fc50 * 1.15,
    );
    report.row(
        "create p95 (ms)",
        pct(&create, 0.95),
        Some(pct(&fcreate, 0.95)),
        "",
        true,
    );
    report.row("reconnect p50 (ms)", pct(&reconnect, 0.5), None, "", true);
    report.row(
        "stop p50 (ms)",
        pct(&stop, 0.5),
        Some(pct(&fremove, 0.5)),
        "",
        true,
    );

    // Exec round trip of `true`.
    let sid = warm_id.as_str();
    let container = format!("{}-{sid}", floor.instance);
    let (mut exec, mut exec_login, mut fexec, mut start_part) = (vec![], vec![], vec![], vec![]);
    for _ in 0..5 {
        run_true(server, sid, json!({"cmd": "true", "login": false})).await?;
        floor.exec(&container, &["true"]).await?;
    }
    for _ in 0..40 {
        let (total, start) = run_true(server, sid, json!({"cmd": "true", "login": false})).await?;
        exec.push(total);
        start_part.push(start);
        exec_login.push(
            run_true(server, sid, json!({"cmd": "bash", "args": ["-lc", "true"]}))
                .await?
                .0,
        );
        fexec.push(ms(floor.exec(&container, &["true"]).await?.0));
    }
    let (e50, fe50) = (pct(&exec, 0.5), pct(&fexec, 0.5));
    report.row(
        "exec true p50 (ms)",
        e50,
        Some(fe50),
        "<= 1.15x floor",
        e50 <= fe50 * 1.15,
    );
    report.row(
        "exec true p95 (ms)",
        pct(&exec, 0.95),
        Some(pct(&fexec, 0.95)),
        "",
        true,
    );
    report.row(
        "exec bash -lc true p50 (ms)",
        pct(&exec_login, 0.5),
        Some(fe50),
        "",
        true,
    );
    if profile {
        println!(
            "profile: exec = start (POST …/commands) {:.1} ms + wait {:.1} ms (p50)",
            pct(&start_part, 0.5),
            e50 - pct(&start_part, 0.5)
        );
    }

    // Log stream throughput: 64 MB of base64 text through /logs.
    let generator = format!(
        "head -c {} /dev/urandom | base64 -w 76 | head -c {LOG_BYTES}",
        LOG_BYTES * 3 / 4 + 4096
    );
    let (mut thr, mut fthr) = (vec![], vec![]);
    for _ in 0..3 {
        let v = server
            .post(
                &format!("/v1/sandboxes/{sid}/commands"),
                json!({"command": generator, "timeoutMs": 120000}),
            )
            .await?;
        let cid = v["commandId"].as_str().ok_or("cid")?.to_string();
        let t = Instant::now();
        let (data, dropped) = read_logs(server, sid, &cid).await?;
        let secs = t.elapsed().as_secs_f64();
        if data + dropped != LOG_BYTES || dropped > 0 {
            println!("note: log stream read {data} bytes, {dropped} dropped");
        }
        thr.push(data as f64 / secs / 1e6);
        let (d, bytes) = floor.exec(&container, &["bash", "-c", &generator]).await?;
        fthr.push(bytes as f64 / d.as_secs_f64() / 1e6);
    }
    let (t50, ft50) = (pct(&thr, 0.5), pct(&fthr, 0.5));
    report.row(
        "log stream (MB/s)",
        t50,
        Some(ft50),
        ">= 0.8x raw stream",
        t50 >= ft50 * 0.8,
    );

    // Files: 4 MiB write and read.
    let content = {
        use base64::Engine as _;
        let mut raw = vec![0u8; FILE_BYTES];
        getrandom::fill(&mut raw)?;
        base64::engine::general_purpose::STANDARD.encode(raw)
    };
    let (mut wr, mut rd) = (vec![], vec![]);
    for i in 0..10 {
        let t = Instant::now();
        server
            .post(
                &format!("/v1/sandboxes/{sid}/files:write"),
                json!({"files": [{"path": format!("bench/f{i}.bin"), "contentBase64": content}]}),
            )
            .await?;
        wr.push(ms(t.elapsed()));
        let t = Instant::now();
        let v = server
            .get(&format!(
                "/v1/sandboxes/{sid}/files:read?path=bench/f{i}.bin"
            ))
            .await?;
        rd.push(ms(t.elapsed()));
        if v["contentBase64"].as_str().map(str::len) != Some(content.len()) {
            return Err("file read back differs".into());
        }
    }
    let (w50, r50) = (pct(&wr, 0.5), pct(&rd, 0.5));
    report.row(
        "file write 4 MiB p50 (ms)",
        w50,
        None,
        "<= 40 ms",
        w50 <= 40.0,
    );
    report.row(
        "file read 4 MiB p50 (ms)",
        r50,
        None,
        "<= 40 ms",
        r50 <= 40.0,
    );

    // Port publish: the first GET of a port, on a sandbox created 1 s
    // earlier (a session writes files and starts its server before it asks
    // for a URL), and, for comparison, right after the create.
    let (mut publish, mut publish_now) = (vec![], vec![]);
    for i in 0..5 {
        for (wait, out) in [(true, &mut publish), (false, &mut publish_now)] {
            let key = format!("port-{wait}-{i}");
            let v = server
                .post("/v1/sandboxes", json!({"sessionKey": key, "ports": [3000]}))
                .await?;
            let id = v["sandboxId"].as_str().ok_or("id")?.to_string();
            if wait {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let t = Instant::now();
            server
                .get(&format!("/v1/sandboxes/{id}/ports/3000"))
                .await?;
            out.push(ms(t.elapsed()));
            server
                .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
                .await?;
        }
    }
    let p50 = pct(&publish, 0.5);
    report.row(
        "port publish p50 (ms)",
        p50,
        None,
        "<= 250 ms",
        p50 <= 250.0,
    );
    report.row(
        "port publish at create p50 (ms)",
        pct(&publish_now, 0.5),
        None,
        "",
        true,
    );

    // Memory.
    let after_rss = server.rss_kb();
    let v = server
        .post(&format!("/v1/sandboxes/{sid}/commands"), json!({"command": format!("head -c {FLOOD_BYTES} /dev/zero | tr '\\0' x"), "timeoutMs": 600000}))
        .await?;
    let cid = v["commandId"].as_str().ok_or("cid")?.to_string();
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
    let growth_mb = peak.saturating_sub(before_flood) as f64 / 1024.0;
    report.row(
        "idle RSS (MB)",
        idle_rss as f64 / 1024.0,
        None,
        "<= 20 MB",
        idle_rss as f64 / 1024.0 <= 20.0,
    );
    report.row(
        "RSS after the run (MB)",
        after_rss as f64 / 1024.0,
        None,
        "",
        true,
    );
    report.row(
        "RSS growth, 1 GB unread (MB)",
        growth_mb,
        None,
        "< 64 MB",
        growth_mb < 64.0,
    );
    report.row(
        "1 GB unread drained (MB/s)",
        FLOOD_BYTES as f64 / flood_secs / 1e6,
        None,
        "",
        true,
    );

    for (name, v, f, _, ok) in &report.rows {
        report
            .json
            .insert(name.clone(), json!({"value": v, "floor": f, "ok": ok}));
    }
    Ok(())
}

/// start + wait of one command; returns (total ms, start ms).
async fn run_true(server: &Server, sid: &str, body: Value) -> Res<(f64, f64)> {
    let t = Instant::now();
    let v = server
        .post(&format!("/v1/sandboxes/{sid}/commands"), body)
        .await?;
    let start = ms(t.elapsed());
    let cid = v["commandId"].as_str().ok_or("cid")?;
    let w = server
        .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
        .await?;
    if w["exitCode"] != 0 {
        return Err(format!("exit {w}").into());
    }
    Ok((ms(t.elapsed()), start))
}

/// Reads a log stream to its end: (data bytes, dropped bytes).
async fn read_logs(server: &Server, sid: &str, cid: &str) -> Res<(u64, u64)> {
    let resp = server
        .client
        .get(format!(
            "{}/v1/sandboxes/{sid}/commands/{cid}/logs",
            server.base
        ))
        .send()
        .await?;
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let (mut data, mut dropped) = (0u64, 0u64);
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk?);
        let mut start = 0;
        while let Some(i) = buf[start..].iter().position(|b| *b == b'\n') {
            let line: Value = serde_json::from_slice(&buf[start..start + i])?;
            start += i + 1;
            match line["stream"].as_str() {
                Some("stdout") | Some("stderr") => {
                    data += line["data"].as_str().map(str::len).unwrap_or(0) as u64
                }
                Some("dropped") => dropped += line["bytes"].as_u64().unwrap_or(0),
                _ => {}
            }
        }
        buf.drain(..start);
    }
    Ok((data, dropped))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let profile = args.iter().any(|a| a == "--profile");
    let json_out = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned());
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(profile, json_out)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
