//! What both benchmarks share: a sandboxd of their own (release build, own
//! instance) and its HTTP client, percentiles, cleanup by label, and where
//! a run's raw JSON goes, named by the commit it measured.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

pub struct Server {
    pub child: Child,
    pub base: String,
    pub client: reqwest::Client,
    /// sandboxd's own log (stderr), at its default level.
    pub log: PathBuf,
}

impl Server {
    /// Starts target/release/sandboxd as `instance`, with `config` as its
    /// configuration file if given and room for 100 sandboxes. It logs at
    /// its default level (no RUST_LOG) to a file in the temporary
    /// directory; no SANDBOXD_* variable of the caller's environment
    /// reaches it.
    pub async fn start(instance: &str, config: Option<&Path>) -> Res<Server> {
        Self::start_capped(instance, config, 100).await
    }

    /// [`Server::start`] with `max_concurrent` sandboxes (its environment
    /// variable, which wins over the file).
    pub async fn start_capped(
        instance: &str,
        config: Option<&Path>,
        max_concurrent: usize,
    ) -> Res<Server> {
        let exe = std::env::current_exe()?;
        let bin = exe
            .parent()
            .and_then(|p| p.parent())
            .map(|p| p.join("sandboxd"))
            .ok_or("cannot locate target/release/sandboxd")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::env::temp_dir().join(format!("{instance}.log"));
        let mut cmd = Command::new(bin);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SANDBOXD_") {
                cmd.env_remove(&k);
            }
        }
        cmd.env_remove("RUST_LOG")
            .env("SANDBOXD_PORT", port.to_string())
            .env("SANDBOXD_INSTANCE", instance)
            .env("SANDBOXD_MAX_CONCURRENT", max_concurrent.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log)?));
        if let Some(config) = config {
            cmd.env("SANDBOXD_CONFIG", config);
        }
        let child = cmd.spawn()?;
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(r) = server
                .client
                .get(format!("{}/v1/sandboxes", server.base))
                .send()
                .await
            {
                if r.status() == 200 {
                    return Ok(server);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "sandboxd did not become ready; log: {}",
            server.log.display()
        )
        .into())
    }

    pub async fn post(&self, path: &str, body: Value) -> Res<Value> {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await?;
        if !status.is_success() {
            return Err(format!("POST {path}: {status} {v}").into());
        }
        Ok(v)
    }

    pub async fn get(&self, path: &str) -> Res<Value> {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await?;
        if !status.is_success() {
            return Err(format!("GET {path}: {status} {v}").into());
        }
        Ok(v)
    }

    /// `method` `path` with a body prepared by the caller; the answer's
    /// bytes, read to the end, when its status is a success. Nothing is
    /// parsed here, so a caller can time the server's work alone.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
    ) -> Res<bytes::Bytes> {
        let r = self
            .client
            .request(method.clone(), format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = r.status();
        let answer = r.bytes().await?;
        if !status.is_success() {
            return Err(format!(
                "{method} {path}: {status} {}",
                String::from_utf8_lossy(&answer)
            )
            .into());
        }
        Ok(answer)
    }

    pub fn rss_kb(&self) -> u64 {
        rss_kb_of(self.child.id())
    }
}

/// VmRSS of process `pid` in kB (0 when it cannot be read).
pub fn rss_kb_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sandboxd of the bench's own, started from a configuration of its own:
/// when dropped, even by a panic, the process is killed, every engine
/// object of its instance removed and its configuration file deleted.
pub struct Instance {
    /// Dropped first: no sandboxd makes objects while they are removed.
    pub server: Server,
    _objects: InstanceObjects,
}

/// What [`Instance`] removes when dropped.
struct InstanceObjects {
    docker: bollard::Docker,
    name: String,
    config: PathBuf,
}

impl Instance {
    /// Starts sandboxd as instance `name` with `config` (TOML) as its file
    /// and room for `max_concurrent` sandboxes.
    pub async fn start(
        docker: &bollard::Docker,
        name: &str,
        config: &str,
        max_concurrent: usize,
    ) -> Res<Instance> {
        let path = std::env::temp_dir().join(format!("{name}.toml"));
        let objects = InstanceObjects {
            docker: docker.clone(),
            name: name.to_string(),
            config: path.clone(),
        };
        std::fs::write(&path, config)?;
        let server = Server::start_capped(name, Some(&path), max_concurrent).await?;
        Ok(Instance {
            server,
            _objects: objects,
        })
    }
}

impl Drop for InstanceObjects {
    fn drop(&mut self) {
        let (docker, name) = (self.docker.clone(), self.name.clone());
        // Drop may run inside the bench's runtime: the cleanup gets a
        // runtime of its own on a thread of its own.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(cleanup(&docker, &name));
            }
        })
        .join();
        let _ = std::fs::remove_file(&self.config);
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The median: the middle value, or the mean of the two middle values.
pub fn median(values: &[f64]) -> f64 {
    let mut s = values.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The sample at rank round((n - 1) * p) of the sorted samples.
pub fn pct(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    let idx = ((s.len() - 1) as f64 * p).round() as usize;
    s[idx]
}

#[path = "../tests/it/harness/cleanup.rs"]
mod cleanup;
pub use cleanup::remove_instance_objects as cleanup;

/// Where a run comes from: the commit (and whether the tree was dirty),
/// the date, the kernel and the cores.
pub fn provenance() -> serde_json::Map<String, Value> {
    let repo = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let changed = git(&["status", "--porcelain", "--untracked-files=no"]);
    let dirty = changed.as_ref().map(|c| !c.is_empty());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut meta = serde_json::Map::new();
    meta.insert("commit".into(), Value::from(commit));
    meta.insert("dirty".into(), dirty.map_or(Value::Null, Value::from));
    meta.insert(
        "changedFiles".into(),
        changed.map_or(Value::Null, |c| c.lines().map(str::to_string).collect()),
    );
    meta.insert("date".into(), Value::from(date));
    meta.insert("kernel".into(), Value::from(kernel));
    meta.insert("cores".into(), Value::from(cores()));
    meta
}

/// The machine's cores.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Where a run's raw JSON goes unless told otherwise: one file per run in
/// bench/runs/, named by its date, commit and section, so that every
/// figure the README quotes can be found with its samples.
pub fn run_file(meta: &Value, section: Option<&str>) -> PathBuf {
    let date = meta["date"]
        .as_str()
        .and_then(|d| d.get(..10))
        .unwrap_or("undated");
    let commit = meta["commit"].as_str().unwrap_or("unknown");
    let dirty = if meta["dirty"] == Value::Bool(false) {
        ""
    } else {
        "-dirty"
    };
    let section = section.map(|s| format!("-{s}")).unwrap_or_default();
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("bench/runs")
        .join(format!("{date}-{commit}{section}{dirty}.json"))
}

/// Writes a run's raw JSON to `path`, making bench/runs/ if needed.
pub fn write_run(path: &Path, run: &Value) -> Res<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(run)?)?;
    println!("JSON written to {}", path.display());
    Ok(())
}
