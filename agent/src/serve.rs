//! `sandboxd-agent serve`: the agent itself. It listens on an abstract
//! unix socket in the sandbox's own network namespace (nothing outside
//! the sandbox can reach it; sandboxd reaches it through `bridge`), reads
//! requests from each connection, runs each as a task and writes the
//! answers back in any order. With `--stdio` its standard input and
//! output are one more connection: the container's own stdio, which
//! sandboxd attaches to when it creates the sandbox, so the first
//! connection costs no exec. It ends when sandboxd detaches (the engine
//! closes a container's input after its one attached client).
//!
//! Everything runs on one thread (a current-thread runtime and a local
//! task set), plus two threads started at launch, one for file I/O and one
//! for searches (so a long search does not hold up reads and writes), so
//! the agent keeps working when the sandbox is at its pids limit. It is a child
//! subreaper, so orphans of a keeper that was killed come to it (and are
//! ended), and it is not dumpable, so the sandbox user cannot read its
//! memory or descriptors.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::os::linux::net::SocketAddrExt;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use sandboxd_proto::{
    CHUNK, Change, ChangesSummary, ENTRIES_PER_CHUNK, Failure, FailureKind, HelloReply, LogChunk,
    MAX_AGENT_FRAME, MAX_HOST_FRAME, NewFile, Op, Reply, Request, Response, Stream,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::commands::{Commands, Settings};
use crate::files::Workspace;
use crate::pty::Ptys;
use crate::relay::{self, Relays};
use crate::{transport, tree};

/// How often the agent looks at the sandbox's limits.
const MONITOR_EVERY: Duration = Duration::from_millis(250);
/// Bytes of recent output a failed probe reports.
const RECENT_OUTPUT: usize = 4096;
/// A file's content goes in pieces of this size: sandboxd hashes and
/// encodes each while the next one is on its way, so what it does after
/// the last byte arrives is one piece's worth.
const READ_PIECE: usize = 256 * 1024;

/// `sandboxd-agent serve`, and with `stdio` its stdin and stdout as a
/// connection.
pub(crate) fn run(stdio: bool) -> ExitCode {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        eprintln!("sandboxd-agent: cannot become a subreaper: {e}");
        return ExitCode::FAILURE;
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sandboxd-agent: cannot find its own binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = match std::os::unix::net::SocketAddr::from_abstract_name(transport::socket_name()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sandboxd-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match std::os::unix::net::UnixListener::bind_addr(&addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sandboxd-agent: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Taken before anything is spawned: no child may inherit them.
    let stdio = if stdio {
        match take_stdio() {
            Ok(fds) => Some(fds),
            Err(e) => {
                eprintln!("sandboxd-agent: cannot take stdio as a connection: {e}");
                None
            }
        }
    } else {
        None
    };
    let (files, searches) = match (FileWorker::start("files"), FileWorker::start("search")) {
        (Ok(f), Ok(s)) => (f, s),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("sandboxd-agent: cannot start the file threads: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Tells sandboxd whether it reconnects to the same agent process.
    let boot = match random_u64() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("sandboxd-agent: no boot id, the OS random source failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxd-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let commands = Commands::new(exe);
        let agent = Rc::new(Agent {
            ptys: Ptys::new(Rc::clone(&commands)),
            commands,
            relays: Rc::new(Relays::default()),
            files,
            searches,
            boot,
        });
        serve(listener, stdio, agent).await
    })
}

/// The agent's stdin and stdout, moved to descriptors closed at exec;
/// 0 and 1 become `/dev/null`. What it starts (keepers, and through them
/// commands) must never read sandboxd's bytes or write into its stream.
fn take_stdio() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use rustix::io::fcntl_dupfd_cloexec;
    let input = fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3)?;
    let output = fcntl_dupfd_cloexec(rustix::stdio::stdout(), 3)?;
    let null = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    // As the bridge does: best effort.
    for fd in [&input, &output] {
        let _ = rustix::pipe::fcntl_setpipe_size(fd, transport::PIPE_BYTES);
    }
    Ok((input, output))
}

/// What every connection shares.
#[derive(Debug)]
struct Agent {
    commands: Rc<Commands>,
    ptys: Rc<Ptys>,
    relays: Rc<Relays>,
    files: FileWorker,
    /// Searches run here, one after the other, each within the deadline
    /// its request set when it came.
    searches: FileWorker,
    boot: u64,
}

async fn serve(
    listener: std::os::unix::net::UnixListener,
    stdio: Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>,
    agent: Rc<Agent>,
) -> ExitCode {
    if let Err(e) = listener.set_nonblocking(true) {
        eprintln!("sandboxd-agent: {e}");
        return ExitCode::FAILURE;
    }
    let listener = match tokio::net::UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sandboxd-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A write past RLIMIT_FSIZE must fail with EFBIG (answered TooLarge),
    // not kill the agent. A handler, not SIG_IGN: commands get the default
    // again at exec.
    let _xfsz = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(
        rustix::process::Signal::XFSZ.as_raw(),
    )) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sandboxd-agent: no SIGXFSZ handler: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::task::spawn_local(reaper());
    tokio::task::spawn_local(monitor(Rc::clone(&agent.commands)));
    // The first command finds a keeper waiting too.
    agent.commands.refill_spare();
    if let Some((input, output)) = stdio {
        use tokio::net::unix::pipe;
        match (
            pipe::Receiver::from_owned_fd(input),
            pipe::Sender::from_owned_fd(output),
        ) {
            (Ok(r), Ok(w)) => {
                tokio::task::spawn_local(connection(r, w, Rc::clone(&agent)));
            }
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("sandboxd-agent: stdio is not a connection: {e}");
            }
        }
    }
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (r, w) = stream.into_split();
                tokio::task::spawn_local(connection(r, w, Rc::clone(&agent)));
            }
            Err(e) => {
                eprintln!("sandboxd-agent: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reaps whatever ends among the agent's children (keepers, and orphans
/// of killed keepers) whenever a child ends.
async fn reaper() {
    let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
    else {
        eprintln!("sandboxd-agent: no SIGCHLD handler; reaping every second");
        loop {
            tree::reap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    loop {
        tree::reap();
        sigchld.recv().await;
    }
}

/// Ends leftovers when the sandbox nears its limits; keeps logs within
/// their budget.
async fn monitor(commands: Rc<Commands>) {
    let mut last_prune = Instant::now();
    loop {
        tokio::time::sleep(MONITOR_EVERY).await;
        commands.relieve_if_pressed();
        if last_prune.elapsed() >= Duration::from_secs(1) {
            commands.prune();
            last_prune = Instant::now();
        }
    }
}

/// One connection's state.
#[derive(Debug, Default)]
struct Conn {
    hello: Cell<bool>,
    /// (command, follower) pairs read through this connection.
    followers: RefCell<HashSet<(String, u64)>>,
    /// Writes whose content is still coming, by request id.
    uploads: RefCell<HashMap<u64, Upload>>,
}

/// Where the pieces of one write's content go: to its file thread call.
#[derive(Debug)]
struct Upload {
    to: std_mpsc::Sender<Bytes>,
    /// Bytes still to come.
    left: u64,
}

impl Conn {
    /// A write `id` starts: its content comes through the receiver. Ending
    /// the connection drops the sender, so a write never waits for pieces
    /// that cannot come.
    fn expect_content(&self, id: u64, files: &[NewFile]) -> std_mpsc::Receiver<Bytes> {
        let (to, from) = std_mpsc::channel();
        let left = files.iter().fold(0u64, |n, f| n.saturating_add(f.size));
        if left > 0 {
            self.uploads.borrow_mut().insert(id, Upload { to, left });
        }
        from
    }

    /// A piece of write `id`'s content. Dropped when no such write waits
    /// (it failed already); a piece past the write's size ends its
    /// content, so the write fails.
    fn content(&self, id: u64, data: Bytes) {
        let mut uploads = self.uploads.borrow_mut();
        let Some(u) = uploads.get_mut(&id) else {
            return;
        };
        let n = u64::try_from(data.len()).unwrap_or(u64::MAX);
        let taken = n <= u.left && u.to.send(data).is_ok();
        u.left = u.left.saturating_sub(n);
        if !taken || u.left == 0 {
            uploads.remove(&id);
        }
    }
}

/// Serves one connection (`r` and `w` are its two directions) until it
/// ends.
async fn connection(
    r: impl AsyncRead + Unpin + 'static,
    w: impl AsyncWrite + Unpin + 'static,
    agent: Rc<Agent>,
) {
    let mut reader = FramedRead::new(r, sandboxd_proto::codec(MAX_HOST_FRAME));
    let mut writer = FramedWrite::new(w, sandboxd_proto::codec(MAX_AGENT_FRAME));
    let (tx, mut rx) = mpsc::channel::<Response>(256);
    let conn = Rc::new(Conn::default());
    let write = tokio::task::spawn_local(async move {
        while let Some(resp) = rx.recv().await {
            let Ok(body) = sandboxd_proto::encode(&resp) else {
                continue;
            };
            if writer.send(body).await.is_err() {
                break;
            }
        }
    });
    while let Some(frame) = reader.next().await {
        let Ok(frame) = frame else { break };
        let req: Request = match sandboxd_proto::decode(&frame) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("sandboxd-agent: a malformed request: {e}");
                break;
            }
        };
        let content = match req.op {
            Op::WriteData { data } => {
                conn.content(req.id, data);
                continue;
            }
            Op::WriteFiles { ref files } => Some(conn.expect_content(req.id, files)),
            _ => None,
        };
        let answer = Answer {
            id: req.id,
            tx: tx.clone(),
        };
        let (agent, conn) = (Rc::clone(&agent), Rc::clone(&conn));
        tokio::task::spawn_local(handle(req.op, content, answer, agent, conn));
    }
    drop(tx);
    // Writes still waiting for content fail now, not after PIECE_WAIT.
    conn.uploads.borrow_mut().clear();
    for (command, follower) in conn.followers.take() {
        if let Ok(cmd) = agent.commands.get(&command) {
            cmd.log.borrow_mut().unfollow(follower);
            cmd.reader_moved();
        }
    }
    let _ = write.await;
}

/// Where the answers to one request go.
struct Answer {
    id: u64,
    tx: mpsc::Sender<Response>,
}

impl Answer {
    async fn part(&self, reply: Reply) -> bool {
        self.tx
            .send(Response {
                id: self.id,
                more: true,
                reply,
            })
            .await
            .is_ok()
    }

    async fn last(self, reply: Reply) {
        let _ = self
            .tx
            .send(Response {
                id: self.id,
                more: false,
                reply,
            })
            .await;
    }

    async fn result(self, r: Result<Reply, Failure>) {
        self.last(r.unwrap_or_else(Reply::Error)).await;
    }
}

/// Runs one request. `content` is where a write's content comes from.
async fn handle(
    op: Op,
    content: Option<std_mpsc::Receiver<Bytes>>,
    answer: Answer,
    agent: Rc<Agent>,
    conn: Rc<Conn>,
) {
    if !conn.hello.get() && !matches!(op, Op::Hello(_)) {
        let f = Failure::new(FailureKind::Invalid, "the first request must be Hello");
        return answer.last(Reply::Error(f)).await;
    }
    let commands = &agent.commands;
    match op {
        Op::Hello(h) => {
            if h.version != sandboxd_proto::VERSION {
                let f = Failure::new(
                    FailureKind::Version,
                    format!(
                        "this agent speaks version {}, not {}",
                        sandboxd_proto::VERSION,
                        h.version
                    ),
                );
                return answer.last(Reply::Error(f)).await;
            }
            let Some(canonical) = h.workspace.first().cloned() else {
                let f = Failure::new(FailureKind::Invalid, "no workspace");
                return answer.last(Reply::Error(f)).await;
            };
            commands.configure(Settings {
                workspace: canonical,
                grace: Duration::from_millis(h.kill_grace_ms),
                ring_bytes: usize::try_from(h.output_buffer_bytes).unwrap_or(usize::MAX),
                memory_bytes: usize::try_from(h.output_memory_bytes).unwrap_or(usize::MAX),
                max_finished: h.max_finished as usize,
                pids_limit: h.pids_limit,
                watch_budget: h.changes_watch_budget as usize,
            });
            agent.searches.set_workspace(h.workspace.clone());
            agent.files.set_workspace(h.workspace);
            conn.hello.set(true);
            answer
                .last(Reply::Hello(HelloReply {
                    version: sandboxd_proto::VERSION,
                    boot: agent.boot,
                    commands: commands.states(),
                }))
                .await
        }
        Op::Spawn(spec) => {
            let r = commands.spawn(spec).await.map(|pid| Reply::Spawned { pid });
            answer.result(r).await
        }
        Op::Kill { command } => match commands.get(&command) {
            Ok(cmd) => {
                cmd.kill().await;
                answer.last(Reply::Ok).await
            }
            Err(f) => answer.last(Reply::Error(f)).await,
        },
        Op::ReadLog(r) => {
            let cmd = match commands.get(&r.command) {
                Ok(c) => c,
                Err(f) => return answer.last(Reply::Error(f)).await,
            };
            conn.followers
                .borrow_mut()
                .insert((r.command.clone(), r.follower));
            let mut changed = cmd.subscribe();
            let deadline = Instant::now() + Duration::from_millis(u64::from(r.wait_ms));
            let chunk = loop {
                changed.borrow_and_update();
                let batch = {
                    let mut log = cmd.log.borrow_mut();
                    log.follow(r.follower, r.after, Instant::now());
                    log.read(
                        r.after,
                        r.max_bytes as usize,
                        r.past_exit,
                        cmd.output_closed(),
                    )
                };
                cmd.reader_moved();
                if !batch.records.is_empty() || batch.complete || Instant::now() >= deadline {
                    break LogChunk {
                        records: batch.records,
                        complete: batch.complete,
                    };
                }
                let _ = tokio::time::timeout_at(deadline.into(), changed.changed()).await;
            };
            answer.last(Reply::Log(chunk)).await
        }
        Op::Unfollow { command, follower } => {
            if let Ok(cmd) = commands.get(&command) {
                cmd.log.borrow_mut().unfollow(follower);
                cmd.reader_moved();
            }
            conn.followers.borrow_mut().remove(&(command, follower));
            answer.last(Reply::Ok).await
        }
        Op::Wait { command } => {
            let cmd = match commands.get(&command) {
                Ok(c) => c,
                Err(f) => return answer.last(Reply::Error(f)).await,
            };
            let mut changed = cmd.subscribe();
            loop {
                changed.borrow_and_update();
                if let Some(ended) = cmd.ended() {
                    return answer.last(Reply::Ended(ended)).await;
                }
                if changed.changed().await.is_err() {
                    let f = Failure::new(FailureKind::NoSuchCommand, "the command is gone");
                    return answer.last(Reply::Error(f)).await;
                }
            }
        }
        Op::Tail { command } => {
            let cmd = match commands.get(&command) {
                Ok(c) => c,
                Err(f) => return answer.last(Reply::Error(f)).await,
            };
            let shaped = cmd.log.borrow().shaped();
            for (stream, (text, info)) in [Stream::Stdout, Stream::Stderr]
                .into_iter()
                .zip(shaped.into_iter().flatten())
            {
                // Every stream gets a part, an empty one too: it carries the info.
                let pieces = text_chunks(&text, CHUNK);
                for piece in pieces.into_iter().chain(text.is_empty().then_some("")) {
                    let part = Reply::Shaped {
                        stream,
                        text: piece.to_string(),
                        info,
                    };
                    if !answer.part(part).await {
                        return;
                    }
                }
            }
            let tails = cmd.tails();
            for (stream, (text, cut)) in [Stream::Stdout, Stream::Stderr]
                .into_iter()
                .zip(tails.into_iter().flatten())
            {
                // Every stream gets a part, an empty one too: it carries the cut.
                let pieces = text_chunks(&text, CHUNK);
                for piece in pieces.into_iter().chain(text.is_empty().then_some("")) {
                    let part = Reply::TailPart {
                        stream,
                        text: piece.to_string(),
                        cut_bytes: cut,
                    };
                    if !answer.part(part).await {
                        return;
                    }
                }
            }
            answer.last(Reply::Ok).await
        }
        Op::Changes { command } => {
            let cmd = match commands.get(&command) {
                Ok(c) => c,
                Err(f) => return answer.last(Reply::Error(f)).await,
            };
            let report = match (cmd.watched(), cmd.changes()) {
                (false, _) => Err(Failure::new(
                    FailureKind::NotFound,
                    format!("command {command} was started without changes"),
                )),
                (true, None) => Err(Failure::new(
                    FailureKind::StillRunning,
                    format!("command {command} is still running"),
                )),
                (true, Some(r)) => Ok(r),
            };
            let report = match report {
                Ok(r) => r,
                Err(f) => return answer.last(Reply::Error(f)).await,
            };
            for piece in change_pieces(report.changes) {
                if !answer.part(Reply::ChangesPart(piece)).await {
                    return;
                }
            }
            let summary = ChangesSummary {
                more: report.more,
                method: report.method,
                complete: report.complete,
            };
            answer.last(Reply::Changes(summary)).await
        }
        Op::Forget { command } => {
            let r = commands.forget(&command).map(|()| Reply::Ok);
            answer.result(r).await
        }
        Op::List => answer.last(Reply::Commands(commands.states())).await,
        Op::ReadFile { path, max_bytes } => {
            let r = agent
                .files
                .call(move |ws| ws.read_file(&path, max_bytes))
                .await;
            match r {
                Ok(content) => {
                    for piece in content.chunks(READ_PIECE) {
                        if !answer.part(Reply::Data(piece.to_vec())).await {
                            return;
                        }
                    }
                    answer.last(Reply::Ok).await
                }
                Err(f) => answer.last(Reply::Error(f)).await,
            }
        }
        Op::WriteFiles { files } => {
            let Some(mut content) = content else {
                let f = Failure::new(FailureKind::Other, "a write without its content");
                return answer.last(Reply::Error(f)).await;
            };
            let r = agent
                .files
                .call(move |ws| ws.write_files(files, &mut content))
                .await;
            let r = r.map(|failed| match failed.is_empty() {
                true => Reply::Ok,
                false => Reply::PreconditionFailed(failed),
            });
            answer.result(r).await
        }
        // Routed to its write by the connection; never comes here.
        Op::WriteData { .. } => {
            let stray = Failure::new(FailureKind::Other, "content with no write");
            answer.result(Err(stray)).await;
        }
        Op::Stat { paths, sha256 } => {
            let r = agent.files.call(move |ws| ws.stat(&paths, sha256)).await;
            answer.result(r.map(Reply::Stats)).await
        }
        Op::Search(s) => {
            // From now, not from when the thread gets to it: searches
            // queued behind one another still answer in time.
            let deadline = Instant::now() + Duration::from_millis(u64::from(s.deadline_ms));
            let r = agent
                .searches
                .call(move |ws| crate::search::search(ws, &s, deadline))
                .await;
            match r {
                Ok((matches, searched)) => {
                    for piece in match_pieces(matches) {
                        if !answer.part(Reply::Matches(piece)).await {
                            return;
                        }
                    }
                    answer.last(Reply::Searched(searched)).await
                }
                Err(f) => answer.last(Reply::Error(f)).await,
            }
        }
        Op::ListDir { path } => {
            let r = agent.files.call(move |ws| ws.list_dir(&path)).await;
            match r {
                Ok(entries) => {
                    for piece in entries.chunks(ENTRIES_PER_CHUNK) {
                        if !answer.part(Reply::Entries(piece.to_vec())).await {
                            return;
                        }
                    }
                    answer.last(Reply::Ok).await
                }
                Err(f) => answer.last(Reply::Error(f)).await,
            }
        }
        Op::Delete { paths, recursive } => {
            let r = agent
                .files
                .call(move |ws| ws.delete(&paths, recursive))
                .await;
            answer.result(r.map(|()| Reply::Ok)).await
        }
        Op::Relay {
            port,
            listen,
            allow,
        } => {
            let r = agent
                .relays
                .ensure(port, listen, &allow)
                .map(|()| Reply::Ok);
            answer.result(r).await
        }
        Op::PtyOpen(open) => {
            let r = agent
                .ptys
                .open(open)
                .await
                .map(|pid| Reply::Spawned { pid });
            answer.result(r).await
        }
        Op::PtyRead {
            pty,
            after,
            max_bytes,
            wait_ms,
        } => {
            let r = match agent.ptys.get(&pty) {
                Ok(p) => {
                    let max = (max_bytes as usize).min(CHUNK);
                    let wait = Duration::from_millis(u64::from(wait_ms));
                    Ok(Reply::PtyOutput(p.read(after, max, wait).await))
                }
                Err(f) => Err(f),
            };
            answer.result(r).await
        }
        Op::PtyWrite { pty, data } => {
            let r = match agent.ptys.get(&pty) {
                Ok(p) => p.write(&data).await.map(|()| Reply::Ok),
                Err(f) => Err(f),
            };
            answer.result(r).await
        }
        Op::PtyResize { pty, cols, rows } => {
            let r = agent
                .ptys
                .get(&pty)
                .and_then(|p| p.resize(cols, rows))
                .map(|()| Reply::Ok);
            answer.result(r).await
        }
        Op::PtyKill { pty } => {
            let r = agent.ptys.get(&pty).map(|p| {
                p.kill();
                Reply::Ok
            });
            answer.result(r).await
        }
        Op::PtyList => answer.last(Reply::Ptys(agent.ptys.states())).await,
        Op::PtyWait { pty } => {
            let r = match agent.ptys.get(&pty) {
                Ok(p) => Ok(Reply::PtyEnded(p.wait().await)),
                Err(f) => Err(f),
            };
            answer.result(r).await
        }
        Op::Probe { port, wait_ms } => {
            let ready = relay::probe(port, Duration::from_millis(u64::from(wait_ms))).await;
            let recent_output = if ready {
                String::new()
            } else {
                commands
                    .latest()
                    .map(|c| c.log.borrow().recent_text(RECENT_OUTPUT))
                    .unwrap_or_default()
            };
            answer
                .last(Reply::Probed {
                    ready,
                    recent_output,
                })
                .await
        }
    }
}

/// `text` in pieces of at most `max` bytes, cut at character boundaries.
fn text_chunks(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(max);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            // A character longer than `max` goes whole.
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (piece, tail) = rest.split_at(end);
        out.push(piece);
        rest = tail;
    }
    out
}

/// Changes in pieces that each fit a frame: at most about half a
/// [`CHUNK`] of paths per piece.
fn change_pieces(changes: Vec<Change>) -> Vec<Vec<Change>> {
    let mut pieces = Vec::new();
    let mut piece = Vec::new();
    let mut bytes = 0usize;
    for c in changes {
        let weight = 32 + c.path.len();
        if !piece.is_empty() && bytes + weight > CHUNK / 2 {
            pieces.push(std::mem::take(&mut piece));
            bytes = 0;
        }
        bytes += weight;
        piece.push(c);
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// Matches in pieces that each fit a frame: at most about half a
/// [`CHUNK`] of text per piece.
fn match_pieces(matches: Vec<sandboxd_proto::Match>) -> Vec<Vec<sandboxd_proto::Match>> {
    let mut pieces = Vec::new();
    let mut piece = Vec::new();
    let mut bytes = 0usize;
    for m in matches {
        let weight = 64
            + m.path.len()
            + m.text.len()
            + m.before
                .iter()
                .chain(&m.after)
                .map(|l| l.len() + 8)
                .sum::<usize>();
        if !piece.is_empty() && bytes + weight > CHUNK / 2 {
            pieces.push(std::mem::take(&mut piece));
            bytes = 0;
        }
        bytes += weight;
        piece.push(m);
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// 64 bits from the OS random source; an error rather than a guessable
/// value when it fails.
fn random_u64() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    let n = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())?;
    if n != b.len() {
        return Err(std::io::Error::other("short read from getrandom"));
    }
    Ok(u64::from_le_bytes(b))
}

type FileJob = Box<dyn FnOnce(&Workspace) + Send>;

/// The thread that does file I/O, started at launch (a sandbox at its pids
/// limit cannot start one later), so blocking calls never stall commands.
#[derive(Debug)]
struct FileWorker {
    jobs: std_mpsc::Sender<FileWork>,
}

enum FileWork {
    Workspace(Vec<String>),
    Job(FileJob),
}

impl std::fmt::Debug for FileWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileWork")
    }
}

impl FileWorker {
    fn start(name: &str) -> std::io::Result<FileWorker> {
        let (tx, rx) = std_mpsc::channel::<FileWork>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut ws = Workspace::new(vec!["/workspace".into()]);
                while let Ok(work) = rx.recv() {
                    match work {
                        FileWork::Workspace(dirs) => ws = Workspace::new(dirs),
                        FileWork::Job(job) => job(&ws),
                    }
                }
            })?;
        Ok(FileWorker { jobs: tx })
    }

    fn set_workspace(&self, dirs: Vec<String>) {
        let _ = self.jobs.send(FileWork::Workspace(dirs));
    }

    /// Runs `f` on the file thread and returns its result.
    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Workspace) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        let (tx, rx) = oneshot::channel();
        let job: FileJob = Box::new(move |ws| {
            let _ = tx.send(f(ws));
        });
        if self.jobs.send(FileWork::Job(job)).is_err() {
            return Err(Failure::new(FailureKind::Other, "the file thread is gone"));
        }
        rx.await
            .unwrap_or_else(|_| Err(Failure::new(FailureKind::Other, "the file thread failed")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_character_boundaries() {
        assert_eq!(text_chunks("abcdef", 4), ["abcd", "ef"]);
        assert_eq!(text_chunks("a€b", 2), ["a", "€", "b"]);
        assert!(text_chunks("", 4).is_empty());
    }
}
