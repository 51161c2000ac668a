//! Observability: Prometheus metrics (behind the token) and their counts,
//! request ids in answers and in the log, JSON log lines.

use serde_json::json;

use crate::harness::{self, ServerOptions, TestServer};

#[tokio::test]
async fn metrics_count_requests_sandboxes_and_commands() {
    let token = "metrics-token";
    let server = TestServer::start_with(ServerOptions::default().token(token)).await;
    let sid = server
        .create(json!({"sessionKey": "m", "network": {"mode": "none"}}))
        .await;
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            json!({"command": "exit 3"}),
        )
        .await;
    assert_eq!(s, 200);
    let unauthorized = server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .expect("send");
    assert_eq!(unauthorized.status(), 401, "metrics need the token");
    let resp = server
        .client
        .get(format!("{}/metrics", server.base))
        .header("x-sandboxd-admin-token", token)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/plain"))
    );
    let text = resp.text().await.expect("body");
    for needle in [
        "sandboxd_sandboxes{state=\"running\"} 1",
        "sandboxd_sandbox_events_total{event=\"created\"} 1",
        "sandboxd_commands_started_total 1",
        "sandboxd_commands_ended_total{outcome=\"exit_nonzero\"} 1",
        "sandboxd_command_duration_seconds_bucket",
        "sandboxd_create_duration_seconds_bucket",
        "sandboxd_http_requests_total{route=\"/v1/sandboxes\",method=\"POST\",status=\"200\"} 1",
        "route=\"/v1/sandboxes/{id}/commands:run\"",
        "sandboxd_http_request_duration_seconds_bucket",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    assert!(!text.contains(&sid), "no ids in labels (unbounded)");
}

#[tokio::test]
async fn every_answer_carries_a_request_id_that_the_log_shows() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_LOG_FORMAT", "json")
            .env("RUST_LOG", "info,tower_http=debug"),
    )
    .await;
    let resp = server
        .client
        .get(format!("{}/v1/nope", server.base))
        .send()
        .await
        .expect("send");
    let id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("x-request-id")
        .to_string();
    assert_eq!(id.len(), 16);
    let resp = server
        .client
        .get(format!("{}/v1/health", server.base))
        .header("x-request-id", "from-the-caller")
        .send()
        .await
        .expect("send");
    assert_eq!(
        resp.headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok()),
        Some("from-the-caller")
    );
    harness::eventually(
        std::time::Duration::from_secs(5),
        "the id is in the log",
        || async { server.log_text().contains(&id) },
    )
    .await;
    for line in server.log_text().lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
}
