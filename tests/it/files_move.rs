//! Moving files and making directories: a move within the workspace
//! (parents made, no overwrite unless asked, a symlink moved itself), the
//! refusals with their codes, and no move or directory that leaves the
//! workspace through a symlink, with nothing outside changed.

use serde_json::{Value, json};

use crate::harness::TestServer;

async fn mv(server: &TestServer, sid: &str, body: Value) -> (u16, Value) {
    server
        .post(&format!("/v1/sandboxes/{sid}/files:move"), body)
        .await
}

async fn mkdir(server: &TestServer, sid: &str, path: &str) -> (u16, Value) {
    server
        .post(
            &format!("/v1/sandboxes/{sid}/files:mkdir"),
            json!({ "path": path }),
        )
        .await
}

#[tokio::test]
async fn a_move_renames_within_the_workspace_and_replaces_only_when_asked() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let r = server
        .sh(
            &sid,
            "echo A > a && echo B > b && mkdir -p d/e && echo in > d/e/f",
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");

    assert_eq!(
        mv(
            &server,
            &sid,
            json!({"from": "a", "to": "/workspace/new/place/a2"})
        )
        .await,
        (200, json!({"ok": true}))
    );
    let r = server
        .sh(&sid, "cat new/place/a2; test -e a || echo gone")
        .await;
    assert_eq!(r["stdout"], "A\ngone\n", "{r}");

    let (status, v) = mv(&server, &sid, json!({"from": "b", "to": "new/place/a2"})).await;
    assert_eq!(
        (status, v["code"].clone()),
        (409, json!("file_exists")),
        "{v}"
    );
    let r = server.sh(&sid, "cat b new/place/a2").await;
    assert_eq!(r["stdout"], "B\nA\n", "nothing moved: {r}");
    let (status, v) = mv(
        &server,
        &sid,
        json!({"from": "b", "to": "new/place/a2", "overwrite": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let r = server
        .sh(&sid, "cat new/place/a2; test -e b || echo gone")
        .await;
    assert_eq!(r["stdout"], "B\ngone\n", "{r}");

    // A directory moves whole.
    assert_eq!(
        mv(&server, &sid, json!({"from": "d", "to": "d2"})).await.0,
        200
    );
    let r = server.sh(&sid, "cat d2/e/f").await;
    assert_eq!(r["stdout"], "in\n", "{r}");

    let (status, v) = mv(&server, &sid, json!({"from": "missing", "to": "x"})).await;
    assert_eq!(
        (status, v["code"].clone()),
        (404, json!("file_not_found")),
        "{v}"
    );
    let (status, v) = mv(&server, &sid, json!({"from": "d2", "to": "d2/inside"})).await;
    assert_eq!(
        (status, v["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
    let (status, v) = mv(&server, &sid, json!({"from": "/workspace", "to": "w"})).await;
    assert_eq!(
        (status, v["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
    let (status, v) = mv(&server, &sid, json!({"from": "../etc/passwd", "to": "p"})).await;
    assert_eq!(
        (status, v["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
}

#[tokio::test]
async fn moves_and_new_directories_never_leave_the_workspace() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let r = server
        .sh(
            &sid,
            "mkdir -p /tmp/outside && echo secret > /tmp/outside/s && ln -s /tmp/outside t \
             && echo mine > mine && mkdir real && ln -s real inside && ln -s mine link",
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");

    // Out through a symlink, in from one, a directory made through one.
    let (status, v) = mv(&server, &sid, json!({"from": "mine", "to": "t/stolen"})).await;
    assert_eq!(
        (status, v["code"].clone()),
        (400, json!("symlink_escape")),
        "{v}"
    );
    let (status, v) = mv(&server, &sid, json!({"from": "t/s", "to": "taken"})).await;
    assert_eq!(
        (status, v["code"].clone()),
        (400, json!("symlink_escape")),
        "{v}"
    );
    let (status, v) = mkdir(&server, &sid, "t/made").await;
    assert_eq!(
        (status, v["code"].clone()),
        (400, json!("symlink_escape")),
        "{v}"
    );
    let r = server
        .sh(
            &sid,
            "ls -A /tmp/outside; cat /tmp/outside/s mine; test -e taken || echo none",
        )
        .await;
    assert_eq!(
        r["stdout"], "s\nsecret\nmine\nnone\n",
        "nothing outside changed: {r}"
    );

    // Positive controls: a symlink that stays inside leads a move and a
    // new directory where it points; a final symlink moves itself.
    assert_eq!(
        mv(&server, &sid, json!({"from": "mine", "to": "inside/mine"}))
            .await
            .0,
        200
    );
    assert_eq!(
        mkdir(&server, &sid, "inside/sub/deeper").await,
        (200, json!({"created": true}))
    );
    assert_eq!(
        mv(&server, &sid, json!({"from": "link", "to": "link2"}))
            .await
            .0,
        200
    );
    let r = server
        .sh(
            &sid,
            "cat real/mine; test -d real/sub/deeper && echo dir; test -L link2 && readlink link2",
        )
        .await;
    assert_eq!(r["stdout"], "mine\ndir\nmine\n", "{r}");
}

#[tokio::test]
async fn a_directory_is_made_once_with_its_parents() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    assert_eq!(
        mkdir(&server, &sid, "a/b/c").await,
        (200, json!({"created": true}))
    );
    assert_eq!(
        mkdir(&server, &sid, "/workspace/a/b/c").await,
        (200, json!({"created": false}))
    );
    assert_eq!(
        mkdir(&server, &sid, "a").await,
        (200, json!({"created": false}))
    );
    let r = server
        .sh(&sid, "stat -c %F a/b/c; echo x > file; ln -s a to_a")
        .await;
    assert_eq!(r["stdout"], "directory\n", "{r}");
    for path in ["file", "to_a"] {
        let (status, v) = mkdir(&server, &sid, path).await;
        assert_eq!(
            (status, v["code"].clone()),
            (400, json!("not_a_directory")),
            "{path}: {v}"
        );
    }
}
