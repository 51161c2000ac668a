//! envd's `process.Process` service over sandboxd's commands and terminal
//! sessions. `Start` without `pty` starts a command (`Commands::start`,
//! with its stdin kept open when the client asks) and streams its log
//! (`Commands::follow_lines`) as E2B's events: `start` with the pid, `data`
//! with stdout and stderr, `end` with the exit; with `pty` it opens a
//! terminal session (`Ptys::open`) and streams what a viewer of it sees
//! (`Ptys::view`). The stream ending kills nothing: a background command
//! outlives its client's disconnect, as in envd. `Connect` follows a
//! running command (from its first output) or session again; `List`,
//! `SendSignal`, `SendInput` (a command's stdin or a session's keys),
//! `StreamInput` (the same input as one client stream, in order),
//! `CloseStdin` and `Update` (a session's size) address them by pid or by
//! tag.
//!
//! A command's pid is its process's pid in the sandbox, as the agent
//! reported it. A terminal session's is 31 bits of SHA-256 of its id (the
//! domain keeps no pid for it): the same after a sandboxd restart, with no
//! map kept. A tag given at `Start` is kept by the domain with the command
//! or session (`Commands::start_tagged`, `Ptys::open_tagged`), so it lasts
//! as long as they do. As in envd, tags need not be unique and only a
//! running process answers to its tag; of several, the one started last
//! is meant.

use std::pin::Pin;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path as AxumPath, State};
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use std::future::ready;

use futures_util::{Stream, StreamExt, TryStreamExt, stream};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::connect::{
    self, ClientStream, Code, ConnectError, Streaming, Timing, Unary, stream_error, stream_reply,
    to_json,
};
use super::wire::{
    B64, DataEvent, Empty, EndEvent, EventMessage, ListResponse, ProcessConfig, ProcessEvent,
    ProcessInfo, ProcessInput, ProcessSelector, SelectRequest, SendInputRequest, SendSignalRequest,
    Signal, StartRequest, StreamInputRequest, UpdateRequest,
};
use super::{E2b, SandboxId, failed};
use crate::command::log::LogLine;
use crate::command::spec::CommandRequest;
use crate::pty::{MAX_WINDOW, PtyCommand, PtyRequest, ViewerEvent, ViewerInput};
use sandboxd_proto::Stream as LogStream;

/// Events waiting for the client of a process's stream.
const EVENT_BUFFER: usize = 16;

/// The pid E2B clients know a terminal session by (see the module docs).
fn session_pid(id: &str) -> u32 {
    let h = Sha256::digest(id.as_bytes());
    (u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff).max(1)
}

/// A process of a sandbox, as sandboxd knows it, with its E2B pid.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Process {
    Command { id: String, pid: u32 },
    Session { id: String, pid: u32 },
}

impl Process {
    fn pid(&self) -> u32 {
        match self {
            Process::Command { pid, .. } | Process::Session { pid, .. } => *pid,
        }
    }
}

impl E2b {
    /// The command or session a selector names.
    async fn find(&self, sandbox_id: &str, sel: &ProcessSelector) -> Result<Process, ConnectError> {
        match (sel.pid, &sel.tag) {
            (Some(pid), None) => self.find_pid(sandbox_id, pid).await,
            (None, Some(tag)) => self.find_tagged(sandbox_id, tag).await,
            (Some(_), Some(_)) => Err(ConnectError::new(
                Code::InvalidArgument,
                "process: a pid or a tag, not both",
            )),
            (None, None) => Err(ConnectError::new(
                Code::InvalidArgument,
                "process: a pid or a tag is required",
            )),
        }
    }

    /// The running command or session tagged `tag`: of a command and a
    /// session that both are, the one started last.
    async fn find_tagged(&self, sandbox_id: &str, tag: &str) -> Result<Process, ConnectError> {
        let command = self
            .app
            .commands
            .tagged(sandbox_id, tag)
            .await
            .map_err(failed(sandbox_id))?
            .map(|c| {
                let pid = c.pid.unwrap_or_else(|| session_pid(&c.id));
                let id = c.id.clone();
                (c.started_at, Process::Command { id, pid })
            });
        let session = self
            .app
            .ptys
            .tagged(sandbox_id, tag)
            .await
            .map_err(failed(sandbox_id))?
            .map(|p| {
                let pid = session_pid(&p.pty_id);
                (p.created_at, Process::Session { id: p.pty_id, pid })
            });
        command
            .into_iter()
            .chain(session)
            .max_by_key(|(started, _)| *started)
            .map(|(_, process)| process)
            .ok_or_else(|| {
                ConnectError::new(Code::NotFound, format!("process with tag {tag} not found"))
            })
    }

    /// The command or session with E2B pid `pid`.
    async fn find_pid(&self, sandbox_id: &str, pid: u32) -> Result<Process, ConnectError> {
        let commands = self
            .app
            .commands
            .list(sandbox_id)
            .await
            .map_err(failed(sandbox_id))?;
        // A running command first: a finished one's pid may have been
        // used again since.
        let command = commands
            .iter()
            .filter(|c| c.command.pid == Some(pid))
            .min_by_key(|c| c.command.finished().is_some());
        if let Some(c) = command {
            return Ok(Process::Command {
                id: c.command.id.clone(),
                pid,
            });
        }
        let sessions = self
            .app
            .ptys
            .list(sandbox_id)
            .await
            .map_err(failed(sandbox_id))?;
        sessions
            .into_iter()
            .find(|p| session_pid(&p.pty_id) == pid)
            .map(|p| Process::Session { id: p.pty_id, pid })
            .ok_or_else(|| {
                ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
            })
    }

    /// Types `input` into a session, as a viewer of its own: the newest
    /// viewer is the one whose input counts, and the viewer the session's
    /// `Start` or `Connect` stream holds writes again once this one goes.
    async fn type_into_session(
        &self,
        sandbox_id: &str,
        pty_id: String,
        input: ViewerInput,
    ) -> Result<(), ConnectError> {
        let sandbox = self
            .app
            .ptys
            .check(sandbox_id, &pty_id)
            .await
            .map_err(failed(sandbox_id))?;
        let input = futures_util::stream::iter([input]);
        self.app
            .ptys
            .view(sandbox, pty_id, input, futures_util::sink::drain())
            .await;
        Ok(())
    }
}

impl E2b {
    /// A command's stdin (started with `stdin`) or a session's keys.
    async fn deliver_input(
        &self,
        sandbox_id: &str,
        process: &Process,
        input: ProcessInput,
    ) -> Result<(), ConnectError> {
        match (process, input.pty, input.stdin) {
            (Process::Session { id, .. }, Some(B64(keys)), _) => {
                let keys = ViewerInput::Bytes(Bytes::from(keys));
                self.type_into_session(sandbox_id, id.clone(), keys).await
            }
            (Process::Command { id, .. }, _, Some(B64(data))) => self
                .app
                .commands
                .send_stdin(sandbox_id, id, Bytes::from(data))
                .await
                .map_err(failed(sandbox_id)),
            (Process::Session { .. }, None, _) => Err(ConnectError::new(
                Code::InvalidArgument,
                "input: a terminal session takes pty input",
            )),
            (Process::Command { .. }, _, None) => Err(ConnectError::new(
                Code::InvalidArgument,
                "input: a command takes stdin input",
            )),
        }
    }
}

/// The keepalive event's JSON.
fn keepalive() -> Bytes {
    to_json(&EventMessage {
        event: ProcessEvent::Keepalive {},
    })
    .unwrap_or_default()
}

fn event(event: ProcessEvent) -> Result<Bytes, ConnectError> {
    to_json(&EventMessage { event })
}

/// `POST /process.Process/Start`.
pub(super) async fn start(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Streaming<StartRequest>,
) -> Response {
    let (req, timing) = (call.message, call.timing);
    let started = match req.pty {
        Some(pty) => start_session(&e2b, &sid, req.process, pty, req.tag).await,
        None => {
            let stdin = req.stdin.unwrap_or(false);
            start_command(&e2b, &sid, req.process, stdin, req.tag).await
        }
    };
    match started {
        Ok(process) => follow(e2b, sid, process, timing),
        Err(e) => stream_error(&e),
    }
}

async fn start_command(
    e2b: &E2b,
    sid: &str,
    p: ProcessConfig,
    stdin: bool,
    tag: Option<String>,
) -> Result<Process, ConnectError> {
    let config = &e2b.app.config;
    let req = CommandRequest {
        cmd: Some(p.cmd),
        args: Some(p.args),
        command: None,
        shell: None,
        // The argv runs as it is (bash -l -c SCRIPT, as the SDKs send it).
        login: Some(false),
        cwd: p.cwd,
        env: (!p.envs.is_empty()).then_some(p.envs),
        stdin: None,
        stdin_open: Some(stdin),
        // An E2B process ends when it ends or is killed, not on the
        // stream's deadline: it gets the longest time sandboxd allows.
        timeout_ms: Some(i64::try_from(config.max_timeout.as_millis()).unwrap_or(i64::MAX)),
        detached: None,
        max_output_bytes: None,
        output: None,
        changes: None,
        checkpoint: None,
    };
    let cmd = e2b
        .app
        .commands
        .start_tagged(sid, req, tag)
        .await
        .map_err(failed(sid))?;
    // A command that could not start has no pid; it ends at once (126 or
    // 127), and its stream says so.
    let pid = cmd.pid.unwrap_or_else(|| session_pid(&cmd.id));
    Ok(Process::Command {
        id: cmd.id.clone(),
        pid,
    })
}

async fn start_session(
    e2b: &E2b,
    sid: &str,
    p: ProcessConfig,
    pty: super::wire::Pty,
    tag: Option<String>,
) -> Result<Process, ConnectError> {
    let size = pty.size.unwrap_or_default();
    let dim = |v: u32| (v != 0).then_some(i64::from(v));
    let mut argv = vec![p.cmd];
    argv.extend(p.args);
    let req = PtyRequest {
        command: Some(PtyCommand::Argv(argv)),
        cwd: p.cwd,
        env: (!p.envs.is_empty()).then_some(p.envs),
        cols: dim(size.cols),
        rows: dim(size.rows),
    };
    let id = e2b
        .app
        .ptys
        .open_tagged(sid, req, tag)
        .await
        .map_err(failed(sid))?;
    let pid = session_pid(&id);
    Ok(Process::Session { id, pid })
}

/// The event stream of a process: `start`, then its output and its end.
fn follow(e2b: Arc<E2b>, sid: String, process: Process, timing: Timing) -> Response {
    let pid = process.pid();
    let first = stream::once(async move { event(ProcessEvent::Start { pid }) });
    let rest: Pin<Box<dyn Stream<Item = Result<Bytes, ConnectError>> + Send>> = match process {
        Process::Command { id, .. } => Box::pin(command_events(e2b, sid, id)),
        Process::Session { id, .. } => Box::pin(session_events(e2b, sid, id)),
    };
    stream_reply(timing, keepalive(), first.chain(rest))
}

/// A command's log from its first record, as E2B's events, to its end.
fn command_events(
    e2b: Arc<E2b>,
    sid: String,
    command_id: String,
) -> impl Stream<Item = Result<Bytes, ConnectError>> + Send {
    let opened = async move {
        let shutdown = e2b.app.shutdown.clone();
        e2b.app
            .commands
            .follow_lines(&sid, &command_id, 0, false, shutdown)
            .await
            .map_err(failed(&sid))
    };
    stream::once(opened).flat_map(|opened| match opened {
        Ok(lines) => log_events(lines).left_stream(),
        Err(e) => stream::iter([Err(e)]).right_stream(),
    })
}

/// A command's records as E2B's events: its output, then one `end`; an
/// error when the log stops short of the exit (shutdown).
fn log_events(
    lines: impl Stream<Item = Vec<LogLine>> + Send,
) -> impl Stream<Item = Result<Bytes, ConnectError>> + Send {
    lines
        .flat_map(stream::iter)
        .map(Some)
        .chain(stream::iter([None]))
        .scan(LogState::default(), |state, line| ready(state.step(line)))
        .filter_map(ready)
}

/// What the log's records have said so far.
#[derive(Debug, Default)]
struct LogState {
    /// The last `error` record (sandboxd ended the command): the end's
    /// `error`.
    error: Option<String>,
    ended: bool,
}

impl LogState {
    /// The event of one record (`None`: the log ended), if it makes one;
    /// `None` once the end is out.
    fn step(&mut self, line: Option<LogLine>) -> Option<Option<Result<Bytes, ConnectError>>> {
        if self.ended {
            return None;
        }
        let data = |d| Some(event(ProcessEvent::Data(d)));
        Some(match line {
            None => {
                self.ended = true;
                Some(Err(ConnectError::new(
                    Code::Unavailable,
                    "the command's log ended before its exit (sandboxd is shutting down)",
                )))
            }
            Some(LogLine::Output { stream, text, .. }) => match stream {
                LogStream::Stdout => data(DataEvent::Stdout(B64(text.into_bytes()))),
                LogStream::Stderr => data(DataEvent::Stderr(B64(text.into_bytes()))),
            },
            Some(LogLine::Error { message, .. }) => {
                self.error = Some(message);
                None
            }
            Some(LogLine::Exit(e)) => {
                self.ended = true;
                let killed = e.exit.killed || e.exit.timed_out;
                Some(event(ProcessEvent::End(end_event(
                    (!killed).then_some(e.exit.exit_code),
                    killed.then_some(9),
                    self.error.take(),
                ))))
            }
            Some(LogLine::Dropped { .. } | LogLine::Heartbeat { .. }) => None,
        })
    }
}

/// envd's end event: an exit code, or the signal that ended it (code -1,
/// not `exited`).
fn end_event(exit_code: Option<i64>, signal: Option<i64>, error: Option<String>) -> EndEvent {
    match exit_code {
        Some(code) => EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error,
        },
        None => EndEvent {
            exit_code: -1,
            exited: false,
            status: match signal {
                Some(9) => "signal: killed".to_string(),
                Some(s) => format!("signal: {s}"),
                None => "ended".to_string(),
            },
            error,
        },
    }
}

/// What a viewer of a session sees, as E2B's events, to its end.
fn session_events(
    e2b: Arc<E2b>,
    sid: String,
    pty_id: String,
) -> impl Stream<Item = Result<Bytes, ConnectError>> + Send {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let work = async move {
        let sandbox = match e2b.app.ptys.check(&sid, &pty_id).await {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(failed(&sid)(e))).await;
                return;
            }
        };
        let sink = futures_util::sink::unfold(tx, |tx, ev: ViewerEvent| async move {
            let item = match ev {
                ViewerEvent::Output(data) => {
                    event(ProcessEvent::Data(DataEvent::Pty(B64(data.to_vec()))))
                }
                ViewerEvent::Exit { exit_code, signal } => {
                    let end = end_event(exit_code.map(i64::from), signal.map(i64::from), None);
                    event(ProcessEvent::End(end))
                }
                ViewerEvent::Writer(_) | ViewerEvent::Lagged { .. } => return Ok(tx),
            };
            tx.send(item).await.map(|()| tx)
        });
        // The session's keys come through SendInput, each as a viewer of
        // its own: this one never types.
        let input = futures_util::stream::pending::<ViewerInput>();
        e2b.app
            .ptys
            .view(sandbox, pty_id, input, Box::pin(sink))
            .await;
    };
    driven(work, rx)
}

/// The items `work` sends while it runs, as a stream: the work is polled
/// as the stream is read (nothing is spawned, and a client that goes
/// drops it), and the stream ends once the work returned and what it sent
/// is out.
fn driven<W>(
    work: W,
    rx: mpsc::Receiver<Result<Bytes, ConnectError>>,
) -> impl Stream<Item = Result<Bytes, ConnectError>> + Send
where
    W: Future<Output = ()> + Send + 'static,
{
    let work = stream::once(work).filter_map(|()| ready(None));
    let sent = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    stream::select(work, sent)
}

/// `POST /process.Process/Connect`: the events of a running process again.
pub(super) async fn connect(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Streaming<SelectRequest>,
) -> Response {
    match e2b.find(&sid, &call.message.process).await {
        Ok(process) => follow(e2b, sid, process, call.timing),
        Err(e) => stream_error(&e),
    }
}

/// `POST /process.Process/List`: the running commands and sessions.
pub(super) async fn list(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<serde_json::Value>,
) -> Response {
    connect::unary(call.deadline, async move {
        let info = |pid: u32, tag: Option<String>, summary: String| ProcessInfo {
            pid,
            tag,
            // What sandboxd keeps of a process is its summary line.
            config: ProcessConfig {
                cmd: summary,
                ..ProcessConfig::default()
            },
        };
        let mut processes: Vec<ProcessInfo> = e2b
            .app
            .commands
            .list(&sid)
            .await
            .map_err(failed(&sid))?
            .into_iter()
            .filter(|c| c.command.finished().is_none())
            .filter_map(|c| {
                let (tag, summary) = (c.command.tag.clone(), c.command.summary.clone());
                Some(info(c.command.pid?, tag, summary))
            })
            .collect();
        let sessions = e2b.app.ptys.list(&sid).await.map_err(failed(&sid))?;
        processes.extend(
            sessions
                .into_iter()
                .filter(|p| p.ended.is_none())
                .map(|p| info(session_pid(&p.pty_id), p.tag, p.command)),
        );
        Ok(ListResponse { processes })
    })
    .await
}

/// `POST /process.Process/SendSignal`: SIGTERM and SIGKILL both end the
/// process's whole tree (SIGTERM, the grace period, SIGKILL).
pub(super) async fn send_signal(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<SendSignalRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let req = call.message;
        if req.signal == Signal::Unspecified {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "signal: SIGNAL_SIGTERM or SIGNAL_SIGKILL",
            ));
        }
        match e2b.find(&sid, &req.process).await? {
            Process::Command { id, .. } => e2b
                .app
                .commands
                .kill(&sid, &id)
                .await
                .map_err(failed(&sid))?,
            Process::Session { id, .. } => {
                e2b.app.ptys.kill(&sid, &id).await.map_err(failed(&sid))?
            }
        }
        Ok(Empty {})
    })
    .await
}

/// `POST /process.Process/SendInput`: a command's stdin (started with
/// `stdin`) or a session's keys.
pub(super) async fn send_input(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<SendInputRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let req = call.message;
        let process = e2b.find(&sid, &req.process).await?;
        e2b.deliver_input(&sid, &process, req.input).await?;
        Ok(Empty {})
    })
    .await
}

/// `POST /process.Process/StreamInput` (client streaming): `start` naming
/// the process, then its input in order, as `SendInput` takes it, with
/// keepalives between; answered once the client ends its stream. Input
/// the stream held before a failure was delivered.
pub(super) async fn stream_input(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: ClientStream<StreamInputRequest>,
) -> Response {
    let ClientStream { messages, deadline } = call;
    connect::client_stream_reply(deadline, async move {
        let (first, rest) = messages.into_future().await;
        let start = first.transpose()?.and_then(|m| m.start).ok_or_else(|| {
            ConnectError::new(
                Code::InvalidArgument,
                "the first message of StreamInput is start{process}",
            )
        })?;
        let process = e2b.find(&sid, &start.process).await?;
        let (e2b, sid, process) = (&e2b, &sid, &process);
        rest.try_for_each(|m| async move {
            match (m.start, m.data) {
                (Some(_), _) => Err(ConnectError::new(
                    Code::InvalidArgument,
                    "start comes once, first",
                )),
                (None, Some(data)) => e2b.deliver_input(sid, process, data.input).await,
                (None, None) => Ok(()),
            }
        })
        .await?;
        Ok(Empty {})
    })
    .await
}

/// `POST /process.Process/CloseStdin`: the command reads end of file.
pub(super) async fn close_stdin(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<SelectRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let Process::Command { id, .. } = e2b.find(&sid, &call.message.process).await? else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "process: a terminal session has no stdin to close",
            ));
        };
        e2b.app
            .commands
            .close_stdin(&sid, &id)
            .await
            .map_err(failed(&sid))?;
        Ok(Empty {})
    })
    .await
}

/// `POST /process.Process/Update`: a session's new size.
pub(super) async fn update(
    State(e2b): State<Arc<E2b>>,
    Extension(SandboxId(sid)): Extension<SandboxId>,
    call: Unary<UpdateRequest>,
) -> Response {
    connect::unary(call.deadline, async move {
        let req = call.message;
        let Process::Session { id, .. } = e2b.find(&sid, &req.process).await? else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "process: only a terminal session has a size",
            ));
        };
        let size = req.pty.and_then(|p| p.size).unwrap_or_default();
        let dim = |v: u32| {
            u16::try_from(v)
                .ok()
                .filter(|v| (1..=MAX_WINDOW).contains(v))
        };
        let (Some(cols), Some(rows)) = (dim(size.cols), dim(size.rows)) else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("pty.size: cols and rows are 1 to {MAX_WINDOW}"),
            ));
        };
        e2b.type_into_session(&sid, id, ViewerInput::Resize { cols, rows })
            .await?;
        Ok(Empty {})
    })
    .await
}

/// Every other method of the service: `unimplemented`, naming it.
pub(super) async fn other(AxumPath(method): AxumPath<String>, headers: HeaderMap) -> Response {
    let what = format!("process.Process/{method}");
    connect::refuse(&headers, &ConnectError::unimplemented(&what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(events: Vec<Result<Bytes, ConnectError>>) -> Vec<serde_json::Value> {
        events
            .into_iter()
            .map(|e| serde_json::from_slice(&e.expect("an event")).expect("json"))
            .collect()
    }

    fn exit(exit_code: i64, killed: bool, seq: u64) -> LogLine {
        LogLine::Exit(Box::new(crate::command::log::ExitRecord {
            exit: crate::command::log::ExitInfo {
                exit_code,
                timed_out: false,
                killed,
            },
            oom_killed: Some(false),
            usage: None,
            shaped: None,
            changes: None,
            seq,
        }))
    }

    fn events_of(lines: Vec<Vec<LogLine>>) -> Vec<Result<Bytes, ConnectError>> {
        let events = log_events(stream::iter(lines)).collect();
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(events)
    }

    #[test]
    fn a_pid_is_stable_positive_and_31_bits() {
        let a = session_pid("018f2a3b4c5d6e7f8a9b0c1d");
        assert_eq!(a, session_pid("018f2a3b4c5d6e7f8a9b0c1d"));
        assert_ne!(a, session_pid("018f2a3b4c5d6e7f8a9b0c1e"));
        assert!((1..=0x7fff_ffff).contains(&a));
    }

    #[test]
    fn log_records_become_data_and_one_end() {
        let out = |stream, text: &str, seq| LogLine::Output {
            stream,
            text: text.into(),
            seq,
        };
        let got = decoded(events_of(vec![
            vec![
                out(LogStream::Stdout, "hi\n", 1),
                LogLine::Heartbeat { seq: 1 },
            ],
            vec![out(LogStream::Stderr, "oops", 2), exit(3, false, 3)],
            vec![out(LogStream::Stdout, "after", 4)],
        ]));
        assert_eq!(
            got,
            [
                serde_json::json!({"event": {"data": {"stdout": "aGkK"}}}),
                serde_json::json!({"event": {"data": {"stderr": "b29wcw=="}}}),
                serde_json::json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}}}),
            ]
        );
    }

    #[test]
    fn a_killed_command_ends_by_signal_with_sandboxds_reason() {
        let got = decoded(events_of(vec![vec![
            LogLine::Error {
                message: "the sandbox restarted".into(),
                seq: 1,
            },
            exit(137, true, 2),
        ]]));
        assert_eq!(
            got,
            [serde_json::json!({"event": {"end": {
                "exitCode": -1, "exited": false, "status": "signal: killed",
                "error": "the sandbox restarted"
            }}})]
        );
    }

    #[test]
    fn a_log_that_stops_short_of_the_exit_ends_in_an_error() {
        let got = events_of(vec![vec![LogLine::Heartbeat { seq: 0 }]]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().map_err(|e| e.code), Err(Code::Unavailable));
    }
}
