//! `"changes"` on commands: the files a command created, modified and
//! deleted in the workspace, in the `commands:run` answer and in the
//! `exit` record of its log; ignored directories, the cap with an exact
//! count, refusals naming the field, the scan when inotify cannot be used,
//! the per-sandbox watch budget (a sandbox past it scans, the others keep
//! inotify), and the report of a command that outlived a restart of
//! sandboxd.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{ServerOptions, TestServer, eventually, under_gvisor};

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

/// Watches the filler leaves to the sandbox user (below): room for
/// sandbox A's whole workspace and a little more, not for B's too.
const HEADROOM: usize = A_DIRS + 200;
/// Directories of sandbox A's workspace: more than [`BUDGET`].
const A_DIRS: usize = 3000;
/// Directories of sandbox B's workspace: within [`BUDGET`], more than
/// [`HEADROOM`] leaves once A holds its whole workspace.
const B_DIRS: usize = 1000;
/// `changes_watch_budget` of the test.
const BUDGET: usize = 1500;

/// Has the sandbox user hold every inotify watch the kernel allows it but
/// [`HEADROOM`] (one instance, watches on empty files in /tmp), so that
/// a test can reach the per-user limit without thousands of directories
/// per sandbox; writes what it held and why it stopped to /tmp/held.
/// Returns the command's id once it holds them.
async fn hold_all_watches_but_headroom(server: &TestServer, sid: &str) -> (String, String) {
    let script = format!(
        "exec python3 -c '\nimport ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\nlimit = int(open(\"/proc/sys/fs/inotify/max_user_watches\").read())\nos.makedirs(\"/tmp/w\")\nfd = libc.inotify_init1(0o2000000)\nwds, err = [], 0\nwhile len(wds) <= limit:\n    p = \"/tmp/w/%d\" % len(wds)\n    open(p, \"w\").close()\n    wd = libc.inotify_add_watch(fd, p.encode(), 4)\n    if wd < 0:\n        err = ctypes.get_errno()\n        break\n    wds.append(wd)\nfor wd in wds[len(wds) - {HEADROOM}:]:\n    libc.inotify_rm_watch(fd, wd)\nopen(\"/tmp/held\", \"w\").write(\"%d %d %d\" % (len(wds) - {HEADROOM}, err, limit))\ntime.sleep(600)\n'"
    );
    let cid = server
        .start_command(sid, json!({"command": script, "timeoutMs": 600_000}))
        .await;
    eventually(Duration::from_secs(120), "the filler holds", || async {
        let r = server.sh(sid, "cat /tmp/held 2>/dev/null").await;
        !r["stdout"].as_str().unwrap_or_default().is_empty()
    })
    .await;
    let held = server.sh(sid, "cat /tmp/held").await["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (cid, held)
}

/// Makes `n` empty directories under `top` in the workspace.
async fn make_dirs(server: &TestServer, sid: &str, top: &str, n: usize) {
    let r = server
        .sh(
            sid,
            &format!(
                "python3 -c 'import os\nfor i in range({n}): os.makedirs(\"{top}/d%05d\" % i)'"
            ),
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");
}

/// Sandbox A's workspace needs more watches than the budget: its report
/// is a scan (exact), and it holds none, so sandbox B, next to it, keeps
/// inotify. The kernel's per-user limit is brought within reach by a
/// third sandbox holding all watches but [`HEADROOM`]; the positive
/// control is the same run with a budget A fits in (as without one): A
/// then holds its whole workspace and B's report is a scan. Under gVisor
/// each sandbox has its own kernel and limits, so only the budget's own
/// effect on A (and B's inotify) is checked.
#[tokio::test]
async fn a_sandbox_past_its_watch_budget_scans_and_leaves_the_others_inotify() {
    for (budget, a_method, b_method) in [
        (BUDGET, "scan", "inotify"),
        // Positive control: a budget larger than A's workspace.
        (1_048_576, "inotify", "scan"),
    ] {
        if under_gvisor() && budget != BUDGET {
            continue;
        }
        let server = TestServer::start_with(
            ServerOptions::default().env("SANDBOXD_CHANGES_WATCH_BUDGET", &budget.to_string()),
        )
        .await;
        let a = server.offline_sandbox().await;
        let b = server.offline_sandbox().await;
        make_dirs(&server, &a, "many", A_DIRS).await;
        assert_eq!(server.sh(&b, SETUP).await["exitCode"], 0);
        make_dirs(&server, &b, "tree", B_DIRS).await;
        let mut filler = None;
        if !under_gvisor() {
            let c = server.offline_sandbox().await;
            let (cid, held) = hold_all_watches_but_headroom(&server, &c).await;
            // It stopped at the kernel's limit (ENOSPC), not at its own
            // bound: the user now has HEADROOM watches left.
            assert_eq!(
                held.split(' ').nth(1),
                Some("28"),
                "the filler did not reach the limit: {held}"
            );
            filler = Some((c, cid));
        }
        // A's command runs (and its watch holds what it took) until told.
        let a_cmd = server
            .start_command(
                &a,
                json!({"command": "touch a-made && until test -e /tmp/go; do sleep 0.05; done", "changes": true, "timeoutMs": 120_000}),
            )
            .await;
        let r = server
            .run(&b, json!({"command": ACT, "changes": true}))
            .await;
        assert_eq!(server.sh(&a, "touch /tmp/go").await["exitCode"], 0);
        let records = server.log_records(&a, &a_cmd, "").await;
        if let Some((c, cid)) = &filler {
            let (s, _) = server
                .post(&format!("/v1/sandboxes/{c}/commands/{cid}:kill"), json!({}))
                .await;
            assert_eq!(s, 200);
        }
        let b_changes = &r["changes"];
        eprintln!(
            "budget {budget}: B's run took {} ms by {}",
            r["durationMs"], b_changes["method"]
        );
        assert_eq!(b_changes["files"], expected(), "{b_changes}");
        assert_eq!(b_changes["complete"], true, "{b_changes}");
        assert_eq!(
            b_changes["method"], b_method,
            "budget {budget}: sandbox B, whose workspace fits its own budget: {b_changes}"
        );
        let exit = records.last().expect("records");
        assert_eq!(exit["stream"], "exit", "{records:?}");
        assert_eq!(
            exit["changes"]["files"],
            json!([{"path": "a-made", "kind": "created", "size": 0}]),
            "{exit}"
        );
        assert_eq!(
            exit["changes"]["method"], a_method,
            "budget {budget}: sandbox A, {A_DIRS} directories: {exit}"
        );
    }
}
