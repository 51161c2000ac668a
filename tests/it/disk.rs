//! A workspace that really fills: sandboxd started with
//! `workspace_tmpfs_mb`, so every workspace is a tmpfs of that size and a
//! write past it meets ENOSPC on any machine (a size on disk,
//! `workspace_size_mb`, needs xfs project quotas that CI machines lack).
//! A command that fills it gets "No space left on device"; `files:write`
//! answers `507 insufficient_storage`, for one file and for a write of
//! several whose second file does not fit, and leaves nothing behind;
//! after a delete the sandbox writes again. The module also holds the
//! tmpfs workspace's documented consequences to what happens: its files
//! outlive a restart of sandboxd (the container runs on) and are gone
//! after a restart of the sandbox, whose new workspace is again the
//! sandbox user's.

use std::time::Instant;

use serde_json::{Value, json};

use crate::harness::{ServerOptions, TestServer, b64, sha256_hex};

/// The workspace size every test here runs with.
const WORKSPACE_MB: u64 = 32;

async fn start() -> TestServer {
    TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_WORKSPACE_TMPFS_MB", &WORKSPACE_MB.to_string()),
    )
    .await
}

/// Free KiB of the workspace's filesystem, as the sandbox sees it.
async fn free_kb(server: &TestServer, sid: &str) -> u64 {
    let r = server
        .sh(sid, "df -k --output=avail /workspace | tail -n 1")
        .await;
    r["stdout"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("df answers a number: {r}"))
}

/// Every name in the workspace (hidden ones included), sorted, as one
/// line each: a leftover temporary (`.sandboxd-…`) or directory shows.
async fn names(server: &TestServer, sid: &str) -> String {
    let r = server.sh(sid, "cd /workspace && find . | sort").await;
    assert_eq!(r["exitCode"], 0, "{r}");
    r["stdout"].as_str().unwrap_or_default().to_string()
}

/// Whether `path` is there, by `files:stat`.
async fn exists(server: &TestServer, sid: &str, path: &str) -> bool {
    let (s, v) = server.stat(sid, &[path], false).await;
    assert_eq!(s, 200, "{v}");
    match v["entries"][0]["type"].as_str() {
        Some("missing") => false,
        Some(_) => true,
        None => panic!("a stat names a type: {v}"),
    }
}

fn assert_full(status: u16, v: &Value, what: &str) {
    assert_eq!(
        (status, v["code"].as_str()),
        (507, Some("insufficient_storage")),
        "{what}: {v}"
    );
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left on device")),
        "{what}: the message gives the OS's reason: {v}"
    );
}

#[tokio::test]
async fn a_full_workspace_says_so_leaves_nothing_half_done_and_recovers() {
    let server = start().await;
    let sid = server.offline_sandbox().await;

    // The workspace is the tmpfs asked for, the sandbox user's.
    let r = server
        .sh(
            &sid,
            "df -k --output=size /workspace | tail -n 1 | tr -d ' '; stat -c %u:%g:%a /workspace",
        )
        .await;
    assert_eq!(
        r["stdout"],
        format!("{}\n1000:1000:755\n", WORKSPACE_MB * 1024),
        "the workspace is a {WORKSPACE_MB} MiB tmpfs of the sandbox user: {r}"
    );
    // Positive control: before it is full, the same kind of write works.
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "keep.txt", "contentBase64": b64("old")}]),
        )
        .await;
    assert_eq!(s, 200, "{v}");

    // A command fills it and gets the error itself.
    let began = Instant::now();
    let r = server
        .run(
            &sid,
            json!({"command": format!("head -c {}M /dev/zero > fill", 2 * WORKSPACE_MB), "timeoutMs": 60000}),
        )
        .await;
    let fill_ms = began.elapsed().as_millis();
    assert_ne!(r["exitCode"], 0, "a write past the size fails: {r}");
    assert!(
        r["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("No space left on device")),
        "{r}"
    );
    let r = server.sh(&sid, "stat -c %s fill").await;
    let filled: u64 = r["stdout"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("the size of fill: {r}"));
    assert!(
        filled > (WORKSPACE_MB - 1) << 20 && filled <= WORKSPACE_MB << 20,
        "the command stopped because the workspace was full, at {filled} bytes"
    );
    assert!(
        free_kb(&server, &sid).await < 64,
        "nothing is left to write into"
    );
    let before = names(&server, &sid).await;
    assert_eq!(before, ".\n./fill\n./keep.txt\n");

    // files:write of one file into the full workspace: 507, and no file
    // and no temporary of it.
    let began = Instant::now();
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "more.bin", "contentBase64": b64(vec![b'x'; 1 << 20])}]),
        )
        .await;
    let full_ms = began.elapsed().as_millis();
    assert_full(s, &v, "one file");
    assert!(!exists(&server, &sid, "more.bin").await);
    assert_eq!(names(&server, &sid).await, before, "nothing is left behind");
    eprintln!("filling {WORKSPACE_MB} MiB took {fill_ms} ms; the 507 write {full_ms} ms");

    // A write of several files whose second does not fit, after the first
    // (which would replace keep.txt) was written in full: every file or
    // none, so keep.txt is as it was, the directory the second needed is
    // gone again, and the space the first took is free again.
    let r = server
        .sh(&sid, "rm fill && head -c 2M /dev/zero > room && echo ok")
        .await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
    let r = server
        .sh(&sid, "head -c 64M /dev/zero > fill; echo $?")
        .await;
    assert_ne!(r["stdout"], "0\n", "full again: {r}");
    let r = server.sh(&sid, "rm room && echo ok").await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
    let room = free_kb(&server, &sid).await;
    assert!(
        (1024..4096).contains(&room),
        "about 2 MiB is free: {room} KiB"
    );
    let before = names(&server, &sid).await;
    let (s, v) = server
        .write_files(
            &sid,
            json!([
                {"path": "keep.txt", "contentBase64": b64(vec![b'n'; 256 << 10])},
                {"path": "new/dir/big.bin", "contentBase64": b64(vec![b'x'; 8 << 20])},
            ]),
        )
        .await;
    assert_full(s, &v, "the second of two files");
    let (s, v) = server.read_file(&sid, "keep.txt").await;
    assert_eq!(
        (s, v["sha256"].as_str()),
        (200, Some(sha256_hex("old").as_str())),
        "keep.txt is as it was (its hash; the first file was not committed)"
    );
    assert_eq!(
        names(&server, &sid).await,
        before,
        "no temporary and no directory of the write is left"
    );
    assert_eq!(
        free_kb(&server, &sid).await,
        room,
        "what the write took is free again"
    );

    // A delete makes room, and the sandbox writes again, by both paths.
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/files:delete"),
            json!({"paths": ["fill"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let content = vec![b'y'; 1 << 20];
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "more.bin", "contentBase64": b64(&content)}]),
        )
        .await;
    assert_eq!(s, 200, "the write succeeds again: {v}");
    let (s, v) = server.read_file(&sid, "more.bin").await;
    assert_eq!(
        (s, v["sha256"].as_str()),
        (200, Some(sha256_hex(&content).as_str())),
        "{v}"
    );
    let r = server
        .sh(&sid, "head -c 1M /dev/zero > again && echo wrote")
        .await;
    assert_eq!(r["stdout"], "wrote\n", "{r}");
}

/// What the docs promise of a tmpfs workspace: it lives as long as its
/// container runs. A restart of the sandbox empties it, and the new tmpfs
/// is the sandbox user's again; sandboxd's own restart keeps it (the
/// sandbox is rehydrated from its labels, the container never stopped).
/// In that order: under gVisor a sandbox restarted right after sandboxd
/// restarted sometimes leaves its next request unanswered until
/// `agent_timeout_ms` (502 `agent_failed`), with a workspace on disk as
/// well; that is another matter than this test's.
#[tokio::test]
async fn a_tmpfs_workspace_lives_as_long_as_its_container_runs() {
    let mut server = start().await;
    let sid = server
        .create(json!({"sessionKey": "kept", "network": {"mode": "none"}}))
        .await;
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "notes.txt", "contentBase64": b64("before")}]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(exists(&server, &sid, "notes.txt").await, "written");

    let (s, v) = server
        .post(&format!("/v1/sandboxes/{sid}:restart"), json!({}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        !exists(&server, &sid, "notes.txt").await,
        "the sandbox's restart empties its tmpfs workspace"
    );
    let r = server
        .sh(
            &sid,
            "stat -c %u:%g:%a /workspace && echo remember > notes.txt && echo written",
        )
        .await;
    assert_eq!(
        r["stdout"], "1000:1000:755\nwritten\n",
        "the new workspace is the sandbox user's: {r}"
    );

    server.restart().await;
    let again = server
        .create(json!({"sessionKey": "kept", "network": {"mode": "none"}}))
        .await;
    assert_eq!(again, sid, "the sandbox is rehydrated");
    let (s, v) = server.read_file(&sid, "notes.txt").await;
    assert_eq!(
        (s, v["sha256"].as_str()),
        (200, Some(sha256_hex("remember\n").as_str())),
        "sandboxd's restart keeps the files: {v}"
    );
}
