//! `CONNECT host:port`: the destination checked and connected to, `200`
//! answered, then the client's socket and the destination's joined in the
//! kernel until either side ends or neither moves a byte for the idle
//! timeout.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::activity::Activity;
use super::answer::{Body, bad_destination};
use super::dest::Dest;
use super::proxy::{Proxy, Slot};
use super::resolve::open;
use crate::splice;

/// `CONNECT host:port`: connects, answers 200 and joins the two streams
/// until either side ends or neither moves a byte for the idle timeout.
pub(super) async fn tunnel(
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::time::Instant;

    use super::*;
    use crate::egress::fixture::{closed_unanswered, connect_from, origin_and_proxy, read_head};

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
