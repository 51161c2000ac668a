//! Commands: each one a keeper process (see `keeper`) running it, a task
//! here (its runner) that drains its output into its [`Log`], enforces its
//! timeout, passes kills to the keeper and records its end; and the table
//! of all of them, with the settings sandboxd sent. One keeper is started
//! ahead of need and waits for the next command (the spare): when the
//! agent starts, and again when a command's own process has ended, not
//! while a command starts (under gVisor a process creation then slowed
//! the command's round trip by a third).
//!
//! A command ends when its own process exits, whatever it left running;
//! what the leftovers print later is still recorded after the `exit`
//! record, and they stay killable until they are gone. When the sandbox
//! runs out of processes or memory, the leftovers of finished commands are
//! ended first, largest first (see [`Commands::relieve`]); running
//! commands and the agent are never chosen.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use sandboxd_proto::{
    CommandMeta, CommandState, Ended, Failure, FailureKind, Spawn, Stream, Usage,
};
use tokio::net::unix::pipe;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio_util::codec::Framed;

use crate::changes::{Report, Watch, WatchBudget, Watching};
use crate::keeper::{self, FromKeeper, ToKeeper};
use crate::log::{Log, Tail};
use crate::{cgroup, tree};

/// How often a runner that waits for a reader looks whether it still must.
const ROOM_RECHECK: Duration = Duration::from_millis(250);
/// How much a runner reads from a pipe at once.
const READ_CHUNK: usize = 64 * 1024;
/// How long a spawn may take before it counts as failed.
const SPAWN_WITHIN: Duration = Duration::from_secs(10);
/// How long a spawn may retry while the sandbox is at its pids limit.
const SPAWN_RETRY_FOR: Duration = Duration::from_secs(5);
/// Why a command was refused at the pids limit.
const AT_PIDS_LIMIT: &str =
    "no process can be started: the sandbox is at its pids limit and running commands hold it";
/// Headroom under the pids limit below which leftovers are ended.
const PIDS_HEADROOM: u64 = 16;
/// Share of the memory limit above which leftovers are ended.
const MEMORY_HIGH: f64 = 0.9;

/// What sandboxd set in its hello; defaults until then.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) workspace: String,
    pub(crate) grace: Duration,
    pub(crate) ring_bytes: usize,
    pub(crate) memory_bytes: usize,
    pub(crate) max_finished: usize,
    /// The pids limit sandboxd set (0: not known).
    pub(crate) pids_limit: u64,
    /// Most inotify watches held for `changes` at once (see
    /// [`WatchBudget`]).
    pub(crate) watch_budget: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            workspace: "/workspace".into(),
            grace: Duration::from_secs(2),
            ring_bytes: 8 << 20,
            memory_bytes: 64 << 20,
            max_finished: 100,
            pids_limit: 0,
            watch_budget: 8192,
        }
    }
}

/// Asks a command's runner to do something.
#[derive(Debug)]
enum Control {
    /// End the tree; answered once SIGTERM is on its way.
    Kill(oneshot::Sender<()>),
    /// End a finished command's leftovers now, saying why.
    Relieve(String),
}

/// One command.
#[derive(Debug)]
pub(crate) struct Cmd {
    pub(crate) id: String,
    meta: CommandMeta,
    started: Instant,
    pub(crate) log: RefCell<Log>,
    tails: RefCell<Option<[Tail; 2]>>,
    /// What it changed in the workspace, once it ended (when it was
    /// started with `changes`).
    changes: RefCell<Option<Report>>,
    ended: RefCell<Option<Ended>>,
    /// Bumped on every change of the log or the state.
    changed: watch::Sender<u64>,
    /// A reader moved on: output held back for it may flow again.
    room: Notify,
    control: mpsc::Sender<Control>,
    /// The keeper's pid while it lives (the tree is alive).
    keeper: Cell<Option<i32>>,
    /// Both pipes are closed: no output can come any more.
    output_closed: Cell<bool>,
}

impl Cmd {
    fn touch(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(crate) fn ended(&self) -> Option<Ended> {
        self.ended.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(crate) fn output_closed(&self) -> bool {
        self.output_closed.get()
    }

    /// A reader moved: wake a runner that waits for room.
    pub(crate) fn reader_moved(&self) {
        self.room.notify_waiters();
    }

    fn processes(&self) -> u32 {
        match self.keeper.get() {
            Some(k) => tree::descendants(k, &tree::snapshot()).len() as u32,
            None => 0,
        }
    }

    pub(crate) fn state(&self) -> CommandState {
        CommandState {
            command: self.id.clone(),
            meta: self.meta.clone(),
            ended: self.ended(),
            processes: self.processes(),
        }
    }

    /// The last `tail_bytes` of each stream, if it was started with them.
    pub(crate) fn tails(&self) -> Option<[(String, u64); 2]> {
        self.tails
            .borrow()
            .as_ref()
            .map(|[o, e]| [o.finish(), e.finish()])
    }

    /// Whether it was started with `changes`.
    pub(crate) fn watched(&self) -> bool {
        self.meta.changes
    }

    /// What it changed, once it ended.
    pub(crate) fn changes(&self) -> Option<Report> {
        self.changes.borrow().clone()
    }

    /// Ends the tree (running or left over); resolves once SIGTERM is sent.
    pub(crate) async fn kill(&self) {
        let (ack, sent) = oneshot::channel();
        if self.control.send(Control::Kill(ack)).await.is_ok() {
            let _ = sent.await;
        }
    }
}

/// Every command, and how to start more.
#[derive(Debug)]
pub(crate) struct Commands {
    settings: RefCell<Settings>,
    /// The inotify watches `changes` may hold, shared by every command.
    watch_budget: Rc<WatchBudget>,
    table: RefCell<BTreeMap<String, Rc<Cmd>>>,
    /// Pids of live keepers, recorded the moment each is started (before
    /// its command is in the table), so none is taken for an orphan.
    keepers: RefCell<HashSet<i32>>,
    /// This binary, started again as each command's keeper.
    exe: PathBuf,
    /// A keeper started ahead of the next command, waiting for its start
    /// message: a command then costs one process creation, not two (under
    /// gVisor each is several milliseconds).
    spare: RefCell<Option<StartedKeeper>>,
    /// A spare is being started.
    refilling: Cell<bool>,
}

/// A started keeper: its process, its control socket and the read ends of
/// its command's output pipes.
#[derive(Debug)]
struct StartedKeeper {
    child: std::process::Child,
    control: tokio::net::UnixStream,
    out: pipe::Receiver,
    err: pipe::Receiver,
}

impl StartedKeeper {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether it still waits for its start: a keeper that died (the
    /// sandbox user may kill it) has closed its end of the control socket.
    fn is_waiting(&self) -> bool {
        matches!(
            self.control.try_read(&mut [0u8; 1]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        )
    }
}

/// The parts of a keeper as started, before they join the runtime.
type KeeperParts = (
    std::process::Child,
    std::os::unix::net::UnixStream,
    OwnedFd,
    OwnedFd,
);

impl Commands {
    pub(crate) fn new(exe: PathBuf) -> Rc<Commands> {
        Rc::new(Commands {
            settings: RefCell::new(Settings::default()),
            watch_budget: Rc::new(WatchBudget::new(Settings::default().watch_budget)),
            table: RefCell::new(BTreeMap::new()),
            keepers: RefCell::new(HashSet::new()),
            exe,
            spare: RefCell::new(None),
            refilling: Cell::new(false),
        })
    }

    /// Starts a spare keeper in the background unless there is one (or
    /// one is starting). A spare that cannot start (the sandbox at its
    /// pids limit) is simply not there: the next command starts its own.
    pub(crate) fn refill_spare(self: &Rc<Self>) {
        if self.spare.borrow().is_some() || self.refilling.replace(true) {
            return;
        }
        let this = Rc::clone(self);
        // After what is already woken (the answer to a wait for the command
        // that just ended): it does not wait for this. On the agent's
        // thread, not a blocking pool's: a pool thread is a process of the
        // sandbox's pids limit that comes and goes.
        tokio::task::spawn_local(async move {
            tokio::task::yield_now().await;
            let parts = spawn_keeper(&this.exe, true);
            this.refilling.set(false);
            if let Ok(parts) = parts
                && let Ok(keeper) = this.adopt_keeper(parts)
            {
                this.keep_as_spare(keeper);
            }
        });
    }

    /// Makes `keeper` (waiting for a start) the spare, or ends it when
    /// there is one.
    fn keep_as_spare(&self, mut keeper: StartedKeeper) {
        let mut spare = self.spare.borrow_mut();
        if spare.is_none() {
            *spare = Some(keeper);
        } else {
            self.keepers.borrow_mut().remove(&keeper.pid());
            let _ = keeper.child.kill();
        }
    }

    /// Records a started keeper as one and turns its ends into the
    /// runtime's.
    fn adopt_keeper(
        &self,
        (child, ours, out_r, err_r): KeeperParts,
    ) -> std::io::Result<StartedKeeper> {
        self.keepers.borrow_mut().insert(child.id() as i32);
        ours.set_nonblocking(true)?;
        Ok(StartedKeeper {
            child,
            control: tokio::net::UnixStream::from_std(ours)?,
            out: pipe::Receiver::from_owned_fd(out_r)?,
            err: pipe::Receiver::from_owned_fd(err_r)?,
        })
    }

    pub(crate) fn configure(&self, settings: Settings) {
        self.watch_budget.set_limit(settings.watch_budget);
        *self.settings.borrow_mut() = settings;
    }

    pub(crate) fn settings(&self) -> Settings {
        self.settings.borrow().clone()
    }

    pub(crate) fn get(&self, id: &str) -> Result<Rc<Cmd>, Failure> {
        self.table
            .borrow()
            .get(id)
            .cloned()
            .ok_or_else(|| Failure::new(FailureKind::NoSuchCommand, format!("no command {id}")))
    }

    pub(crate) fn states(&self) -> Vec<CommandState> {
        let all: Vec<Rc<Cmd>> = self.table.borrow().values().cloned().collect();
        all.iter().map(|c| c.state()).collect()
    }

    /// Whether `pid` is a live keeper (a process the agent started).
    pub(crate) fn is_keeper(&self, pid: i32) -> bool {
        self.keepers.borrow().contains(&pid)
    }

    /// The most recently started command.
    pub(crate) fn latest(&self) -> Option<Rc<Cmd>> {
        self.table
            .borrow()
            .values()
            .max_by_key(|c| (c.meta.started_at_ms, c.id.clone()))
            .cloned()
    }

    /// Drops a finished command; a running one stays.
    pub(crate) fn forget(&self, id: &str) -> Result<(), Failure> {
        let cmd = self.get(id)?;
        if cmd.ended().is_none() {
            return Err(Failure::new(
                FailureKind::StillRunning,
                format!("command {id} is still running"),
            ));
        }
        // What it left stays killable through it while it runs.
        let left = cmd.processes();
        if left > 0 {
            return Err(Failure::new(
                FailureKind::StillRunning,
                format!("command {id} left {left} processes running"),
            ));
        }
        self.table.borrow_mut().remove(id);
        Ok(())
    }

    /// Starts a command; resolves once it runs (or could not start, which
    /// makes a command that ended at once).
    pub(crate) async fn spawn(self: &Rc<Self>, spec: Spawn) -> Result<u32, Failure> {
        let valid_id = spec.command.len() == 24
            && spec
                .command
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !valid_id || spec.argv.is_empty() {
            return Err(Failure::new(FailureKind::Invalid, "bad command id or argv"));
        }
        if self.table.borrow().contains_key(&spec.command) {
            return Err(Failure::new(
                FailureKind::DuplicateCommand,
                format!("command {} exists", spec.command),
            ));
        }
        let settings = self.settings();
        let timeout = Duration::from_millis(spec.meta.timeout_ms);
        let started = Instant::now();
        let oom_before = cgroup::oom_kills();
        let start = ToKeeper::Start(keeper::Start {
            program: None,
            argv: spec.argv,
            env: spec.env,
            cwd: spec.cwd.unwrap_or_else(|| settings.workspace.clone()),
            stdin: spec.stdin,
            terminal: false,
        });
        let body = sandboxd_proto::encode(&start)
            .map_err(|e| Failure::new(FailureKind::Invalid, format!("the start: {e}")))?;
        // Before the command runs, so that all it does is seen.
        let mut workspace_watch = spec
            .changes
            .as_ref()
            .map(|c| Watch::start(&settings.workspace, c, &self.watch_budget));
        let (mut child, framed, out, err, first) = loop {
            let (keeper, was_spare) = self.keeper_for_command().await?;
            let StartedKeeper {
                mut child,
                control,
                out,
                err,
            } = keeper;
            let keeper_pid = child.id() as i32;
            let mut framed = Framed::new(control, keeper::codec());
            let first = async {
                let retry_until = Instant::now() + SPAWN_RETRY_FOR;
                loop {
                    framed.send(body.clone()).await?;
                    let answer = match framed.next().await {
                        Some(Ok(frame)) => sandboxd_proto::decode::<FromKeeper>(&frame)
                            .map_err(std::io::Error::other)?,
                        Some(Err(e)) => return Err(e),
                        None => return Err(std::io::Error::other("the keeper exited")),
                    };
                    // At the pids limit: end leftovers, then ask again.
                    if answer == FromKeeper::NoProcesses && Instant::now() < retry_until {
                        self.relieve("the sandbox reached its pids limit");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    return Ok(answer);
                }
            };
            match tokio::time::timeout(SPAWN_WITHIN, first).await {
                Ok(Ok(m)) => break (child, framed, out, err, m),
                Ok(Err(e)) => {
                    self.keepers.borrow_mut().remove(&keeper_pid);
                    let _ = child.kill();
                    // The spare died after it was checked: a new keeper.
                    if was_spare {
                        continue;
                    }
                    return Err(Failure::new(
                        FailureKind::Other,
                        format!("the command's keeper failed: {e}"),
                    ));
                }
                Err(_) => {
                    self.keepers.borrow_mut().remove(&keeper_pid);
                    let _ = child.kill();
                    return Err(Failure::new(
                        FailureKind::NoProcesses,
                        "the command did not start in time (is the sandbox at its pids limit?)",
                    ));
                }
            }
        };
        let keeper_pid = child.id() as i32;
        if first == FromKeeper::NoProcesses {
            // The keeper stays, waiting for another start: a refusal frees
            // no process for whatever holds the sandbox at its limit.
            self.keep_as_spare(StartedKeeper {
                child,
                control: framed.into_inner(),
                out,
                err,
            });
            return Err(Failure::new(FailureKind::NoProcesses, AT_PIDS_LIMIT));
        }
        let (tx, rx) = mpsc::channel(8);
        let (shape, awaits_reader) = (spec.meta.shape, spec.awaits_reader);
        let cmd = Rc::new(Cmd {
            id: spec.command.clone(),
            meta: spec.meta,
            started,
            log: RefCell::new({
                let mut log = Log::new(settings.ring_bytes);
                if !awaits_reader {
                    log.expect_no_first_reader();
                }
                if let Some(shape) = shape {
                    log.shape(shape);
                }
                log
            }),
            tails: RefCell::new((spec.tail_bytes > 0).then(|| {
                [
                    Tail::new(spec.tail_bytes as usize),
                    Tail::new(spec.tail_bytes as usize),
                ]
            })),
            changes: RefCell::new(None),
            ended: RefCell::new(None),
            changed: watch::channel(0).0,
            room: Notify::new(),
            control: tx,
            keeper: Cell::new(Some(keeper_pid)),
            output_closed: Cell::new(false),
        });
        let pid = match first {
            FromKeeper::Started { pid } => pid,
            FromKeeper::Failed { exit_code, message } => {
                cmd.append(Stream::Stderr, message.as_bytes());
                *cmd.changes.borrow_mut() = workspace_watch.take().map(Watch::conclude);
                cmd.finish(exit_code, false, false, Usage::default(), false);
                0
            }
            other => {
                self.keepers.borrow_mut().remove(&keeper_pid);
                let _ = child.kill();
                return Err(Failure::new(
                    FailureKind::Other,
                    format!("the keeper answered {other:?} to a start"),
                ));
            }
        };
        self.table
            .borrow_mut()
            .insert(cmd.id.clone(), Rc::clone(&cmd));
        self.prune();
        let runner = Runner {
            commands: Rc::clone(self),
            cmd,
            keeper_pid,
            keeper: framed,
            out: Some(out),
            err: Some(err),
            deadline: started + timeout,
            grace: settings.grace,
            oom_before,
            stopping: None,
            main_usage: None,
            watching: workspace_watch.map(Watch::spawn),
        };
        tokio::task::spawn_local(runner.run(rx));
        Ok(pid)
    }

    /// A keeper for a new command: the spare while it waits (and whether
    /// it was the spare), else a new one.
    async fn keeper_for_command(&self) -> Result<(StartedKeeper, bool), Failure> {
        let spare = self.spare.borrow_mut().take();
        if let Some(mut k) = spare {
            if k.is_waiting() {
                return Ok((k, true));
            }
            self.keepers.borrow_mut().remove(&k.pid());
            let _ = k.child.kill();
        }
        Ok((self.start_keeper().await?, false))
    }

    /// Starts a keeper with a control socket and the output pipes; while
    /// the sandbox is at its pids limit, ends leftovers and tries again.
    async fn start_keeper(&self) -> Result<StartedKeeper, Failure> {
        let parts = self
            .spawn_with_room(|| spawn_keeper(&self.exe, false))
            .await?;
        self.adopt_keeper(parts)
            .map_err(|e| Failure::new(FailureKind::Other, format!("the keeper's ends: {e}")))
    }

    /// Starts a keeper for a terminal session: `terminal` (a pty's slave)
    /// is its stdout and stderr. While the sandbox is at its pids limit,
    /// ends leftovers and tries again, like a command's. The keeper counts
    /// as one until [`Commands::keeper_done`].
    pub(crate) async fn start_terminal_keeper(
        &self,
        terminal: OwnedFd,
    ) -> Result<(std::process::Child, tokio::net::UnixStream), Failure> {
        let (mut child, ours) = self
            .spawn_with_room(|| {
                let (out, err) = (terminal.try_clone()?, terminal.try_clone()?);
                spawn_keeper_on(&self.exe, out, err, false)
            })
            .await?;
        self.keepers.borrow_mut().insert(child.id() as i32);
        let control = ours
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(ours));
        match control {
            Ok(control) => Ok((child, control)),
            Err(e) => {
                self.keeper_done(child.id() as i32);
                let _ = child.kill();
                Err(Failure::new(
                    FailureKind::Other,
                    format!("the keeper's control socket: {e}"),
                ))
            }
        }
    }

    /// Runs `spawn` until it starts a process; while the sandbox is at its
    /// pids limit (EAGAIN), ends leftovers and tries again for
    /// [`SPAWN_RETRY_FOR`], then refuses as [`FailureKind::NoProcesses`].
    async fn spawn_with_room<T>(
        &self,
        mut spawn: impl FnMut() -> std::io::Result<T>,
    ) -> Result<T, Failure> {
        let deadline = Instant::now() + SPAWN_RETRY_FOR;
        loop {
            match spawn() {
                Ok(started) => return Ok(started),
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::AGAIN.raw_os_error()) => {
                    if Instant::now() >= deadline {
                        return Err(Failure::new(FailureKind::NoProcesses, AT_PIDS_LIMIT));
                    }
                    self.relieve("the sandbox reached its pids limit");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    return Err(Failure::new(
                        FailureKind::Other,
                        format!("starting the keeper: {e}"),
                    ));
                }
            }
        }
    }

    /// A keeper has exited (or was killed): its orphans are no longer
    /// spared by [`Commands::end_orphans`].
    pub(crate) fn keeper_done(&self, pid: i32) {
        self.keepers.borrow_mut().remove(&pid);
    }

    /// Keeps finished commands within `max_finished` (oldest go first) and
    /// all logs within the memory budget (finished logs are emptied first,
    /// oldest first, then running ones are halved).
    pub(crate) fn prune(&self) {
        let settings = self.settings();
        let mut finished: Vec<(u64, String)> = self
            .table
            .borrow()
            .values()
            .filter(|c| c.ended().is_some() && c.keeper.get().is_none())
            .map(|c| (c.meta.started_at_ms, c.id.clone()))
            .collect();
        if finished.len() > settings.max_finished {
            finished.sort();
            let extra = finished.len() - settings.max_finished;
            let mut table = self.table.borrow_mut();
            for (_, id) in finished.into_iter().take(extra) {
                table.remove(&id);
            }
        }
        let mut logs: Vec<Rc<Cmd>> = self.table.borrow().values().cloned().collect();
        let mut total: usize = logs.iter().map(|c| c.log.borrow().retained()).sum();
        if total <= settings.memory_bytes {
            return;
        }
        logs.sort_by_key(|c| (c.ended().is_none(), c.meta.started_at_ms));
        for c in logs {
            if total <= settings.memory_bytes {
                return;
            }
            let mut log = c.log.borrow_mut();
            let before = log.retained();
            let keep = if c.ended().is_some() { 0 } else { before / 2 };
            log.trim_to(keep);
            total = total - before + log.retained();
            drop(log);
            c.touch();
        }
    }

    /// When the sandbox is near its pids or memory limit, ends the largest
    /// tree of leftovers of a finished command (one per call) and says so
    /// in that command's log. Running commands are never chosen.
    pub(crate) fn relieve_if_pressed(&self) {
        // Only leftovers are ever ended. Without any, nothing is read: at
        // the pids limit (a running fork bomb) even listing `/proc` is
        // slow under gVisor, and would stall the agent every round.
        if !self.has_leftovers() {
            return;
        }
        let pids = cgroup::pids()
            .or_else(|| cgroup::counted_pids(self.settings.borrow().pids_limit))
            .filter(|l| l.used + PIDS_HEADROOM >= l.max);
        let memory = cgroup::memory().filter(|l| l.used as f64 >= l.max as f64 * MEMORY_HIGH);
        if let Some(l) = pids {
            self.relieve(&format!(
                "the sandbox reached its pids limit ({} of {})",
                l.used, l.max
            ));
        } else if let Some(l) = memory {
            self.relieve(&format!(
                "the sandbox neared its memory limit ({} of {} MiB)",
                l.used >> 20,
                l.max >> 20
            ));
        }
    }

    /// Whether a finished command's keeper still watches processes.
    fn has_leftovers(&self) -> bool {
        self.table
            .borrow()
            .values()
            .any(|c| c.ended().is_some() && c.keeper.get().is_some())
    }

    /// Ends the largest leftover tree, if there is one; see
    /// [`Commands::relieve_if_pressed`].
    pub(crate) fn relieve(&self, why: &str) {
        if !self.has_leftovers() {
            return;
        }
        let procs = tree::snapshot();
        let by_memory = why.contains("memory");
        let victim = self
            .table
            .borrow()
            .values()
            .filter(|c| c.ended().is_some())
            .filter_map(|c| {
                let k = c.keeper.get()?;
                let tree = tree::descendants(k, &procs);
                let size = if by_memory {
                    tree.iter().map(|p| p.rss_kb).sum::<u64>()
                } else {
                    tree.len() as u64
                };
                (!tree.is_empty()).then(|| (size, Rc::clone(c)))
            })
            .max_by_key(|(size, c)| (*size, c.meta.started_at_ms));
        if let Some((_, c)) = victim {
            let _ = c.control.try_send(Control::Relieve(why.to_string()));
        }
    }
}

impl Commands {
    /// Ends processes that became the agent's children without being
    /// keepers: the tree of a keeper that was killed. Called when one is.
    pub(crate) fn end_orphans(&self) {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        for _ in 0..20 {
            let procs = tree::snapshot();
            let orphans: Vec<i32> = procs
                .iter()
                .filter(|p| p.ppid == me && !self.is_keeper(p.pid))
                .map(|p| p.pid)
                .collect();
            if orphans.is_empty() {
                return;
            }
            let mut all = orphans.clone();
            for o in &orphans {
                all.extend(tree::descendants(*o, &procs).iter().map(|p| p.pid));
            }
            tree::signal_all(all.iter().copied(), rustix::process::Signal::STOP);
            tree::signal_all(all, rustix::process::Signal::KILL);
            tree::reap();
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Starts `exe keep` with a control socket on its stdin and new pipes on
/// its stdout and stderr; returns the process and the agent's ends.
/// `ahead`: the spare, which starts its command's process ahead.
fn spawn_keeper(exe: &std::path::Path, ahead: bool) -> std::io::Result<KeeperParts> {
    let (out_r, out_w) = pipe_pair()?;
    let (err_r, err_w) = pipe_pair()?;
    let (child, ours) = spawn_keeper_on(exe, out_w, err_w, ahead)?;
    Ok((child, ours, out_r, err_r))
}

/// Starts `exe keep` with a control socket on its stdin and `out` and
/// `err` as its stdout and stderr; returns the process and the agent's
/// end of the socket.
fn spawn_keeper_on(
    exe: &std::path::Path,
    out: OwnedFd,
    err: OwnedFd,
    ahead: bool,
) -> std::io::Result<(std::process::Child, std::os::unix::net::UnixStream)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let child = std::process::Command::new(exe)
        .arg("keep")
        .args(ahead.then_some("--ahead"))
        .current_dir("/")
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()?;
    Ok((child, ours))
}

fn pipe_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(std::io::Error::from)
}

impl Cmd {
    /// Records output (and keeps the tails).
    fn append(&self, stream: Stream, bytes: &[u8]) {
        self.log.borrow_mut().append(stream, bytes);
        if let Some(t) = self.tails.borrow_mut().as_mut() {
            t[usize::from(stream == Stream::Stderr)].push(bytes);
        }
        self.touch();
    }

    /// Records the end, once.
    fn finish(&self, exit_code: i32, timed_out: bool, killed: bool, usage: Usage, oom: bool) {
        if self.ended.borrow().is_some() {
            return;
        }
        let ended = self.log.borrow_mut().finish(Ended {
            exit_code,
            timed_out,
            killed,
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            oom_killed: oom,
            usage,
            seq: 0,
        });
        *self.ended.borrow_mut() = Some(ended);
        self.touch();
    }
}

/// Why the tree is being ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopCause {
    Timeout,
    Kill,
    /// A finished command's leftovers (a kill, or to make room).
    Leftovers,
}

/// The task that owns one command: see the module docs.
struct Runner {
    commands: Rc<Commands>,
    cmd: Rc<Cmd>,
    keeper_pid: i32,
    keeper: Framed<tokio::net::UnixStream, tokio_util::codec::LengthDelimitedCodec>,
    out: Option<pipe::Receiver>,
    err: Option<pipe::Receiver>,
    deadline: Instant,
    grace: Duration,
    oom_before: Option<u64>,
    stopping: Option<StopCause>,
    /// What the command's own process used, once it ended.
    main_usage: Option<Usage>,
    /// The workspace's watch while the command runs.
    watching: Option<Watching>,
}

/// What woke the runner.
enum Woke {
    Keeper(Option<std::io::Result<FromKeeper>>),
    Output(Stream, std::io::Result<usize>, Vec<u8>),
    Timeout,
    Control(Option<Control>),
    Room,
}

impl Runner {
    async fn run(mut self, mut control: mpsc::Receiver<Control>) {
        let mut keeper_open = true;
        let mut control_open = true;
        loop {
            if !keeper_open && self.out.is_none() && self.err.is_none() {
                break;
            }
            let now = Instant::now();
            let wait_for_room = self.cmd.log.borrow().must_wait(READ_CHUNK, now);
            let running = self.cmd.ended().is_none() && self.stopping.is_none();
            let woke = tokio::select! {
                m = self.keeper.next(), if keeper_open => Woke::Keeper(m.map(|r| r.and_then(|f| {
                    sandboxd_proto::decode::<FromKeeper>(&f).map_err(std::io::Error::other)
                }))),
                r = read_some(self.out.as_ref()), if self.out.is_some() && !wait_for_room => {
                    Woke::Output(Stream::Stdout, r.0, r.1)
                }
                r = read_some(self.err.as_ref()), if self.err.is_some() && !wait_for_room => {
                    Woke::Output(Stream::Stderr, r.0, r.1)
                }
                _ = tokio::time::sleep_until(self.deadline.into()), if running => Woke::Timeout,
                c = control.recv(), if control_open => Woke::Control(c),
                _ = self.cmd.room.notified(), if wait_for_room => Woke::Room,
                // A reader that went idle stops holding output back.
                _ = tokio::time::sleep(ROOM_RECHECK), if wait_for_room => Woke::Room,
            };
            match woke {
                Woke::Room => {}
                Woke::Output(stream, Ok(0), _) => self.close(stream),
                Woke::Output(stream, Ok(n), buf) => self.cmd.append(stream, &buf[..n]),
                Woke::Output(stream, Err(e), _) => {
                    if e.kind() != std::io::ErrorKind::WouldBlock {
                        self.close(stream);
                    }
                }
                Woke::Timeout => self.stop(StopCause::Timeout).await,
                Woke::Control(None) => control_open = false,
                Woke::Control(Some(Control::Kill(ack))) => {
                    let cause = if self.cmd.ended().is_some() {
                        StopCause::Leftovers
                    } else {
                        StopCause::Kill
                    };
                    self.stop(cause).await;
                    let _ = ack.send(());
                }
                Woke::Control(Some(Control::Relieve(why))) => {
                    if self.cmd.ended().is_some() && self.cmd.keeper.get().is_some() {
                        let n = self.cmd.processes();
                        self.cmd.log.borrow_mut().error(&format!(
                            "sandboxd-agent ended the {n} processes this command left running: {why}"
                        ));
                        self.cmd.touch();
                        eprintln!(
                            "sandboxd-agent: ended the leftovers of command {} ({n} processes): {why}",
                            self.cmd.id
                        );
                        self.stopping = Some(StopCause::Leftovers);
                        let _ = self.send(&ToKeeper::Kill).await;
                    }
                }
                Woke::Keeper(Some(Ok(ev))) => {
                    if self.on_keeper(ev).await {
                        keeper_open = false;
                    }
                }
                Woke::Keeper(Some(Err(_)) | None) => {
                    keeper_open = false;
                    self.keeper_gone().await;
                }
            }
        }
        self.cmd.log.borrow_mut().flush_carry();
        self.cmd.output_closed.set(true);
        self.cmd.touch();
        self.commands.keepers.borrow_mut().remove(&self.keeper_pid);
    }

    async fn send(&mut self, msg: &ToKeeper) -> std::io::Result<()> {
        let body = sandboxd_proto::encode(msg).map_err(std::io::Error::other)?;
        self.keeper.send(body).await
    }

    fn close(&mut self, stream: Stream) {
        match stream {
            Stream::Stdout => self.out = None,
            Stream::Stderr => self.err = None,
        }
        if self.out.is_none() && self.err.is_none() {
            self.cmd.output_closed.set(true);
            self.cmd.touch();
        }
    }

    /// Begins ending the tree (once; a kill during a timeout changes
    /// nothing).
    async fn stop(&mut self, cause: StopCause) {
        if self.stopping.is_some() || self.cmd.keeper.get().is_none() {
            return;
        }
        self.stopping = Some(cause);
        let grace_ms = u64::try_from(self.grace.as_millis()).unwrap_or(u64::MAX);
        let _ = self.send(&ToKeeper::Stop { grace_ms }).await;
    }

    /// Handles a keeper event; true when the keeper is done.
    async fn on_keeper(&mut self, ev: FromKeeper) -> bool {
        match ev {
            FromKeeper::Exited {
                code,
                signal,
                usage,
            } => {
                self.main_usage = Some(usage);
                if matches!(self.stopping, None | Some(StopCause::Leftovers)) {
                    self.drain().await;
                    let oom = signal == Some(9)
                        && matches!(
                            (self.oom_before, cgroup::oom_kills()),
                            (Some(before), Some(now)) if now > before
                        );
                    let exit_code = code.unwrap_or_else(|| 128 + signal.unwrap_or(9));
                    self.conclude_changes().await;
                    self.cmd.finish(exit_code, false, false, usage, oom);
                }
                self.commands.refill_spare();
                false
            }
            FromKeeper::Stopped { within_grace } => {
                if self.cmd.ended().is_none() {
                    self.drain().await;
                    self.conclude_changes().await;
                    let usage = self.main_usage.unwrap_or_default();
                    match self.stopping {
                        Some(StopCause::Timeout) => self.cmd.finish(124, true, false, usage, false),
                        _ => {
                            let code = if within_grace { 143 } else { 137 };
                            self.cmd.finish(code, false, true, usage, false);
                        }
                    }
                }
                self.stopping = None;
                self.commands.refill_spare();
                false
            }
            FromKeeper::Empty => {
                self.cmd.keeper.set(None);
                self.cmd.touch();
                true
            }
            FromKeeper::Started { .. } | FromKeeper::Failed { .. } | FromKeeper::NoProcesses => {
                false
            }
        }
    }

    /// The keeper died without saying so (something in the sandbox killed
    /// it): its orphans now belong to the agent, which ends them.
    async fn keeper_gone(&mut self) {
        let Some(pid) = self.cmd.keeper.take() else {
            return;
        };
        if self.cmd.ended().is_none() {
            self.drain().await;
            self.cmd.log.borrow_mut().error(
                "the command's keeper process was killed from inside the sandbox; its processes were ended",
            );
            self.conclude_changes().await;
            let usage = self.main_usage.unwrap_or_default();
            self.cmd.finish(137, false, false, usage, false);
        }
        eprintln!(
            "sandboxd-agent: the keeper {pid} of command {} died",
            self.cmd.id
        );
        self.commands.end_orphans();
        self.cmd.touch();
    }

    /// Ends the workspace's watch and keeps what it found, before the end
    /// is recorded: whoever learns of the end can ask for it.
    async fn conclude_changes(&mut self) {
        if let Some(w) = self.watching.take() {
            let report = w.finish().await;
            *self.cmd.changes.borrow_mut() = Some(report);
        }
    }

    /// Reads what the pipes hold now (the command's own process has ended,
    /// so all it wrote is there), before the exit record goes in. A reader
    /// who keeps reading is waited for here too (at most FOLLOWER_IDLE for
    /// one that stops asking), so the end loses nothing it has not read.
    async fn drain(&mut self) {
        let mut buf = vec![0u8; READ_CHUNK];
        for stream in [Stream::Stdout, Stream::Stderr] {
            loop {
                // As in the main loop: a reader that keeps reading is
                // waited for, so what is drained pushes out nothing unread.
                while self.cmd.log.borrow().must_wait(READ_CHUNK, Instant::now()) {
                    tokio::select! {
                        _ = self.cmd.room.notified() => {}
                        _ = tokio::time::sleep(ROOM_RECHECK) => {}
                    }
                }
                let rx = match stream {
                    Stream::Stdout => self.out.as_ref(),
                    Stream::Stderr => self.err.as_ref(),
                };
                let Some(rx) = rx else { break };
                match rx.try_read(&mut buf) {
                    Ok(0) => {
                        self.close(stream);
                        break;
                    }
                    Ok(n) => self.cmd.append(stream, &buf[..n]),
                    Err(_) => break,
                }
            }
        }
    }
}

/// Waits until `rx` is readable and reads a chunk.
async fn read_some(rx: Option<&pipe::Receiver>) -> (std::io::Result<usize>, Vec<u8>) {
    let Some(rx) = rx else {
        return (Ok(0), Vec::new());
    };
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        if let Err(e) = rx.readable().await {
            return (Err(e), buf);
        }
        match rx.try_read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return (r, buf),
        }
    }
}
