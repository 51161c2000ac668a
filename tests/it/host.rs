//! The browser path into sandboxd: a page whose host name rebinds to
//! 127.0.0.1 (DNS rebinding) or a cross-site page must not drive it, token
//! or not; loopback clients, `allowed_hosts` names, same-origin pages and
//! `cors_origins` are served. Requests are written by hand on a TCP socket,
//! so the `Host` and `Origin` headers are exactly what a browser would send.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{ServerOptions, TestServer, unique_instance};

/// An answer read off the socket: status, header block (lowercase names),
/// body.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: String,
    body: String,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim().eq_ignore_ascii_case(name)).then(|| v.trim().to_string())
        })
    }
}

fn port_of(server: &TestServer) -> u16 {
    server
        .base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port in base URL")
}

/// Sends one request with exactly these header lines (plus the body's
/// length) and reads the answer; a 101 is returned once its head is read.
async fn raw(
    server: &TestServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Raw {
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| *k == "connection") {
        req.push_str("connection: close\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    let addr = format!("127.0.0.1:{}", port_of(server));
    let read = async {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        // Until the end of the answer: EOF, a 101's head, or the head and
        // as many body bytes as it declares (an upgrade request keeps the
        // connection open).
        loop {
            let n = s.read(&mut chunk).await.expect("read");
            buf.extend_from_slice(&chunk[..n]);
            if n == 0 || answer_complete(&buf) {
                break;
            }
        }
        buf
    };
    let buf = tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("an answer within 30 s");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Raw {
        status,
        headers: head.to_string(),
        body: body.to_string(),
    }
}

fn answer_complete(buf: &[u8]) -> bool {
    let text = String::from_utf8_lossy(buf);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    if head.starts_with("HTTP/1.1 101") {
        return true;
    }
    let declared = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    declared.is_some_and(|n| body.len() >= n)
}

const JSON: (&str, &str) = ("content-type", "application/json");

/// The request: a page at attacker.example:PORT, rebound to
/// 127.0.0.1, creates a sandbox.
async fn rebound_create(server: &TestServer, token: Option<&str>) -> Raw {
    let port = port_of(server);
    let host = format!("attacker.example:{port}");
    let origin = format!("http://attacker.example:{port}");
    let mut headers = vec![("host", host.as_str()), ("origin", origin.as_str()), JSON];
    if let Some(t) = token {
        headers.push(("x-sandboxd-admin-token", t));
    }
    let body = json!({"sessionKey": unique_instance(), "network": {"mode": "none"}}).to_string();
    raw(server, "POST", "/v1/sandboxes", &headers, &body).await
}

fn assert_refused(r: &Raw, status: u16, code: &str, header: &str) {
    assert_eq!(r.status, status, "{r:?}");
    let v = r.json();
    assert_eq!(v["code"], code, "{r:?}");
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains(header),
        "the error names the {header} header: {msg}"
    );
}

#[tokio::test]
async fn a_rebound_page_cannot_drive_a_token_less_sandboxd_and_loopback_still_can() {
    let server = TestServer::start().await;
    let port = port_of(&server);

    let r = rebound_create(&server, None).await;
    assert_refused(&r, 421, "host_not_allowed", "Host");
    // The same Host without any Origin (what a rebound fetch may also
    // look like to us) is refused too.
    let host = format!("attacker.example:{port}");
    let r = raw(&server, "GET", "/v1/sandboxes", &[("host", &host)], "").await;
    assert_refused(&r, 421, "host_not_allowed", "Host");
    // And nothing was made by the refused create.
    let (status, v) = server.get("/v1/sandboxes").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["sandboxes"].as_array().map(Vec::len), Some(0), "{v}");

    // Positive control: the same create with a loopback Host is served,
    // under every loopback spelling.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = raw(&server, "GET", "/v1/sandboxes", &[("host", &host)], "").await;
        assert_eq!(r.status, 200, "{host}: {r:?}");
    }
    let host = format!("localhost:{port}");
    let body = json!({"sessionKey": unique_instance(), "network": {"mode": "none"}}).to_string();
    let r = raw(
        &server,
        "POST",
        "/v1/sandboxes",
        &[("host", &host), JSON],
        &body,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.json()["sandboxId"].is_string(), "{r:?}");
}

#[tokio::test]
async fn the_rebinding_request_is_refused_with_a_token_too() {
    let server = TestServer::start_with(ServerOptions::default().token("tok-host")).await;
    let r = rebound_create(&server, Some("tok-host")).await;
    assert_refused(&r, 421, "host_not_allowed", "Host");
    // Positive control: the token and a loopback Host are served.
    let host = format!("127.0.0.1:{}", port_of(&server));
    let r = raw(
        &server,
        "GET",
        "/v1/sandboxes",
        &[("host", &host), ("x-sandboxd-admin-token", "tok-host")],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
}

#[tokio::test]
async fn allowed_hosts_names_and_patterns_are_served_and_others_are_not() {
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_ALLOWED_HOSTS", "sandboxd, *.sandbox.test"),
    )
    .await;
    for (host, status) in [
        ("sandboxd:8080", 200),
        ("api.sandbox.test", 200),
        ("a.b.sandbox.test:1", 200),
        ("sandbox.test", 421),
        ("sandboxd.attacker.example", 421),
    ] {
        let r = raw(&server, "GET", "/v1/sandboxes", &[("host", host)], "").await;
        assert_eq!(r.status, status, "{host}: {r:?}");
    }
}

#[tokio::test]
async fn health_answers_any_host_but_no_other_route_does() {
    let server = TestServer::start().await;
    let r = raw(
        &server,
        "GET",
        "/v1/health",
        &[("host", "lb-check.internal:9")],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["ok"], true, "{r:?}");
    // Control: the next route over is refused for that Host.
    let r = raw(
        &server,
        "GET",
        "/metrics",
        &[("host", "lb-check.internal:9")],
        "",
    )
    .await;
    assert_refused(&r, 421, "host_not_allowed", "Host");
    // A request without any Host names no server.
    let mut s = tokio::net::TcpStream::connect(format!("127.0.0.1:{}", port_of(&server)))
        .await
        .expect("connect");
    s.write_all(b"GET /v1/sandboxes HTTP/1.0\r\n\r\n")
        .await
        .expect("write");
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .expect("answer")
        .expect("read");
    assert!(
        out.starts_with("HTTP/1.0 421") || out.starts_with("HTTP/1.1 421"),
        "{out}"
    );
}

#[tokio::test]
async fn a_cross_site_origin_is_refused_and_the_same_origin_is_served() {
    let server = TestServer::start().await;
    let host = format!("127.0.0.1:{}", port_of(&server));
    let same = format!("http://{host}");
    let body = json!({"sessionKey": unique_instance(), "network": {"mode": "none"}}).to_string();
    for origin in [
        "http://evil.example",
        "null",
        &format!("http://localhost:{}", port_of(&server)),
        "http://127.0.0.1:1",
    ] {
        let r = raw(
            &server,
            "POST",
            "/v1/sandboxes",
            &[("host", &host), ("origin", origin), JSON],
            &body,
        )
        .await;
        assert_refused(&r, 403, "origin_not_allowed", "Origin");
        assert!(r.header("access-control-allow-origin").is_none(), "{r:?}");
    }
    // No CORS without cors_origins: a preflight gets no allow header.
    let r = raw(
        &server,
        "OPTIONS",
        "/v1/sandboxes",
        &[
            ("host", &host),
            ("origin", "http://evil.example"),
            ("access-control-request-method", "POST"),
        ],
        "",
    )
    .await;
    assert!(r.header("access-control-allow-origin").is_none(), "{r:?}");
    assert_eq!(r.status, 403, "{r:?}");
    // Positive control: the page sandboxd serves itself.
    let r = raw(
        &server,
        "POST",
        "/v1/sandboxes",
        &[("host", &host), ("origin", &same), JSON],
        &body,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.header("access-control-allow-origin").is_none(), "{r:?}");
}

#[tokio::test]
async fn cors_origins_get_preflights_and_allow_headers_and_no_one_else_does() {
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_CORS_ORIGINS", "https://chat.example:8443"),
    )
    .await;
    let host = format!("127.0.0.1:{}", port_of(&server));
    let r = raw(
        &server,
        "OPTIONS",
        "/v1/sandboxes",
        &[
            ("host", &host),
            ("origin", "https://chat.example:8443"),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "content-type, x-sandboxd-admin-token",
            ),
        ],
        "",
    )
    .await;
    assert!(r.status == 200 || r.status == 204, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin").as_deref(),
        Some("https://chat.example:8443"),
        "{r:?}"
    );
    let r = raw(
        &server,
        "GET",
        "/v1/sandboxes",
        &[("host", &host), ("origin", "https://chat.example:8443")],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin").as_deref(),
        Some("https://chat.example:8443"),
        "{r:?}"
    );
    // Another origin, even the same host on another port, is not listed.
    let r = raw(
        &server,
        "GET",
        "/v1/sandboxes",
        &[("host", &host), ("origin", "https://chat.example")],
        "",
    )
    .await;
    assert_refused(&r, 403, "origin_not_allowed", "Origin");
}

#[tokio::test]
async fn the_terminal_websocket_refuses_a_foreign_origin_and_takes_its_own() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let (status, v) = server
        .post(&format!("/v1/sandboxes/{sid}/ptys"), json!({}))
        .await;
    assert_eq!(status, 201, "{v}");
    let pty = v["ptyId"].as_str().expect("ptyId").to_string();
    let host = format!("127.0.0.1:{}", port_of(&server));
    let path = format!("/v1/sandboxes/{sid}/ptys/{pty}");
    let upgrade = |origin: String| {
        let host = host.clone();
        let path = path.clone();
        let server = &server;
        async move {
            raw(
                server,
                "GET",
                &path,
                &[
                    ("host", &host),
                    ("origin", &origin),
                    ("upgrade", "websocket"),
                    ("connection", "upgrade"),
                    ("sec-websocket-version", "13"),
                    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ],
                "",
            )
            .await
        }
    };
    let r = upgrade("http://evil.example".to_string()).await;
    assert_refused(&r, 403, "origin_not_allowed", "Origin");
    // Positive control: the same upgrade from sandboxd's own origin.
    let r = upgrade(format!("http://{host}")).await;
    assert_eq!(r.status, 101, "{r:?}");
}
