//! The abuse suite (issue 9, part 2) against the real binary and engine:
//! memory past the limit, a full /tmp, a crowd of commands, a swarm of
//! orphans, and an output flood to a reader that barely reads. Each time
//! sandboxd and the other sandboxes must carry on. (The fork bomb is in
//! tests/commands.rs.)

mod common;

use std::time::{Duration, Instant};

use common::{ServerOptions, TestServer};
use futures_util::StreamExt;
use serde_json::{Value, json};

async fn run(server: &TestServer, sid: &str, script: &str, timeout_ms: u64) -> Value {
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            json!({"command": script, "timeoutMs": timeout_ms}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    v
}

#[tokio::test]
async fn memory_past_the_limit_is_killed_and_nothing_else_notices() {
    let server = TestServer::start().await;
    let hog = server.create(json!({"sessionKey": "hog", "resources": {"memoryMb": 256}, "network": {"mode": "none"}})).await;
    let calm = server
        .create(json!({"sessionKey": "calm", "network": {"mode": "none"}}))
        .await;
    let r = run(
        &server,
        &hog,
        "python3 -c 'a = bytearray(512 * 1024 * 1024); print(len(a))'",
        60000,
    )
    .await;
    assert_eq!(r["exitCode"], 137, "the OOM killer ends it: {r}");
    assert_eq!(
        run(&server, &calm, "echo fine", 10000).await["stdout"],
        "fine\n"
    );
    assert_eq!(
        run(&server, &hog, "echo still here", 10000).await["stdout"],
        "still here\n"
    );
    assert_eq!(server.get("/v1/health").await.0, 200);
}

#[tokio::test]
async fn a_full_tmp_says_enospc_at_its_size() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_TMP_SIZE_MB", "16")).await;
    let sid = server
        .create(json!({"sessionKey": "tmp", "network": {"mode": "none"}}))
        .await;
    let r = run(
        &server,
        &sid,
        "head -c 32M /dev/zero > /tmp/fill; echo rc=$?; du -m /tmp/fill | cut -f1",
        30000,
    )
    .await;
    let out = r["stdout"].as_str().unwrap_or("");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("No space left on device"),
        "{r}"
    );
    assert!(out.starts_with("rc=1\n"), "{r}");
    let mb: u32 = out
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("size");
    assert!((15..=16).contains(&mb), "stopped at the 16 MB size: {mb}");
    assert_eq!(
        run(&server, &sid, "rm /tmp/fill && echo ok", 10000).await["stdout"],
        "ok\n"
    );
}

#[tokio::test]
async fn a_crowd_of_commands_gets_429_past_the_limit_and_leaves_nothing() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_MAX_RUNNING_COMMANDS", "40"))
            .await;
    let sid = server
        .create(json!({"sessionKey": "crowd", "network": {"mode": "none"}}))
        .await;
    let path = format!("/v1/sandboxes/{sid}/commands");
    let results = futures_util::future::join_all(
        (0..200).map(|_| server.post(&path, json!({"command": "sleep 3; echo done"}))),
    )
    .await;
    let ok: Vec<String> = results
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, v)| v["commandId"].as_str().expect("id").to_string())
        .collect();
    let refused = results
        .iter()
        .filter(|(s, v)| *s == 429 && v["code"] == "too_many_commands")
        .count();
    assert_eq!(ok.len(), 40, "exactly the limit runs");
    assert_eq!(refused, 160, "the rest get a clear 429");
    for cid in &ok {
        let (s, w) = server
            .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
            .await;
        assert_eq!((s, w["exitCode"].clone()), (200, json!(0)), "{w}");
    }
    let (_, view) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(view["runningCommands"], 0);
    let ps = run(
        &server,
        &sid,
        "ps -eo args --no-headers | grep -c '^sleep 3$' || true",
        10000,
    )
    .await;
    assert_eq!(ps["stdout"], "0\n", "nothing left behind");
}

#[tokio::test]
async fn a_thousand_orphans_leave_no_zombies() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "orphans", "network": {"mode": "none"}}))
        .await;
    let r = run(
        &server,
        &sid,
        "for i in $(seq 1000); do (sleep 0.01 &); done; sleep 1; echo spawned",
        60000,
    )
    .await;
    assert_eq!(r["stdout"], "spawned\n");
    common::eventually(Duration::from_secs(10), "no zombies", || async {
        let z = run(
            &server,
            &sid,
            "ps -eo stat --no-headers | grep -c '^Z' || true",
            10000,
        )
        .await;
        z["stdout"] == "0\n"
    })
    .await;
}

#[tokio::test]
async fn a_flood_to_a_reader_that_barely_reads_stays_bounded_and_times_out() {
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_OUTPUT_BUFFER_BYTES", "1048576"),
    )
    .await;
    let sid = server
        .create(json!({"sessionKey": "flood", "network": {"mode": "none"}}))
        .await;
    let pid = server.pid().expect("pid");
    let before = common::rss_kb(pid);
    let (_, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "yes flood", "timeoutMs": 4000}),
        )
        .await;
    let cid = v["commandId"].as_str().expect("cid").to_string();
    let resp = server.open_logs(&sid, &cid).await;
    let mut body = resp.bytes_stream();
    // Read a little, then nothing for a while, twice: the command floods on.
    let mut peak = before;
    for _ in 0..2 {
        let _ = body.next().await;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            peak = peak.max(common::rss_kb(pid));
        }
    }
    // The timeout fired regardless of the slow reader.
    let started = Instant::now();
    let (s, w) = server
        .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
        .await;
    assert_eq!(
        (s, w["timedOut"].clone(), w["exitCode"].clone()),
        (200, json!(true), json!(124)),
        "{w}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let growth_mb = peak.saturating_sub(before) / 1024;
    assert!(growth_mb < 64, "RSS grew {growth_mb} MB with a 1 MB ring");
    // The reader, once it reads on, gets told what it missed and the end.
    let mut text = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("\"stream\":\"dropped\""), "drops reported");
    assert!(
        text.trim_end().ends_with('}') && text.contains("\"stream\":\"exit\""),
        "the stream ends with the exit record"
    );
    // Disconnecting readers change nothing either.
    let (_, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "yes gone", "timeoutMs": 2000}),
        )
        .await;
    let cid = v["commandId"].as_str().expect("cid").to_string();
    for _ in 0..3 {
        let resp = server.open_logs(&sid, &cid).await;
        let mut b = resp.bytes_stream();
        let _ = b.next().await;
        drop(b);
    }
    let (_, w) = server
        .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
        .await;
    assert_eq!(w["timedOut"], true);
    assert_eq!(server.get("/v1/health").await.0, 200);
}
