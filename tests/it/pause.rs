//! Pausing and resuming a sandbox: its processes are frozen and go on
//! where they were, every call on it is refused as paused meanwhile, the
//! pause survives a restart of sandboxd (and its commands are found again
//! on resume), a paused sandbox is never idle-expired, a fork from its
//! checkpoint leaves it paused, and all of it under gVisor too.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, eventually};

async fn act(server: &TestServer, sid: &str, action: &str) -> (u16, Value) {
    server
        .post(&format!("/v1/sandboxes/{sid}:{action}"), json!(null))
        .await
}

async fn state(server: &TestServer, sid: &str) -> Value {
    let (status, v) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(status, 200, "{v}");
    v["state"].clone()
}

/// The value the counting command last wrote.
async fn count(server: &TestServer, sid: &str) -> u64 {
    let r = server.sh(sid, "cat counter").await;
    r["stdout"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count: {r}"))
}

/// Starts a command that counts in `counter` ten times a second, and
/// waits for its first count.
async fn start_counting(server: &TestServer, sid: &str) -> String {
    let cid = server
        .start_command(
            sid,
            // Replaced whole (a rename), never truncated then written: a
            // reader between the two read an empty file.
            json!({"command": "i=0; while true; do i=$((i+1)); echo $i > counter.new && mv counter.new counter; sleep 0.1; done", "timeoutMs": 600000}),
        )
        .await;
    eventually(Duration::from_secs(10), "the first count", || async {
        server.sh(sid, "test -s counter").await["exitCode"] == 0
    })
    .await;
    cid
}

/// Asserts the count goes on rising from where it was.
async fn counting_goes_on(server: &TestServer, sid: &str) {
    let before = count(server, sid).await;
    eventually(Duration::from_secs(10), "the count rises", || async {
        count(server, sid).await > before
    })
    .await;
}

#[tokio::test]
async fn a_paused_sandbox_is_frozen_refuses_calls_and_resumes_where_it_was() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let cid = start_counting(&server, &sid).await;
    let (_, list) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    let pid = list["commands"][0]["pid"].clone();

    assert_eq!(
        act(&server, &sid, "pause").await,
        (200, json!({"ok": true}))
    );
    assert_eq!(state(&server, &sid).await, "paused");
    let (_, all) = server.get("/v1/sandboxes").await;
    let listed: Vec<&Value> = all["sandboxes"]
        .as_array()
        .expect("list")
        .iter()
        .filter(|s| s["sandboxId"] == sid.as_str())
        .collect();
    assert_eq!(listed[0]["state"], "paused", "{all}");
    let frozen = server.inspect(&sid).await.state.expect("state");
    assert_eq!(frozen.paused, Some(true), "the engine froze it");

    // Every call on it is refused as paused, a second pause too.
    for (status, v) in [
        server
            .post(
                &format!("/v1/sandboxes/{sid}/commands:run"),
                json!({"command": "true"}),
            )
            .await,
        server.read_file(&sid, "counter").await,
        server.get(&format!("/v1/sandboxes/{sid}/commands")).await,
        act(&server, &sid, "restart").await,
        act(&server, &sid, "pause").await,
    ] {
        assert_eq!(
            (status, v["code"].clone()),
            (409, json!("sandbox_paused")),
            "{v}"
        );
    }

    assert_eq!(
        act(&server, &sid, "resume").await,
        (200, json!({"ok": true}))
    );
    assert_eq!(state(&server, &sid).await, "running");
    let (status, v) = act(&server, &sid, "resume").await;
    assert_eq!(
        (status, v["code"].clone()),
        (409, json!("sandbox_not_paused")),
        "{v}"
    );
    // The same process counts on: nothing was restarted.
    counting_goes_on(&server, &sid).await;
    let (_, list) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    let again = &list["commands"][0];
    assert_eq!(
        (
            again["commandId"].clone(),
            again["state"].clone(),
            again["pid"].clone()
        ),
        (json!(cid), json!("running"), pid),
        "{list}"
    );

    // A paused sandbox can be stopped.
    assert_eq!(act(&server, &sid, "pause").await.0, 200);
    assert_eq!(act(&server, &sid, "stop").await, (200, json!({"ok": true})));
    assert!(
        server
            .containers_with("sandboxd.sandbox_id", &sid)
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn a_pause_survives_a_restart_of_sandboxd_and_its_commands_are_found_on_resume() {
    let mut server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let cid = start_counting(&server, &sid).await;
    assert_eq!(act(&server, &sid, "pause").await.0, 200);
    server.restart().await;
    assert_eq!(state(&server, &sid).await, "paused", "adopted paused");
    assert_eq!(
        server.inspect(&sid).await.state.expect("state").paused,
        Some(true)
    );

    assert_eq!(act(&server, &sid, "resume").await.0, 200);
    let (_, list) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert!(
        list["commands"]
            .as_array()
            .expect("commands")
            .iter()
            .any(|c| c["commandId"] == cid.as_str() && c["state"] == "running"),
        "the running command is found again: {list}"
    );
    counting_goes_on(&server, &sid).await;
}

#[tokio::test]
async fn a_paused_sandbox_is_never_idle_expired() {
    let server = TestServer::start().await;
    let paused = server
        .create(json!({"sessionKey": "paused", "idleTtlMs": 10000, "network": {"mode": "none"}}))
        .await;
    let idle = server
        .create(json!({"sessionKey": "idle", "idleTtlMs": 10000, "network": {"mode": "none"}}))
        .await;
    assert_eq!(act(&server, &paused, "pause").await.0, 200);
    // The other one, as idle as long, expires (a positive control). The
    // list is polled: a `GET` of one counts as use.
    eventually(
        Duration::from_secs(30),
        "the idle sandbox expires",
        || async {
            let (_, all) = server.get("/v1/sandboxes").await;
            let ids: Vec<&str> = all["sandboxes"]
                .as_array()
                .map(|l| l.iter().filter_map(|s| s["sandboxId"].as_str()).collect())
                .unwrap_or_default();
            !ids.contains(&idle.as_str()) && ids.contains(&paused.as_str())
        },
    )
    .await;
    assert_eq!(state(&server, &paused).await, "paused");
    assert_eq!(act(&server, &paused, "resume").await.0, 200);
}

/// A fork needs none of its source's processes (the checkpoint's content
/// is in the store, outside the sandbox): a paused sandbox is forked from
/// as it is, not resumed, and the fork is the checkpoint, not the
/// workspace as it was paused.
#[tokio::test]
async fn a_paused_sandbox_is_forked_from_its_checkpoint_and_stays_paused() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let turn = "mkdir -p d/empty && echo one > d/a && chmod 640 d/a && ln -s d/a link";
    assert_eq!(server.sh(&sid, turn).await["exitCode"], 0);
    let (status, cp) = server
        .post(
            &format!("/v1/sandboxes/{sid}/checkpoints"),
            json!({"label": "before-pause"}),
        )
        .await;
    assert_eq!(status, 201, "{cp}");
    let at_checkpoint = crate::checkpoints::tree_hash(&server, &sid).await;
    let later = "echo two > d/a && echo later > later && rmdir d/empty";
    assert_eq!(server.sh(&sid, later).await["exitCode"], 0);
    let as_paused = crate::checkpoints::tree_hash(&server, &sid).await;
    assert_ne!(as_paused, at_checkpoint, "the workspace moved on");
    assert_eq!(act(&server, &sid, "pause").await.0, 200);
    // The pause holds: a call that needs the sandbox is refused.
    let (status, v) = server.read_file(&sid, "d/a").await;
    assert_eq!((status, v["code"].clone()), (409, json!("sandbox_paused")));

    let (status, forked) = server
        .post_within(
            "/v1/sandboxes",
            json!({
                "sessionKey": harness::unique_instance(),
                "network": {"mode": "none"},
                "from": {"sandboxId": sid, "checkpointId": cp["checkpointId"]},
            }),
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(
        (status, &forked["created"]),
        (200, &json!(true)),
        "{forked}"
    );
    let fork = forked["sandboxId"].as_str().expect("sandboxId");
    assert_eq!(
        crate::checkpoints::tree_hash(&server, fork).await,
        at_checkpoint,
        "the fork is the checkpoint"
    );

    assert_eq!(state(&server, &sid).await, "paused", "still paused");
    assert_eq!(
        server.inspect(&sid).await.state.expect("state").paused,
        Some(true),
        "still frozen in the engine"
    );
    assert_eq!(act(&server, &sid, "resume").await.0, 200);
    assert_eq!(
        crate::checkpoints::tree_hash(&server, &sid).await,
        as_paused,
        "the source is as it was paused"
    );
}

/// A paused sandbox's checkpoints are in the store, outside it: they are
/// listed, compared with each other (as text too) and deleted without a
/// resume. What needs the sandbox's files (a new checkpoint, a diff with
/// the workspace now, a restore) is refused as paused, and changes
/// nothing.
#[tokio::test]
async fn a_paused_sandboxs_checkpoints_are_listed_compared_and_deleted_and_the_rest_is_refused() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(server.sh(&sid, "echo one > a").await["exitCode"], 0);
    let first = crate::checkpoints::checkpoint(&server, &sid, "turn-1").await;
    assert_eq!(
        server.sh(&sid, "echo two > a && echo new > b").await["exitCode"],
        0
    );
    let second = crate::checkpoints::checkpoint(&server, &sid, "turn-2").await;
    let (one, two) = (
        first["checkpointId"].as_str().expect("id"),
        second["checkpointId"].as_str().expect("id"),
    );
    let base = format!("/v1/sandboxes/{sid}/checkpoints");
    let (status, running_list) = server.get(&base).await;
    assert_eq!(status, 200, "{running_list}");
    let (status, running_diff) = server
        .get(&format!("{base}/{one}/diff?to={two}&text=true"))
        .await;
    assert_eq!(status, 200, "{running_diff}");
    assert_eq!(running_diff["text"]["files"], 2, "{running_diff}");

    assert_eq!(act(&server, &sid, "pause").await.0, 200);
    let (status, v) = server.read_file(&sid, "a").await;
    assert_eq!(
        (status, v["code"].clone()),
        (409, json!("sandbox_paused")),
        "the pause holds"
    );

    let (status, list) = server.get(&base).await;
    assert_eq!(
        (status, &list),
        (200, &running_list),
        "listed as when running"
    );
    let (status, diff) = server
        .get(&format!("{base}/{one}/diff?to={two}&text=true"))
        .await;
    assert_eq!(
        (status, &diff),
        (200, &running_diff),
        "compared as when running"
    );

    for (what, (status, v)) in [
        (
            "a new checkpoint",
            server.post(&base, json!({"label": "turn-3"})).await,
        ),
        (
            "a diff with the workspace now",
            server.get(&format!("{base}/{one}/diff?to=current")).await,
        ),
        (
            "a restore",
            server
                .post(&format!("{base}/{one}:restore"), json!({}))
                .await,
        ),
    ] {
        assert_eq!(
            (status, v["code"].clone()),
            (409, json!("sandbox_paused")),
            "{what}: {v}"
        );
    }

    assert_eq!(crate::checkpoints::delete(&server, &sid, one).await, 200);
    let (status, list) = server.get(&base).await;
    assert_eq!(status, 200, "{list}");
    let labels: Vec<&Value> = list["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| &c["label"])
        .collect();
    assert_eq!(labels, [&json!("turn-2")], "only the deleted one went");

    assert_eq!(state(&server, &sid).await, "paused", "still paused");
    assert_eq!(act(&server, &sid, "resume").await.0, 200);
    let r = server.sh(&sid, "cat a b").await;
    assert_eq!(
        r["stdout"], "two\nnew\n",
        "the workspace was not restored: {r}"
    );
}

/// Under gVisor the engine's pause is runsc's (it stops gVisor's sandbox,
/// its kernel included), and the counting goes on after the resume as
/// under the default runtime.
#[tokio::test]
async fn a_gvisor_sandbox_pauses_and_resumes_too() {
    let config =
        std::env::temp_dir().join(format!("{}-pause-gvisor.toml", harness::unique_instance()));
    std::fs::write(&config, "[runtimes.gvisor]\noci_runtime = \"runsc\"\n").expect("config");
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_CONFIG", config.to_str().expect("utf8")),
    )
    .await;
    let sid = server
        .create(json!({"sessionKey": "g", "runtime": "gvisor", "network": {"mode": "none"}}))
        .await;
    let hc = server.inspect(&sid).await.host_config.expect("host config");
    assert_eq!(hc.runtime.as_deref(), Some("runsc"));
    start_counting(&server, &sid).await;
    assert_eq!(
        act(&server, &sid, "pause").await,
        (200, json!({"ok": true}))
    );
    assert_eq!(
        server.inspect(&sid).await.state.expect("state").paused,
        Some(true)
    );
    assert_eq!(
        act(&server, &sid, "resume").await,
        (200, json!({"ok": true}))
    );
    counting_goes_on(&server, &sid).await;
    let _ = std::fs::remove_file(&config);
}
