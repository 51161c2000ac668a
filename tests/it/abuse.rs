//! Abuse of a sandbox's limits: memory past the limit, a full /tmp, a
//! runaway file at the file size limit, a workspace size the engine cannot
//! enforce, a crowd of commands past the running-command limit, a thousand
//! orphans, and output floods to a reader that barely reads and to readers
//! that vanish. Each time sandboxd and the other sandboxes carry on. (The
//! fork bomb is in `commands`.)

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, b64};

#[tokio::test]
async fn memory_past_the_limit_is_killed_and_nothing_else_notices() {
    let server = TestServer::start().await;
    let hog = server.create(json!({"sessionKey": "hog", "resources": {"memoryMb": 256}, "network": {"mode": "none"}})).await;
    let calm = server
        .create(json!({"sessionKey": "calm", "network": {"mode": "none"}}))
        .await;
    assert_eq!(
        server
            .sh_with_timeout(&hog, "echo kept > before.txt && echo ok", 10000)
            .await["stdout"],
        "ok\n"
    );
    let (s, started) = server
        .post(
            &format!("/v1/sandboxes/{hog}/commands"),
            json!({"command": "python3 -c 'a = bytearray(512 * 1024 * 1024); print(len(a))'", "timeoutMs": 60000}),
        )
        .await;
    assert_eq!(s, 200, "{started}");
    let cid = started["commandId"].as_str().expect("commandId");
    let text = server.open_logs(&hog, cid).await.text().await.expect("log");
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("NDJSON"))
        .collect();
    let exit = records.last().expect("an exit record");
    assert_eq!(
        (&exit["stream"], &exit["exitCode"]),
        (&json!("exit"), &json!(137)),
        "the OOM killer ends it: {text}"
    );
    let errors: Vec<&Value> = records.iter().filter(|r| r["stream"] == "error").collect();
    if harness::under_gvisor() {
        // gVisor's kernel goes with its memory, and the log says so, also
        // when the sandbox was started again before the command's end was
        // looked into.
        assert_eq!(errors.len(), 1, "{text}");
        assert!(
            errors[0]["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("the sandbox ran out of memory and stopped"),
            "{text}"
        );
    } else {
        assert!(errors.is_empty(), "only the process died: {text}");
    }
    assert_eq!(
        server.sh_with_timeout(&calm, "echo fine", 10000).await["stdout"],
        "fine\n"
    );
    assert_eq!(
        server.sh_with_timeout(&hog, "cat before.txt", 10000).await["stdout"],
        "kept\n",
        "the sandbox answers, its workspace intact"
    );
    assert_eq!(server.get("/v1/health").await.0, 200);
}

/// Anything in a sandbox can write to its init's output (the same user
/// opens /proc/1/fd/1). That output is the agent's first connection to
/// sandboxd, never a log on the engine host: 30 MB of garbage written
/// there while a command runs break that connection, and nothing else.
/// The command still reports its end, later commands run, and sandboxd
/// stays healthy.
#[tokio::test]
async fn garbage_written_to_the_containers_own_output_reaches_no_disk_and_breaks_nothing() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let inspect = server.inspect(&sid).await;
    assert_eq!(
        inspect.log_path.as_deref().unwrap_or(""),
        "",
        "the engine keeps no log of a sandbox"
    );
    let r = server
        .sh_with_timeout(
            &sid,
            "head -c 30000000 /dev/zero | tr '\\0' x > /proc/1/fd/1; echo rc=$?",
            60000,
        )
        .await;
    assert_eq!(r["stdout"], "rc=0\n", "the flood was written: {r}");
    assert_eq!(
        server.sh_with_timeout(&sid, "echo fine", 10000).await["stdout"],
        "fine\n"
    );
    assert!(
        !server
            .inspect(&sid)
            .await
            .exec_ids
            .unwrap_or_default()
            .is_empty(),
        "the flood broke the first connection; a bridge took over"
    );
    assert_eq!(server.get("/v1/health").await.0, 200);
}

/// The same flood from a process left running by a finished command: with
/// no command running, sandboxd lets go of the broken connection at once
/// (both halves), so the engine drains the container's output and the
/// writer finishes instead of blocking for good.
#[tokio::test]
async fn garbage_written_to_the_containers_own_output_while_nothing_runs_does_not_block_the_writer()
{
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let r = server
        .sh_with_timeout(
            &sid,
            "(head -c 30000000 /dev/zero | tr '\\0' x > /proc/1/fd/1; touch flood.done) \
             >/dev/null 2>&1 &",
            10000,
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");
    // Looked at from outside, by the engine: a request to sandboxd would
    // make a new connection and drop the broken one anyway.
    harness::eventually(
        Duration::from_secs(60),
        "the flood written whole",
        || async {
            server
                .docker_exec(&sid, "test -e /workspace/flood.done")
                .await
                .0
                == 0
        },
    )
    .await;
    assert_eq!(server.sh(&sid, "echo fine").await["stdout"], "fine\n");
    assert_eq!(server.get("/v1/health").await.0, 200);
}

#[tokio::test]
async fn a_full_tmp_says_enospc_at_its_size() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_TMP_SIZE_MB", "16")).await;
    let sid = server
        .create(json!({"sessionKey": "tmp", "network": {"mode": "none"}}))
        .await;
    let r = server
        .sh_with_timeout(
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
        server
            .sh_with_timeout(&sid, "rm /tmp/fill && echo ok", 10000)
            .await["stdout"],
        "ok\n"
    );
}

#[tokio::test]
async fn a_runaway_file_stops_at_the_file_size_limit() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_FILE_SIZE_LIMIT_MB", "16"))
            .await;
    let filler = server
        .create(json!({"sessionKey": "filler", "network": {"mode": "none"}}))
        .await;
    let other = server
        .create(json!({"sessionKey": "other", "network": {"mode": "none"}}))
        .await;
    let inspect = server.inspect(&filler).await;
    let ulimits = inspect
        .host_config
        .and_then(|h| h.ulimits)
        .unwrap_or_default();
    assert!(
        ulimits.iter().any(|u| u.name.as_deref() == Some("fsize")
            && u.soft == Some(16 << 20)
            && u.hard == Some(16 << 20)),
        "{ulimits:?}"
    );

    // The classic accident: an endless writer into the workspace.
    let r = server.sh_with_timeout(&filler,
        "yes > out.txt; echo rc=$?; stat -c %s out.txt; ulimit -f unlimited 2>/dev/null && echo raised",
        60000,
    )
    .await;
    assert_eq!(
        r["stdout"],
        format!("rc=153\n{}\n", 16 << 20),
        "SIGXFSZ at 16 MiB: {r}"
    );
    assert!(
        r["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("File size limit exceeded"),
        "{r}"
    );

    // files:write past the limit: a clear 413, and no partial file.
    let big = b64(vec![b'x'; 17 << 20]);
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{filler}/files:write"),
            json!({"files": [{"path": "big.bin", "contentBase64": big}]}),
        )
        .await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["code"], "file_too_large", "{v}");
    assert!(
        v["error"].as_str().unwrap_or("").contains("16777216"),
        "{v}"
    );
    assert_eq!(
        server
            .sh_with_timeout(&filler, "ls -A; rm out.txt", 10000)
            .await["stdout"],
        "out.txt\n",
        "nothing half-written is left"
    );
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{other}/files:write"),
            json!({"files": [{"path": "fine.bin", "contentBase64": b64(vec![b'y'; 1 << 20])}]}),
        )
        .await;
    assert_eq!(s, 200, "the other sandbox writes as before: {v}");
}

/// Docker's local driver limits a volume only where its root supports
/// project quotas (xfs with prjquota). Where the engine can, filling the
/// workspace must stop at its size with a clear error while the sandbox
/// and its neighbours carry on; where it cannot, a configured limit must be
/// refused up front rather than silently ignored.
#[tokio::test]
async fn filling_the_workspace_stops_at_its_quota_or_is_refused_up_front() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_WORKSPACE_SIZE_MB", "64")
            .env("SANDBOXD_FILE_SIZE_LIMIT_MB", "0"),
    )
    .await;
    let (status, v) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "full", "network": {"mode": "none"}}),
        )
        .await;
    if status == 503 {
        eprintln!("this engine cannot limit volume sizes; checking the refusal");
        assert_eq!(v["code"], "workspace_quota_unsupported", "{v}");
        let message = v["error"].as_str().unwrap_or("");
        assert!(
            message.contains("prjquota") && message.contains("SANDBOXD_WORKSPACE_SIZE_MB=0"),
            "{v}"
        );
        assert!(server.containers().await.is_empty(), "no container is left");
        assert!(server.volumes().await.is_empty(), "no volume is left");
        let (s, list) = server.get("/v1/sandboxes").await;
        assert_eq!(s, 200);
        assert_eq!(
            list["sandboxes"].as_array().map(Vec::len),
            Some(0),
            "{list}"
        );
        return;
    }
    assert_eq!(status, 200, "{v}");
    let full = v["sandboxId"].as_str().expect("sandboxId").to_string();
    let other = server
        .create(json!({"sessionKey": "neighbour", "network": {"mode": "none"}}))
        .await;
    let r = server
        .sh_with_timeout(
            &full,
            "for i in 1 2 3 4 5 6 7 8; do head -c 16M /dev/zero > f$i || break; done; echo done",
            60000,
        )
        .await;
    let err = r["stderr"].as_str().unwrap_or("");
    assert!(
        err.contains("No space left on device") || err.contains("Disk quota exceeded"),
        "{r}"
    );
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{full}/files:write"),
            json!({"files": [{"path": "more.bin", "contentBase64": b64(vec![b'x'; 1 << 20])}]}),
        )
        .await;
    assert_eq!(s, 507, "{v}");
    assert_eq!(v["code"], "insufficient_storage", "{v}");
    assert_eq!(
        server.sh_with_timeout(&full, "echo answers", 10000).await["stdout"],
        "answers\n"
    );
    assert_eq!(
        server
            .sh_with_timeout(&other, "head -c 32M /dev/zero > f && echo wrote", 30000)
            .await["stdout"],
        "wrote\n",
        "the neighbour has its own quota"
    );
    assert_eq!(
        server
            .sh_with_timeout(
                &full,
                "rm f* && head -c 1M /dev/zero > g && echo again",
                10000
            )
            .await["stdout"],
        "again\n",
        "freeing space frees the sandbox"
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
    let ps = server
        .sh_with_timeout(
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
    let r = server
        .sh_with_timeout(
            &sid,
            "for i in $(seq 1000); do (sleep 0.01 &); done; sleep 1; echo spawned",
            60000,
        )
        .await;
    assert_eq!(r["stdout"], "spawned\n");
    harness::eventually(Duration::from_secs(10), "no zombies", || async {
        let z = server
            .sh_with_timeout(
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
async fn a_flood_to_a_slow_reader_waits_for_it_stays_bounded_and_times_out() {
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_OUTPUT_BUFFER_BYTES", "1048576"),
    )
    .await;
    let sid = server
        .create(json!({"sessionKey": "flood", "network": {"mode": "none"}}))
        .await;
    let pid = server.pid().expect("pid");
    let before = harness::rss_kb(pid);
    let (_, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "echo ready; while [ ! -e go ]; do sleep 0.05; done; yes flood", "timeoutMs": 4000}),
        )
        .await;
    let cid = v["commandId"].as_str().expect("cid").to_string();
    let resp = server.open_logs(&sid, &cid).await;
    let mut body = resp.bytes_stream();
    // The flood starts once the reader follows (a reader that comes later
    // than FIRST_READER_WITHIN may miss output: that is not this test's
    // subject, and a loaded machine can be that slow to attach).
    let first = body.next().await.and_then(Result::ok).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&first).contains("ready"),
        "{first:?}"
    );
    assert_eq!(server.sh(&sid, "touch go").await["exitCode"], 0);
    // Read a little, then nothing for a while, twice: the command floods on.
    let mut peak = before;
    for _ in 0..2 {
        let _ = body.next().await;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            peak = peak.max(harness::rss_kb(pid));
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
    // The command waited for the reader, which keeps reading: it misses
    // nothing, and gets the end.
    let mut text = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8_lossy(&text);
    let dropped: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"stream\":\"dropped\""))
        .collect();
    assert!(
        dropped.is_empty(),
        "nothing dropped for a reader that keeps reading: {dropped:?}"
    );
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

/// A directory of more entries than a listing holds (100,000) is a clear
/// 413, not a broken agent; a directory of exactly that many lists in full.
#[tokio::test]
async fn a_directory_past_the_listing_limit_is_413() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "crowded", "network": {"mode": "none"}}))
        .await;
    let made = server
        .sh_with_timeout(
            &sid,
            "mkdir d && cd d && seq 100000 | xargs touch && ls | wc -l",
            120000,
        )
        .await;
    assert_eq!(made["stdout"], "100000\n", "{made}");
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/files:list?path=d"))
        .await;
    assert_eq!(s, 200, "positive control: the limit itself lists");
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(100000));
    // One more: past the limit.
    let more = server.sh(&sid, "touch d/x && ls d | wc -l").await;
    assert_eq!(more["stdout"], "100001\n", "{more}");
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/files:list?path=d"))
        .await;
    assert_eq!(
        (s, v["code"].clone()),
        (413, json!("file_too_large")),
        "{v}"
    );
    assert!(v["error"].as_str().unwrap_or("").contains("100000"), "{v}");
}
