//! `"changes"` on commands: the files a command created, modified and
//! deleted in the workspace, in the `commands:run` answer and in the
//! `exit` record of its log; ignored directories, the cap with an exact
//! count, refusals naming the field, the scan when inotify cannot be used,
//! and the report of a command that outlived a restart of sandboxd.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{TestServer, eventually, under_gvisor};

/// Files, some in directories left out by default. The files are a
/// little older than the clock margin of a scan when the command after
/// this starts (see docs/API.md), so that no file is in doubt whichever
/// method the agent uses.
const SETUP: &str = "mkdir -p sub node_modules/pkg .git deep/__pycache__ .venv/lib build \
    && for f in keep edit gone again perm stamp sub/old node_modules/pkg/a .git/HEAD deep/__pycache__/c.pyc .venv/lib/x build/out; do echo 1 > $f; done \
    && sleep 0.1";

/// What the command does: every kind of change, in and out of the
/// ignored directories.
const ACT: &str = "echo 22 > edit && rm gone && rm again && echo 333 > again \
    && echo 4444 > new && echo x > brief && rm brief \
    && mkdir -p made/inner && echo 55555 > made/inner/f && mkdir empty \
    && mv sub moved && ln -s new link && chmod 600 perm && touch stamp \
    && echo changed > node_modules/pkg/a && touch node_modules/pkg/b \
    && echo ref > .git/HEAD && touch .git/index && touch deep/__pycache__/d.pyc \
    && echo y > .venv/lib/x && echo z > build/out";

/// The changes `ACT` makes outside the default ignored directories.
fn expected() -> Value {
    json!([
        {"path": "again", "kind": "modified", "size": 4},
        {"path": "build/out", "kind": "modified", "size": 2},
        {"path": "edit", "kind": "modified", "size": 3},
        {"path": "gone", "kind": "deleted"},
        {"path": "link", "kind": "created", "size": 3},
        {"path": "made/inner/f", "kind": "created", "size": 6},
        {"path": "moved/old", "kind": "created", "size": 2},
        {"path": "new", "kind": "created", "size": 5},
        {"path": "perm", "kind": "modified", "size": 2},
        {"path": "stamp", "kind": "modified", "size": 2},
        {"path": "sub/old", "kind": "deleted"},
    ])
}

#[tokio::test]
async fn run_reports_what_changed_outside_the_ignored_directories() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, SETUP).await["exitCode"], 0);
    let r = server
        .run(&sid, json!({"command": ACT, "changes": true}))
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");
    let changes = &r["changes"];
    assert_eq!(changes["files"], expected(), "{changes}");
    assert_eq!(changes["more"], 0);
    assert_eq!(changes["complete"], true);
    assert!(
        matches!(changes["method"].as_str(), Some("inotify" | "scan")),
        "{changes}"
    );

    // A timeout: what the files are once the tree ended.
    let r = server
        .run(
            &sid,
            json!({"command": "echo t > timed && sleep 30", "timeoutMs": 1000, "changes": true}),
        )
        .await;
    assert_eq!(r["timedOut"], true, "{r}");
    assert_eq!(
        r["changes"]["files"],
        json!([{"path": "timed", "kind": "created", "size": 2}])
    );
    // What a process it left running writes later is not in it.
    let r = server
        .run(
            &sid,
            json!({"command": "(sleep 1; echo l > later) >/dev/null 2>&1 & echo n > now", "changes": true}),
        )
        .await;
    assert_eq!(
        r["changes"]["files"],
        json!([{"path": "now", "kind": "created", "size": 2}])
    );
    eventually(Duration::from_secs(10), "the leftover wrote", || async {
        server.sh(&sid, "cat later 2>/dev/null").await["stdout"] == "l\n"
    })
    .await;

    // What another command writes while this one runs is in it: the
    // workspace is watched, not the command.
    server
        .start_command(&sid, json!({"command": "sleep 0.5 && echo o > other"}))
        .await;
    let r = server
        .run(
            &sid,
            json!({"command": "until test -s other; do sleep 0.1; done", "changes": true, "timeoutMs": 10000}),
        )
        .await;
    assert_eq!(
        r["changes"]["files"],
        json!([{"path": "other", "kind": "created", "size": 2}]),
        "{r}"
    );

    // Without the option there is no report.
    let r = server.run(&sid, json!({"command": "touch x"})).await;
    assert!(r.get("changes").is_none(), "{r}");
    let r = server
        .run(&sid, json!({"command": "touch y", "changes": false}))
        .await;
    assert!(r.get("changes").is_none(), "{r}");
}

#[tokio::test]
async fn the_exit_record_carries_the_changes_and_ignore_replaces_the_defaults() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, SETUP).await["exitCode"], 0);
    // Only `build` and `.venv` are left out now: node_modules, .git and
    // __pycache__ count.
    let cid = server
        .start_command(
            &sid,
            json!({"command": ACT, "changes": {"ignore": ["build", ".venv"], "max": 100}}),
        )
        .await;
    let records = server.log_records(&sid, &cid, "").await;
    let exit = records.last().expect("records");
    assert_eq!(exit["stream"], "exit", "{records:?}");
    assert_eq!(exit["exitCode"], 0, "{exit}");
    let mut want: Vec<Value> = expected()
        .as_array()
        .expect("array")
        .iter()
        .filter(|c| c["path"] != "build/out")
        .cloned()
        .collect();
    want.extend([
        json!({"path": ".git/HEAD", "kind": "modified", "size": 4}),
        json!({"path": ".git/index", "kind": "created", "size": 0}),
        json!({"path": "deep/__pycache__/d.pyc", "kind": "created", "size": 0}),
        json!({"path": "node_modules/pkg/a", "kind": "modified", "size": 8}),
        json!({"path": "node_modules/pkg/b", "kind": "created", "size": 0}),
    ]);
    want.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    assert_eq!(exit["changes"]["files"], json!(want), "{exit}");
    assert_eq!(exit["changes"]["more"], 0);
    assert_eq!(exit["changes"]["complete"], true);

    // A command started without the option: no `changes` on its exit.
    let cid = server
        .start_command(&sid, json!({"command": "touch z"}))
        .await;
    let records = server.log_records(&sid, &cid, "").await;
    let exit = records.last().expect("records");
    assert_eq!(exit["stream"], "exit");
    assert!(exit.get("changes").is_none(), "{exit}");
}

#[tokio::test]
async fn a_hundred_thousand_files_are_capped_with_an_exact_count() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let script = "mkdir many && cd many && python3 -c '\nfor i in range(100000):\n    open(\"f%06d\" % i, \"w\").close()\n'";
    let r = server
        .run(
            &sid,
            json!({"command": script, "changes": true, "timeoutMs": 300000}),
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");
    let changes = &r["changes"];
    let files = changes["files"].as_array().expect("files");
    assert_eq!(files.len(), 1000);
    assert_eq!(changes["more"], 99_000, "{}", changes["method"]);
    assert_eq!(changes["complete"], true);
    for (i, f) in files.iter().enumerate() {
        assert_eq!(
            f,
            &json!({"path": format!("many/f{i:06}"), "kind": "created", "size": 0})
        );
    }

    // Deleting them all: the same count, the first by path listed.
    let r = server
        .run(
            &sid,
            json!({"command": "rm -rf many", "changes": {"max": 10}, "timeoutMs": 300000}),
        )
        .await;
    let changes = &r["changes"];
    assert_eq!(changes["files"].as_array().map(Vec::len), Some(10));
    assert_eq!(
        changes["files"][0],
        json!({"path": "many/f000000", "kind": "deleted"})
    );
    assert_eq!(changes["more"], 99_990);
}

#[tokio::test]
async fn bad_changes_values_are_refused_naming_the_field() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    for (changes, field) in [
        (json!(1), "changes"),
        (json!("yes"), "changes"),
        (json!({"max": 0}), "changes.max"),
        (json!({"max": 10001}), "changes.max"),
        (json!({"ignore": "node_modules"}), "changes.ignore"),
        (json!({"ignore": ["ok", "a/b"]}), "changes.ignore[1]"),
        (json!({"ignore": [".."]}), "changes.ignore[0]"),
        (json!({"paths": ["x"]}), "changes.paths"),
    ] {
        for route in ["commands", "commands:run"] {
            let (s, v) = server
                .post(
                    &format!("/v1/sandboxes/{sid}/{route}"),
                    json!({"command": "touch never", "changes": changes}),
                )
                .await;
            assert_eq!(s, 400, "{changes}: {v}");
            assert_eq!(v["code"], "invalid_request", "{v}");
            let message = v["error"].as_str().unwrap_or_default();
            assert!(message.starts_with(&format!("{field}:")), "{changes}: {v}");
        }
    }
    let r = server.sh(&sid, "test -e never; echo $?").await;
    assert_eq!(r["stdout"], "1\n", "nothing ran");
}

#[tokio::test]
async fn a_scan_is_used_when_the_sandbox_holds_every_inotify_instance() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, SETUP).await["exitCode"], 0);
    // The sandbox's own code takes every inotify instance its user may
    // have (the limit is per user, and the agent runs as that user).
    // gVisor's own kernel has no such limit: the holder stops at 4096 and
    // the agent goes on using inotify.
    let holder = server
        .start_command(
            &sid,
            json!({"command": "exec python3 -c '\nimport ctypes, time\nlibc = ctypes.CDLL(None, use_errno=True)\nfds = []\nwhile len(fds) < 4096:\n    fd = libc.inotify_init1(0o2000000)\n    if fd < 0:\n        break\n    fds.append(fd)\nopen(\"/tmp/held\", \"w\").write(\"%d %d\" % (len(fds), ctypes.get_errno()))\ntime.sleep(600)\n'"}),
        )
        .await;
    eventually(Duration::from_secs(30), "the holder holds", || async {
        let r = server.sh(&sid, "cat /tmp/held 2>/dev/null").await;
        !r["stdout"].as_str().unwrap_or_default().is_empty()
    })
    .await;
    let held = server.sh(&sid, "cat /tmp/held; ulimit -n").await;
    let r = server
        .run(&sid, json!({"command": ACT, "changes": true}))
        .await;
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{holder}:kill"),
            json!({}),
        )
        .await;
    assert_eq!(s, 200);
    let changes = &r["changes"];
    assert_eq!(changes["files"], expected(), "{changes}");
    assert_eq!(changes["complete"], true, "{changes}");
    if under_gvisor() {
        eprintln!("under gVisor, with {held}: {changes}");
    } else {
        assert_eq!(changes["method"], "scan", "{changes} {held}");
    }
}

#[tokio::test]
async fn a_command_that_outlives_a_restart_of_sandboxd_keeps_its_report() {
    let mut server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let cid = server
        .start_command(
            &sid,
            json!({"command": "sleep 3 && echo after > late", "changes": true}),
        )
        .await;
    server.crash_and_restart().await;
    let records = server.log_records(&sid, &cid, "").await;
    let exit = records.last().expect("records");
    assert_eq!(exit["stream"], "exit", "{records:?}");
    assert_eq!(
        exit["changes"]["files"],
        json!([{"path": "late", "kind": "created", "size": 6}]),
        "{exit}"
    );
}

#[tokio::test]
async fn odd_names_and_unreadable_directories() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(
        server
            .sh(&sid, "mkdir locked && echo 1 > locked/f && sleep 0.1")
            .await["exitCode"],
        0
    );
    // A name that is not UTF-8 reads with U+FFFD; a directory the sandbox
    // user cannot read makes the report incomplete.
    let r = server
        .run(
            &sid,
            json!({"command": "touch $'bad\\xff' && chmod 000 locked && sleep 0.1", "changes": true}),
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");
    assert_eq!(
        r["changes"]["files"],
        json!([{"path": "bad\u{fffd}", "kind": "created", "size": 0}])
    );
    assert_eq!(
        r["changes"]["complete"], true,
        "it was readable at the start"
    );
    let r = server
        .run(&sid, json!({"command": "touch ok", "changes": true}))
        .await;
    assert_eq!(r["changes"]["complete"], false, "{r}");
    assert_eq!(
        r["changes"]["files"],
        json!([{"path": "ok", "kind": "created", "size": 0}])
    );
}

#[tokio::test]
async fn a_command_whose_sandbox_went_has_no_report() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let cid = server
        .start_command(
            &sid,
            json!({"command": "touch x && sleep 60", "changes": true}),
        )
        .await;
    let (s, v) = server
        .post(&format!("/v1/sandboxes/{sid}:restart"), json!({}))
        .await;
    assert_eq!(s, 200, "{v}");
    let records = server.log_records(&sid, &cid, "").await;
    let exit = records.last().expect("records");
    assert_eq!(exit["stream"], "exit", "{records:?}");
    assert!(exit.get("changes").is_none(), "{exit}");
}
