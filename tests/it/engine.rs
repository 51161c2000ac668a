//! Finding the engine: with no engine at its socket sandboxd still starts,
//! says so in health (503) and its log, answers sandbox routes with 503 at
//! once, and connects when the engine appears.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{self, ServerOptions, TestServer, eventually};

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
    let dir = std::env::temp_dir().join(harness::unique_instance());
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
