//! The engine: the only code that talks to Docker (through bollard). The
//! domain asks for volumes, containers and networks in its own words
//! ([`SandboxContainer`], [`ContainerRecord`]) and gets [`EngineError`]s back;
//! no bollard type leaves this module. A second backend (rootless Podman,
//! Kubernetes) would be another file beside `discovery.rs` behind the same
//! methods.
//!
//! This file holds the handle and its connection; the methods on it are in
//! one file per object: `containers`, `volumes`, `networks`, `exec`,
//! `logs`, `image`, `archive` (files in and out through scratch
//! containers). `container_spec` holds the hardened container bodies.

mod archive;
mod container_spec;
mod containers;
pub(crate) mod discovery;
mod error;
mod exec;
mod image;
mod logs;
mod networks;
mod volumes;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use archive::Entry;
pub use container_spec::{
    EgressContainer, ProxyContainer, SandboxContainer, sandbox_container_body,
};
pub use containers::{ContainerRecord, ContainerStatus, ProxyState};
use discovery::DiscoveryInputs;
pub use error::{EngineError, EngineResult};
pub use exec::{ExecOutput, ExecRequest, ExecSession, OutputStream};
pub use logs::LogLine;
pub use networks::NetworkRecord;
pub use volumes::VolumeRecord;

/// How long an engine call that should be instant may take before we call
/// the engine unavailable. Health must never hang.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// The OCI runtime a container gets when it names none, once the
    /// engine said.
    default_runtime: RwLock<Option<String>>,
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
                default_runtime: RwLock::new(None),
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
}

fn label_filter(labels: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
    HashMap::from([(
        "label".to_string(),
        labels.iter().map(|(k, v)| format!("{k}={v}")).collect(),
    )])
}
