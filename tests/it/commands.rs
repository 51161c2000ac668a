//! Commands: exact exit codes, tree kills and timeouts (a fork bomb
//! included), the NDJSON log stream (replay, follow, resume, exact drops,
//! UTF-8, heartbeats), bounded memory, stdin/cwd/env/argv/login PATH,
//! limits, busy sandboxes, retention and commands lost to a restart of
//! sandboxd.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, eventually};

fn text_of(lines: &[Value], stream: &str) -> String {
    lines
        .iter()
        .filter(|l| l["stream"] == stream)
        .map(|l| l["data"].as_str().expect("data").to_string())
        .collect()
}

#[tokio::test]
async fn exit_codes_are_exact() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // The compat form: start, then wait.
    let cid = server
        .start_command(
            &sid,
            json!({"cmd": "bash", "args": ["-lc", "exit 3"], "timeoutMs": 30000, "detached": true}),
        )
        .await;
    let w = server.wait_command(&sid, &cid).await;
    assert_eq!(w["exitCode"], 3);
    assert_eq!(w["timedOut"], false);
    assert_eq!(w["killed"], false);
    assert!(w["durationMs"].as_u64().is_some());

    assert_eq!(server.sh(&sid, "true").await["exitCode"], 0);
    let missing = server
        .run(&sid, json!({"cmd": "no-such-program", "args": ["x"]}))
        .await;
    assert_eq!(missing["exitCode"], 127, "{missing}");
    assert!(
        missing["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("no-such-program"),
        "{missing}"
    );
    let segv = server
        .sh(&sid, "python3 -c 'import ctypes; ctypes.string_at(0)'")
        .await;
    assert_eq!(segv["exitCode"], 139, "{segv}");
    let timed = server
        .run(&sid, json!({"command": "sleep 30", "timeoutMs": 1000}))
        .await;
    assert_eq!(
        (timed["exitCode"].clone(), timed["timedOut"].clone()),
        (json!(124), json!(true))
    );

    // kill: SIGTERM suffices -> 143; ignored -> SIGKILL -> 137.
    let cid = server
        .start_command(&sid, json!({"command": "sleep 300"}))
        .await;
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
            json!(null),
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok": true})));
    let w = server.wait_command(&sid, &cid).await;
    assert_eq!(
        (w["exitCode"].clone(), w["killed"].clone()),
        (json!(143), json!(true))
    );
    let cid = server
        .start_command(
            &sid,
            json!({"command": "trap '' TERM; sleep 3137 & wait; sleep 300"}),
        )
        .await;
    // Kill only once the trap is set (the sleep starts after it).
    eventually(
        Duration::from_secs(5),
        "the TERM-ignoring tree is up",
        || async { has_process(&server, &sid, "sleep 3137").await },
    )
    .await;
    let started = Instant::now();
    server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
            json!(null),
        )
        .await;
    let w = server.wait_command(&sid, &cid).await;
    assert_eq!(
        (w["exitCode"].clone(), w["killed"].clone()),
        (json!(137), json!(true)),
        "{w}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "grace then SIGKILL"
    );
    // Killing a finished command changes nothing.
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
            json!(null),
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok": true})));
    assert_eq!(server.wait_command(&sid, &cid).await["exitCode"], 137);
    // Unknown command and sandbox.
    let (s, v) = server
        .get(&format!(
            "/v1/sandboxes/{sid}/commands/000000000000000000000000/wait"
        ))
        .await;
    assert_eq!((s, v["code"].clone()), (404, json!("command_not_found")));
    let (s, _) = server
        .post(
            "/v1/sandboxes/0123456789abcdef01234567/commands",
            json!({"command": "true"}),
        )
        .await;
    assert_eq!(s, 404);
}

/// Processes whose whole command line is `needle` (not the supervisor's,
/// whose arguments merely contain it).
fn pids_matching(ps: &str, needle: &str) -> Vec<String> {
    ps.lines()
        .filter(|l| l.trim() == needle)
        .map(str::to_string)
        .collect()
}

async fn has_process(server: &TestServer, sid: &str, args: &str) -> bool {
    let ps = server.sh(sid, "ps -eo args").await;
    !pids_matching(ps["stdout"].as_str().unwrap_or(""), args).is_empty()
}

#[tokio::test]
async fn timeout_and_kill_end_the_whole_tree_but_spare_earlier_servers() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // A preview server left running by a command that exited normally.
    let r = server
        .sh(&sid, "nohup sleep 4242 >/dev/null 2>&1 & exit 0")
        .await;
    assert_eq!(r["exitCode"], 0);
    // Another command's long process, which must not be touched.
    let neighbour = server
        .start_command(&sid, json!({"command": "sleep 4343"}))
        .await;

    // Every way out of a tree: the background, a new session, nohup, a
    // double fork, and a cleared environment.
    let tree = "sleep 1001 & setsid sleep 1002 & nohup sleep 1003 >/dev/null 2>&1 & (sleep 1004 &) ; env -i /bin/sleep 1005 & wait";
    let timed = server
        .run(&sid, json!({"command": tree, "timeoutMs": 1500}))
        .await;
    assert_eq!(timed["exitCode"], 124);
    let ps = server.sh(&sid, "ps -eo args").await["stdout"]
        .as_str()
        .expect("ps")
        .to_string();
    for n in [
        "sleep 1001",
        "sleep 1002",
        "sleep 1003",
        "sleep 1004",
        "/bin/sleep 1005",
    ] {
        assert!(
            pids_matching(&ps, n).is_empty(),
            "{n} survived the timeout:\n{ps}"
        );
    }
    let cid = server
        .start_command(&sid, json!({"command": tree.replace("100", "200")}))
        .await;
    eventually(Duration::from_secs(5), "the tree is up", || async {
        has_process(&server, &sid, "sleep 2004").await
            && has_process(&server, &sid, "/bin/sleep 2005").await
    })
    .await;
    server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
            json!(null),
        )
        .await;
    // :kill answers once SIGTERM is sent; the end follows.
    server.wait_command(&sid, &cid).await;
    let ps = server.sh(&sid, "ps -eo args").await["stdout"]
        .as_str()
        .expect("ps")
        .to_string();
    for n in [
        "sleep 2001",
        "sleep 2002",
        "sleep 2003",
        "sleep 2004",
        "/bin/sleep 2005",
    ] {
        assert!(
            pids_matching(&ps, n).is_empty(),
            "{n} survived the kill:\n{ps}"
        );
    }
    assert!(
        !pids_matching(&ps, "sleep 4242").is_empty(),
        "the earlier server survives:\n{ps}"
    );
    assert!(
        !pids_matching(&ps, "sleep 4343").is_empty(),
        "the other command is untouched:\n{ps}"
    );
    server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{neighbour}:kill"),
            json!(null),
        )
        .await;
}

#[tokio::test]
async fn a_fork_bomb_dies_at_its_timeout_and_the_sandbox_works_again() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let bomb = server
        .run(
            &sid,
            json!({"command": "bomb() { bomb | bomb; }; bomb", "timeoutMs": 3000}),
        )
        .await;
    assert_eq!(bomb["exitCode"], 124, "{}", bomb["exitCode"]);
    let started = Instant::now();
    let ok = server.sh(&sid, "echo ok").await;
    assert_eq!(ok["stdout"], "ok\n");
    assert!(started.elapsed() < Duration::from_secs(5));
    let count = server.sh(&sid, "ps -e --no-headers | wc -l").await;
    let n: u32 = count["stdout"]
        .as_str()
        .unwrap_or("")
        .trim()
        .parse()
        .expect("count");
    assert!(n < 10, "no bomb process left ({n} processes)");
}

/// Each command is its own process group: `kill 0` ends the command and
/// what it started in its group, and neither the agent (whose connection,
/// the first one, survives: no bridge exec is made) nor the sandbox.
#[tokio::test]
async fn kill_zero_in_a_command_ends_its_own_group_only() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let started = server.inspect(&sid).await.state.and_then(|s| s.started_at);
    let r = server
        .run(
            &sid,
            json!({"command": "sleep 300 & kill 0; sleep 300", "timeoutMs": 20000}),
        )
        .await;
    assert_eq!(r["exitCode"], 143, "{r}");
    assert_eq!(r["timedOut"], false, "{r}");
    let r = server
        .sh(&sid, "pgrep -x sleep >/dev/null && echo left || echo none")
        .await;
    assert_eq!(
        r["stdout"], "none\n",
        "the group's background sleep got it too"
    );
    let after = server.inspect(&sid).await;
    assert_eq!(
        after.state.and_then(|s| s.started_at),
        started,
        "the sandbox was not restarted"
    );
    assert!(
        after.exec_ids.unwrap_or_default().is_empty(),
        "the agent's first connection survived: no bridge was needed"
    );
}

/// A process that left the command's process group (`setsid`) gets its
/// SIGTERM within the grace period even while the group, ignoring
/// SIGTERM, still has members: it does not go to SIGKILL unwarned.
#[tokio::test]
async fn a_process_outside_the_group_gets_sigterm_while_the_group_ignores_it() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // The escapee starts before the group ignores SIGTERM: a shell that
    // starts with it ignored cannot trap it.
    let script = "setsid bash -c 'trap \"echo term > /workspace/escapee; exit 0\" TERM; echo up > /workspace/escapee; while :; do sleep 0.1; done' & trap '' TERM; sleep 300";
    let r = server
        .run(&sid, json!({"command": script, "timeoutMs": 1500}))
        .await;
    assert_eq!(r["exitCode"], 124, "{r}");
    let f = server.sh(&sid, "cat /workspace/escapee").await;
    // "up" alone: the escapee ran but was killed without a SIGTERM.
    assert_eq!(f["stdout"], "term\n", "{f}");
}

#[tokio::test]
async fn stdin_cwd_env_argv_and_login_path() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let r = server.run(&sid, json!({"command": "cat; pwd; echo \"$GREETING\"", "stdin": "from stdin\n", "cwd": "made/here", "env": {"GREETING": "hi there"}})).await;
    assert_eq!(r["stdout"], "from stdin\n/workspace/made/here\nhi there\n");
    let r = server
        .run(&sid, json!({"command": "pwd", "cwd": "/workspace/made"}))
        .await;
    assert_eq!(r["stdout"], "/workspace/made\n");
    // Without stdin, a reader sees EOF at once.
    let r = server
        .run(
            &sid,
            json!({"command": "cat; echo done", "timeoutMs": 5000}),
        )
        .await;
    assert_eq!(
        (r["stdout"].clone(), r["exitCode"].clone()),
        (json!("done\n"), json!(0))
    );
    // argv is passed as is: spaces and quotes stay inside one argument.
    let r = server
        .run(
            &sid,
            json!({"cmd": "printf", "args": ["<%s>\n", "a b", "it's \"q\"", "$HOME", ""]}),
        )
        .await;
    assert_eq!(r["stdout"], "<a b>\n<it's \"q\">\n<$HOME>\n<>\n");
    // A directory added to PATH by ~/.profile (HOME is the workspace) is found.
    let setup = "mkdir -p ~/bin && printf '#!/bin/sh\\necho from-profile-path\\n' > ~/bin/myprog && chmod +x ~/bin/myprog && echo 'export PATH=\"$HOME/bin:$PATH\"' >> ~/.profile";
    assert_eq!(server.sh(&sid, setup).await["exitCode"], 0);
    let r = server.run(&sid, json!({"cmd": "myprog"})).await;
    assert_eq!(r["stdout"], "from-profile-path\n", "{r}");
    let r = server
        .run(&sid, json!({"cmd": "myprog", "login": false}))
        .await;
    assert_eq!(r["exitCode"], 127, "no login shell, no profile PATH");
    // Commands see SIGINT like in a terminal (not ignored). Python keeps a
    // signal ignored at its start as SIG_IGN, so it reports what it got
    // (and works under gVisor, whose /proc has no SigIgn line).
    let r = server.sh(&sid,
        "python3 -c 'import signal as s; print([s.getsignal(n) == s.SIG_IGN for n in (s.SIGINT, s.SIGQUIT)])'",
    )
    .await;
    assert_eq!(
        r["stdout"], "[False, False]\n",
        "SIGINT/SIGQUIT not ignored: {r}"
    );
    // The sandbox user runs it, in a login shell.
    let r = server
        .sh(&sid, "id -u; shopt -q login_shell && echo login")
        .await;
    assert_eq!(r["stdout"], "1000\nlogin\n");
    // Bad input is 400 and runs nothing.
    for body in [
        json!({"command": "x", "cwd": "../etc"}),
        json!({"command": "x", "cwd": "/etc"}),
        json!({"command": "x", "env": {"BAD-NAME": "v"}}),
        json!({"command": "x", "timeoutMs": -5}),
        json!({}),
        json!({"command": "x", "bogus": 1}),
    ] {
        let (s, v) = server
            .post(&format!("/v1/sandboxes/{sid}/commands"), body.clone())
            .await;
        assert_eq!(s, 400, "{body}: {v}");
    }
}

#[tokio::test]
async fn run_keeps_the_tail_of_each_stream() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let r = server
        .run(
            &sid,
            json!({"command": "seq 1 1000; seq 1 5 >&2", "maxOutputBytes": 10}),
        )
        .await;
    assert_eq!(r["stdout"], "\n999\n1000\n");
    assert_eq!(r["stderr"], "1\n2\n3\n4\n5\n");
    let total_out = (1..=1000)
        .map(|n: u32| n.to_string().len() as u64 + 1)
        .sum::<u64>();
    assert_eq!(r["stdoutTruncatedBytes"].as_u64(), Some(total_out - 10));
    assert_eq!(r["stderrTruncatedBytes"], 0);
    assert_eq!(r["timedOut"], false);
    assert_eq!(r["killed"], false);
}

#[tokio::test]
async fn logs_replay_follow_resume_and_keep_streams_apart() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_LOG_HEARTBEAT_MS", "300"))
            .await;
    let sid = server.offline_sandbox().await;
    let script = "echo one; echo two >&2; printf '\\xe2\\x82'; sleep 0.3; printf '\\xac\\n'; printf 'bad\\xff\\n'; sleep 1; echo three";
    let cid = server.start_command(&sid, json!({"command": script})).await;
    // Two readers at once, each gets the whole stream.
    let (a, b) = tokio::join!(
        server.log_records(&sid, &cid, ""),
        server.log_records(&sid, &cid, "")
    );
    for lines in [&a, &b] {
        assert_eq!(text_of(lines, "stdout"), "one\n€\nbad\u{FFFD}\nthree\n");
        assert_eq!(text_of(lines, "stderr"), "two\n");
        let last = lines.last().expect("exit line");
        assert_eq!(last["stream"], "exit");
        assert_eq!(last["exitCode"], 0);
        assert!(
            lines.iter().any(|l| l["stream"] == "heartbeat"),
            "a silent second brings a heartbeat"
        );
        let seqs: Vec<u64> = lines
            .iter()
            .filter(|l| l["stream"] != "heartbeat")
            .map(|l| l["seq"].as_u64().expect("seq"))
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "increasing seq: {seqs:?}"
        );
    }
    // ?after= resumes after a record: exactly the records that follow it
    // (stdout and stderr are separate pipes, so their relative order is
    // whatever the engine delivered; the seq numbers fix it).
    let records: Vec<&Value> = a.iter().filter(|l| l["stream"] != "heartbeat").collect();
    for k in [0usize, 1, 2] {
        let after = records[k]["seq"].as_u64().expect("seq");
        let rest = server
            .log_records(&sid, &cid, &format!("?after={after}"))
            .await;
        let rest: Vec<&Value> = rest.iter().filter(|l| l["stream"] != "heartbeat").collect();
        assert_eq!(rest, records[k + 1..].to_vec(), "after={after}");
    }
    let (s, _) = server
        .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/logs?after=x"))
        .await;
    assert_eq!(s, 400);
}

#[tokio::test]
async fn output_reaches_a_reader_promptly() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let cid = server
        .start_command(
            &sid,
            json!({"command": "for i in 1 2 3 4; do date +%s%N; sleep 1; done"}),
        )
        .await;
    let resp = server.open_logs(&sid, &cid).await;
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut lags = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        while let Some(i) = buf.find('\n') {
            let line: Value = serde_json::from_str(&buf[..i]).expect("json");
            buf.drain(..=i);
            if line["stream"] == "stdout" {
                let printed: u128 = line["data"]
                    .as_str()
                    .unwrap_or("")
                    .trim()
                    .parse()
                    .expect("ns");
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock")
                    .as_nanos();
                lags.push(now.saturating_sub(printed) / 1_000_000);
            }
        }
    }
    assert_eq!(lags.len(), 4);
    assert!(lags.iter().all(|ms| *ms < 200), "lags in ms: {lags:?}");
}

/// Reads a whole log stream, counting output bytes and dropped bytes.
async fn count_stream(server: &TestServer, sid: &str, cid: &str) -> (u64, u64, Value) {
    let resp = server.open_logs(sid, cid).await;
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let (mut data, mut dropped, mut exit) = (0u64, 0u64, Value::Null);
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.expect("chunk"));
        let mut start = 0;
        while let Some(i) = buf[start..].iter().position(|b| *b == b'\n') {
            let line: Value = serde_json::from_slice(&buf[start..start + i]).expect("json");
            start += i + 1;
            match line["stream"].as_str() {
                Some("stdout") => data += line["data"].as_str().expect("data").len() as u64,
                Some("dropped") => dropped += line["bytes"].as_u64().expect("bytes"),
                Some("exit") => exit = line,
                _ => {}
            }
        }
        buf.drain(..start);
    }
    (data, dropped, exit)
}

#[tokio::test]
async fn two_hundred_megabytes_are_accounted_for_exactly() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let total: u64 = 200 * 1024 * 1024;
    let cid = server.start_command(&sid, json!({"command": format!("yes abcdefghijklmnopqrstuvwxyz0123456789 | head -c {total}"), "timeoutMs": 120000})).await;
    let (data, dropped, exit) = count_stream(&server, &sid, &cid).await;
    assert_eq!(exit["exitCode"], 0);
    assert_eq!(data + dropped, total, "data {data} + dropped {dropped}");
}

#[tokio::test]
async fn a_late_reader_is_told_what_it_missed() {
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_OUTPUT_BUFFER_BYTES", "65536"),
    )
    .await;
    let sid = server.offline_sandbox().await;
    let total: u64 = 1024 * 1024;
    let cid = server
        .start_command(
            &sid,
            json!({"command": format!("yes 0123456789 | head -c {total}")}),
        )
        .await;
    server.wait_command(&sid, &cid).await;
    let lines = server.log_records(&sid, &cid, "").await;
    assert_eq!(lines[0]["stream"], "dropped", "{}", lines[0]);
    let dropped = lines[0]["bytes"].as_u64().expect("bytes");
    let kept = text_of(&lines, "stdout").len() as u64;
    assert_eq!(dropped + kept, total);
    assert!(kept <= 65536);
    assert_eq!(lines.last().expect("exit")["stream"], "exit");
}

#[tokio::test]
async fn a_gigabyte_nobody_reads_keeps_memory_bounded_and_is_not_blocked() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    server.sh(&sid, "true").await;
    let pid = server.pid().expect("pid");
    let before = harness::rss_kb(pid);
    let r = server.run(&sid, json!({"command": "head -c 1073741824 /dev/zero | tr '\\0' x; echo", "timeoutMs": 300000, "maxOutputBytes": 16})).await;
    assert_eq!(r["exitCode"], 0);
    assert_eq!(r["stdoutTruncatedBytes"].as_u64(), Some(1_073_741_825 - 16));
    let after = harness::rss_kb(pid);
    let growth_mb = after.saturating_sub(before) / 1024;
    assert!(
        growth_mb < 8 + 32,
        "RSS grew by {growth_mb} MB (ring is 8 MB)"
    );
}

#[tokio::test]
async fn concurrency_limit_and_busy_sandboxes() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_MAX_RUNNING_COMMANDS", "2")
            .env("SANDBOXD_MAX_CONCURRENT", "1"),
    )
    .await;
    let sid = server
        .create(json!({"sessionKey": "busy", "idleTtlMs": 10000, "network": {"mode": "none"}}))
        .await;
    let a = server
        .start_command(&sid, json!({"command": "sleep 14"}))
        .await;
    let _b = server
        .start_command(&sid, json!({"command": "sleep 14"}))
        .await;
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "true"}),
        )
        .await;
    assert_eq!(
        (s, v["code"].clone()),
        (429, json!("too_many_commands")),
        "{v}"
    );
    let (_, view) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(view["runningCommands"], 2);
    // At capacity with every sandbox busy: 429, nothing evicted.
    let (s, v) = server
        .post("/v1/sandboxes", json!({"sessionKey": "other"}))
        .await;
    assert_eq!((s, v["code"].clone()), (429, json!("at_capacity")), "{v}");
    // Past its 10 s TTL while busy: not expired.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        server.get(&format!("/v1/sandboxes/{sid}")).await.0,
        200,
        "busy sandboxes do not expire"
    );
    server.wait_command(&sid, &a).await;
    assert!(server.log_text().contains("command_ended"));
}

#[tokio::test]
async fn commands_are_listed_then_forgotten_after_retention() {
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_COMMAND_RETENTION_MS", "1000"),
    )
    .await;
    let sid = server.offline_sandbox().await;
    let done = server
        .start_command(&sid, json!({"cmd": "bash", "args": ["-lc", "echo listed"]}))
        .await;
    server.wait_command(&sid, &done).await;
    let running = server
        .start_command(&sid, json!({"command": "sleep 30"}))
        .await;
    let (s, v) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert_eq!(s, 200);
    let list = v["commands"].as_array().expect("array");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["commandId"], json!(done));
    assert_eq!(list[0]["state"], "exited");
    assert_eq!(list[0]["exitCode"], 0);
    assert_eq!(list[0]["summary"], "echo listed");
    assert!(list[0]["finishedAt"].as_u64().is_some());
    assert_eq!(list[1]["state"], "running");
    assert_eq!(list[1]["exitCode"], Value::Null);
    eventually(
        Duration::from_secs(15),
        "the finished command is forgotten",
        || async {
            server
                .get(&format!("/v1/sandboxes/{sid}/commands/{done}/wait"))
                .await
                .0
                == 404
        },
    )
    .await;
    assert_eq!(
        server.get(&format!("/v1/sandboxes/{sid}/commands")).await.1["commands"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{running}:kill"),
            json!(null),
        )
        .await;
}

#[tokio::test]
async fn commands_keep_running_across_a_sandboxd_restart_and_leftovers_stay_killable() {
    let mut server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let cid = server
        .start_command(
            &sid,
            json!({"command": "echo before; touch started; while [ ! -e go ]; do sleep 0.05; done; echo after; exit 7", "timeoutMs": 600000}),
        )
        .await;
    // A finished command that left a process behind.
    let left = server
        .start_command(
            &sid,
            json!({"command": "nohup sleep 5252 >/dev/null 2>&1 & exit 0"}),
        )
        .await;
    server.wait_command(&sid, &left).await;
    eventually(Duration::from_secs(5), "the first runs", || async {
        server.sh(&sid, "test -e started").await["exitCode"] == 0
    })
    .await;
    server.restart().await;
    let (_, v) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    let find = |id: &str| {
        v["commands"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["commandId"] == json!(id)).cloned())
            .unwrap_or_else(|| panic!("{id} listed after the restart: {v}"))
    };
    assert_eq!(find(&cid)["state"], "running", "{v}");
    let leftover = find(&left);
    assert_eq!(
        (leftover["state"].clone(), leftover["exitCode"].clone()),
        (json!("exited"), json!(0))
    );
    assert_eq!(leftover["processes"], 1, "its leftover is counted: {v}");
    // Its log replays from the start and goes on live; wait gives its own code.
    let logs = tokio::spawn({
        let client = server.client.clone();
        let url = format!("{}/v1/sandboxes/{sid}/commands/{cid}/logs", server.base);
        async move {
            client
                .get(url)
                .send()
                .await
                .expect("logs")
                .text()
                .await
                .expect("body")
        }
    });
    server.sh(&sid, "touch go").await;
    let w = server.wait_command(&sid, &cid).await;
    assert_eq!(w["exitCode"], 7, "{w}");
    let text = logs.await.expect("joined");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("ndjson"))
        .collect();
    assert_eq!(lines[0]["seq"], 1, "replayed from the start: {text}");
    let out: String = lines
        .iter()
        .filter(|l| l["stream"] == "stdout")
        .filter_map(|l| l["data"].as_str())
        .collect();
    assert_eq!(out, "before\nafter\n");
    assert_eq!(lines.last().map(|l| l["exitCode"].clone()), Some(json!(7)));
    // The leftover stays killable: kill ends it, and only it.
    assert!(has_process(&server, &sid, "sleep 5252").await);
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{left}:kill"),
            json!(null),
        )
        .await;
    assert_eq!(s, 200);
    eventually(Duration::from_secs(5), "the leftover ends", || async {
        !has_process(&server, &sid, "sleep 5252").await
    })
    .await;
}

/// Past its retention a finished command is forgotten, unless processes it
/// left still run: then it stays listed and killable, and goes once they end.
#[tokio::test]
async fn a_command_whose_leftovers_run_outlives_its_retention_and_stays_killable() {
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_COMMAND_RETENTION_MS", "1000"),
    )
    .await;
    let sid = server.offline_sandbox().await;
    let plain = server.start_command(&sid, json!({"command": "true"})).await;
    let left = server
        .start_command(
            &sid,
            json!({"command": "nohup sleep 5353 >/dev/null 2>&1 & exit 0"}),
        )
        .await;
    server.wait_command(&sid, &plain).await;
    server.wait_command(&sid, &left).await;
    let status = |cid: String| {
        let server = &server;
        let sid = sid.clone();
        async move {
            server
                .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
                .await
                .0
        }
    };
    // Positive control: retention and pruning work, the plain one goes.
    eventually(
        Duration::from_secs(15),
        "the plain command is forgotten",
        || {
            let plain = plain.clone();
            async { status(plain).await == 404 }
        },
    )
    .await;
    assert_eq!(
        status(left.clone()).await,
        200,
        "the one with leftovers stays"
    );
    let (_, v) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    let listed = v["commands"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["commandId"] == json!(left)).cloned())
        .unwrap_or_else(|| panic!("{left} listed: {v}"));
    assert_eq!(listed["processes"], 1, "{listed}");
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{left}:kill"),
            json!(null),
        )
        .await;
    assert_eq!(s, 200);
    eventually(Duration::from_secs(5), "the leftover ends", || async {
        !has_process(&server, &sid, "sleep 5353").await
    })
    .await;
    eventually(
        Duration::from_secs(15),
        "forgotten once its leftovers ended",
        || {
            let left = left.clone();
            async { status(left).await == 404 }
        },
    )
    .await;
}

/// A `cwd` that cannot be created or entered ends the command at once with
/// 126 and sandboxd's message (a command with stdin is started by another
/// path than one without: both are tried); a program that cannot be found ends it with 127, the
/// shell saying so, or with `login: false` the agent.
#[tokio::test]
async fn an_uncreatable_cwd_is_126_and_a_missing_program_127() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, "echo > plain").await["exitCode"], 0);
    // Control: a missing cwd that can be created is made, and the command runs.
    let r = server
        .run(&sid, json!({"command": "pwd", "cwd": "made/here"}))
        .await;
    assert_eq!(
        (r["exitCode"].clone(), r["stdout"].clone()),
        (json!(0), json!("/workspace/made/here\n")),
        "{r}"
    );
    // Under a regular file no directory can be made.
    let r = server
        .run(&sid, json!({"command": "echo ran", "cwd": "plain/sub"}))
        .await;
    assert_eq!(r["exitCode"], 126, "{r}");
    assert_eq!(r["stdout"], "", "the command never ran: {r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap_or("")
            .starts_with("sandboxd: cannot create the working directory /workspace/plain/sub: "),
        "{r}"
    );
    // A directory the sandbox user may not enter.
    assert_eq!(
        server.sh(&sid, "mkdir -p locked && chmod 000 locked").await["exitCode"],
        0
    );
    for stdin in [None, Some("x")] {
        // Control: the same path of start runs in a directory it may enter.
        let mut ok = json!({"cmd": "pwd", "login": false, "cwd": "made/here"});
        let mut locked = json!({"cmd": "pwd", "login": false, "cwd": "locked"});
        if let Some(input) = stdin {
            ok["stdin"] = json!(input);
            locked["stdin"] = json!(input);
        }
        let r = server.run(&sid, ok).await;
        assert_eq!(
            r["stdout"], "/workspace/made/here\n",
            "stdin {stdin:?}: {r}"
        );
        let r = server.run(&sid, locked).await;
        assert_eq!(r["exitCode"], 126, "stdin {stdin:?}: {r}");
        assert_eq!(r["stdout"], "", "the command never ran: {r}");
        assert!(
            r["stderr"]
                .as_str()
                .unwrap_or("")
                .starts_with("sandboxd: cannot enter the working directory /workspace/locked: "),
            "stdin {stdin:?}: {r}"
        );
    }

    let r = server
        .run(&sid, json!({"cmd": "no-such-program", "login": false}))
        .await;
    assert_eq!(
        (r["exitCode"].clone(), r["stderr"].clone()),
        (
            json!(127),
            json!("sandboxd: no-such-program: command not found\n")
        ),
        "{r}"
    );
    let r = server.sh(&sid, "no-such-program").await;
    assert_eq!(r["exitCode"], 127, "{r}");
    let stderr = r["stderr"].as_str().unwrap_or("");
    assert!(
        stderr.contains("no-such-program: command not found") && !stderr.starts_with("sandboxd:"),
        "the shell says so: {r}"
    );
}

/// A `timeoutMs` above `max_timeout_ms` is capped, not refused: the answer
/// gives the effective value, and the cap is logged once, at info, with
/// what was asked.
#[tokio::test]
async fn a_timeout_above_the_maximum_is_capped_reported_and_logged() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_MAX_TIMEOUT_MS", "60000"))
            .await;
    let sid = server.offline_sandbox().await;
    let cap_lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("timeoutMs capped to max_timeout_ms"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // Control: at the maximum nothing is capped or logged.
    let r = server
        .run(&sid, json!({"command": "true", "timeoutMs": 60000}))
        .await;
    assert_eq!(r["timeoutMs"], 60000, "{r}");
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "true", "timeoutMs": 3600000}),
        )
        .await;
    assert_eq!((s, v["timeoutMs"].clone()), (200, json!(60000)), "{v}");
    let r = server
        .run(&sid, json!({"command": "true", "timeoutMs": 3600001}))
        .await;
    assert_eq!(r["timeoutMs"], 60000, "{r}");

    let lines = cap_lines(&server.log_text());
    assert_eq!(lines.len(), 2, "one line per capped command: {lines:?}");
    for (line, asked) in lines.iter().zip(["3600000", "3600001"]) {
        assert!(line.contains("INFO"), "{line}");
        assert!(line.contains(&format!("requested_ms={asked}")), "{line}");
        assert!(line.contains("effective_ms=60000"), "{line}");
    }
}
