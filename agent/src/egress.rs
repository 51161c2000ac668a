//! `sandboxd-agent egress --listen <port> [policy]`: the HTTP proxy that is
//! a sandbox's only way out. Sandboxes sit on internal networks with no
//! route out; an egress container on those networks runs this role, and
//! every command in a sandbox gets `HTTP_PROXY`/`HTTPS_PROXY` pointing at
//! it. The policy (`sandboxd_proto::egress`) arrives on the command line.
//!
//! Two kinds of request are proxied, each checked against the policy
//! before any byte reaches the destination:
//! - `CONNECT host:port`: a tunnel (HTTPS and anything else over TCP),
//!   its bytes moved in the kernel (`splice.rs`);
//! - absolute-form `http://` requests: forwarded as origin-form HTTP/1.1,
//!   bodies streamed both ways.
//!
//! A name is resolved once, every address it resolves to is checked (one
//! refused address refuses the name), and the connection goes to an
//! address that was checked, so a second answer from DNS cannot swap in
//! another. A refusal is answered `403` with a one-line reason and
//! printed as one `egress-denied` line on stdout, which sandboxd follows.
//! Hyper parses all HTTP.
//!
//! One proxy serves many sandboxes, each from its own link network, so a
//! client's address names its sandbox, and no one sandbox may take the
//! proxy from the others: each client address has its own caps on
//! connections and name lookups at once, and its own budget of
//! `egress-denied` lines (past it they are counted, and stdout gets one
//! `egress-denied-suppressed <client> <count>` line a second instead,
//! which sandboxd's parser skips); request heads are bounded, and a
//! tunnel or forwarded exchange with no byte either way for a while is
//! closed. What was turned away for a cap is counted and goes to stderr
//! once a second at most. The global numbers are sized against the
//! container's limits (`src/engine/container.rs`): see
//! [`MAX_CONNECTIONS`] and [`LOOKUP_THREADS`].
//!
//! One thread serves every connection (the work is waiting on sockets),
//! plus a few for name lookups, which block.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::io::Write;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use sandboxd_proto::egress::{Denied, EgressPolicy};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::splice;

/// Connections served at once, tunnels included; beyond, new ones are
/// closed at once rather than queued behind a flood. Sized against the
/// container's 384 MiB. A forwarded request whose reader stalls holds, on
/// its client's connection, [`HEAD_BUFFER`] read and as much queued to
/// write, and on the origin's [`ORIGIN_BUFFER`] read: with 16 KiB on both
/// sides 81 KiB of resident memory each was measured (with hyper's default
/// buffers it was 1 MiB, and the 4096 connections allowed before could ask
/// for 4 GiB); the origin's larger buffer adds about 48 KiB, 129 KiB in
/// all. A tunnel's bytes go through the kernel (`splice.rs`): a stalled
/// one holds no buffer here, and at most a pipe's 64 KiB each way there,
/// 128 KiB. 2048 × 129 KiB is 258 MiB at worst, which leaves 126 MiB for the
/// process itself (a few MiB) and for the kernel's socket buffers, which
/// the container is charged for and which the kernel stops growing as the
/// container nears its limit. Each connection holds two descriptors, the
/// client's and the destination's: 4096, half the container's nofile
/// limit of 8192, the rest ample for the lookups' sockets and the
/// listener.
const MAX_CONNECTIONS: usize = 2048;
/// Connections one client may hold at once: a package manager's parallel
/// downloads use tens; 16 clients at their cap fill the proxy, so one
/// sandbox alone cannot. Past it a new connection is closed at once, as
/// past [`MAX_CONNECTIONS`], rather than answered 429: answering means
/// reading its request first, the work a flood should not get.
const CLIENT_CONNECTIONS: usize = 128;
/// Name lookups one client may have under way at once: an eighth of
/// [`LOOKUP_THREADS`], so one sandbox resolving slow names cannot hold
/// every lookup thread. A lookup counts until getaddrinfo returns, even
/// after its request gave up waiting for it.
const CLIENT_LOOKUPS: usize = 8;
/// How long a lookup past [`CLIENT_LOOKUPS`] waits for one of its client's
/// to finish before it is answered 503.
const LOOKUP_WAIT: Duration = Duration::from_secs(2);
/// The most a client's connection buffers: a request head must fit (hyper
/// answers 431 past it). Request bodies stream through in pieces of at
/// most this.
const HEAD_BUFFER: usize = 16 * 1024;
/// The most the origin's side of a forwarded request buffers: its
/// response head must fit (502 past it; nginx's default for a proxied
/// head is 4 or 8 KiB) and its body comes through in pieces of at most
/// this. Pieces of [`HEAD_BUFFER`] halved a 100 MB download's speed
/// (bench/: 0.36× a direct download, 0.62× with this).
const ORIGIN_BUFFER: usize = 64 * 1024;
/// Longest a client may take to send a request's head, or to start the
/// next one on a kept-alive connection.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a name lookup may take (the resolver retries on its own).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest connecting to a destination may take, all its addresses together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest an origin may stay silent before its response head, counted
/// from the last byte of the request it was sent: 504 after. Counting
/// from the last byte lets a long upload through.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// A tunnel or forwarded exchange that moves no byte either way for this
/// long is closed, and its slot freed. Clients already live with
/// middleboxes that drop silent connections after 4 to 6 minutes (cloud
/// NAT gateways and load balancers), so this breaks nothing new.
const IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Threads for name lookups (getaddrinfo blocks): enough for bursts, and
/// with the serving thread and the engine's init 66 of the container's
/// 128 pids.
const LOOKUP_THREADS: usize = 64;
/// `egress-denied` lines a client may print in a burst, and then each
/// second: enough for a person to see every refusal, too few for one
/// sandbox to flood sandboxd's log or the container's.
const LOG_BURST: f64 = 20.0;
const LOG_PER_SECOND: f64 = 10.0;
/// How often the counts of what was suppressed or turned away are printed.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// Most bytes of a destination in an `egress-denied` line.
const MAX_LOGGED: usize = 300;

const USAGE: &str = "usage: sandboxd-agent egress --listen <port> [--deny CIDR]... \
                     [--allowlist] [--allow-domain PATTERN]... [--allow-cidr CIDR]...";

/// `sandboxd-agent egress`.
pub(crate) fn run() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let (port, policy) = match parse_args(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("sandboxd-agent egress: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(LOOKUP_THREADS)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxd-agent egress: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        let listener = match bind(port) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sandboxd-agent egress: cannot listen on port {port}: {e}");
                return ExitCode::FAILURE;
            }
        };
        // PID 1 of its container: without handlers SIGTERM would be
        // ignored and every stop would wait for the engine's SIGKILL.
        let (mut term, mut int) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("sandboxd-agent egress: signals: {e}");
                return ExitCode::FAILURE;
            }
        };
        let proxy = Arc::new(Proxy::new(policy, Box::new(print_line)));
        // sandboxd waits for this line before it counts the proxy started.
        eprintln!("egress listening on port {port}");
        tokio::select! {
            () = serve(listener, proxy) => ExitCode::FAILURE,
            _ = term.recv() => ExitCode::SUCCESS,
            _ = int.recv() => ExitCode::SUCCESS,
        }
    });
    // Lookups still blocking in getaddrinfo are not waited for.
    runtime.shutdown_background();
    code
}

/// `--listen <port>` first, then the policy's own arguments.
fn parse_args(args: &[String]) -> Result<(u16, EgressPolicy), String> {
    let [flag, port, policy @ ..] = args else {
        return Err("--listen <port> comes first".into());
    };
    if flag != "--listen" {
        return Err(format!("--listen <port> comes first, not {flag:?}"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{port:?} is not a port"))?;
    Ok((port, EgressPolicy::from_args(policy)?))
}

fn bind(port: u16) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([0, 0, 0, 0], port)))?;
    socket.listen(1024)
}

/// Writes one line to stdout at once: sandboxd reads it as it comes.
fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The numbers a proxy works to: the constants above, shorter in tests.
#[derive(Debug, Clone, Copy)]
struct Limits {
    connections: usize,
    client_connections: usize,
    client_lookups: usize,
    lookup_wait: Duration,
    lookup_timeout: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    idle_timeout: Duration,
    log_burst: f64,
    log_per_second: f64,
}

impl Limits {
    const DEFAULT: Limits = Limits {
        connections: MAX_CONNECTIONS,
        client_connections: CLIENT_CONNECTIONS,
        client_lookups: CLIENT_LOOKUPS,
        lookup_wait: LOOKUP_WAIT,
        lookup_timeout: LOOKUP_TIMEOUT,
        connect_timeout: CONNECT_TIMEOUT,
        response_timeout: RESPONSE_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        log_burst: LOG_BURST,
        log_per_second: LOG_PER_SECOND,
    };
}

/// Resolves a name to its addresses, blocking: getaddrinfo, or a test's.
type Resolver = dyn Fn(&str, u16) -> std::io::Result<Vec<IpAddr>> + Send + Sync;

/// getaddrinfo, as the egress container's resolv.conf says.
fn system_resolver(name: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    Ok((name, port).to_socket_addrs()?.map(|a| a.ip()).collect())
}

/// What every connection shares.
struct Proxy {
    policy: EgressPolicy,
    /// Where `egress-denied` lines go: stdout, or a test's buffer.
    log: Box<dyn Fn(&str) + Send + Sync>,
    limits: Limits,
    resolver: Arc<Resolver>,
    /// Clients with connections open, lookups under way or counts not yet
    /// reported.
    clients: Mutex<HashMap<IpAddr, Client>>,
    /// Connections closed unserved because the proxy was full, since the
    /// last report.
    full: AtomicU64,
    /// Destinations tests run on loopback, exempt from the policy.
    #[cfg(test)]
    exempt: Vec<SocketAddr>,
}

/// What the proxy holds for one client address.
#[derive(Debug)]
struct Client {
    connections: usize,
    /// Its lookups under way, [`Limits::client_lookups`] at most.
    lookups: Arc<Semaphore>,
    /// `egress-denied` lines it may print now: a bucket of tokens that
    /// refills at [`Limits::log_per_second`] up to [`Limits::log_burst`].
    log_tokens: f64,
    refilled: Instant,
    /// Since the last report: lines not printed, connections closed at
    /// its cap, lookups answered 503 at its cap.
    suppressed: u64,
    closed: u64,
    busy: u64,
}

type Body = Either<Full<Bytes>, Incoming>;

impl Proxy {
    fn new(policy: EgressPolicy, log: Box<dyn Fn(&str) + Send + Sync>) -> Proxy {
        Proxy {
            policy,
            log,
            limits: Limits::DEFAULT,
            resolver: Arc::new(system_resolver),
            clients: Mutex::default(),
            full: AtomicU64::new(0),
            #[cfg(test)]
            exempt: Vec::new(),
        }
    }

    /// The client table. A panic elsewhere while it was held leaves
    /// counts that are still counts: the table is used on.
    fn clients(&self) -> MutexGuard<'_, HashMap<IpAddr, Client>> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `client`'s entry, made if it has none.
    fn client<'a>(&self, table: &'a mut HashMap<IpAddr, Client>, client: IpAddr) -> &'a mut Client {
        table.entry(client).or_insert_with(|| Client {
            connections: 0,
            lookups: Arc::new(Semaphore::new(self.limits.client_lookups)),
            log_tokens: self.limits.log_burst,
            refilled: Instant::now(),
            suppressed: 0,
            closed: 0,
            busy: 0,
        })
    }

    /// Counts a connection of `client`, or `None` (counted as closed) if
    /// it has all it may hold.
    fn admit(self: &Arc<Self>, client: IpAddr) -> Option<ClientSlot> {
        let mut table = self.clients();
        let entry = self.client(&mut table, client);
        if entry.connections >= self.limits.client_connections {
            entry.closed += 1;
            return None;
        }
        entry.connections += 1;
        Some(ClientSlot {
            proxy: Arc::clone(self),
            client,
        })
    }

    /// Prints an `egress-denied` line if `client` has a token left, or
    /// counts it for the next report.
    fn log_denial(&self, client: IpAddr, line: &str) {
        let allowed = {
            let mut table = self.clients();
            let entry = self.client(&mut table, client);
            self.refill(entry);
            if entry.log_tokens >= 1.0 {
                entry.log_tokens -= 1.0;
                true
            } else {
                entry.suppressed += 1;
                false
            }
        };
        if allowed {
            (self.log)(line);
        }
    }

    fn refill(&self, entry: &mut Client) {
        let now = Instant::now();
        let earned = now.duration_since(entry.refilled).as_secs_f64() * self.limits.log_per_second;
        entry.log_tokens = (entry.log_tokens + earned).min(self.limits.log_burst);
        entry.refilled = now;
    }

    /// Prints what was suppressed or turned away since the last report,
    /// and forgets the clients that have nothing left to count. A client
    /// is kept until its bucket is full again, so that closing every
    /// connection does not buy it a new one.
    fn report(&self) {
        let mut denials = Vec::new();
        let mut turned_away = Vec::new();
        let full = self.full.swap(0, Ordering::Relaxed);
        if full > 0 {
            turned_away.push(format!(
                "{full} connections closed unserved: the proxy holds {} at most",
                self.limits.connections
            ));
        }
        {
            let mut table = self.clients();
            for (ip, entry) in table.iter_mut() {
                self.refill(entry);
                if entry.suppressed > 0 {
                    denials.push(format!(
                        "egress-denied-suppressed {ip} {}",
                        entry.suppressed
                    ));
                }
                if entry.closed > 0 {
                    turned_away.push(format!(
                        "{ip}: {} connections closed: it holds {} at most",
                        entry.closed, self.limits.client_connections
                    ));
                }
                if entry.busy > 0 {
                    turned_away.push(format!(
                        "{ip}: {} requests answered 503: it has {} name lookups under way at most",
                        entry.busy, self.limits.client_lookups
                    ));
                }
                (entry.suppressed, entry.closed, entry.busy) = (0, 0, 0);
            }
            table.retain(|_, entry| {
                entry.connections > 0
                    || entry.lookups.available_permits() < self.limits.client_lookups
                    || entry.log_tokens < self.limits.log_burst
            });
        }
        for line in denials {
            (self.log)(&line);
        }
        for line in turned_away {
            eprintln!("sandboxd-agent egress: {line}");
        }
    }

    /// The policy's verdict on an address a request would connect to.
    fn check_addr(&self, ip: IpAddr, port: u16) -> Result<(), Denied> {
        #[cfg(test)]
        if self.exempt.contains(&SocketAddr::new(ip, port)) {
            return Ok(());
        }
        // Only tests' exemptions look at the port.
        let _ = port;
        self.policy.check_addr(ip, false)
    }
}

/// One of a client's connections, counted until dropped.
struct ClientSlot {
    proxy: Arc<Proxy>,
    client: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        if let Some(entry) = self.proxy.clients().get_mut(&self.client) {
            entry.connections = entry.connections.saturating_sub(1);
        }
    }
}

/// What a connection holds while it, or a tunnel or origin connection it
/// led to, is open: its place in the proxy and in its client's count.
struct Slot {
    _proxy: OwnedSemaphorePermit,
    _client: ClientSlot,
}

/// Accepts connections; returns never (the process ends on a signal).
async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    let slots = Arc::new(Semaphore::new(proxy.limits.connections));
    let reporter = Arc::clone(&proxy);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(REPORT_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            reporter.report();
        }
    });
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, most likely: wait for some to close
                // instead of spinning on the error.
                eprintln!("sandboxd-agent egress: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let client = peer.ip().to_canonical();
        // Past either cap the connection is closed unserved.
        let Some(client_slot) = proxy.admit(client) else {
            drop(stream);
            continue;
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            proxy.full.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        let slot = Slot {
            _proxy: permit,
            _client: client_slot,
        };
        tokio::spawn(connection(stream, client, Arc::clone(&proxy), slot));
    }
}

/// Serves one client connection; `slot` is held until it and any tunnel
/// or origin connection it led to have ended.
async fn connection(stream: TcpStream, client: IpAddr, proxy: Arc<Proxy>, slot: Slot) {
    let _ = stream.set_nodelay(true);
    let slot = Arc::new(slot);
    let service = service_fn(move |req| {
        let proxy = Arc::clone(&proxy);
        let slot = Arc::clone(&slot);
        async move { Ok::<_, Infallible>(handle(req, client, &proxy, slot).await) }
    });
    // An error here is the client's: it went away, timed out or sent
    // something hyper refused (and answered 400 or 431 itself).
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(HEAD_BUFFER)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

async fn handle(
    req: Request<Incoming>,
    client: IpAddr,
    proxy: &Proxy,
    slot: Arc<Slot>,
) -> Response<Body> {
    if req.method() == Method::CONNECT {
        return tunnel(req, client, proxy, slot).await;
    }
    match req.uri().scheme_str() {
        Some("http") => forward(req, client, proxy, slot).await,
        Some(_) => text(
            StatusCode::BAD_REQUEST,
            "sandboxd egress: only http:// URLs are forwarded; use CONNECT for anything else",
        ),
        None => text(
            StatusCode::BAD_REQUEST,
            "sandboxd egress: this is an egress proxy: send http://host/path or CONNECT host:port",
        ),
    }
}

/// `CONNECT host:port`: connects, answers 200 and joins the two streams
/// until either side ends or neither moves a byte for the idle timeout.
async fn tunnel(
    req: Request<Incoming>,
    client: IpAddr,
    proxy: &Proxy,
    slot: Arc<Slot>,
) -> Response<Body> {
    let dest = match req.uri().authority().map(|a| Dest::parse(a.as_str(), None)) {
        Some(Ok(dest)) => dest,
        Some(Err(why)) => return bad_destination(why),
        None => return bad_destination("CONNECT needs host:port"),
    };
    let upstream = match open(&dest, client, proxy).await {
        Ok(stream) => stream,
        Err(answer) => return answer,
    };
    let idle = proxy.limits.idle_timeout;
    tokio::spawn(async move {
        let _slot = slot;
        // The client's socket back from hyper, with whatever it sent
        // after its request head (a TLS hello that did not wait for 200).
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        let Ok(parts) = upgraded.downcast::<TokioIo<TcpStream>>() else {
            return;
        };
        let downstream = parts.io.into_inner();
        let mut upstream = upstream;
        if upstream.write_all(&parts.read_buf).await.is_err() {
            return;
        }
        let activity = Activity::new();
        let moved = || activity.touch();
        tokio::select! {
            _ = splice::join(&downstream, &upstream, &moved) => {}
            () = activity.idle_for(idle) => {}
        }
    });
    Response::new(Either::Left(Full::new(Bytes::new())))
}

/// An absolute-form `http://` request: sent on to the destination as
/// origin-form over a connection of its own, the answer streamed back.
/// The origin has [`Limits::response_timeout`] of silence to start its
/// answer, then the idle timeout between any two bytes either way.
async fn forward(
    req: Request<Incoming>,
    client: IpAddr,
    proxy: &Proxy,
    slot: Arc<Slot>,
) -> Response<Body> {
    let Some(authority) = req.uri().authority().cloned() else {
        return bad_destination("the URL has no host");
    };
    let dest = match Dest::parse(authority.as_str(), Some(80)) {
        Ok(dest) => dest,
        Err(why) => return bad_destination(why),
    };
    let upstream = match open(&dest, client, proxy).await {
        Ok(stream) => stream,
        Err(answer) => return answer,
    };
    let (mut parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match Uri::try_from(target) {
        Ok(uri) => uri,
        Err(_) => return bad_destination("the URL's path is not valid"),
    };
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    // A proxy replaces Host with the target's (RFC 9112, 3.2.2), so the
    // origin sees the name that was checked.
    match HeaderValue::from_str(authority.as_str()) {
        Ok(host) => parts.headers.insert(header::HOST, host),
        Err(_) => return bad_destination("the URL's host is not valid"),
    };
    let shown = dest.to_string();
    // The request body goes out and the answer comes in on this socket:
    // watching it sees every byte of the exchange.
    let activity = Activity::new();
    let upstream = Watched::new(upstream, activity.clone());
    let (mut sender, conn) = match hyper::client::conn::http1::Builder::new()
        .max_buf_size(ORIGIN_BUFFER)
        .handshake::<_, Incoming>(TokioIo::new(upstream))
        .await
    {
        Ok(pair) => pair,
        Err(e) => return failed(StatusCode::BAD_GATEWAY, &shown, &format!("origin: {e}")),
    };
    // Drives the origin connection until the answer's body is through, or
    // the exchange falls silent; dropping it closes the origin's socket,
    // which ends the body the client is reading with an error.
    let idle = proxy.limits.idle_timeout;
    let watch = activity.clone();
    let driver = tokio::spawn(async move {
        let _slot = slot;
        tokio::select! {
            _ = conn => {}
            () = watch.idle_for(idle) => {}
        }
    });
    let answer = tokio::select! {
        answer = sender.send_request(Request::from_parts(parts, body)) => answer,
        () = activity.idle_for(proxy.limits.response_timeout) => {
            driver.abort();
            return failed(
                StatusCode::GATEWAY_TIMEOUT,
                &shown,
                &format!(
                    "no response within {} s of the request",
                    proxy.limits.response_timeout.as_secs()
                ),
            );
        }
    };
    match answer {
        Ok(mut answer) => {
            strip_hop_by_hop(answer.headers_mut());
            answer.map(Either::Right)
        }
        Err(e) => failed(StatusCode::BAD_GATEWAY, &shown, &format!("origin: {e}")),
    }
}

/// When a byte last went through a [`Watched`] socket or a spliced tunnel.
#[derive(Debug, Clone)]
struct Activity {
    since: Instant,
    /// Milliseconds from `since` to the last byte.
    last: Arc<AtomicU64>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            since: Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    /// Returns once no byte has gone through for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let last = self.since + Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = last + limit;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A socket that records in an [`Activity`] every byte read or written.
#[derive(Debug)]
struct Watched<S> {
    inner: S,
    activity: Activity,
}

impl<S> Watched<S> {
    fn new(inner: S, activity: Activity) -> Watched<S> {
        activity.touch();
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Checks `dest` against the policy, resolving a name, and connects to
/// an address that passed; or the answer to give instead.
async fn open(dest: &Dest, client: IpAddr, proxy: &Proxy) -> Result<TcpStream, Response<Body>> {
    let shown = dest.to_string();
    let mut addrs = match &dest.host {
        Host::Ip(ip) => {
            proxy
                .check_addr(*ip, dest.port)
                .map_err(|denied| proxy.refuse(client, &shown, denied, None))?;
            vec![ip.to_canonical()]
        }
        Host::Name(name) => {
            let check = proxy
                .policy
                .check_name(name)
                .map_err(|denied| proxy.refuse(client, &shown, denied, None))?;
            let addrs = resolve(proxy, client, name, dest.port, &shown).await?;
            proxy
                .policy
                .check_resolved(check, &addrs)
                .map_err(|(ip, denied)| proxy.refuse(client, &shown, denied, Some(ip)))?;
            addrs
        }
    };
    // IPv4 first: the egress container has no IPv6 route.
    addrs.sort_by_key(IpAddr::is_ipv6);
    let attempt = async {
        let mut last = std::io::Error::other("no address");
        for ip in addrs {
            match TcpStream::connect((ip, dest.port)).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e,
            }
        }
        Err(last)
    };
    let limit = proxy.limits.connect_timeout;
    match tokio::time::timeout(limit, attempt).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) => Err(failed(
            StatusCode::BAD_GATEWAY,
            &shown,
            &format!("cannot connect: {e}"),
        )),
        Err(_) => Err(failed(
            StatusCode::GATEWAY_TIMEOUT,
            &shown,
            &format!("no connection within {} s", limit.as_secs()),
        )),
    }
}

/// Every address `name` resolves to, each once, in the resolver's order.
/// The lookup runs on a lookup thread under one of `client`'s lookup
/// permits, held until the resolver returns: a lookup the request gave up
/// on still counts while it blocks a thread.
async fn resolve(
    proxy: &Proxy,
    client: IpAddr,
    name: &str,
    port: u16,
    shown: &str,
) -> Result<Vec<IpAddr>, Response<Body>> {
    let lookups = {
        let mut table = proxy.clients();
        Arc::clone(&proxy.client(&mut table, client).lookups)
    };
    let permit = match tokio::time::timeout(proxy.limits.lookup_wait, lookups.acquire_owned()).await
    {
        Ok(Ok(permit)) => permit,
        // Err(_) inside: the semaphore was closed, which nothing does.
        Ok(Err(_)) | Err(_) => {
            if let Some(entry) = proxy.clients().get_mut(&client) {
                entry.busy += 1;
            }
            let mut answer = failed(
                StatusCode::SERVICE_UNAVAILABLE,
                shown,
                &format!(
                    "not looked up: this sandbox has {} name lookups under way already; try again",
                    proxy.limits.client_lookups
                ),
            );
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(answer);
        }
    };
    let limit = proxy.limits.lookup_timeout;
    let deadline = Instant::now() + limit;
    let resolver = Arc::clone(&proxy.resolver);
    let owned = name.to_owned();
    let lookup = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        // Queued behind busy threads until after the request gave up:
        // nobody waits for the answer any more.
        if Instant::now() >= deadline {
            return Ok(Vec::new());
        }
        resolver(&owned, port)
    });
    let found = match tokio::time::timeout_at(deadline, lookup).await {
        Ok(Ok(Ok(found))) => found,
        Ok(Ok(Err(e))) => {
            return Err(failed(
                StatusCode::BAD_GATEWAY,
                shown,
                &format!("does not resolve: {e}"),
            ));
        }
        Ok(Err(_)) => {
            return Err(failed(
                StatusCode::BAD_GATEWAY,
                shown,
                "does not resolve: the lookup failed",
            ));
        }
        Err(_) => {
            return Err(failed(
                StatusCode::GATEWAY_TIMEOUT,
                shown,
                &format!("no answer from DNS within {} s", limit.as_secs()),
            ));
        }
    };
    let mut addrs: Vec<IpAddr> = Vec::new();
    for ip in found.into_iter().map(|ip| ip.to_canonical()) {
        if !addrs.contains(&ip) {
            addrs.push(ip);
        }
    }
    if addrs.is_empty() {
        return Err(failed(
            StatusCode::BAD_GATEWAY,
            shown,
            "does not resolve: no address",
        ));
    }
    Ok(addrs)
}

impl Proxy {
    /// The answer to a refused destination, and its `egress-denied` line.
    fn refuse(
        &self,
        client: IpAddr,
        shown: &str,
        denied: Denied,
        resolved: Option<IpAddr>,
    ) -> Response<Body> {
        let dest = sanitise(shown);
        self.log_denial(
            client,
            &format!("egress-denied {client} {dest} {}", denied.reason),
        );
        let detail = resolved.map(|ip| format!(" ({ip})")).unwrap_or_default();
        let mut answer = text(
            StatusCode::FORBIDDEN,
            &format!(
                "sandboxd egress: {dest} refused: {}{detail}",
                denied.message()
            ),
        );
        answer.headers_mut().insert(
            HeaderName::from_static("x-sandboxd-egress"),
            HeaderValue::from_static("denied"),
        );
        answer
    }
}

/// `dest` for a log line: at most [`MAX_LOGGED`] bytes of characters that
/// cannot split or forge a line, anything else as `?`.
fn sanitise(dest: &str) -> String {
    dest.bytes()
        .take(MAX_LOGGED)
        .map(|b| {
            if b.is_ascii_alphanumeric() || b".:_-[]*".contains(&b) {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect()
}

fn bad_destination(why: &str) -> Response<Body> {
    text(
        StatusCode::BAD_REQUEST,
        &format!("sandboxd egress: bad destination: {why}"),
    )
}

fn failed(status: StatusCode, shown: &str, why: &str) -> Response<Body> {
    text(
        status,
        &format!("sandboxd egress: {} {why}", sanitise(shown)),
    )
}

/// A one-line plain-text answer.
fn text(status: StatusCode, line: &str) -> Response<Body> {
    let mut answer = Response::new(Either::Left(Full::new(Bytes::from(format!("{line}\n")))));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    answer
}

/// Removes what concerns one hop only: the headers `Connection` names,
/// the standard hop-by-hop ones and the proxy's own credentials.
/// Hyper frames bodies itself on each side.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("proxy-connection"),
        HeaderName::from_static("keep-alive"),
    ] {
        headers.remove(name);
    }
}

/// Where a request wants to go.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dest {
    host: Host,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Ip(IpAddr),
    /// Letters, digits, `.`, `-` and `_` only (checked).
    Name(String),
}

impl Dest {
    /// `host:port` as hyper found it in a request (a name, an IPv4
    /// address or a bracketed IPv6 address), the port optional if there
    /// is a `default`. Credentials (`user@`) are refused: nothing here
    /// would use them, and they would end up in the log.
    fn parse(authority: &str, default: Option<u16>) -> Result<Dest, &'static str> {
        if authority.contains('@') {
            return Err("credentials in the address are not supported");
        }
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or("an unclosed '['")?;
            let ip: Ipv6Addr = inside.parse().map_err(|_| "not an IPv6 address in [ ]")?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or("junk after ']'")?),
            };
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            let host = if let Ok(ip) = host.parse() {
                Host::Ip(IpAddr::V4(ip))
            } else if !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
            {
                Host::Name(host.to_owned())
            } else {
                return Err("not a host name or IP address");
            };
            (host, port)
        };
        let port = match port {
            None => default.ok_or("no port")?,
            Some(p) if (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or("not a port")?,
            Some(_) => return Err("not a port"),
        };
        Ok(Dest { host, port })
    }
}

impl fmt::Display for Dest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            Host::Name(name) => write!(f, "{name}:{}", self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use sandboxd_proto::egress::{Allowlist, Cidr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_name_the_port_then_the_policy() {
        let (port, policy) = parse_args(&strings(&["--listen", "3128"])).expect("args");
        assert_eq!((port, policy), (3128, EgressPolicy::default()));
        let (_, policy) = parse_args(&strings(&[
            "--listen",
            "3128",
            "--deny",
            "203.0.113.0/24",
            "--allow-domain",
            "pypi.org",
        ]))
        .expect("args");
        assert_eq!(
            policy.deny,
            vec![Cidr::parse("203.0.113.0/24").expect("cidr")]
        );
        assert!(policy.allowlist.is_some());
        for bad in [
            &[][..],
            &["--listen"],
            &["--listen", "0"],
            &["--listen", "65536"],
            &["--listen", "x"],
            &["--deny", "10.0.0.0/8", "--listen", "3128"],
            &["--listen", "3128", "--allow-domain", "*"],
        ] {
            assert!(parse_args(&strings(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn log_destinations_are_sanitised() {
        assert_eq!(sanitise("pypi.org:443"), "pypi.org:443");
        assert_eq!(sanitise("[::ffff:127.0.0.1]:80"), "[::ffff:127.0.0.1]:80");
        assert_eq!(sanitise("*_a-b"), "*_a-b");
        assert_eq!(sanitise("a b\nc\u{e9}"), "a?b?c??");
        assert_eq!(sanitise(&"x".repeat(400)).len(), MAX_LOGGED);
        assert_eq!(sanitise(&"\u{e9}".repeat(400)).len(), MAX_LOGGED);
    }

    #[test]
    fn destinations_parse() {
        let ok = |a: &str, default: Option<u16>| Dest::parse(a, default).expect(a).to_string();
        assert_eq!(ok("example.com:443", None), "example.com:443");
        assert_eq!(ok("Example.COM", Some(80)), "Example.COM:80");
        assert_eq!(ok("10.0.0.1:8080", None), "10.0.0.1:8080");
        assert_eq!(ok("[::1]:443", None), "[::1]:443");
        assert_eq!(ok("[::1]", Some(80)), "[::1]:80");
        assert_eq!(ok("[::FFFF:127.0.0.1]:80", None), "[::ffff:127.0.0.1]:80");
        assert_eq!(ok("_srv.example.com:1", None), "_srv.example.com:1");
        assert_eq!(
            Dest::parse("[2001:db8::1]:65535", None),
            Ok(Dest {
                host: Host::Ip("2001:db8::1".parse().expect("ip")),
                port: 65535
            })
        );
        for (bad, default) in [
            ("example.com", None),
            ("[::1]", None),
            ("example.com:", Some(80)),
            ("example.com:0", None),
            ("example.com:65536", None),
            ("example.com:+80", None),
            ("example.com:080080", None),
            ("example.com:http", None),
            ("::1:443", None),
            ("[::1:443", None),
            ("[::1]443", None),
            ("[10.0.0.1]:80", None),
            ("[fe80::1%25eth0]:80", None),
            ("user:pw@example.com:80", None),
            (":443", None),
            ("", Some(80)),
            ("exa%6dple.com:80", None),
            ("example.com:80:80", None),
        ] {
            assert!(Dest::parse(bad, default).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("proxy-authorization", "Basic eA=="),
            ("proxy-connection", "keep-alive"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("transfer-encoding", "chunked"),
            ("accept", "*/*"),
            ("content-length", "3"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "content-length"]);
    }

    type Lines = Arc<Mutex<Vec<String>>>;

    /// A proxy with `policy` whose `egress-denied` lines go to a buffer.
    fn proxy(policy: EgressPolicy) -> (Proxy, Lines) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let log = Box::new(move |line: &str| sink.lock().expect("lines").push(line.to_owned()));
        (Proxy::new(policy, log), lines)
    }

    /// Serves `proxy` on 127.0.0.1.
    async fn listen(proxy: Proxy) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, Arc::new(proxy)));
        addr
    }

    /// A proxy on 127.0.0.1 with `policy`, and the lines it logs.
    async fn start(policy: EgressPolicy) -> (SocketAddr, Lines) {
        let (proxy, lines) = proxy(policy);
        (listen(proxy).await, lines)
    }

    /// A connection to `proxy` from 127.0.0.`host`: one client address
    /// per sandbox, as the proxy sees them (Linux answers on all of
    /// 127.0.0.0/8).
    async fn connect_from(host: u8, proxy: SocketAddr) -> TcpStream {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, host], 0)))
            .expect("bind");
        socket.connect(proxy).await.expect("connect")
    }

    /// Sends `head` (a request line and headers) and reads the answer
    /// until the proxy closes.
    async fn ask(proxy: SocketAddr, head: &str) -> String {
        ask_from(1, proxy, head).await
    }

    async fn ask_from(host: u8, proxy: SocketAddr, head: &str) -> String {
        let mut conn = connect_from(host, proxy).await;
        let request = format!("{head}\r\nconnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.expect("write");
        read_answer(&mut conn).await
    }

    /// Everything until the proxy closes, or what came before it reset.
    async fn read_answer(conn: &mut TcpStream) -> String {
        let mut answer = Vec::new();
        let mut buf = [0; 4096];
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                Err(_) => panic!(
                    "the proxy did not close within 20 s: {}",
                    String::from_utf8_lossy(&answer)
                ),
            }
        }
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// Waits up to 10 s for `done`, checking every few milliseconds.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "waited 10 s for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether the proxy closed `conn` (within 10 s) before sending it
    /// anything.
    async fn closed_unanswered(conn: &mut TcpStream) -> bool {
        let mut buf = [0; 64];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    fn assert_refused(answer: &str, body: &str) {
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert!(
            answer.contains("\r\nx-sandboxd-egress: denied\r\n"),
            "{answer}"
        );
        assert!(answer.ends_with(&format!("\r\n\r\n{body}\n")), "{answer}");
    }

    #[tokio::test]
    async fn loopback_in_every_form_is_refused_and_logged() {
        let (proxy, lines) = start(EgressPolicy::default()).await;
        let port = proxy.port();

        let answer = ask(
            proxy,
            &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nhost: 127.0.0.1:{port}"),
        )
        .await;
        assert_refused(
            &answer,
            &format!("sandboxd egress: 127.0.0.1:{port} refused: loopback address"),
        );

        let answer = ask(
            proxy,
            &format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nhost: x"),
        )
        .await;
        assert_refused(
            &answer,
            &format!("sandboxd egress: 127.0.0.1:{port} refused: loopback address"),
        );

        let answer = ask(proxy, "GET http://[::1]:80/ HTTP/1.1\r\nhost: [::1]").await;
        assert_refused(
            &answer,
            "sandboxd egress: [::1]:80 refused: loopback address",
        );

        let answer = ask(
            proxy,
            "GET http://[::ffff:127.0.0.1]/x?y HTTP/1.1\r\nhost: x",
        )
        .await;
        assert_refused(
            &answer,
            "sandboxd egress: [::ffff:127.0.0.1]:80 refused: loopback address",
        );

        let answer = ask(
            proxy,
            "CONNECT [::ffff:169.254.169.254]:80 HTTP/1.1\r\nhost: x",
        )
        .await;
        assert_refused(
            &answer,
            "sandboxd egress: [::ffff:169.254.169.254]:80 refused: link-local address",
        );

        // A name is judged by what it resolves to (localhost: /etc/hosts).
        let answer = ask(
            proxy,
            &format!("GET http://localhost:{port}/ HTTP/1.1\r\nhost: x"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert!(
            answer.contains(&format!(
                "sandboxd egress: localhost:{port} refused: loopback address ("
            )),
            "{answer}"
        );

        let lines = lines.lock().expect("lines").clone();
        assert_eq!(
            lines,
            [
                format!("egress-denied 127.0.0.1 127.0.0.1:{port} loopback"),
                format!("egress-denied 127.0.0.1 127.0.0.1:{port} loopback"),
                "egress-denied 127.0.0.1 [::1]:80 loopback".to_owned(),
                "egress-denied 127.0.0.1 [::ffff:127.0.0.1]:80 loopback".to_owned(),
                "egress-denied 127.0.0.1 [::ffff:169.254.169.254]:80 link-local".to_owned(),
                format!("egress-denied 127.0.0.1 localhost:{port} loopback"),
            ]
        );
    }

    #[tokio::test]
    async fn an_allowlist_refuses_unlisted_names_before_any_lookup() {
        let policy = EgressPolicy {
            allowlist: Some(Allowlist::default()),
            deny: Vec::new(),
        };
        let (proxy, lines) = start(policy).await;
        let answer = ask(proxy, "CONNECT pypi.org:443 HTTP/1.1\r\nhost: pypi.org:443").await;
        assert_refused(
            &answer,
            "sandboxd egress: pypi.org:443 refused: not on the sandbox's allowlist",
        );
        assert_eq!(
            *lines.lock().expect("lines"),
            ["egress-denied 127.0.0.1 pypi.org:443 not-allowlisted"]
        );
    }

    #[tokio::test]
    async fn requests_that_are_not_for_a_proxy_get_400() {
        let (proxy, lines) = start(EgressPolicy::default()).await;
        for head in [
            "GET / HTTP/1.1\r\nhost: egress",
            "GET https://example.com/ HTTP/1.1\r\nhost: example.com",
            "CONNECT example.com HTTP/1.1\r\nhost: example.com",
            "CONNECT example.com:0 HTTP/1.1\r\nhost: example.com",
            "GET http://user@example.com/ HTTP/1.1\r\nhost: example.com",
        ] {
            let answer = ask(proxy, head).await;
            assert!(
                answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{head}: {answer}"
            );
        }
        let answer = ask(proxy, "GET / HTTP/1.1\r\nhost: egress").await;
        assert!(
            answer
                .ends_with("this is an egress proxy: send http://host/path or CONNECT host:port\n"),
            "{answer}"
        );
        assert!(lines.lock().expect("lines").is_empty());
    }

    #[tokio::test]
    async fn one_client_cannot_hold_every_connection() {
        let (proxy, _) = start(EgressPolicy::default()).await;
        let mut held = Vec::new();
        for _ in 0..CLIENT_CONNECTIONS {
            held.push(connect_from(2, proxy).await);
        }
        // Connections are counted as they are accepted, in order: the
        // next one from the same address is over the cap.
        let mut over = connect_from(2, proxy).await;
        assert!(
            closed_unanswered(&mut over).await,
            "connection {} of one client is closed",
            CLIENT_CONNECTIONS + 1
        );
        // Another client is served meanwhile.
        let answer = ask_from(3, proxy, "GET / HTTP/1.1\r\nhost: egress").await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        // One connection closed, the first client is served again (once
        // the proxy has seen it close).
        drop(held.pop());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut conn = connect_from(2, proxy).await;
            conn.write_all(b"GET / HTTP/1.1\r\nhost: egress\r\nconnection: close\r\n\r\n")
                .await
                .expect("write");
            let answer = read_answer(&mut conn).await;
            if answer.starts_with("HTTP/1.1 400 Bad Request\r\n") {
                break;
            }
            assert!(answer.is_empty(), "{answer}");
            assert!(Instant::now() < deadline, "no slot came free in 10 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A resolver whose `slow.test` blocks until the gate opens, counting
    /// the lookups that entered it; every name resolves to 127.0.0.1.
    #[derive(Clone, Default)]
    struct Gate {
        state: Arc<(Mutex<(bool, usize)>, std::sync::Condvar)>,
    }

    impl Gate {
        fn resolver(&self) -> Arc<Resolver> {
            let gate = self.clone();
            Arc::new(move |name: &str, _port: u16| {
                if name == "slow.test" {
                    let (lock, opened) = &*gate.state;
                    let mut state = lock.lock().expect("gate");
                    state.1 += 1;
                    while !state.0 {
                        state = opened.wait(state).expect("gate");
                    }
                }
                Ok(vec![IpAddr::from([127, 0, 0, 1])])
            })
        }

        fn entered(&self) -> usize {
            self.state.0.lock().expect("gate").1
        }

        fn open(&self) {
            self.state.0.lock().expect("gate").0 = true;
            self.state.1.notify_all();
        }
    }

    /// A failed test does not leave lookup threads blocked forever (the
    /// runtime waits for them when it is dropped).
    impl Drop for Gate {
        fn drop(&mut self) {
            if Arc::strong_count(&self.state) == 1 {
                return;
            }
            if let Ok(mut state) = self.state.0.lock() {
                state.0 = true;
            }
            self.state.1.notify_all();
        }
    }

    #[tokio::test]
    async fn one_client_cannot_hold_every_lookup() {
        let gate = Gate::default();
        let (mut proxy, lines) = proxy(EgressPolicy::default());
        proxy.resolver = gate.resolver();
        proxy.limits.lookup_wait = Duration::from_millis(200);
        let proxy = listen(proxy).await;
        let head = b"CONNECT slow.test:443 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";

        let mut waiting = Vec::new();
        for _ in 0..CLIENT_LOOKUPS {
            let mut conn = connect_from(2, proxy).await;
            conn.write_all(head).await.expect("write");
            waiting.push(conn);
        }
        until("the client's lookups to start", || {
            gate.entered() == CLIENT_LOOKUPS
        })
        .await;

        // One more from the same client waits, then is turned away.
        let answer = ask_from(2, proxy, "CONNECT slow.test:443 HTTP/1.1\r\nhost: x").await;
        assert!(
            answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{answer}"
        );
        assert!(answer.contains("\r\nretry-after: 1\r\n"), "{answer}");
        assert!(
            answer.ends_with(
                "sandboxd egress: slow.test:443 not looked up: this sandbox has 8 name \
                 lookups under way already; try again\n"
            ),
            "{answer}"
        );
        assert_eq!(gate.entered(), CLIENT_LOOKUPS);

        // Another client's lookup starts at once.
        let mut other = connect_from(3, proxy).await;
        other.write_all(head).await.expect("write");
        until("the other client's lookup to start", || {
            gate.entered() == CLIENT_LOOKUPS + 1
        })
        .await;

        // The lookups end; the answers (127.0.0.1) are judged as usual.
        gate.open();
        for conn in waiting.iter_mut().chain([&mut other]) {
            let answer = read_answer(conn).await;
            assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        }
        let lines = lines.lock().expect("lines");
        assert_eq!(lines.len(), CLIENT_LOOKUPS + 1, "{lines:?}");
    }

    #[tokio::test]
    async fn refusal_lines_are_rate_limited_per_client() {
        let (mut proxy, lines) = proxy(EgressPolicy::default());
        proxy.limits.log_burst = 5.0;
        proxy.limits.log_per_second = 0.001;
        let proxy = listen(proxy).await;
        for _ in 0..12 {
            let answer = ask_from(2, proxy, "CONNECT 10.0.0.1:80 HTTP/1.1\r\nhost: x").await;
            // Every refusal is still answered in full.
            assert_refused(
                &answer,
                "sandboxd egress: 10.0.0.1:80 refused: private address",
            );
        }
        ask_from(3, proxy, "CONNECT 10.0.0.1:80 HTTP/1.1\r\nhost: x").await;

        // The counts come a second at a time, in one line or more if a
        // report fell between two refusals, before or after the other
        // client's line.
        let suppressed = |lines: &[String]| -> u64 {
            lines
                .iter()
                .filter_map(|l| l.strip_prefix("egress-denied-suppressed 127.0.0.2 "))
                .map(|n| n.parse::<u64>().expect("a count"))
                .sum()
        };
        until("the count of suppressed lines", || {
            suppressed(&lines.lock().expect("lines")) == 7
        })
        .await;
        let lines = lines.lock().expect("lines").clone();
        let printed: Vec<&str> = lines
            .iter()
            .map(String::as_str)
            .filter(|l| !l.starts_with("egress-denied-suppressed 127.0.0.2 "))
            .collect();
        let mut expected = vec!["egress-denied 127.0.0.2 10.0.0.1:80 private"; 5];
        expected.push("egress-denied 127.0.0.3 10.0.0.1:80 private");
        assert_eq!(printed, expected);
        assert_eq!(suppressed(&lines), 7);
    }

    #[tokio::test]
    async fn request_heads_are_bounded() {
        let (proxy, _) = start(EgressPolicy::default()).await;
        let big = |n: usize| format!("GET / HTTP/1.1\r\nhost: egress\r\nx-big: {}", "a".repeat(n));
        let answer = ask(proxy, &big(12 * 1024)).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "a 12 KiB head is read: {answer}"
        );
        let answer = ask(proxy, &big(HEAD_BUFFER)).await;
        assert!(
            answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn response_heads_are_bounded() {
        let (origin, proxy) = origin_and_proxy(|_| {}).await;
        let target = origin.local_addr().expect("addr");
        for (size, status) in [
            (48 * 1024, "200 OK"),
            (2 * ORIGIN_BUFFER, "502 Bad Gateway"),
        ] {
            let mut client = connect_from(2, proxy).await;
            let request =
                format!("GET http://{target}/ HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            client.write_all(request.as_bytes()).await.expect("write");
            let (mut served, _) = origin.accept().await.expect("accept");
            read_head(&mut served).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 2\r\n\r\nhi",
                "a".repeat(size)
            );
            // The proxy may stop reading a head past its bound (hyper's
            // buffer takes one read past it before it refuses).
            let _ = served.write_all(head.as_bytes()).await;
            let answer = read_answer(&mut client).await;
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status}\r\n")),
                "a {size}-byte head: {}",
                &answer[..answer.len().min(200)]
            );
        }
    }

    /// A destination on 127.0.0.1 that tests script, and a proxy that may
    /// reach it (and nothing else on loopback).
    async fn origin_and_proxy(limits: impl FnOnce(&mut Limits)) -> (TcpListener, SocketAddr) {
        let origin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let (mut proxy, _) = proxy(EgressPolicy::default());
        proxy.exempt.push(origin.local_addr().expect("addr"));
        limits(&mut proxy.limits);
        (origin, listen(proxy).await)
    }

    /// Reads what the origin is sent until a blank line ends a head.
    async fn read_head(conn: &mut TcpStream) -> String {
        let mut head = Vec::new();
        let mut byte = [0; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut byte))
                .await
                .expect("a request head")
                .expect("read");
            assert_eq!(n, 1, "the head ended early: {head:?}");
            head.push(byte[0]);
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    #[tokio::test]
    async fn forwarded_requests_are_answered_and_silent_origins_get_504() {
        let (origin, proxy) = origin_and_proxy(|l| {
            l.response_timeout = Duration::from_secs(1);
        })
        .await;
        let target = origin.local_addr().expect("addr");

        let mut client = connect_from(2, proxy).await;
        let request =
            format!("GET http://{target}/ok?x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        client.write_all(request.as_bytes()).await.expect("write");
        let (mut served, _) = origin.accept().await.expect("accept");
        let head = read_head(&mut served).await;
        assert!(head.starts_with("GET /ok?x HTTP/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("host: {target}\r\n")), "{head}");
        served
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi")
            .await
            .expect("write");
        let answer = read_answer(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nhi"), "{answer}");

        let mut client = connect_from(2, proxy).await;
        let request =
            format!("GET http://{target}/silent HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        client.write_all(request.as_bytes()).await.expect("write");
        let (mut silent, _) = origin.accept().await.expect("accept");
        read_head(&mut silent).await;
        let asked = Instant::now();
        let answer = read_answer(&mut client).await;
        assert!(asked.elapsed() >= Duration::from_secs(1));
        assert!(
            answer.starts_with("HTTP/1.1 504 Gateway Timeout\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains(&format!("sandboxd egress: {target} no response within")),
            "{answer}"
        );
        // The proxy let go of the origin's connection.
        assert!(closed_unanswered(&mut silent).await);
    }

    #[tokio::test]
    async fn silent_forwarded_bodies_are_closed() {
        let (origin, proxy) = origin_and_proxy(|l| {
            l.idle_timeout = Duration::from_secs(1);
        })
        .await;
        let target = origin.local_addr().expect("addr");
        let mut client = connect_from(2, proxy).await;
        let request = format!("GET http://{target}/ HTTP/1.1\r\nhost: x\r\n\r\n");
        client.write_all(request.as_bytes()).await.expect("write");
        let (mut served, _) = origin.accept().await.expect("accept");
        read_head(&mut served).await;
        served
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
            .await
            .expect("write");
        // Then nothing: the proxy closes both sides, the client's before
        // the 100 bytes it was promised.
        let answer = read_answer(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\n0123456789"), "{answer}");
        assert!(closed_unanswered(&mut served).await);
    }

    #[tokio::test]
    async fn bytes_sent_with_the_connect_head_reach_the_destination() {
        let (origin, proxy) = origin_and_proxy(|_| {}).await;
        let target = origin.local_addr().expect("addr");
        let mut client = connect_from(2, proxy).await;
        // A client that does not wait for 200 (TLS false start, or a
        // pipelined hello): the bytes after the head are the tunnel's.
        let request = format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\nhello");
        client.write_all(request.as_bytes()).await.expect("write");
        let (mut served, _) = origin.accept().await.expect("accept");
        let head = read_head(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        let mut early = [0; 5];
        served.read_exact(&mut early).await.expect("read");
        assert_eq!(&early, b"hello");
        served.write_all(b"back").await.expect("write");
        drop(served);
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.expect("read");
        assert_eq!(rest, b"back");
    }

    #[tokio::test]
    async fn silent_tunnels_are_closed_and_busy_ones_kept() {
        let idle = Duration::from_secs(1);
        let (origin, proxy) = origin_and_proxy(|l| l.idle_timeout = idle).await;
        let target = origin.local_addr().expect("addr");
        let mut client = connect_from(2, proxy).await;
        let request = format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n");
        client.write_all(request.as_bytes()).await.expect("write");
        let (mut served, _) = origin.accept().await.expect("accept");
        let head = read_head(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");

        // A byte each way every 100 ms for twice the idle timeout: kept.
        let mut byte = [0; 1];
        for i in 0..20u8 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            client.write_all(&[i]).await.expect("write");
            served.read_exact(&mut byte).await.expect("read");
            served.write_all(&byte).await.expect("write");
            client.read_exact(&mut byte).await.expect("read");
            assert_eq!(byte, [i]);
        }
        // Then silence: both ends are closed after the idle timeout.
        let quiet = Instant::now();
        assert!(closed_unanswered(&mut client).await);
        assert!(
            quiet.elapsed() >= idle / 2,
            "closed for being idle, not at once"
        );
        assert!(closed_unanswered(&mut served).await);
    }
}
