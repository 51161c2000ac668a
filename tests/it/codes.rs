//! Every stable error `code` of the API, produced by a request that earns it.
//!
//! The codes other modules already produce are left to them; these are the
//! ones no other test reaches: each earned through the real binary and the
//! real engine, with its status, its code and a sentence, and where there
//! is one, a positive control showing the same request succeeds once the
//! cause is gone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, b64, eventually};

/// Asserts an error answer: this status, this code, a non-empty sentence.
#[track_caller]
fn assert_error(got: &(u16, Value), status: u16, code: &str, what: &str) {
    let (s, v) = got;
    assert_eq!(
        (*s, v["code"].as_str()),
        (status, Some(code)),
        "{what}: {v}"
    );
    assert!(
        v["error"].as_str().is_some_and(|e| !e.trim().is_empty()),
        "{what}: the error sentence is empty: {v}"
    );
}

async fn read(server: &TestServer, sid: &str, path: &str) -> (u16, Value) {
    server.read_file(sid, path).await
}

async fn write(server: &TestServer, sid: &str, path: &str, content: &[u8]) -> (u16, Value) {
    server
        .write_files(sid, json!([{"path": path, "contentBase64": b64(content)}]))
        .await
}

#[tokio::test]
async fn is_a_directory() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(write(&server, &sid, "d/x", b"x").await.0, 200);
    assert_error(
        &read(&server, &sid, "d").await,
        400,
        "is_a_directory",
        "read of a directory",
    );
    assert_error(
        &read(&server, &sid, "/workspace").await,
        400,
        "is_a_directory",
        "read of the workspace itself",
    );
    assert_error(
        &write(&server, &sid, "d", b"over a dir").await,
        400,
        "is_a_directory",
        "write over a directory",
    );
    // Control: the file in it reads, and the directory is still one.
    assert_eq!(
        read(&server, &sid, "d/x").await,
        (
            200,
            json!({"found": true, "contentBase64": b64(b"x"), "sha256": harness::sha256_hex(b"x")})
        )
    );
    assert_eq!(
        server.sh(&sid, "test -d d && echo dir").await["stdout"],
        "dir\n"
    );
}

#[tokio::test]
async fn permission_denied() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // As the sandbox user (not root), so the kernel holds the mode.
    let r = server
        .sh(
            &sid,
            "id -u && mkdir ro && chmod 555 ro && echo secret > locked && chmod 000 locked",
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");
    assert_eq!(
        r["stdout"], "1000\n",
        "commands run as the sandbox user: {r}"
    );
    assert_error(
        &write(&server, &sid, "ro/x", b"x").await,
        403,
        "permission_denied",
        "write into a 0555 directory",
    );
    assert_error(
        &read(&server, &sid, "locked").await,
        403,
        "permission_denied",
        "read of a 0000 file",
    );
    // Nothing was left in ro; a normal directory takes the same write.
    assert_eq!(server.sh(&sid, "ls -A ro | wc -l").await["stdout"], "0\n");
    assert_eq!(
        write(&server, &sid, "ok/x", b"x").await,
        (200, json!({"ok": true}))
    );
    assert_eq!(
        read(&server, &sid, "ok/x").await,
        (
            200,
            json!({"found": true, "contentBase64": b64(b"x"), "sha256": harness::sha256_hex(b"x")})
        )
    );
}

/// Flips `d` between a real directory and a symlink to `other` (both in
/// the workspace, both holding `x`) as fast as it can, for as many
/// seconds as its argument says.
/// With renameat2(RENAME_EXCHANGE) the swap is atomic: `d` always exists.
/// Where that is refused, it falls back to rename + symlink, and `d` is
/// missing for a moment on every round; then only reads race it (a write
/// would make `d` in that moment and stop the loop). The first line of
/// output says which.
const SWAPPER: &str = r#"
import ctypes, os, sys, time
os.makedirs('real', exist_ok=True)
os.makedirs('other', exist_ok=True)
open('real/x', 'w').write('real')
open('other/x', 'w').write('other')
os.rename('real', 'd')
os.symlink('other', 'l')
libc = ctypes.CDLL(None, use_errno=True)
def exchange():
    return libc.renameat2(-100, b'd', -100, b'l', 2) == 0
atomic = exchange()
print('atomic' if atomic else 'fallback errno %d' % ctypes.get_errno(), flush=True)
if not atomic:
    os.unlink('l')
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    if atomic:
        exchange()
    else:
        os.rename('d', 'd.tmp')
        os.symlink('other', 'd')
        os.unlink('d')
        os.rename('d.tmp', 'd')
    n += 1
print('swaps', n, flush=True)
"#;

#[tokio::test]
async fn path_changed() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "swap.py", "contentBase64": b64(SWAPPER)}]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let swapper = server
        .start_command(
            &sid,
            json!({"command": "exec python3 swap.py 40", "timeoutMs": 120000}),
        )
        .await;
    let first = server
        .output_until(&sid, &swapper, "\n", Duration::from_secs(20))
        .await;
    let atomic = first.starts_with("atomic");
    eprintln!(
        "swapper: {}{}",
        first.trim(),
        if atomic {
            ""
        } else {
            " (renameat2 RENAME_EXCHANGE refused, as gVisor does: d goes missing for a moment on \
             every swap, and only reads race it)"
        }
    );

    let started = Instant::now();
    let bound = Duration::from_secs(25);
    let (mut reads, mut writes, mut ok, mut missing, mut changed) = (0u32, 0u32, 0u32, 0u32, 0u32);
    let mut first_changed: Option<Value> = None;
    // Any other answer, by operation, status and code: count, first seen.
    let mut unexpected: BTreeMap<String, (u32, Value)> = BTreeMap::new();
    // At least MIN_REQUESTS, so that a wrong answer that comes one time in
    // ten is seen too, then until the first path_changed.
    const MIN_REQUESTS: u32 = 400;
    while started.elapsed() < bound
        && reads + writes < 5000
        && (changed == 0 || reads + writes < MIN_REQUESTS)
    {
        // Writes only where `d` never disappears (see SWAPPER).
        let use_write = atomic && (reads + writes) % 2 == 1;
        let (s, v) = if use_write {
            writes += 1;
            write(&server, &sid, "d/x", b"written").await
        } else {
            reads += 1;
            read(&server, &sid, "d/x").await
        };
        let content = v["contentBase64"].as_str().unwrap_or("").to_string();
        match (s, v["code"].as_str()) {
            (200, _) if use_write && v == json!({"ok": true}) => ok += 1,
            (200, _)
                if !use_write
                    && v["found"] == true
                    && [b64(b"real"), b64(b"other"), b64(b"written")].contains(&content) =>
            {
                ok += 1
            }
            (200, _) if !use_write && !atomic && v == json!({"found": false}) => missing += 1,
            (409, Some("path_changed"))
                if v["error"].as_str().is_some_and(|e| !e.trim().is_empty()) =>
            {
                changed += 1;
                first_changed.get_or_insert(v);
            }
            _ => {
                let op = if use_write { "write" } else { "read" };
                let key = format!("{op} -> {s} {}", v["code"].as_str().unwrap_or("-"));
                unexpected.entry(key).or_insert((0, v)).0 += 1;
            }
        }
    }
    let took = started.elapsed();
    let stats = format!(
        "{} swaps; {reads} reads, {writes} writes in {took:?}: {ok} ok, {missing} found:false, \
         {changed} path_changed, other answers: {unexpected:?}",
        if atomic { "atomic" } else { "rename+symlink" }
    );
    eprintln!("path_changed race: {stats}");
    let (s, list) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert_eq!(s, 200);
    let swapping = list["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .any(|c| c["commandId"] == json!(swapper) && c["state"] == "running");
    assert!(swapping, "the swapper stopped before the end: {list}");
    assert!(
        unexpected.is_empty(),
        "answers other than 200 and 409 path_changed while d was swapped: {stats}"
    );
    assert!(changed > 0, "no 409 path_changed: {stats}");
    eprintln!("first path_changed: {}", first_changed.unwrap_or_default());
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{swapper}:kill"),
            json!(null),
        )
        .await;
    assert_eq!(s, 200);
    server.wait_command(&sid, &swapper).await;
}

#[tokio::test]
async fn too_many_processes() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_PIDS_LIMIT", "64")).await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, "echo before").await["stdout"], "before\n");
    // A running command takes every process there is and keeps them.
    let holder = server
        .start_command(
            &sid,
            json!({"command": "for i in $(seq 200); do sleep 600 & done; wait", "timeoutMs": 600000}),
        )
        .await;
    // bash says so when fork fails for want of processes.
    let _ = server
        .output_until(
            &sid,
            &holder,
            "Resource temporarily unavailable",
            Duration::from_secs(60),
        )
        .await;
    let t = Instant::now();
    let got = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "echo never"}),
        )
        .await;
    eprintln!("the refused start took {:?}", t.elapsed());
    assert_error(
        &got,
        429,
        "too_many_processes",
        "a command at the pids limit",
    );
    let got = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            json!({"command": "echo never"}),
        )
        .await;
    assert_error(
        &got,
        429,
        "too_many_processes",
        "commands:run at the pids limit",
    );
    // Control: once the holder is killed, a command runs again.
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{holder}:kill"),
            json!(null),
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok": true})));
    let w = server.wait_command(&sid, &holder).await;
    assert_eq!(w["killed"], true, "{w}");
    let r = server.sh(&sid, "echo after").await;
    assert_eq!(
        (r["exitCode"].clone(), r["stdout"].clone()),
        (json!(0), json!("after\n")),
        "{r}"
    );
}

/// A proxy image the engine lacks: the port's GET is answered
/// `engine_error`, and it is the engine that failed (sandboxd's log has the
/// engine's own "No such image" for that image). Positive control: once
/// the engine has an image by that name (the runtime image, tagged so), the
/// same GET on the same server publishes the port.
#[tokio::test]
async fn engine_error() {
    // A name of this test's own, so that no other test's tag can make it
    // exist.
    let repo = "sandboxd-no-such-image";
    let tag = harness::unique_instance();
    let missing = format!("{repo}:{tag}");
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_PROXY_IMAGE", &missing))
            .await;
    let sid = server
        .create(json!({"sessionKey": harness::unique_instance(), "ports": [3000]}))
        .await;
    let got = server.get(&format!("/v1/sandboxes/{sid}/ports/3000")).await;
    assert_error(
        &got,
        502,
        "engine_error",
        "a port whose proxy image is missing",
    );
    let log = server.log_text();
    assert!(
        log.lines().any(|l| l.contains("engine call failed")
            && l.contains("No such image")
            && l.contains(&missing)),
        "the engine refused for want of {missing}; sandboxd's log:\n{log}"
    );
    // Nothing was pulled, and the sandbox itself is fine.
    assert!(
        server.docker.inspect_image(&missing).await.is_err(),
        "{missing} must not have been pulled"
    );
    assert_eq!(server.sh(&sid, "echo fine").await["stdout"], "fine\n");

    // The engine given the image: the same call now succeeds.
    server
        .docker
        .tag_image(
            "sandboxd-runtime:latest",
            Some(bollard::query_parameters::TagImageOptions {
                repo: Some(repo.to_string()),
                tag: Some(tag.clone()),
            }),
        )
        .await
        .expect("tag the runtime image as the proxy image");
    let _untag = harness::ImageGuard(server.docker.clone(), missing.clone());
    let (s, v) = server.get(&format!("/v1/sandboxes/{sid}/ports/3000")).await;
    assert_eq!(
        (s, &v["found"]),
        (200, &json!(true)),
        "with {missing} there, the port is published: {v}"
    );
    assert!(v["hostPort"].as_u64().is_some_and(|p| p > 0), "{v}");
}

#[tokio::test]
async fn agent_failed() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_AGENT_TIMEOUT_MS", "2000"))
            .await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, "echo before").await["stdout"], "before\n");
    // What the workspace holds before: it must be there after the restart.
    let kept = format!(
        "written before the agent stopped, {}",
        harness::unique_instance()
    );
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "kept/before.bin", "contentBase64": b64(&kept)}]),
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok": true})));
    let started_at = server.inspect(&sid).await.state.and_then(|s| s.started_at);
    let (code, out) = server
        .docker_exec(&sid, "pkill -STOP -f '^/.sandboxd/sandboxd-agent serve'")
        .await;
    assert_eq!(code, 0, "the agent was found and stopped: {out}");
    let t = Instant::now();
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        server.post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "echo stuck"}),
        ),
    )
    .await
    .expect("a stopped agent is answered within 10 s");
    eprintln!("agent_failed after {:?}", t.elapsed());
    assert_error(
        &got,
        502,
        "agent_failed",
        "a command while the agent is stopped",
    );
    // sandboxd recovers: the sandbox is restarted and commands run again.
    let t = Instant::now();
    let mut answers = Vec::new();
    loop {
        let (s, v) = server
            .post(
                &format!("/v1/sandboxes/{sid}/commands:run"),
                json!({"command": "echo again"}),
            )
            .await;
        if s == 200 {
            assert_eq!(v["stdout"], "again\n", "{v}");
            break;
        }
        assert_eq!(
            (s, v["code"].as_str()),
            (502, Some("agent_failed")),
            "while recovering: {v}"
        );
        answers.push(s);
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no command ran within 60 s of agent_failed ({} more 502s)",
            answers.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "a command ran again after {:?} ({} more agent_failed first)",
        t.elapsed(),
        answers.len()
    );
    assert_eq!(server.get("/v1/health").await.0, 200);
    // The container really started again (else a kept workspace proves
    // nothing), and the workspace came through it.
    let restarted_at = server.inspect(&sid).await.state.and_then(|s| s.started_at);
    assert_ne!(
        restarted_at, started_at,
        "the sandbox's container was restarted"
    );
    let (s, v) = server.read_file(&sid, "kept/before.bin").await;
    assert_eq!(
        (s, &v["found"], &v["contentBase64"]),
        (200, &json!(true), &json!(b64(&kept))),
        "the workspace is kept across the restart"
    );
}

/// A /29 pool of one block, in a range no other test uses, different per
/// test process.
fn one_block_pool() -> String {
    let i = std::process::id() % 4096;
    format!("10.214.{}.{}/28", i / 16, (i % 16) * 16)
}

#[tokio::test]
async fn port_publish_failed() {
    let pool = one_block_pool();
    // Mode open makes its link network at the first port (the egress
    // modes at create), so the pool runs out at a port's GET.
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_LINK_SUBNET_POOL", &pool)
            .env("SANDBOXD_NETWORK_MODES", "none,internet,allowlist,open"),
    )
    .await;
    // The link network made ahead for the next `internet` sandbox holds
    // the only block first; the first sandbox that needs one takes it.
    eventually(
        Duration::from_secs(30),
        "the link network made ahead",
        || server.link_ready(),
    )
    .await;
    let open = json!({"mode": "open"});
    let first = server
        .create(json!({"sessionKey": harness::unique_instance(), "ports": [3000], "network": open}))
        .await;
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{first}/ports/3000"))
        .await;
    assert_eq!(
        s, 200,
        "the first sandbox takes the only block of {pool}: {v}"
    );
    assert_eq!(v["found"], true, "{v}");
    assert!(
        !server.link_ready().await,
        "the block made ahead was given back"
    );
    let second = server
        .create(json!({"sessionKey": harness::unique_instance(), "ports": [3000], "network": open}))
        .await;
    let got = server
        .get(&format!("/v1/sandboxes/{second}/ports/3000"))
        .await;
    assert_error(
        &got,
        502,
        "port_publish_failed",
        "a second link network from a one-block pool",
    );
    assert!(
        got.1["error"].as_str().unwrap_or("").contains("no free"),
        "{}",
        got.1
    );
    // A create in an egress mode needs its block at once: 429.
    let egress = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": harness::unique_instance(), "network": {"mode": "internet"}}),
        )
        .await;
    assert_error(
        &egress,
        429,
        "at_capacity",
        "an internet sandbox from a used-up pool",
    );
    assert!(
        egress.1["error"]
            .as_str()
            .unwrap_or("")
            .contains("link_subnet_pool"),
        "{}",
        egress.1
    );
    // Control: once the first sandbox gives its block back, the second
    // publishes.
    let (s, _) = server
        .post(&format!("/v1/sandboxes/{first}:stop"), json!(null))
        .await;
    assert_eq!(s, 200);
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{second}/ports/3000"))
        .await;
    assert_eq!((s, v["found"].clone()), (200, json!(true)), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down() {
    // Debug-level request lines say when the wait has reached sandboxd.
    let mut server =
        TestServer::start_with(ServerOptions::default().env("RUST_LOG", "info,tower_http=debug"))
            .await;
    let sid = server.offline_sandbox().await;
    let cid = server
        .start_command(&sid, json!({"command": "sleep 600", "timeoutMs": 600000}))
        .await;
    let wait_path = format!("/v1/sandboxes/{sid}/commands/{cid}/wait");
    let open = {
        let url = format!("{}{wait_path}", server.base);
        let client = server.client.clone();
        tokio::spawn(async move {
            let resp = client.get(url).send().await.expect("the wait is answered");
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.expect("a JSON answer");
            (status, v)
        })
    };
    eventually(Duration::from_secs(10), "the wait reached sandboxd", || {
        let log = server.log_text();
        let path = wait_path.clone();
        async move {
            log.lines()
                .any(|l| l.contains(&path) && l.contains("started processing request"))
        }
    })
    .await;
    assert!(
        !open.is_finished(),
        "the wait is open while the command runs"
    );
    let exit = server.stop_process();
    let got = tokio::time::timeout(Duration::from_secs(10), open)
        .await
        .expect("the open wait is answered when sandboxd shuts down")
        .expect("the wait task");
    assert_error(&got, 503, "shutting_down", "a wait open at shutdown");
    assert_eq!(exit, Some(0), "sandboxd exits cleanly on SIGTERM");
}
