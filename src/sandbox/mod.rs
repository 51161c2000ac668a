//! Sandboxes: one hardened container and one workspace volume per chat
//! session. [`Sandboxes`] owns their lifecycle (create or reconnect, stop,
//! restart, expire, evict, rehydrate) on top of the pure bookkeeping in
//! [`registry`]; the engine does the container work.

pub mod labels;
mod reaper;
pub mod registry;
mod rehydrate;
pub mod spec;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::config::Config;
use crate::engine::{Engine, EngineError, ExecRequest, ExecSession, SandboxContainer};
pub use reaper::run_reaper;
pub use registry::{Sandbox, SandboxRegistry};
use registry::{container_name, is_sandbox_id, now_ms, volume_name};
use spec::{CreateSandboxRequest, NetworkMode, SandboxSpec, SpecError};

/// The runtime Dockerfile, built into the binary so a fresh install can build
/// its image on first use.
const RUNTIME_DOCKERFILE: &str = include_str!("../../sandbox-images/default/Dockerfile");

/// How long a request waits for startup reconciliation before giving up.
const READY_WAIT: Duration = Duration::from_secs(30);

/// Grace between SIGTERM and SIGKILL when a sandbox restarts.
const RESTART_GRACE: Duration = Duration::from_secs(2);

/// What can go wrong with a sandbox operation.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The request is invalid; names the field.
    #[error(transparent)]
    Invalid(#[from] SpecError),
    /// No sandbox with this id (or its container is gone).
    #[error("no sandbox with id {0:?}")]
    NotFound(String),
    /// Every slot is taken by a busy sandbox.
    #[error("all {max} sandboxes are busy running commands; try again when one finishes")]
    AtCapacity { max: usize },
    /// The runtime image is missing and may not be built here.
    #[error("the runtime image {image} is missing; build it with: {command}")]
    ImageMissing { image: String, command: String },
    /// The engine cannot be reached.
    #[error("the container engine is not available: {0}")]
    EngineUnavailable(String),
    /// `workspace_size_mb` is set, but the engine cannot enforce it.
    #[error(
        "{0}. Workspace size limits need Docker's volume root on xfs mounted with prjquota; \
         set workspace_size_mb = 0 (SANDBOXD_WORKSPACE_SIZE_MB=0) to run without one"
    )]
    WorkspaceQuotaUnsupported(String),
    /// The engine refused or failed.
    #[error("{0}")]
    Engine(EngineError),
}

impl From<EngineError> for SandboxError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Unavailable(m) => SandboxError::EngineUnavailable(m),
            EngineError::VolumeSizeUnsupported(m) => SandboxError::WorkspaceQuotaUnsupported(m),
            other => SandboxError::Engine(other),
        }
    }
}

/// Result of sandbox operations.
pub type SandboxResult<T> = Result<T, SandboxError>;

/// The answer to a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub sandbox_id: String,
    pub created: bool,
    /// The allowlist grew (or the sandbox is new with ports): their proxies
    /// can be prepared.
    pub ports_added: bool,
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxView {
    pub sandbox_id: String,
    pub session_key: String,
    pub runtime: String,
    pub state: &'static str,
    pub created_at: u64,
    pub last_used_at: u64,
    pub idle_ttl_ms: u64,
    pub expires_at: u64,
    pub resources: ResourcesView,
    pub network: NetworkView,
    pub ports: PortsView,
    pub running_commands: usize,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesView {
    pub vcpus: u32,
    pub memory_mb: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct NetworkView {
    pub mode: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct PortsView {
    pub allowed: Vec<u16>,
    pub published: BTreeMap<String, u16>,
}

fn view(s: &Sandbox, state: &'static str) -> SandboxView {
    let ports = s.ports();
    SandboxView {
        sandbox_id: s.id.clone(),
        session_key: s.session_key.clone(),
        runtime: s.runtime.clone(),
        state,
        created_at: s.created_at,
        last_used_at: s.last_used_at(),
        idle_ttl_ms: s.idle_ttl_ms(),
        expires_at: s.expires_at(),
        resources: ResourcesView {
            vcpus: s.resources.vcpus,
            memory_mb: s.resources.memory_mb,
        },
        network: NetworkView {
            mode: s.network.as_str(),
        },
        ports: PortsView {
            allowed: ports.allowed.into_iter().collect(),
            published: ports
                .published
                .into_iter()
                .map(|(p, h)| (p.to_string(), h))
                .collect(),
        },
        running_commands: s.running_commands(),
    }
}

/// Why a sandbox is being removed; one tracing event each.
#[derive(Debug, Clone, Copy)]
enum Removal {
    Stopped,
    Expired,
    Evicted,
    Removed,
}

impl Removal {
    fn event(self) -> &'static str {
        match self {
            Removal::Stopped => "stopped",
            Removal::Expired => "expired",
            Removal::Evicted => "evicted",
            Removal::Removed => "removed",
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Sandboxes {
    config: Arc<Config>,
    engine: Engine,
    registry: SandboxRegistry,
    /// Set once startup reconciliation has rebuilt the registry.
    ready: watch::Sender<bool>,
    /// One image build at a time; concurrent creates wait for it.
    image_build: tokio::sync::Mutex<()>,
    /// The bridge network was seen; rechecked only when a start says it is gone.
    network_ready: AtomicBool,
}

impl Sandboxes {
    pub fn new(config: Arc<Config>, engine: Engine) -> Self {
        Sandboxes {
            registry: SandboxRegistry::new(config.max_concurrent),
            config,
            engine,
            ready: watch::channel(false).0,
            image_build: tokio::sync::Mutex::new(()),
            network_ready: AtomicBool::new(false),
        }
    }

    /// Fails fast while no engine is connected; waits (bounded) while the
    /// registry is being rebuilt, so no request races rehydration.
    async fn ensure_ready(&self) -> SandboxResult<()> {
        if !self.engine.is_connected() {
            // Let the engine say why (which sockets were tried).
            return match self.engine.version().await {
                Err(e) => Err(e.into()),
                Ok(_) => Err(SandboxError::EngineUnavailable(
                    "the engine is connecting; try again".into(),
                )),
            };
        }
        let mut rx = self.ready.subscribe();
        match tokio::time::timeout(READY_WAIT, rx.wait_for(|r| *r)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(SandboxError::EngineUnavailable(
                "sandboxd is still reconciling its sandboxes with the engine".into(),
            )),
        }
    }

    /// A registered sandbox, counted as used.
    pub async fn lookup(&self, id: &str) -> SandboxResult<Arc<Sandbox>> {
        self.ensure_ready().await?;
        let s = self
            .registry
            .get(id)
            .ok_or_else(|| SandboxError::NotFound(id.to_string()))?;
        self.registry.touch(&s);
        Ok(s)
    }

    /// Creates a sandbox for the session, or reconnects to its healthy one.
    pub async fn create(&self, req: CreateSandboxRequest) -> SandboxResult<Created> {
        let create_started = std::time::Instant::now();
        let spec = SandboxSpec::parse(req, &self.config)?;
        self.ensure_ready().await?;
        let _key = self.registry.lock_key(&spec.session_key).await;

        if let Some(existing) = self.registry.by_session(&spec.session_key) {
            if let Some(created) = self.reconnect(&existing, &spec).await? {
                return Ok(created);
            }
        }

        let mut reservation = self
            .registry
            .reserve()
            .map_err(|e| SandboxError::AtCapacity { max: e.max })?;
        if let Some(victim) = reservation.evicted.take() {
            self.remove_objects(&victim.id, Removal::Evicted, Some(&victim))
                .await;
        }

        let id = registry::new_sandbox_id();
        let record = labels::SandboxRecord {
            id: id.clone(),
            session_key: spec.session_key.clone(),
            runtime: spec.runtime.clone(),
            created_at: now_ms(),
            idle_ttl_ms: spec.idle_ttl_ms.unwrap_or(self.config.default_idle_ttl_ms),
            resources: spec.resources,
            network: spec.network,
            ports: spec.ports.clone(),
        };
        let sandbox = Arc::new(Sandbox::from_record(
            &self.config.instance,
            &record,
            now_ms(),
        ));
        if let Err(e) = self.launch(&sandbox, &spec, &record).await {
            // Leave nothing half-made behind.
            self.remove_engine_objects(&sandbox.container, &sandbox.volume)
                .await;
            tracing::warn!(sandbox_id = %id, session_key = %spec.session_key, error = %e, "create failed; cleaned up");
            return Err(e);
        }
        self.registry.insert(reservation, sandbox);
        tracing::info!(event = "created", sandbox_id = %id, session_key = %spec.session_key, runtime = %spec.runtime, "sandbox created");
        crate::telemetry::sandbox_event("created");
        crate::telemetry::create_took(create_started);
        Ok(Created {
            sandbox_id: id,
            created: true,
            ports_added: !spec.ports.is_empty(),
        })
    }

    /// Reuses `existing` if its container can run; `None` means it is gone
    /// and a new one must be made.
    async fn reconnect(
        &self,
        existing: &Arc<Sandbox>,
        spec: &SandboxSpec,
    ) -> SandboxResult<Option<Created>> {
        let healthy = match self.engine.container_running(&existing.container).await? {
            Some(true) => true,
            Some(false) => {
                existing.note_unexpected_stop();
                self.engine
                    .start_container(&existing.container)
                    .await
                    .is_ok()
            }
            None => false,
        };
        if !healthy {
            self.registry.remove(&existing.id);
            self.remove_objects(&existing.id, Removal::Removed, Some(existing))
                .await;
            return Ok(None);
        }
        let allowed_before = existing.ports().allowed.len();
        existing
            .allow_ports(&spec.ports, self.config.max_ports)
            .map_err(|n| {
                SandboxError::Invalid(SpecError {
                    field: "ports".into(),
                    message: format!(
                        "at most {} ports per sandbox (this would make {n})",
                        self.config.max_ports
                    ),
                })
            })?;
        let allowed_after = existing.ports().allowed.len();
        if let Some(ttl) = spec.idle_ttl_ms {
            existing.set_idle_ttl_ms(ttl);
        }
        self.registry.touch(existing);
        tracing::info!(event = "reconnected", sandbox_id = %existing.id, session_key = %existing.session_key, "sandbox reconnected");
        crate::telemetry::sandbox_event("reconnected");
        Ok(Some(Created {
            sandbox_id: existing.id.clone(),
            created: false,
            ports_added: allowed_after > allowed_before,
        }))
    }

    async fn launch(
        &self,
        sandbox: &Sandbox,
        spec: &SandboxSpec,
        record: &labels::SandboxRecord,
    ) -> SandboxResult<()> {
        let labels = labels::encode(&self.config.instance, record);
        let container = SandboxContainer {
            name: sandbox.container.clone(),
            image: spec.image.clone(),
            oci_runtime: spec.oci_runtime.clone(),
            user: self.config.sandbox_user.clone(),
            workspace_dir: self.config.workspace_dir.clone(),
            volume: sandbox.volume.clone(),
            network: match spec.network {
                NetworkMode::Default => Some(self.config.network_name.clone()),
                NetworkMode::None => None,
            },
            vcpus: spec.resources.vcpus,
            memory_mb: spec.resources.memory_mb,
            pids_limit: self.config.pids_limit,
            tmp_size_mb: self.config.tmp_size_mb,
            file_size_limit_mb: self.config.file_size_limit_mb,
            labels: labels.clone(),
        };
        let networked = spec.network == NetworkMode::Default;
        if networked && !self.network_ready.load(Ordering::Relaxed) {
            self.ensure_network().await?;
        }
        self.engine
            .create_volume(&sandbox.volume, self.config.workspace_size_mb, labels)
            .await?;
        // A missing image shows up as a 404 from create, a network removed
        // out of band as a 404 from start: fix what is missing and try once
        // more, so the common path costs no extra engine round trip.
        match self.engine.create_container(&container).await {
            Err(EngineError::NotFound(msg)) => {
                tracing::info!(reason = %msg, "container create needs a missing image");
                self.ensure_image(&spec.image).await?;
                self.engine.create_container(&container).await?;
            }
            other => other?,
        }
        match self.engine.start_container(&sandbox.container).await {
            Err(EngineError::NotFound(msg)) if networked => {
                tracing::info!(reason = %msg, "container start needs the network again");
                self.ensure_network().await?;
                self.engine.start_container(&sandbox.container).await?;
            }
            other => other?,
        }
        Ok(())
    }

    async fn ensure_network(&self) -> SandboxResult<()> {
        let labels = labels::instance_only(&self.config.instance);
        self.engine
            .ensure_network(&self.config.network_name, labels)
            .await?;
        self.network_ready.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Builds the runtime image from the embedded Dockerfile if it is
    /// missing and allowed; one build at a time.
    async fn ensure_image(&self, image: &str) -> SandboxResult<()> {
        let _one_build = self.image_build.lock().await;
        if self.engine.image_exists(image).await? {
            return Ok(());
        }
        let command = format!("SANDBOXD_IMAGE={image} sandbox-images/build.sh");
        if self.config.disable_autobuild || image != self.config.image {
            return Err(SandboxError::ImageMissing {
                image: image.to_string(),
                command,
            });
        }
        tracing::info!(image, base = %self.config.base_image, "runtime image missing; building it from the embedded Dockerfile");
        let args = HashMap::from([("BASE_IMAGE".to_string(), self.config.base_image.clone())]);
        self.engine
            .build_image(image, RUNTIME_DOCKERFILE, args)
            .await
            .map_err(|e| {
                tracing::error!(image, error = %e, "building the runtime image failed");
                SandboxError::ImageMissing {
                    image: image.to_string(),
                    command: format!("{command} (building it here failed: {e})"),
                }
            })?;
        tracing::info!(image, "runtime image built");
        Ok(())
    }

    /// One sandbox, with its container's actual state. A container removed
    /// out of band makes the sandbox unknown; a stopped one is started again.
    pub async fn get(&self, id: &str) -> SandboxResult<SandboxView> {
        let s = self.lookup(id).await?;
        match self.engine.container_running(&s.container).await? {
            Some(true) => Ok(view(&s, "running")),
            Some(false) => {
                self.revive(&s).await?;
                Ok(view(&s, "running"))
            }
            None => {
                self.forget_gone(&s).await;
                Err(SandboxError::NotFound(id.to_string()))
            }
        }
    }

    /// Starts a sandbox's stopped container again (its init was killed, the
    /// engine restarted); a container that is gone makes it unknown.
    pub async fn revive(&self, s: &Arc<Sandbox>) -> SandboxResult<()> {
        s.note_unexpected_stop();
        match self.engine.start_container(&s.container).await {
            Ok(()) => {
                tracing::info!(event = "restarted", sandbox_id = %s.id, session_key = %s.session_key, "stopped container started again");
                crate::telemetry::sandbox_event("restarted");
                Ok(())
            }
            Err(EngineError::NotFound(_)) => {
                self.forget_gone(s).await;
                Err(SandboxError::NotFound(s.id.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Starts a process in the sandbox. A container removed out of band
    /// makes the sandbox unknown (404); a stopped one (its init died, the
    /// engine restarted) is started again and the exec tried once more.
    pub async fn exec(&self, s: &Arc<Sandbox>, req: &ExecRequest) -> SandboxResult<ExecSession> {
        let result = match self.engine.exec(&s.container, req).await {
            Ok(session) => Ok(session),
            Err(EngineError::NotFound(_)) => {
                self.forget_gone(s).await;
                Err(SandboxError::NotFound(s.id.clone()))
            }
            Err(EngineError::Conflict(_)) => match self.revive(s).await {
                Ok(()) => self
                    .engine
                    .exec(&s.container, req)
                    .await
                    .map_err(Into::into),
                Err(e) => Err(e),
            },
            Err(e) => Err(e.into()),
        };
        // Stopped (or expired, or evicted) while we were at it: the sandbox
        // is gone, whatever the engine said about its container.
        match result {
            Err(SandboxError::Engine(_) | SandboxError::EngineUnavailable(_))
                if self.registry.get(&s.id).is_none() =>
            {
                Err(SandboxError::NotFound(s.id.clone()))
            }
            other => other,
        }
    }

    /// A sandbox whose container vanished out of band: drop it and its volume.
    pub async fn forget_gone(&self, s: &Arc<Sandbox>) {
        let _key = self.registry.lock_key(&s.session_key).await;
        if self.registry.remove(&s.id).is_some() {
            self.remove_objects(&s.id, Removal::Removed, Some(s)).await;
        }
    }

    /// Every sandbox of this instance.
    pub async fn list(&self) -> SandboxResult<Vec<SandboxView>> {
        self.ensure_ready().await?;
        Ok(self
            .registry
            .list()
            .iter()
            .map(|s| view(s, "running"))
            .collect())
    }

    /// Removes a sandbox's container, proxies and volume. Idempotent: an
    /// unknown id is fine, and engine leftovers of a known-format id are
    /// swept too, so a retried stop finishes what a failed one started.
    pub async fn stop(&self, id: &str) -> SandboxResult<()> {
        if !is_sandbox_id(id) {
            return Ok(());
        }
        self.ensure_ready().await?;
        let known = self.registry.get(id);
        let _key = match &known {
            Some(s) => Some(self.registry.lock_key(&s.session_key).await),
            None => None,
        };
        let removed = self.registry.remove(id);
        self.remove_objects_checked(id).await?;
        if let Some(s) = removed {
            tracing::info!(event = Removal::Stopped.event(), sandbox_id = %s.id, session_key = %s.session_key, "sandbox stopped");
            crate::telemetry::sandbox_event("stopped");
        }
        Ok(())
    }

    /// Restarts the container: every process ends, the workspace stays.
    pub async fn restart(&self, id: &str) -> SandboxResult<()> {
        let s = self.lookup(id).await?;
        s.note_planned_stop();
        match self
            .engine
            .restart_container(&s.container, RESTART_GRACE)
            .await
        {
            Ok(()) => {
                tracing::info!(event = "restarted", sandbox_id = %s.id, session_key = %s.session_key, "sandbox restarted");
                crate::telemetry::sandbox_event("restarted");
                Ok(())
            }
            Err(EngineError::NotFound(_)) => {
                self.forget_gone(&s).await;
                Err(SandboxError::NotFound(id.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Stops every idle sandbox whose TTL ran out. Rechecks under the key
    /// lock, since a request may have used it in between.
    pub async fn expire_idle(&self) {
        for s in self.registry.expired(now_ms()) {
            let _key = self.registry.lock_key(&s.session_key).await;
            if s.is_busy() || now_ms() < s.expires_at() || self.registry.get(&s.id).is_none() {
                continue;
            }
            self.registry.remove(&s.id);
            self.remove_objects(&s.id, Removal::Expired, Some(&s)).await;
        }
    }

    async fn remove_engine_objects(&self, container: &str, volume: &str) {
        if let Err(e) = self.engine.remove_container(container).await {
            tracing::warn!(container, error = %e, "could not remove container");
        }
        if let Err(e) = self.engine.remove_volume(volume).await {
            tracing::warn!(volume, error = %e, "could not remove volume");
        }
    }

    /// Removes everything of sandbox `id`, logging failures.
    async fn remove_objects(&self, id: &str, why: Removal, s: Option<&Arc<Sandbox>>) {
        if let Err(e) = self.remove_objects_checked(id).await {
            tracing::warn!(sandbox_id = %id, error = %e, "could not remove all engine objects");
        }
        crate::telemetry::sandbox_event(why.event());
        if !matches!(why, Removal::Stopped) {
            let key = s.map(|s| s.session_key.as_str()).unwrap_or("");
            tracing::info!(event = why.event(), sandbox_id = %id, session_key = %key, "sandbox {}", why.event());
        }
    }

    /// Removes proxies, container and volume of `id`, found by label as well
    /// as by name so nothing of ours is left.
    async fn remove_objects_checked(&self, id: &str) -> SandboxResult<()> {
        let inst = self.config.instance.as_str();
        let filter = [(labels::INSTANCE, inst), (labels::SANDBOX_ID, id)];
        let mut containers: BTreeSet<String> = self
            .engine
            .list_containers(&filter)
            .await?
            .into_iter()
            .map(|c| c.name)
            .collect();
        containers.insert(container_name(inst, id));
        for name in &containers {
            self.engine.remove_container(name).await?;
        }
        let mut volumes: BTreeSet<String> = self
            .engine
            .list_volumes(&filter)
            .await?
            .into_iter()
            .map(|v| v.name)
            .collect();
        volumes.insert(volume_name(inst, id));
        for name in &volumes {
            self.engine.remove_volume(name).await?;
        }
        // Link networks, once no container holds them.
        for n in self.engine.list_networks(&filter).await? {
            self.engine.remove_network(&n.name).await?;
        }
        Ok(())
    }

    /// The registry: lookups without touching, for other domain modules.
    pub fn registry(&self) -> &SandboxRegistry {
        &self.registry
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// Lets requests in; called once startup reconciliation is complete.
    pub fn mark_ready(&self) {
        self.ready.send_replace(true);
    }
}
