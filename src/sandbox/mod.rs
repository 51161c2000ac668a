//! Sandboxes: one hardened container and one workspace volume per chat
//! session. [`Sandboxes`] owns their lifecycle (create or reconnect, stop,
//! restart, pause and resume, expire, evict, rehydrate) on top of the pure
//! bookkeeping in [`registry`]; the engine does the container work.

pub mod agent_delivery;
mod agent_link;
pub mod environment;
mod foreground;
mod image;
pub mod labels;
pub mod lifetime;
pub mod metadata;
pub mod network;
mod next_link;
mod pause;
mod pool;
pub mod port_proxy;
mod reaper;
pub mod registry;
mod rehydrate;
pub mod spec;
mod teardown;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::agent_client::AgentError;
use crate::clock::now_ms;
use crate::config::Config;
use crate::engine::{
    ContainerStatus, Engine, EngineError, ExecRequest, ExecSession, SandboxContainer,
};
use crate::field_error::FieldError;
pub use next_link::{RefillAfter, run_next_link};
pub use pool::run_pool;
pub use reaper::run_reaper;
use registry::is_sandbox_id;
pub use registry::{Sandbox, SandboxRegistry};
use spec::{CreateSandboxRequest, NetworkMode, SandboxSpec};
pub use teardown::run_teardown;

/// How long a request waits for startup reconciliation before giving up.
const READY_WAIT: Duration = Duration::from_secs(30);

/// Grace between SIGTERM and SIGKILL when a sandbox restarts.
const RESTART_GRACE: Duration = Duration::from_secs(2);

/// What can go wrong with a sandbox operation.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The request is invalid; names the field.
    #[error(transparent)]
    Invalid(#[from] FieldError),
    /// No sandbox with this id (or its container is gone).
    #[error("no sandbox with id {0:?}")]
    NotFound(String),
    /// Every slot is taken: by a busy sandbox or by a create under way.
    #[error("{}", at_capacity_message(*max, *creating))]
    AtCapacity { max: usize, creating: usize },
    /// `link_subnet_pool` has no free block for another link network.
    #[error("no free /{prefix} left in link_subnet_pool {pool}")]
    NoLinkBlock { prefix: u32, pool: String },
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
    /// No id could be made: the OS random source failed.
    #[error(transparent)]
    Random(#[from] crate::id::RandomUnavailable),
    /// The agent inside the sandbox could not be reached, misbehaved, or
    /// refused.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The sandbox is paused: nothing runs in it until it is resumed.
    #[error("sandbox {0:?} is paused; resume it first")]
    Paused(String),
    /// A resume of a sandbox that is not paused.
    #[error("sandbox {0:?} is not paused")]
    NotPaused(String),
    /// What must survive a restart (a lifetime) could not be saved in the
    /// state directory; nothing changed.
    #[error("{0}")]
    StateWrite(String),
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
#[derive(Debug, Clone)]
pub struct Created {
    pub sandbox_id: String,
    pub created: bool,
    /// The allowlist grew (or the sandbox is new with ports): their proxies
    /// can be prepared.
    pub ports_added: bool,
    /// Held by the work that follows a create on the link network made
    /// ahead: the next one is made once it is all dropped.
    pub next_link_after: Option<Arc<RefillAfter>>,
}

/// A sandbox as it is now: what the API shows of it.
#[derive(Debug, Clone)]
pub struct SandboxInfo {
    pub id: String,
    pub session_key: String,
    pub runtime: String,
    pub created_at: u64,
    pub last_used_at: u64,
    pub idle_ttl_ms: u64,
    pub expires_at: u64,
    pub resources: spec::Resources,
    pub network: NetworkMode,
    pub allow: Vec<String>,
    pub ports: registry::PortState,
    pub running_commands: usize,
    /// Its processes are frozen (see [`Sandboxes::pause`]).
    pub paused: bool,
    pub metadata: metadata::Metadata,
}

impl From<&Sandbox> for SandboxInfo {
    fn from(s: &Sandbox) -> Self {
        SandboxInfo {
            id: s.id.clone(),
            session_key: s.session_key.clone(),
            runtime: s.runtime.clone(),
            created_at: s.created_at,
            last_used_at: s.last_used_at(),
            idle_ttl_ms: s.idle_ttl_ms(),
            expires_at: s.expires_at(),
            resources: s.resources,
            network: s.network,
            allow: s.allow.clone(),
            ports: s.ports(),
            running_commands: s.running_commands(),
            paused: s.is_paused(),
            metadata: s.metadata.clone(),
        }
    }
}

/// A sandbox lifecycle event: one structured log line and one count,
/// always together (`sandboxd_sandbox_events_total{event}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Reconnected,
    /// sandboxd restarted it, or found it stopped and started it again.
    Restarted,
    Stopped,
    Expired,
    Evicted,
    /// Its container was gone or unusable, so sandboxd dropped it.
    Removed,
    Rehydrated,
    Paused,
    Resumed,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Reconnected => "reconnected",
            Event::Restarted => "restarted",
            Event::Stopped => "stopped",
            Event::Expired => "expired",
            Event::Evicted => "evicted",
            Event::Removed => "removed",
            Event::Rehydrated => "rehydrated",
            Event::Paused => "paused",
            Event::Resumed => "resumed",
        }
    }

    fn record(self, sandbox_id: &str, session_key: &str) {
        let event = self.name();
        tracing::info!(event, sandbox_id, session_key, "sandbox {event}");
        crate::telemetry::sandbox_event(event);
    }
}

/// The `created` event, which says whether the sandbox came from the warm
/// pool.
fn record_created(sandbox_id: &str, session_key: &str, from_pool: bool) {
    tracing::info!(
        event = "created",
        sandbox_id,
        session_key,
        from_pool,
        "sandbox created"
    );
    crate::telemetry::sandbox_event("created");
    crate::telemetry::pool_claim(from_pool);
}

/// What a 429 says: which work holds the slots, so that a client in a
/// burst of creates is not told its peers' sandboxes run commands.
fn at_capacity_message(max: usize, creating: usize) -> String {
    if creating == 0 {
        format!(
            "all {max} sandboxes are busy (running commands, or paused) or kept until their \
             end time; try again when one finishes"
        )
    } else {
        format!(
            "all {max} sandbox slots are taken: {} by sandboxes that are busy or kept until \
             their end time and {creating} by creates still under way; try again in a moment",
            max.saturating_sub(creating)
        )
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
    /// One check-and-create of the bridge network at a time.
    network_create: tokio::sync::Mutex<()>,
    /// The agent volume holds this agent (checked once per process).
    agent_volume_ready: tokio::sync::Mutex<bool>,
    /// Image -> whether it has a workspace directory of the sandbox user.
    workspace_owned: dashmap::DashMap<String, bool>,
    /// One start of the shared egress proxy at a time.
    egress_start: tokio::sync::Mutex<()>,
    /// Creates a request waits for: background engine work yields to them.
    foreground: foreground::Foreground,
    /// Warm sandboxes no session has claimed yet.
    pool: pool::Pool,
    /// The next `internet` sandboxes' link networks, made ahead.
    next_link: next_link::NextLinks,
    /// Volumes and link networks of removed sandboxes, still to go.
    teardown: teardown::Teardowns,
    /// Where the sandboxes' lifetimes are kept across restarts.
    lifetimes: lifetime::LifetimeFile,
}

impl Sandboxes {
    pub fn new(config: Arc<Config>, engine: Engine) -> Self {
        let lifetimes = lifetime::LifetimeFile::in_dir(config.state_dir());
        let next_link = next_link::NextLinks::new(config.links_ahead);
        Sandboxes {
            registry: SandboxRegistry::new(config.max_concurrent),
            config,
            engine,
            ready: watch::channel(false).0,
            image_build: tokio::sync::Mutex::new(()),
            network_ready: AtomicBool::new(false),
            network_create: tokio::sync::Mutex::new(()),
            agent_volume_ready: tokio::sync::Mutex::new(false),
            workspace_owned: dashmap::DashMap::new(),
            egress_start: tokio::sync::Mutex::new(()),
            foreground: foreground::Foreground::default(),
            pool: pool::Pool::default(),
            next_link,
            teardown: teardown::Teardowns::default(),
            lifetimes,
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

    /// A registered sandbox that is not paused, counted as used: what
    /// every command, file, terminal and port call starts with.
    pub async fn lookup(&self, id: &str) -> SandboxResult<Arc<Sandbox>> {
        let s = self.lookup_any(id).await?;
        if s.is_paused() {
            return Err(SandboxError::Paused(s.id.clone()));
        }
        Ok(s)
    }

    /// A registered sandbox, paused or not, counted as used: for calls
    /// that need none of its processes (a fork reads only its checkpoints,
    /// which are kept outside it).
    pub async fn lookup_any(&self, id: &str) -> SandboxResult<Arc<Sandbox>> {
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

        // Counted before the claim, so a burst's cold creates are counted
        // before the refill its first claims wake could start.
        let _under_way = self.foreground.enter();
        let mut reservation = self
            .registry
            .reserve()
            .map_err(|e| SandboxError::AtCapacity {
                max: e.max,
                creating: e.creating,
            })?;
        if let Some(victim) = reservation.evicted.take() {
            self.remove_objects(&victim.id, Event::Evicted, Some(&victim))
                .await;
        }

        if let Some(sandbox) = self.claim(&spec).await {
            return Ok(self.register_new(reservation, sandbox, &spec, create_started, true));
        }
        self.make_room_for_session().await;
        self.wait_for_teardowns().await;

        // The link network made ahead is for the default mode's sandboxes;
        // one that fails to launch on it is made again without it.
        let mut prepared = (spec.network == NetworkMode::Internet)
            .then(|| self.next_link.take())
            .flatten();
        let refill = prepared.is_some().then(|| self.next_link.refill_after());
        let cold_started = std::time::Instant::now();
        loop {
            let id = prepared
                .as_ref()
                .map(|p| p.id.clone())
                .map_or_else(registry::new_sandbox_id, Ok)?;
            match self
                .create_cold(&spec, &id, prepared.as_ref().map(|p| p.subnet.as_str()))
                .await
            {
                Ok(sandbox) => {
                    self.pool.cold_took(cold_started.elapsed());
                    let created =
                        self.register_new(reservation, sandbox, &spec, create_started, false);
                    return Ok(Created {
                        next_link_after: refill,
                        ..created
                    });
                }
                Err(e) if prepared.take().is_some() => {
                    tracing::warn!(sandbox_id = %id, error = %e, "create on the prepared link network failed; trying a new one");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Registers a sandbox just made (or claimed, `from_pool`) for
    /// `spec`'s session and records the create.
    fn register_new(
        &self,
        reservation: registry::Reservation<'_>,
        sandbox: Arc<Sandbox>,
        spec: &SandboxSpec,
        started: std::time::Instant,
        from_pool: bool,
    ) -> Created {
        let id = sandbox.id.clone();
        self.registry.insert(reservation, sandbox);
        record_created(&id, &spec.session_key, from_pool);
        crate::telemetry::create_took(started);
        Created {
            sandbox_id: id,
            created: true,
            ports_added: !spec.ports.is_empty(),
            next_link_after: None,
        }
    }

    /// Makes, launches and returns a new sandbox `id` for `spec`
    /// (registered by the caller); on failure leaves nothing behind.
    /// `link` is the subnet of its link network when that was made ahead.
    async fn create_cold(
        &self,
        spec: &SandboxSpec,
        id: &str,
        link: Option<&str>,
    ) -> SandboxResult<Arc<Sandbox>> {
        let id = id.to_string();
        let record = labels::SandboxRecord {
            id: id.clone(),
            session_key: spec.session_key.clone(),
            runtime: spec.runtime.clone(),
            created_at: now_ms(),
            idle_ttl_ms: spec.idle_ttl_ms.unwrap_or(
                u64::try_from(self.config.default_idle_ttl.as_millis()).unwrap_or(u64::MAX),
            ),
            resources: spec.resources,
            network: spec.network,
            allow: spec.allow.clone(),
            ports: spec.ports.clone(),
            metadata: spec.metadata.clone(),
            env: spec.env.clone(),
        };
        let sandbox = Arc::new(Sandbox::from_record(
            &self.config.instance,
            &record,
            now_ms(),
        ));
        let labels = labels::encode(&self.config.instance, &record);
        if let Err(e) = self.launch(&sandbox, spec, labels, link).await {
            // Leave nothing half-made behind.
            if let Err(e) = self.remove_objects_checked(&id).await {
                tracing::warn!(sandbox_id = %id, error = %e, "could not remove all engine objects");
            }
            tracing::warn!(sandbox_id = %id, session_key = %spec.session_key, error = %e, "create failed; cleaned up");
            return Err(e);
        }
        Ok(sandbox)
    }

    /// Reuses `existing` if its container can run; `None` means it is gone
    /// and a new one must be made.
    async fn reconnect(
        &self,
        existing: &Arc<Sandbox>,
        spec: &SandboxSpec,
    ) -> SandboxResult<Option<Created>> {
        let healthy = match self.engine.container_status(&existing.container).await? {
            Some(st) if st.running => true,
            Some(st) => {
                existing.note_unexpected_stop(self.stopped_by_memory(existing, Some(&st)).await);
                self.engine
                    .start_container(&existing.container)
                    .await
                    .is_ok()
            }
            None => false,
        };
        if !healthy {
            self.registry.remove(&existing.id);
            self.remove_objects(&existing.id, Event::Removed, Some(existing))
                .await;
            return Ok(None);
        }
        let allowed_before = existing.ports().allowed.len();
        existing
            .allow_ports(&spec.ports, self.config.max_ports)
            .map_err(|n| {
                SandboxError::Invalid(FieldError::new(
                    "ports",
                    format!(
                        "at most {} ports per sandbox (this would make {n})",
                        self.config.max_ports
                    ),
                ))
            })?;
        let allowed_after = existing.ports().allowed.len();
        if let Some(ttl) = spec.idle_ttl_ms {
            existing.set_idle_ttl_ms(ttl);
        }
        self.registry.touch(existing);
        Event::Reconnected.record(&existing.id, &existing.session_key);
        Ok(Some(Created {
            sandbox_id: existing.id.clone(),
            created: false,
            ports_added: allowed_after > allowed_before,
            next_link_after: None,
        }))
    }

    /// Makes and starts the sandbox's objects: its volume and container
    /// (both labelled `labels`), its link network and way out.
    async fn launch(
        &self,
        sandbox: &Sandbox,
        spec: &SandboxSpec,
        labels: HashMap<String, String>,
        prepared_link: Option<&str>,
    ) -> SandboxResult<()> {
        let needs_owner = self.prepare_image(&spec.image).await?;
        if spec.network != NetworkMode::None && !self.network_ready.load(Ordering::Relaxed) {
            // Sandboxes in mode open join it; egress and port proxies
            // reach out or publish through it.
            self.ensure_network().await?;
        }
        // The link network's block and the volume do not depend on each
        // other.
        let volume_labels = labels.clone();
        let (plan, volume) = tokio::join!(
            self.plan_link(&sandbox.id, spec.network, prepared_link),
            self.create_workspace_volume(&sandbox.volume, volume_labels.clone())
        );
        let plan = plan?;
        volume?;
        let planned = plan.as_ref().map(network::Link::subnet);
        let container_on = |subnet: Option<&str>| {
            self.container_for(
                sandbox,
                spec.image.clone(),
                spec.oci_runtime.clone(),
                labels.clone(),
                needs_owner,
                subnet,
            )
        };
        let container = container_on(planned);
        let made = async {
            // A tmpfs workspace is owned by the sandbox user through its
            // mount options, and would forget whatever a container that is
            // removed again put into it.
            if needs_owner && self.config.workspace_tmpfs_mb == 0 {
                // The image has no workspace of the sandbox user: the new
                // volume's root (the engine's, root's) is given to it.
                let (uid, gid) = self.config.sandbox_uid_gid();
                self.engine
                    .fill_volume(
                        &sandbox.volume,
                        &spec.image,
                        volume_labels,
                        &[crate::engine::Entry::Dir { path: "", uid, gid }],
                    )
                    .await?;
            }
            Ok::<_, SandboxError>(self.engine.create_container(&container).await)
        };
        // Both end before either's failure is returned: the caller's
        // cleanup finds all there is.
        let (link, made) = tokio::join!(self.make_planned_link(&sandbox.id, plan.as_ref()), made);
        let link = link?;
        let again = match made? {
            Ok(()) => link.as_deref() != planned,
            // An engine that looks the network up at create (this one does
            // at the start).
            Err(EngineError::NotFound(_)) if matches!(plan, Some(network::Link::Planned(_))) => {
                true
            }
            Err(e) => return Err(e.into()),
        };
        let container = if again {
            // Made again on the network as it is: its block was taken
            // meanwhile (the proxy address in its environment is another
            // block's), or the engine wanted the network first.
            self.engine.remove_container(&container.name).await?;
            let container = container_on(link.as_deref());
            self.engine.create_container(&container).await?;
            container
        } else {
            container
        };
        let Some(subnet) = link else {
            return self
                .start_attached(sandbox, &container, spec.network == NetworkMode::Open)
                .await;
        };
        // The way out is ready by the time the create answers: the first
        // `pip install` must not race it. (On a link network made ahead the
        // shared proxy has joined already, and this only checks.)
        let (started, attached) = tokio::join!(
            self.start_attached(sandbox, &container, false),
            self.attach_egress(&sandbox.id, spec.network, &spec.allow, &subnet)
        );
        started?;
        attached?;
        sandbox.set_linked(subnet);
        Ok(())
    }

    /// Creates a sandbox's workspace volume: a tmpfs of the sandbox user
    /// when `workspace_tmpfs_mb` is set, else a volume of the engine's
    /// disk, limited to `workspace_size_mb` when that is set.
    async fn create_workspace_volume(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> SandboxResult<()> {
        match self.config.workspace_tmpfs_mb {
            0 => {
                self.engine
                    .create_volume(name, self.config.workspace_size_mb, labels)
                    .await?
            }
            mb => {
                self.engine
                    .create_tmpfs_volume(name, mb, self.config.sandbox_uid_gid(), labels)
                    .await?
            }
        }
        Ok(())
    }

    /// Replaces a sandbox's container with one that runs this sandboxd's
    /// agent (it was made by another version); the workspace stays, the
    /// processes in the old container end.
    pub(super) async fn recreate(&self, record: &labels::SandboxRecord) -> SandboxResult<()> {
        let (image, oci_runtime) = self.config.runtime(&record.runtime).ok_or_else(|| {
            SandboxError::Invalid(FieldError::new(
                "runtime",
                format!("runtime {:?} is no longer configured", record.runtime),
            ))
        })?;
        let needs_owner = self.prepare_image(&image).await?;
        let sandbox = Sandbox::from_record(&self.config.instance, record, now_ms());
        let link = if record.network.through_egress() {
            Some(self.link_network(&record.id).await?)
        } else {
            None
        };
        let container = self.container_for(
            &sandbox,
            image,
            oci_runtime,
            labels::encode(&self.config.instance, record),
            needs_owner,
            link.as_deref(),
        );
        self.engine.remove_container(&container.name).await?;
        let open = record.network == NetworkMode::Open;
        if open {
            self.ensure_network().await?;
        }
        self.engine.create_container(&container).await?;
        self.start_container(&container, open).await
    }

    /// The container of a sandbox: its image and OCI runtime, its labels,
    /// everything else from the configuration, and this sandboxd's agent.
    fn container_for(
        &self,
        sandbox: &Sandbox,
        image: String,
        oci_runtime: Option<String>,
        mut labels: HashMap<String, String>,
        workspace_nocopy: bool,
        link_subnet: Option<&str>,
    ) -> SandboxContainer {
        let egress = link_subnet.and_then(network::egress_address);
        labels.insert(labels::AGENT.into(), agent_delivery::AGENT_VERSION.into());
        SandboxContainer {
            name: sandbox.container.clone(),
            image,
            oci_runtime,
            user: self.config.sandbox_user.clone(),
            workspace_dir: self.config.workspace_dir.clone(),
            workspace_aliases: self
                .config
                .workspace_dirs()
                .skip(1)
                .map(str::to_string)
                .collect(),
            volume: sandbox.volume.clone(),
            workspace_nocopy,
            agent_volume: agent_delivery::agent_volume(&self.config.instance),
            agent_dir: agent_delivery::AGENT_DIR.into(),
            command: agent_delivery::agent_command(),
            network: match sandbox.network {
                NetworkMode::Open => Some(self.config.network_name().to_string()),
                NetworkMode::Internet | NetworkMode::Allowlist => {
                    Some(network::link_name(&self.config.instance, &sandbox.id))
                }
                NetworkMode::None => None,
            },
            network_aliases: if link_subnet.is_some() {
                vec![network::LINK_ALIAS.to_string()]
            } else {
                Vec::new()
            },
            env: egress.map(network::proxy_env).unwrap_or_default(),
            vcpus: sandbox.resources.vcpus,
            memory_mb: sandbox.resources.memory_mb,
            pids_limit: self.config.pids_limit,
            tmp_size_mb: self.config.tmp_size_mb,
            file_size_limit_mb: self.config.file_size_limit_mb,
            labels,
        }
    }

    /// Starts a created container; a network removed out of band (a 404
    /// from start) is made again and the start tried once more.
    async fn start_container(
        &self,
        container: &SandboxContainer,
        networked: bool,
    ) -> SandboxResult<()> {
        match self.engine.start_container(&container.name).await {
            Err(EngineError::NotFound(msg)) if networked => {
                tracing::info!(reason = %msg, "container start needs the network again");
                self.ensure_network().await?;
                self.engine.start_container(&container.name).await?;
            }
            other => other?,
        }
        Ok(())
    }

    /// Starts a new sandbox's container and, meanwhile, attaches to its
    /// agent's stdio: the first connection to the agent is made of that,
    /// with no exec. Without it (the attach failed) the connection is made
    /// the usual way, through a bridge.
    async fn start_attached(
        &self,
        sandbox: &Sandbox,
        container: &SandboxContainer,
        networked: bool,
    ) -> SandboxResult<()> {
        let (started, attached) = tokio::join!(
            self.start_container(container, networked),
            self.engine.attach(&container.name)
        );
        match attached {
            Ok(session) => sandbox.set_stdio(session),
            Err(e) => {
                tracing::debug!(sandbox_id = %sandbox.id, error = %e, "could not attach to the agent's stdio");
            }
        }
        started
    }

    async fn ensure_network(&self) -> SandboxResult<()> {
        // One at a time: this engine makes a second network of the same
        // name for a concurrent create (API 1.41 checks no duplicates).
        let _one = self.network_create.lock().await;
        let labels = labels::instance_only(&self.config.instance);
        self.engine
            .ensure_network(self.config.network_name(), labels)
            .await?;
        self.network_ready.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// One sandbox, with its container's actual state. A container removed
    /// out of band makes the sandbox unknown; a stopped one is started again.
    pub async fn get(&self, id: &str) -> SandboxResult<SandboxInfo> {
        let s = self.lookup_any(id).await?;
        match self.engine.container_status(&s.container).await? {
            Some(st) if st.running => Ok(SandboxInfo::from(&*s)),
            Some(st) => {
                self.revive(&s, Some(&st)).await?;
                Ok(SandboxInfo::from(&*s))
            }
            None => {
                self.forget_gone(&s).await;
                Err(SandboxError::NotFound(id.to_string()))
            }
        }
    }

    /// Starts a sandbox's stopped container again (its init was killed, the
    /// engine restarted); a container that is gone makes it unknown.
    /// `status`: the stopped container's state, when the caller has asked
    /// the engine already. Whether the memory limit stopped it is
    /// recorded: starting the container clears what the engine says about
    /// that, and a command that ran in it must still be told.
    pub async fn revive(
        &self,
        s: &Arc<Sandbox>,
        status: Option<&ContainerStatus>,
    ) -> SandboxResult<()> {
        s.note_unexpected_stop(self.stopped_by_memory(s, status).await);
        match self.engine.start_container(&s.container).await {
            Ok(()) => {
                Event::Restarted.record(&s.id, &s.session_key);
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
            Err(EngineError::Conflict(_)) => match self.revive(s, None).await {
                Ok(()) => self
                    .engine
                    .exec(&s.container, req)
                    .await
                    .map_err(Into::into),
                Err(e) => Err(e),
            },
            Err(e) => Err(e.into()),
        };
        result.map_err(|e| match e {
            SandboxError::Engine(_) | SandboxError::EngineUnavailable(_) => self.gone_or(s, e),
            other => other,
        })
    }

    /// Whether the memory limit stopped `s`'s container; `status` is its
    /// state when the caller has it already.
    pub async fn stopped_by_memory(&self, s: &Sandbox, status: Option<&ContainerStatus>) -> bool {
        match status {
            Some(st) => self.engine.stopped_by_memory(&s.container, st).await,
            None => match self.engine.container_status(&s.container).await {
                Ok(Some(st)) => self.engine.stopped_by_memory(&s.container, &st).await,
                _ => false,
            },
        }
    }

    /// The state of a sandbox's container, `None` when it is gone.
    pub async fn container_status(&self, s: &Sandbox) -> SandboxResult<Option<ContainerStatus>> {
        Ok(self.engine.container_status(&s.container).await?)
    }

    /// Whether the sandbox runs under gVisor.
    pub async fn under_gvisor(&self, s: &Sandbox) -> bool {
        let oci_runtime = self.config.runtime(&s.runtime).and_then(|(_, rt)| rt);
        self.engine.is_gvisor(oci_runtime.as_deref()).await
    }

    /// Where the host holds `s`'s workspace, when sandboxd may read its
    /// files there (see [`crate::engine::Engine::volume_host_dir`]); a
    /// failure to ask is `None`: the agent reads them instead.
    pub async fn workspace_host_dir(&self, s: &Sandbox) -> Option<std::path::PathBuf> {
        let oci_runtime = self.config.runtime(&s.runtime).and_then(|(_, rt)| rt);
        match (self.engine)
            .volume_host_dir(&s.volume, oci_runtime.as_deref())
            .await
        {
            Ok(dir) => dir.map(std::path::PathBuf::from),
            Err(e) => {
                tracing::debug!(sandbox = %s.id, error = %e, "no host directory for the workspace");
                None
            }
        }
    }

    /// What a failure on `s` means: a sandbox stopped (or expired, or
    /// evicted) while the work was under way is gone, whatever the engine
    /// said about its container.
    pub fn gone_or<E: From<SandboxError>>(&self, s: &Sandbox, e: E) -> E {
        if self.registry.get(&s.id).is_none() {
            SandboxError::NotFound(s.id.clone()).into()
        } else {
            e
        }
    }

    /// A sandbox whose container vanished out of band: drop it and its volume.
    pub async fn forget_gone(&self, s: &Arc<Sandbox>) {
        let _key = self.registry.lock_key(&s.session_key).await;
        if self.registry.remove(&s.id).is_some() {
            self.remove_objects(&s.id, Event::Removed, Some(s)).await;
        }
    }

    /// Every sandbox of this instance.
    pub async fn list(&self) -> SandboxResult<Vec<SandboxInfo>> {
        self.list_matching(&metadata::Metadata::new()).await
    }

    /// The sandboxes of this instance whose metadata holds every pair of
    /// `wanted`.
    pub async fn list_matching(
        &self,
        wanted: &metadata::Metadata,
    ) -> SandboxResult<Vec<SandboxInfo>> {
        self.ensure_ready().await?;
        Ok(self
            .registry
            .list()
            .iter()
            .filter(|s| metadata::matches(&s.metadata, wanted))
            .map(|s| SandboxInfo::from(&**s))
            .collect())
    }

    /// Removes a sandbox: answers once its containers (its own and its
    /// proxies) are gone; its volumes and link network go right after, in
    /// the background (see `teardown`). Idempotent: an unknown id is fine,
    /// and engine leftovers of a known-format id are removed before the
    /// answer, so a retried stop finishes what an earlier one left.
    pub async fn stop(&self, id: &str) -> SandboxResult<()> {
        if !is_sandbox_id(id) {
            return Ok(());
        }
        self.ensure_ready().await?;
        // Background engine work waits while the stop runs (see
        // `foreground`).
        let _under_way = self.foreground.enter();
        let known = self.registry.get(id);
        let _key = match &known {
            Some(s) => Some(self.registry.lock_key(&s.session_key).await),
            None => None,
        };
        let Some(s) = self.registry.remove(id) else {
            return self.finish_teardown(id).await;
        };
        self.thaw_for_removal(&s).await;
        self.remove_containers_then_queue(id).await?;
        Event::Stopped.record(&s.id, &s.session_key);
        self.pool.wake();
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
                Event::Restarted.record(&s.id, &s.session_key);
                Ok(())
            }
            Err(EngineError::NotFound(_)) => {
                self.forget_gone(&s).await;
                Err(SandboxError::NotFound(id.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Stops every idle sandbox whose TTL ran out, and ends those whose
    /// lifetime did (see `lifetime`). Rechecks under the key lock, since a
    /// request may have used it in between.
    pub async fn expire_idle(&self) {
        for s in self.registry.expired(now_ms()) {
            if s.lifetime().is_some() {
                self.end_lifetime(&s).await;
                continue;
            }
            let _key = self.registry.lock_key(&s.session_key).await;
            if !s.is_due(now_ms()) || self.registry.get(&s.id).is_none() {
                continue;
            }
            self.registry.remove(&s.id);
            self.remove_objects(&s.id, Event::Expired, Some(&s)).await;
        }
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

#[cfg(test)]
mod tests {
    use super::at_capacity_message;

    #[test]
    fn a_429_names_creates_under_way_when_they_hold_slots() {
        assert_eq!(
            at_capacity_message(4, 0),
            "all 4 sandboxes are busy (running commands, or paused) or kept until their end \
             time; try again when one finishes"
        );
        let m = at_capacity_message(4, 3);
        assert!(m.contains("1 by sandboxes that are busy or kept"), "{m}");
        assert!(m.contains("3 by creates still under way"), "{m}");
    }
}
