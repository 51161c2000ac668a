//! `POST …/files:edit`: one exact, unique replacement, all or nothing; zero
//! or several matches and a stale `ifMatch` refuse and change nothing; the
//! file keeps its mode.

use serde_json::json;

use crate::harness::{TestServer, b64, sha256_hex};

async fn edit(server: &TestServer, sid: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    server
        .post(&format!("/v1/sandboxes/{sid}/files:edit"), body)
        .await
}

async fn content(server: &TestServer, sid: &str, path: &str) -> String {
    let (_, v) = server.sh(sid, &format!("cat {path}")).await.pipe_ok();
    v
}

trait PipeOk {
    fn pipe_ok(self) -> (i64, String);
}

impl PipeOk for serde_json::Value {
    fn pipe_ok(self) -> (i64, String) {
        (
            self["exitCode"].as_i64().unwrap_or(-1),
            self["stdout"].as_str().unwrap_or_default().to_string(),
        )
    }
}

#[tokio::test]
async fn an_edit_replaces_one_match_and_refuses_zero_several_or_stale() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let (s, _) = server
        .write_files(
            &sid,
            json!([{"path": "e.sh", "contentBase64": b64("echo one\necho two two\n"), "mode": 493}]),
        )
        .await;
    assert_eq!(s, 200);
    let original = "echo one\necho two two\n";

    for (old, times) in [("three", 0), ("two", 2)] {
        let (s, v) = edit(
            &server,
            &sid,
            json!({"path": "e.sh", "oldText": old, "newText": "x"}),
        )
        .await;
        assert_eq!(
            (s, v["code"].as_str()),
            (400, Some("invalid_request")),
            "{v}"
        );
        assert!(
            v["error"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("{times} times")),
            "{v}"
        );
        assert_eq!(content(&server, &sid, "e.sh").await, original);
    }

    let stale = sha256_hex("something else");
    let (s, v) = edit(
        &server,
        &sid,
        json!({"path": "e.sh", "oldText": "one", "newText": "1", "ifMatch": stale}),
    )
    .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (409, Some("precondition_failed")),
        "{v}"
    );
    assert_eq!(v["failed"][0]["currentSha256"], json!(sha256_hex(original)));
    assert_eq!(content(&server, &sid, "e.sh").await, original);

    // Positive: the right hash edits, and the answer is the new content's.
    let (s, v) = edit(
        &server,
        &sid,
        json!({"path": "e.sh", "oldText": "one", "newText": "1", "ifMatch": sha256_hex(original)}),
    )
    .await;
    let edited = "echo 1\necho two two\n";
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v,
        json!({"ok": true, "sha256": sha256_hex(edited), "size": edited.len()})
    );
    assert_eq!(content(&server, &sid, "e.sh").await, edited);
    let (_, mode) = server.sh(&sid, "stat -c %a e.sh").await.pipe_ok();
    assert_eq!(mode.trim(), "755", "the mode is kept");

    let (s, v) = edit(
        &server,
        &sid,
        json!({"path": "missing.txt", "oldText": "a", "newText": "b"}),
    )
    .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (404, Some("file_not_found")),
        "{v}"
    );
    let (s, v) = edit(
        &server,
        &sid,
        json!({"path": "../etc/passwd", "oldText": "a", "newText": "b"}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
}
