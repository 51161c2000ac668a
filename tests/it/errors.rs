//! The JSON error contract against the real binary: every error is JSON
//! with the right status and a stable `code`; bodies over the limit are
//! refused before they are buffered; a long stream of bad input gets 4xx
//! answers only and leaves sandboxd's memory flat.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer};

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
    let head = "POST /v1/sandboxes HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000000000\r\n\r\n";
    let reply = raw_http(port, head.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("body_too_large"), "{reply}");
    // A chunked body with no length: refused once it passes the limit.
    let mut chunked = b"POST /v1/sandboxes HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
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

#[tokio::test]
async fn a_stream_of_bad_input_is_4xx_and_leaves_memory_flat() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_MAX_BODY_BYTES", "65536"))
            .await;
    let sid = server
        .create(json!({"sessionKey": "target", "network": {"mode": "none"}}))
        .await;
    let pid = server.pid().expect("pid");
    let nested = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let long_key = "k".repeat(300);
    let bodies: Vec<(String, String)> = vec![
        ("/v1/sandboxes".into(), "{\"sessionKey\": ".into()),
        ("/v1/sandboxes".into(), "{\"sessionKey\": 1}".into()),
        (
            "/v1/sandboxes".into(),
            "{\"sessionKey\": \"k\"} garbage".into(),
        ),
        ("/v1/sandboxes".into(), nested.clone()),
        (
            "/v1/sandboxes".into(),
            format!("{{\"sessionKey\": \"{long_key}\"}}"),
        ),
        (
            "/v1/sandboxes".into(),
            "{\"sessionKey\": \"k\", \"idleTtlMs\": 1e30}".into(),
        ),
        (
            "/v1/sandboxes".into(),
            "{\"sessionKey\": \"k\", \"ports\": [-1]}".into(),
        ),
        (
            format!("/v1/sandboxes/{sid}/commands"),
            "{\"command\": \"x\", \"timeoutMs\": -1}".into(),
        ),
        (
            format!("/v1/sandboxes/{sid}/commands"),
            "{\"cmd\": \"x\", \"args\": [1, 2]}".into(),
        ),
        (
            format!("/v1/sandboxes/{sid}/files:write"),
            "{\"files\": [{\"path\": \"../x\", \"contentBase64\": \"\"}]}".into(),
        ),
        (
            format!("/v1/sandboxes/{sid}/files:write"),
            format!(
                "{{\"files\": [{{\"path\": \"a\", \"contentBase64\": \"{}\"}}]}}",
                "*".repeat(60000)
            ),
        ),
        ("/v1/sandboxes/../../etc/commands".into(), "{}".into()),
        (
            format!("/v1/sandboxes/{sid}/commands/%00/wait"),
            String::new(),
        ),
        (
            format!("/v1/sandboxes/{sid}/ports/99999999999"),
            String::new(),
        ),
    ];
    let round = |n: usize| {
        let server = &server;
        let bodies = &bodies;
        async move {
            for (path, body) in bodies.iter().cycle().skip(n).take(bodies.len()) {
                let url = format!("{}{path}", server.base);
                let req = if body.is_empty() {
                    server.client.get(&url)
                } else {
                    server
                        .client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                };
                let resp = req.send().await.expect("send");
                let status = resp.status().as_u16();
                let text = resp.text().await.expect("body");
                assert!(
                    (400..500).contains(&status),
                    "{path} {}: {status} {text}",
                    &body[..body.len().min(60)]
                );
                let v: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|_| panic!("JSON error for {path}: {text}"));
                assert!(v["code"].is_string() && v["error"].is_string(), "{v}");
            }
        }
    };
    // Warm up, then measure across many more rounds.
    futures_util::future::join_all((0..4).map(round)).await;
    let before = harness::rss_kb(pid);
    for _ in 0..50 {
        futures_util::future::join_all((0..4).map(round)).await;
    }
    let after = harness::rss_kb(pid);
    let growth_mb = after.saturating_sub(before) / 1024;
    assert!(
        growth_mb < 8,
        "RSS grew {growth_mb} MB over {} bad requests",
        50 * 4 * bodies.len()
    );
    assert!(
        server.containers().await.len() == 1,
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
