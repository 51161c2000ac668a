//! The agent client: one multiplexed connection to the agent inside a
//! sandbox (`sandboxd-agent`, see `sandboxd-proto`), and one typed method
//! per operation of the protocol, by family ([`commands`], [`files`],
//! [`ptys`], [`ports`], [`file_watch`], [`snapshots`]). Requests go out with ids; a reader task hands each
//! response to whoever waits for its id, so a long poll for a command's end
//! and a file write share the connection. The protocol's envelope (`Op`,
//! `Reply`) stays in here: the domain gets the answer it asked for, or an
//! [`AgentError`] (an answer of another kind is
//! [`AgentError::Unexpected`], checked once, here).
//!
//! Everything the agent sends is untrusted: the sandbox user can kill,
//! replace or impersonate it. Frames are bounded by the codec
//! ([`MAX_AGENT_FRAME`]); a frame that does not decode ends the
//! connection; an answer to an id nobody asked is dropped; answers in
//! several parts are bounded by their caller ([`AgentConn::call_parts`]);
//! answers of the wrong kind are refused; and nothing here acts on what an
//! answer says. The caller (the domain) validates the content and confines
//! its effect to that one sandbox.
//!
//! The byte stream itself comes from below (an exec of `sandboxd-agent
//! bridge` on Docker); this module sees only `AsyncRead`/`AsyncWrite`.

mod commands;
mod file_watch;
mod files;
mod ports;
mod ptys;
mod snapshots;

pub use commands::TailPiece;
pub use file_watch::{AgentWatch, WatchPart};
pub use files::WriteOutcome;
pub use ports::Probed;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use sandboxd_proto::{
    Failure, Hello, HelloReply, MAX_AGENT_FRAME, MAX_HOST_FRAME, Op, Reply, Request, Response,
    WRITE_PIECE,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{FramedRead, FramedWrite};

/// What can go wrong talking to an agent.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// The connection is gone (the sandbox stopped, the agent died, the
    /// bridge was killed) or could not be made.
    #[error("the sandbox's agent is not reachable: {0}")]
    Closed(String),
    /// The agent sent something the protocol does not allow.
    #[error("the sandbox's agent misbehaved: {0}")]
    Protocol(String),
    /// The agent answered an operation with an answer of another kind
    /// (see [`unexpected`]).
    #[error("the sandbox's agent misbehaved: {0}")]
    Unexpected(String),
    /// The agent did not answer in time (it may be stopped or stuck); the
    /// connection was closed.
    #[error("the sandbox's agent did not answer within {0} ms")]
    Unresponsive(u64),
    /// The agent refused or failed the request, saying why.
    #[error("{}", .0.message)]
    Refused(Failure),
}

/// Result of agent calls.
pub type AgentResult<T> = Result<T, AgentError>;

/// How many parts of one answer may wait for their reader.
const PARTS_IN_FLIGHT: usize = 16;
/// How many requests may wait for the writer.
const WRITES_IN_FLIGHT: usize = 64;

type Pending = HashMap<u64, mpsc::Sender<Response>>;

/// What the writer task sends: a request, then the pieces of its content
/// (a file write's), all before anything else. Once queued it is sent
/// whole, even if its caller stops waiting: the agent never waits for
/// pieces that do not come.
#[derive(Debug)]
struct Outgoing {
    request: Request,
    content: Vec<Content>,
}

/// A piece of a write's content: bytes in hand (at most
/// [`sandboxd_proto::WRITE_PIECE`]), or a file on the host that the writer
/// task reads piece by piece as it sends it, so a large one is never held
/// whole in memory.
#[derive(Debug)]
pub enum Content {
    Bytes(Bytes),
    /// Exactly `size` bytes read from `file`; a file that gives fewer
    /// (or fails) closes the connection, as the agent waits for them.
    File {
        file: tokio::fs::File,
        size: u64,
    },
}

impl From<Bytes> for Content {
    fn from(b: Bytes) -> Self {
        Content::Bytes(b)
    }
}

/// A live connection to one agent. Cheap to share; closes when dropped by
/// all or when the stream ends.
#[derive(Debug)]
pub struct AgentConn {
    writes: mpsc::Sender<Outgoing>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    closed: watch::Receiver<Option<String>>,
    close_tx: Arc<watch::Sender<Option<String>>>,
    /// The agent's start id (from its hello): a new one means the sandbox
    /// restarted.
    boot: AtomicU64,
}

fn lock(p: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    // A panic while holding this map leaves it consistent (single inserts
    // and removes); carry on with it.
    p.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl AgentConn {
    /// Starts the reader and writer tasks on the stream and says hello.
    /// Returns the connection and what the agent said (its commands).
    pub async fn open<R, W>(
        read: R,
        write: W,
        hello: Hello,
    ) -> AgentResult<(Arc<AgentConn>, HelloReply)>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let pending: Arc<Mutex<Pending>> = Arc::default();
        let (closed_tx, closed) = watch::channel(None);
        let closed_tx = Arc::new(closed_tx);
        let (writes, mut rx) = mpsc::channel::<Outgoing>(WRITES_IN_FLIGHT);
        // Both tasks end when the connection closes, whoever closed it,
        // and drop their half of the stream: an engine session (a bridge's
        // exec, an attach to the agent's stdio) ends only when both halves
        // are gone, and only then does the engine close the agent's input.
        {
            let closed_tx = Arc::clone(&closed_tx);
            let pending = Arc::clone(&pending);
            let shut = closed_tx.subscribe();
            tokio::spawn(async move {
                let mut sink = FramedWrite::new(write, sandboxd_proto::codec(MAX_HOST_FRAME));
                let until_shut = until_closed(shut);
                tokio::pin!(until_shut);
                loop {
                    let out = tokio::select! {
                        out = rx.recv() => out,
                        () = &mut until_shut => None,
                    };
                    let Some(out) = out else { break };
                    let id = out.request.id;
                    let mut sent = send_frame(&mut sink, &out.request).await;
                    if sent.is_ok() {
                        sent = send_content(&mut sink, id, out.content).await;
                    }
                    if let Err(e) = sent {
                        close(
                            &closed_tx,
                            &pending,
                            format!("writing to the agent failed: {e}"),
                        );
                        break;
                    }
                }
                // Says "no more" to the agent even while the read half
                // lives on for a moment.
                let _ = sink.get_mut().shutdown().await;
            });
        }
        {
            let pending = Arc::clone(&pending);
            let closed_tx = Arc::clone(&closed_tx);
            let shut = closed_tx.subscribe();
            tokio::spawn(async move {
                let mut frames = FramedRead::new(read, sandboxd_proto::codec(MAX_AGENT_FRAME));
                let until_shut = until_closed(shut);
                tokio::pin!(until_shut);
                let why = loop {
                    let next = tokio::select! {
                        next = frames.next() => next,
                        () = &mut until_shut => break "the connection was closed".to_string(),
                    };
                    let frame = match next {
                        Some(Ok(f)) => f,
                        Some(Err(e)) => break format!("the agent's stream broke: {e}"),
                        None => break "the agent closed the connection".to_string(),
                    };
                    let resp: Response = match sandboxd_proto::decode(&frame) {
                        Ok(r) => r,
                        Err(e) => break format!("the agent sent a malformed frame: {e}"),
                    };
                    let waiter = {
                        let mut p = lock(&pending);
                        if resp.more {
                            p.get(&resp.id).cloned()
                        } else {
                            p.remove(&resp.id)
                        }
                    };
                    // An answer nobody waits for (a caller that gave up, or
                    // an id the agent made up) is dropped.
                    if let Some(w) = waiter {
                        let _ = w.send(resp).await;
                    }
                };
                close(&closed_tx, &pending, why);
            });
        }
        let conn = Arc::new(AgentConn {
            writes,
            pending,
            // Random start: ids of a connection never match another's.
            next_id: AtomicU64::new(start_id()?),
            closed,
            close_tx: closed_tx,
            boot: AtomicU64::new(0),
        });
        let reply = conn.call(Op::Hello(hello)).await?;
        let Reply::Hello(hello) = reply else {
            return Err(unexpected("hello", &reply));
        };
        if hello.version != sandboxd_proto::VERSION {
            return Err(AgentError::Protocol(format!(
                "it speaks protocol version {}, sandboxd {}",
                hello.version,
                sandboxd_proto::VERSION
            )));
        }
        conn.boot.store(hello.boot, Ordering::Relaxed);
        Ok((conn, hello))
    }

    /// The agent's start id; see the field.
    pub fn boot(&self) -> u64 {
        self.boot.load(Ordering::Relaxed)
    }

    /// Why the connection closed, once it has.
    pub fn closed_because(&self) -> Option<String> {
        self.closed.borrow().clone()
    }

    /// Resolves when the connection closes.
    pub async fn closed(&self) {
        until_closed(self.closed.clone()).await;
    }

    async fn send(
        &self,
        op: Op,
        content: Vec<Content>,
    ) -> AgentResult<(u64, mpsc::Receiver<Response>)> {
        if let Some(why) = self.closed_because() {
            return Err(AgentError::Closed(why));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(PARTS_IN_FLIGHT);
        lock(&self.pending).insert(id, tx);
        let request = Request { id, op };
        if self
            .writes
            .send(Outgoing { request, content })
            .await
            .is_err()
        {
            lock(&self.pending).remove(&id);
            return Err(AgentError::Closed(
                self.closed_because()
                    .unwrap_or_else(|| "the connection is closing".into()),
            ));
        }
        Ok((id, rx))
    }

    /// Closes the connection: every waiter fails, nothing more is sent.
    pub fn close(&self, why: String) {
        close(&self.close_tx, &self.pending, why);
    }

    /// As [`AgentConn::call`], but an agent that does not answer within
    /// `limit` counts as stuck: the connection is closed.
    async fn call_within(&self, op: Op, limit: std::time::Duration) -> AgentResult<Reply> {
        match tokio::time::timeout(limit, self.call(op)).await {
            Ok(r) => r,
            Err(_) => Err(self.stuck(limit)),
        }
    }

    /// As [`AgentConn::call_parts`], within `limit` (see `call_within`).
    async fn call_parts_within(
        &self,
        op: Op,
        limit: std::time::Duration,
        part: impl FnMut(Reply) -> Result<(), String>,
    ) -> AgentResult<Reply> {
        match tokio::time::timeout(limit, self.call_parts(op, part)).await {
            Ok(r) => r,
            Err(_) => Err(self.stuck(limit)),
        }
    }

    fn stuck(&self, limit: std::time::Duration) -> AgentError {
        let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        self.close(format!("the agent did not answer within {ms} ms"));
        AgentError::Unresponsive(ms)
    }

    /// Sends `op` and returns its one answer. An error answer is
    /// [`AgentError::Refused`]; an answer in parts is a protocol error.
    async fn call(&self, op: Op) -> AgentResult<Reply> {
        self.call_with_content(op, Vec::new()).await
    }

    /// As [`AgentConn::call_within`], for an [`Op::WriteFiles`] whose
    /// content follows it in `content` (pieces of at most
    /// [`sandboxd_proto::WRITE_PIECE`] bytes).
    async fn call_with_content_within(
        &self,
        op: Op,
        content: Vec<Content>,
        limit: std::time::Duration,
    ) -> AgentResult<Reply> {
        match tokio::time::timeout(limit, self.call_with_content(op, content)).await {
            Ok(r) => r,
            Err(_) => Err(self.stuck(limit)),
        }
    }

    async fn call_with_content(&self, op: Op, content: Vec<Content>) -> AgentResult<Reply> {
        let (id, mut rx) = self.send(op, content).await?;
        let _forget = Forget { conn: self, id };
        match rx.recv().await {
            Some(r) if !r.more => refused(r.reply),
            Some(_) => Err(AgentError::Protocol(
                "an answer in parts where one was due".into(),
            )),
            None => Err(AgentError::Closed(
                self.closed_because()
                    .unwrap_or_else(|| "the connection closed".into()),
            )),
        }
    }

    /// Sends `op` and hands each part of the answer to `part`, which may
    /// refuse it (a bound passed); returns the final answer.
    async fn call_parts(
        &self,
        op: Op,
        mut part: impl FnMut(Reply) -> Result<(), String>,
    ) -> AgentResult<Reply> {
        let mut answer = self.answer(op).await?;
        loop {
            match answer.next().await? {
                Step::Part(p) => part(p).map_err(AgentError::Protocol)?,
                Step::Last(last) => return Ok(last),
            }
        }
    }

    /// Sends `op`; its answer is then taken step by step.
    async fn answer(&self, op: Op) -> AgentResult<Answer<'_>> {
        let (id, rx) = self.send(op, Vec::new()).await?;
        Ok(Answer {
            rx,
            forget: Forget { conn: self, id },
        })
    }
}

/// One step of an answer in parts.
enum Step {
    /// A part; more follow.
    Part(Reply),
    /// The final answer (not an error).
    Last(Reply),
}

/// The answer to one request, taken step by step; the request is
/// forgotten when this is dropped.
struct Answer<'a> {
    rx: mpsc::Receiver<Response>,
    forget: Forget<'a>,
}

impl Answer<'_> {
    /// The next part, or the final answer; an error answer (final or as
    /// a part) is [`AgentError::Refused`].
    async fn next(&mut self) -> AgentResult<Step> {
        match self.rx.recv().await {
            Some(r) if r.more => match r.reply {
                Reply::Error(f) => Err(AgentError::Refused(f)),
                part => Ok(Step::Part(part)),
            },
            Some(r) => refused(r.reply).map(Step::Last),
            None => {
                let conn = self.forget.conn;
                Err(AgentError::Closed(
                    conn.closed_because()
                        .unwrap_or_else(|| "the connection closed".into()),
                ))
            }
        }
    }
}

/// Removes a request's entry when its caller stops waiting.
struct Forget<'a> {
    conn: &'a AgentConn,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.conn.pending).remove(&self.id);
    }
}

/// Sends a write's content after its request, each piece a
/// [`Op::WriteData`] frame; a file's pieces are read as they go.
async fn send_content<W: AsyncWrite + Unpin>(
    sink: &mut FramedWrite<W, tokio_util::codec::LengthDelimitedCodec>,
    id: u64,
    content: Vec<Content>,
) -> Result<(), String> {
    for c in content {
        match c {
            Content::Bytes(data) => {
                send_frame(
                    sink,
                    &Request {
                        id,
                        op: Op::WriteData { data },
                    },
                )
                .await?;
            }
            Content::File { mut file, size } => {
                let mut left = size;
                while left > 0 {
                    let n = usize::try_from(left).map_or(WRITE_PIECE, |l| l.min(WRITE_PIECE));
                    let mut piece = vec![0; n];
                    file.read_exact(&mut piece)
                        .await
                        .map_err(|e| format!("a file to send could not be read: {e}"))?;
                    left -= n as u64;
                    let op = Op::WriteData {
                        data: Bytes::from(piece),
                    };
                    send_frame(sink, &Request { id, op }).await?;
                }
            }
        }
    }
    Ok(())
}

/// Encodes and sends one frame.
async fn send_frame<W: AsyncWrite + Unpin>(
    sink: &mut FramedWrite<W, tokio_util::codec::LengthDelimitedCodec>,
    request: &Request,
) -> Result<(), String> {
    let body = sandboxd_proto::encode(request).map_err(|e| e.to_string())?;
    sink.send(body).await.map_err(|e| e.to_string())
}

fn refused(reply: Reply) -> AgentResult<Reply> {
    match reply {
        Reply::Error(f) => Err(AgentError::Refused(f)),
        other => Ok(other),
    }
}

/// Resolves when the connection `rx` watches is closed.
async fn until_closed(mut rx: watch::Receiver<Option<String>>) {
    let _ = rx.wait_for(Option::is_some).await;
}

fn close(closed: &watch::Sender<Option<String>>, pending: &Mutex<Pending>, why: String) {
    closed.send_if_modified(|c| {
        if c.is_none() {
            *c = Some(why);
            true
        } else {
            false
        }
    });
    // Dropping the senders wakes every waiter with "closed".
    lock(pending).clear();
}

fn start_id() -> AgentResult<u64> {
    // Leave room to count up without wrapping.
    crate::id::random_u64()
        .map(|r| r >> 1)
        .map_err(|e| AgentError::Closed(e.to_string()))
}

/// The error for an answer of the wrong kind to `op` (say "a wait").
fn unexpected(op: &str, reply: &Reply) -> AgentError {
    AgentError::Unexpected(format!("it answered {op} with {}", reply_name(reply)))
}

/// The part handler of an operation answered in one piece: any part is
/// refused.
fn no_parts(part: Reply) -> Result<(), String> {
    Err(format!("{} where one answer was due", reply_name(&part)))
}

/// A reply's kind, for messages.
fn reply_name(r: &Reply) -> &'static str {
    match r {
        Reply::Hello(_) => "Hello",
        Reply::Spawned { .. } => "Spawned",
        Reply::Ok => "Ok",
        Reply::Log(_) => "Log",
        Reply::Ended(_) => "Ended",
        Reply::Commands(_) => "Commands",
        Reply::TailPart(_) => "TailPart",
        Reply::Shaped(_) => "Shaped",
        Reply::Data(_) => "Data",
        Reply::Entries(_) => "Entries",
        Reply::Probed { .. } => "Probed",
        Reply::PtyOutput(_) => "PtyOutput",
        Reply::Ptys(_) => "Ptys",
        Reply::PtyEnded(_) => "PtyEnded",
        Reply::Stats(_) => "Stats",
        Reply::PreconditionFailed(_) => "PreconditionFailed",
        Reply::Matches(_) => "Matches",
        Reply::Searched(_) => "Searched",
        Reply::ChangesPart(_) => "ChangesPart",
        Reply::Changes(_) => "Changes",
        Reply::Snapshot(_) => "Snapshot",
        Reply::MadeDir { .. } => "MadeDir",
        Reply::Error(_) => "Error",
        Reply::Watching => "Watching",
        Reply::WatchEvents(_) => "WatchEvents",
        Reply::WatchEnded(_) => "WatchEnded",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    fn hello() -> Hello {
        Hello {
            version: sandboxd_proto::VERSION,
            workspace: vec!["/workspace".into()],
            kill_grace_ms: 1,
            output_buffer_bytes: 1,
            output_memory_bytes: 1,
            max_finished: 1,
            pids_limit: 0,
            changes_watch_budget: 0,
        }
    }

    /// A fake agent on the other end of an in-memory pipe, answering each
    /// request with what `answer` returns (raw frames, so it can misbehave).
    fn fake_agent(
        answer: impl Fn(Request) -> Vec<Vec<u8>> + Send + 'static,
    ) -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
        // sandboxd writes `to_agent`, the fake reads its other end; the
        // fake writes `from_agent`, sandboxd reads its other end.
        let (to_agent, agent_in) = duplex(1 << 20);
        let (from_agent, agent_out) = duplex(4 << 20);
        tokio::spawn(async move {
            let mut reqs = FramedRead::new(agent_in, sandboxd_proto::codec(MAX_HOST_FRAME));
            let mut out = FramedWrite::new(agent_out, sandboxd_proto::codec(1 << 30));
            while let Some(Ok(f)) = reqs.next().await {
                let req: Request = sandboxd_proto::decode(&f).expect("request");
                for frame in answer(req) {
                    if out.send(bytes::Bytes::from(frame)).await.is_err() {
                        return;
                    }
                }
            }
        });
        (from_agent, to_agent)
    }

    fn frame(id: u64, more: bool, reply: Reply) -> Vec<u8> {
        sandboxd_proto::encode(&Response { id, more, reply })
            .expect("encode")
            .to_vec()
    }

    fn hello_reply(id: u64) -> Vec<u8> {
        frame(
            id,
            false,
            Reply::Hello(HelloReply {
                version: sandboxd_proto::VERSION,
                boot: 42,
                commands: vec![],
            }),
        )
    }

    #[tokio::test]
    async fn answers_reach_their_callers_in_any_order() {
        let (r, w) = fake_agent(|req| match req.op {
            Op::Hello(_) => vec![hello_reply(req.id)],
            Op::List => vec![
                frame(req.id + 1000, false, Reply::Ok),
                frame(req.id, true, Reply::Data(vec![1])),
                frame(req.id, false, Reply::Ok),
            ],
            _ => vec![frame(req.id, false, Reply::Ok)],
        });
        let (conn, hello) = AgentConn::open(r, w, super::tests::hello())
            .await
            .expect("open");
        assert_eq!((conn.boot(), hello.boot), (42, 42));
        let mut parts = Vec::new();
        let last = conn
            .call_parts(Op::List, |p| {
                parts.push(p);
                Ok(())
            })
            .await
            .expect("list");
        assert_eq!(last, Reply::Ok);
        assert_eq!(
            parts,
            [Reply::Data(vec![1])],
            "an answer to nobody is dropped"
        );
    }

    #[tokio::test]
    async fn garbage_closes_the_connection_and_fails_the_waiters() {
        let (r, w) = fake_agent(|req| match req.op {
            Op::Hello(_) => vec![hello_reply(req.id)],
            _ => vec![vec![0xff; 40]],
        });
        let (conn, _) = AgentConn::open(r, w, hello()).await.expect("open");
        let e = conn.call(Op::List).await.expect_err("garbage");
        assert!(
            matches!(e, AgentError::Closed(ref m) if m.contains("malformed")),
            "{e}"
        );
        assert!(conn.closed_because().is_some());
        assert!(matches!(
            conn.call(Op::List).await,
            Err(AgentError::Closed(_))
        ));
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_before_it_is_buffered() {
        let (r, w) = fake_agent(|req| match req.op {
            Op::Hello(_) => vec![hello_reply(req.id)],
            _ => vec![frame(
                req.id,
                false,
                Reply::Data(vec![0; MAX_AGENT_FRAME + 1]),
            )],
        });
        let (conn, _) = AgentConn::open(r, w, hello()).await.expect("open");
        let e = conn.call(Op::List).await.expect_err("too big");
        assert!(matches!(e, AgentError::Closed(_)), "{e}");
    }

    #[tokio::test]
    async fn parts_can_be_refused_by_their_caller() {
        let (r, w) = fake_agent(|req| match req.op {
            Op::Hello(_) => vec![hello_reply(req.id)],
            _ => (0..5)
                .map(|_| frame(req.id, true, Reply::Data(vec![0; 10])))
                .chain([frame(req.id, false, Reply::Ok)])
                .collect(),
        });
        let (conn, _) = AgentConn::open(r, w, hello()).await.expect("open");
        let mut total = 0;
        let e = conn
            .call_parts(Op::List, |p| {
                if let Reply::Data(d) = p {
                    total += d.len();
                }
                if total > 25 {
                    Err("more than 25 bytes".into())
                } else {
                    Ok(())
                }
            })
            .await
            .expect_err("bounded");
        assert!(
            matches!(e, AgentError::Protocol(ref m) if m.contains("25")),
            "{e}"
        );
        assert!(
            matches!(conn.call(Op::List).await, Err(AgentError::Protocol(_))),
            "the connection still serves others (this one answers in parts)"
        );
    }

    #[tokio::test]
    async fn a_silent_agent_is_cut_off() {
        let (r, w) = fake_agent(|req| match req.op {
            Op::Hello(_) => vec![hello_reply(req.id)],
            _ => vec![],
        });
        let (conn, _) = AgentConn::open(r, w, hello()).await.expect("open");
        let e = conn
            .call_within(Op::List, std::time::Duration::from_millis(50))
            .await
            .expect_err("no answer");
        assert!(matches!(e, AgentError::Unresponsive(50)), "{e}");
        assert!(conn.closed_because().is_some(), "closed");
    }

    #[tokio::test]
    async fn a_typed_call_refuses_an_answer_of_another_kind() {
        let (r, w) = fake_agent(|req| match req.op {
            Op::Hello(_) => vec![hello_reply(req.id)],
            _ => vec![frame(req.id, false, Reply::Ok)],
        });
        let (conn, _) = AgentConn::open(r, w, hello()).await.expect("open");
        let e = conn.wait("c").await.expect_err("Ok is no end");
        assert!(
            matches!(e, AgentError::Unexpected(ref m) if m == "it answered a wait with Ok"),
            "{e}"
        );
        let limit = std::time::Duration::from_secs(5);
        conn.kill("c", limit).await.expect("Ok is what a kill gets");
    }

    #[tokio::test]
    async fn a_wrong_hello_is_refused() {
        let (r, w) = fake_agent(|req| vec![frame(req.id, false, Reply::Ok)]);
        assert!(matches!(
            AgentConn::open(r, w, hello()).await,
            Err(AgentError::Unexpected(_))
        ));
    }
}
