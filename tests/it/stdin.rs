//! Input to a running command: a command started with `stdinOpen` reads
//! each input sent to it, in order, and its end once the stdin is closed;
//! the refusals (no open stdin, a closed one, an ended command, input the
//! command does not read, input over the limit) with their codes; and the
//! pid a command reports is its own process's.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{TestServer, b64};

async fn send(server: &TestServer, sid: &str, cid: &str, data: &[u8]) -> (u16, Value) {
    server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}/stdin"),
            json!({ "data": b64(data) }),
        )
        .await
}

async fn close(server: &TestServer, sid: &str, cid: &str) -> (u16, Value) {
    server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}:closeStdin"),
            json!(null),
        )
        .await
}

#[tokio::test]
async fn an_open_stdin_echoes_each_input_until_it_is_closed() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let (status, started) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "while IFS= read -r l; do echo \"got:$l\"; done; echo eof", "stdinOpen": true}),
        )
        .await;
    assert_eq!(status, 200, "{started}");
    let cid = started["commandId"]
        .as_str()
        .expect("commandId")
        .to_string();
    let pid = started["pid"].as_u64().expect("a pid");

    assert_eq!(send(&server, &sid, &cid, b"one\n").await.0, 200);
    server
        .output_until(&sid, &cid, "got:one\n", Duration::from_secs(10))
        .await;
    assert_eq!(send(&server, &sid, &cid, b"two\n").await.0, 200);
    server
        .output_until(&sid, &cid, "got:two\n", Duration::from_secs(10))
        .await;

    // The pid is the command's own process, and the list has it too.
    let (code, cmdline) = server
        .docker_exec(&sid, &format!("tr '\\0' ' ' < /proc/{pid}/cmdline"))
        .await;
    assert_eq!(code, 0, "{cmdline}");
    assert!(cmdline.contains("read -r l"), "pid {pid} runs {cmdline:?}");
    let (_, list) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    let listed = &list["commands"][0];
    assert_eq!(
        (listed["state"].clone(), listed["pid"].clone()),
        (json!("running"), json!(pid)),
        "{list}"
    );

    assert_eq!(close(&server, &sid, &cid).await, (200, json!({"ok": true})));
    let ended = server.wait_command(&sid, &cid).await;
    assert_eq!(ended["exitCode"], 0, "{ended}");
    let out = server
        .output_until(&sid, &cid, "eof", Duration::from_secs(10))
        .await;
    assert_eq!(out, "got:one\ngot:two\neof\n");

    let (status, v) = send(&server, &sid, &cid, b"late\n").await;
    assert_eq!(
        (status, v["code"].clone()),
        (409, json!("command_finished")),
        "{v}"
    );
    let (status, v) = close(&server, &sid, &cid).await;
    assert_eq!(
        (status, v["code"].clone()),
        (409, json!("command_finished")),
        "{v}"
    );
}

#[tokio::test]
async fn input_is_refused_without_an_open_stdin_and_bounded_in_size() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;

    // Without stdinOpen: refused; unknown command: 404; both fields: 400.
    let plain = server
        .start_command(&sid, json!({"command": "sleep 60"}))
        .await;
    let (status, v) = send(&server, &sid, &plain, b"x").await;
    assert_eq!(
        (status, v["code"].clone()),
        (409, json!("stdin_closed")),
        "{v}"
    );
    let (status, v) = send(&server, &sid, "0123456789abcdef01234567", b"x").await;
    assert_eq!(
        (status, v["code"].clone()),
        (404, json!("command_not_found")),
        "{v}"
    );
    let (status, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "cat", "stdin": "x", "stdinOpen": true}),
        )
        .await;
    assert_eq!(status, 400, "{v}");

    // The limit itself is taken (a positive control), one byte more is not.
    let limit = 1024 * 1024;
    let counter = server
        .start_command(&sid, json!({"command": "wc -c", "stdinOpen": true}))
        .await;
    let (status, v) = send(&server, &sid, &counter, &vec![b'x'; limit + 1]).await;
    assert_eq!(
        (status, v["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
    assert_eq!(
        send(&server, &sid, &counter, &vec![b'x'; limit]).await.0,
        200
    );
    assert_eq!(close(&server, &sid, &counter).await.0, 200);
    assert_eq!(server.wait_command(&sid, &counter).await["exitCode"], 0);
    let out = server
        .output_until(&sid, &counter, "\n", Duration::from_secs(10))
        .await;
    assert_eq!(out.trim(), limit.to_string());

    // Closed twice while it runs: the second is refused.
    let idle = server
        .start_command(&sid, json!({"command": "sleep 60", "stdinOpen": true}))
        .await;
    assert_eq!(close(&server, &sid, &idle).await.0, 200);
    let (status, v) = close(&server, &sid, &idle).await;
    assert_eq!(
        (status, v["code"].clone()),
        (409, json!("stdin_closed")),
        "{v}"
    );

    // Input the command never reads fills the pipe, then is refused in
    // time rather than held.
    let deaf = server
        .start_command(&sid, json!({"command": "sleep 60", "stdinOpen": true}))
        .await;
    let started = std::time::Instant::now();
    let (status, v) = send(&server, &sid, &deaf, &vec![b'x'; limit]).await;
    assert_eq!(
        (status, v["code"].clone()),
        (409, json!("stdin_not_read")),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );

    for cid in [plain, idle, deaf] {
        let (status, v) = server
            .post(
                &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
                json!(null),
            )
            .await;
        assert_eq!(status, 200, "{v}");
    }
}
