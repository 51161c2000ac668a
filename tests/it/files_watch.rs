//! `GET …/files:watch`: create, write, remove and rename events in order,
//! for a directory and a new subdirectory; a flat watch leaves
//! subdirectories out; a queue past its bound says `overflow`; a symlink
//! out of the workspace is not followed; bad paths are refused like every
//! file route's; closing the stream removes the watch in the sandbox (the
//! sandbox's cap on watches frees up); the directory's removal ends the
//! stream. `smoke_*` runs under gVisor too (scripts/test.sh).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{ServerOptions, TestServer};

/// How long a test waits for an event it expects.
const EVENT_BOUND: Duration = Duration::from_secs(20);
/// The agent's cap on watches per sandbox (`MAX_FILE_WATCHES`).
const MAX_WATCHES: usize = 8;

/// An open watch stream.
struct Watch {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Watch {
    /// Opens `files:watch?{query}`, asserting 200.
    async fn open(server: &TestServer, sid: &str, query: &str) -> Watch {
        let resp = watch_request(server, sid, query).await;
        assert_eq!(resp.status().as_u16(), 200, "files:watch?{query}");
        Watch {
            resp,
            buf: Vec::new(),
        }
    }

    /// The next line (heartbeats left out), or `None` at the end of the
    /// stream or the deadline.
    async fn line(&mut self, deadline: Instant) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let v: Value = serde_json::from_slice(&line).expect("a JSON line");
                if v["type"] == "heartbeat" {
                    continue;
                }
                return Some(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }

    /// Lines until one is `(type, path)`, that one included; fails after
    /// [`EVENT_BOUND`] with what came.
    async fn until(&mut self, kind: &str, path: &str) -> Vec<(String, String)> {
        let deadline = Instant::now() + EVENT_BOUND;
        let mut seen = Vec::new();
        loop {
            let Some(v) = self.line(deadline).await else {
                panic!("no {kind} {path} within {EVENT_BOUND:?}; got {seen:?}");
            };
            let e = event(&v);
            let done = e.0 == kind && e.1 == path;
            seen.push(e);
            if done {
                return seen;
            }
        }
    }
}

async fn watch_request(server: &TestServer, sid: &str, query: &str) -> reqwest::Response {
    server
        .client
        .get(format!(
            "{}/v1/sandboxes/{sid}/files:watch?{query}",
            server.base
        ))
        .send()
        .await
        .expect("files:watch")
}

/// `(type, path)` of a line (`path` empty when it has none).
fn event(v: &Value) -> (String, String) {
    (
        v["type"].as_str().unwrap_or_default().to_string(),
        v["path"].as_str().unwrap_or_default().to_string(),
    )
}

fn events(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, p)| (k.to_string(), p.to_string()))
        .collect()
}

async fn sh_ok(server: &TestServer, sid: &str, script: &str) {
    let v = server.sh(sid, script).await;
    assert_eq!(v["exitCode"], 0, "{script}: {v}");
}

#[tokio::test]
async fn events_arrive_in_order_for_a_directory_and_a_new_subdirectory() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "mkdir -p w").await;
    let mut w = Watch::open(&server, &sid, "path=w&recursive=true").await;

    sh_ok(&server, &sid, "echo a > w/f").await;
    assert_eq!(
        w.until("write", "w/f").await,
        events(&[("create", "w/f"), ("write", "w/f")])
    );
    sh_ok(&server, &sid, "mv w/f w/g && rm w/g").await;
    assert_eq!(
        w.until("remove", "w/g").await,
        events(&[("rename", "w/f"), ("create", "w/g"), ("remove", "w/g")])
    );
    sh_ok(&server, &sid, "mkdir w/sub").await;
    assert_eq!(
        w.until("create", "w/sub").await,
        events(&[("create", "w/sub")])
    );
    // The new subdirectory is watched: what happens in it comes in order.
    sh_ok(
        &server,
        &sid,
        "echo c > w/sub/h && mv w/sub/h w/sub/i && rm w/sub/i",
    )
    .await;
    assert_eq!(
        w.until("remove", "w/sub/i").await,
        events(&[
            ("create", "w/sub/h"),
            ("write", "w/sub/h"),
            ("rename", "w/sub/h"),
            ("create", "w/sub/i"),
            ("remove", "w/sub/i"),
        ])
    );
    sh_ok(&server, &sid, "chmod 600 w/sub").await;
    w.until("chmod", "w/sub").await;

    // The watched directory's removal ends the stream, saying why.
    sh_ok(&server, &sid, "rm -rf w").await;
    let deadline = Instant::now() + EVENT_BOUND;
    let mut last = None;
    while let Some(v) = w.line(deadline).await {
        last = Some(v);
    }
    let last = last.expect("lines before the end");
    assert_eq!(last["type"], "end", "{last}");
    assert!(
        last["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("removed"),
        "{last}"
    );
}

#[tokio::test]
async fn a_file_written_through_the_api_is_created_and_its_temporary_file_is_not_reported() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "mkdir -p w").await;
    let mut watch = Watch::open(&server, &sid, "path=w").await;
    let (status, body) = server
        .write_files(
            &sid,
            serde_json::json!([{"path": "w/x.txt", "contentBase64": crate::harness::b64(b"one")}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // A user's file named like one is reported: the control.
    sh_ok(&server, &sid, "echo y > w/.sandboxd-notatemp").await;
    let seen = watch.until("create", "w/.sandboxd-notatemp").await;
    assert!(
        seen.contains(&("create".into(), "w/x.txt".into())),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .all(|(_, p)| p == "w/x.txt" || p == "w/.sandboxd-notatemp"),
        "only the user's names: {seen:?}"
    );
}

#[tokio::test]
async fn a_flat_watch_leaves_out_what_happens_in_subdirectories() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "mkdir -p w/sub").await;
    let mut flat = Watch::open(&server, &sid, "path=w").await;
    // The positive control: the same events, watched recursively.
    let mut deep = Watch::open(&server, &sid, "path=/workspace/w&recursive=true").await;
    sh_ok(&server, &sid, "echo x > w/sub/inner && echo y > w/top").await;
    let seen = flat.until("create", "w/top").await;
    assert!(
        seen.iter().all(|(_, p)| !p.starts_with("w/sub/")),
        "{seen:?}"
    );
    let seen = deep.until("create", "w/top").await;
    assert!(
        seen.contains(&("create".into(), "w/sub/inner".into())),
        "{seen:?}"
    );
}

#[tokio::test]
async fn an_overflow_is_reported_when_the_queue_is_exceeded() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_WATCH_QUEUE_EVENTS", "8"))
            .await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "mkdir -p w").await;
    let mut w = Watch::open(&server, &sid, "path=w").await;
    // 200 creates within one gathering of events: past the 8 queued.
    sh_ok(
        &server,
        &sid,
        "cd w && for i in $(seq 1 200); do : > f$i; done",
    )
    .await;
    let seen = w.until("overflow", "").await;
    let creates = seen.iter().filter(|(k, _)| k == "create").count();
    assert!(creates < 200, "events were dropped: {creates} creates");
    // The watch goes on after an overflow.
    sh_ok(&server, &sid, "sleep 0.3; : > w/after").await;
    w.until("create", "w/after").await;
}

#[tokio::test]
async fn a_symlink_out_of_the_workspace_is_not_followed() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(
        &server,
        &sid,
        "mkdir -p /tmp/outside w && ln -s /tmp/outside w/link",
    )
    .await;
    let mut w = Watch::open(&server, &sid, "path=w&recursive=true").await;
    sh_ok(
        &server,
        &sid,
        "echo s > /tmp/outside/secret && echo m > w/marker",
    )
    .await;
    let seen = w.until("create", "w/marker").await;
    assert!(seen.iter().all(|(_, p)| !p.contains("secret")), "{seen:?}");
    // Watching the link itself leads out: refused like every file route.
    let resp = watch_request(&server, &sid, "path=w/link").await;
    let status = resp.status().as_u16();
    let v: Value = resp.json().await.expect("json");
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("symlink_escape")),
        "{v}"
    );
}

#[tokio::test]
async fn bad_paths_are_refused_like_every_file_routes() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "echo f > file").await;
    for (query, status, code) in [
        ("path=missing", 404, "file_not_found"),
        ("path=file", 400, "not_a_directory"),
        ("path=../etc", 400, "invalid_request"),
        ("path=/etc", 400, "invalid_request"),
    ] {
        let resp = watch_request(&server, &sid, query).await;
        let got = resp.status().as_u16();
        let v: Value = resp.json().await.expect("json");
        assert_eq!(
            (got, v["code"].as_str()),
            (status, Some(code)),
            "{query}: {v}"
        );
    }
    let resp = watch_request(&server, "sbx_nope", "path=w").await;
    assert_eq!(resp.status().as_u16(), 404);
}

#[tokio::test]
async fn closing_the_stream_removes_the_watch_in_the_sandbox() {
    // Heartbeats often: a closed client is noticed at the next write.
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_LOG_HEARTBEAT_MS", "200"))
            .await;
    let sid = server.offline_sandbox().await;
    let mut open = Vec::new();
    for _ in 0..MAX_WATCHES {
        open.push(Watch::open(&server, &sid, "").await);
    }
    // The agent's cap: one more is refused while all of them run.
    let resp = watch_request(&server, &sid, "").await;
    let status = resp.status().as_u16();
    let v: Value = resp.json().await.expect("json");
    assert_eq!(
        (status, v["code"].as_str()),
        (429, Some("too_many_watches")),
        "{v}"
    );
    // One client goes: its watch is removed in the agent, so one can start
    // again.
    drop(open.pop());
    let deadline = Instant::now() + EVENT_BOUND;
    let again = loop {
        let resp = watch_request(&server, &sid, "").await;
        if resp.status().as_u16() == 200 {
            break resp;
        }
        assert!(
            Instant::now() < deadline,
            "the closed watch was not removed: {}",
            resp.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The others still run.
    let mut w = open.pop().expect("a watch");
    sh_ok(&server, &sid, ": > still").await;
    w.until("create", "still").await;
    drop(again);
}

/// Under gVisor too: its inotify reports creates, writes, renames and
/// removes, recursively.
#[tokio::test]
async fn smoke_create_write_rename_remove() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "mkdir -p w").await;
    let mut w = Watch::open(&server, &sid, "path=w&recursive=true").await;
    sh_ok(&server, &sid, "mkdir w/d && echo a > w/d/f").await;
    let seen = w.until("create", "w/d/f").await;
    assert_eq!(
        seen.first(),
        Some(&("create".into(), "w/d".into())),
        "{seen:?}"
    );
    sh_ok(&server, &sid, "echo b >> w/d/f").await;
    w.until("write", "w/d/f").await;
    sh_ok(&server, &sid, "mv w/d/f w/g && rm w/g").await;
    let seen = w.until("remove", "w/g").await;
    let rename = seen
        .iter()
        .position(|e| *e == ("rename".into(), "w/d/f".into()));
    let create = seen
        .iter()
        .position(|e| *e == ("create".into(), "w/g".into()));
    assert!(
        matches!((rename, create), (Some(r), Some(c)) if r < c),
        "{seen:?}"
    );
}
