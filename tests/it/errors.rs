//! The JSON error contract against the real binary: every error is JSON
//! with the right status and a stable `code`, and bodies over the limit are
//! refused before they are buffered.

use std::time::Duration;

use crate::harness::{ServerOptions, TestServer};

#[tokio::test]
async fn errors_are_json_with_the_right_status() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_MAX_BODY_BYTES", "2048"))
            .await;
    let c = &server.client;
    let url = |p: &str| format!("{}{p}", server.base);
    let check = |status: u16, expected: u16, code: &str, body: &serde_json::Value, what: &str| {
        assert_eq!(status, expected, "{what}: {body}");
        assert_eq!(body["code"], code, "{what}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{what}: {body}"
        );
    };
    async fn send(rb: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
        let r = rb.send().await.expect("send");
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(serde_json::Value::Null))
    }
    let post_raw = |body: &'static str| {
        c.post(url("/v1/sandboxes"))
            .header("content-type", "application/json")
            .body(body)
    };

    let (s, b) = send(c.get(url("/v1/nope"))).await;
    check(s, 404, "not_found", &b, "unknown route");
    let (s, b) = send(c.delete(url("/v1/sandboxes"))).await;
    check(s, 405, "method_not_allowed", &b, "wrong method");
    let (s, b) = send(c.put(url("/v1/health"))).await;
    check(s, 405, "method_not_allowed", &b, "wrong method on health");
    let (s, b) = send(post_raw("{\"sessionKey\": ")).await;
    check(s, 400, "invalid_request", &b, "malformed JSON");
    let (s, b) = send(post_raw("{\"sessionKey\": 42}")).await;
    check(s, 400, "invalid_request", &b, "wrong type");
    let (s, b) = send(post_raw("{\"sessionKey\": \"k\", \"bogus\": 1}")).await;
    check(s, 400, "invalid_request", &b, "unknown field");
    let (s, b) = send(post_raw("{\"sessionKey\": \"k\"} trailing")).await;
    check(s, 400, "invalid_request", &b, "trailing garbage");
    let (s, b) = send(post_raw("[]")).await;
    check(s, 400, "invalid_request", &b, "not an object");
    let (s, b) = send(c.post(url("/v1/sandboxes")).body("{\"sessionKey\":\"k\"}")).await;
    check(s, 415, "unsupported_media_type", &b, "no content type");
    // A declared length over the limit is refused before any byte of the
    // body is sent: nothing is buffered.
    let port = server.base.rsplit(':').next().expect("port");
    let head = "POST /v1/sandboxes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000000000\r\n\r\n";
    let reply = raw_http(port, head.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("body_too_large"), "{reply}");
    // A chunked body with no length: refused once it passes the limit.
    let mut chunked = b"POST /v1/sandboxes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend_from_slice(&[b' '; 1024]);
        chunked.extend_from_slice(b"\r\n");
    }
    let reply = raw_http(port, &chunked).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("body_too_large"), "{reply}");
    assert!(
        server.containers().await.is_empty(),
        "bad input created nothing"
    );
}

/// Writes `request` to the server and reads what it answers (bounded).
async fn raw_http(port: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
        .await
        .expect("connect");
    stream.write_all(request).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let mut out = Vec::new();
    // Read until the headers and a JSON body have arrived.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if String::from_utf8_lossy(&out).contains("\"code\"") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}
