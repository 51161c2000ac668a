//! Accepting and serving the proxy's connections: each counted against
//! the proxy's cap and its client's before anything is read, served by
//! hyper with bounded heads, and each request sent to [`tunnel`] or
//! [`forward`], or answered `400`; and the task that reports once a
//! second.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::answer::{Body, text};
use super::forward::forward;
use super::limits::{HEAD_BUFFER, HEADER_TIMEOUT, REPORT_EVERY};
use super::proxy::{Proxy, Slot};
use super::tunnel::tunnel;

/// Accepts connections; returns never (the process ends on a signal).
pub(super) async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
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

#[cfg(test)]
mod tests {
    use sandboxd_proto::egress::EgressPolicy;
    use tokio::io::AsyncWriteExt;
    use tokio::time::Instant;

    use super::*;
    use crate::egress::fixture::{
        ask, ask_from, closed_unanswered, connect_from, read_answer, start,
    };
    use crate::egress::limits::CLIENT_CONNECTIONS;

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
}
