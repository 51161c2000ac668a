//! The engine restarted mid-command: the log stream ends with an `error`
//! record, then `exit`, and the sandbox works again. This test restarts the
//! Docker daemon, so scripts/test.sh runs it alone, after every other test
//! (a second nextest pass); a guard brings the engine back even when the
//! test fails.

use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::harness::{self, TestServer};

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
    // Through systemd when it manages the engine; else the way
    // scripts/ensure-docker.sh runs it (our machines).
    let systemd = Command::new("systemctl")
        .args(["is-active", "--quiet", "docker"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if systemd {
        let ok = Command::new("systemctl")
            .args(["restart", "docker"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "systemctl restart docker failed");
        ensure_engine();
        return;
    }
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
    let resp = server.open_logs(&sid, &cid).await;
    // The reader notes when the first output arrived: the engine is only
    // restarted once the command demonstrably runs.
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let seen = std::sync::Arc::clone(&seen);
        tokio::spawn(async move {
            let mut body = resp.bytes_stream();
            let mut text = Vec::new();
            while let Some(Ok(chunk)) = body.next().await {
                text.extend_from_slice(&chunk);
                if String::from_utf8_lossy(&text).contains("tick") {
                    seen.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    harness::eventually(Duration::from_secs(10), "output flows", || {
        let seen = std::sync::Arc::clone(&seen);
        async move { seen.load(std::sync::atomic::Ordering::Relaxed) }
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
    assert_eq!((s, w["exitCode"].clone()), (200, json!(137)), "{w}");

    // sandboxd sees the engine again, and the sandbox works again.
    harness::eventually(Duration::from_secs(30), "health is ok again", || async {
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
