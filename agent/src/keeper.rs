//! The keeper: one small process per command (`sandboxd-agent keep`), the
//! command's parent and a child subreaper (`PR_SET_CHILD_SUBREAPER`). Every
//! orphan of the command's tree is re-parented to it, whatever the orphan
//! did to leave (`setsid`, a double fork, `nohup`, a cleared environment),
//! so the tree is always exactly "the keeper's descendants": it can be
//! counted, reaped and ended, and nothing of another command is in it.
//!
//! Its standard input is a control socket to the agent; its standard
//! output and error are the command's pipes, which it hands to the
//! command and never writes to itself. It reports the command's start and
//! end (with the resources the tree used), ends the tree when asked
//! (SIGTERM, a grace period, then rounds of SIGSTOP and SIGKILL until
//! nothing is left), and exits once the tree is empty, which closes the
//! last writer of the pipes.
//!
//! It is synchronous and small: it must work when the sandbox is at its
//! pids limit, so after the command starts it creates no thread or process.
//!
//! The spare keeper, made ahead of need (`keep --ahead`), also starts
//! the command's process as soon as it starts itself (the stub,
//! `sandboxd-agent stub`), before any command is asked of it: the stub
//! waits for what to run and then only `exec`s it. Under gVisor creating
//! a process costs about twice its exec, so the command starts sooner. A
//! keeper made on demand (a terminal's, or a command's when no spare
//! waits) starts no stub: there it would only add a process. A command
//! with stdin, or a spare whose stub could not be started (the pids
//! limit) or has died, starts the command the usual way.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal as NixSignal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, Signal, WaitOptions};
use sandboxd_proto::Usage;
use serde::{Deserialize, Serialize};

use crate::tree;

/// Largest control message either side accepts (a command's argv, env and
/// stdin travel in the first).
const MAX_MESSAGE: usize = 256 * 1024 * 1024;
/// Stdin up to this size is written before the command starts (it fits in
/// the pipe); larger stdin is fed by a thread.
const STDIN_INLINE: usize = 60 * 1024;

/// Agent to keeper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ToKeeper {
    /// The first message: what to run.
    Start(Start),
    /// End the tree: SIGTERM now, SIGKILL rounds after `grace_ms`.
    Stop { grace_ms: u64 },
    /// End the tree now: SIGKILL rounds.
    Kill,
}

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Start {
    /// The file run; `None`: `argv[0]`. A login shell is `/bin/bash` run
    /// as `-bash`.
    pub(crate) program: Option<String>,
    pub(crate) argv: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cwd: String,
    #[serde(with = "serde_bytes")]
    pub(crate) stdin: Vec<u8>,
    /// The command's stdin is a pipe the agent keeps writing to: its read
    /// end follows this message on the control socket, passed with one
    /// byte (`SCM_RIGHTS`), and `stdin` is empty.
    pub(crate) stdin_pipe: bool,
    /// The keeper's stdout is a terminal (a pty's slave; its stderr
    /// too): the command gets it as stdin, stdout and stderr, and is
    /// started through `sandboxd-agent session`, which makes it the
    /// leader of a new session with the terminal as its controlling one
    /// (so Ctrl-C reaches the command's group, never the keeper); the
    /// keeper then lets go of the terminal (so the pty's other side sees
    /// its end once the command's tree has closed it).
    pub(crate) terminal: bool,
}

/// Keeper to agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum FromKeeper {
    Started {
        pid: u32,
    },
    /// The command could not start: it ends with this code, saying why.
    Failed {
        exit_code: i32,
        message: String,
    },
    /// The command could not start because the sandbox is at its pids
    /// limit: no command, a refusal. The keeper waits for another start
    /// (the agent ends leftovers and sends it again, for a while).
    NoProcesses,
    /// The command's own process ended.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        usage: Usage,
    },
    /// A stop finished: every process is gone, within the grace period or
    /// only after SIGKILL.
    Stopped {
        within_grace: bool,
    },
    /// The tree is empty; the keeper exits.
    Empty,
}

/// Writes one message: a 4-byte big-endian length, then postcard.
pub(crate) fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let body = sandboxd_proto::encode(msg).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(std::io::Error::other)?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one message written by [`write_message`].
pub(crate) fn read_message<T: for<'a> Deserialize<'a>>(r: &mut impl Read) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other("control message too large"));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    sandboxd_proto::decode(&body).map_err(std::io::Error::other)
}

/// The frame codec the agent's side of the control socket uses.
pub(crate) fn codec() -> tokio_util::codec::LengthDelimitedCodec {
    sandboxd_proto::codec(MAX_MESSAGE)
}

/// `sandboxd-agent keep`; `ahead`: `--ahead`, the spare, which starts
/// the stub.
pub(crate) fn run(ahead: bool) -> ExitCode {
    let control = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => UnixStream::from(fd),
        Err(_) => return ExitCode::from(2),
    };
    match keep(control, ahead) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

fn keep(mut control: UnixStream, ahead: bool) -> std::io::Result<()> {
    // The keeper holds no directory of the workspace. It moves itself
    // rather than being started in "/": a static binary's std spawns with
    // a fork instead of a vfork when asked for a working directory (its
    // glibc's chdir file action is looked up dynamically, and found only
    // in a dynamic binary), and the agent's fork copies its page tables
    // on every spare made. The stub it starts inherits "/".
    std::env::set_current_dir("/")?;
    // Processes of the sandbox user may not read or trace the keeper (its
    // control socket is the agent's); a command it starts is dumpable again.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    // Inherited by the command: under memory pressure the kernel's OOM
    // killer picks commands before the agent (0), and leftovers (raised to
    // 1000 once the command ends) before commands.
    set_oom_score_adj("self", 500);
    let mut stub = if ahead { Stub::start() } else { None };
    let main = loop {
        let ToKeeper::Start(start) = read_message(&mut control)? else {
            return Err(std::io::Error::other(
                "a keeper's first message must be Start",
            ));
        };
        let stdin_pipe = if start.stdin_pipe {
            Some(receive_fd(&control)?)
        } else {
            None
        };
        // A command with stdin gets a pipe for it: the usual way.
        if (!start.stdin.is_empty() || stdin_pipe.is_some())
            && let Some(unused) = stub.take()
        {
            unused.end();
        }
        let started = match stub.take().map(|stub| stub.run(&start)) {
            Some(Ok(started)) => started,
            Some(Err(())) | None => spawn(&start, stdin_pipe),
        };
        match started {
            Ok(pid) => break pid,
            // Refused for now; the agent may send another start.
            Err(None) => write_message(&mut control, &FromKeeper::NoProcesses)?,
            Err(Some((exit_code, message))) => {
                write_message(&mut control, &FromKeeper::Failed { exit_code, message })?;
                return write_message(&mut control, &FromKeeper::Empty);
            }
        }
    };
    write_message(&mut control, &FromKeeper::Started { pid: main as u32 })?;
    watch(control, main)
}

/// The descriptor the agent passes after a start with `stdin_pipe` (see
/// [`Start::stdin_pipe`]).
fn receive_fd(control: &UnixStream) -> std::io::Result<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut byte = [0u8; 1];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        control,
        &mut [std::io::IoSliceMut::new(&mut byte)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut passed = None;
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message {
            passed = passed.or(fds.next());
        }
    }
    match passed {
        Some(fd) if got.bytes == 1 => Ok(fd),
        _ => Err(std::io::Error::other("the stdin pipe did not arrive")),
    }
}

/// Passes `fd` to the keeper at the other end of `control`, as
/// [`receive_fd`] takes it.
pub(crate) async fn send_fd(
    control: &tokio::net::UnixStream,
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    control
        .async_io(tokio::io::Interest::WRITABLE, || {
            let fds = [fd];
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut ancillary = SendAncillaryBuffer::new(&mut space);
            if !ancillary.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(std::io::Error::other("no room for a descriptor"));
            }
            let sent = rustix::net::sendmsg(
                control,
                &[std::io::IoSlice::new(&[0])],
                &mut ancillary,
                SendFlags::NOSIGNAL,
            )?;
            match sent {
                1 => Ok(()),
                _ => Err(std::io::Error::other("the stdin pipe was not sent")),
            }
        })
        .await
}

/// Why a command could not start: its exit code and what it says on
/// stderr; `None` when the sandbox is at its pids limit.
type StartError = Option<(i32, String)>;

/// The command's process, started ahead (`sandboxd-agent stub`, the
/// keeper's child): it waits on its stdin, a socket to the keeper, for
/// what to run.
struct Stub {
    pid: i32,
    control: UnixStream,
}

impl Stub {
    /// Starts the stub; `None` when it cannot be started (the pids limit).
    fn start() -> Option<Stub> {
        let (ours, theirs) = UnixStream::pair().ok()?;
        let child = Command::new(std::env::current_exe().ok()?)
            .arg("stub")
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .spawn()
            .ok()?;
        Some(Stub {
            pid: child.id() as i32,
            control: ours,
        })
    }

    /// Hands `start` (one without stdin) to the stub: its pid, the
    /// command's. The keeper does not wait for the exec: a program that
    /// cannot run makes the stub say why on stderr and exit 126 or 127,
    /// as a command that ends at once. `Err(())`: the stub is gone, start
    /// the command the usual way.
    fn run(mut self, start: &Start) -> Result<Result<i32, StartError>, ()> {
        if let Err(e) = std::fs::create_dir_all(&start.cwd) {
            return Ok(Err(Some(cwd_error(&start.cwd, &e))));
        }
        // A stub killed just before the start may not have run since to
        // act on it (a loaded machine, its CPU quota spent): its socket is
        // still open and would take the start, and the command would end
        // with it. Written to a stub that is gone, the start fails.
        if doomed(self.pid) || write_message(&mut self.control, start).is_err() {
            self.end();
            return Err(());
        }
        if start.terminal {
            let_go_of_the_terminal();
        }
        Ok(Ok(self.pid))
    }

    /// Ends an unused stub and reaps it, before the command is started
    /// the usual way: unreaped, it would take a process of the pids limit
    /// the command may need. Killed, not asked: a stub the sandbox user
    /// stopped would never read that its socket closed.
    fn end(self) {
        if let Some(pid) = Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
            let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
        }
    }
}

/// Whether the process `pid` is gone or going: no longer there, a zombie,
/// or with a SIGKILL pending that it has not yet run to act on.
fn doomed(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).map_or(true, |s| doomed_by(&s))
}

/// [`doomed`], from the text of `/proc/PID/status`.
fn doomed_by(status: &str) -> bool {
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    status.lines().any(|line| match line.split_once(':') {
        Some(("State", state)) => state.trim_start().starts_with(['Z', 'X']),
        Some(("SigPnd" | "ShdPnd", mask)) => {
            u64::from_str_radix(mask.trim(), 16).is_ok_and(|m| m & SIGKILL_BIT != 0)
        }
        _ => false,
    })
}

/// `sandboxd-agent stub`: waits for a command on its stdin (a socket to
/// its keeper) and execs it; when the exec fails, says why on stderr (the
/// command's) and exits with the command's code.
pub(crate) fn run_stub() -> ExitCode {
    let mut control = std::io::stdin().lock();
    let start = match read_message::<Start>(&mut control) {
        Ok(start) => start,
        // The keeper went away, or started the command the usual way: no
        // command was handed over, so nothing reports this exit.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return ExitCode::SUCCESS,
        // A start that did not arrive whole: the command's, if the keeper
        // reported it started, so it fails as one that could not run.
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "sandboxd: the command did not arrive: {e}"
            );
            return ExitCode::from(126);
        }
    };
    let (code, message) = match command(&start, Stdio::null()) {
        Ok(mut cmd) => match std::env::set_current_dir(&start.cwd) {
            Ok(()) => spawn_error(&start, &cmd.exec()),
            Err(e) => enter_error(&start.cwd, &e),
        },
        Err(failed) => failed,
    };
    let _ = std::io::stderr().write_all(message.as_bytes());
    ExitCode::from(u8::try_from(code).unwrap_or(126))
}

fn enter_error(cwd: &str, e: &std::io::Error) -> (i32, String) {
    (
        126,
        format!("sandboxd: cannot enter the working directory {cwd}: {e}\n"),
    )
}

fn cwd_error(cwd: &str, e: &std::io::Error) -> (i32, String) {
    (
        126,
        format!("sandboxd: cannot create the working directory {cwd}: {e}\n"),
    )
}

/// Starts the command the usual way (a new process) with the keeper's
/// stdout and stderr (the pipes), and `stdin_pipe` as its stdin when the
/// agent passed one; its pid, or why it could not start.
fn spawn(start: &Start, stdin_pipe: Option<OwnedFd>) -> Result<i32, StartError> {
    if let Err(e) = std::fs::create_dir_all(&start.cwd) {
        return Err(Some(cwd_error(&start.cwd, &e)));
    }
    let stdin = match stdin_pipe {
        Some(fd) if !start.terminal => Stdio::from(fd),
        _ if start.stdin.is_empty() || start.terminal => Stdio::null(),
        _ => Stdio::piped(),
    };
    let mut cmd = command(start, stdin).map_err(Some)?;
    // The command starts in `start.cwd`; the keeper goes back to "/".
    if let Err(e) = std::env::set_current_dir(&start.cwd) {
        return Err(Some(enter_error(&start.cwd, &e)));
    }
    let spawned = cmd.spawn();
    let _ = std::env::set_current_dir("/");
    match spawned {
        Ok(mut child) => {
            if let Some(stdin) = child.stdin.take() {
                feed_stdin(stdin, start.stdin.clone());
            }
            if start.terminal {
                let_go_of_the_terminal();
            }
            Ok(child.id() as i32)
        }
        // The sandbox is at its pids limit: the agent ends leftovers and
        // sends the start again.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::AGAIN.raw_os_error()) => Err(None),
        Err(e) => Err(Some(spawn_error(start, &e))),
    }
}

/// The command `start` asks for, with the keeper's stdout and stderr (the
/// pipes) and `stdin` (a terminal's command gets the terminal instead).
fn command(start: &Start, stdin: Stdio) -> Result<Command, (i32, String)> {
    let arg0 = start
        .argv
        .first()
        .ok_or_else(|| (127, "empty argv".to_string()))?;
    let program = start.program.as_ref().unwrap_or(arg0);
    let stdout = std::io::stdout().as_fd().try_clone_to_owned();
    let stderr = std::io::stderr().as_fd().try_clone_to_owned();
    let (Ok(stdout), Ok(stderr)) = (stdout, stderr) else {
        return Err((126, "sandboxd: the output pipes are gone\n".into()));
    };
    let mut cmd = if start.terminal {
        let terminal = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| (126, format!("sandboxd: the terminal is gone: {e}\n")))?;
        let exe = std::env::current_exe()
            .map_err(|e| (126, format!("sandboxd: cannot find the agent: {e}\n")))?;
        let mut cmd = Command::new(exe);
        cmd.arg("session")
            .arg(program)
            .arg(arg0)
            .stdin(Stdio::from(terminal));
        cmd
    } else {
        let mut cmd = Command::new(program);
        // Its own process group, whose id is the command's pid: ending
        // the tree starts with one signal to the group, which reaches a
        // fork bomb's processes at once (a terminal's command gets the
        // same from `session`'s setsid). `kill 0` in the command reaches
        // its own group, not the agent's.
        cmd.arg0(arg0).stdin(stdin).process_group(0);
        cmd
    };
    // No `current_dir`: the stub and `spawn` enter `start.cwd` themselves,
    // so that a spawn is a vfork, not a fork (see `keep`).
    cmd.args(&start.argv[1..])
        .envs(start.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    Ok(cmd)
}

/// The exit code and message of a command whose program could not run.
fn spawn_error(start: &Start, e: &std::io::Error) -> (i32, String) {
    let program = start
        .program
        .as_deref()
        .or(start.argv.first().map(String::as_str))
        .unwrap_or_default();
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => 127,
        _ => 126,
    };
    let why = match e.kind() {
        std::io::ErrorKind::NotFound => "command not found".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => e.to_string(),
    };
    (code, format!("sandboxd: {program}: {why}\n"))
}

/// Points the keeper's stdout and stderr (the terminal) at /dev/null: the
/// pty's other side reads its end (EIO) once the command's tree has
/// closed the terminal.
fn let_go_of_the_terminal() {
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
}

/// Writes the command's stdin and closes it. Small input fits in the pipe
/// at once; larger input is written by a thread, so a command that reads
/// slowly (or not at all) holds up nothing.
fn feed_stdin(mut stdin: impl Write + Send + 'static, data: Vec<u8>) {
    if data.len() <= STDIN_INLINE {
        let _ = stdin.write_all(&data);
        return;
    }
    let _ = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let _ = stdin.write_all(&data);
        });
}

fn set_oom_score_adj(pid: &str, value: i32) {
    let _ = std::fs::write(format!("/proc/{pid}/oom_score_adj"), value.to_string());
}

/// How a stop is going.
struct Stopping {
    /// SIGKILL rounds start then.
    kill_at: Instant,
    /// The command's process group (its id is the command's pid) may
    /// still have members, and is still the command's: the stop began
    /// while the command was an unreaped child (so its pid could not be
    /// reused), and it has been looked at every round since. False once
    /// it is empty: from then on its id could be another group's.
    group: bool,
    /// The processes outside the command's process group have not had
    /// their SIGTERM yet: they get it once the group is empty, or halfway
    /// through the grace period, whichever comes first.
    term_rest: Option<Instant>,
    /// When the tree is next walked in `/proc` to kill what is left of it
    /// while the group has members (set when the SIGKILL rounds begin).
    walk_at: Option<Instant>,
}

impl Stopping {
    fn new(kill_at: Instant, group: bool, term_rest: Option<Instant>) -> Stopping {
        Stopping {
            kill_at,
            group,
            term_rest,
            walk_at: None,
        }
    }
}

/// While the command's process group has members, the tree is killed
/// through it (one call, however many processes), and `/proc` is walked
/// for what left the group only this often: under gVisor a walk while a
/// fork bomb's 512 processes die takes seconds, and holds up their exits.
/// (What left the group had its SIGTERM and grace period already.)
const WALK_EVERY: Duration = Duration::from_secs(1);

/// How long the keeper reaps at a time while a stop is going.
const REAP_SLICE: Duration = Duration::from_millis(20);

/// One step of a stop, between two reaps.
fn step(st: &mut Stopping, me: i32, main: i32) {
    if st.group {
        st.group = tree::group_has_members(main);
    }
    let now = Instant::now();
    if now >= st.kill_at {
        if st.group {
            // Stopped first: a stopped process cannot fork.
            tree::signal_group(main, Signal::STOP);
            tree::signal_group(main, Signal::KILL);
        }
        let walk_at = *st.walk_at.get_or_insert(now + WALK_EVERY);
        if !st.group || now >= walk_at {
            tree::stop_and_kill_round(me);
            st.walk_at = Some(now + WALK_EVERY);
        }
    } else if st.term_rest.is_some_and(|at| !st.group || now >= at) {
        st.term_rest = None;
        terminate_tree(me);
    }
}

fn terminate_tree(me: i32) {
    tree::signal_all(
        tree::descendants(me, &tree::snapshot())
            .into_iter()
            .map(|p| p.pid),
        Signal::TERM,
    );
}

/// Reaps the tree, reports the command's end, ends the tree when asked,
/// and returns once the tree is empty.
fn watch(mut control: UnixStream, main: i32) -> std::io::Result<()> {
    // Every ended child (the command, or an orphan of its tree) wakes the
    // keeper at once, so the dead are reaped as fast as init would (a fork
    // bomb's zombies would otherwise count against the pids limit). The
    // command was started before SIGCHLD is blocked here, so it does not
    // inherit the block.
    let mut sigchld = SigSet::empty();
    sigchld.add(NixSignal::SIGCHLD);
    let childfd = sigchld.thread_block().ok().and_then(|()| {
        SignalFd::with_flags(&sigchld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).ok()
    });
    let pidfd: Option<OwnedFd> = Pid::from_raw(main)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    let mut main_done = false;
    let mut stopping: Option<Stopping> = None;
    let mut control_open = true;
    let me = rustix::process::getpid().as_raw_nonzero().get();
    loop {
        // A due kill round comes before the reaping: under load each call
        // can take milliseconds, and the round stops the tree from growing.
        if let Some(st) = &mut stopping {
            step(st, me, main);
        }
        // Reap everything that ended; an empty tree ends the keeper. While
        // a stop goes through the command's group, reaping yields to it now
        // and then: a fork bomb leaves hundreds of zombies, and a loaded
        // sandbox (gVisor above all) can take milliseconds per reap, while
        // the kill round that stops the rest of the bomb takes two calls.
        // (A stop that walks `/proc` reaps all first: zombies slow a walk.)
        let sliced = stopping.as_ref().is_some_and(|st| st.group);
        let reap_until = Instant::now() + REAP_SLICE;
        let mut more_to_reap = false;
        loop {
            if sliced && Instant::now() >= reap_until {
                more_to_reap = true;
                break;
            }
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) => {
                    if pid.as_raw_nonzero().get() == main && !main_done {
                        main_done = true;
                        let usage = children_usage();
                        write_message(
                            &mut control,
                            &FromKeeper::Exited {
                                code: status.exit_status(),
                                signal: status.terminating_signal(),
                                usage,
                            },
                        )?;
                        // What the command left behind goes first when
                        // memory runs out; unless it is being ended anyway
                        // (a walk of a fork bomb's tree takes seconds
                        // under gVisor, and would hold up its end).
                        if stopping.is_none() {
                            for p in tree::descendants(me, &tree::snapshot()) {
                                set_oom_score_adj(&p.pid.to_string(), 1000);
                            }
                        }
                    }
                }
                Ok(None) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => {
                    // ECHILD: no process left below the keeper.
                    if let Some(st) = &stopping {
                        let within_grace = Instant::now() < st.kill_at;
                        write_message(&mut control, &FromKeeper::Stopped { within_grace })?;
                    }
                    let _ = write_message(&mut control, &FromKeeper::Empty);
                    return Ok(());
                }
            }
        }
        let timeout = if more_to_reap {
            Duration::ZERO
        } else if stopping.is_some() {
            Duration::from_millis(10)
        } else if childfd.is_some() {
            Duration::from_secs(1)
        } else {
            // No signalfd: look for ends now and then.
            Duration::from_millis(50)
        };
        let control_ready = poll_events(
            &control,
            control_open,
            pidfd.as_ref().filter(|_| !main_done),
            childfd.as_ref(),
            timeout,
        );
        if let Some(fd) = &childfd {
            // Drain the signals; the reaping loop above does the work.
            while let Ok(Some(_)) = fd.read_signal() {}
        }
        if control_ready && control_open {
            match read_message::<ToKeeper>(&mut control) {
                Ok(ToKeeper::Stop { grace_ms }) if stopping.is_none() => {
                    // The command's group at once; the rest of the tree
                    // once the group is empty or halfway through the
                    // grace period (see `step`).
                    let now = Instant::now();
                    let grace = Duration::from_millis(grace_ms);
                    if main_done {
                        terminate_tree(me);
                    } else {
                        tree::signal_group(main, Signal::TERM);
                        // Also the command itself: a stub that has not yet
                        // made its group would be missed by the group's.
                        tree::signal_all([main], Signal::TERM);
                    }
                    stopping = Some(Stopping::new(
                        now + grace,
                        !main_done,
                        (!main_done).then(|| now + grace / 2),
                    ));
                }
                Ok(ToKeeper::Kill) => {
                    let now = Instant::now();
                    match &mut stopping {
                        Some(st) => st.kill_at = st.kill_at.min(now),
                        None => stopping = Some(Stopping::new(now, !main_done, None)),
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    // The agent is gone (the sandbox is going down): end
                    // the tree rather than leave it unwatched.
                    control_open = false;
                    stopping.get_or_insert(Stopping::new(Instant::now(), !main_done, None));
                }
            }
        }
    }
}

/// Waits up to `timeout` for something to happen to the keeper: a
/// message on `control` (looked at only while it is `open`), the
/// command's end (its `pidfd`, until it is reaped) or a child's end
/// (`childfd`, the SIGCHLD signalfd). Returns whether `control` is ready.
fn poll_events(
    control: &UnixStream,
    open: bool,
    pidfd: Option<&OwnedFd>,
    childfd: Option<&SignalFd>,
    timeout: Duration,
) -> bool {
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let mut fds = Vec::with_capacity(2);
    fds.push(PollFd::new(
        control,
        if open {
            PollFlags::IN
        } else {
            PollFlags::empty()
        },
    ));
    if let Some(fd) = pidfd {
        fds.push(PollFd::new(fd, PollFlags::IN));
    }
    if let Some(fd) = childfd {
        fds.push(PollFd::new(fd, PollFlags::IN));
    }
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(_) => !fds[0].revents().is_empty(),
        Err(_) => false,
    }
}

/// CPU time and peak RSS of the processes reaped so far.
fn children_usage() -> Usage {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN);
    match u {
        Ok(u) => {
            let ms = |tv: nix::sys::time::TimeVal| {
                (tv.tv_sec().max(0) as u64) * 1000 + (tv.tv_usec().max(0) as u64) / 1000
            };
            Usage {
                user_ms: ms(u.user_time()),
                system_ms: ms(u.system_time()),
                max_rss_kb: u.max_rss().max(0) as u64,
            }
        }
        Err(_) => Usage::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_the_framing() {
        let mut buf = Vec::new();
        let msg = ToKeeper::Start(Start {
            program: Some("/bin/sh".into()),
            argv: vec!["sh".into(), "-c".into(), "true".into()],
            env: vec![("A".into(), "b".into())],
            cwd: "/tmp".into(),
            stdin: vec![1, 2, 3],
            stdin_pipe: false,
            terminal: true,
        });
        write_message(&mut buf, &msg).expect("write");
        write_message(&mut buf, &ToKeeper::Kill).expect("write");
        let mut r = &buf[..];
        assert_eq!(read_message::<ToKeeper>(&mut r).expect("read"), msg);
        assert_eq!(
            read_message::<ToKeeper>(&mut r).expect("read"),
            ToKeeper::Kill
        );
        assert!(read_message::<ToKeeper>(&mut r).is_err(), "nothing left");
        let huge = (MAX_MESSAGE as u32 + 1).to_be_bytes();
        assert!(read_message::<ToKeeper>(&mut &huge[..]).is_err());
    }

    /// A process is doomed when it is a zombie or has a SIGKILL pending
    /// (bit 9 of either mask), not for another pending signal.
    #[test]
    fn a_pending_sigkill_or_a_zombie_dooms_a_process() {
        let status = |state: &str, sig: &str, shd: &str| {
            format!("Name:\tstub\nState:\t{state}\nSigPnd:\t{sig}\nShdPnd:\t{shd}\n")
        };
        let zero = "0000000000000000";
        assert!(!doomed_by(&status("S (sleeping)", zero, zero)));
        // SIGTERM (bit 15) and SIGSTOP (bit 19) pending.
        assert!(!doomed_by(&status(
            "S (sleeping)",
            "0000000000044000",
            zero
        )));
        assert!(doomed_by(&status("S (sleeping)", "0000000000000100", zero)));
        assert!(doomed_by(&status("R (running)", zero, "0000000000000100")));
        assert!(doomed_by(&status("Z (zombie)", zero, zero)));

        // A real child: alive, then a zombie, then gone.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        assert!(!doomed(pid), "a sleeping child");
        child.kill().expect("kill");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !doomed(pid) {
            assert!(
                Instant::now() < deadline,
                "the killed child never looked doomed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        child.wait().expect("wait");
        assert!(doomed(pid), "a reaped child");
    }
}
