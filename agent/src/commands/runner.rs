//! A command's runner: the task that owns one command while its keeper
//! lives. It drains the command's output into its log (holding back while
//! a reader must catch up), enforces its timeout, passes kills and
//! reliefs to the keeper, and records the end once the keeper reports it.

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use sandboxd_proto::{Stream, Usage};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

use super::{Cmd, Commands, Control};
use crate::cgroup;
use crate::changes::Watching;
use crate::keeper::{FromKeeper, ToKeeper};

/// How often a runner that waits for a reader looks whether it still must.
const ROOM_RECHECK: Duration = Duration::from_millis(250);
/// How much a runner reads from a pipe at once.
const READ_CHUNK: usize = 64 * 1024;

/// Why the tree is being ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StopCause {
    Timeout,
    Kill,
    /// A finished command's leftovers (a kill, or to make room).
    Leftovers,
}

/// The task that owns one command: see the module docs.
pub(super) struct Runner {
    pub(super) commands: Rc<Commands>,
    pub(super) cmd: Rc<Cmd>,
    pub(super) keeper_pid: i32,
    pub(super) keeper: Framed<tokio::net::UnixStream, tokio_util::codec::LengthDelimitedCodec>,
    pub(super) out: Option<pipe::Receiver>,
    pub(super) err: Option<pipe::Receiver>,
    pub(super) deadline: Instant,
    pub(super) grace: Duration,
    pub(super) oom_before: Option<u64>,
    /// Set when the tree is being ended (None to start with).
    pub(super) stopping: Option<StopCause>,
    /// What the command's own process used, once it ended.
    pub(super) main_usage: Option<Usage>,
    /// The workspace's watch while the command runs.
    pub(super) watching: Option<Watching>,
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
    pub(super) async fn run(mut self, mut control: mpsc::Receiver<Control>) {
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
