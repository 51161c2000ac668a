//! Terminal sessions: a program on a pseudo-terminal in a sandbox, for a
//! REPL, a program that asks questions, or a person looking inside. The
//! agent owns each session (the program, its process tree, a scrollback
//! ring of its screen output), so sessions outlive a restart of sandboxd
//! like commands do; sandboxd keeps only what concerns its clients: the
//! viewers attached to each session (the last one to attach is the one
//! whose input counts), single-use attach tickets, and a task per running
//! session that logs its end.
//!
//! A viewer is a pair of streams ([`ViewerInput`] in, [`ViewerEvent`]
//! out; the HTTP edge adapts a WebSocket to them). It first gets the
//! scrollback, then the live output, read from the agent at its own pace:
//! the program never waits for a viewer, and one that falls more than the
//! scrollback behind is told how much it missed (`Lagged`) and goes on
//! from the oldest byte kept, without holding back the others. An attached viewer keeps its sandbox busy (never idle-
//! stopped); a session nobody watches does not.
//!
//! What the agent reports is checked like everything from a sandbox:
//! session ids of our form, bounded text and data, offsets that only move
//! forward.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use sandboxd_proto::{FailureKind, PtyEnded, PtyOpen, PtyOutput, PtyState};
use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use crate::agent_client::{AgentConn, AgentError};
use crate::clock::now_ms;
use crate::config::Config;
use crate::field_error::FieldError;
use crate::process_fields::{self, SUMMARY_CHARS, no_nul, summarise};
use crate::sandbox::{Sandbox, SandboxError, Sandboxes, environment};

/// Sessions that may run in one sandbox at once.
pub const MAX_RUNNING: u32 = 8;
/// Most columns or rows of a window, at open and on resize.
pub const MAX_WINDOW: u16 = 1000;
/// How long an attach ticket is good for.
pub const TICKET_TTL: Duration = Duration::from_secs(30);
/// Tickets not yet used, at most (past it, 429).
const MAX_TICKETS: usize = 4096;
/// Most bytes one read from the agent brings (and one output event holds).
pub const OUTPUT_CHUNK: u32 = 256 * 1024;
/// How long one read from the agent waits for output.
const READ_WAIT: Duration = Duration::from_secs(20);
/// The terminal type a session gets unless its request names one.
const DEFAULT_TERM: &str = "xterm-256color";

/// What can go wrong with a session operation.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error(transparent)]
    Invalid(#[from] FieldError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("no terminal session {0:?} in this sandbox")]
    NotFound(String),
    #[error("this sandbox already runs {max} terminal sessions; end one first")]
    TooMany { max: u32 },
    /// The sandbox is at its pids limit.
    #[error("{0}")]
    NoProcesses(String),
    #[error("{MAX_TICKETS} attach tickets wait to be used; use or let some expire first")]
    TooManyTickets,
}

impl From<AgentError> for PtyError {
    fn from(e: AgentError) -> Self {
        PtyError::Sandbox(e.into())
    }
}

/// Result of session operations.
pub type PtyResult<T> = Result<T, PtyError>;

/// What runs: a command line, or a program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(untagged)]
#[schema(as = CommandField)]
pub enum PtyCommand {
    /// Run as `bash -lc 'exec LINE'`.
    Line(String),
    /// Run as `bash -lc 'exec "$@"' sandboxd ARGV…`, without re-parsing.
    Argv(Vec<String>),
}

/// `POST …/ptys` body.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = PtyBody)]
pub struct PtyRequest {
    /// None: the sandbox user's login shell, in login mode.
    #[serde(default)]
    pub command: Option<PtyCommand>,
    /// Workspace-relative or absolute under the workspace; created if missing.
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// 1–1000, default 80.
    #[serde(default)]
    pub cols: Option<i64>,
    /// 1–1000, default 24.
    #[serde(default)]
    pub rows: Option<i64>,
}

/// A session as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtyInfo {
    pub pty_id: String,
    pub command: String,
    pub created_at: u64,
    /// Viewers attached now.
    pub viewers: usize,
    pub ended: Option<PtyEnded>,
    /// The label a client finds it by (E2B's process tag), kept by its
    /// agent.
    pub tag: Option<String>,
}

/// An attach ticket.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub ticket: String,
    pub expires_in_ms: u64,
}

/// What a viewer sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewerInput {
    /// Terminal input (keys, pasted text).
    Bytes(Bytes),
    Resize {
        cols: u16,
        rows: u16,
    },
    /// Something that is not input (a control message we do not know):
    /// ignored.
    Other,
}

/// What a viewer is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewerEvent {
    /// Screen output.
    Output(Bytes),
    /// Whether this viewer's input counts (sent on attach and on change).
    Writer(bool),
    /// The session's process ended: the last event.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// The viewer fell more than the scrollback behind: this many bytes
    /// were skipped, and output goes on from the oldest byte kept.
    Lagged { skipped: u64 },
}

/// The viewers of one session: ids in the order they attached; the last
/// one writes.
#[derive(Debug)]
struct Viewers {
    ids: Vec<u64>,
    writer: watch::Sender<Option<u64>>,
}

#[derive(Debug)]
struct TicketEntry {
    sandbox_id: String,
    pty_id: String,
    expires: Instant,
}

/// The tickets issued and not yet used (expired ones go at the next issue).
#[derive(Debug, Default)]
struct Tickets {
    open: HashMap<String, TicketEntry>,
}

impl Tickets {
    /// A new ticket for the session; refused at [`MAX_TICKETS`], and
    /// when the OS random source fails.
    fn issue(&mut self, sandbox_id: &str, pty_id: &str, now: Instant) -> PtyResult<String> {
        self.open.retain(|_, t| t.expires > now);
        if self.open.len() >= MAX_TICKETS {
            return Err(PtyError::TooManyTickets);
        }
        let ticket = crate::id::random_hex(16).map_err(SandboxError::from)?;
        self.open.insert(
            ticket.clone(),
            TicketEntry {
                sandbox_id: sandbox_id.to_string(),
                pty_id: pty_id.to_string(),
                expires: now + TICKET_TTL,
            },
        );
        Ok(ticket)
    }

    fn redeem(&mut self, ticket: &str, sandbox_id: &str, pty_id: &str, now: Instant) -> bool {
        self.open
            .remove(ticket)
            .is_some_and(|t| t.expires > now && t.sandbox_id == sandbox_id && t.pty_id == pty_id)
    }
}

/// The sessions service.
#[derive(Debug)]
pub struct Ptys {
    config: Arc<Config>,
    sandboxes: Arc<Sandboxes>,
    viewers: Mutex<HashMap<String, Viewers>>,
    tickets: Mutex<Tickets>,
    next_viewer: AtomicU64,
    shutdown: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Single inserts and removes leave the maps consistent after a panic.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn bad(field: &str, msg: impl std::fmt::Display) -> FieldError {
    FieldError::new(field, msg.to_string())
}

fn window(field: &str, v: Option<i64>, default: u16) -> Result<u16, FieldError> {
    match v {
        None => Ok(default),
        Some(n) if (1..=i64::from(MAX_WINDOW)).contains(&n) => {
            Ok(u16::try_from(n).unwrap_or(default))
        }
        Some(n) => Err(bad(
            field,
            format!("must be between 1 and {MAX_WINDOW} (got {n})"),
        )),
    }
}

/// The program, argv and summary of a session: a login shell, or the
/// command through one.
fn program_of(command: Option<PtyCommand>) -> Result<(String, Vec<String>, String), FieldError> {
    match command {
        // The agent finds the user's login shell and runs it as `-NAME`.
        None => Ok((String::new(), Vec::new(), "(login shell)".to_string())),
        Some(PtyCommand::Line(line)) => {
            no_nul("command", &line)?;
            if line.trim().is_empty() {
                return Err(bad("command", "must not be empty"));
            }
            let argv = vec![
                "bash".to_string(),
                "-lc".to_string(),
                format!("exec {line}"),
            ];
            Ok(("/bin/bash".to_string(), argv, summarise(&line)))
        }
        Some(PtyCommand::Argv(args)) => {
            if args.first().is_none_or(String::is_empty) {
                return Err(bad("command", "must name a program first"));
            }
            for (i, a) in args.iter().enumerate() {
                no_nul(&format!("command[{i}]"), a)?;
            }
            let summary = summarise(&args.join(" "));
            let argv = process_fields::through_login_shell("bash".into(), args);
            Ok(("/bin/bash".to_string(), argv, summary))
        }
    }
}

impl Ptys {
    pub fn new(
        config: Arc<Config>,
        sandboxes: Arc<Sandboxes>,
        shutdown: CancellationToken,
    ) -> Self {
        Ptys {
            config,
            sandboxes,
            viewers: Mutex::new(HashMap::new()),
            tickets: Mutex::new(Tickets::default()),
            next_viewer: AtomicU64::new(1),
            shutdown,
        }
    }

    /// Starts a session; answers its id.
    pub async fn open(&self, sandbox_id: &str, req: PtyRequest) -> PtyResult<String> {
        self.open_tagged(sandbox_id, req, None).await
    }

    /// Starts a session carrying `tag` (see [`PtyInfo::tag`] and
    /// [`Self::tagged`]); answers its id.
    pub async fn open_tagged(
        &self,
        sandbox_id: &str,
        req: PtyRequest,
        tag: Option<String>,
    ) -> PtyResult<String> {
        let tag = process_fields::tag(tag)?;
        let cols = window("cols", req.cols, 80)?;
        let rows = window("rows", req.rows, 24)?;
        let (program, argv, summary) = program_of(req.command)?;
        let mut env = process_fields::env_vars(req.env)?;
        if !env.iter().any(|(name, _)| name == "TERM") {
            env.push(("TERM".into(), DEFAULT_TERM.into()));
        }
        let cwd = process_fields::cwd(req.cwd, &self.config)?;
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let _busy = sandbox.open_request();
        let open = PtyOpen {
            pty: crate::id::random_hex(12).map_err(SandboxError::from)?,
            program,
            argv,
            env: environment::under(&sandbox.env, env),
            cwd,
            cols,
            rows,
            summary,
            created_at_ms: now_ms(),
            max_running: MAX_RUNNING,
            tag,
        };
        let limit = self.config.agent_timeout;
        let opened = self
            .sandboxes
            .with_agent(&sandbox, |conn| {
                let open = open.clone();
                async move {
                    match conn.pty_open(open, limit).await {
                        Ok(()) => Ok(conn),
                        // A repeat (the connection closed after the first
                        // reached the agent): the session runs.
                        Err(AgentError::Refused(f)) if f.kind == FailureKind::DuplicateCommand => {
                            Ok(conn)
                        }
                        Err(e) => Err(e),
                    }
                }
            })
            .await;
        let conn = match opened {
            Ok(conn) => conn,
            Err(SandboxError::Agent(AgentError::Refused(f))) => {
                return Err(match f.kind {
                    FailureKind::TooMany => PtyError::TooMany { max: MAX_RUNNING },
                    FailureKind::NoProcesses => PtyError::NoProcesses(f.message),
                    _ => self
                        .sandboxes
                        .gone_or(&sandbox, PtyError::from(AgentError::Refused(f))),
                });
            }
            Err(e) => return Err(self.sandboxes.gone_or(&sandbox, e).into()),
        };
        crate::telemetry::pty_opened();
        tracing::info!(
            event = "pty_opened",
            sandbox_id = %sandbox.id,
            session_key = %sandbox.session_key,
            pty_id = %open.pty,
            command = %open.summary,
            "terminal session opened"
        );
        self.watch_end(&sandbox, conn, open.pty.clone(), Instant::now());
        Ok(open.pty)
    }

    /// Logs and counts the session's end when it comes (or stops watching
    /// when the sandbox goes or sandboxd shuts down).
    fn watch_end(&self, sandbox: &Sandbox, conn: Arc<AgentConn>, pty_id: String, since: Instant) {
        let sandbox_id = sandbox.id.clone();
        let session_key = sandbox.session_key.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let ended = tokio::select! {
                r = conn.pty_wait(&pty_id) => r,
                () = shutdown.cancelled() => return,
            };
            let Ok(ended) = ended else {
                return;
            };
            crate::telemetry::pty_ended();
            tracing::info!(
                event = "pty_exited",
                sandbox_id = %sandbox_id,
                session_key = %session_key,
                pty_id = %pty_id,
                exit_code = ended.exit_code,
                signal = ended.signal,
                // The agent's figure, bounded by what sandboxd saw.
                duration_ms = ended
                    .duration_ms
                    .min(u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)),
                "terminal session ended"
            );
        });
    }

    /// After a restart of sandboxd: watches for the end of every session
    /// still running in the sandboxes' agents.
    pub async fn discover(&self) {
        let sandboxes = self.sandboxes.registry().list();
        futures_util::future::join_all(sandboxes.into_iter().map(|s| self.discover_in(s))).await;
    }

    async fn discover_in(&self, sandbox: Arc<Sandbox>) {
        let Ok(conn) = self.sandboxes.agent(&sandbox).await else {
            return;
        };
        let limit = self.config.agent_timeout;
        let Ok(list) = conn.pty_list(limit).await else {
            return;
        };
        for state in list.into_iter().take(MAX_RUNNING as usize + 64) {
            if state.ended.is_none() && crate::id::is_hex_id(&state.pty, 24) {
                self.watch_end(&sandbox, Arc::clone(&conn), state.pty, Instant::now());
            }
        }
    }

    /// The sessions of a sandbox: running ones, and ended ones for the
    /// command retention time.
    pub async fn list(&self, sandbox_id: &str) -> PtyResult<Vec<PtyInfo>> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        let states = self.states(&sandbox).await?;
        let now = now_ms();
        let retention =
            u64::try_from(self.config.command_retention.as_millis()).unwrap_or(u64::MAX);
        let viewers = lock(&self.viewers);
        let mut list: Vec<PtyInfo> = states
            .into_iter()
            .filter(|s| {
                s.ended
                    .is_none_or(|e| now.saturating_sub(e.ended_at_ms.min(now)) <= retention)
            })
            .map(|s| PtyInfo {
                viewers: viewers.get(&s.pty).map_or(0, |v| v.ids.len()),
                command: s.summary.chars().take(SUMMARY_CHARS).collect(),
                created_at: s.created_at_ms.min(now),
                pty_id: s.pty,
                ended: s.ended,
                // Checked like a request's; one that is not is dropped.
                tag: process_fields::tag(s.tag).ok().flatten(),
            })
            .collect();
        list.sort_by(|a, b| (a.created_at, &a.pty_id).cmp(&(b.created_at, &b.pty_id)));
        Ok(list)
    }

    /// The running session of `sandbox_id` tagged `tag`: the one opened
    /// last when several are (tags need not be unique, as in envd). A
    /// session that has ended no longer answers to its tag.
    pub async fn tagged(&self, sandbox_id: &str, tag: &str) -> PtyResult<Option<PtyInfo>> {
        Ok(self
            .list(sandbox_id)
            .await?
            .into_iter()
            .rfind(|p| p.ended.is_none() && p.tag.as_deref() == Some(tag)))
    }

    /// The agent's list, checked: ids of our form, bounded.
    async fn states(&self, sandbox: &Arc<Sandbox>) -> PtyResult<Vec<PtyState>> {
        let limit = self.config.agent_timeout;
        let list = self
            .sandboxes
            .with_agent(sandbox, |conn| async move { conn.pty_list(limit).await })
            .await
            .map_err(|e| self.sandboxes.gone_or(sandbox, e))?;
        Ok(list
            .into_iter()
            .filter(|s| crate::id::is_hex_id(&s.pty, 24))
            .take(MAX_RUNNING as usize + 64)
            .collect())
    }

    /// Fails unless the sandbox has session `pty_id`.
    pub async fn check(&self, sandbox_id: &str, pty_id: &str) -> PtyResult<Arc<Sandbox>> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        if !crate::id::is_hex_id(pty_id, 24)
            || !self.states(&sandbox).await?.iter().any(|s| s.pty == pty_id)
        {
            return Err(PtyError::NotFound(pty_id.to_string()));
        }
        Ok(sandbox)
    }

    /// Ends the session's process tree (SIGTERM, the grace period, SIGKILL).
    pub async fn kill(&self, sandbox_id: &str, pty_id: &str) -> PtyResult<()> {
        let sandbox = self.check(sandbox_id, pty_id).await?;
        let limit = self.config.agent_timeout;
        self.sandboxes
            .with_agent(&sandbox, |conn| async move {
                conn.pty_kill(pty_id, limit).await
            })
            .await
            .map_err(|e| self.sandboxes.gone_or(&sandbox, e))?;
        Ok(())
    }

    /// A single-use ticket to attach to the session for [`TICKET_TTL`]:
    /// what a browser presents, as it cannot set headers on a WebSocket.
    pub async fn ticket(&self, sandbox_id: &str, pty_id: &str) -> PtyResult<Ticket> {
        let sandbox = self.check(sandbox_id, pty_id).await?;
        let ticket = lock(&self.tickets).issue(&sandbox.id, pty_id, Instant::now())?;
        Ok(Ticket {
            ticket,
            expires_in_ms: u64::try_from(TICKET_TTL.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Uses up `ticket`: true when it was issued for this session and has
    /// not expired. A ticket for another session is used up too.
    pub fn redeem(&self, ticket: &str, sandbox_id: &str, pty_id: &str) -> bool {
        lock(&self.tickets).redeem(ticket, sandbox_id, pty_id, Instant::now())
    }

    /// Serves one viewer of a session until the session ends, the viewer
    /// goes, falls behind, or sandboxd shuts down: the scrollback first,
    /// then live output; its input is typed into the session while it is
    /// the writer (the last viewer to attach).
    pub async fn view<I, O>(
        &self,
        sandbox: Arc<Sandbox>,
        pty_id: String,
        mut input: I,
        mut output: O,
    ) where
        I: Stream<Item = ViewerInput> + Unpin,
        O: Sink<ViewerEvent> + Unpin,
    {
        let _busy = sandbox.open_request();
        let Ok(conn) = self.sandboxes.agent(&sandbox).await else {
            return;
        };
        let attached = self.attach(&pty_id);
        let mut writer_rx = attached.writer.clone();
        let is_writer = |w: &Option<u64>| *w == Some(attached.id);
        let mut writing = is_writer(&writer_rx.borrow_and_update());
        if output.send(ViewerEvent::Writer(writing)).await.is_err() {
            return;
        }
        let limit = self.config.agent_timeout + READ_WAIT;
        let mut after = 0u64;
        let mut first = true;
        let wait_ms = u32::try_from(READ_WAIT.as_millis()).unwrap_or(u32::MAX);
        let read = |after: u64| {
            let (conn, pty_id) = (Arc::clone(&conn), pty_id.clone());
            Box::pin(async move {
                conn.pty_read(&pty_id, after, OUTPUT_CHUNK, wait_ms, limit)
                    .await
            })
        };
        let mut reading = read(after);
        loop {
            tokio::select! {
                r = &mut reading => {
                    let Ok(out) = r else { return };
                    let Some(events) = take_output(&out, &mut after, first) else {
                        return;
                    };
                    first = false;
                    let ended = out.ended.is_some();
                    for ev in events {
                        if output.send(ev).await.is_err() {
                            return;
                        }
                    }
                    if ended {
                        return;
                    }
                    reading = read(after);
                }
                key = input.next() => match key {
                    None => return,
                    Some(ViewerInput::Bytes(data)) if writing && !data.is_empty() => {
                        // Input the program did not take is dropped (the
                        // agent said why); a connection that failed ends
                        // the view.
                        match conn.pty_write(&pty_id, data.to_vec(), self.config.agent_timeout).await {
                            Ok(()) | Err(AgentError::Refused(_)) => {}
                            Err(_) => return,
                        }
                    }
                    Some(ViewerInput::Resize { cols, rows }) if writing => {
                        let _ = conn.pty_resize(&pty_id, cols, rows, self.config.agent_timeout).await;
                    }
                    Some(_) => {}
                },
                changed = writer_rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let now = is_writer(&writer_rx.borrow_and_update());
                    if now != writing {
                        writing = now;
                        if output.send(ViewerEvent::Writer(writing)).await.is_err() {
                            return;
                        }
                    }
                }
                () = self.shutdown.cancelled() => return,
            }
        }
    }
}

/// Checks a read from the agent and moves `after` past it: the events
/// for the viewer (a `Lagged` first when it fell behind the scrollback;
/// the first read, the replay, starts wherever the scrollback does), or
/// None when the agent answered what was not asked.
fn take_output(out: &PtyOutput, after: &mut u64, first: bool) -> Option<Vec<ViewerEvent>> {
    if out.start < *after || out.data.len() > OUTPUT_CHUNK as usize {
        return None;
    }
    let mut events = Vec::new();
    if out.start > *after && !first {
        events.push(ViewerEvent::Lagged {
            skipped: out.start - *after,
        });
    }
    *after = out.start + out.data.len() as u64;
    if !out.data.is_empty() {
        events.push(ViewerEvent::Output(Bytes::copy_from_slice(&out.data)));
    }
    if let Some(end) = out.ended {
        events.push(ViewerEvent::Exit {
            exit_code: end.exit_code,
            signal: end.signal,
        });
    }
    Some(events)
}

impl Ptys {
    /// Adds a viewer to a session and makes it the writer; the guard
    /// removes it (and hands writing to the newest viewer left).
    fn attach(&self, pty_id: &str) -> Attached<'_> {
        let id = self.next_viewer.fetch_add(1, Ordering::Relaxed);
        let mut all = lock(&self.viewers);
        let v = all.entry(pty_id.to_string()).or_insert_with(|| Viewers {
            ids: Vec::new(),
            writer: watch::channel(None).0,
        });
        v.ids.push(id);
        v.writer.send_replace(Some(id));
        Attached {
            ptys: self,
            pty_id: pty_id.to_string(),
            id,
            writer: v.writer.subscribe(),
        }
    }
}

/// A viewer's place among a session's viewers, while it is attached.
struct Attached<'a> {
    ptys: &'a Ptys,
    pty_id: String,
    id: u64,
    writer: watch::Receiver<Option<u64>>,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        let mut all = lock(&self.ptys.viewers);
        if let Some(v) = all.get_mut(&self.pty_id) {
            v.ids.retain(|i| *i != self.id);
            if v.ids.is_empty() {
                all.remove(&self.pty_id);
            } else if *v.writer.borrow() == Some(self.id) {
                v.writer.send_replace(v.ids.last().copied());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_run_through_a_login_shell_and_the_bare_session_is_one() {
        assert_eq!(
            program_of(None).expect("bare").1,
            Vec::<String>::new(),
            "the agent picks the login shell"
        );
        let (program, argv, summary) =
            program_of(Some(PtyCommand::Line("python3 -q".into()))).expect("line");
        assert_eq!(program, "/bin/bash");
        assert_eq!(argv, ["bash", "-lc", "exec python3 -q"]);
        assert_eq!(summary, "python3 -q");
        let (_, argv, _) = program_of(Some(PtyCommand::Argv(vec![
            "printf".into(),
            "%s\n".into(),
            "a b; rm -rf /".into(),
        ])))
        .expect("argv");
        // Each element reaches the program as it is: no shell parses it.
        assert_eq!(
            argv,
            [
                "bash",
                "-lc",
                "exec \"$@\"",
                "sandboxd",
                "printf",
                "%s\n",
                "a b; rm -rf /"
            ]
        );
        assert!(program_of(Some(PtyCommand::Argv(vec![]))).is_err());
        assert!(program_of(Some(PtyCommand::Line("  ".into()))).is_err());
        assert!(program_of(Some(PtyCommand::Line("a\0b".into()))).is_err());
    }

    #[test]
    fn tickets_are_single_use_bound_to_their_session_and_expire() {
        let mut t = Tickets::default();
        let now = Instant::now();
        let a = t.issue("s", "p", now).expect("issued");
        assert_eq!(a.len(), 32);
        assert!(!t.redeem(&a, "s", "other", now), "another session's");
        assert!(!t.redeem(&a, "s", "p", now), "used up by the wrong try");
        let b = t.issue("s", "p", now).expect("issued");
        assert!(t.redeem(&b, "s", "p", now + TICKET_TTL / 2));
        assert!(!t.redeem(&b, "s", "p", now), "once only");
        let c = t.issue("s", "p", now).expect("issued");
        assert!(!t.redeem(&c, "s", "p", now + TICKET_TTL), "expired");
        for _ in 0..MAX_TICKETS {
            assert!(t.issue("s", "p", now).is_ok());
        }
        assert!(
            matches!(t.issue("s", "p", now), Err(PtyError::TooManyTickets)),
            "capped"
        );
        // Expired ones make room.
        assert!(t.issue("s", "p", now + TICKET_TTL).is_ok());
    }

    #[test]
    fn output_moves_forward_and_a_gap_is_told() {
        let out = |start: u64, data: &[u8], ended: bool| PtyOutput {
            start,
            data: data.to_vec(),
            ended: ended.then_some(PtyEnded {
                exit_code: Some(3),
                signal: None,
                duration_ms: 1,
                ended_at_ms: 1,
            }),
        };
        let mut after = 0;
        // The replay starts wherever the scrollback does.
        let ev = take_output(&out(100, b"ab", false), &mut after, true).expect("replay");
        assert_eq!(ev, [ViewerEvent::Output(Bytes::from_static(b"ab"))]);
        assert_eq!(after, 102);
        let ev = take_output(&out(110, b"c", true), &mut after, false).expect("gap");
        assert_eq!(
            ev,
            [
                ViewerEvent::Lagged { skipped: 8 },
                ViewerEvent::Output(Bytes::from_static(b"c")),
                ViewerEvent::Exit {
                    exit_code: Some(3),
                    signal: None
                }
            ]
        );
        // An agent that goes back, or sends more than asked, is refused.
        assert!(take_output(&out(5, b"x", false), &mut after, false).is_none());
        let big = vec![0; OUTPUT_CHUNK as usize + 1];
        assert!(take_output(&out(after, &big, false), &mut after, false).is_none());
    }

    #[test]
    fn windows_are_bounded() {
        assert_eq!(window("cols", None, 80).ok(), Some(80));
        assert_eq!(window("cols", Some(1000), 80).ok(), Some(1000));
        assert!(window("cols", Some(0), 80).is_err());
        assert!(window("rows", Some(1001), 24).is_err());
    }
}
