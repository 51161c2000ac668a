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
//! This module keeps the connections, the hello and the dispatch: each
//! other request goes to its function in `ops`.
//!
//! Everything runs on one thread (a current-thread runtime and a local
//! task set), plus two threads started at launch, one for file I/O and one
//! for searches (so a long search does not hold up reads and writes), so
//! the agent keeps working when the sandbox is at its pids limit. It is a child
//! subreaper, so orphans of a keeper that was killed come to it (and are
//! ended), and it is not dumpable, so the sandbox user cannot read its
//! memory or descriptors.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::linux::net::SocketAddrExt;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use sandboxd_proto::{
    Failure, FailureKind, Hello, HelloReply, MAX_AGENT_FRAME, MAX_HOST_FRAME, NewFile, Op, Reply,
    Request, Response,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::commands::{Commands, Settings};
use crate::file_thread::FileThread;
use crate::ops::commands::Followers;
use crate::ops::watch::Watches;
use crate::ops::{Agent, Answer, commands, files, ports, ptys, search, watch};
use crate::pty::Ptys;
use crate::relay::Relays;
use crate::{transport, tree};

/// How often the agent looks at the sandbox's limits.
const MONITOR_EVERY: Duration = Duration::from_millis(250);

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
    let (files, searches) = match (FileThread::start("files"), FileThread::start("search")) {
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
/// their budget. While no command runs and none left processes, it prunes
/// once and sleeps until the next command starts: an idle agent sets no
/// timer, so a host's idle sandboxes wake nothing.
async fn monitor(commands: Rc<Commands>) {
    let mut last_prune = Instant::now();
    loop {
        if commands.is_settled() {
            commands.prune();
            commands.next_start().await;
            last_prune = Instant::now();
        }
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
    /// The command logs read through this connection.
    followers: Followers,
    /// Writes whose content is still coming, by request id.
    uploads: RefCell<HashMap<u64, Upload>>,
    /// The file watches started through this connection.
    watches: Watches,
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
        let answer = Answer::new(req.id, tx.clone());
        let (agent, conn) = (Rc::clone(&agent), Rc::clone(&conn));
        tokio::task::spawn_local(handle(req.op, content, answer, agent, conn));
    }
    drop(tx);
    // Writes still waiting for content fail now, not after PIECE_WAIT.
    conn.uploads.borrow_mut().clear();
    commands::unfollow_all(&agent, &conn.followers);
    watch::unwatch_all(&conn.watches);
    let _ = write.await;
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
    let (agent, followers) = (&*agent, &conn.followers);
    match op {
        Op::Hello(h) => hello(h, agent, &conn, answer).await,
        Op::Spawn(spec) => commands::spawn(agent, spec, answer).await,
        Op::Kill { command } => commands::kill(agent, command, answer).await,
        Op::ReadLog(r) => commands::read_log(agent, followers, r, answer).await,
        Op::Unfollow { command, follower } => {
            commands::unfollow(agent, followers, command, follower, answer).await
        }
        Op::Wait { command } => commands::wait(agent, command, answer).await,
        Op::Tail { command } => commands::tail(agent, command, answer).await,
        Op::Changes { command } => commands::changes(agent, command, answer).await,
        Op::Forget { command } => commands::forget(agent, command, answer).await,
        Op::Stdin { command, data } => commands::write_stdin(agent, command, &data, answer).await,
        Op::CloseStdin { command } => commands::close_stdin(agent, command, answer).await,
        Op::List => commands::list(agent, answer).await,
        Op::ReadFile { path, max_bytes } => files::read_file(agent, path, max_bytes, answer).await,
        Op::WriteFiles { files } => files::write_files(agent, files, content, answer).await,
        // Routed to its write by the connection; never comes here.
        Op::WriteData { .. } => files::write_data(answer).await,
        Op::Stat { paths, sha256 } => files::stat(agent, paths, sha256, answer).await,
        Op::Search(s) => search::search(agent, s, answer).await,
        Op::ListDir { path } => files::list_dir(agent, path, answer).await,
        Op::Delete { paths, recursive } => files::delete(agent, paths, recursive, answer).await,
        Op::Rename {
            from,
            to,
            overwrite,
        } => files::rename(agent, from, to, overwrite, answer).await,
        Op::MakeDir { path } => files::make_dir(agent, path, answer).await,
        Op::Snapshot { max_entries } => files::snapshot(agent, max_entries, answer).await,
        Op::ReadExact { path, expect } => files::read_exact(agent, path, expect, answer).await,
        Op::SetModes { modes } => files::set_modes(agent, modes, answer).await,
        Op::MakeSymlinks { links } => files::make_symlinks(agent, links, answer).await,
        Op::Relay {
            port,
            listen,
            allow,
        } => ports::relay(agent, port, listen, allow, answer).await,
        Op::Probe { port, wait_ms } => ports::probe(agent, port, wait_ms, answer).await,
        Op::PtyOpen(open) => ptys::open(agent, open, answer).await,
        Op::PtyRead {
            pty,
            after,
            max_bytes,
            wait_ms,
        } => ptys::read(agent, pty, after, max_bytes, wait_ms, answer).await,
        Op::PtyWrite { pty, data } => ptys::write(agent, pty, data, answer).await,
        Op::PtyResize { pty, cols, rows } => ptys::resize(agent, pty, cols, rows, answer).await,
        Op::PtyKill { pty } => ptys::kill(agent, pty, answer).await,
        Op::PtyList => ptys::list(agent, answer).await,
        Op::PtyWait { pty } => ptys::wait(agent, pty, answer).await,
        Op::Watch(start) => watch::watch(agent, &conn.watches, start, answer).await,
        Op::Unwatch { watch: id } => watch::unwatch(&conn.watches, id, answer).await,
    }
}

/// The hello: the protocol's version, the workspace and the settings for
/// everything that follows; answered with what the agent holds.
async fn hello(h: Hello, agent: &Agent, conn: &Conn, answer: Answer) {
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
    agent.commands.configure(Settings {
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
            commands: agent.commands.states(),
        }))
        .await
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
