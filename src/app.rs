//! `App`: what every handler shares, behind one `Arc`, and the operations
//! that span domain services (a command that starts after a checkpoint of
//! the workspace, a create that publishes its ports
//! afterwards, a resume that finds the commands of the sandbox again, a
//! restore of a checkpoint that ends the sandbox's commands and terminal
//! sessions first).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::checkpoints::{CheckpointError, CheckpointInfo, CheckpointResult, Checkpoints, Diff};
use crate::command::spec::{CommandRequest, CommandSpec};
use crate::command::{Command, CommandError, Commands, RunResult};
use crate::config::Config;
use crate::engine::Engine;
use crate::field_error::FieldError;
use crate::files::Files;
use crate::ports::Ports;
use crate::pty::{PtyError, Ptys};
use crate::sandbox::lifetime::LifetimeChange;
use crate::sandbox::spec::{CreateSandboxRequest, ForkSource};
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

/// Why a command with a checkpoint (`checkpoint` in its request) failed:
/// the checkpoint was refused, or the command.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Command(#[from] CommandError),
}

/// A terminal session operation that failed under a restore.
fn pty_failure(e: PtyError) -> CheckpointError {
    match e {
        PtyError::Sandbox(inner) => CheckpointError::Sandbox(inner),
        other => CheckpointError::CommandsRunning(other.to_string()),
    }
}

/// What runs in a sandbox and could write into its workspace.
enum Work {
    Command(String),
    Pty(String),
}

impl Work {
    fn id(&self) -> &str {
        match self {
            Work::Command(id) | Work::Pty(id) => id,
        }
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
    /// [`Checkpoints::restore`]). Commands and terminal sessions that run
    /// (or processes a finished command left) could write into it
    /// meanwhile: the restore is refused while there are any, unless
    /// `end_commands`, which ends their process trees first and waits (a
    /// bounded time) until none is left.
    pub async fn restore_checkpoint(
        &self,
        sandbox_id: &str,
        checkpoint_id: &str,
        end_commands: bool,
    ) -> CheckpointResult<Diff> {
        let running = self.running_work(sandbox_id).await?;
        if !running.is_empty() {
            if !end_commands {
                return Err(CheckpointError::CommandsRunning(format!(
                    "{} command(s) or terminal session(s) run in the sandbox ({}); end them, or restore with endCommands: true",
                    running.len(),
                    running.iter().map(Work::id).collect::<Vec<_>>().join(", ")
                )));
            }
            for work in &running {
                match work {
                    Work::Command(id) => self
                        .commands
                        .kill(sandbox_id, id)
                        .await
                        .map_err(command_failure)?,
                    Work::Pty(id) => match self.ptys.kill(sandbox_id, id).await {
                        // It ended meanwhile.
                        Ok(()) | Err(PtyError::NotFound(_)) => {}
                        Err(e) => return Err(pty_failure(e)),
                    },
                }
            }
            let deadline = Instant::now() + self.config.kill_grace + ENDING_AT_MOST;
            while !self.running_work(sandbox_id).await?.is_empty() {
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

    /// The sandbox's commands that run or left processes, and its
    /// terminal sessions that run.
    async fn running_work(&self, sandbox_id: &str) -> CheckpointResult<Vec<Work>> {
        let listed = self
            .commands
            .list(sandbox_id)
            .await
            .map_err(command_failure)?;
        let ptys = self.ptys.list(sandbox_id).await.map_err(pty_failure)?;
        let commands = listed
            .into_iter()
            .filter(|l| l.command.finished().is_none() || l.processes.unwrap_or(0) > 0)
            .map(|l| Work::Command(l.command.id.clone()));
        let sessions = ptys
            .into_iter()
            .filter(|p| p.ended.is_none())
            .map(|p| Work::Pty(p.pty_id));
        Ok(commands.chain(sessions).collect())
    }

    /// Starts a command (see [`Commands::start`]); with `checkpoint` in the
    /// request, a checkpoint of that label is taken just before.
    pub async fn start_command(
        &self,
        sandbox_id: &str,
        mut req: CommandRequest,
    ) -> Result<(Arc<Command>, Option<CheckpointInfo>), TurnError> {
        match req.checkpoint.take() {
            None => Ok((self.commands.start(sandbox_id, req).await?, None)),
            Some(label) => {
                let start = move |req| self.commands.start(sandbox_id, req);
                let (cmd, made) = self.checkpoint_then(sandbox_id, req, label, start).await?;
                Ok((cmd, Some(made)))
            }
        }
    }

    /// Runs a command to its end (see [`Commands::run`]); with
    /// `checkpoint` in the request, a checkpoint of that label is taken
    /// just before it starts.
    pub async fn run_command(
        &self,
        sandbox_id: &str,
        mut req: CommandRequest,
    ) -> Result<(RunResult, Option<CheckpointInfo>), TurnError> {
        match req.checkpoint.take() {
            None => Ok((
                self.commands.run(sandbox_id, req, &self.shutdown).await?,
                None,
            )),
            Some(label) => {
                let start = move |req| self.commands.start_run(sandbox_id, req);
                let (cmd, made) = self.checkpoint_then(sandbox_id, req, label, start).await?;
                let ran = self
                    .commands
                    .run_result(sandbox_id, &cmd, &self.shutdown)
                    .await?;
                Ok((ran, Some(made)))
            }
        }
    }

    /// Takes checkpoint `label` of the workspace, then `start`s the
    /// command `req` (checked first, so a request refused for its own
    /// fields takes none). A command that does not start takes its
    /// checkpoint back with it, so that the call can be made again.
    async fn checkpoint_then<F, Fut>(
        &self,
        sandbox_id: &str,
        req: CommandRequest,
        label: String,
        start: F,
    ) -> Result<(Arc<Command>, CheckpointInfo), TurnError>
    where
        F: FnOnce(CommandRequest) -> Fut,
        Fut: Future<Output = Result<Arc<Command>, CommandError>>,
    {
        crate::checkpoints::check_label("checkpoint", &label)?;
        CommandSpec::parse(req.clone(), &self.config).map_err(CommandError::from)?;
        let made = self
            .checkpoints
            .create(sandbox_id, Some(label), false)
            .await?;
        match start(req).await {
            Ok(cmd) => Ok((cmd, made)),
            Err(e) => {
                if let Err(undo) = self
                    .checkpoints
                    .delete(sandbox_id, &made.checkpoint_id)
                    .await
                {
                    tracing::warn!(sandbox_id, error = %undo, "the checkpoint of a command that did not start stays");
                }
                Err(e.into())
            }
        }
    }

    /// Creates a new sandbox for `req`'s session whose workspace is
    /// checkpoint `from.checkpoint_id` of sandbox `from.sandbox_id` (a
    /// fork; see [`Checkpoints::copy`]). The session must have no sandbox
    /// yet; a fork that fails removes the sandbox it made, and so does one
    /// whose caller goes away mid-copy (see [`ForkUnderway`]). A paused
    /// source is forked from as it is (neither resumed nor asked
    /// anything): the checkpoint's content is in the store, outside it.
    pub async fn fork_sandbox(
        &self,
        req: CreateSandboxRequest,
        from: ForkSource,
    ) -> CheckpointResult<Created> {
        let source = self.sandboxes.lookup_any(&from.sandbox_id).await?;
        self.checkpoints
            .info(&source.id, &from.checkpoint_id)
            .await?;
        let taken = || {
            FieldError::new(
                "sessionKey",
                "has a sandbox already; a fork makes a new sandbox, for a new session key",
            )
        };
        if (self.sandboxes.registry())
            .by_session(&req.session_key)
            .is_some()
        {
            return Err(taken().into());
        }
        let created = self.create_sandbox(req).await?;
        if !created.created {
            return Err(taken().into());
        }
        let mut underway = ForkUnderway {
            app: self,
            sandbox_id: Some(created.sandbox_id.clone()),
        };
        let copied = self
            .checkpoints
            .copy(&source.id, &from.checkpoint_id, &created.sandbox_id)
            .await;
        underway.sandbox_id = None;
        if let Err(e) = copied {
            if let Err(stop) = self.sandboxes.stop(&created.sandbox_id).await {
                tracing::warn!(sandbox_id = %created.sandbox_id, error = %stop, "a fork that failed could not remove its sandbox");
            }
            return Err(e);
        }
        Ok(created)
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

/// A forked sandbox whose copy has not finished. Dropped before the copy
/// ends (its request went away: a client that disconnected), it stops the
/// sandbox in the background: a sandbox whose workspace is part of a
/// checkpoint is removed, never left for its session to use.
struct ForkUnderway<'a> {
    app: &'a App,
    /// Taken once the copy has ended, however it ended.
    sandbox_id: Option<String>,
}

impl Drop for ForkUnderway<'_> {
    fn drop(&mut self) {
        let Some(id) = self.sandbox_id.take() else {
            return;
        };
        tracing::warn!(sandbox_id = %id, "a fork's request went away before its copy ended; removing the sandbox");
        let sandboxes = Arc::clone(&self.app.sandboxes);
        self.app.tasks.spawn(async move {
            if let Err(e) = sandboxes.stop(&id).await {
                tracing::warn!(sandbox_id = %id, error = %e, "a fork cut short could not remove its sandbox");
            }
        });
    }
}
