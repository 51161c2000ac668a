//! `sandboxd shell`: the command-line client of interactive terminals. It
//! owns everything on the user's side of a PTY session: finding the sandbox
//! (by `sandboxId`, else by `sessionKey`), creating the session
//! (`POST /v1/sandboxes/{id}/ptys` with the local terminal's size and an
//! optional argv), attaching to it over a WebSocket, the local terminal's
//! raw mode and its restoration, and the exit code. The server side (what a
//! session runs, who may write, when a viewer is dropped) is not here.
//!
//! It speaks HTTP/1.1 to sandboxd with hyper's client connection (one
//! request per connection, no pool: three small requests do not need one),
//! and the WebSocket with tokio-tungstenite. Only `http://` URLs are
//! supported; the token goes in `x-sandboxd-admin-token` on every request,
//! the WebSocket upgrade included, and never in a URL. Of the server's
//! control messages, `exit` ends the command, `lagged` (this terminal fell
//! behind and output skipped ahead) is told on stderr, and the rest
//! (`writer`, anything newer) is ignored.
//!
//! Exit codes:
//! - the session's `exitCode` (a code outside 0–255, which no Unix process
//!   can have, becomes 255), or 128+N when the session's process was ended
//!   by signal N;
//! - 2 when no session was attached: bad arguments or URL, sandboxd not
//!   reachable, the token missing or refused, no sandbox with that id or
//!   session key, an error answer to the create or to the upgrade (the
//!   server's `error` and `code` are printed);
//! - 255, as ssh does, when the connection ends or fails without the
//!   session's `exit` message: the session's own end is then unknown;
//! - 128+N when `sandboxd shell` itself gets SIGHUP, SIGINT or SIGTERM.
//!
//! The local terminal is restored on every one of these paths: the raw
//! mode is held by a guard that is dropped before anything is printed and
//! before `main` returns, and nothing here calls `std::process::exit`.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::client::conn::http1;
use hyper::{Request, header};
use hyper_util::rt::TokioIo;
use rustix::termios::{self, OptionalActions, Termios};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::task::AbortOnDropHandle;

/// The header the token travels in (one of the three sandboxd accepts).
const TOKEN_HEADER: &str = "x-sandboxd-admin-token";
/// Nothing was attached: arguments, server, sandbox or session refused.
const SETUP_FAILED: u8 = 2;
/// Attached, but the session's end is unknown.
const CONNECTION_LOST: u8 = 255;
/// Connecting to sandboxd: a loopback or LAN peer answers in milliseconds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// One request or the upgrade: a `GET` of a stopped sandbox starts its
/// container, and a create may wait for that too.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The answers read here are small JSON documents; the sandbox list is the
/// largest. A bound keeps a misbehaving peer from filling memory.
const MAX_ANSWER_BYTES: usize = 16 << 20;
/// The size sent when stdin is not a terminal (or reports 0x0).
const DEFAULT_SIZE: (u16, u16) = (80, 24);
/// The largest `cols` and `rows` sandboxd accepts for a session.
const MAX_SIZE: u16 = 1000;

/// Open an interactive terminal in a sandbox through a running sandboxd.
#[derive(clap::Args)]
pub(crate) struct ShellArgs {
    /// sandboxd's base URL, e.g. http://127.0.0.1:8080 (http only).
    #[arg(long, env = "SANDBOXD_URL")]
    url: String,
    /// The admin token, sent in the x-sandboxd-admin-token header.
    #[arg(long, env = "SANDBOXD_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A sandboxId, or the sessionKey of an existing sandbox (none is
    /// created).
    #[arg(value_name = "SANDBOX_OR_SESSION_KEY")]
    target: String,
    /// The program to run and its arguments (argv, no shell), instead of the
    /// server's default.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

// By hand so that a debug print of the command line never shows the token.
impl std::fmt::Debug for ShellArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShellArgs")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("target", &self.target)
            .field("command", &self.command)
            .finish()
    }
}

/// Why `sandboxd shell` ends without the session's exit code.
#[derive(Debug)]
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn setup(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: SETUP_FAILED,
        }
    }

    fn lost(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: CONNECTION_LOST,
        }
    }
}

/// Runs the command to its end. Messages are printed only here, once the
/// terminal guard (inside `run`) is gone, so they are not written to a raw
/// terminal.
pub(crate) fn main(args: ShellArgs) -> ExitCode {
    // One thread is plenty for one terminal; stdin has its own (see
    // `stdin_reader`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxd shell: cannot start the async runtime: {e}");
            return ExitCode::from(SETUP_FAILED);
        }
    };
    let result = runtime.block_on(run(args));
    drop(runtime);
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("sandboxd shell: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

async fn run(args: ShellArgs) -> Result<u8, Failure> {
    let server = Server::parse(&args.url)?;
    // An empty SANDBOXD_ADMIN_TOKEN means none, as for the server.
    let token = args.token.filter(|t| !t.is_empty());
    if let Some(t) = &token {
        // Checked once, here, so that a token no header can carry (a line
        // break, say) is refused with this message before anything is sent.
        HeaderValue::from_str(t).map_err(|_| {
            Failure::setup("the token contains characters an HTTP header cannot carry")
        })?;
    }
    let token = token.as_deref();
    let sandbox_id = resolve(&server, token, &args.target).await?;

    let (cols, rows) = local_size();
    let mut body = json!({"cols": cols, "rows": rows});
    if !args.command.is_empty() {
        body["command"] = json!(args.command);
    }
    let path = format!("/v1/sandboxes/{}/ptys", segment(&sandbox_id));
    let (status, answer) = server.request(token, "POST", &path, Some(&body)).await?;
    if status != 201 {
        return Err(Failure::setup(answer_error(
            &format!("cannot start a terminal session in sandbox {sandbox_id}"),
            status,
            &answer,
            token,
        )));
    }
    let Some(pty_id) = answer.get("ptyId").and_then(Value::as_str) else {
        return Err(Failure::setup(format!(
            "sandboxd created a terminal session but its answer has no ptyId: {}",
            shorten(&answer.to_string())
        )));
    };
    let ws = server.attach(token, &sandbox_id, pty_id).await?;
    session(ws).await
}

/// The sandbox `target` names: a `sandboxId` that `GET /v1/sandboxes/{id}`
/// knows, else the sandbox whose `sessionKey` it is.
async fn resolve(server: &Server, token: Option<&str>, target: &str) -> Result<String, Failure> {
    if target.is_empty() {
        return Err(Failure::setup("the sandbox id or session key is empty"));
    }
    let path = format!("/v1/sandboxes/{}", segment(target));
    let (status, answer) = server.request(token, "GET", &path, None).await?;
    if status == 200 {
        return Ok(answer
            .get("sandboxId")
            .and_then(Value::as_str)
            .unwrap_or(target)
            .to_string());
    }
    // Only "not a sandbox id" sends us to the list; a refused token would be
    // refused there too, and says more here.
    if status == 401 {
        return Err(Failure::setup(answer_error(
            "sandboxd refused the request",
            status,
            &answer,
            token,
        )));
    }
    let (status, list) = server.request(token, "GET", "/v1/sandboxes", None).await?;
    if status != 200 {
        return Err(Failure::setup(answer_error(
            "cannot list the sandboxes",
            status,
            &list,
            token,
        )));
    }
    let Some(sandboxes) = list.get("sandboxes").and_then(Value::as_array) else {
        return Err(Failure::setup(format!(
            "sandboxd's sandbox list has no `sandboxes` array: {}",
            shorten(&list.to_string())
        )));
    };
    sandboxes
        .iter()
        .find(|s| s.get("sessionKey").and_then(Value::as_str) == Some(target))
        .and_then(|s| s.get("sandboxId").and_then(Value::as_str))
        .map(str::to_string)
        .ok_or_else(|| {
            Failure::setup(format!(
                "no sandbox has the id or session key `{target}` (sandboxd shell does not create sandboxes)"
            ))
        })
}

/// The attached session, to its end. The terminal is raw only in here.
async fn session(mut ws: WebSocketStream<TcpStream>) -> Result<u8, Failure> {
    let mut resized = listen(SignalKind::window_change())?;
    let mut hangup = listen(SignalKind::hangup())?;
    let mut interrupt = listen(SignalKind::interrupt())?;
    let mut terminate = listen(SignalKind::terminate())?;
    // Raw only once attached: until then the user may still want Ctrl-C,
    // and errors print on a terminal in its usual mode. Bytes typed
    // meanwhile stay in the terminal's input queue and are forwarded.
    let _raw = RawMode::enter()?;
    let mut input = stdin_reader()?;
    let mut input_open = true;
    let ended = loop {
        tokio::select! {
            frame = ws.next() => match frame {
                None => break Err(Failure::lost(
                    "the connection ended without the session's exit",
                )),
                Some(Err(e)) => break Err(Failure::lost(format!(
                    "the connection ended without the session's exit ({e})"
                ))),
                Some(Ok(Message::Binary(bytes))) => {
                    // Flushed per frame: the user must see a prompt that
                    // does not end in a newline.
                    let mut out = std::io::stdout().lock();
                    if let Err(e) = out.write_all(&bytes).and_then(|()| out.flush()) {
                        break Err(Failure::lost(format!("cannot write to stdout: {e}")));
                    }
                }
                Some(Ok(Message::Text(text))) => match control(text.as_str()) {
                    Control::Exit(code) => break Ok(code),
                    // Output goes on after the gap, but the screen may now
                    // lack some of it: say so.
                    Control::Lagged(skipped) => {
                        let skipped = skipped.map_or_else(
                            || "some".to_string(),
                            |n| format!("{n} bytes of"),
                        );
                        let mut err = std::io::stderr().lock();
                        let _ = write!(
                            err,
                            "\r\nsandboxd shell: this terminal fell behind; {skipped} output skipped\r\n"
                        );
                        let _ = err.flush();
                    }
                    Control::Ignore => {}
                },
                // Pings are answered by tungstenite itself; after a Close
                // the next read ends the stream.
                Some(Ok(_)) => {}
            },
            chunk = input.recv(), if input_open => match chunk {
                Some(bytes) => {
                    if let Err(e) = ws.send(Message::Binary(bytes.into())).await {
                        break Err(Failure::lost(format!(
                            "the connection ended without the session's exit ({e})"
                        )));
                    }
                }
                // Stdin is at its end (a pipe or file): keep showing the
                // session's output until it exits.
                None => input_open = false,
            },
            Some(()) = resized.recv() => {
                let (cols, rows) = local_size();
                let resize = json!({"type": "resize", "cols": cols, "rows": rows}).to_string();
                if let Err(e) = ws.send(Message::Text(resize.into())).await {
                    break Err(Failure::lost(format!(
                        "the connection ended without the session's exit ({e})"
                    )));
                }
            }
            Some(()) = hangup.recv() => break Err(signalled("SIGHUP", 1)),
            Some(()) = interrupt.recv() => break Err(signalled("SIGINT", 2)),
            Some(()) = terminate.recv() => break Err(signalled("SIGTERM", 15)),
        }
    };
    // A polite close; the server may already have closed, and a peer that
    // does not answer must not keep the user waiting.
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    ended
}

fn signalled(name: &str, number: u8) -> Failure {
    Failure {
        message: format!("ended by {name}"),
        code: 128 + number,
    }
}

fn listen(kind: SignalKind) -> Result<Signal, Failure> {
    signal(kind).map_err(|e| Failure::setup(format!("cannot listen for signals: {e}")))
}

/// A control message from the server.
#[derive(Debug, PartialEq)]
enum Control {
    /// The session's process ended; the exit code to leave with.
    Exit(u8),
    /// This viewer fell behind the server's scrollback and missed this
    /// many bytes; output goes on after the gap.
    Lagged(Option<u64>),
    /// `writer` and anything this client does not know.
    Ignore,
}

fn control(text: &str) -> Control {
    let Ok(message) = serde_json::from_str::<Value>(text) else {
        return Control::Ignore;
    };
    match message.get("type").and_then(Value::as_str) {
        Some("exit") => {
            if let Some(code) = message.get("exitCode").and_then(Value::as_i64) {
                Control::Exit(u8::try_from(code).unwrap_or(CONNECTION_LOST))
            } else if let Some(signal) = message.get("signal").and_then(Value::as_i64) {
                Control::Exit(
                    u8::try_from(signal)
                        .ok()
                        .filter(|s| (1..=127).contains(s))
                        .map_or(CONNECTION_LOST, |s| 128 + s),
                )
            } else {
                Control::Exit(CONNECTION_LOST)
            }
        }
        Some("lagged") => Control::Lagged(message.get("skippedBytes").and_then(Value::as_u64)),
        _ => Control::Ignore,
    }
}

/// The local terminal's size as (cols, rows), from stdin. At most 1000
/// each, the most sandboxd accepts: a session a little smaller than a huge
/// window beats a refused one.
fn local_size() -> (u16, u16) {
    match termios::tcgetwinsize(rustix::stdio::stdin()) {
        Ok(size) if size.ws_col > 0 && size.ws_row > 0 => {
            (size.ws_col.min(MAX_SIZE), size.ws_row.min(MAX_SIZE))
        }
        _ => DEFAULT_SIZE,
    }
}

/// Stdin in raw mode while this lives (nothing when stdin is not a
/// terminal): keys go to the session as typed, Ctrl-C included, and the
/// remote terminal does the echoing. Dropping it restores the settings it
/// found.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> Result<Option<RawMode>, Failure> {
        let stdin = rustix::stdio::stdin();
        if !termios::isatty(stdin) {
            return Ok(None);
        }
        let failed = |e: rustix::io::Errno| {
            Failure::setup(format!("cannot put the terminal in raw mode: {e}"))
        };
        let saved = termios::tcgetattr(stdin).map_err(failed)?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(stdin, OptionalActions::Now, &raw).map_err(failed)?;
        Ok(Some(RawMode { saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing to do if it fails: the terminal is gone (SIGHUP).
        let _ = termios::tcsetattr(rustix::stdio::stdin(), OptionalActions::Now, &self.saved);
    }
}

/// Stdin's bytes, as they come. A plain thread, not `tokio::io::stdin()`:
/// tokio reads stdin on its blocking pool, and a read there cannot be
/// cancelled, so the runtime's shutdown would wait for the user's next key.
/// This thread is simply left behind when the process exits.
fn stdin_reader() -> Result<tokio::sync::mpsc::Receiver<Vec<u8>>, Failure> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        // The bounded channel holds the thread back when the
                        // connection is slower than the typist (a paste).
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        })
        .map_err(|e| Failure::setup(format!("cannot start the stdin reader: {e}")))?;
    Ok(rx)
}

/// Where sandboxd listens, from `--url`.
#[derive(Debug)]
struct Server {
    /// `host[:port]` as given: the Host header and the WebSocket URL.
    authority: String,
    host: String,
    port: u16,
    /// A path sandboxd is mounted under (a reverse proxy), without the
    /// final slash; usually empty.
    prefix: String,
}

impl Server {
    fn parse(url: &str) -> Result<Server, Failure> {
        let scheme = |s: &str| {
            url.get(..s.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(s))
        };
        if scheme("https://") {
            return Err(Failure::setup(format!(
                "--url {url}: only http:// URLs are supported (sandboxd shell does not speak TLS)"
            )));
        }
        let rest = match url.get("http://".len()..) {
            Some(rest) if scheme("http://") => rest,
            _ => {
                return Err(Failure::setup(format!(
                    "--url {url}: not an http:// URL (e.g. http://127.0.0.1:8080)"
                )));
            }
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let bad = |why: &str| Failure::setup(format!("--url {url}: {why}"));
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        if authority.contains('@') || path.contains(['?', '#']) {
            return Err(bad("a base URL has no user, query or fragment"));
        }
        let port = |p: &str| {
            p.parse::<u16>()
                .map_err(|_| bad("the port is not a number"))
        };
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (host, tail) = bracketed
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 address needs its closing ]"))?;
            match tail.strip_prefix(':') {
                Some(p) => (host, port(p)?),
                None if tail.is_empty() => (host, 80),
                None => return Err(bad("unexpected text after the IPv6 address")),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((host, p)) => (host, port(p)?),
                None => (authority, 80),
            }
        };
        Ok(Server {
            authority: authority.to_string(),
            host: host.to_string(),
            port,
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    async fn connect(&self) -> Result<TcpStream, Failure> {
        let unreachable = |why: String| {
            Failure::setup(format!(
                "cannot reach sandboxd at http://{}: {why}",
                self.authority
            ))
        };
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| unreachable(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
        // Keystrokes are tiny and must not wait for more to join them.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// One request on a connection of its own; the status and the answer
    /// (JSON, or the text as a JSON string when it is not JSON).
    async fn request(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), Failure> {
        let what = format!("{method} {}{path}", self.prefix);
        let exchange = async {
            let failed = |why: String| Failure::setup(format!("{what}: {why}"));
            let body = body.map(Value::to_string).unwrap_or_default();
            let mut request = Request::builder()
                .method(method)
                .uri(format!("{}{path}", self.prefix))
                .header(header::HOST, self.authority.as_str())
                .header(header::CONNECTION, "close")
                .header(header::ACCEPT, "application/json");
            if let Some(t) = token {
                request = request.header(TOKEN_HEADER, t);
            }
            if method != "GET" {
                request = request
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(header::CONTENT_LENGTH, body.len());
            }
            let request = request
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| failed(e.to_string()))?;
            let stream = self.connect().await?;
            let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| failed(describe(&e)))?;
            // The connection is driven by a task of its own, ended with this
            // exchange (a timeout included) if it has not ended by itself
            // (`connection: close`: once the answer is read).
            let _connection = AbortOnDropHandle::new(tokio::spawn(connection));
            let answer = sender
                .send_request(request)
                .await
                .map_err(|e| failed(describe(&e)))?;
            let status = answer.status().as_u16();
            let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<LengthLimitError>() {
                        failed(format!(
                            "the answer is larger than {MAX_ANSWER_BYTES} bytes"
                        ))
                    } else if let Some(e) = e.downcast_ref::<hyper::Error>() {
                        failed(describe(e))
                    } else {
                        failed(e.to_string())
                    }
                })?
                .to_bytes();
            Ok((status, json_or_text(&body)))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                Failure::setup(format!(
                    "{what}: no answer from sandboxd within {REQUEST_TIMEOUT:?}"
                ))
            })?
    }

    /// The WebSocket of session `pty_id`, the token in the upgrade request.
    async fn attach(
        &self,
        token: Option<&str>,
        sandbox_id: &str,
        pty_id: &str,
    ) -> Result<WebSocketStream<TcpStream>, Failure> {
        let url = format!(
            "ws://{}{}/v1/sandboxes/{}/ptys/{}",
            self.authority,
            self.prefix,
            segment(sandbox_id),
            segment(pty_id)
        );
        let failed = |e: tungstenite::Error| {
            Failure::setup(format!("cannot attach to terminal session {pty_id}: {e}"))
        };
        let mut request = url.as_str().into_client_request().map_err(failed)?;
        if let Some(t) = token {
            let value = HeaderValue::from_str(t).map_err(|_| {
                Failure::setup("the token contains characters an HTTP header cannot carry")
            })?;
            request.headers_mut().insert(TOKEN_HEADER, value);
        }
        let stream = self.connect().await?;
        match tokio::time::timeout(
            REQUEST_TIMEOUT,
            tokio_tungstenite::client_async(request, stream),
        )
        .await
        {
            Err(_) => Err(Failure::setup(format!(
                "cannot attach to terminal session {pty_id}: no answer within {REQUEST_TIMEOUT:?}"
            ))),
            Ok(Err(tungstenite::Error::Http(answer))) => {
                let status = answer.status().as_u16();
                let body = answer.body().as_deref().map_or(Value::Null, json_or_text);
                Err(Failure::setup(answer_error(
                    &format!("cannot attach to terminal session {pty_id}"),
                    status,
                    &body,
                    token,
                )))
            }
            Ok(Err(e)) => Err(failed(e)),
            Ok(Ok((ws, _))) => Ok(ws),
        }
    }
}

/// A hyper error for a message: what went wrong and, when there is one, its
/// cause (hyper's own text for an I/O error is only "connection error").
fn describe(e: &hyper::Error) -> String {
    if e.is_incomplete_message() {
        return "the connection closed in the middle of the answer".to_string();
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

fn json_or_text(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

/// "what: 404 sandbox_not_found: message", from sandboxd's error shape.
fn answer_error(what: &str, status: u16, answer: &Value, token: Option<&str>) -> String {
    let message = answer.get("error").and_then(Value::as_str);
    let code = answer.get("code").and_then(Value::as_str);
    let mut text = match (message, code) {
        (Some(m), Some(c)) => format!("{what}: {status} {c}: {m}"),
        (Some(m), None) => format!("{what}: {status}: {m}"),
        _ => match answer {
            Value::Null => format!("{what}: status {status}"),
            Value::String(s) => format!("{what}: status {status}: {}", shorten(s)),
            other => format!("{what}: status {status}: {}", shorten(&other.to_string())),
        },
    };
    if status == 401 {
        text.push_str(match token {
            None => " (no token was given: pass --token or set SANDBOXD_ADMIN_TOKEN)",
            Some(_) => " (the token given was refused)",
        });
    }
    text
}

/// At most 200 characters of a peer's text, for an error message.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// `s` as one URL path segment: every byte but the unreserved ones
/// percent-encoded, so a session key such as `chat:42/a b` stays one
/// segment (and a `:` never reads as sandboxd's `{id}:verb`).
fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let s = Server::parse("http://127.0.0.1:8080/").expect("parse");
        assert_eq!(
            (s.host.as_str(), s.port, s.prefix.as_str()),
            ("127.0.0.1", 8080, "")
        );
        let s = Server::parse("HTTP://[::1]:9/sbx/").expect("parse");
        assert_eq!(
            (s.host.as_str(), s.port, s.prefix.as_str()),
            ("::1", 9, "/sbx")
        );
        assert_eq!(s.authority, "[::1]:9");
        let s = Server::parse("http://example").expect("parse");
        assert_eq!(s.port, 80);
        let https = Server::parse("https://x").expect_err("https");
        assert!(https.message.contains("only http://"), "{}", https.message);
        assert!(Server::parse("ftp://x").is_err());
        assert!(Server::parse("http://x:port").is_err());
        assert!(Server::parse("http://x/?a=1").is_err());
    }

    /// A one-connection peer that reads a request head, sends `answer` as
    /// is and closes; it returns the request as it arrived.
    async fn canned(answer: Vec<u8>) -> (Server, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("local_addr").port();
        let peer = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.expect("read");
                assert!(n > 0, "the request ended early");
                request.extend_from_slice(&buf[..n]);
            }
            let _ = stream.write_all(&answer).await;
            let _ = stream.shutdown().await;
            // The rest of the request, until the client closes.
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&request).into_owned()
        });
        let server = Server::parse(&format!("http://127.0.0.1:{port}/sbx/")).expect("parse");
        (server, peer)
    }

    #[tokio::test]
    async fn answers() {
        let (server, peer) =
            canned(b"HTTP/1.1 201 Created\r\ncontent-length: 13\r\n\r\n{\"ptyId\":\"a\"}".to_vec())
                .await;
        let answer = server
            .request(Some("tok"), "POST", "/v1/x", Some(&json!({"cols": 80})))
            .await
            .expect("request");
        assert_eq!(answer, (201, json!({"ptyId": "a"})));
        let sent = peer.await.expect("peer").to_ascii_lowercase();
        assert!(sent.starts_with("post /sbx/v1/x http/1.1\r\n"), "{sent}");
        for line in [
            "x-sandboxd-admin-token: tok\r\n",
            "content-type: application/json\r\n",
            "content-length: 11\r\n",
            "connection: close\r\n",
        ] {
            assert!(sent.contains(line), "{line:?} in {sent}");
        }
        assert!(sent.ends_with("\r\n\r\n{\"cols\":80}"), "{sent}");

        let (server, _peer) = canned(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                .to_vec(),
        )
        .await;
        let answer = server
            .request(None, "GET", "/", None)
            .await
            .expect("chunked");
        assert_eq!(answer, (200, json!("abcde")));

        let (server, _peer) = canned(b"HTTP/1.1 502 Bad Gateway\r\n\r\noops".to_vec()).await;
        let answer = server
            .request(None, "GET", "/", None)
            .await
            .expect("unsized");
        assert_eq!(answer, (502, json!("oops")));

        let (server, _peer) =
            canned(b"HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n{\"ptyId\"".to_vec()).await;
        let cut = server
            .request(None, "GET", "/", None)
            .await
            .expect_err("cut");
        assert_eq!(cut.code, SETUP_FAILED);
        assert!(cut.message.starts_with("GET /sbx/: "), "{}", cut.message);

        let mut huge = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
            MAX_ANSWER_BYTES + 1
        )
        .into_bytes();
        huge.resize(huge.len() + MAX_ANSWER_BYTES + 1, b' ');
        let (server, _peer) = canned(huge).await;
        let big = server
            .request(None, "GET", "/", None)
            .await
            .expect_err("huge");
        assert!(big.message.contains("larger than"), "{}", big.message);
    }

    #[test]
    fn control_messages() {
        assert_eq!(control(r#"{"type":"exit","exitCode":7}"#), Control::Exit(7));
        assert_eq!(control(r#"{"type":"exit","signal":9}"#), Control::Exit(137));
        assert_eq!(
            control(r#"{"type":"exit","exitCode":300}"#),
            Control::Exit(255)
        );
        assert_eq!(
            control(r#"{"type":"lagged","skippedBytes":5}"#),
            Control::Lagged(Some(5))
        );
        assert_eq!(control(r#"{"type":"lagged"}"#), Control::Lagged(None));
        assert_eq!(
            control(r#"{"type":"writer","writer":false}"#),
            Control::Ignore
        );
        assert_eq!(control(r#"{"type":"new-thing"}"#), Control::Ignore);
        assert_eq!(control("not json"), Control::Ignore);
    }

    #[test]
    fn segments_and_errors() {
        assert_eq!(segment("chat:42/a b"), "chat%3A42%2Fa%20b");
        let e = answer_error(
            "x",
            401,
            &json!({"error": "missing or wrong token", "code": "unauthorized"}),
            None,
        );
        assert!(
            e.starts_with("x: 401 unauthorized: missing or wrong token"),
            "{e}"
        );
        assert!(e.contains("--token"), "{e}");
    }
}
