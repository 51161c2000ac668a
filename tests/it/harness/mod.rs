//! Test harness: `TestServer` runs the real `sandboxd` binary against the real
//! engine, on its own port and with its own instance name, so tests run in
//! parallel without seeing each other's containers. Dropping it stops the
//! process and removes every engine object labelled with its instance, even
//! when the test panicked. Each has its own state directory (the session
//! tokens' file), kept across its restarts and removed with it. Its methods are the requests the modules make
//! again and again: an offline sandbox, a command run or started, waited
//! for or read back, files written and read.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bollard::Docker;
use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::{
    InspectContainerOptions, ListContainersOptions, ListVolumesOptions,
};
use serde_json::{Value, json};

pub(crate) const INSTANCE_LABEL: &str = "sandboxd.instance";

// `pub` inside for bench/support.rs, which includes the same file.
#[allow(unreachable_pub)]
mod cleanup;
use cleanup::remove_instance_objects;
pub(crate) mod fakenet;

/// A connected engine, or a panic that says how to get one. Never a skip.
pub(crate) async fn docker() -> Docker {
    let docker = Docker::connect_with_local_defaults()
        .unwrap_or_else(|e| panic!("{}", no_engine(&e.to_string())));
    match tokio::time::timeout(Duration::from_secs(5), docker.negotiate_version()).await {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => panic!("{}", no_engine(&e.to_string())),
        Err(_) => panic!("{}", no_engine("timed out")),
    }
}

fn no_engine(why: &str) -> String {
    format!(
        "integration tests need a running Docker engine and none answered ({why}). \
         Start one with scripts/ensure-docker.sh (or run scripts/test.sh, which does it)."
    )
}

/// Runs `f` on a fresh runtime in its own thread: for cleanup from `Drop`,
/// which may run inside another runtime.
pub(crate) fn block_on_side<F: std::future::Future<Output = ()> + Send + 'static>(f: F) {
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(f);
        }
    })
    .join();
}

/// Removes an image reference (a tag, or the image when it is the last)
/// when dropped, even if the test failed.
pub(crate) struct ImageGuard(pub(crate) bollard::Docker, pub(crate) String);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        let (docker, image) = (self.0.clone(), self.1.clone());
        block_on_side(async move {
            let _ = docker
                .remove_image(
                    &image,
                    None::<bollard::query_parameters::RemoveImageOptions>,
                    None,
                )
                .await;
        });
    }
}

/// A unique instance name per test server.
pub(crate) fn unique_instance() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "sbt-{}-{}-{:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos & 0xffff
    )
}

/// Free loopback port at the time of asking.
pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// The longest any request of the harness may take: a call that hangs
/// fails with its path, well before nextest ends the test.
pub(crate) const REQUEST_BOUND: Duration = Duration::from_secs(120);
/// The longest a call that waits by design (a command run to its end, a
/// wait, a whole log stream) may take; the tests' commands end sooner.
pub(crate) const WAIT_BOUND: Duration = Duration::from_secs(200);

/// The harness's HTTP client, every request bounded by [`REQUEST_BOUND`].
pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(REQUEST_BOUND)
        .build()
        .expect("an HTTP client")
}

/// How to start a server.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServerOptions {
    pub(crate) env: Vec<(String, String)>,
    pub(crate) token: Option<String>,
    /// Do not wait for the engine at start (tests of a missing engine).
    pub(crate) no_engine: bool,
}

impl ServerOptions {
    pub(crate) fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    pub(crate) fn no_engine(mut self) -> Self {
        self.no_engine = true;
        self
    }

    pub(crate) fn token(mut self, t: &str) -> Self {
        self.token = Some(t.to_string());
        self
    }
}

/// A running sandboxd.
pub(crate) struct TestServer {
    pub(crate) base: String,
    pub(crate) instance: String,
    pub(crate) log: PathBuf,
    /// `SANDBOXD_STATE_DIR` of every start (unless the options set one).
    pub(crate) state_dir: PathBuf,
    pub(crate) docker: Docker,
    pub(crate) client: reqwest::Client,
    options: ServerOptions,
    child: Option<Child>,
}

/// The OCI runtime every test sandbox runs under, when not the engine's
/// default: scripts/test.sh runs every module that makes sandboxes a second
/// time with SANDBOXD_TEST_OCI_RUNTIME=runsc (gVisor).
pub(crate) fn oci_runtime() -> Option<String> {
    std::env::var("SANDBOXD_TEST_OCI_RUNTIME")
        .ok()
        .filter(|v| !v.is_empty())
}

/// Whether the sandboxes of this run are under gVisor.
pub(crate) fn under_gvisor() -> bool {
    oci_runtime().as_deref() == Some("runsc")
}

/// A Python client script run by a test (with `SANDBOXD_TOKEN` set): its
/// stdout read line by line, its stdin written a line at a time, its
/// stderr (tracebacks) in the test's own output. Killed when dropped.
pub(crate) struct ScriptRun {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    seen: Vec<String>,
}

impl ScriptRun {
    pub(crate) fn start(
        python: &std::path::Path,
        script: &str,
        args: &[&str],
        token: &str,
    ) -> ScriptRun {
        use tokio::io::AsyncBufReadExt;
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut child = tokio::process::Command::new(python)
            .arg(repo.join(script))
            .args(args)
            .env("SANDBOXD_TOKEN", token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("run {script}: {e}"));
        let stdin = child.stdin.take().expect("stdin");
        let lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        ScriptRun {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one starts with `prefix` (bounded); returns it.
    pub(crate) async fn until(&mut self, prefix: &str) -> String {
        let found = tokio::time::timeout(Duration::from_secs(240), async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                self.seen.push(line.clone());
                if line.starts_with(prefix) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!(
                "no line {prefix:?}; output so far:\n{}",
                self.seen.join("\n")
            ),
        }
    }

    pub(crate) async fn tell(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the script");
        self.stdin.flush().await.expect("flush to the script");
    }

    /// Waits for the end, asserts it succeeded; every line it printed.
    pub(crate) async fn finish(mut self) -> Vec<String> {
        while let Ok(Some(line)) = self.lines.next_line().await {
            self.seen.push(line);
        }
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("the script ends")
            .expect("wait");
        assert!(
            status.success(),
            "the script failed; output:\n{}",
            self.seen.join("\n")
        );
        self.seen
    }
}

/// Path of the binary under test.
pub(crate) fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_sandboxd")
}

impl TestServer {
    pub(crate) async fn start() -> TestServer {
        TestServer::start_with(ServerOptions::default()).await
    }

    pub(crate) async fn start_with(options: ServerOptions) -> TestServer {
        let docker = docker().await;
        let instance = unique_instance();
        let log = std::env::temp_dir().join(format!("{instance}.log"));
        let state_dir = std::env::temp_dir().join(format!("{instance}-state"));
        let mut server = TestServer {
            base: String::new(),
            instance,
            log,
            state_dir,
            docker,
            client: http_client(),
            options,
            child: None,
        };
        server.spawn().await;
        if !server.options.no_engine {
            server.wait_ready().await;
        }
        server
    }

    async fn spawn(&mut self) {
        // A port set in the options (a test that restarts sandboxd where
        // its clients wait) is kept; otherwise a free one is picked.
        let fixed = self
            .options
            .env
            .iter()
            .find(|(k, _)| k == "SANDBOXD_PORT")
            .and_then(|(_, v)| v.parse::<u16>().ok());
        for _attempt in 0..3 {
            let port = fixed.unwrap_or_else(free_port);
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .expect("open log file");
            let mut cmd = Command::new(binary());
            cmd.env("SANDBOXD_PORT", port.to_string())
                .env("SANDBOXD_INSTANCE", &self.instance)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log));
            if let Some(rt) = oci_runtime() {
                cmd.env("SANDBOXD_OCI_RUNTIME", rt);
            }
            // No warm pool unless a test asks for one (tests/it/pool.rs,
            // remcochat.rs): most tests count the sandboxes they make.
            cmd.env("SANDBOXD_POOL_SIZE", "0");
            // One link network made ahead, not the default's stock, unless
            // a test asks (egress.rs): each holds a spare proxy container,
            // and every test's sandboxd would make them at its start.
            cmd.env("SANDBOXD_LINKS_AHEAD", "1");
            cmd.env("SANDBOXD_STATE_DIR", &self.state_dir);
            if let Some(t) = &self.options.token {
                cmd.env("SANDBOXD_ADMIN_TOKEN", t);
            }
            for (k, v) in &self.options.env {
                cmd.env(k, v);
            }
            let mut child = cmd.spawn().expect("spawn sandboxd");
            self.base = format!("http://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    let text = std::fs::read_to_string(&self.log).unwrap_or_default();
                    if text.contains("Address already in use") {
                        break;
                    }
                    panic!("sandboxd exited early ({status}); log:\n{text}");
                }
                if self
                    .client
                    .get(format!("{}/v1/health", self.base))
                    .timeout(Duration::from_secs(3))
                    .send()
                    .await
                    .is_ok()
                {
                    self.child = Some(child);
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "sandboxd did not answer within 20 s; log: {}",
                    self.log.display()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("could not find a free port for sandboxd");
    }

    /// The sandboxd process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM, then wait for exit (bounded); returns the exit code.
    pub(crate) fn stop_process(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// SIGKILL, no chance to clean up, then start again with the same
    /// instance and options: a crash.
    pub(crate) async fn crash_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn().await;
        self.wait_ready().await;
    }

    /// Sets (or replaces) an environment variable for the next start.
    pub(crate) fn set_env(&mut self, k: &str, v: &str) {
        self.options.env.retain(|(key, _)| key != k);
        self.options.env.push((k.to_string(), v.to_string()));
    }

    /// Stops and starts the process again with the same instance and options.
    pub(crate) async fn restart(&mut self) {
        self.stop_process();
        self.spawn().await;
        self.wait_ready().await;
    }

    /// Ids of the sandboxes in the list (which, unlike a lookup, is no use
    /// of them: it does not restart their idle clock).
    pub(crate) async fn listed_sandboxes(&self) -> Vec<String> {
        let (_, v) = self.get("/v1/sandboxes").await;
        v["sandboxes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["sandboxId"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until the engine is connected and the registry rebuilt.
    pub(crate) async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, _) = self.get("/v1/sandboxes").await;
            let healthy = self.get("/v1/health").await.0 == 200;
            if healthy && status != 503 {
                return;
            }
            assert!(Instant::now() < deadline, "sandboxd never became ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.options.token {
            Some(t) => rb.header("x-sandboxd-admin-token", t),
            None => rb,
        }
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, Value) {
        self.get_within(path, REQUEST_BOUND).await
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_within(path, body, REQUEST_BOUND).await
    }

    /// `GET path`, failing with its path when no answer comes in `bound`.
    pub(crate) async fn get_within(&self, path: &str, bound: Duration) -> (u16, Value) {
        let resp = self
            .auth(self.client.get(format!("{}{path}", self.base)))
            .timeout(bound)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        into_parts(resp).await
    }

    /// `POST path`, failing with its path when no answer comes in `bound`.
    pub(crate) async fn post_within(
        &self,
        path: &str,
        body: Value,
        bound: Duration,
    ) -> (u16, Value) {
        let resp = self
            .auth(self.client.post(format!("{}{path}", self.base)))
            .timeout(bound)
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        into_parts(resp).await
    }

    /// The Prometheus text of `GET /metrics`.
    pub(crate) async fn metrics_text(&self) -> String {
        self.auth(self.client.get(format!("{}/metrics", self.base)))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// The value of one series (`name{labels}`) in the metrics; 0 when
    /// absent.
    pub(crate) async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics_text().await;
        let series = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    }

    /// Whether sandboxd reports all the link networks it keeps made ahead
    /// for the next `internet` sandboxes made, and at least one (its
    /// `sandboxd_link_networks_ready` and `_wanted` gauges).
    pub(crate) async fn link_ready(&self) -> bool {
        let text = self.metrics_text().await;
        let gauge = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        };
        match (
            gauge("sandboxd_link_networks_ready"),
            gauge("sandboxd_link_networks_wanted"),
        ) {
            (Some(ready), Some(wanted)) => wanted >= 1.0 && ready >= wanted,
            _ => false,
        }
    }

    /// Opens a command's NDJSON log stream (the answer, not yet read).
    pub(crate) async fn open_logs(&self, sid: &str, cid: &str) -> reqwest::Response {
        self.auth(self.client.get(format!(
            "{}/v1/sandboxes/{sid}/commands/{cid}/logs",
            self.base
        )))
        .send()
        .await
        .expect("logs")
    }

    /// Creates a sandbox, asserting success; returns its id.
    pub(crate) async fn create(&self, body: Value) -> String {
        let (status, v) = self.post("/v1/sandboxes", body).await;
        assert_eq!(status, 200, "create failed: {v}");
        v["sandboxId"].as_str().expect("sandboxId").to_string()
    }

    /// Creates an offline sandbox (network mode none) under a session key
    /// of its own; returns its id.
    pub(crate) async fn offline_sandbox(&self) -> String {
        self.create(json!({"sessionKey": unique_instance(), "network": {"mode": "none"}}))
            .await
    }

    /// `docker inspect` of a sandbox's container.
    pub(crate) async fn inspect(&self, sid: &str) -> ContainerInspectResponse {
        self.docker
            .inspect_container(&self.container_name(sid), None::<InspectContainerOptions>)
            .await
            .expect("inspect")
    }

    /// Runs a command to its end (`commands:run`), asserting 200; returns
    /// the answer.
    pub(crate) async fn run(&self, sid: &str, body: Value) -> Value {
        let (status, v) = self
            .post_within(
                &format!("/v1/sandboxes/{sid}/commands:run"),
                body,
                WAIT_BOUND,
            )
            .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// Runs `script` in the sandbox's login shell to its end.
    pub(crate) async fn sh(&self, sid: &str, script: &str) -> Value {
        self.run(sid, json!({"command": script})).await
    }

    /// Runs `script` in the sandbox's login shell to its end or timeout.
    pub(crate) async fn sh_with_timeout(&self, sid: &str, script: &str, timeout_ms: u64) -> Value {
        self.run(sid, json!({"command": script, "timeoutMs": timeout_ms}))
            .await
    }

    /// Starts a command, asserting 200; returns its id.
    pub(crate) async fn start_command(&self, sid: &str, body: Value) -> String {
        let (status, v) = self
            .post(&format!("/v1/sandboxes/{sid}/commands"), body)
            .await;
        assert_eq!(status, 200, "{v}");
        v["commandId"].as_str().expect("commandId").to_string()
    }

    /// Waits for a command to end, asserting 200; returns the answer.
    pub(crate) async fn wait_command(&self, sid: &str, cid: &str) -> Value {
        let (status, v) = self
            .get_within(
                &format!("/v1/sandboxes/{sid}/commands/{cid}/wait"),
                WAIT_BOUND,
            )
            .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// Reads a running command's log stream until its stdout+stderr
    /// contain `needle` (failing after `within`), and returns that output;
    /// the stream is left open no longer than that.
    pub(crate) async fn output_until(
        &self,
        sid: &str,
        cid: &str,
        needle: &str,
        within: Duration,
    ) -> String {
        use futures_util::StreamExt;
        let resp = self.open_logs(sid, cid).await;
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        let mut seen = String::new();
        let found = tokio::time::timeout(within, async {
            let mut carry = Vec::new();
            while let Some(chunk) = body.next().await {
                carry.extend_from_slice(&chunk.expect("log chunk"));
                while let Some(nl) = carry.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = carry.drain(..=nl).collect();
                    let rec: Value = serde_json::from_slice(&line).expect("NDJSON line");
                    if let Some(d) = rec["data"].as_str() {
                        seen.push_str(d);
                    }
                    if seen.contains(needle) {
                        return true;
                    }
                }
            }
            false
        })
        .await;
        assert!(
            found == Ok(true),
            "{needle:?} did not appear in the output of {cid} within {within:?}:\n{seen}"
        );
        seen
    }

    /// A command's whole NDJSON log stream, parsed; `query` is appended to
    /// the path (e.g. `?after=3`).
    pub(crate) async fn log_records(&self, sid: &str, cid: &str, query: &str) -> Vec<Value> {
        let resp = self
            .auth(self.client.get(format!(
                "{}/v1/sandboxes/{sid}/commands/{cid}/logs{query}",
                self.base
            )))
            .timeout(WAIT_BOUND)
            .send()
            .await
            .expect("logs");
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/x-ndjson")
        );
        let text = resp.text().await.expect("body");
        text.lines()
            .map(|l| serde_json::from_str(l).expect("NDJSON line"))
            .collect()
    }

    /// `files:write` of `files` (a JSON array of `{path, contentBase64,
    /// mode?}`).
    pub(crate) async fn write_files(&self, sid: &str, files: Value) -> (u16, Value) {
        self.post(
            &format!("/v1/sandboxes/{sid}/files:write"),
            json!({ "files": files }),
        )
        .await
    }

    /// `files:stat` of `paths`.
    pub(crate) async fn stat(&self, sid: &str, paths: &[&str], sha256: bool) -> (u16, Value) {
        self.post(
            &format!("/v1/sandboxes/{sid}/files:stat"),
            json!({ "paths": paths, "sha256": sha256 }),
        )
        .await
    }

    /// `files:search` with `body`.
    pub(crate) async fn search(&self, sid: &str, body: Value) -> (u16, Value) {
        self.post(&format!("/v1/sandboxes/{sid}/files:search"), body)
            .await
    }

    /// `files:read` of `path`, URL-encoded as is (no normalising).
    pub(crate) async fn read_file(&self, sid: &str, path: &str) -> (u16, Value) {
        let q = url_encode(path);
        self.get(&format!("/v1/sandboxes/{sid}/files:read?path={q}"))
            .await
    }

    /// The engine filter for this instance's objects carrying `label=value`.
    fn label_filter(&self, label: &str, value: &str) -> HashMap<String, Vec<String>> {
        HashMap::from([(
            "label".to_string(),
            vec![
                format!("{INSTANCE_LABEL}={}", self.instance),
                format!("{label}={value}"),
            ],
        )])
    }

    /// Containers of this instance carrying `label=value` (all states).
    pub(crate) async fn containers_with(
        &self,
        label: &str,
        value: &str,
    ) -> Vec<bollard::models::ContainerSummary> {
        self.docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(self.label_filter(label, value)),
                ..Default::default()
            }))
            .await
            .expect("list containers")
    }

    /// Sandbox `sid`'s containers but an untaken spare port proxy (which a
    /// stop leaves to the teardown after its answer).
    pub(crate) async fn session_containers(
        &self,
        sid: &str,
    ) -> Vec<bollard::models::ContainerSummary> {
        let mut all = self.containers_with("sandboxd.sandbox_id", sid).await;
        all.retain(|c| !c.names.iter().flatten().any(|n| n.ends_with("-port-spare")));
        all
    }

    /// The names of this instance's networks that carry `label=value`.
    pub(crate) async fn networks_with(&self, label: &str, value: &str) -> Vec<String> {
        self.docker
            .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
                filters: Some(self.label_filter(label, value)),
            }))
            .await
            .expect("list networks")
            .into_iter()
            .filter_map(|n| n.name)
            .collect()
    }

    /// Every container of this instance but the egress proxy `internet`
    /// sandboxes share (it belongs to none of them and stays; a sandbox's
    /// own egress proxy is listed) and spare port proxies (made ahead for
    /// the next sandbox, or given back by one without ports; a spare that
    /// became a port's proxy is listed).
    pub(crate) async fn containers(&self) -> Vec<bollard::models::ContainerSummary> {
        let shared = format!("/{}-egress", self.instance);
        self.containers_with(INSTANCE_LABEL, &self.instance.clone())
            .await
            .into_iter()
            .filter(|c| {
                !c.names
                    .iter()
                    .flatten()
                    .any(|n| *n == shared || n.ends_with("-port-spare"))
            })
            .collect()
    }

    /// Every workspace volume of this instance (the volume that carries
    /// the agent to all its sandboxes is not one).
    pub(crate) async fn volumes(&self) -> Vec<bollard::models::Volume> {
        self.all_volumes()
            .await
            .into_iter()
            .filter(|v| v.labels.get("sandboxd.role").map(String::as_str) != Some("agent"))
            .collect()
    }

    /// The volumes of this instance that carry the agent.
    pub(crate) async fn agent_volumes(&self) -> Vec<bollard::models::Volume> {
        self.all_volumes()
            .await
            .into_iter()
            .filter(|v| v.labels.get("sandboxd.role").map(String::as_str) == Some("agent"))
            .collect()
    }

    async fn all_volumes(&self) -> Vec<bollard::models::Volume> {
        let filter = HashMap::from([(
            "label".to_string(),
            vec![format!("{INSTANCE_LABEL}={}", self.instance)],
        )]);
        self.docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filter),
            }))
            .await
            .expect("list volumes")
            .volumes
            .unwrap_or_default()
    }

    pub(crate) fn container_name(&self, id: &str) -> String {
        format!("{}-{id}", self.instance)
    }

    /// Runs `script` in the sandbox's container directly through the engine
    /// (as the container's user), returning (exit code, stdout+stderr).
    pub(crate) async fn docker_exec(&self, id: &str, script: &str) -> (i64, String) {
        exec_in(&self.docker, &self.container_name(id), script).await
    }
}

/// `sh -c script` in a container, output and exit code.
pub(crate) async fn exec_in(docker: &Docker, container: &str, script: &str) -> (i64, String) {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    use futures_util::StreamExt;
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(vec!["sh", "-c", script]),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("create exec");
    let mut out = String::new();
    if let StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, None).await.expect("start exec")
    {
        while let Some(Ok(chunk)) = output.next().await {
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
    }
    let code = docker
        .inspect_exec(&exec.id)
        .await
        .expect("inspect exec")
        .exit_code
        .unwrap_or(-1);
    (code, out)
}

/// Standard base64 of `bytes`, as the files API wants it.
/// Lowercase hex SHA-256, as `files:read` gives it.
pub(crate) fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn b64(bytes: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Percent-encodes every byte but unreserved characters and `/`.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn into_parts(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

/// Resident memory of a process, in KiB (0 if it cannot be read).
pub(crate) fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Polls `f` until it returns true or `within` passes.
pub(crate) async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop_process();
        let docker = self.docker.clone();
        let instance = self.instance.clone();
        block_on_side(async move { remove_instance_objects(&docker, &instance).await });
        let _ = std::fs::remove_dir_all(&self.state_dir);
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        } else {
            eprintln!("sandboxd log kept at {}", self.log.display());
        }
    }
}

/// A venv under target/ (`venv`) with the pinned packages of
/// `client`/requirements.txt (a directory under clients/), made again
/// only when the file changed; its python. A missing python3 or venv
/// fails the test: the real-client tests are never skipped.
pub(crate) fn python_venv(client: &str, venv: &str) -> PathBuf {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let requirements = repo.join(client).join("requirements.txt");
    let pinned = std::fs::read_to_string(&requirements).expect("requirements.txt");
    // Tests run in processes of their own: one makes the venv, the others
    // wait for it.
    let lock = std::fs::File::create(repo.join("target").join(format!("{venv}.lock")))
        .expect("the venv's lock file");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).expect("lock the venv");
    let venv = repo.join("target").join(venv);
    let stamp = venv.join("requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(pinned.as_str()) {
        let made = Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv)
            .status()
            .expect("python3 is needed for the real-client tests");
        assert!(
            made.success(),
            "python3 -m venv failed (python3-venv is needed)"
        );
        let installed = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "-r"])
            .arg(&requirements)
            .status()
            .expect("run pip");
        assert!(
            installed.success(),
            "pip install -r {}",
            requirements.display()
        );
        std::fs::write(&stamp, &pinned).expect("stamp");
    }
    venv.join("bin/python")
}

/// Installs the npm package in `dir` (`npm ci`, from its lock file) unless
/// it has its `node_modules`: the real-client tests' clients. A missing
/// node or npm fails the test.
pub(crate) async fn npm_ci(dir: &std::path::Path) {
    if dir.join("node_modules").exists() {
        return;
    }
    let out = tokio::process::Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(dir)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run `npm ci` (node 20 and npm are needed for this test)");
    assert!(
        out.status.success(),
        "npm ci in {} failed:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
