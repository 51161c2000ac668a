//! `sandboxd-agent egress --listen <port> [policy]`: the HTTP proxy that is
//! a sandbox's only way out. Sandboxes sit on internal networks with no
//! route out; an egress container on those networks runs this role, and
//! every command in a sandbox gets `HTTP_PROXY`/`HTTPS_PROXY` pointing at
//! it. The policy (`sandboxd_proto::egress`) arrives on the command line.
//!
//! Two kinds of request are proxied, each checked against the policy
//! before any byte reaches the destination:
//! - `CONNECT host:port`: a tunnel (HTTPS and anything else over TCP);
//! - absolute-form `http://` requests: forwarded as origin-form HTTP/1.1,
//!   bodies streamed both ways.
//!
//! A name is resolved once, every address it resolves to is checked (one
//! refused address refuses the name), and the connection goes to an
//! address that was checked, so a second answer from DNS cannot swap in
//! another. A refusal is answered `403` with a one-line reason and
//! printed as one `egress-denied` line on stdout, which sandboxd follows;
//! stdout carries nothing else. Hyper parses all HTTP.
//!
//! One thread serves every connection (the work is waiting on sockets),
//! plus a few for name lookups, which block.

use std::convert::Infallible;
use std::fmt;
use std::io::Write;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
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
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections served at once (tunnels included); beyond, new ones are
/// closed at once rather than queued behind a flood.
const MAX_CONNECTIONS: usize = 4096;
/// Longest a client may take to send a request's head, or to start the
/// next one on a kept-alive connection.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a name lookup may take (the resolver retries on its own).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest connecting to a destination may take, all its addresses together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Threads for name lookups (getaddrinfo blocks): enough for bursts,
/// few enough for a container's pids limit.
const LOOKUP_THREADS: usize = 64;
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
        let proxy = Arc::new(Proxy {
            policy,
            log: Box::new(print_line),
        });
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

/// What every connection shares.
struct Proxy {
    policy: EgressPolicy,
    /// Where `egress-denied` lines go: stdout, or a test's buffer.
    log: Box<dyn Fn(&str) + Send + Sync>,
}

type Body = Either<Full<Bytes>, Incoming>;

/// Accepts connections; returns never (the process ends on a signal).
async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Full: the connection is closed unserved.
            drop(stream);
            continue;
        };
        tokio::spawn(connection(stream, peer.ip(), Arc::clone(&proxy), slot));
    }
}

/// Serves one client connection; `slot` is held until it and any tunnel
/// it became have ended.
async fn connection(
    stream: TcpStream,
    client: IpAddr,
    proxy: Arc<Proxy>,
    slot: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let slot = Arc::new(slot);
    let client = client.to_canonical();
    let service = service_fn(move |req| {
        let proxy = Arc::clone(&proxy);
        let slot = Arc::clone(&slot);
        async move { Ok::<_, Infallible>(handle(req, client, &proxy, slot).await) }
    });
    // An error here is the client's: it went away, timed out or sent
    // something hyper refused (and answered 400 itself).
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

async fn handle(
    req: Request<Incoming>,
    client: IpAddr,
    proxy: &Proxy,
    slot: Arc<OwnedSemaphorePermit>,
) -> Response<Body> {
    if req.method() == Method::CONNECT {
        return tunnel(req, client, proxy, slot).await;
    }
    match req.uri().scheme_str() {
        Some("http") => forward(req, client, proxy).await,
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

/// `CONNECT host:port`: connects, answers 200 and joins the two streams.
async fn tunnel(
    req: Request<Incoming>,
    client: IpAddr,
    proxy: &Proxy,
    slot: Arc<OwnedSemaphorePermit>,
) -> Response<Body> {
    let dest = match req.uri().authority().map(|a| Dest::parse(a.as_str(), None)) {
        Some(Ok(dest)) => dest,
        Some(Err(why)) => return bad_destination(why),
        None => return bad_destination("CONNECT needs host:port"),
    };
    let mut upstream = match open(&dest, client, proxy).await {
        Ok(stream) => stream,
        Err(answer) => return answer,
    };
    tokio::spawn(async move {
        let _slot = slot;
        if let Ok(upgraded) = hyper::upgrade::on(req).await {
            let mut downstream = TokioIo::new(upgraded);
            let _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await;
        }
    });
    Response::new(Either::Left(Full::new(Bytes::new())))
}

/// An absolute-form `http://` request: sent on to the destination as
/// origin-form over a connection of its own, the answer streamed back.
async fn forward(req: Request<Incoming>, client: IpAddr, proxy: &Proxy) -> Response<Body> {
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
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream)).await {
            Ok(pair) => pair,
            Err(e) => return failed(StatusCode::BAD_GATEWAY, &shown, &format!("origin: {e}")),
        };
    // Drives the origin connection until the answer's body is through.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(mut answer) => {
            strip_hop_by_hop(answer.headers_mut());
            answer.map(Either::Right)
        }
        Err(e) => failed(StatusCode::BAD_GATEWAY, &shown, &format!("origin: {e}")),
    }
}

/// Checks `dest` against the policy, resolving a name, and connects to
/// an address that passed; or the answer to give instead.
async fn open(dest: &Dest, client: IpAddr, proxy: &Proxy) -> Result<TcpStream, Response<Body>> {
    let shown = dest.to_string();
    let mut addrs = match &dest.host {
        Host::Ip(ip) => {
            proxy
                .policy
                .check_addr(*ip, false)
                .map_err(|denied| proxy.refuse(client, &shown, denied, None))?;
            vec![ip.to_canonical()]
        }
        Host::Name(name) => {
            let check = proxy
                .policy
                .check_name(name)
                .map_err(|denied| proxy.refuse(client, &shown, denied, None))?;
            let addrs = resolve(name, dest.port, &shown).await?;
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
    match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
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
            &format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
        )),
    }
}

/// Every address `name` resolves to, each once, in the resolver's order.
async fn resolve(name: &str, port: u16, shown: &str) -> Result<Vec<IpAddr>, Response<Body>> {
    let found = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((name, port))).await;
    let found = match found {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            return Err(failed(
                StatusCode::BAD_GATEWAY,
                shown,
                &format!("does not resolve: {e}"),
            ));
        }
        Err(_) => {
            return Err(failed(
                StatusCode::GATEWAY_TIMEOUT,
                shown,
                &format!("no answer from DNS within {} s", LOOKUP_TIMEOUT.as_secs()),
            ));
        }
    };
    let mut addrs: Vec<IpAddr> = Vec::new();
    for ip in found.map(|a| a.ip().to_canonical()) {
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
        (self.log)(&format!("egress-denied {client} {dest} {}", denied.reason));
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
    use std::sync::Mutex;

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

    /// A proxy on 127.0.0.1 with `policy`, and the lines it logs.
    async fn start(policy: EgressPolicy) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let proxy = Arc::new(Proxy {
            policy,
            log: Box::new(move |line| sink.lock().expect("lines").push(line.to_owned())),
        });
        tokio::spawn(serve(listener, proxy));
        (addr, lines)
    }

    /// Sends `head` (a request line and headers) and reads the answer
    /// until the proxy closes.
    async fn ask(proxy: SocketAddr, head: &str) -> String {
        let mut conn = TcpStream::connect(proxy).await.expect("connect");
        let request = format!("{head}\r\nconnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.expect("write");
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(20), conn.read_to_string(&mut answer))
            .await
            .expect("the proxy answers")
            .expect("read");
        answer
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
}
