//! Issue 2 against the real binary and engine: health, configuration errors,
//! engine discovery and late arrival, auth, and the JSON error contract.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{ServerOptions, TestServer, eventually};
use serde_json::json;

#[tokio::test]
async fn health_reports_the_engine_version() {
    let server = TestServer::start().await;
    let expected = server
        .docker
        .version()
        .await
        .expect("engine version")
        .version;
    let (status, body) = server.get("/v1/health").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true);
    assert_eq!(body["engine"], "docker");
    assert_eq!(body["version"].as_str(), expected.as_deref());
}

/// Runs the binary with `env` and returns (exit code, stderr) once it exits.
/// A configuration it accepts would start a server: that fails the test
/// after 10 s instead of hanging it.
fn run_expecting_exit(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let stderr_path = std::env::temp_dir().join(format!("{}.stderr", common::unique_instance()));
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut child = Command::new(common::binary())
        .args(args)
        .env("SANDBOXD_INSTANCE", common::unique_instance())
        .env_remove("SANDBOXD_PORT")
        .env_remove("SANDBOXD_CONFIG")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("run sandboxd");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sandboxd accepted {env:?} {args:?} and kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let _ = std::fs::remove_file(&stderr_path);
    (status.code(), text)
}

#[test]
fn bad_configuration_exits_2_with_one_line_naming_the_key() {
    let dir = std::env::temp_dir().join(common::unique_instance());
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let unknown = dir.join("unknown.toml");
    std::fs::write(&unknown, "prot = 8080\n").expect("write");
    let zero = dir.join("zero.toml");
    std::fs::write(&zero, "port = 0\n").expect("write");

    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<&'a str>, &'a str);
    let cases: Vec<Case> = vec![
        (vec![("SANDBOXD_PORT", "eighty")], vec![], "SANDBOXD_PORT"),
        (vec![("SANDBOXD_PORT", "0")], vec![], "port"),
        (
            vec![("SANDBOXD_WORKSPACE_DIR", "workspace")],
            vec![],
            "SANDBOXD_WORKSPACE_DIR",
        ),
        (
            vec![("SANDBOXD_MAX_CONCURRENT", "many")],
            vec![],
            "SANDBOXD_MAX_CONCURRENT",
        ),
        (
            vec![],
            vec!["--config", unknown.to_str().expect("utf8")],
            "prot",
        ),
        (
            vec![],
            vec!["--config", zero.to_str().expect("utf8")],
            "port",
        ),
        (
            vec![("SANDBOXD_CONFIG", zero.to_str().expect("utf8"))],
            vec![],
            "port",
        ),
    ];
    for (env, args, key) in cases {
        let (code, stderr) = run_expecting_exit(&env, &args);
        assert_eq!(code, Some(2), "{env:?} {args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(lines[0].contains(key), "{key} named in: {stderr}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn non_loopback_bind_without_token_refuses_to_start() {
    let (code, stderr) = run_expecting_exit(&[("SANDBOXD_BIND_HOST", "0.0.0.0")], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("SANDBOXD_ADMIN_TOKEN"), "{stderr}");
    assert!(stderr.contains("allow_insecure_no_token"), "{stderr}");
}

#[tokio::test]
async fn insecure_non_loopback_starts_when_explicitly_allowed() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_BIND_HOST", "0.0.0.0")
            .env("SANDBOXD_ALLOW_INSECURE_NO_TOKEN", "true"),
    )
    .await;
    let (status, body) = server.get("/v1/health").await;
    assert_eq!(status, 200, "{body}");
}

/// Forwards a unix socket to the real engine's: an engine that "appears".
async fn forward_socket(listen: std::path::PathBuf, target: std::path::PathBuf) {
    let listener = tokio::net::UnixListener::bind(&listen).expect("bind forwarder");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::UnixStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
}

#[tokio::test]
async fn health_is_503_without_an_engine_and_200_once_it_appears() {
    let dir = std::env::temp_dir().join(common::unique_instance());
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let socket = dir.join("engine.sock");
    let server = TestServer::start_with(
        ServerOptions::default()
            .no_engine()
            .env("SANDBOXD_DOCKER_SOCKET", socket.to_str().expect("utf8")),
    )
    .await;

    let started = Instant::now();
    let (status, body) = server.get("/v1/health").await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "health must not hang"
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["ok"], false);
    assert_eq!(body["engine"], "docker");
    assert!(
        body["error"].as_str().unwrap_or("").contains("engine.sock"),
        "{body}"
    );
    // Domain routes fail fast with 503 meanwhile, never hang or 500.
    let started = Instant::now();
    let (status, body) = server
        .post("/v1/sandboxes", json!({"sessionKey": "k"}))
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "engine_unavailable");
    assert!(started.elapsed() < Duration::from_secs(3));

    forward_socket(socket, "/var/run/docker.sock".into()).await;
    eventually(Duration::from_secs(15), "health turns ok", || async {
        server.get("/v1/health").await.0 == 200
    })
    .await;
    let log = server.log_text();
    assert!(
        log.contains("no Docker engine yet"),
        "said in the log: {log}"
    );
    assert!(
        log.contains("SANDBOXD_DOCKER_SOCKET is set"),
        "why it was chosen: {log}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn token_guards_every_route_but_health() {
    let token = "t0ken-Very-Secret-42";
    let server = TestServer::start_with(ServerOptions::default().token(token)).await;
    let c = &server.client;
    let base = &server.base;
    let routes: Vec<(&str, String)> = vec![
        ("GET", "/v1/sandboxes".into()),
        ("POST", "/v1/sandboxes".into()),
        ("GET", "/v1/sandboxes/0123456789abcdef01234567".into()),
        ("POST", "/v1/sandboxes/0123456789abcdef01234567:stop".into()),
        (
            "POST",
            "/v1/sandboxes/0123456789abcdef01234567:restart".into(),
        ),
    ];
    let body = json!({"sessionKey": "should-never-exist"});
    for (method, path) in &routes {
        let url = format!("{base}{path}");
        let attempts: Vec<reqwest::RequestBuilder> = vec![
            c.request(method.parse().expect("method"), &url),
            c.request(method.parse().expect("method"), &url)
                .header("x-sandboxd-admin-token", "wrong"),
            c.request(method.parse().expect("method"), &url)
                .header("authorization", "Bearer "),
            c.request(
                method.parse().expect("method"),
                format!("{url}?token={token}"),
            ),
            c.request(
                method.parse().expect("method"),
                format!("{url}?admin_token={token}"),
            ),
        ];
        for rb in attempts {
            let resp = rb.json(&body).send().await.expect("send");
            assert_eq!(resp.status().as_u16(), 401, "{method} {path}");
            let v: serde_json::Value = resp.json().await.expect("json error");
            assert_eq!(v["code"], "unauthorized");
        }
    }
    assert!(
        server.containers().await.is_empty(),
        "nothing created without a token"
    );
    assert!(server.volumes().await.is_empty());

    // Health needs no token; each accepted header works.
    assert_eq!(
        c.get(format!("{base}/v1/health"))
            .send()
            .await
            .expect("send")
            .status(),
        200
    );
    for (name, value) in [
        ("x-sandboxd-admin-token", token.to_string()),
        ("x-remcochat-admin-token", token.to_string()),
        ("authorization", format!("Bearer {token}")),
    ] {
        let resp = c
            .get(format!("{base}/v1/sandboxes"))
            .header(name, value)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), 200, "{name}");
    }
    assert!(
        !server.log_text().contains(token),
        "the token must never be logged"
    );
}

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
