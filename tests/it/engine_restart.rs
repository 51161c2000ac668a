//! Tests that stop or pause the Docker daemon, so scripts/test.sh runs
//! them alone, after every other test (a second nextest pass); guards
//! bring the engine back even when a test fails:
//! - the engine restarted mid-command: the log stream ends with an
//!   `error` record, then `exit`, and the sandbox works again;
//! - sandboxd stopped while the engine is making something for it waits
//!   for that, so nothing it asked for appears after it exited.

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

/// Pauses the engine (SIGSTOP to `dockerd`) until dropped, even when the
/// test fails.
struct EnginePaused(String);

impl EnginePaused {
    fn pause() -> EnginePaused {
        let out = Command::new("pgrep")
            .args(["-x", "dockerd"])
            .output()
            .expect("pgrep");
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            !pid.is_empty() && !pid.contains('\n'),
            "one dockerd to pause, found {pid:?}"
        );
        let ok = Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "could not pause dockerd {pid}");
        EnginePaused(pid)
    }
}

impl Drop for EnginePaused {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

/// Whether process `pid` (a child of this test, so a zombie once it has
/// exited and until it is reaped) still runs.
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The engine carries out a request whose client has gone away, so an
/// engine call that sandboxd abandoned when it stopped would make its
/// object after sandboxd exited, where neither its next start nor a
/// cleanup by label that already ran sees it (a test's cleanup left link
/// networks behind that way). Here the call is the link network made
/// ahead for the next `internet` sandbox, which a create sets off; the
/// engine is paused so that the call is certainly under way when the
/// stop comes, and sandboxd must wait for it.
#[tokio::test]
async fn a_stop_waits_for_what_the_engine_is_making_so_nothing_appears_after_exit() {
    // The stop has to come while the engine is making an object, and
    // when that is is a race this test cannot see from outside (a stop
    // during the reads before the network's create, or during the spare
    // proxy's start, finds nothing to wait for). Every attempt checks that
    // nothing appears after exit; one in which sandboxd waited checks the
    // rest. Each attempt pauses the engine a little later than the one
    // before, so that a slower or faster machine does not make every
    // attempt miss the same way.
    for attempt in 1..=ATTEMPTS {
        if stop_during_the_next_link_network(attempt).await {
            return;
        }
    }
    panic!(
        "in {ATTEMPTS} attempts the stop never came while a link network was being made, \
         so this proves nothing"
    );
}

/// How many attempts [`stop_during_the_next_link_network`] gets.
const ATTEMPTS: u32 = 10;

/// One attempt (see above): whether the stop came while the engine was
/// making the next link network, and sandboxd waited for it.
async fn stop_during_the_next_link_network(attempt: u32) -> bool {
    let _engine_back = EngineBack;
    let mut server = TestServer::start().await;
    harness::eventually(
        Duration::from_secs(30),
        "the link network made ahead",
        || server.link_ready(),
    )
    .await;
    let before = server.networks_with("sandboxd.role", "link").await;
    // Takes the network made ahead; making the next one starts once the
    // work after the create's answer is done: connecting to the agent
    // (which a command's answer shows done) and publishing ports (none
    // asked: no engine call). The spare port proxy that came with the
    // network is given back only later.
    let sid = server.create(json!({"sessionKey": "first"})).await;
    let ran = server.sh(&sid, "true").await;
    assert_eq!(ran["exitCode"], 0, "a command in the new sandbox: {ran}");
    let pid = server.pid().expect("sandboxd runs");
    // Background work starts 100 ms after the user's last create ended
    // (`SETTLE` in src/sandbox/foreground.rs): past it, making the next
    // link network (its network, then its spare port proxy) is under way.
    // The attempts pause the engine from 50 to 590 ms after the command.
    std::thread::sleep(Duration::from_millis(50 + 60 * u64::from(attempt - 1)));
    let paused = EnginePaused::pause();
    // Nothing can be answered while the engine is paused: sandboxd's
    // request for the next link network waits at the engine's socket.
    std::thread::sleep(Duration::from_millis(500));
    let ok = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "SIGTERM to sandboxd {pid}");
    std::thread::sleep(Duration::from_secs(1));
    let waited = runs(pid);
    drop(paused);
    let code = server
        .stop_process()
        .expect("sandboxd exits once the engine answers again");
    assert_eq!(code, 0, "sandboxd's exit code");

    let at_exit = server.networks_with("sandboxd.role", "link").await;
    let made: Vec<&String> = at_exit.iter().filter(|n| !before.contains(n)).collect();
    // Nothing more appears: what was asked for was all made before exit.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        let now = server.networks_with("sandboxd.role", "link").await;
        let late: Vec<&String> = now.iter().filter(|n| !at_exit.contains(n)).collect();
        assert!(late.is_empty(), "appeared after sandboxd exited: {late:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !waited {
        eprintln!(
            "attempt {attempt}: sandboxd exited within 1 s of SIGTERM: no engine write was \
             under way when the stop came (nothing appeared after exit); trying again"
        );
        return false;
    }
    assert!(
        !made.is_empty(),
        "sandboxd waited, yet no link network was being made when the stop came \
         (before the create: {before:?}; at exit: {at_exit:?})"
    );
    true
}
