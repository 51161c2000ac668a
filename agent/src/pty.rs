//! Terminal sessions: a program on a pseudo-terminal, started by a keeper
//! of its own (see `keeper`, terminal mode) so that its process tree is
//! tracked and ended like a command's; a task here (its runner) that
//! reads the terminal's output into the session's scrollback, passes
//! kills to the keeper and records how the program ended; and the table
//! of sessions. Sessions live in the agent, so they outlive a restart of
//! sandboxd, which finds them again with [`sandboxd_proto::Op::PtyList`].
//!
//! The scrollback is a ring of the last [`SCROLLBACK`] bytes, numbered
//! from the session's first, so any number of readers each read from
//! where they are and one that falls behind the ring learns what it
//! missed (a read's `start` past its `after`); the program never waits
//! for a reader.
//!
//! A session ends when its program's process exits: the rest of its tree
//! is then ended as when a terminal closes (SIGTERM, the grace period,
//! SIGKILL), and once nothing holds the terminal any more (its end of
//! file: every byte written is in the scrollback) the end is recorded.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use sandboxd_proto::{Failure, FailureKind, PtyEnded, PtyOpen, PtyOutput, PtyState};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::Framed;

use crate::commands::Commands;
use crate::keeper::{self, FromKeeper, ToKeeper};

/// Bytes of screen output a session keeps.
pub(crate) const SCROLLBACK: usize = 256 * 1024;
/// Ended sessions kept for listing; the oldest go first.
const MAX_ENDED: usize = 16;
/// How much the runner reads from the terminal at once.
const READ_CHUNK: usize = 64 * 1024;
/// How long typed input may wait for a program that does not read it.
const WRITE_WITHIN: Duration = Duration::from_secs(5);
/// How long a start may take.
const START_WITHIN: Duration = Duration::from_secs(10);

/// The last bytes a session wrote, numbered from its first.
#[derive(Debug)]
struct Screen {
    kept: VecDeque<u8>,
    /// Bytes written in all.
    end: u64,
    cap: usize,
}

impl Screen {
    fn new(cap: usize) -> Screen {
        Screen {
            kept: VecDeque::new(),
            end: 0,
            cap,
        }
    }

    fn append(&mut self, data: &[u8]) {
        self.kept.extend(data);
        self.end += data.len() as u64;
        let over = self.kept.len().saturating_sub(self.cap);
        self.kept.drain(..over);
    }

    /// The number of the oldest byte kept.
    fn start(&self) -> u64 {
        self.end - self.kept.len() as u64
    }

    /// Up to `max` bytes from `after` on (from the oldest kept when
    /// `after` is older), and the number of the first.
    fn read(&self, after: u64, max: usize) -> (u64, Vec<u8>) {
        let from = after.clamp(self.start(), self.end);
        let skip = usize::try_from(from - self.start()).unwrap_or(usize::MAX);
        (
            from,
            self.kept.iter().skip(skip).take(max).copied().collect(),
        )
    }
}

/// One terminal session.
#[derive(Debug)]
pub(crate) struct Pty {
    id: String,
    summary: String,
    created_at_ms: u64,
    tag: Option<String>,
    screen: RefCell<Screen>,
    /// Bumped on every change (output, the end).
    changed: watch::Sender<u64>,
    ended: Cell<Option<PtyEnded>>,
    /// The terminal's master side, for typing and resizing (the runner
    /// reads from another descriptor of it).
    input: pipe::Sender,
    kill: mpsc::Sender<()>,
}

impl Pty {
    fn touch(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    pub(crate) fn state(&self) -> PtyState {
        PtyState {
            pty: self.id.clone(),
            summary: self.summary.clone(),
            created_at_ms: self.created_at_ms,
            ended: self.ended.get(),
            tag: self.tag.clone(),
        }
    }

    /// Output from `after` on, waiting up to `wait` for some when there
    /// is none yet and the session has not ended.
    pub(crate) async fn read(&self, after: u64, max_bytes: usize, wait: Duration) -> PtyOutput {
        let deadline = tokio::time::Instant::now() + wait;
        let mut changed = self.changed.subscribe();
        loop {
            changed.borrow_and_update();
            let (start, data) = self.screen.borrow().read(after, max_bytes.max(1));
            let end = self.screen.borrow().end;
            let ended = self.ended.get();
            let done = ended.is_some() && start + data.len() as u64 >= end;
            if !data.is_empty() || ended.is_some() || tokio::time::Instant::now() >= deadline {
                return PtyOutput {
                    start,
                    data,
                    ended: if done { ended } else { None },
                };
            }
            let _ = tokio::time::timeout_at(deadline, changed.changed()).await;
        }
    }

    /// Answers once the session has ended.
    pub(crate) async fn wait(&self) -> PtyEnded {
        let mut changed = self.changed.subscribe();
        loop {
            changed.borrow_and_update();
            if let Some(ended) = self.ended.get() {
                return ended;
            }
            // The sender lives as long as `self`.
            let _ = changed.changed().await;
        }
    }

    /// Types `data` into the terminal.
    pub(crate) async fn write(&self, mut data: &[u8]) -> Result<(), Failure> {
        if self.ended.get().is_some() {
            return Err(Failure::new(FailureKind::Invalid, "the session has ended"));
        }
        let typing = async {
            while !data.is_empty() {
                self.input.writable().await?;
                match self.input.try_write(data) {
                    Ok(n) => data = &data[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            Ok::<_, std::io::Error>(())
        };
        match tokio::time::timeout(WRITE_WITHIN, typing).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Failure::new(
                FailureKind::Other,
                format!("the terminal took no input: {e}"),
            )),
            Err(_) => Err(Failure::new(
                FailureKind::TooMany,
                "the terminal's program has not read its input for 5 s",
            )),
        }
    }

    /// A new window size (the program gets SIGWINCH).
    pub(crate) fn resize(&self, cols: u16, rows: u16) -> Result<(), Failure> {
        let size = rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(&self.input, size)
            .map_err(|e| Failure::new(FailureKind::Other, format!("resize: {e}")))
    }

    /// Ends the session's process tree (once it has been asked, again
    /// changes nothing).
    pub(crate) fn kill(&self) {
        let _ = self.kill.try_send(());
    }
}

/// Every session.
#[derive(Debug)]
pub(crate) struct Ptys {
    table: RefCell<BTreeMap<String, Rc<Pty>>>,
    commands: Rc<Commands>,
}

impl Ptys {
    pub(crate) fn new(commands: Rc<Commands>) -> Rc<Ptys> {
        Rc::new(Ptys {
            table: RefCell::new(BTreeMap::new()),
            commands,
        })
    }

    pub(crate) fn get(&self, id: &str) -> Result<Rc<Pty>, Failure> {
        self.table
            .borrow()
            .get(id)
            .cloned()
            .ok_or_else(|| Failure::new(FailureKind::NotFound, format!("no terminal session {id}")))
    }

    pub(crate) fn states(&self) -> Vec<PtyState> {
        self.table.borrow().values().map(|p| p.state()).collect()
    }

    /// Starts a session; answers the program's pid.
    pub(crate) async fn open(self: &Rc<Self>, open: PtyOpen) -> Result<u32, Failure> {
        let valid_id = open.pty.len() == 24
            && open
                .pty
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !valid_id || open.cols == 0 || open.rows == 0 {
            return Err(Failure::new(
                FailureKind::Invalid,
                "bad session id or window size",
            ));
        }
        {
            let table = self.table.borrow();
            if table.contains_key(&open.pty) {
                return Err(Failure::new(
                    FailureKind::DuplicateCommand,
                    format!("terminal session {} exists", open.pty),
                ));
            }
            let running = table.values().filter(|p| p.ended.get().is_none()).count();
            if running >= open.max_running as usize {
                return Err(Failure::new(
                    FailureKind::TooMany,
                    format!(
                        "{running} terminal sessions run in this sandbox, the most it may have"
                    ),
                ));
            }
        }
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Failure::new(FailureKind::Other, format!("{what}: {e}"))
        };
        let (master, slave) = open_pty(open.cols, open.rows).map_err(|e| fail("a pty", &e))?;
        let (mut child, control) = self.commands.start_terminal_keeper(slave).await?;
        let keeper_pid = child.id() as i32;
        let (program, argv) = if open.argv.is_empty() {
            login_shell()
        } else {
            (open.program.clone(), open.argv.clone())
        };
        let workspace = self.commands.settings().workspace;
        let start = ToKeeper::Start(keeper::Start {
            program: Some(program),
            argv,
            env: open.env.clone(),
            cwd: open.cwd.clone().unwrap_or(workspace),
            stdin: Vec::new(),
            stdin_pipe: false,
            terminal: true,
        });
        let mut framed = Framed::new(control, keeper::codec());
        let first = async {
            let body = sandboxd_proto::encode(&start).map_err(std::io::Error::other)?;
            framed.send(body).await?;
            match framed.next().await {
                Some(Ok(frame)) => {
                    sandboxd_proto::decode::<FromKeeper>(&frame).map_err(std::io::Error::other)
                }
                Some(Err(e)) => Err(e),
                None => Err(std::io::Error::other("the keeper exited")),
            }
        };
        let first = match tokio::time::timeout(START_WITHIN, first).await {
            Ok(Ok(first)) => first,
            Ok(Err(e)) => {
                self.commands.keeper_done(keeper_pid);
                let _ = child.kill();
                return Err(fail("the session's keeper failed", &e));
            }
            Err(_) => {
                self.commands.keeper_done(keeper_pid);
                let _ = child.kill();
                return Err(Failure::new(
                    FailureKind::NoProcesses,
                    "the session did not start in time (is the sandbox at its pids limit?)",
                ));
            }
        };
        let (output, input) = master;
        let (kill_tx, kill_rx) = mpsc::channel(1);
        let pty = Rc::new(Pty {
            id: open.pty.clone(),
            summary: open.summary.clone(),
            created_at_ms: open.created_at_ms,
            tag: open.tag.clone(),
            screen: RefCell::new(Screen::new(SCROLLBACK)),
            changed: watch::channel(0).0,
            ended: Cell::new(None),
            input,
            kill: kill_tx,
        });
        let pid = match first {
            FromKeeper::Started { pid } => pid,
            FromKeeper::Failed { exit_code, message } => {
                pty.screen.borrow_mut().append(message.as_bytes());
                pty.ended.set(Some(PtyEnded {
                    exit_code: Some(exit_code),
                    signal: None,
                    duration_ms: 0,
                    ended_at_ms: now_ms(),
                }));
                0
            }
            other => {
                self.commands.keeper_done(keeper_pid);
                let _ = child.kill();
                let why = if other == FromKeeper::NoProcesses {
                    FailureKind::NoProcesses
                } else {
                    FailureKind::Other
                };
                return Err(Failure::new(
                    why,
                    format!("the session's keeper answered {other:?}"),
                ));
            }
        };
        self.table
            .borrow_mut()
            .insert(pty.id.clone(), Rc::clone(&pty));
        self.prune();
        let runner = Runner {
            commands: Rc::clone(&self.commands),
            pty,
            keeper_pid,
            keeper: framed,
            started: Instant::now(),
            exited: None,
            stopping: false,
        };
        tokio::task::spawn_local(runner.run(output, kill_rx, child));
        Ok(pid)
    }

    /// Keeps at most [`MAX_ENDED`] ended sessions, the newest.
    fn prune(&self) {
        let mut table = self.table.borrow_mut();
        let mut ended: Vec<(u64, String)> = table
            .values()
            .filter_map(|p| p.ended.get().map(|e| (e.ended_at_ms, p.id.clone())))
            .collect();
        ended.sort();
        let excess = ended.len().saturating_sub(MAX_ENDED);
        for (_, id) in ended.into_iter().take(excess) {
            table.remove(&id);
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A new pty of `cols` × `rows`: its master side on the runtime, to read
/// from and to write to, and the slave (for the keeper). None of them is
/// inherited by anything else the agent starts. tokio's pipe ends take
/// any pollable descriptor, unchecked: the safe way to put a pty's master
/// on the runtime.
fn open_pty(cols: u16, rows: u16) -> std::io::Result<((pipe::Receiver, pipe::Sender), OwnedFd)> {
    use rustix::pty::OpenptFlags;
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::termios::tcsetwinsize(
        &master,
        rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    let flags = rustix::fs::fcntl_getfl(&master)?;
    rustix::fs::fcntl_setfl(&master, flags | rustix::fs::OFlags::NONBLOCK)?;
    let writer = master.try_clone()?;
    let output = pipe::Receiver::from_owned_fd_unchecked(master)?;
    let input = pipe::Sender::from_owned_fd_unchecked(writer)?;
    Ok(((output, input), slave))
}

/// The sandbox user's login shell from /etc/passwd (`/bin/bash` when it
/// names none), run in login mode: `argv[0]` is its name after a `-`, so
/// it reads the profiles.
fn login_shell() -> (String, Vec<String>) {
    let uid = rustix::process::getuid().as_raw().to_string();
    let shell = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let fields: Vec<&str> = line.split(':').collect();
                (fields.len() == 7 && fields[2] == uid && fields[6].starts_with('/'))
                    .then(|| fields[6].to_string())
            })
        })
        .unwrap_or_else(|| "/bin/bash".to_string());
    let name = shell.rsplit('/').next().unwrap_or("bash");
    let arg0 = format!("-{name}");
    (shell, vec![arg0])
}

/// `sandboxd-agent session PROGRAM ARGV0 [ARG]...`, started by a keeper
/// with a pty's slave as stdin, stdout and stderr: leads a new session
/// with that terminal as its controlling one (its process group the
/// foreground, as a terminal's first program is), then becomes PROGRAM,
/// which sees ARGV0 as its name. If that fails, it says why on the
/// terminal and ends as a shell would (127 not found, 126 otherwise).
pub(crate) fn run_session() -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(2).collect();
    let [program, arg0, rest @ ..] = args.as_slice() else {
        eprintln!("usage: sandboxd-agent session PROGRAM ARGV0 [ARG]...");
        return std::process::ExitCode::from(2);
    };
    let terminal = rustix::process::setsid()
        .map_err(std::io::Error::from)
        .and_then(|_| rustix::process::ioctl_tiocsctty(std::io::stdin()).map_err(Into::into));
    if let Err(e) = terminal {
        eprintln!("sandboxd: the terminal cannot be made this session's: {e}");
    }
    let e = std::process::Command::new(program)
        .arg0(arg0)
        .args(rest)
        .exec();
    let name = program.to_string_lossy();
    if e.kind() == std::io::ErrorKind::NotFound {
        eprintln!("sandboxd: {name}: command not found");
        std::process::ExitCode::from(127)
    } else {
        eprintln!("sandboxd: {name}: {e}");
        std::process::ExitCode::from(126)
    }
}

/// The task that owns one session: see the module docs.
struct Runner {
    commands: Rc<Commands>,
    pty: Rc<Pty>,
    keeper_pid: i32,
    keeper: Framed<tokio::net::UnixStream, tokio_util::codec::LengthDelimitedCodec>,
    started: Instant,
    /// How the program's own process ended.
    exited: Option<(Option<i32>, Option<i32>)>,
    stopping: bool,
}

enum Woke {
    Output(std::io::Result<usize>),
    Keeper(Option<std::io::Result<FromKeeper>>),
    Kill,
}

impl Runner {
    async fn run(
        mut self,
        output: pipe::Receiver,
        mut kill: mpsc::Receiver<()>,
        mut child: std::process::Child,
    ) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut keeper_open = true;
        let mut output_open = self.pty.ended.get().is_none();
        let mut kill_open = true;
        while output_open || keeper_open {
            let woke = tokio::select! {
                r = read_master(&output, &mut buf), if output_open => Woke::Output(r),
                m = self.keeper.next(), if keeper_open => Woke::Keeper(m.map(|r| r.and_then(|f| {
                    sandboxd_proto::decode::<FromKeeper>(&f).map_err(std::io::Error::other)
                }))),
                k = kill.recv(), if kill_open => match k {
                    Some(()) => Woke::Kill,
                    None => { kill_open = false; continue; }
                },
            };
            match woke {
                Woke::Output(Ok(n)) if n > 0 => {
                    self.pty.screen.borrow_mut().append(&buf[..n]);
                    self.pty.touch();
                    // Readers of what was just appended run before the
                    // next piece: a terminal that always has output would
                    // otherwise keep the agent's one thread for a whole
                    // budget of reads (megabytes), past the scrollback.
                    tokio::task::yield_now().await;
                }
                // End of file (EIO on a pty): nothing holds the terminal.
                Woke::Output(_) => output_open = false,
                Woke::Kill => self.stop().await,
                Woke::Keeper(Some(Ok(FromKeeper::Exited { code, signal, .. }))) => {
                    self.exited = Some((code, signal));
                    // As when a terminal closes: the rest of the tree goes.
                    self.stop().await;
                }
                Woke::Keeper(Some(Ok(FromKeeper::Empty)) | Some(Err(_)) | None) => {
                    keeper_open = false;
                    self.commands.keeper_done(self.keeper_pid);
                    // A keeper killed from inside leaves its tree to the
                    // agent, which ends it (and so closes the terminal).
                    self.commands.end_orphans();
                }
                Woke::Keeper(Some(Ok(_))) => {}
            }
        }
        let _ = child.try_wait();
        if self.pty.ended.get().is_none() {
            let (exit_code, signal) = self.exited.unwrap_or((None, Some(9)));
            self.pty.ended.set(Some(PtyEnded {
                exit_code,
                signal,
                duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                ended_at_ms: now_ms(),
            }));
        }
        self.pty.touch();
    }

    async fn stop(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        let grace = self.commands.settings().grace;
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        if let Ok(body) = sandboxd_proto::encode(&ToKeeper::Stop { grace_ms }) {
            let _ = self.keeper.send(body).await;
        }
    }
}

/// Waits until the terminal has output and reads it: `Ok(0)` or an error
/// (EIO) once nothing holds the terminal's other side.
async fn read_master(master: &pipe::Receiver, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        master.readable().await?;
        match master.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_screen_keeps_the_last_bytes_numbered_from_the_first() {
        let mut s = Screen::new(8);
        s.append(b"abcdef");
        assert_eq!(s.read(0, 100), (0, b"abcdef".to_vec()));
        assert_eq!(s.read(4, 100), (4, b"ef".to_vec()));
        assert_eq!(s.read(2, 3), (2, b"cde".to_vec()));
        s.append(b"ghijkl");
        // 12 written, the last 8 kept: a reader at 0 learns it missed 4.
        assert_eq!(s.start(), 4);
        assert_eq!(s.read(0, 100), (4, b"efghijkl".to_vec()));
        assert_eq!(s.read(12, 100), (12, Vec::new()));
        // A reader ahead of the end is put at the end.
        assert_eq!(s.read(99, 100), (12, Vec::new()));
    }
}
