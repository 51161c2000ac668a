//! Commands: processes run in a sandbox on request. The agent inside the
//! sandbox runs each under a keeper that owns its whole process tree,
//! keeps its output and enforces its timeout; sandboxd keeps the list of
//! commands, what the API shows of them, and a task per running command
//! (its [`Drive`]) that waits for the agent to report the end, and ends
//! the command itself, with an `error` record saying why, when the
//! sandbox stops, restarts or dies under it.
//!
//! Commands survive a restart of sandboxd: they live in the agent, and
//! [`Commands::discover`] lists them again. What the agent reports is
//! checked and only ever describes that sandbox's own commands; how long
//! a command keeps its sandbox busy is bounded by sandboxd's own clock.

pub mod changes;
mod follow;
pub mod log;
mod progress;
pub use progress::{Progress, Reported};
pub mod spec;
mod stdin;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use sandboxd_proto::{
    CommandMeta, CommandState, Ended, FailureKind, ShapeInfo, ShapeSpec, ShapedPart, Spawn, Stream,
    TailPart,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::agent_client::{AgentConn, AgentError, TailPiece};
use crate::clock::now_ms;
use crate::config::Config;
use crate::field_error::FieldError;
use crate::sandbox::registry::{RunningCommand, Stops};
use crate::sandbox::{Sandbox, SandboxError, Sandboxes, environment};
use changes::Changes;
use log::{ExitInfo, Shape, Shaped, Shapes, Usage, exit_of};
use spec::{CommandRequest, CommandSpec};

/// How often finished commands are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(5);
/// How long past its timeout and grace a command may go unreported
/// before sandboxd asks the agent to kill it, and as long again before it
/// gives up on the agent and ends it itself.
const REPORT_SLACK: Duration = Duration::from_secs(15);
/// Pause between attempts to reach a sandbox's agent again.
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// How often a running command's sandbox is looked at.
const LIVENESS_EVERY: Duration = Duration::from_secs(2);
/// Longest summary kept from an agent's listing.
const SUMMARY_CHARS: usize = 120;

/// What can go wrong with a command operation.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Invalid(#[from] FieldError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("no command with id {0:?} in this sandbox")]
    NotFound(String),
    #[error("this sandbox already runs {max} commands; wait for one to finish")]
    TooMany { max: usize },
    /// The sandbox is at its pids limit and running commands hold it.
    #[error("{0}")]
    NoProcesses(String),
    #[error("sandboxd is shutting down")]
    ShuttingDown,
    /// It has ended: it takes no input.
    #[error("command {0:?} has ended")]
    Finished(String),
    /// Its stdin is not open (started without `stdinOpen`, or closed).
    #[error("{0}")]
    StdinClosed(String),
    /// It did not read its input in time.
    #[error("{0}")]
    StdinNotRead(String),
}

impl From<AgentError> for CommandError {
    fn from(e: AgentError) -> Self {
        CommandError::Sandbox(e.into())
    }
}

/// Result of command operations.
pub type CommandResult<T> = Result<T, CommandError>;

/// How a command ended, with its timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub exit: ExitInfo,
    pub duration_ms: u64,
    pub finished_at: u64,
    /// From the agent; `None` when sandboxd ended it (the sandbox died).
    pub oom_killed: Option<bool>,
    pub usage: Option<Usage>,
}

impl Finished {
    fn from_agent(e: &Ended) -> Finished {
        Finished {
            exit: exit_of(e),
            duration_ms: e.duration_ms,
            finished_at: now_ms(),
            oom_killed: Some(e.oom_killed),
            usage: Some(Usage::from(e.usage)),
        }
    }
}

/// One command.
#[derive(Debug)]
pub struct Command {
    pub id: String,
    pub sandbox_id: String,
    pub summary: String,
    pub started_at: u64,
    /// The effective timeout (capped to `max_timeout`).
    pub timeout_ms: u64,
    /// The pid of its own process in the sandbox, as its agent said
    /// (`None`: it could not start, or its agent did not say).
    pub pid: Option<u32>,
    /// The label a client finds it by besides its pid (E2B's process
    /// tag); its agent keeps it, so it survives a restart of sandboxd.
    pub tag: Option<String>,
    finished: watch::Sender<Option<Finished>>,
    /// Why sandboxd ended it (the sandbox stopped or died under it): the
    /// `error` record readers get after whatever the agent still gave.
    ended_by_sandboxd: Mutex<Option<String>>,
    /// The agent that runs it (its boot id).
    boot: u64,
    /// Its streams are shaped for its end (`output`).
    shape: Option<ShapeSpec>,
    /// Started with `changes`: the most entries its report may list.
    changes_max: Option<u32>,
    /// Its report, once the agent gave it.
    changes: OnceLock<Changes>,
}

impl Command {
    /// What it changed in the workspace, when it was started with
    /// `changes` and has ended: asked of `conn` (its own agent) once, then
    /// kept. `None` when its agent cannot say (the sandbox went).
    async fn changes(&self, conn: &AgentConn, limit: Duration) -> Option<Changes> {
        let max = self.changes_max?;
        if let Some(c) = self.changes.get() {
            return Some(c.clone());
        }
        if conn.boot() != self.boot {
            return None;
        }
        let c = changes::fetch(conn, &self.id, max, limit).await?;
        Some(self.changes.get_or_init(|| c).clone())
    }

    /// How it ended, once it has.
    pub fn finished(&self) -> Option<Finished> {
        *self.finished.borrow()
    }

    /// Resolves when it ends.
    pub async fn ended(&self) -> Finished {
        let mut rx = self.finished.subscribe();
        loop {
            if let Some(f) = *rx.borrow_and_update() {
                return f;
            }
            if rx.changed().await.is_err() {
                // The sender lives in self; this cannot happen while we run.
                return self.end_locally(ExitInfo {
                    exit_code: 137,
                    timed_out: false,
                    killed: false,
                });
            }
        }
    }

    fn end_locally(&self, exit: ExitInfo) -> Finished {
        Finished {
            exit,
            duration_ms: now_ms().saturating_sub(self.started_at),
            finished_at: now_ms(),
            oom_killed: None,
            usage: None,
        }
    }

    /// Records the end, once.
    fn finish(&self, f: Finished) {
        self.finished.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(f);
                true
            } else {
                false
            }
        });
    }

    /// Why sandboxd ended it, if it did.
    pub fn ended_by_sandboxd(&self) -> Option<String> {
        self.ended_by_sandboxd
            .lock()
            .map(|g| g.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
}

/// What `commands:run` answers: how the command ended and the tail of
/// each stream.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub finished: Finished,
    /// The effective timeout (capped to `max_timeout`).
    pub timeout_ms: u64,
    pub tails: Tails,
    /// What it changed, when it was started with `changes` and its agent
    /// could say.
    pub changes: Option<Changes>,
}

/// What the agent kept of a command's streams for its end: the tail of
/// each, or each shaped for a model.
#[derive(Debug, Clone, Default)]
pub struct Tails {
    pub stdout: String,
    pub stderr: String,
    /// Bytes left out before each tail (shaped: the omitted part's).
    pub stdout_cut: u64,
    pub stderr_cut: u64,
    /// What shaping kept, when the command asked for it and its agent
    /// still had it.
    pub shapes: Option<Shapes>,
}

impl Tails {
    /// The shaped streams, when there are.
    pub fn shaped(self) -> Option<Shaped> {
        let shapes = self.shapes?;
        Some(Shaped {
            stdout: self.stdout,
            stderr: self.stderr,
            shapes,
        })
    }
}

/// Asks `cmd`'s agent what it kept of its streams. What the agent sends is
/// checked against what was asked for: within the byte limit for tails,
/// within the budget (and adding up) for shaped streams. Whatever goes
/// wrong leaves the streams empty, with a warning in sandboxd's log.
async fn fetch_tails(conn: &AgentConn, cmd: &Command, limit: Duration) -> Tails {
    let mut text = [String::new(), String::new()];
    let mut cut = [0u64; 2];
    let mut infos: [Option<ShapeInfo>; 2] = [None, None];
    let max_chars = cmd.shape.map_or(0, |s| s.max_chars as usize);
    let got = conn
        .tail(&cmd.id, limit, |part| {
            let (stream, piece) = match part {
                TailPiece::Plain(TailPart {
                    stream,
                    text,
                    cut_bytes,
                }) if cmd.shape.is_none() => {
                    cut[usize::from(stream == Stream::Stderr)] = cut_bytes;
                    (stream, text)
                }
                TailPiece::Shaped(ShapedPart { stream, text, info }) if cmd.shape.is_some() => {
                    infos[usize::from(stream == Stream::Stderr)] = Some(info);
                    (stream, text)
                }
                TailPiece::Plain(_) => return Err("a plain tail of a shaped command".into()),
                TailPiece::Shaped(_) => return Err("a shaped tail of a plain command".into()),
            };
            let slot = &mut text[usize::from(stream == Stream::Stderr)];
            // A shaped character takes at most four bytes.
            let most = if cmd.shape.is_some() {
                max_chars * 4
            } else {
                spec::MAX_RUN_OUTPUT_BYTES
            };
            if slot.len() + piece.len() > most {
                return Err("a tail longer than asked for".into());
            }
            slot.push_str(&piece);
            Ok(())
        })
        .await;
    if let Err(e) = got {
        tracing::warn!(command_id = %cmd.id, error = %e, "the agent's tails of a command");
        return Tails::default();
    }
    let [stdout, stderr] = text;
    let shapes = match (cmd.shape, infos) {
        (Some(spec), [Some(out), Some(err)]) => {
            let checked = Shape::from_agent(&out, &stdout, &cmd.id, spec.max_chars).and_then(|o| {
                Shape::from_agent(&err, &stderr, &cmd.id, spec.max_chars).map(|e| (o, e))
            });
            match checked {
                Ok((o, e)) => {
                    cut = [o.omitted_bytes, e.omitted_bytes];
                    Some(Shapes {
                        stdout: o,
                        stderr: e,
                    })
                }
                Err(e) => {
                    tracing::warn!(command_id = %cmd.id, error = %e, "the agent's shaped output");
                    return Tails::default();
                }
            }
        }
        _ => None,
    };
    Tails {
        stdout,
        stderr,
        stdout_cut: cut[0],
        stderr_cut: cut[1],
        shapes,
    }
}

/// A command as the list shows it: the command, and how many processes of
/// its tree are alive (after its end: what it left running), when the
/// agent could say.
#[derive(Debug, Clone)]
pub struct Listed {
    pub command: Arc<Command>,
    pub processes: Option<u32>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Commands {
    config: Arc<Config>,
    sandboxes: Arc<Sandboxes>,
    all: DashMap<String, Arc<Command>>,
}

/// A fresh command id: the start time in ms (12 hex digits) and 48 random
/// bits.
fn new_command_id() -> Result<String, SandboxError> {
    Ok(format!(
        "{:012x}{}",
        now_ms() & 0xffff_ffff_ffff,
        crate::id::random_hex(6)?
    ))
}

impl Commands {
    pub fn new(config: Arc<Config>, sandboxes: Arc<Sandboxes>) -> Self {
        Commands {
            config,
            sandboxes,
            all: DashMap::new(),
        }
    }

    /// Starts a command; returns once the process runs.
    pub async fn start(
        &self,
        sandbox_id: &str,
        req: CommandRequest,
    ) -> CommandResult<Arc<Command>> {
        self.start_with_tails(sandbox_id, req, false, None).await
    }

    /// Starts a command carrying `tag` (see [`Command::tag`] and
    /// [`Self::tagged`]); returns once the process runs.
    pub async fn start_tagged(
        &self,
        sandbox_id: &str,
        req: CommandRequest,
        tag: Option<String>,
    ) -> CommandResult<Arc<Command>> {
        let tag = crate::process_fields::tag(tag)?;
        self.start_with_tails(sandbox_id, req, false, tag).await
    }

    /// Runs a command to its end and returns each stream's tail.
    pub async fn run(
        &self,
        sandbox_id: &str,
        req: CommandRequest,
        shutdown: &CancellationToken,
    ) -> CommandResult<RunResult> {
        let cmd = self.start_run(sandbox_id, req).await?;
        self.run_result(sandbox_id, &cmd, shutdown).await
    }

    /// Starts a command as [`Self::run`] does (its streams kept for its
    /// end), for a caller that follows its log or kills it before
    /// [`Self::run_result`].
    pub async fn start_run(
        &self,
        sandbox_id: &str,
        req: CommandRequest,
    ) -> CommandResult<Arc<Command>> {
        self.start_with_tails(sandbox_id, req, true, None).await
    }

    /// Waits for the end of a command [`Self::start_run`] started and
    /// answers what [`Self::run`] does.
    pub async fn run_result(
        &self,
        sandbox_id: &str,
        cmd: &Command,
        shutdown: &CancellationToken,
    ) -> CommandResult<RunResult> {
        let done = tokio::select! {
            f = cmd.ended() => f,
            _ = shutdown.cancelled() => return Err(CommandError::ShuttingDown),
        };
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        // The tails live in the agent; a sandbox that died took them along.
        let (tails, changes) = match self.sandboxes.agent(&sandbox).await {
            Ok(conn) => {
                let changes = cmd.changes(&conn, self.config.agent_timeout).await;
                let tails = if conn.boot() == cmd.boot {
                    fetch_tails(&conn, cmd, self.config.agent_timeout).await
                } else {
                    Tails::default()
                };
                (tails, changes)
            }
            Err(_) => (Tails::default(), None),
        };
        Ok(RunResult {
            finished: done,
            timeout_ms: cmd.timeout_ms,
            tails,
            changes,
        })
    }

    async fn start_with_tails(
        &self,
        sandbox_id: &str,
        req: CommandRequest,
        keep_tails: bool,
        tag: Option<String>,
    ) -> CommandResult<Arc<Command>> {
        let spec = CommandSpec::parse(req, &self.config)?;
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        if let Some(asked) = spec.requested_timeout {
            tracing::info!(
                sandbox_id = %sandbox.id,
                requested_ms = asked.as_millis(),
                effective_ms = spec.timeout.as_millis(),
                "timeoutMs capped to max_timeout_ms"
            );
        }
        let max = self.config.max_running_commands;
        let running = sandbox
            .command_started(max)
            .ok_or(CommandError::TooMany { max })?;
        let _busy = sandbox.open_request();
        let id = new_command_id()?;
        let started_at = now_ms();
        let timeout_ms = u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX);
        let spawn = Spawn {
            command: id.clone(),
            argv: spec.argv,
            env: environment::under(&sandbox.env, spec.env),
            cwd: spec.cwd,
            stdin: spec.stdin,
            stdin_open: spec.stdin_open,
            tail_bytes: if keep_tails && spec.shape.is_none() {
                u32::try_from(spec.max_output_bytes).unwrap_or(u32::MAX)
            } else {
                0
            },
            awaits_reader: !keep_tails,
            changes: spec.changes.clone(),
            meta: CommandMeta {
                summary: spec.summary.clone(),
                started_at_ms: started_at,
                timeout_ms,
                shape: spec.shape,
                changes: spec.changes.is_some(),
                tag: tag.clone(),
            },
        };
        let limit = self.config.agent_timeout;
        let spawned = self
            .sandboxes
            .with_agent(&sandbox, |conn| {
                let spawn = spawn.clone();
                async move {
                    match conn.spawn(spawn, limit).await {
                        Ok(pid) => Ok((conn.boot(), (pid != 0).then_some(pid))),
                        // A repeat (the connection closed after the first
                        // reached the agent): the command runs.
                        Err(AgentError::Refused(f)) if f.kind == FailureKind::DuplicateCommand => {
                            Ok((conn.boot(), None))
                        }
                        Err(e) => Err(e),
                    }
                }
            })
            .await;
        let (boot, pid) = match spawned {
            Ok(started) => started,
            Err(SandboxError::Agent(AgentError::Refused(f)))
                if f.kind == FailureKind::NoProcesses =>
            {
                return Err(CommandError::NoProcesses(f.message));
            }
            Err(e) => return Err(self.sandboxes.gone_or(&sandbox, e).into()),
        };
        let cmd = Arc::new(Command {
            id: id.clone(),
            sandbox_id: sandbox.id.clone(),
            summary: spec.summary,
            started_at,
            timeout_ms,
            pid,
            tag,
            finished: watch::channel(None).0,
            ended_by_sandboxd: Mutex::new(None),
            boot,
            shape: spec.shape,
            changes_max: spec.changes.as_ref().map(|c| c.max),
            changes: OnceLock::new(),
        });
        self.all.insert(id, Arc::clone(&cmd));
        crate::telemetry::command_started();
        tokio::spawn(
            Drive {
                cmd: Arc::clone(&cmd),
                sandboxes: Arc::clone(&self.sandboxes),
                stops: sandbox.stops(),
                sandbox,
                deadline: Instant::now() + spec.timeout + self.config.kill_grace + REPORT_SLACK,
                _running: running,
            }
            .run(),
        );
        Ok(cmd)
    }

    /// A command of `sandbox_id`, counting as use of the sandbox.
    pub async fn get(
        &self,
        sandbox_id: &str,
        command_id: &str,
    ) -> CommandResult<(Arc<Sandbox>, Arc<Command>)> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let cmd = self
            .all
            .get(command_id)
            .map(|c| Arc::clone(&c))
            .filter(|c| c.sandbox_id == sandbox.id)
            .ok_or_else(|| CommandError::NotFound(command_id.to_string()))?;
        Ok((sandbox, cmd))
    }

    /// The command's log after record `after`, typed (the REST log renders
    /// each as an NDJSON line): replayed, then
    /// followed live until its `exit` record (or `shutdown`); with
    /// `leftovers`, on past it until the processes it left are gone.
    pub async fn follow_lines(
        &self,
        sandbox_id: &str,
        command_id: &str,
        after: u64,
        leftovers: bool,
        shutdown: CancellationToken,
    ) -> CommandResult<impl futures_util::Stream<Item = Vec<log::LogLine>> + Send + use<>> {
        let (sandbox, cmd) = self.get(sandbox_id, command_id).await?;
        let busy = sandbox.open_request();
        Ok(follow::follow(
            follow::Follow::new(
                Arc::clone(&self.sandboxes),
                sandbox,
                cmd,
                after,
                leftovers,
                &self.config,
                shutdown,
            )
            .map_err(SandboxError::from)?,
            busy,
        ))
    }

    /// Waits for the end of a command.
    pub async fn wait(
        &self,
        sandbox_id: &str,
        command_id: &str,
        shutdown: &CancellationToken,
    ) -> CommandResult<Finished> {
        let (sandbox, cmd) = self.get(sandbox_id, command_id).await?;
        let _busy = sandbox.open_request();
        tokio::select! {
            f = cmd.ended() => Ok(f),
            _ = shutdown.cancelled() => Err(CommandError::ShuttingDown),
        }
    }

    /// Ends a command's whole process tree, or the processes a finished
    /// one left running: answers once SIGTERM is on its way; the grace
    /// period and SIGKILL go on in the background, and `wait`/`logs`
    /// report the end.
    pub async fn kill(&self, sandbox_id: &str, command_id: &str) -> CommandResult<()> {
        let (sandbox, cmd) = self.get(sandbox_id, command_id).await?;
        if cmd.ended_by_sandboxd().is_some() {
            // Its sandbox restarted: nothing of it is left to end.
            return Ok(());
        }
        let conn = self.sandboxes.agent(&sandbox).await?;
        if conn.boot() != cmd.boot {
            return Ok(());
        }
        match conn.kill(&cmd.id, self.config.agent_timeout).await {
            Ok(()) => Ok(()),
            // The agent forgot a finished command: nothing to end.
            Err(AgentError::Refused(f)) if f.kind == FailureKind::NoSuchCommand => Ok(()),
            Err(e) => Err(self.sandboxes.gone_or(&sandbox, e.into())),
        }
    }

    /// The commands of a sandbox, oldest first, with how many processes of
    /// each are alive (when the agent answers).
    pub async fn list(&self, sandbox_id: &str) -> CommandResult<Vec<Listed>> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let mut mine: Vec<Arc<Command>> = self
            .all
            .iter()
            .filter(|c| c.sandbox_id == sandbox.id)
            .map(|c| Arc::clone(&c))
            .collect();
        mine.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        let states = self.agent_states(&sandbox).await;
        Ok(mine
            .into_iter()
            .map(|command| {
                let processes = states.as_ref().and_then(|(boot, list)| {
                    (*boot == command.boot)
                        .then(|| list.iter().find(|s| s.command == command.id))
                        .flatten()
                        .map(|s| s.processes)
                });
                Listed { command, processes }
            })
            .collect())
    }

    /// The running command of `sandbox_id` tagged `tag`: the one started
    /// last when several are (tags need not be unique, as in envd). A
    /// command that has ended no longer answers to its tag.
    pub async fn tagged(&self, sandbox_id: &str, tag: &str) -> CommandResult<Option<Arc<Command>>> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        Ok(self
            .all
            .iter()
            .filter(|c| {
                c.sandbox_id == sandbox.id
                    && c.tag.as_deref() == Some(tag)
                    && c.finished().is_none()
            })
            .map(|c| Arc::clone(&c))
            .max_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id))))
    }

    /// What the sandbox's agent lists, if it answers (and which agent).
    async fn agent_states(&self, sandbox: &Arc<Sandbox>) -> Option<(u64, Vec<CommandState>)> {
        let conn = sandbox.live_agent()?;
        let list = conn.list(self.config.agent_timeout).await.ok()?;
        Some((conn.boot(), list))
    }

    /// Lists again the commands the agents of all sandboxes hold, after a
    /// restart of sandboxd: running ones are followed to their end, ended
    /// ones keep their exit status and their logs.
    pub async fn discover(self: &Arc<Self>) {
        let sandboxes = self.sandboxes.registry().list();
        let found = futures_util::future::join_all(sandboxes.into_iter().map(|s| {
            let this = Arc::clone(self);
            async move { this.discover_in(s).await }
        }))
        .await;
        let n: usize = found.into_iter().sum();
        if n > 0 {
            tracing::info!(commands = n, "commands found in the sandboxes' agents");
        }
    }

    /// Lists again the commands the agent of `sandbox_id` holds that
    /// sandboxd does not know: after a resume, for a sandbox that was
    /// paused when sandboxd started (its agent could not be asked then).
    pub async fn discover_sandbox(&self, sandbox_id: &str) {
        if let Some(sandbox) = self.sandboxes.registry().get(sandbox_id) {
            let n = self.discover_in(sandbox).await;
            if n > 0 {
                tracing::info!(
                    sandbox_id,
                    commands = n,
                    "commands found in a resumed sandbox's agent"
                );
            }
        }
    }

    async fn discover_in(&self, sandbox: Arc<Sandbox>) -> usize {
        let Ok(conn) = self.sandboxes.agent(&sandbox).await else {
            return 0;
        };
        let Ok(list) = conn.list(self.config.agent_timeout).await else {
            return 0;
        };
        let mut n = 0;
        for state in list {
            // What the agent says is checked: ids of our form, no id of
            // another sandbox's command, bounded text.
            let valid = crate::id::is_hex_id(&state.command, 24);
            if !valid || self.all.contains_key(&state.command) {
                continue;
            }
            let summary: String = state.meta.summary.chars().take(SUMMARY_CHARS).collect();
            let cmd = Arc::new(Command {
                id: state.command.clone(),
                sandbox_id: sandbox.id.clone(),
                summary,
                started_at: state.meta.started_at_ms.min(now_ms()),
                timeout_ms: state
                    .meta
                    .timeout_ms
                    .min(u64::try_from(self.config.max_timeout.as_millis()).unwrap_or(u64::MAX)),
                pid: (state.pid != 0).then_some(state.pid),
                // Checked like a request's; one that is not is dropped.
                tag: crate::process_fields::tag(state.meta.tag).ok().flatten(),
                finished: watch::channel(state.ended.as_ref().map(Finished::from_agent)).0,
                ended_by_sandboxd: Mutex::new(None),
                boot: conn.boot(),
                // Bounded like a request's, whatever the agent says.
                shape: state.meta.shape.map(|s| ShapeSpec {
                    max_chars: s.max_chars.min(spec::MAX_SHAPED_CHARS),
                    ..s
                }),
                // How many it asked for is not kept: at most what any may.
                changes_max: state.meta.changes.then_some(changes::MAX_MAX),
                changes: OnceLock::new(),
            });
            self.all.insert(cmd.id.clone(), Arc::clone(&cmd));
            n += 1;
            if state.ended.is_none() {
                // It runs already: it is followed (and counted) whatever
                // the limit, which may have been lowered meanwhile.
                let Some(running) = sandbox.command_started(usize::MAX) else {
                    continue;
                };
                let left = Duration::from_millis(
                    (cmd.started_at + cmd.timeout_ms).saturating_sub(now_ms()),
                );
                tokio::spawn(
                    Drive {
                        cmd,
                        sandboxes: Arc::clone(&self.sandboxes),
                        stops: sandbox.stops(),
                        sandbox: Arc::clone(&sandbox),
                        deadline: Instant::now() + left + self.config.kill_grace + REPORT_SLACK,
                        _running: running,
                    }
                    .run(),
                );
            }
        }
        n
    }

    /// Drops finished commands past their retention, past the per-sandbox
    /// count, or of sandboxes that are gone; their agents forget them too.
    /// A command whose leftover processes still run stays (its agent
    /// refuses to forget it), so they stay listed and killable.
    pub async fn prune(&self) {
        let now = now_ms();
        let retention =
            u64::try_from(self.config.command_retention.as_millis()).unwrap_or(u64::MAX);
        let mut per_sandbox: std::collections::HashMap<String, Vec<(u64, String)>> =
            Default::default();
        let mut remove = Vec::new();
        for c in self.all.iter() {
            let gone = self.sandboxes.registry().get(&c.sandbox_id).is_none();
            match c.finished() {
                Some(f) if gone || now.saturating_sub(f.finished_at) > retention => {
                    remove.push(Arc::clone(c.value()))
                }
                Some(f) => per_sandbox
                    .entry(c.sandbox_id.clone())
                    .or_default()
                    .push((f.finished_at, c.id.clone())),
                None => {}
            }
        }
        for (_, mut done) in per_sandbox {
            if done.len() > self.config.max_finished_commands {
                done.sort();
                let extra = done.len() - self.config.max_finished_commands;
                remove.extend(
                    done.into_iter()
                        .take(extra)
                        .filter_map(|(_, id)| self.all.get(&id).map(|c| Arc::clone(c.value()))),
                );
            }
        }
        // One round trip each, all at once: a stuck agent holds up only
        // its own commands, for at most FORGET_WITHIN.
        let forgotten = futures_util::future::join_all(remove.into_iter().map(|cmd| async move {
            let conn = self
                .sandboxes
                .registry()
                .get(&cmd.sandbox_id)
                .and_then(|s| s.live_agent())
                .filter(|c| c.boot() == cmd.boot);
            let Some(conn) = conn else {
                // No agent that knows it: nothing of it can run any more.
                return Some(cmd);
            };
            match conn.forget(&cmd.id, FORGET_WITHIN).await {
                Err(AgentError::Refused(f)) if f.kind == FailureKind::StillRunning => None,
                _ => Some(cmd),
            }
        }))
        .await;
        for cmd in forgotten.into_iter().flatten() {
            self.all.remove(&cmd.id);
        }
    }
}

/// How long the pruner waits for an agent to forget a command.
const FORGET_WITHIN: Duration = Duration::from_secs(5);

/// Prunes finished commands until `shutdown`.
pub async fn run_pruner(commands: Arc<Commands>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => commands.prune().await,
        }
    }
}

/// The task that follows one running command to its end: it waits for
/// the agent's report; when the connection drops it reconnects, and when
/// the sandbox stopped, restarted or died meanwhile it ends the command
/// itself (137, with an `error` record saying why). It keeps the sandbox
/// busy until then, but never longer than sandboxd's own deadline.
struct Drive {
    cmd: Arc<Command>,
    sandboxes: Arc<Sandboxes>,
    sandbox: Arc<Sandbox>,
    /// The sandbox's stops when the command started.
    stops: Stops,
    deadline: Instant,
    _running: RunningCommand,
}

impl Drive {
    async fn run(self) {
        let mut asked_to_kill = false;
        let mut deadline = self.deadline;
        let outcome: Result<Ended, String> = loop {
            // A paused sandbox's agent cannot report: its time does not
            // count against the deadline.
            if self.sandbox.is_paused() {
                deadline = deadline.max(Instant::now() + REPORT_SLACK);
            }
            if Instant::now() >= deadline {
                if asked_to_kill {
                    break Err("the sandbox's agent did not report how the command ended".into());
                }
                asked_to_kill = true;
                self.kill_late().await;
            }
            let conn = match self.sandboxes.agent(&self.sandbox).await {
                Ok(c) => c,
                Err(SandboxError::NotFound(_)) => break Err(self.why_gone().await),
                Err(_) => {
                    tokio::time::sleep(RETRY_EVERY).await;
                    continue;
                }
            };
            if conn.boot() != self.cmd.boot {
                break Err(self.why_gone().await);
            }
            let wait = conn.wait(&self.cmd.id);
            tokio::pin!(wait);
            // A sandbox that dies (gVisor's kernel, out of memory) can leave
            // the connection open: look at the container now and then.
            let mut liveness = tokio::time::interval_at(
                tokio::time::Instant::now() + LIVENESS_EVERY,
                LIVENESS_EVERY,
            );
            let answer = loop {
                tokio::select! {
                    r = &mut wait => break Some(r),
                    _ = tokio::time::sleep_until(deadline.into()) => break None,
                    _ = liveness.tick() => {
                        if !self.sandbox_alive().await {
                            conn.close("the sandbox stopped".into());
                        }
                    }
                }
            };
            match answer {
                Some(Ok(e)) => break Ok(e),
                Some(Err(AgentError::Unexpected(why))) => {
                    tracing::warn!(command_id = %self.cmd.id, why, "the agent answered a wait oddly");
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                Some(Err(AgentError::Refused(f))) if f.kind == FailureKind::NoSuchCommand => {
                    break Err("the sandbox's agent no longer knows the command".into());
                }
                Some(Err(_)) => tokio::time::sleep(RETRY_EVERY).await,
                None => {}
            }
        };
        let finished = match outcome {
            Ok(e) => Finished::from_agent(&e),
            Err(why) => {
                tracing::warn!(command_id = %self.cmd.id, sandbox_id = %self.cmd.sandbox_id, why, "command ended by sandboxd");
                if let Ok(mut slot) = self.cmd.ended_by_sandboxd.lock() {
                    *slot = Some(why);
                }
                // Its timeout had come when the sandbox went: it timed out,
                // however its processes ended.
                let timed_out = now_ms() >= self.cmd.started_at.saturating_add(self.cmd.timeout_ms);
                self.cmd.end_locally(ExitInfo {
                    exit_code: if timed_out { 124 } else { 137 },
                    timed_out,
                    killed: false,
                })
            }
        };
        let outcome = if finished.exit.timed_out {
            "timeout"
        } else if finished.exit.killed {
            "killed"
        } else if finished.exit.exit_code == 0 {
            "exit_zero"
        } else {
            "exit_nonzero"
        };
        crate::telemetry::command_ended(outcome, finished.duration_ms as f64 / 1000.0);
        tracing::info!(
            event = "command_ended",
            sandbox_id = %self.cmd.sandbox_id,
            session_key = %self.sandbox.session_key,
            command_id = %self.cmd.id,
            exit_code = finished.exit.exit_code,
            timed_out = finished.exit.timed_out,
            killed = finished.exit.killed,
            duration_ms = finished.duration_ms,
            "command ended"
        );
        self.cmd.finish(finished);
    }

    /// Whether the sandbox is still the one the command started in: not
    /// stopped or restarted by sandboxd, its container running. An engine
    /// that does not answer within a second counts as alive.
    async fn sandbox_alive(&self) -> bool {
        self.sandbox.stops() == self.stops && self.sandboxes.container_alive(&self.sandbox).await
    }

    /// Past the deadline: ask the agent to end it (once).
    async fn kill_late(&self) {
        tracing::warn!(command_id = %self.cmd.id, "the agent has not reported the end of a command past its timeout; killing it");
        if let Some(conn) = self.sandbox.live_agent() {
            // Bounded here, and not by the call: a slow answer does not
            // close the connection the drive waits on.
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                conn.kill(&self.cmd.id, Duration::MAX),
            )
            .await;
        }
    }

    /// Why the command's processes are gone with its sandbox's agent.
    async fn why_gone(&self) -> String {
        let now = self.sandbox.stops();
        if now.planned != self.stops.planned {
            return "the sandbox was restarted or stopped while the command ran".into();
        }
        // Found stopped by its memory limit, and started again since.
        if now.out_of_memory != self.stops.out_of_memory {
            return "the sandbox ran out of memory and stopped; it was started again".into();
        }
        let status = self.sandboxes.container_status(&self.sandbox).await;
        if let Ok(Some(st)) = &status
            && self
                .sandboxes
                .stopped_by_memory(&self.sandbox, Some(st))
                .await
        {
            return "the sandbox ran out of memory and stopped; it starts again on the next request".into();
        }
        match status {
            Ok(None) => "the sandbox's container is gone".into(),
            _ if now.unexpected != self.stops.unexpected => {
                "the sandbox's agent (the process everything in it runs under) ended while the command ran, and the sandbox was started again: something in the sandbox killed it, or the sandbox ran out of memory or was stopped by its engine".into()
            }
            _ => "the sandbox's agent stopped answering while the command ran; the sandbox was started again".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_ids_carry_their_start_time() {
        let id = new_command_id().expect("random");
        assert!(crate::id::is_hex_id(&id, 24));
        let started = u64::from_str_radix(&id[..12], 16).expect("hex");
        assert!(now_ms().saturating_sub(started) < 60_000);
    }
}
