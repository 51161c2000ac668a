//! The engine: the only code that talks to Docker (through bollard). The
//! domain asks for volumes, containers and networks in its own words
//! ([`SandboxContainer`], [`ContainerRecord`]) and gets [`EngineError`]s back;
//! no bollard type leaves this module. A second backend (rootless Podman,
//! Kubernetes) would be another file beside `discovery.rs` behind the same
//! methods.

mod archive;
mod container;
pub(crate) mod discovery;
mod exec;
mod image;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{
    Ipam, IpamConfig, NetworkConnectRequest, NetworkCreateRequest, VolumeCreateRequest,
};
use bollard::query_parameters::{
    EventsOptions, InspectContainerOptions, ListContainersOptions, ListNetworksOptions,
    ListVolumesOptions, LogsOptionsBuilder, RemoveContainerOptions, RemoveVolumeOptions,
    RestartContainerOptions, StartContainerOptions,
};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::unix_seconds;

pub use archive::Entry;
pub use container::{EgressContainer, ProxyContainer, SandboxContainer, sandbox_container_body};
use discovery::DiscoveryInputs;
pub use exec::{ExecOutput, ExecRequest, ExecSession, OutputStream};

/// Where a volume is mounted in a container made only to read or fill it.
const VOLUME_USER_DIR: &str = "/volume";

/// How long an engine call that should be instant may take before we call
/// the engine unavailable. Health must never hang.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an `oom` event may come after its container's exit (it
/// came 36 ms after the exit when it was late on this machine).
const LATE_OOM_EVENT: Duration = Duration::from_secs(1);

/// How long a started proxy may take to listen (it takes milliseconds).
const PROXY_START: Duration = Duration::from_secs(10);

/// What went wrong talking to the engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// No engine is connected, or it did not answer.
    #[error("the container engine is not available: {0}")]
    Unavailable(String),
    /// The object does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The object is in a state that refuses the call (e.g. not running).
    #[error("{0}")]
    Conflict(String),
    /// The engine cannot limit a volume's size on this host (its volume
    /// root has no project quotas).
    #[error("{0}")]
    VolumeSizeUnsupported(String),
    /// Anything else the engine refused.
    #[error("the container engine failed: {0}")]
    Failed(String),
}

impl From<BollardError> for EngineError {
    fn from(e: BollardError) -> Self {
        let err = Self::classify(e);
        crate::telemetry::engine_error(match &err {
            EngineError::Unavailable(_) => "unavailable",
            EngineError::NotFound(_) => "not_found",
            EngineError::Conflict(_) => "conflict",
            EngineError::VolumeSizeUnsupported(_) => "unsupported",
            EngineError::Failed(_) => "failed",
        });
        err
    }
}

impl EngineError {
    fn classify(e: BollardError) -> Self {
        match e {
            BollardError::DockerResponseServerError {
                status_code,
                message,
            } => match status_code {
                404 => EngineError::NotFound(message),
                409 => EngineError::Conflict(message),
                _ => EngineError::Failed(format!("{status_code}: {message}")),
            },
            BollardError::RequestTimeoutError
            | BollardError::IOError { .. }
            | BollardError::HyperResponseError { .. }
            | BollardError::HyperLegacyError { .. }
            | BollardError::SocketNotFoundError(_) => EngineError::Unavailable(e.to_string()),
            other => EngineError::Failed(other.to_string()),
        }
    }
}

/// Result of engine calls.
pub type EngineResult<T> = Result<T, EngineError>;

/// A container as listed: enough to adopt or clean it up.
#[derive(Debug, Clone)]
pub struct ContainerRecord {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub running: bool,
    /// (container port, host port) of published TCP ports.
    pub published: Vec<(u16, u16)>,
}

/// A container's state as far as the domain cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    pub running: bool,
    /// The engine's flag that the kernel's OOM killer acted in its last
    /// life. It can miss (see [`Engine::stopped_by_memory`]).
    pub oom_killed: bool,
    /// The exit code of its last life (0 while it runs).
    pub exit_code: i64,
    /// When its last life started, as the engine wrote it (RFC 3339).
    pub started_at: String,
    pub labels: HashMap<String, String>,
    /// The id of the image it was made from.
    pub image_id: String,
}

/// One line of a container's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When the engine logged it, as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnn`:
    /// later lines sort after earlier ones.
    pub at: String,
    pub text: String,
}

impl LogLine {
    /// A line as the engine sends it with time stamps: RFC 3339 with up
    /// to nine fraction digits (trailing zeros dropped), in UTC, a space,
    /// the text. The fraction is padded so stamps compare as strings.
    fn parse(line: &str) -> Option<LogLine> {
        let (stamp, text) = line.split_once(' ')?;
        let stamp = stamp.strip_suffix('Z')?;
        let (seconds, fraction) = stamp.split_once('.').unwrap_or((stamp, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if seconds.len() != 19 || fraction.len() > 9 || !digits(fraction) {
            return None;
        }
        Some(LogLine {
            at: format!("{seconds}.{fraction:0<9}"),
            text: text.to_string(),
        })
    }
}

/// A network as listed.
#[derive(Debug, Clone)]
pub struct NetworkRecord {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub subnets: Vec<String>,
}

/// A volume as listed.
#[derive(Debug, Clone)]
pub struct VolumeRecord {
    pub name: String,
    pub labels: HashMap<String, String>,
}

/// Handle to the engine; cheap to clone. Starts disconnected; a connector
/// task (see [`Engine::run_connector`]) fills it in once an engine answers.
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    docker: RwLock<Option<Docker>>,
    last_error: RwLock<String>,
    /// OCI runtime name -> whether it is gVisor's runsc, as the engine
    /// registered it (asked once per name).
    gvisor_runtimes: RwLock<HashMap<String, bool>>,
    connected: watch::Sender<bool>,
    /// Engine calls that make something, run to their end (see
    /// [`Engine::making`]).
    making: TaskTracker,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    /// A handle with no engine yet.
    pub fn new() -> Self {
        Engine {
            inner: Arc::new(Inner {
                docker: RwLock::new(None),
                last_error: RwLock::new("not connected yet".into()),
                gvisor_runtimes: RwLock::new(HashMap::new()),
                connected: watch::channel(false).0,
                making: TaskTracker::new(),
            }),
        }
    }

    /// Discovers the socket and connects, retrying every second until an
    /// engine answers or `shutdown` fires. Returns once connected.
    pub async fn run_connector(
        &self,
        configured_socket: Option<String>,
        shutdown: CancellationToken,
    ) {
        let inputs = DiscoveryInputs::from_env(configured_socket);
        let status = |r: Result<&Docker, &str>| {
            if let Err(e) = r {
                if let Ok(mut last) = self.inner.last_error.write() {
                    *last = e.to_string();
                }
            }
        };
        if let Some((docker, choice)) =
            discovery::connect_until_ready(inputs, shutdown, status).await
        {
            let api = docker.client_version();
            tracing::info!(
                socket = %choice.path.display(),
                why = %choice.reason,
                api_version = %api,
                "connected to the container engine"
            );
            if let Ok(mut slot) = self.inner.docker.write() {
                *slot = Some(docker);
            }
            self.inner.connected.send_replace(true);
        }
    }

    /// True once an engine has answered.
    pub fn is_connected(&self) -> bool {
        *self.inner.connected.borrow()
    }

    /// Resolves once an engine has answered (or never, if none does).
    pub async fn connected(&self) {
        let mut rx = self.inner.connected.subscribe();
        // An Err means the sender is gone, which cannot happen while we hold it.
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Runs an engine call that makes something (a network, a volume, a
    /// container) to its end, even when its caller stops waiting (a
    /// background task cancelled at shutdown): the engine carries out a
    /// request it has received whether or not its client is still there,
    /// so an abandoned one would make its object after sandboxd exited,
    /// where neither the next start nor a cleanup by label that already
    /// ran sees it. [`Engine::finish_making`] waits for these.
    async fn making<T: Send + 'static>(
        &self,
        call: impl Future<Output = Result<T, BollardError>> + Send + 'static,
    ) -> EngineResult<T> {
        match self.inner.making.spawn(call).await {
            Ok(done) => done.map_err(EngineError::from),
            Err(e) => Err(EngineError::Failed(format!(
                "an engine call ended early: {e}"
            ))),
        }
    }

    /// Waits until the engine calls under way that make something (see
    /// [`Engine::making`]) have ended, for at most `within`; at shutdown,
    /// after the tasks that start them have stopped.
    pub async fn finish_making(&self, within: Duration) {
        self.inner.making.close();
        let pending = self.inner.making.len();
        if tokio::time::timeout(within, self.inner.making.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                pending,
                "engine calls that make something were still under way at shutdown"
            );
        }
    }

    fn docker(&self) -> EngineResult<Docker> {
        let slot = self
            .inner
            .docker
            .read()
            .map_err(|_| EngineError::Unavailable("engine handle poisoned".into()))?;
        match slot.as_ref() {
            Some(d) => Ok(d.clone()),
            None => {
                let why = self
                    .inner
                    .last_error
                    .read()
                    .map(|e| e.clone())
                    .unwrap_or_default();
                Err(EngineError::Unavailable(why))
            }
        }
    }

    /// The engine's version string, within two seconds or not at all.
    pub async fn version(&self) -> EngineResult<String> {
        let docker = self.docker()?;
        match tokio::time::timeout(HEALTH_TIMEOUT, docker.version()).await {
            Ok(Ok(v)) => Ok(v.version.unwrap_or_else(|| "unknown".into())),
            Ok(Err(e)) => Err(EngineError::Unavailable(e.to_string())),
            Err(_) => Err(EngineError::Unavailable(format!(
                "the engine did not answer within {} ms",
                HEALTH_TIMEOUT.as_millis()
            ))),
        }
    }

    /// Creates the bridge network unless it exists. Inter-container traffic
    /// is off: sandboxes of different sessions must not reach each other.
    pub async fn ensure_network(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        match docker
            .inspect_network(
                name,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => {}
                other => return Err(other),
            },
        }
        let options = HashMap::from([(
            "com.docker.network.bridge.enable_icc".to_string(),
            "false".to_string(),
        )]);
        let req = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".into()),
            labels: Some(labels),
            options: Some(options),
            ..Default::default()
        };
        match self
            .making(async move { docker.create_network(req).await })
            .await
        {
            Ok(_) => {
                tracing::info!(network = name, "created the sandbox network");
                Ok(())
            }
            // Lost a race with another create: the network is there.
            Err(EngineError::Conflict(_)) => Ok(()),
            Err(other) => Err(other),
        }
    }

    /// Creates a named volume with labels, limited to `size_mb` MiB when
    /// that is not 0 (the local driver's `size`: an xfs project quota).
    pub async fn create_volume(
        &self,
        name: &str,
        size_mb: u64,
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let driver_opts = (size_mb > 0).then(|| {
            let bytes = size_mb.saturating_mul(1024 * 1024);
            HashMap::from([("size".to_string(), bytes.to_string())])
        });
        match self.create_volume_with(name, driver_opts, labels).await {
            Ok(()) => Ok(()),
            // Docker's local driver: "quota size requested but no quota
            // support".
            Err(EngineError::Failed(m)) if size_mb > 0 && m.contains("no quota support") => {
                Err(EngineError::VolumeSizeUnsupported(format!(
                    "the engine cannot limit the workspace to {size_mb} MiB: {m}"
                )))
            }
            Err(other) => Err(other),
        }
    }

    /// Creates a named volume with labels that is a tmpfs of `size_mb` MiB
    /// (the local driver mounts it while a container holds the volume),
    /// its root owned by `owner` (uid, gid) with mode 0755. A tmpfs lives
    /// in memory: its files are gone whenever no container holds it, and
    /// the engine copies nothing of the image into it.
    pub async fn create_tmpfs_volume(
        &self,
        name: &str,
        size_mb: u64,
        owner: (u32, u32),
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let (uid, gid) = owner;
        let opts = HashMap::from([
            ("type".to_string(), "tmpfs".to_string()),
            ("device".to_string(), "tmpfs".to_string()),
            (
                "o".to_string(),
                format!("size={size_mb}m,uid={uid},gid={gid},mode=0755"),
            ),
        ]);
        self.create_volume_with(name, Some(opts), labels).await
    }

    async fn create_volume_with(
        &self,
        name: &str,
        driver_opts: Option<HashMap<String, String>>,
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        let req = VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels),
            driver_opts,
            ..Default::default()
        };
        self.making(async move { docker.create_volume(req).await })
            .await?;
        Ok(())
    }

    /// Removes a volume; a missing one is fine. A volume still held by a
    /// container that is being removed right now is retried briefly.
    pub async fn remove_volume(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        for _ in 0..40 {
            match docker
                .remove_volume(name, Some(RemoveVolumeOptions { force: true }))
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) => match EngineError::from(e) {
                    EngineError::NotFound(_) => return Ok(()),
                    EngineError::Conflict(m) if m.contains("in use") => {
                        tokio::time::sleep(Duration::from_millis(250)).await
                    }
                    other => return Err(other),
                },
            }
        }
        Err(EngineError::Conflict(format!("volume {name} stays in use")))
    }

    /// Removes a volume at once, or says why not (in use: a conflict).
    pub async fn remove_volume_now(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        docker
            .remove_volume(name, Some(RemoveVolumeOptions { force: false }))
            .await?;
        Ok(())
    }

    /// Creates (does not start) a hardened sandbox container.
    pub async fn create_container(&self, spec: &SandboxContainer) -> EngineResult<()> {
        let under_gvisor = self.is_gvisor(spec.oci_runtime.as_deref()).await;
        self.create_named(
            &spec.name,
            container::sandbox_container_body(spec, under_gvisor),
        )
        .await
    }

    /// Creates a container called `name` from `body`.
    async fn create_named(
        &self,
        name: &str,
        body: bollard::models::ContainerCreateBody,
    ) -> EngineResult<()> {
        let options = bollard::query_parameters::CreateContainerOptions {
            name: Some(name.to_string()),
            platform: String::new(),
        };
        let docker = self.docker()?;
        self.making(async move { docker.create_container(Some(options), body).await })
            .await?;
        Ok(())
    }

    /// Whether the OCI runtime of that name is gVisor's runsc: by name, or
    /// by the program the engine registered for it. Unknown until the
    /// engine answers (then false, and asked again next time).
    pub async fn is_gvisor(&self, oci_runtime: Option<&str>) -> bool {
        let Some(name) = oci_runtime else {
            return false;
        };
        if name.starts_with("runsc") {
            return true;
        }
        if let Some(known) = self
            .inner
            .gvisor_runtimes
            .read()
            .ok()
            .and_then(|m| m.get(name).copied())
        {
            return known;
        }
        let Ok(docker) = self.docker() else {
            return false;
        };
        let Ok(info) = docker.info().await else {
            return false;
        };
        let runtimes = info.runtimes.unwrap_or_default();
        let gvisor = runtimes
            .get(name)
            .and_then(|r| r.path.as_deref())
            .is_some_and(|p| {
                std::path::Path::new(p)
                    .file_name()
                    .is_some_and(|f| f == "runsc")
            });
        if let Ok(mut m) = self.inner.gvisor_runtimes.write() {
            m.insert(name.to_string(), gvisor);
        }
        gvisor
    }

    /// Whether a volume exists.
    pub async fn volume_exists(&self, name: &str) -> EngineResult<bool> {
        let docker = self.docker()?;
        match docker.inspect_volume(name).await {
            Ok(_) => Ok(true),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(false),
                other => Err(other),
            },
        }
    }

    /// Puts `entries` into `volume` (paths relative to the volume), through
    /// a container of `image` that is created for it and never started.
    pub async fn fill_volume(
        &self,
        volume: &str,
        image: &str,
        labels: HashMap<String, String>,
        entries: &[Entry<'_>],
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        let name = format!("{volume}-fill-{}", scratch_suffix()?);
        self.create_scratch(&docker, &name, Some(volume), image, labels)
            .await?;
        let moved: Vec<(String, Entry<'_>)> = entries
            .iter()
            .map(|e| match *e {
                Entry::Dir { path, .. } | Entry::File { path, .. } => (
                    format!("{VOLUME_USER_DIR}/{}", path.trim_start_matches('/')),
                    *e,
                ),
            })
            .collect();
        let entries: Vec<Entry<'_>> = moved
            .iter()
            .map(|(path, e)| match *e {
                Entry::Dir { uid, gid, .. } => Entry::Dir { path, uid, gid },
                Entry::File { content, mode, .. } => Entry::File {
                    path,
                    content,
                    mode,
                },
            })
            .collect();
        let uploaded = archive::upload(&docker, &name, &entries).await;
        let removed = self.remove_container(&name).await;
        uploaded.and(removed)
    }

    /// The content of `path` in `volume` (at most `max` bytes), read
    /// through a container of `image` created for it and never started.
    pub async fn volume_file(
        &self,
        volume: &str,
        image: &str,
        labels: HashMap<String, String>,
        path: &str,
        max: usize,
    ) -> EngineResult<Option<Vec<u8>>> {
        let docker = self.docker()?;
        let name = format!("{volume}-read-{}", scratch_suffix()?);
        self.create_scratch(&docker, &name, Some(volume), image, labels)
            .await?;
        let full = format!("{VOLUME_USER_DIR}/{}", path.trim_start_matches('/'));
        let read = archive::download(&docker, &name, &full, max).await;
        let removed = self.remove_container(&name).await;
        let content = read?;
        removed?;
        Ok(content)
    }

    /// The owner (uid, gid) of directory `path` in `image`; `None` when
    /// the image has no such directory. Read through a container created
    /// for it and never started.
    pub async fn image_dir_owner(
        &self,
        image: &str,
        path: &str,
        labels: HashMap<String, String>,
    ) -> EngineResult<Option<(u32, u32)>> {
        let docker = self.docker()?;
        let name = format!(
            "{}-probe-{}",
            labels
                .get("sandboxd.instance")
                .map(String::as_str)
                .unwrap_or("sandboxd"),
            scratch_suffix()?
        );
        self.create_scratch(&docker, &name, None, image, labels)
            .await?;
        let owner = archive::dir_owner(&docker, &name, path).await;
        let removed = self.remove_container(&name).await;
        let owner = owner?;
        removed?;
        Ok(owner)
    }

    /// A container only for the archive API, holding `volume` (if any) at
    /// [`VOLUME_USER_DIR`]; never started.
    async fn create_scratch(
        &self,
        docker: &Docker,
        name: &str,
        volume: Option<&str>,
        image: &str,
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let body = container::scratch_body(volume.map(|v| (v, VOLUME_USER_DIR)), image, labels);
        docker
            .create_container(
                Some(bollard::query_parameters::CreateContainerOptions {
                    name: Some(name.to_string()),
                    platform: String::new(),
                }),
                body,
            )
            .await?;
        Ok(())
    }

    /// Starts a created or stopped container.
    pub async fn start_container(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        docker
            .start_container(name, None::<StartContainerOptions>)
            .await?;
        Ok(())
    }

    /// Removes a container and kills what runs in it; a missing one is fine.
    pub async fn remove_container(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        let options = RemoveContainerOptions {
            force: true,
            v: false,
            link: false,
        };
        match docker.remove_container(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(()),
                // "removal already in progress": someone else is doing it;
                // done means gone, so wait for that (bounded).
                EngineError::Conflict(m) if m.contains("in progress") => {
                    for _ in 0..40 {
                        if self.container_running(name).await?.is_none() {
                            return Ok(());
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(EngineError::Conflict(format!(
                        "{name} is still being removed"
                    )))
                }
                other => Err(other),
            },
        }
    }

    /// Restarts a container: SIGTERM to its process (under init, the init
    /// passes it on), SIGKILL to everything if it has not stopped after
    /// `grace`.
    pub async fn restart_container(&self, name: &str, grace: Duration) -> EngineResult<()> {
        let docker = self.docker()?;
        let options = RestartContainerOptions {
            signal: None,
            t: Some(i32::try_from(grace.as_secs()).unwrap_or(i32::MAX)),
        };
        docker.restart_container(name, Some(options)).await?;
        Ok(())
    }

    /// Whether a container runs: `Some(true)` running, `Some(false)` exists
    /// but stopped, `None` gone.
    pub async fn container_running(&self, name: &str) -> EngineResult<Option<bool>> {
        Ok(self.container_status(name).await?.map(|s| s.running))
    }

    /// A container's state, `None` when it is gone.
    pub async fn container_status(&self, name: &str) -> EngineResult<Option<ContainerStatus>> {
        let docker = self.docker()?;
        match docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                Ok(Some(ContainerStatus {
                    running: state.running.unwrap_or(false),
                    oom_killed: state.oom_killed.unwrap_or(false),
                    exit_code: state.exit_code.unwrap_or(0),
                    started_at: state.started_at.unwrap_or_default(),
                    labels: info.config.and_then(|c| c.labels).unwrap_or_default(),
                    image_id: info.image.unwrap_or_default(),
                }))
            }
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(None),
                other => Err(other),
            },
        }
    }

    /// Whether the memory limit ended a stopped container's last life.
    /// The engine's flag is set only when its `oom` event came before the
    /// container's exit; on a loaded host it sometimes comes after (seen
    /// with gVisor, whose whole kernel goes), and the flag stays false.
    /// So a container killed by SIGKILL (137) without the flag is looked
    /// up in the engine's events of that life: an `oom` there, or arriving
    /// within [`LATE_OOM_EVENT`], means memory.
    pub async fn stopped_by_memory(&self, name: &str, status: &ContainerStatus) -> bool {
        if status.running {
            return false;
        }
        if status.oom_killed {
            return true;
        }
        if status.exit_code != 137 {
            return false;
        }
        let (Ok(docker), Some(started)) = (self.docker(), unix_seconds(&status.started_at)) else {
            return false;
        };
        let options = EventsOptions {
            since: Some(started.to_string()),
            until: None,
            filters: Some(HashMap::from([
                ("type".to_string(), vec!["container".to_string()]),
                ("container".to_string(), vec![name.to_string()]),
                ("event".to_string(), vec!["oom".to_string()]),
            ])),
        };
        let mut events = docker.events(Some(options));
        let found = matches!(
            tokio::time::timeout(LATE_OOM_EVENT, events.next()).await,
            Ok(Some(Ok(_)))
        );
        if found {
            tracing::info!(
                container = name,
                "stopped by its memory limit (the engine's flag missed it; its oom event says so)"
            );
        }
        found
    }

    /// Every container, running or not, carrying all of `labels`.
    pub async fn list_containers(
        &self,
        labels: &[(&str, &str)],
    ) -> EngineResult<Vec<ContainerRecord>> {
        let docker = self.docker()?;
        let options = ListContainersOptions {
            all: true,
            filters: Some(label_filter(labels)),
            ..Default::default()
        };
        let list = docker.list_containers(Some(options)).await?;
        Ok(list
            .into_iter()
            .map(|c| ContainerRecord {
                name: c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .map(|n| n.trim_start_matches('/').to_string())
                    .unwrap_or_default(),
                labels: c.labels.unwrap_or_default(),
                running: c.state.map(|s| s.to_string() == "running").unwrap_or(false),
                published: c
                    .ports
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|p| Some((p.private_port, p.public_port?)))
                    .collect(),
            })
            .collect())
    }

    /// Every volume carrying all of `labels`.
    pub async fn list_volumes(&self, labels: &[(&str, &str)]) -> EngineResult<Vec<VolumeRecord>> {
        let docker = self.docker()?;
        let options = ListVolumesOptions {
            filters: Some(label_filter(labels)),
        };
        let list = docker.list_volumes(Some(options)).await?;
        Ok(list
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| VolumeRecord {
                name: v.name,
                labels: v.labels,
            })
            .collect())
    }

    /// The id of a local image (`sha256:…`), `None` when the engine does not
    /// have it.
    pub async fn image_id(&self, image: &str) -> EngineResult<Option<String>> {
        let docker = self.docker()?;
        match docker.inspect_image(image).await {
            Ok(info) => Ok(info.id),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(None),
                other => Err(other),
            },
        }
    }

    /// Changes a running sandbox container's CPU and memory limits in
    /// place; memory and memory with swap move together, so there is still
    /// no swap on top. gVisor's runsc cannot do this (the engine answers
    /// an error and the limits stay).
    pub async fn update_resources(
        &self,
        name: &str,
        vcpus: u32,
        memory_mb: u32,
    ) -> EngineResult<()> {
        let (memory, nano_cpus) = container::cpu_and_memory(vcpus, memory_mb);
        self.docker()?
            .update_container(
                name,
                bollard::models::ContainerUpdateBody {
                    memory: Some(memory),
                    memory_swap: Some(memory),
                    nano_cpus: Some(nano_cpus),
                    ..Default::default()
                },
            )
            .await?;
        Ok(())
    }

    /// True when the engine has the image locally.
    pub async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        let docker = self.docker()?;
        match docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(false),
                other => Err(other),
            },
        }
    }

    /// Builds `tag` from a Dockerfile held in memory (a context of one file).
    pub async fn build_image(
        &self,
        tag: &str,
        dockerfile: &str,
        build_args: HashMap<String, String>,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        image::build(&docker, tag, dockerfile, build_args).await
    }
}

impl Engine {
    /// Starts a process in a running container, attached.
    pub async fn exec(&self, container: &str, req: &ExecRequest) -> EngineResult<ExecSession> {
        let docker = self.docker()?;
        exec::start(&docker, container, req).await
    }

    /// Attaches to the stdio of a container's own process (see
    /// [`exec::attach`]).
    pub async fn attach(&self, container: &str) -> EngineResult<ExecSession> {
        let docker = self.docker()?;
        exec::attach(&docker, container).await
    }
}

impl Engine {
    /// Creates an isolated network: internal (the engine routes nothing in
    /// or out) and with no address of the host on its bridge (the gateway
    /// address is never assigned), so its containers reach each other and
    /// nothing else, the host included; `subnet` pins the address range
    /// (an overlap is reported as a conflict).
    pub async fn create_isolated_network(
        &self,
        name: &str,
        labels: HashMap<String, String>,
        subnet: &str,
        ip_range: &str,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        let req = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".into()),
            internal: Some(true),
            options: Some(HashMap::from([(
                "com.docker.network.bridge.inhibit_ipv4".to_string(),
                "true".to_string(),
            )])),
            labels: Some(labels),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(subnet.to_string()),
                    ip_range: Some(ip_range.to_string()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        match self
            .making(async move { docker.create_network(req).await })
            .await
        {
            Ok(_) => Ok(()),
            Err(EngineError::Failed(m)) if m.contains("overlap") => Err(EngineError::Conflict(m)),
            Err(other) => Err(other),
        }
    }

    /// Attaches a container to a network, under extra DNS `aliases` that
    /// resolve on that network only, at `address` if given; already
    /// attached is fine.
    pub async fn connect_network(
        &self,
        network: &str,
        container: &str,
        aliases: &[&str],
        address: Option<std::net::Ipv4Addr>,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        let req = NetworkConnectRequest {
            container: container.to_string(),
            endpoint_config: (!aliases.is_empty() || address.is_some()).then(|| {
                bollard::models::EndpointSettings {
                    aliases: Some(aliases.iter().map(|a| a.to_string()).collect())
                        .filter(|a: &Vec<String>| !a.is_empty()),
                    ipam_config: address.map(|a| bollard::models::EndpointIpamConfig {
                        ipv4_address: Some(a.to_string()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            }),
        };
        match docker.connect_network(network, req).await {
            Ok(()) => Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::Failed(m) | EngineError::Conflict(m)
                    if m.contains("already exists") =>
                {
                    Ok(())
                }
                other => Err(other),
            },
        }
    }

    /// Detaches a container from a network; not attached (or either one
    /// missing) is fine.
    pub async fn disconnect_network(&self, network: &str, container: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        let req = bollard::models::NetworkDisconnectRequest {
            container: container.to_string(),
            force: Some(true),
        };
        match docker.disconnect_network(network, req).await {
            Ok(()) => Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(()),
                EngineError::Failed(m) | EngineError::Conflict(m)
                    if m.contains("not connected") =>
                {
                    Ok(())
                }
                other => Err(other),
            },
        }
    }

    /// Removes a network; a missing one is fine.
    pub async fn remove_network(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        match docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(()),
                other => Err(other),
            },
        }
    }

    /// Every network carrying all of `labels`.
    pub async fn list_networks(&self, labels: &[(&str, &str)]) -> EngineResult<Vec<NetworkRecord>> {
        let docker = self.docker()?;
        let list = docker
            .list_networks(Some(ListNetworksOptions {
                filters: Some(label_filter(labels)),
            }))
            .await?;
        Ok(list
            .into_iter()
            .map(|n| NetworkRecord {
                name: n.name.unwrap_or_default(),
                labels: n.labels.unwrap_or_default(),
                subnets: n
                    .ipam
                    .and_then(|i| i.config)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.subnet)
                    .collect(),
            })
            .collect())
    }

    /// Creates a proxy container and starts it.
    pub async fn start_proxy(&self, spec: &ProxyContainer) -> EngineResult<()> {
        self.create_named(&spec.name, container::proxy_container_body(spec))
            .await?;
        self.connect_network(&spec.link_network, &spec.name, &[], None)
            .await?;
        self.start_container(&spec.name).await?;
        if self
            .wait_for_output(&spec.name, container::PROXY_LISTENING, PROXY_START)
            .await?
        {
            Ok(())
        } else {
            Err(EngineError::Failed(format!(
                "proxy {} did not start listening within {PROXY_START:?}",
                spec.name
            )))
        }
    }

    /// Creates an egress proxy (not started: it joins its link networks
    /// first, see `connect_network`).
    pub async fn create_egress(&self, spec: &EgressContainer) -> EngineResult<()> {
        self.create_named(&spec.name, container::egress_container_body(spec))
            .await
    }

    /// The lines `container` prints on stdout from `since` (unix seconds)
    /// on, as they come, until it stops, each with the time the engine
    /// logged it; lines longer than `max` bytes (and what cannot be read
    /// as text) are skipped, so what is held is bounded.
    pub fn follow_stdout_lines(
        &self,
        container: &str,
        since: i32,
        max: usize,
    ) -> impl futures_util::Stream<Item = LogLine> + use<> {
        let options = LogsOptionsBuilder::new()
            .follow(true)
            .stdout(true)
            .stderr(false)
            .since(since)
            .timestamps(true)
            .build();
        let chunks = match self.docker() {
            Ok(docker) => docker.logs(container, Some(options)).boxed(),
            Err(_) => futures_util::stream::empty().boxed(),
        };
        // Room for the engine's time stamp in front of each line.
        let max = max + 64;
        let mut partial: Vec<u8> = Vec::new();
        let mut skipping = false;
        chunks
            .take_while(|c| std::future::ready(c.is_ok()))
            .flat_map(move |chunk| {
                let mut lines = Vec::new();
                for &b in chunk.map(|c| c.into_bytes()).unwrap_or_default().iter() {
                    if b == b'\n' {
                        if !skipping {
                            lines.extend(
                                String::from_utf8(std::mem::take(&mut partial))
                                    .ok()
                                    .and_then(|l| LogLine::parse(&l)),
                            );
                        }
                        partial.clear();
                        skipping = false;
                    } else if partial.len() >= max {
                        skipping = true;
                        partial.clear();
                    } else if !skipping {
                        partial.push(b);
                    }
                }
                futures_util::stream::iter(lines)
            })
    }

    /// Whether `container` prints `needle` (on stdout or stderr, from its
    /// start) within `within`; false when it ends or time is up first. What
    /// is kept to find a needle split across chunks is bounded.
    pub async fn wait_for_output(
        &self,
        container: &str,
        needle: &str,
        within: Duration,
    ) -> EngineResult<bool> {
        use futures_util::StreamExt;
        let docker = self.docker()?;
        let options = LogsOptionsBuilder::new()
            .follow(true)
            .stdout(true)
            .stderr(true)
            .build();
        let mut logs = docker.logs(container, Some(options));
        let keep = needle.len().max(1) * 2 + 4096;
        let mut seen: Vec<u8> = Vec::new();
        let search = async {
            while let Some(chunk) = logs.next().await {
                seen.extend_from_slice(&chunk?.into_bytes());
                if seen.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    return Ok(true);
                }
                let cut = seen.len().saturating_sub(keep);
                seen.drain(..cut);
            }
            Ok(false)
        };
        match tokio::time::timeout(within, search).await {
            Ok(found) => found,
            Err(_) => Ok(false),
        }
    }

    /// The host port a running container publishes `port/tcp` on.
    pub async fn published_port(&self, container: &str, port: u16) -> EngineResult<Option<u16>> {
        let docker = self.docker()?;
        let info = docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await?;
        if !info.state.and_then(|s| s.running).unwrap_or(false) {
            return Ok(None);
        }
        Ok(info
            .network_settings
            .and_then(|n| n.ports)
            .and_then(|mut p| p.remove(&format!("{port}/tcp")))
            .flatten()
            .and_then(|b| b.into_iter().find_map(|b| b.host_port?.parse().ok())))
    }
}

fn label_filter(labels: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
    HashMap::from([(
        "label".to_string(),
        labels.iter().map(|(k, v)| format!("{k}={v}")).collect(),
    )])
}

/// A random suffix that keeps a scratch container's name unique.
fn scratch_suffix() -> EngineResult<String> {
    crate::id::random_hex(4).map_err(|e| EngineError::Failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::LogLine;

    #[test]
    fn log_time_stamps_are_padded_to_sort_as_strings() {
        let a = LogLine::parse("2026-11-25T10:00:00.1Z egress-denied x").expect("line");
        let b = LogLine::parse("2026-11-25T10:00:00.12Z next").expect("line");
        let c = LogLine::parse("2026-11-25T10:00:01Z later").expect("line");
        assert_eq!(a.at, "2026-11-25T10:00:00.100000000");
        assert_eq!(a.text, "egress-denied x");
        assert!(a.at < b.at && b.at < c.at, "{a:?} {b:?} {c:?}");
        for bad in [
            "no-stamp",
            "2026-11-25T10:00:00.1 no-zone",
            "2026-11-25T10:00:00.1234567890Z too-fine",
            "2026-11-25T10:00:00.1xZ not-digits",
            "10:00:00Z short",
        ] {
            assert_eq!(LogLine::parse(bad), None, "{bad}");
        }
    }
}
