//! The agent inside every sandbox: commands that end with their own
//! process, leftovers that stay recorded and killable, runaways of finished
//! commands ended so new commands start, why a command ended, output not
//! lost to a reader who keeps reading, any image, and a sandbox whose agent
//! is killed.

use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, eventually};

/// A request to a URL from the test, as a user's browser would make it.
async fn fetch(url: &str) -> Option<String> {
    let resp = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .ok()?;
    resp.status()
        .is_success()
        .then_some(resp)?
        .text()
        .await
        .ok()
}

/// The command list entry of `cid`.
async fn listed(server: &TestServer, sid: &str, cid: &str) -> Value {
    let (_, v) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    v["commands"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["commandId"] == json!(cid)).cloned())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_background_server_ends_its_command_at_once_and_keeps_serving() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "bg", "ports": [3000]}))
        .await;
    server
        .write_files(
            &sid,
            json!([{"path": "index.html", "contentBase64": harness::b64(b"hello\n")}]),
        )
        .await;
    // What a model writes: the server's output goes to the command's pipes.
    let t = Instant::now();
    let bg = server
        .run(
            &sid,
            json!({"cmd": "bash", "args": ["-lc", "cd /vercel/sandbox/workspace && python3 -m http.server 3000 &"]}),
        )
        .await;
    let took = t.elapsed();
    assert_eq!(bg["exitCode"], 0, "{bg}");
    assert!(
        took < Duration::from_secs(1),
        "ended with its shell: {took:?}"
    );
    let t = Instant::now();
    let next = server.sh(&sid, "echo next").await;
    assert_eq!(next["stdout"], "next\n");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "the next command is not held up: {:?}",
        t.elapsed()
    );
    let (_, v) = server
        .get(&format!("/v1/sandboxes/{sid}/ports/3000?waitMs=10000"))
        .await;
    assert_eq!(v["ready"], true, "{v}");
    let url = format!("{}/index.html", v["url"].as_str().expect("url"));
    // The server logs every request to its stderr, which is the finished
    // command's pipe: requests keep being served, and the lines recorded.
    for _ in 0..3 {
        assert_eq!(fetch(&url).await.as_deref(), Some("hello\n"));
    }
    let (_, list) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    let entry = list["commands"]
        .as_array()
        .and_then(|l| {
            l.iter()
                .find(|c| c["processes"].as_u64().unwrap_or(0) > 0)
                .cloned()
        })
        .expect("the server's command lists its leftover");
    assert_eq!(entry["state"], "exited");
    let cid = entry["commandId"].as_str().expect("id").to_string();
    let exit_seq = server
        .log_records(&sid, &cid, "")
        .await
        .last()
        .map(|r| r["seq"].clone())
        .expect("exit record");
    // Its later output: past the exit record, with ?leftovers=true.
    let resp = server
        .client
        .get(format!(
            "{}/v1/sandboxes/{sid}/commands/{cid}/logs?after={exit_seq}&leftovers=true",
            server.base
        ))
        .send()
        .await
        .expect("logs");
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !text.contains("GET /index.html") {
        assert!(Instant::now() < deadline, "the request log lines: {text}");
        match tokio::time::timeout(Duration::from_secs(5), body.next()).await {
            Ok(Some(Ok(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            other => panic!("the leftovers' stream ended early: {other:?} {text}"),
        }
    }
    // And it is killable: the server goes, the stream ends.
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
            json!(null),
        )
        .await;
    assert_eq!(s, 200);
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(chunk)) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(rest.is_ok(), "the stream ends once the leftovers are gone");
    eventually(Duration::from_secs(5), "the URL stops serving", || async {
        fetch(&url).await.is_none()
    })
    .await;
    assert_eq!(listed(&server, &sid, &cid).await["processes"], 0);
}

#[tokio::test]
async fn a_process_runaway_left_by_a_finished_command_is_ended() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_PIDS_LIMIT", "96")).await;
    let sid = server.offline_sandbox().await;
    // The command ends at once; what it leaves forks until the limit.
    let left = server
        .run(
            &sid,
            json!({"command": "nohup bash -c 'while :; do sleep 600 & done' >/dev/null 2>bomb.err & echo started"}),
        )
        .await;
    assert_eq!(left["stdout"], "started\n");
    let bomb = Instant::now();
    let (_, list) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    let cid = list["commands"][0]["commandId"]
        .as_str()
        .expect("the runaway's command")
        .to_string();
    // Polled until the limit is reached, seen one of two ways, neither
    // needing a new process in the sandbox. Bash says in its stderr (a
    // workspace file, read through the files API) that a fork was refused
    // for want of processes: the limit itself (the pids cgroup's under
    // runc; under gVisor, whose cgroup files show no limit, RLIMIT_NPROC).
    // Or the agent has already ended the runaway for coming within its
    // headroom (16) of the limit, and said so in the command's log: under
    // gVisor forks are slow, and its check every 250 ms often comes first.
    let deadline = bomb + Duration::from_secs(30);
    let seen = loop {
        let (_, v) = server.read_file(&sid, "bomb.err").await;
        let err = v["contentBase64"]
            .as_str()
            .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
            .unwrap_or_default();
        if String::from_utf8_lossy(&err).contains("fork: retry: Resource temporarily unavailable") {
            break "bash's fork was refused";
        }
        if listed(&server, &sid, &cid).await["processes"] == 0 {
            let records = server.log_records(&sid, &cid, "?leftovers=true").await;
            let ended_at_limit = records.iter().any(|r| {
                r["stream"] == "error"
                    && r["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("pids limit"))
            });
            assert!(
                ended_at_limit,
                "the runaway ended without reaching the pids limit: {records:?}"
            );
            break "the agent ended the runaway at the limit";
        }
        assert!(
            Instant::now() < deadline,
            "the runaway did not reach the pids limit within 30 s: no fork refused, and \
             its processes still run"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // From the limit reached, a new command must run within 5 s.
    let t = Instant::now();
    let ok = server.sh(&sid, "echo ok").await;
    assert_eq!(ok["stdout"], "ok\n", "{ok}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a new command within 5 s of the pids limit reached: {:?}",
        t.elapsed()
    );
    eprintln!(
        "the pids limit was reached ({seen}) {:?} after the runaway started; a new command \
         ran {:?} after that",
        t - bomb,
        t.elapsed()
    );
    // The leftovers were ended, and the log of their command says so.
    eventually(
        Duration::from_secs(10),
        "the leftovers are gone",
        || async { listed(&server, &sid, &cid).await["processes"] == 0 },
    )
    .await;
    let records = server.log_records(&sid, &cid, "?leftovers=true").await;
    let why = records
        .iter()
        .find(|r| r["stream"] == "error")
        .unwrap_or_else(|| panic!("an error record says why: {records:?}"));
    assert!(
        why["message"].as_str().unwrap_or("").contains("pids limit"),
        "{why}"
    );
}

/// Watches the sandbox's cgroup (v2 or v1) until its peak memory usage
/// reaches 90% of its limit, then says so and ends. Only bash builtins
/// after the start (a FIFO of its own stands in for `sleep`), so it runs
/// on without a new process.
const MEMORY_WATCHER: &str = r#"mkfifo .tick && exec 9<>.tick && rm .tick || exit 1
c=/sys/fs/cgroup
if [ -e $c/memory.max ]; then
  read max < $c/memory.max; f=$c/memory.peak; [ -e $f ] || f=$c/memory.current
else
  read max < $c/memory/memory.limit_in_bytes; f=$c/memory/memory.max_usage_in_bytes
fi
echo "watching $f against $max"
while read n < $f && [ $((n * 10)) -lt $((max * 9)) ]; do read -t 0.02 -u 9; done
if [ $((n * 10)) -ge $((max * 9)) ]; then echo "reached $n of $max"; else echo "cannot read $f"; fi
"#;

/// Under gVisor the memory limit takes the sandbox's kernel along (see
/// README, gVisor): there the whole sandbox starts again instead, and the
/// test says so.
#[tokio::test]
async fn a_memory_runaway_left_by_a_finished_command_is_ended_or_under_gvisor_its_sandbox_restarts()
{
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "mem", "network": {"mode": "none"}, "resources": {"memoryMb": 256}}))
        .await;
    // Pages it writes (a zeroed bytearray would only map them).
    let hog =
        "import time\na = []\nwhile True:\n    a.append(b'x' * (8 << 20))\n    time.sleep(0.01)\n";
    server
        .write_files(
            &sid,
            json!([{"path": "hog.py", "contentBase64": harness::b64(hog.as_bytes())}]),
        )
        .await;
    // Where the limit can be seen being reached. Under runc: the sandbox's
    // cgroup, read by a watcher command started before the hog (a running
    // command is never ended to make room, and it reads with bash builtins
    // only, needing no new process): the peak usage (cgroup v2's
    // memory.peak, or memory.current where the kernel has none; v1's
    // max_usage_in_bytes) at 90% of the limit, where the agent ends
    // leftovers. Under gVisor the cgroup files inside show no limit, and
    // the limit takes the sandbox's kernel along: the engine sees its
    // container stop (or start again, if sandboxd was quicker than us).
    let watcher = if harness::under_gvisor() {
        None
    } else {
        let cid = server
            .start_command(&sid, json!({"command": MEMORY_WATCHER, "timeoutMs": 60000}))
            .await;
        server
            .output_until(&sid, &cid, "watching", Duration::from_secs(10))
            .await;
        Some(cid)
    };
    let started_at = server.inspect(&sid).await.state.and_then(|s| s.started_at);
    let left = server
        .sh(&sid, "nohup python3 hog.py >/dev/null 2>&1 & echo started")
        .await;
    assert_eq!(left["stdout"], "started\n");
    match &watcher {
        Some(cid) => {
            let out = server
                .output_until(&sid, cid, "reached", Duration::from_secs(30))
                .await;
            eprintln!("memory watcher: {}", out.trim().replace('\n', "; "));
        }
        None => {
            eventually(
                Duration::from_secs(30),
                "the hog reaches the memory limit (the sandbox's container stops)",
                || async {
                    let state = server.inspect(&sid).await.state;
                    let running = state.as_ref().and_then(|s| s.running);
                    let now = state.and_then(|s| s.started_at);
                    running == Some(false) || now != started_at
                },
            )
            .await;
        }
    }
    // From the limit reached, a new command.
    let t = Instant::now();
    let ok = server.sh(&sid, "echo ok").await;
    assert_eq!(ok["stdout"], "ok\n", "{ok}");
    let within = if harness::under_gvisor() {
        eprintln!("under gVisor the runaway ends the sandbox's kernel; the sandbox restarts");
        Duration::from_secs(30)
    } else {
        Duration::from_secs(5)
    };
    assert!(
        t.elapsed() < within,
        "a new command within {within:?}: {:?}",
        t.elapsed()
    );
    eventually(Duration::from_secs(10), "the hog is gone", || async {
        server.sh(&sid, "pgrep -f '[h]og.py' || echo none").await["stdout"] == "none\n"
    })
    .await;
}

#[tokio::test]
async fn an_exit_says_whether_the_memory_limit_killed_it_and_what_it_used() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "oom", "network": {"mode": "none"}, "resources": {"memoryMb": 256}}))
        .await;
    // A command that uses CPU and some memory, then ends normally.
    let busy = server
        .sh(
            &sid,
            "python3 -c 'b = b\"x\" * (64 << 20); x = 0\nfor i in range(3000000): x += i'",
        )
        .await;
    assert_eq!(busy["exitCode"], 0, "{busy}");
    assert_eq!(busy["oomKilled"], false);
    let usage = &busy["usage"];
    assert!(usage["cpuUserMs"].as_u64().unwrap_or(0) >= 50, "{usage}");
    assert!(
        usage["maxRssKb"].as_u64().unwrap_or(0) >= 64 * 1024,
        "its 64 MiB show in its peak: {usage}"
    );
    if harness::under_gvisor() {
        // gVisor's kernel goes with the sandbox when the memory limit is
        // hit (see README, gVisor): no exit of the command's own to read.
        eprintln!("under gVisor the memory limit ends the whole sandbox; oomKilled is runc's");
        return;
    }
    let hog = server
        .sh(
            &sid,
            "python3 -c 'a = []\nwhile True: a.append(b\"x\" * (16 << 20))'",
        )
        .await;
    assert_eq!(
        (hog["exitCode"].clone(), hog["oomKilled"].clone()),
        (json!(137), json!(true)),
        "{hog}"
    );
    assert!(
        !hog["stderr"].as_str().unwrap_or("").contains("sandboxd"),
        "no implementation lines on the user's stderr: {hog}"
    );
    // The same through wait and the exit record.
    let cid = server
        .start_command(
            &sid,
            json!({"command": "python3 -c 'a = []\nwhile True: a.append(b\"x\" * (16 << 20))'"}),
        )
        .await;
    let w = server.wait_command(&sid, &cid).await;
    assert_eq!(w["oomKilled"], true, "{w}");
    let exit = server.log_records(&sid, &cid, "").await;
    let exit = exit.last().expect("exit");
    assert_eq!(
        (exit["stream"].clone(), exit["oomKilled"].clone()),
        (json!("exit"), json!(true))
    );
    assert!(
        exit["usage"]["maxRssKb"].as_u64().unwrap_or(0) > 100 * 1024,
        "{exit}"
    );
}

#[tokio::test]
async fn readers_that_keep_reading_get_every_byte_of_a_gigabyte() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let pid = server.pid().expect("pid");
    let before = harness::rss_kb(pid);
    let size: u64 = 1 << 30;
    let cid = server
        .start_command(
            &sid,
            json!({"command": format!("head -c {size} /dev/zero | tr '\\0' x"), "timeoutMs": 600000}),
        )
        .await;
    let count = |n: usize| {
        let client = server.client.clone();
        let url = format!("{}/v1/sandboxes/{sid}/commands/{cid}/logs", server.base);
        async move {
            let resp = client.get(url).send().await.expect("logs");
            let mut body = resp.bytes_stream();
            let (mut bytes, mut dropped, mut carry) = (0u64, false, Vec::new());
            while let Some(chunk) = body.next().await {
                carry.extend_from_slice(&chunk.expect("chunk"));
                let end = carry.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                for line in carry[..end]
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                {
                    let v: Value = serde_json::from_slice(line).expect("ndjson");
                    match v["stream"].as_str() {
                        Some("stdout") => bytes += v["data"].as_str().map_or(0, |d| d.len() as u64),
                        Some("dropped") => dropped = true,
                        _ => {}
                    }
                }
                carry.drain(..end);
            }
            (n, bytes, dropped)
        }
    };
    let mut peak = before;
    let readers = futures_util::future::join_all((0..4).map(count));
    tokio::pin!(readers);
    let results = loop {
        tokio::select! {
            r = &mut readers => break r,
            _ = tokio::time::sleep(Duration::from_millis(200)) => peak = peak.max(harness::rss_kb(pid)),
        }
    };
    for (n, bytes, dropped) in results {
        assert!(!dropped, "reader {n} was told of a drop");
        assert_eq!(bytes, size, "reader {n} got every byte");
    }
    let growth = peak.saturating_sub(before) / 1024;
    assert!(
        growth < 64,
        "sandboxd grew {growth} MB with four readers of a gigabyte"
    );
}

#[tokio::test]
async fn a_bare_image_runs_commands_files_and_ports() {
    // The debootstrap base (sandbox-images/build.sh --base-only): bash and
    // coreutils and perl-base, no python3, no socat, no workspace directory.
    let base = std::process::Command::new("sandbox-images/build.sh")
        .arg("--base-only")
        .output()
        .expect("build.sh --base-only");
    assert!(
        base.status.success(),
        "{}",
        String::from_utf8_lossy(&base.stderr)
    );
    let image = String::from_utf8_lossy(&base.stdout).trim().to_string();
    let config = std::env::temp_dir().join(format!("{}.toml", harness::unique_instance()));
    std::fs::write(&config, format!("[runtimes.bare]\nimage = \"{image}\"\n")).expect("config");
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_CONFIG", &config.display().to_string()),
    )
    .await;
    let sid = server
        .create(json!({"sessionKey": "bare", "runtime": "bare", "ports": [3000]}))
        .await;
    let r = server
        .sh(&sid, "echo hi; id -u; pwd; touch made && ls")
        .await;
    assert_eq!(r["stdout"], "hi\n1000\n/workspace\nmade\n", "{r}");
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "dir/a.bin", "contentBase64": harness::b64([0, 1, 255])}]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, v) = server
        .read_file(&sid, "/vercel/sandbox/workspace/dir/a.bin")
        .await;
    assert_eq!(v["contentBase64"], harness::b64([0, 1, 255]));
    let (_, v) = server.get(&format!("/v1/sandboxes/{sid}/files:list")).await;
    let names: Vec<&str> = v["entries"]
        .as_array()
        .map(|l| l.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["dir", "made"]);
    // A server in perl, the only language the base has.
    let serve = "use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1:3000', Listen => 5, ReuseAddr => 1) or die; while (my $c = $s->accept) { <$c>; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\nbare\\n\"; close $c }";
    server
        .write_files(
            &sid,
            json!([{"path": "serve.pl", "contentBase64": harness::b64(serve.as_bytes())}]),
        )
        .await;
    server
        .start_command(
            &sid,
            json!({"command": "exec perl serve.pl", "timeoutMs": 600000}),
        )
        .await;
    let (_, v) = server
        .get(&format!("/v1/sandboxes/{sid}/ports/3000?waitMs=10000"))
        .await;
    assert_eq!(v["ready"], true, "{v}");
    let url = v["url"].as_str().expect("url").to_string();
    eventually(
        Duration::from_secs(10),
        "the bare sandbox serves",
        || async { fetch(&url).await.as_deref() == Some("bare\n") },
    )
    .await;
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn killing_the_agent_ends_its_commands_with_a_reason_and_the_sandbox_recovers() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    server
        .write_files(
            &sid,
            json!([{"path": "kept.txt", "contentBase64": harness::b64(b"kept")}]),
        )
        .await;
    let cid = server
        .start_command(
            &sid,
            json!({"command": "echo running; sleep 600", "timeoutMs": 600000}),
        )
        .await;
    // The sandbox user kills the agent (it runs as that user).
    let killed = server
        .sh(&sid, "pkill -KILL -f '^/.sandboxd/sandboxd-agent serve'")
        .await;
    assert_eq!(
        killed["exitCode"], 137,
        "the killing command went with it: {killed}"
    );
    let w = server.wait_command(&sid, &cid).await;
    assert_eq!(
        (w["exitCode"].clone(), w["killed"].clone()),
        (json!(137), json!(false)),
        "{w}"
    );
    let records = server.log_records(&sid, &cid, "").await;
    let n = records.len();
    assert!(n >= 2, "{records:?}");
    assert_eq!(records[n - 2]["stream"], "error");
    assert!(
        records[n - 2]["message"]
            .as_str()
            .unwrap_or("")
            .contains("agent"),
        "the reason names the agent: {}",
        records[n - 2]
    );
    assert_eq!(records[n - 1]["stream"], "exit");
    // The sandbox recovers: same workspace, new commands run.
    let ok = server.sh(&sid, "cat kept.txt").await;
    assert_eq!(ok["stdout"], "kept");
    let (s, _) = server.get("/v1/health").await;
    assert_eq!(s, 200, "sandboxd stays healthy");
}

#[tokio::test]
async fn commands_survive_a_sandboxd_kill_and_report_their_own_exit_code() {
    let mut server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let cid = server
        .start_command(
            &sid,
            json!({"command": "echo one; while [ ! -e go ]; do sleep 0.05; done; echo two; exit 5", "timeoutMs": 600000}),
        )
        .await;
    eventually(Duration::from_secs(5), "it runs", || async {
        listed(&server, &sid, &cid).await["state"] == "running"
    })
    .await;
    server.crash_and_restart().await;
    assert_eq!(listed(&server, &sid, &cid).await["state"], "running");
    server.sh(&sid, "touch go").await;
    let w = server.wait_command(&sid, &cid).await;
    assert_eq!(w["exitCode"], 5, "{w}");
    let out: String = server
        .log_records(&sid, &cid, "")
        .await
        .iter()
        .filter(|r| r["stream"] == "stdout")
        .filter_map(|r| r["data"].as_str().map(str::to_string))
        .collect();
    assert_eq!(out, "one\ntwo\n");
}

/// The first connection to a new sandbox's agent is the agent's own
/// stdio, attached while the container started: commands and files work
/// with no exec in the container. The engine keeps no log of that stream.
/// After a sandboxd crash the engine closed the agent's input and the new
/// sandboxd connects through an exec of the bridge.
#[tokio::test]
async fn the_first_connection_is_the_agents_stdio_and_a_restarted_sandboxd_uses_a_bridge() {
    let mut server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, "echo one").await["stdout"], "one\n");
    let (s, body) = server
        .post(
            &format!("/v1/sandboxes/{sid}/files:write"),
            json!({"files": [{"path": "a.txt", "contentBase64": "aGk="}]}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let before = server.inspect(&sid).await;
    let cmd = before
        .config
        .as_ref()
        .and_then(|c| c.cmd.clone())
        .unwrap_or_default();
    assert_eq!(cmd.last().map(String::as_str), Some("--stdio"), "{cmd:?}");
    let log = before
        .host_config
        .as_ref()
        .and_then(|h| h.log_config.as_ref())
        .and_then(|l| l.typ.clone());
    assert_eq!(
        log.as_deref(),
        Some("none"),
        "the agent's stream is not logged"
    );
    assert_eq!(
        before.exec_ids.clone().unwrap_or_default(),
        Vec::<String>::new(),
        "no exec: the connection is the agent's stdio"
    );
    server.crash_and_restart().await;
    assert_eq!(server.sh(&sid, "cat a.txt").await["stdout"], "hi");
    let after = server.inspect(&sid).await;
    assert!(
        !after.exec_ids.unwrap_or_default().is_empty(),
        "a restarted sandboxd connects through a bridge"
    );
}

#[tokio::test]
async fn the_agent_cannot_be_replaced_from_inside() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // Its binary is on a read-only mount.
    let w = server
        .sh(&sid, "cp /bin/true /.sandboxd/sandboxd-agent")
        .await;
    assert_ne!(w["exitCode"], 0, "{w}");
    let reason = if harness::under_gvisor() {
        "Permission denied"
    } else {
        "Read-only file system"
    };
    assert!(w["stderr"].as_str().unwrap_or("").contains(reason), "{w}");
    // A second agent cannot take its socket.
    let second = server
        .sh(&sid, "/.sandboxd/sandboxd-agent serve; echo \"exit $?\"")
        .await;
    let out = format!("{}{}", second["stdout"], second["stderr"]);
    assert!(
        out.contains("cannot listen") && out.contains("exit 1"),
        "the name is taken: {second}"
    );
    // And the real one still answers.
    assert_eq!(server.sh(&sid, "echo still").await["stdout"], "still\n");
}

/// Only the spare keeper, made ahead, starts its command's process ahead
/// (`keep --ahead`, with a stub); a keeper made when a command comes and
/// no spare waits (a second command while the first runs) starts the
/// command itself.
#[tokio::test]
async fn only_the_spare_keeper_starts_a_stub() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, "true").await["exitCode"], 0);
    // Positive control: the spare waits with its stub.
    eventually(Duration::from_secs(5), "a spare with its stub", || async {
        let (_, out) = server
            .docker_exec(&sid, "pgrep -fx '/.sandboxd/sandboxd-agent stub' | wc -l")
            .await;
        out == "1\n"
    })
    .await;
    // The first takes the spare; no new spare is made while it runs, so
    // the second gets a keeper made for it.
    let sleep = |secs: &str| json!({"cmd": "sleep", "args": [secs], "login": false});
    let first = server.start_command(&sid, sleep("31")).await;
    let second = server.start_command(&sid, sleep("32")).await;
    // Each sleep's parent, its keeper: its command line.
    let keepers = "for n in 31 32; do p=$(pgrep -x -f \"sleep $n\"); \
                   k=$(ps -o ppid= -p \"$p\" | tr -d ' '); \
                   tr '\\0' ' ' < /proc/$k/cmdline; echo; done";
    let seen = std::cell::RefCell::new(String::new());
    eventually(Duration::from_secs(10), "both commands run", || async {
        let out = server.docker_exec(&sid, keepers).await.1;
        let both = out
            .lines()
            .filter(|l| l.contains("sandboxd-agent keep"))
            .count()
            == 2;
        *seen.borrow_mut() = out;
        both
    })
    .await;
    let seen = seen.into_inner();
    assert_eq!(
        seen, "/.sandboxd/sandboxd-agent keep --ahead \n/.sandboxd/sandboxd-agent keep \n",
        "the spare's keeper, then one made on demand"
    );
    for cid in [first, second] {
        let (status, v) = server
            .post(
                &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
                json!({}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
    }
}

/// The agent keeps one keeper started ahead of the next command, and the
/// keeper the command's process (its stub, which only has to exec the
/// command). The sandbox user can kill either; the next command then
/// starts all the same, and a spare with its stub is there again.
#[tokio::test]
async fn a_killed_spare_keeper_or_stub_does_not_fail_the_next_command() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // The spare's stub waits for a command; a stub that has its command
    // is that command. Its parent is the spare keeper.
    let stub = "pgrep -f '^/.sandboxd/sandboxd-agent stub$'";
    let spare = format!("for s in $({stub}); do ps -o ppid= -p \"$s\" | tr -d ' '; done");
    assert_eq!(server.sh(&sid, "true").await["exitCode"], 0);
    let runs = |tag: &'static str| {
        let server = &server;
        let sid = &sid;
        async move {
            for i in 0..3 {
                let r = server.sh(sid, &format!("echo {tag}-{i}")).await;
                assert_eq!(
                    (r["exitCode"].clone(), r["stdout"].clone()),
                    (
                        serde_json::json!(0),
                        serde_json::json!(format!("{tag}-{i}\n"))
                    ),
                    "{r}"
                );
            }
        }
    };
    // Killed from outside the agent's commands (a command would take the
    // spare itself), retried while they are still starting.
    for (what, pids) in [("stub", stub.to_string()), ("keeper", spare.clone())] {
        eventually(
            Duration::from_secs(10),
            &format!("the spare's {what} is killed"),
            || async {
                let (_, out) = server
                    .docker_exec(
                        &sid,
                        &format!("for p in $({pids}); do kill -KILL \"$p\" && echo killed; done"),
                    )
                    .await;
                out == "killed\n"
            },
        )
        .await;
        runs(what).await;
    }
    eventually(
        Duration::from_secs(5),
        "a spare keeper with its stub waits again",
        || async {
            server
                .docker_exec(&sid, &format!("{spare} | wc -l"))
                .await
                .1
                == "1\n"
        },
    )
    .await;
}

/// Voluntary context switches of every thread of host process `pid`.
fn wakeups(pid: i64) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the agent's threads");
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .filter_map(|n| n.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// An agent with no command running and none left behind sets no timer:
/// over 2 s it wakes (almost) never, where with a command running its
/// monitor wakes several times a second (the positive control). Under
/// gVisor the host sees the sandbox's kernel, not the agent: the test
/// says so and checks nothing there.
#[tokio::test]
async fn an_idle_agent_wakes_for_nothing_under_runc() {
    if harness::under_gvisor() {
        eprintln!(
            "agent::an_idle_agent_wakes_for_nothing_under_runc: not checked under gVisor \
             (the host cannot see the agent's threads)"
        );
        return;
    }
    let server = TestServer::start().await;
    let sid = server.create(json!({"sessionKey": "quiet-agent"})).await;
    let ran = server.sh(&sid, "true").await;
    assert_eq!(ran["exitCode"], 0, "{ran}");
    let init = server
        .inspect(&sid)
        .await
        .state
        .and_then(|s| s.pid)
        .expect("the sandbox's init pid");
    let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        .expect("the init's children");
    let agent: i64 = children
        .split_whitespace()
        .find_map(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains("sandboxd-agent")
                .then(|| p.parse().ok())?
        })
        .expect("the agent is a child of the sandbox's init");
    let over_2s = || async {
        let before = wakeups(agent);
        tokio::time::sleep(Duration::from_secs(2)).await;
        wakeups(agent) - before
    };
    // Positive control: with a command running, the monitor ticks.
    let started = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "sleep 30"}),
        )
        .await;
    assert_eq!(started.0, 200, "{}", started.1);
    let busy = over_2s().await;
    let cid = started.1["commandId"].as_str().expect("commandId");
    let killed = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
            json!(null),
        )
        .await;
    assert_eq!(killed.0, 200, "{}", killed.1);
    let _ = server
        .get_within(
            &format!("/v1/sandboxes/{sid}/commands/{cid}/wait"),
            Duration::from_secs(30),
        )
        .await;
    assert!(
        busy >= 4,
        "with a command running the agent woke only {busy} times in 2 s: the control failed"
    );
    // Settled once the killed command's keeper is gone: measured in 2 s
    // windows until one is quiet, for up to five.
    let mut idle = Vec::new();
    for _ in 0..5 {
        idle.push(over_2s().await);
        if idle.last().is_some_and(|n| *n <= 2) {
            break;
        }
    }
    assert!(
        idle.last().is_some_and(|n| *n <= 2),
        "an idle agent kept waking: {idle:?} times in successive 2 s windows (with a command running: {busy})"
    );
}
