//! What the proxy's tests share: a proxy on 127.0.0.1 whose
//! `egress-denied` lines go to a buffer, clients connecting from their
//! own loopback address (one per sandbox, as the proxy sees them), a
//! destination on loopback the tests script, and the looks they take at
//! what came back.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandboxd_proto::egress::EgressPolicy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::Instant;

use super::connection::serve;
use super::limits::Limits;
use super::proxy::Proxy;

pub(super) type Lines = Arc<Mutex<Vec<String>>>;

/// A proxy with `policy` whose `egress-denied` lines go to a buffer.
pub(super) fn proxy(policy: EgressPolicy) -> (Proxy, Lines) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    let log = Box::new(move |line: &str| sink.lock().expect("lines").push(line.to_owned()));
    (Proxy::new(policy, log), lines)
}

/// Serves `proxy` on 127.0.0.1.
pub(super) async fn listen(proxy: Proxy) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(listener, Arc::new(proxy)));
    addr
}

/// A proxy on 127.0.0.1 with `policy`, and the lines it logs.
pub(super) async fn start(policy: EgressPolicy) -> (SocketAddr, Lines) {
    let (proxy, lines) = proxy(policy);
    (listen(proxy).await, lines)
}

/// A connection to `proxy` from 127.0.0.`host`: one client address
/// per sandbox, as the proxy sees them (Linux answers on all of
/// 127.0.0.0/8).
pub(super) async fn connect_from(host: u8, proxy: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, host], 0)))
        .expect("bind");
    socket.connect(proxy).await.expect("connect")
}

/// Sends `head` (a request line and headers) and reads the answer
/// until the proxy closes.
pub(super) async fn ask(proxy: SocketAddr, head: &str) -> String {
    ask_from(1, proxy, head).await
}

pub(super) async fn ask_from(host: u8, proxy: SocketAddr, head: &str) -> String {
    let mut conn = connect_from(host, proxy).await;
    let request = format!("{head}\r\nconnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.expect("write");
    read_answer(&mut conn).await
}

/// Everything until the proxy closes, or what came before it reset.
pub(super) async fn read_answer(conn: &mut TcpStream) -> String {
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
pub(super) async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "waited 10 s for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether the proxy closed `conn` (within 10 s) before sending it
/// anything.
pub(super) async fn closed_unanswered(conn: &mut TcpStream) -> bool {
    let mut buf = [0; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

pub(super) fn assert_refused(answer: &str, body: &str) {
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.contains("\r\nx-sandboxd-egress: denied\r\n"),
        "{answer}"
    );
    assert!(answer.ends_with(&format!("\r\n\r\n{body}\n")), "{answer}");
}

/// A destination on 127.0.0.1 that tests script, and a proxy that may
/// reach it (and nothing else on loopback).
pub(super) async fn origin_and_proxy(
    limits: impl FnOnce(&mut Limits),
) -> (TcpListener, SocketAddr) {
    let origin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (mut proxy, _) = proxy(EgressPolicy::default());
    proxy.exempt.push(origin.local_addr().expect("addr"));
    limits(&mut proxy.limits);
    (origin, listen(proxy).await)
}

/// Reads what the origin is sent until a blank line ends a head.
pub(super) async fn read_head(conn: &mut TcpStream) -> String {
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
