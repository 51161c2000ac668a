//! The engine restarted mid-command (issue 9, part 3). This test restarts
//! the Docker daemon, so scripts/test.sh runs it alone, after every other
//! test (a second nextest pass); a guard brings the engine back even when
//! the test fails.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::TestServer;
use futures_util::StreamExt;
use serde_json::{Value, json};

fn ensure_engine() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/ensure-docker.sh");
    let ok = Command::new(script)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "scripts/ensure-docker.sh could not bring the engine back"
    );
}

/// Restarts the engine the way ensure-docker.sh runs it.
fn restart_engine() {
    let _ = Command::new("pkill").args(["-x", "dockerd"]).status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Command::new("pgrep")
        .args(["-x", "dockerd"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "dockerd did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure_engine();
}

struct EngineBack;

impl Drop for EngineBack {
    fn drop(&mut self) {
        ensure_engine();
    }
}

#[tokio::test]
async fn streams_end_with_an_error_and_sandboxes_work_again_after_an_engine_restart() {
    let _engine_back = EngineBack;
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "survivor", "network": {"mode": "none"}}))
        .await;
    let (_, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "while true; do echo tick; sleep 0.2; done", "timeoutMs": 600000}),
        )
        .await;
    let cid = v["commandId"].as_str().expect("cid").to_string();
    let resp = server
        .client
        .get(format!(
            "{}/v1/sandboxes/{sid}/commands/{cid}/logs",
            server.base
        ))
        .send()
        .await
        .expect("logs");
    let reader = tokio::spawn(async move {
        let mut body = resp.bytes_stream();
        let mut text = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            text.extend_from_slice(&chunk);
        }
        String::from_utf8_lossy(&text).into_owned()
    });
    common::eventually(Duration::from_secs(5), "output flows", || async {
        server.get(&format!("/v1/sandboxes/{sid}/commands")).await.1["commands"][0]["state"]
            == "running"
    })
    .await;

    tokio::task::spawn_blocking(restart_engine)
        .await
        .expect("restart");

    // The stream ended (no hang), with an explicit error, then the exit.
    let text = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the log stream ends")
        .expect("reader");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let streams: Vec<&str> = lines.iter().filter_map(|l| l["stream"].as_str()).collect();
    assert!(streams.contains(&"stdout"), "{streams:?}");
    let n = streams.len();
    assert!(
        n >= 2 && streams[n - 2] == "error" && streams[n - 1] == "exit",
        "ends with error, exit: {:?}",
        &streams[n.saturating_sub(3)..]
    );
    let (s, w) = server
        .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
        .await;
    assert_eq!(s, 200, "{w}");

    // sandboxd sees the engine again, and the sandbox works again.
    common::eventually(Duration::from_secs(30), "health is ok again", || async {
        server.get("/v1/health").await.0 == 200
    })
    .await;
    let (s, r) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            json!({"command": "echo back"}),
        )
        .await;
    assert_eq!((s, r["stdout"].clone()), (200, json!("back\n")), "{r}");
    let (s, _) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "newcomer", "network": {"mode": "none"}}),
        )
        .await;
    assert_eq!(s, 200);
}
