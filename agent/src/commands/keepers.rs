//! The keeper processes commands run under: starting one (while the
//! sandbox is at its pids limit, after ending leftovers to make room),
//! handing it a command's start, the spare started ahead of the next
//! command, the keepers of terminal sessions, and the orphans of a keeper
//! that was killed. The spare is started when the agent starts, and again
//! when a command's own process has ended, not while a command starts
//! (under gVisor a process creation then slowed the command's round trip
//! by a third).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::process::Stdio;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use sandboxd_proto::{Failure, FailureKind};
use tokio::net::unix::pipe;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use super::{AT_PIDS_LIMIT, Commands};
use crate::keeper::{self, FromKeeper};
use crate::tree;

/// How long a spawn may take before it counts as failed.
const SPAWN_WITHIN: Duration = Duration::from_secs(10);
/// How long a spawn may retry while the sandbox is at its pids limit.
const SPAWN_RETRY_FOR: Duration = Duration::from_secs(5);

/// A started keeper: its process, its control socket and the read ends of
/// its command's output pipes.
#[derive(Debug)]
pub(super) struct StartedKeeper {
    pub(super) child: std::process::Child,
    pub(super) control: tokio::net::UnixStream,
    pub(super) out: pipe::Receiver,
    pub(super) err: pipe::Receiver,
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

/// A keeper that was handed a command's start, and what it answered.
pub(super) struct Launched {
    pub(super) child: std::process::Child,
    pub(super) keeper: Framed<tokio::net::UnixStream, LengthDelimitedCodec>,
    pub(super) out: pipe::Receiver,
    pub(super) err: pipe::Receiver,
    pub(super) first: FromKeeper,
}

impl Commands {
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
    pub(super) fn keep_as_spare(&self, mut keeper: StartedKeeper) {
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

    /// Hands a command's start (`body`) to a keeper, the spare first (a
    /// new one when the spare died), with the read end of its stdin pipe
    /// after it when the start has one, and returns what it answered.
    /// While it answers that the sandbox is at its pids limit, leftovers
    /// are ended and it is asked again, for [`SPAWN_RETRY_FOR`].
    pub(super) async fn launch(
        &self,
        body: Bytes,
        stdin_pipe: Option<BorrowedFd<'_>>,
    ) -> Result<Launched, Failure> {
        loop {
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
                    if let Some(fd) = stdin_pipe {
                        keeper::send_fd(framed.get_ref(), fd).await?;
                    }
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
                Ok(Ok(first)) => {
                    return Ok(Launched {
                        child,
                        keeper: framed,
                        out,
                        err,
                        first,
                    });
                }
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
        }
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
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()?;
    Ok((child, ours))
}

fn pipe_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(std::io::Error::from)
}
