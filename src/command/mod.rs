//! Commands: processes run in a sandbox on request. Each runs under a small
//! supervisor (`supervisor.sh`, bash) that marks its whole process tree with
//! `SANDBOXD_CMD=<id>` and, asked through its stdin, ends that tree: SIGTERM,
//! a grace period, then SIGSTOP+SIGKILL until nothing is left. Timeouts and
//! kills go through it; no signal ever reaches another command's processes.
//!
//! Output is always drained into an [`log::OutputLog`] whether or not anyone
//! reads it: the engine blocks a process whose exec output nobody drains.

mod follow;
pub mod log;
pub mod spec;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::config::Config;
use crate::engine::{EngineError, ExecRequest, ExecSession, OutputStream};
use crate::field_error::FieldError;
use crate::sandbox::registry::{RunningCommand, Stops};
use crate::sandbox::{Sandbox, SandboxError, Sandboxes};
use log::{ExitInfo, OutputLog, Tail};
use spec::{CommandRequest, CommandSpec, MARKER_VAR};

/// The supervisor script. It travels in an environment variable and runs
/// through `eval`, so `ps` in the sandbox shows one short line, not the
/// script; it unsets the variable before starting the command.
const SUPERVISOR: &str = include_str!("supervisor.sh");
const SUPERVISOR_VAR: &str = "SANDBOXD_SUPERVISOR";

/// `bash -c 'eval "$SANDBOXD_SUPERVISOR"' NAME MODE ARGS...` plus its env.
fn supervisor_exec(
    name: &str,
    args: impl IntoIterator<Item = String>,
    mut env: Vec<String>,
) -> ExecRequest {
    let mut argv = vec![
        "bash".to_string(),
        "-c".to_string(),
        format!("eval \"${SUPERVISOR_VAR}\""),
        name.to_string(),
    ];
    argv.extend(args);
    env.push(format!("{SUPERVISOR_VAR}={SUPERVISOR}"));
    ExecRequest {
        argv,
        env,
        working_dir: "/".into(),
    }
}
/// After a kill request, how long past the grace period the supervisor gets
/// before a separate sweep is started.
const SUPERVISOR_SLACK: Duration = Duration::from_secs(3);
/// Longest a kill request waits for its signal to be sent.
const KILL_ACK_WITHIN: Duration = Duration::from_secs(5);
/// After the fallback sweep, how long before we stop waiting for the stream.
const ABANDON_AFTER: Duration = Duration::from_secs(10);
/// How often a running command checks that its sandbox is still alive.
const LIVENESS_EVERY: Duration = Duration::from_secs(2);
/// How long that check may take before it counts as alive.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(1);
/// How often finished commands are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(5);

/// What can go wrong with a command operation.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Invalid(#[from] FieldError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("no command with id {0:?} in this sandbox")]
    NotFound(String),
    #[error(
        "command {0:?} was running when sandboxd restarted; its output and exit status are lost (its processes were left running; kill ends them)"
    )]
    Lost(String),
    #[error("this sandbox already runs {max} commands; wait for one to finish")]
    TooMany { max: usize },
    #[error("sandboxd is shutting down")]
    ShuttingDown,
}

impl From<EngineError> for CommandError {
    fn from(e: EngineError) -> Self {
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
}

/// One command.
#[derive(Debug)]
pub struct Command {
    pub id: String,
    pub sandbox_id: String,
    pub summary: String,
    pub started_at: u64,
    pub log: OutputLog,
    /// Per-stream tails, kept only for `commands:run`.
    tails: Option<Mutex<[Tail; 2]>>,
    /// Kill requests; each is answered once the signal is on its way.
    kill: mpsc::Sender<oneshot::Sender<()>>,
    /// The effective timeout (capped to `max_timeout`).
    pub timeout_ms: u64,
    finished: watch::Sender<Option<Finished>>,
    /// Found running after a restart of sandboxd: no output, no status.
    lost: bool,
    /// When a lost command was found (ms); 0 for others.
    found_at: u64,
}

impl Command {
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
                return Finished {
                    exit: ExitInfo {
                        exit_code: 137,
                        timed_out: false,
                        killed: true,
                    },
                    duration_ms: 0,
                    finished_at: now_ms(),
                };
            }
        }
    }

    pub fn is_lost(&self) -> bool {
        self.lost
    }
}

/// What `commands:run` answers: how the command ended and the tail of
/// each stream.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub finished: Finished,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated_bytes: u64,
    pub stderr_truncated_bytes: u64,
    /// The effective timeout (capped to `max_timeout`).
    pub timeout_ms: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct Commands {
    config: Arc<Config>,
    sandboxes: Arc<Sandboxes>,
    all: DashMap<String, Arc<Command>>,
}

/// A fresh command id: the start time in ms (12 hex digits) and 48 random
/// bits, so a command found after a restart still has its start time.
fn new_command_id() -> String {
    format!(
        "{:012x}{}",
        now_ms() & 0xffff_ffff_ffff,
        crate::id::random_hex(6)
    )
}

fn started_at_of(id: &str) -> u64 {
    id.get(..12)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or(0)
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
        self.start_inner(sandbox_id, req, false).await
    }

    /// Runs a command to its end and returns each stream's tail.
    pub async fn run(
        &self,
        sandbox_id: &str,
        req: CommandRequest,
        shutdown: &CancellationToken,
    ) -> CommandResult<RunResult> {
        let cmd = self.start_inner(sandbox_id, req, true).await?;
        let done = tokio::select! {
            f = cmd.ended() => f,
            _ = shutdown.cancelled() => return Err(CommandError::ShuttingDown),
        };
        let ((stdout, out_cut), (stderr, err_cut)) = match cmd.tails.as_ref().map(|t| t.lock()) {
            Some(Ok(t)) => (t[0].finish(), t[1].finish()),
            _ => ((String::new(), 0), (String::new(), 0)),
        };
        Ok(RunResult {
            finished: done,
            stdout,
            stderr,
            stdout_truncated_bytes: out_cut,
            stderr_truncated_bytes: err_cut,
            timeout_ms: cmd.timeout_ms,
        })
    }

    async fn start_inner(
        &self,
        sandbox_id: &str,
        req: CommandRequest,
        keep_tails: bool,
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
        let id = new_command_id();
        let exec = self.exec_request(&id, &spec);
        let session = self.sandboxes.exec(&sandbox, &exec).await?;
        let (kill_tx, kill_rx) = mpsc::channel(1);
        let tails = keep_tails.then(|| {
            Mutex::new([
                Tail::new(spec.max_output_bytes),
                Tail::new(spec.max_output_bytes),
            ])
        });
        let cmd = Arc::new(Command {
            id: id.clone(),
            sandbox_id: sandbox.id.clone(),
            summary: spec.summary.clone(),
            started_at: now_ms(),
            log: OutputLog::new(self.config.output_buffer_bytes),
            tails,
            kill: kill_tx,
            timeout_ms: u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX),
            finished: watch::channel(None).0,
            lost: false,
            found_at: 0,
        });
        self.all.insert(id, Arc::clone(&cmd));
        let drive = Drive {
            cmd: Arc::clone(&cmd),
            sandboxes: Arc::clone(&self.sandboxes),
            stops: sandbox.stops(),
            under_gvisor: self.sandboxes.under_gvisor(&sandbox).await,
            sandbox: Arc::clone(&sandbox),
            timeout: spec.timeout,
            grace: self.config.kill_grace,
            stdin: spec.stdin,
            _running: running,
        };
        tokio::spawn(drive.run(session, kill_rx));
        crate::telemetry::command_started();
        Ok(cmd)
    }

    fn exec_request(&self, id: &str, spec: &CommandSpec) -> ExecRequest {
        let args = [
            "supervise".to_string(),
            self.config.kill_grace.as_millis().to_string(),
            spec.stdin.len().to_string(),
            spec.cwd.clone().unwrap_or_default(),
        ]
        .into_iter()
        .chain(spec.argv.iter().cloned());
        let mut env = spec.env.clone();
        env.push(format!("{MARKER_VAR}={id}"));
        ExecRequest {
            working_dir: self.config.workspace_dir.clone(),
            ..supervisor_exec("sandboxd-supervisor", args, env)
        }
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

    /// The command's NDJSON log after record `after`: replayed, then
    /// followed live until its `exit` record (or `shutdown`).
    pub async fn follow_logs(
        &self,
        sandbox_id: &str,
        command_id: &str,
        after: u64,
        shutdown: CancellationToken,
    ) -> CommandResult<impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static> {
        let (sandbox, cmd) = self.get(sandbox_id, command_id).await?;
        if cmd.lost {
            return Err(CommandError::Lost(cmd.id.clone()));
        }
        let busy = sandbox.open_request();
        Ok(follow::follow(
            cmd,
            after,
            self.config.log_heartbeat,
            shutdown,
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
        if cmd.lost {
            return Err(CommandError::Lost(cmd.id.clone()));
        }
        let _busy = sandbox.open_request();
        tokio::select! {
            f = cmd.ended() => Ok(f),
            _ = shutdown.cancelled() => Err(CommandError::ShuttingDown),
        }
    }

    /// Ends a command's whole process tree: answers once SIGTERM is on its
    /// way; the grace period and SIGKILL go on in the background, and
    /// `wait`/`logs` report the end. A finished command is left alone.
    pub async fn kill(&self, sandbox_id: &str, command_id: &str) -> CommandResult<()> {
        let (sandbox, cmd) = self.get(sandbox_id, command_id).await?;
        if cmd.lost {
            sweep(&self.sandboxes, &sandbox, &cmd.id, self.config.kill_grace).await;
            self.all.remove(&cmd.id);
            return Ok(());
        }
        if cmd.finished().is_some() {
            return Ok(());
        }
        let (ack, sent) = oneshot::channel();
        // A full channel means a kill is already under way.
        if cmd.kill.try_send(ack).is_ok() {
            // An Err means the command ended first: nothing left to signal.
            let _ = tokio::time::timeout(KILL_ACK_WITHIN, sent).await;
        }
        Ok(())
    }

    /// The commands of a sandbox, oldest first.
    pub async fn list(&self, sandbox_id: &str) -> CommandResult<Vec<Arc<Command>>> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let mut out: Vec<Arc<Command>> = self
            .all
            .iter()
            .filter(|c| c.sandbox_id == sandbox.id)
            .map(|c| Arc::clone(&c))
            .collect();
        out.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        Ok(out)
    }

    /// The last `max_bytes` of output of the sandbox's most recent command
    /// (stdout and stderr as they came), to explain why a server is not up.
    pub fn last_output(&self, sandbox_id: &str, max_bytes: usize) -> Option<String> {
        let latest = self
            .all
            .iter()
            .filter(|c| c.sandbox_id == sandbox_id && !c.lost)
            .max_by_key(|c| (c.started_at, c.id.clone()))
            .map(|c| Arc::clone(&c))?;
        let mut cursor = log::Cursor::after(0);
        let mut text = String::new();
        loop {
            let batch = latest.log.read(&mut cursor);
            for line in &batch.lines {
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) {
                    if let Some(d) = v.get("data").and_then(|d| d.as_str()) {
                        text.push_str(d);
                    }
                }
            }
            if batch.done || batch.lines.is_empty() {
                break;
            }
        }
        let cut = text.len().saturating_sub(max_bytes);
        let start = (cut..=text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        Some(text[start..].to_string())
    }

    /// Drops finished commands past their retention, past the per-sandbox
    /// count, or of sandboxes that are gone.
    pub fn prune(&self) {
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
                    remove.push(c.id.clone())
                }
                Some(f) => per_sandbox
                    .entry(c.sandbox_id.clone())
                    .or_default()
                    .push((f.finished_at, c.id.clone())),
                // We cannot see a lost command end: it stays listed for the
                // retention time after it was found, then is forgotten.
                None if c.lost && (gone || now.saturating_sub(c.found_at) > retention) => {
                    remove.push(c.id.clone())
                }
                None => {}
            }
        }
        for (_, mut done) in per_sandbox {
            if done.len() > self.config.max_finished_commands {
                done.sort();
                let extra = done.len() - self.config.max_finished_commands;
                remove.extend(done.into_iter().take(extra).map(|(_, id)| id));
            }
        }
        for id in remove {
            self.all.remove(&id);
        }
        self.enforce_output_budget();
    }

    /// Keeps the output all commands retain under `output_memory_bytes`:
    /// the logs of finished commands go first, oldest first; then the
    /// biggest running ones are halved. Readers see `dropped` records.
    fn enforce_output_budget(&self) {
        let budget = self.config.output_memory_bytes;
        let mut logs: Vec<(Option<u64>, usize, Arc<Command>)> = self
            .all
            .iter()
            .map(|c| {
                (
                    c.finished().map(|f| f.finished_at),
                    c.log.retained_bytes(),
                    Arc::clone(&c),
                )
            })
            .collect();
        let mut total: usize = logs.iter().map(|(_, n, _)| n).sum();
        if total <= budget {
            return;
        }
        logs.sort_by_key(|(finished, n, _)| {
            (finished.is_none(), finished.unwrap_or(0), usize::MAX - n)
        });
        for (finished, n, c) in &logs {
            if total <= budget {
                return;
            }
            let keep = if finished.is_some() { 0 } else { n / 2 };
            c.log.trim_to(keep);
            total = total - n + c.log.retained_bytes();
        }
    }

    /// Registers commands whose processes outlived a restart of sandboxd as
    /// lost: listed, killable, but without output or exit status. Their
    /// processes are left running (a preview server may be among them).
    pub async fn discover_lost(&self) {
        for sandbox in self.sandboxes.registry().list() {
            let req = supervisor_exec(
                "sandboxd-list",
                ["list".to_string(), "0".to_string()],
                vec![],
            );
            let out = match self
                .sandboxes
                .exec_to_end(&sandbox, &req, Duration::from_secs(10))
                .await
            {
                Ok(Some(ended)) => String::from_utf8_lossy(&ended.stdout).into_owned(),
                _ => continue,
            };
            for id in out
                .lines()
                .map(str::trim)
                .filter(|l| crate::id::is_hex_id(l, 24))
            {
                if self.all.contains_key(id) {
                    continue;
                }
                tracing::info!(sandbox_id = %sandbox.id, command_id = id, "command outlived a restart of sandboxd; listed as lost");
                let (kill, _) = mpsc::channel(1);
                self.all.insert(
                    id.to_string(),
                    Arc::new(Command {
                        id: id.to_string(),
                        sandbox_id: sandbox.id.clone(),
                        summary: "(started before sandboxd restarted)".into(),
                        started_at: started_at_of(id),
                        log: OutputLog::new(1024),
                        tails: None,
                        kill,
                        timeout_ms: 0,
                        finished: watch::channel(None).0,
                        lost: true,
                        found_at: now_ms(),
                    }),
                );
            }
        }
    }
}

/// Prunes finished commands until `shutdown`.
pub async fn run_pruner(commands: Arc<Commands>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => commands.prune(),
        }
    }
}

/// Ends every process marked with `command_id` from a separate exec: the
/// fallback when the command's own supervisor is gone or stuck. Returns the
/// sweep's verdict: 143 when SIGTERM sufficed, 137 when SIGKILL was needed.
async fn sweep(
    sandboxes: &Sandboxes,
    sandbox: &Arc<Sandbox>,
    command_id: &str,
    grace: Duration,
) -> Option<i64> {
    let req = supervisor_exec(
        "sandboxd-sweep",
        [
            "sweep".to_string(),
            grace.as_millis().to_string(),
            command_id.to_string(),
        ],
        vec![],
    );
    let limit = grace + ABANDON_AFTER;
    match sandboxes.exec_to_end(sandbox, &req, limit).await {
        Ok(Some(ended)) => ended.code,
        _ => {
            tracing::warn!(command_id, "the fallback sweep did not finish");
            None
        }
    }
}

/// The task that owns one running command: drains its output, enforces its
/// timeout, passes kill requests to the supervisor, and records the end.
struct Drive {
    cmd: Arc<Command>,
    sandboxes: Arc<Sandboxes>,
    sandbox: Arc<Sandbox>,
    /// The sandbox's stops when the command started.
    stops: Stops,
    under_gvisor: bool,
    timeout: Duration,
    grace: Duration,
    stdin: Vec<u8>,
    _running: RunningCommand,
}

impl Drive {
    async fn run(mut self, session: ExecSession, mut kill_rx: mpsc::Receiver<oneshot::Sender<()>>) {
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + self.timeout);
        let ExecSession {
            id: exec_id,
            mut output,
            stdin,
        } = session;
        let payload = std::mem::take(&mut self.stdin);
        // Staging stdin runs alongside draining, so a command that writes
        // while the supervisor reads its input cannot deadlock us.
        let mut stdin_write = Some(Box::pin(async move {
            let mut stdin = stdin;
            if !payload.is_empty() {
                stdin.write_all(&payload).await?;
                stdin.flush().await?;
            }
            Ok::<_, std::io::Error>(stdin)
        }));
        let mut control = None;
        let (mut timed_out, mut killed) = (false, false);
        let mut kill_sent: Option<tokio::time::Instant> = None;
        let mut swept = false;
        let mut broken: Option<String> = None;
        let mut sweep_code = None;
        let mut abandoned = false;
        let mut sandbox_died = false;
        let far = deadline + Duration::from_secs(86_400 * 365);
        let mut kill_acks: Vec<oneshot::Sender<()>> = Vec::new();
        // A sandbox that dies (gVisor's kernel killed by the OOM killer) can
        // leave the exec's stream open: look at the container now and then.
        let mut liveness =
            tokio::time::interval_at(tokio::time::Instant::now() + LIVENESS_EVERY, LIVENESS_EVERY);
        liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        loop {
            let sweep_at = kill_sent
                .map(|t| t + self.grace + SUPERVISOR_SLACK)
                .unwrap_or(far);
            let abandon_at = kill_sent
                .map(|t| t + self.grace + SUPERVISOR_SLACK + ABANDON_AFTER)
                .unwrap_or(far);
            let want_kill = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline), if kill_sent.is_none() => {
                    timed_out = true;
                    true
                }
                Some(ack) = kill_rx.recv() => {
                    kill_acks.push(ack);
                    if kill_sent.is_none() && !timed_out {
                        killed = true;
                        true
                    } else {
                        // Already on its way: the signal was sent.
                        kill_acks.drain(..).for_each(|a| { let _ = a.send(()); });
                        false
                    }
                }
                _ = tokio::time::sleep_until(sweep_at), if !swept => {
                    swept = true;
                    sweep_code = sweep(&self.sandboxes, &self.sandbox, &self.cmd.id, self.grace).await;
                    false
                }
                _ = liveness.tick() => {
                    if !matches!(self.look_at_sandbox().await, SandboxEnd::Alive) {
                        sandbox_died = true;
                        break;
                    }
                    false
                }
                _ = tokio::time::sleep_until(abandon_at) => {
                    tracing::warn!(command_id = %self.cmd.id, "the command's output did not end after a sweep; giving up on it");
                    abandoned = true;
                    break;
                }
                w = async {
                    match stdin_write.as_mut() {
                        Some(f) => f.await,
                        None => std::future::pending().await,
                    }
                }, if stdin_write.is_some() => {
                    stdin_write = None;
                    control = w.ok();
                    false
                }
                item = output.next() => {
                    match item {
                        Some(Ok((stream, bytes))) => {
                            self.cmd.log.append(stream, &bytes);
                            if let Some(t) = &self.cmd.tails {
                                if let Ok(mut t) = t.lock() {
                                    t[usize::from(stream == OutputStream::Stderr)].push(&bytes);
                                }
                            }
                            false
                        }
                        Some(Err(e)) => {
                            tracing::warn!(command_id = %self.cmd.id, error = %e, "the command's output stream broke");
                            broken = Some(format!("the output stream from the engine broke: {e}"));
                            break;
                        }
                        None => break,
                    }
                }
            };
            if want_kill {
                let now = tokio::time::Instant::now();
                kill_sent = Some(now);
                let delivered = match control.as_mut() {
                    Some(c) => c.write_all(b"k\n").await.is_ok() && c.flush().await.is_ok(),
                    None => false,
                };
                if !delivered {
                    // No control channel (stdin still being staged, or the
                    // supervisor is gone): sweep from outside right away.
                    kill_sent = Some(now - self.grace - SUPERVISOR_SLACK);
                }
                for ack in kill_acks.drain(..) {
                    let _ = ack.send(());
                }
            }
        }

        let mut code = if abandoned || sandbox_died {
            None
        } else {
            self.sandboxes.exit_code(&exec_id).await
        };
        // No code, or one that may be the runtime's rather than the
        // command's: the whole sandbox may have died under it (under gVisor
        // an out-of-memory or out-of-tasks sandbox loses its kernel and
        // every command with it). Inspected on abnormal ends only.
        if sandbox_died || (!timed_out && !killed && code.is_none_or(|c| c >= 126)) {
            if let Some(why) = self.death_of_sandbox(code).await {
                broken = Some(why.to_string());
                code = Some(137);
            }
        }
        // Say so when the end is not what the process told us: the stream
        // broke, or the engine could not report the exit status (it was
        // restarted, the container vanished).
        if code.is_none() && !timed_out && !killed {
            broken.get_or_insert_with(|| "the engine did not report how the command ended".into());
        }
        if let Some(message) = &broken {
            self.cmd.log.error(message);
        }
        drop(control);
        let exit = if timed_out {
            ExitInfo {
                exit_code: 124,
                timed_out: true,
                killed: false,
            }
        } else if killed {
            // The supervisor reports 143 or 137; when the fallback sweep ran
            // instead, the supervisor itself was among those it signalled,
            // so the sweep's own verdict is the one that counts.
            let verdict = if swept { sweep_code } else { code };
            ExitInfo {
                exit_code: if verdict == Some(143) { 143 } else { 137 },
                timed_out: false,
                killed: true,
            }
        } else {
            ExitInfo {
                // A vanished container or engine leaves no code: report it
                // as killed by SIGKILL, which is what happened to it.
                exit_code: code.unwrap_or(137),
                timed_out: false,
                killed: false,
            }
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let outcome = if exit.timed_out {
            "timeout"
        } else if exit.killed {
            "killed"
        } else if exit.exit_code == 0 {
            "exit_zero"
        } else {
            "exit_nonzero"
        };
        crate::telemetry::command_ended(outcome, started.elapsed().as_secs_f64());
        self.cmd.log.finish(exit);
        let (out_bytes, err_bytes) = self.cmd.log.byte_counts();
        tracing::info!(
            event = "command_ended",
            sandbox_id = %self.cmd.sandbox_id,
            session_key = %self.sandbox.session_key,
            command_id = %self.cmd.id,
            exit_code = exit.exit_code,
            timed_out = exit.timed_out,
            killed = exit.killed,
            duration_ms,
            stdout_bytes = out_bytes,
            stderr_bytes = err_bytes,
            "command ended"
        );
        self.cmd.finished.send_replace(Some(Finished {
            exit,
            duration_ms,
            finished_at: now_ms(),
        }));
    }
}

impl Drive {
    /// One look at the sandbox: whether the command's end is (or will be)
    /// the sandbox's, and why. An engine that does not answer within a
    /// second counts as alive.
    async fn look_at_sandbox(&self) -> SandboxEnd {
        let now = self.sandbox.stops();
        if now.planned != self.stops.planned {
            return SandboxEnd::Ended("the sandbox was restarted or stopped while the command ran");
        }
        if now.unexpected != self.stops.unexpected {
            return SandboxEnd::Ended(
                "the sandbox stopped while the command ran and was started again",
            );
        }
        let status = tokio::time::timeout(
            LIVENESS_TIMEOUT,
            self.sandboxes.container_status(&self.sandbox),
        )
        .await;
        match status {
            Ok(Ok(Some(status))) if !status.running => SandboxEnd::Ended(if status.oom_killed {
                "the sandbox ran out of memory and stopped; it starts again on the next request"
            } else {
                "the sandbox stopped while the command ran; it starts again on the next request"
            }),
            Ok(Ok(None)) => SandboxEnd::Gone,
            _ => SandboxEnd::Alive,
        }
    }

    /// Why the command's end is the sandbox's, if it is: sandboxd restarted
    /// or stopped it (the engine then reports a kill, or 126 when the exec
    /// had not quite started), or it stopped (or was revived since) on its
    /// own. runsc answers 128 when its sandbox died under an exec, possibly
    /// before the engine has noticed the container's end: under gVisor look
    /// again briefly then.
    async fn death_of_sandbox(&self, code: Option<i64>) -> Option<&'static str> {
        let looks = if self.under_gvisor && matches!(code, None | Some(128)) {
            10
        } else {
            1
        };
        for look in 0..looks {
            if look > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            match self.look_at_sandbox().await {
                SandboxEnd::Ended(why) => return Some(why),
                SandboxEnd::Gone => return None,
                SandboxEnd::Alive => {}
            }
        }
        None
    }
}

/// What a look at a command's sandbox found.
enum SandboxEnd {
    Alive,
    /// The container is gone; the engine's own answer says the rest.
    Gone,
    /// The sandbox ended under the command, for this reason.
    Ended(&'static str),
}
