//! `App`: what every handler shares, behind one `Arc`, and the operations
//! that span domain services (a create that publishes its ports
//! afterwards, a resume that finds the commands of the sandbox again, a
//! restore of a checkpoint that ends the sandbox's commands first).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::checkpoints::{CheckpointError, CheckpointResult, Checkpoints, Diff};
use crate::command::{CommandError, Commands};
use crate::config::Config;
use crate::engine::Engine;
use crate::files::Files;
use crate::ports::Ports;
use crate::pty::Ptys;
use crate::sandbox::lifetime::LifetimeChange;
use crate::sandbox::spec::CreateSandboxRequest;
use crate::sandbox::{Created, SandboxResult, Sandboxes};
use crate::session_tokens::SessionTokens;

/// How long a restore that ends the sandbox's commands waits for their
/// trees to be gone, past the grace period their SIGTERM gives them.
const ENDING_AT_MOST: Duration = Duration::from_secs(10);
/// How often it looks.
const ENDING_POLL: Duration = Duration::from_millis(50);

/// A command operation that failed under a restore.
fn command_failure(e: CommandError) -> CheckpointError {
    match e {
        CommandError::Sandbox(inner) => CheckpointError::Sandbox(inner),
        other => CheckpointError::CommandsRunning(other.to_string()),
    }
}

/// Shared state: configuration, the engine handle and the domain services.
#[derive(Debug)]
pub struct App {
    pub config: Arc<Config>,
    pub engine: Engine,
    pub sandboxes: Arc<Sandboxes>,
    pub commands: Arc<Commands>,
    pub files: Files,
    pub checkpoints: Checkpoints,
    pub ports: Arc<Ports>,
    pub ptys: Arc<Ptys>,
    /// Session tokens; read from the state directory by `server::run`
    /// before the first request.
    pub session_tokens: Arc<SessionTokens>,
    /// Cancelled on SIGTERM: background tasks and long requests end.
    pub shutdown: CancellationToken,
    /// Work that outlives the request that started it; the server waits
    /// for it on shutdown.
    pub tasks: TaskTracker,
    /// Renders `/metrics`; None when no recorder is installed (tests).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl App {
    /// Wires the services together; connects to nothing yet.
    pub fn new(config: Config) -> Arc<App> {
        Self::with_metrics(config, None)
    }

    /// As `new`, rendering `/metrics` from `metrics`.
    pub fn with_metrics(
        config: Config,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> Arc<App> {
        let config = Arc::new(config);
        let engine = Engine::new();
        let sandboxes = Arc::new(Sandboxes::new(Arc::clone(&config), engine.clone()));
        let commands = Arc::new(Commands::new(Arc::clone(&config), Arc::clone(&sandboxes)));
        let files = Files::new(Arc::clone(&config), Arc::clone(&sandboxes));
        let checkpoints = Checkpoints::new(Arc::clone(&config), Arc::clone(&sandboxes));
        let ports = Arc::new(Ports::new(Arc::clone(&config), Arc::clone(&sandboxes)));
        let shutdown = CancellationToken::new();
        let ptys = Arc::new(Ptys::new(
            Arc::clone(&config),
            Arc::clone(&sandboxes),
            shutdown.clone(),
        ));
        let session_tokens = Arc::new(SessionTokens::new(&config));
        Arc::new(App {
            config,
            engine,
            sandboxes,
            commands,
            files,
            checkpoints,
            ports,
            ptys,
            session_tokens,
            shutdown,
            tasks: TaskTracker::new(),
            metrics,
        })
    }

    /// The engine's version, within two seconds, or why there is none.
    pub async fn engine_version(&self) -> Result<String, String> {
        self.engine.version().await.map_err(|e| e.to_string())
    }

    /// Thaws a paused sandbox (see [`Sandboxes::resume`]), then lists the
    /// commands its agent holds that sandboxd does not know yet (sandboxd
    /// restarted while it was paused, and could not ask then).
    pub async fn resume_sandbox(&self, id: &str) -> SandboxResult<()> {
        self.sandboxes.resume(id).await?;
        self.commands.discover_sandbox(id).await;
        Ok(())
    }

    /// E2B's connect: a paused sandbox is resumed (see
    /// [`resume_sandbox`](App::resume_sandbox)) and its lifetime renewed
    /// for `length_ms`; a running one's lifetime is lengthened to
    /// `length_ms` from now if that is later. `None` changes no lifetime.
    pub async fn connect_sandbox(
        &self,
        id: &str,
        paused: bool,
        length_ms: Option<u64>,
    ) -> SandboxResult<()> {
        if paused {
            self.resume_sandbox(id).await?;
        }
        let Some(length_ms) = length_ms else {
            return Ok(());
        };
        let change = if paused {
            LifetimeChange::Renew { length_ms }
        } else {
            LifetimeChange::Lengthen { length_ms }
        };
        self.sandboxes.change_lifetime(id, change).await
    }

    /// Makes the sandbox's workspace exactly a checkpoint's (see
    /// [`Checkpoints::restore`]). Commands that run (or processes a
    /// finished one left) could write into it meanwhile: the restore is
    /// refused while there are any, unless `end_commands`, which ends
    /// their process trees first and waits (a bounded time) until none is
    /// left.
    pub async fn restore_checkpoint(
        &self,
        sandbox_id: &str,
        checkpoint_id: &str,
        end_commands: bool,
    ) -> CheckpointResult<Diff> {
        let running = self.running_commands(sandbox_id).await?;
        if !running.is_empty() {
            if !end_commands {
                return Err(CheckpointError::CommandsRunning(format!(
                    "{} command(s) run in the sandbox ({}); end them, or restore with endCommands: true",
                    running.len(),
                    running.join(", ")
                )));
            }
            for id in &running {
                self.commands
                    .kill(sandbox_id, id)
                    .await
                    .map_err(command_failure)?;
            }
            let deadline = Instant::now() + self.config.kill_grace + ENDING_AT_MOST;
            while !self.running_commands(sandbox_id).await?.is_empty() {
                if Instant::now() >= deadline {
                    return Err(CheckpointError::CommandsRunning(
                        "the sandbox's commands did not end in time; nothing was restored".into(),
                    ));
                }
                tokio::time::sleep(ENDING_POLL).await;
            }
        }
        self.checkpoints.restore(sandbox_id, checkpoint_id).await
    }

    /// The ids of the sandbox's commands that run or left processes.
    async fn running_commands(&self, sandbox_id: &str) -> CheckpointResult<Vec<String>> {
        let listed = self
            .commands
            .list(sandbox_id)
            .await
            .map_err(command_failure)?;
        Ok(listed
            .into_iter()
            .filter(|l| l.command.finished().is_none() || l.processes.unwrap_or(0) > 0)
            .map(|l| l.command.id.clone())
            .collect())
    }

    /// [`create_sandbox`](App::create_sandbox), then gives the sandbox a
    /// lifetime (E2B's `timeout`, see `sandbox::lifetime`). A new sandbox
    /// whose lifetime cannot be saved is half-made, and stopped again.
    pub async fn create_sandbox_with_lifetime(
        &self,
        req: CreateSandboxRequest,
        lifetime: LifetimeChange,
    ) -> SandboxResult<Created> {
        let created = self.create_sandbox(req).await?;
        let id = &created.sandbox_id;
        if let Err(e) = self.sandboxes.change_lifetime(id, lifetime).await {
            if created.created
                && let Err(stop) = self.sandboxes.stop(id).await
            {
                tracing::warn!(sandbox_id = %id, error = %stop, "stopping a sandbox whose lifetime was not saved failed");
            }
            return Err(e);
        }
        Ok(created)
    }

    /// Creates a sandbox (or reconnects to the session's), then connects to
    /// its agent and publishes its allowlisted ports in the background: the
    /// answer does not wait, and the first command and the first
    /// `GET …/ports/{port}` find the work done.
    pub async fn create_sandbox(&self, req: CreateSandboxRequest) -> SandboxResult<Created> {
        let mut created = self.sandboxes.create(req).await?;
        // The next link network is made once this work is done.
        let next_link_after = created.next_link_after.take();
        if created.created {
            // Connect to the new sandbox's agent now: its first command
            // then finds the connection made.
            let sandboxes = Arc::clone(&self.sandboxes);
            let id = created.sandbox_id.clone();
            let shutdown = self.shutdown.clone();
            let after = next_link_after.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    _ = sandboxes.warm_agent(&id) => {}
                    _ = shutdown.cancelled() => {}
                }
                drop(after);
            });
        }
        // Then a new sandbox gives back the spare port proxy its ports did
        // not take, a little later (see `sandbox::port_proxy`).
        if created.ports_added || created.created {
            let (ports, sandboxes) = (Arc::clone(&self.ports), Arc::clone(&self.sandboxes));
            let id = created.sandbox_id.clone();
            let shutdown = self.shutdown.clone();
            let after = next_link_after.clone();
            let give_back = created.created;
            self.tasks.spawn(async move {
                let work = async {
                    ports.prepare(&id).await;
                    drop(after);
                    if give_back {
                        sandboxes.give_back_spare_proxy(&id).await;
                    }
                };
                tokio::select! {
                    _ = work => {}
                    _ = shutdown.cancelled() => {}
                }
            });
        }
        Ok(created)
    }
}
