//! Absolute-form `http://` requests: sent on to the destination as
//! origin-form HTTP/1.1 over a connection of their own, the hop-by-hop
//! headers removed both ways, the answer streamed back, and an origin
//! that stays silent answered `504` or cut off.

use std::net::IpAddr;
use std::sync::Arc;

use http_body_util::Either;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;

use super::activity::{Activity, Watched};
use super::answer::{Body, bad_destination, failed};
use super::dest::Dest;
use super::limits::ORIGIN_BUFFER;
use super::proxy::{Proxy, Slot};
use super::resolve::open;

/// An absolute-form `http://` request: sent on to the destination as
/// origin-form over a connection of its own, the answer streamed back.
/// The origin has
/// [`Limits::response_timeout`](super::limits::Limits::response_timeout) of silence to start its
/// answer, then the idle timeout between any two bytes either way.
pub(super) async fn forward(
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::time::Instant;

    use super::*;
    use crate::egress::fixture::{
        closed_unanswered, connect_from, origin_and_proxy, read_answer, read_head,
    };

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
}
