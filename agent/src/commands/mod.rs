//! Commands: each one a keeper process (see `keeper`) running it, a task
//! here (its runner) that drains its output into its [`Log`], enforces its
//! timeout, passes kills to the keeper and records its end; and the table
//! of all of them, with the settings sandboxd sent. This module holds the
//! table, a command's record and its start; `keepers` starts the keeper
//! processes (and one ahead of need, the spare), `runner` is the task
//! that follows one command, and `relief` ends leftovers when the sandbox
//! runs short of processes or memory.
//!
//! A command started with `stdin_open` reads a pipe whose write end the
//! agent keeps: input sandboxd sends goes into it until it is closed or
//! the command ends.
//!
//! A command ends when its own process exits, whatever it left running;
//! what the leftovers print later is still recorded after the `exit`
//! record, and they stay killable until they are gone. When the sandbox
//! runs out of processes or memory, the leftovers of finished commands are
//! ended first, largest first (see [`Commands::relieve`]); running
//! commands and the agent are never chosen.

mod keepers;
mod relief;
mod runner;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use sandboxd_proto::{
    CommandMeta, CommandState, Ended, Failure, FailureKind, Spawn, Stream, Usage,
};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::changes::{Report, Watch, WatchBudget};
use crate::keeper::{self, FromKeeper, ToKeeper};
use crate::log::{Log, Tail};
use crate::{cgroup, tree};
use keepers::{Launched, StartedKeeper};
use runner::Runner;

/// How long input may wait for a command to read it.
const STDIN_WITHIN: Duration = Duration::from_millis(sandboxd_proto::STDIN_WAIT_MS);

/// Why a command was refused at the pids limit.
const AT_PIDS_LIMIT: &str =
    "no process can be started: the sandbox is at its pids limit and running commands hold it";

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
    /// Its own process's pid (0: it never started).
    pid: u32,
    /// The write end of its stdin while that is open (started with
    /// `stdin_open`, neither closed nor ended). Held across a write, so
    /// that inputs go in whole and in order.
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
}

impl Cmd {
    /// A command its keeper `keeper` has just started, its output going
    /// to `log` (and, when `tail_bytes`, to the tails too).
    fn new(
        id: String,
        meta: CommandMeta,
        started: Instant,
        log: Log,
        tail_bytes: u32,
        control: mpsc::Sender<Control>,
        keeper: i32,
    ) -> Cmd {
        Cmd {
            id,
            meta,
            started,
            log: RefCell::new(log),
            tails: RefCell::new((tail_bytes > 0).then(|| {
                [
                    Tail::new(tail_bytes as usize),
                    Tail::new(tail_bytes as usize),
                ]
            })),
            changes: RefCell::new(None),
            ended: RefCell::new(None),
            changed: watch::channel(0).0,
            room: Notify::new(),
            control,
            keeper: Cell::new(Some(keeper)),
            output_closed: Cell::new(false),
            pid: 0,
            stdin: tokio::sync::Mutex::new(None),
        }
    }

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
            pid: self.pid,
        }
    }

    /// Writes `data` to its stdin, all of it, within [`STDIN_WITHIN`].
    pub(crate) async fn write_stdin(&self, data: &[u8]) -> Result<(), Failure> {
        if data.len() > sandboxd_proto::STDIN_PIECE {
            return Err(Failure::new(FailureKind::TooLarge, "input over the limit"));
        }
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut().filter(|_| self.ended().is_none()) else {
            return Err(stdin_closed(&self.id));
        };
        match tokio::time::timeout(STDIN_WITHIN, pipe.write_all(data)).await {
            Ok(Ok(())) => Ok(()),
            // EPIPE: nothing holds its end any more.
            Ok(Err(e)) => {
                *stdin = None;
                Err(Failure::new(
                    FailureKind::StdinClosed,
                    format!("command {} no longer reads its stdin: {e}", self.id),
                ))
            }
            Err(_) => Err(Failure::new(
                FailureKind::InputNotRead,
                format!(
                    "command {} has not read its input for {} s; part of it may be in",
                    self.id,
                    STDIN_WITHIN.as_secs()
                ),
            )),
        }
    }

    /// Closes its stdin: it reads the end of its input.
    pub(crate) async fn close_stdin(&self) -> Result<(), Failure> {
        match self.stdin.lock().await.take() {
            Some(_) if self.ended().is_none() => Ok(()),
            _ => Err(stdin_closed(&self.id)),
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

fn stdin_closed(id: &str) -> Failure {
    Failure::new(
        FailureKind::StdinClosed,
        format!("command {id} has no open stdin (started without stdinOpen, closed, or ended)"),
    )
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
    /// Notified as each command starts: the monitor sleeps on it while no
    /// command runs (see `is_settled`).
    started: Notify,
}

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
            started: Notify::new(),
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

    /// Whether no command runs and none left processes behind: nothing
    /// for the monitor to relieve, and no log that grows.
    pub(crate) fn is_settled(&self) -> bool {
        self.table
            .borrow()
            .values()
            .all(|c| c.ended().is_some() && c.keeper.get().is_none())
    }

    /// Returns once a command starts; at once if one started since the
    /// last return (the start leaves a permit).
    pub(crate) async fn next_start(&self) {
        self.started.notified().await;
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
        if spec.stdin_open && !spec.stdin.is_empty() {
            return Err(Failure::new(
                FailureKind::Invalid,
                "stdin text and an open stdin together",
            ));
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
            stdin_pipe: spec.stdin_open,
            terminal: false,
        });
        // Close-on-exec: only the keeper it is passed to holds its end.
        let (stdin_read, stdin_write) = if spec.stdin_open {
            let piped = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(std::io::Error::from)
                .and_then(|(read, write)| Ok((read, pipe::Sender::from_owned_fd(write)?)));
            let (read, write) = piped
                .map_err(|e| Failure::new(FailureKind::Other, format!("a stdin pipe: {e}")))?;
            (Some(read), Some(write))
        } else {
            (None, None)
        };
        let body = sandboxd_proto::encode(&start)
            .map_err(|e| Failure::new(FailureKind::Invalid, format!("the start: {e}")))?;
        // Before the command runs, so that all it does is seen.
        let mut workspace_watch = spec
            .changes
            .as_ref()
            .map(|c| Watch::start(&settings.workspace, c, &self.watch_budget));
        let Launched {
            mut child,
            keeper: framed,
            out,
            err,
            first,
        } = self
            .launch(body, stdin_read.as_ref().map(AsFd::as_fd))
            .await?;
        // The command's end only: a write sees EPIPE once it is gone.
        drop(stdin_read);
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
        let mut log = Log::new(settings.ring_bytes);
        if !spec.awaits_reader {
            log.expect_no_first_reader();
        }
        if let Some(shape) = spec.meta.shape {
            log.shape(shape);
        }
        let mut cmd = Cmd::new(
            spec.command,
            spec.meta,
            started,
            log,
            spec.tail_bytes,
            tx,
            keeper_pid,
        );
        cmd.pid = match first {
            FromKeeper::Started { pid } => {
                cmd.stdin = tokio::sync::Mutex::new(stdin_write);
                pid
            }
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
        let pid = cmd.pid;
        let cmd = Rc::new(cmd);
        self.table
            .borrow_mut()
            .insert(cmd.id.clone(), Rc::clone(&cmd));
        self.started.notify_one();
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
        // Its input ends with it (a write under way sees the pipe close
        // once the leftovers that hold it go, or gives up in time).
        if let Ok(mut stdin) = self.stdin.try_lock() {
            *stdin = None;
        }
        self.touch();
    }
}
