//! The MCP endpoint driven by the official Python MCP SDK (`mcp`, pinned in
//! clients/mcp-python/requirements.txt, installed into a venv under
//! target/ by the test): initialize, the tool list and every tool, edits
//! that refuse, 200,000 lines within the budget, progress, cancellation
//! killing the command's tree, a URL that answers from the host, and a
//! sandboxd restart between two calls, and the checkpoint tools. Each
//! scenario but the checkpoints runs under both
//! revisions served (`auto` picks 2026-07-28; `legacy` the 2025-11-25
//! handshake). A missing python3 or venv fails the test: nothing is
//! skipped. `smoke_initialize_and_tools` is the short one kept under
//! gVisor.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::harness::{self, ScriptRun, ServerOptions, TestServer};

const TOKEN: &str = "mcp-Test-Token-40";

/// The venv with the pinned SDK.
fn python() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(|| harness::python_venv("clients/mcp-python", "mcp-python-venv"))
        .clone()
}

async fn server() -> TestServer {
    TestServer::start_with(ServerOptions::default().token(TOKEN)).await
}

fn endpoint(server: &TestServer, key: &str, query: &str) -> String {
    format!("{}/v1/sessions/{key}/mcp{query}", server.base)
}

/// A running scenario of clients/mcp-python/check.py.
fn scenario(args: &[&str]) -> ScriptRun {
    ScriptRun::start(&python(), "clients/mcp-python/check.py", args, TOKEN)
}

async fn happy(mode: &str, want_protocol: &str) {
    let server = server().await;
    let out = scenario(&["happy", &endpoint(&server, "mcp-happy", ""), mode])
        .finish()
        .await;
    let text = out.join("\n");
    assert!(
        text.contains(&format!("protocol: {want_protocol}")),
        "{text}"
    );
    for check in [
        "ok: initialize",
        "ok: tools listed",
        "ok: writeFile->bash and bash->readFile",
        "ok: edits all-or-nothing",
        "ok: 200000 lines in",
        "progress notifications",
        "ok: path outside the workspace",
        "done",
    ] {
        assert!(text.contains(check), "{check:?} missing:\n{text}");
    }
    // Counted by tool and outcome.
    let metrics = server.metrics_text().await;
    for series in [
        r#"sandboxd_mcp_tool_calls_total{tool="bash",outcome="ok"}"#,
        r#"sandboxd_mcp_tool_calls_total{tool="readFile",outcome="tool_error"}"#,
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
    println!(
        "{}",
        out.iter()
            .find(|l| l.contains("descriptions"))
            .cloned()
            .unwrap_or_default()
    );
}

/// The short test kept under gVisor: initialize, the tools, every tool's
/// happy path, under the newest revision.
#[tokio::test]
async fn smoke_initialize_and_tools() {
    happy("auto", "2026-07-28").await;
}

#[tokio::test]
async fn every_tool_over_the_handshake_revision() {
    happy("legacy", "2025-11-25").await;
}

#[tokio::test]
async fn a_server_started_by_bash_answers_at_its_url_from_the_host() {
    let server = server().await;
    let port = "8765";
    let mut s = scenario(&[
        "url",
        &endpoint(&server, "mcp-url", &format!("?ports={port}")),
        "auto",
        port,
    ]);
    let line = s.until("url: ").await;
    s.finish().await;
    let url = line.trim_start_matches("url: ").to_string();
    let body = server.client.get(&url).send().await.expect("fetch the URL");
    assert_eq!(body.status().as_u16(), 200, "{url}");
    assert!(
        body.text()
            .await
            .unwrap_or_default()
            .contains("Directory listing")
    );
}

async fn marker_processes(server: &TestServer, sid: &str) -> String {
    let v = server
        .sh(sid, "pgrep -f 'mcp-cancel-marke[r]' || true")
        .await;
    v["stdout"].as_str().unwrap_or_default().trim().to_string()
}

async fn cancel(mode: &str) {
    let server = server().await;
    let key = format!("mcp-cancel-{mode}");
    let mut s = scenario(&["cancel", &endpoint(&server, &key, ""), mode]);
    s.until("running").await;
    let sid = server.create(json!({"sessionKey": key})).await;
    // Positive control: the command's tree is there while it runs.
    assert!(
        !marker_processes(&server, &sid).await.is_empty(),
        "the marker runs"
    );
    s.tell("cancel").await;
    s.until("cancelled").await;
    harness::eventually(
        Duration::from_secs(20),
        "no process of the command is left",
        || async { marker_processes(&server, &sid).await.is_empty() },
    )
    .await;
    s.tell("end").await;
    s.finish().await;
}

#[tokio::test]
async fn cancelling_bash_kills_its_tree() {
    cancel("auto").await;
}

#[tokio::test]
async fn cancelling_bash_kills_its_tree_over_the_handshake_revision() {
    cancel("legacy").await;
}

/// The checkpoint tools on a session's workspace (check.py says what each
/// line asserts), and the checkpoint they made is the session sandbox's,
/// the one `/v1` lists.
#[tokio::test]
async fn checkpoint_tools_save_diff_and_restore_the_session_s_files() {
    let server = server().await;
    let key = "mcp-checkpoints";
    let out = scenario(&["checkpoints", &endpoint(&server, key, ""), "auto"])
        .finish()
        .await;
    let text = out.join("\n");
    for check in [
        "ok: createCheckpoint and listCheckpoints",
        "ok: diffCheckpoint shows the change",
        "ok: restore while a process runs",
        "ok: restoreCheckpoint brings the file back",
        "ok: unknown checkpoint",
        "ok: label taken",
        "done",
    ] {
        assert!(text.contains(check), "{check:?} missing:\n{text}");
    }
    let sid = server.create(json!({"sessionKey": key})).await;
    let (status, v) = server
        .get(&format!("/v1/sandboxes/{sid}/checkpoints"))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["checkpoints"][0]["label"], "turn-1", "{v}");
    assert_eq!(v["checkpoints"].as_array().map(Vec::len), Some(1), "{v}");
    let metrics = server.metrics_text().await;
    for series in [
        r#"sandboxd_mcp_tool_calls_total{tool="restoreCheckpoint",outcome="ok"}"#,
        r#"sandboxd_mcp_tool_calls_total{tool="diffCheckpoint",outcome="tool_error"}"#,
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
}

async fn restart(mode: &str, want: &str) {
    let port = harness::free_port().to_string();
    let mut server = TestServer::start_with(
        ServerOptions::default()
            .token(TOKEN)
            .env("SANDBOXD_PORT", &port),
    )
    .await;
    let mut s = scenario(&["restart", &endpoint(&server, "mcp-restart", ""), mode]);
    s.until("written").await;
    server.restart().await;
    s.tell("go").await;
    let out = s.finish().await.join("\n");
    assert!(out.contains(want) && out.contains("ok: file kept"), "{out}");
}

/// 2026-07-28 is stateless: the restart is invisible.
#[tokio::test]
async fn a_restart_between_two_calls_is_invisible() {
    restart("auto", "continued").await;
}

/// 2025-11-25 keeps a session id in memory: after a restart the client is
/// answered 404 and initializes again, as the specification says.
#[tokio::test]
async fn a_restart_tells_a_handshake_client_to_initialize_again() {
    restart("legacy", "re-initialised").await;
}

#[tokio::test]
async fn an_invalid_query_or_key_is_a_400_before_any_mcp_handling() {
    let server = server().await;
    for (url, field) in [
        (endpoint(&server, "k", "?vcpus=99"), "resources.vcpus"),
        (endpoint(&server, "k", "?ports=0"), "ports[0]"),
        (endpoint(&server, "k", "?ports=x"), "ports"),
        (endpoint(&server, "k", "?runtime=nope"), "runtime"),
        (endpoint(&server, &"k".repeat(257), ""), "sessionKey"),
    ] {
        let resp = server
            .client
            .post(&url)
            .header("x-sandboxd-admin-token", TOKEN)
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status().as_u16(), 400, "{url}");
        let body: serde_json::Value = resp.json().await.expect("json");
        assert_eq!(body["code"], "invalid_request", "{body}");
        assert!(
            body["error"].as_str().unwrap_or_default().contains(field),
            "{body}"
        );
    }
    // Without the token: 401.
    let resp = server
        .client
        .post(endpoint(&server, "k", ""))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 401);
}

/// The status of an `initialize` on `key`'s endpoint with `bearer`.
async fn initialize_status(server: &TestServer, key: &str, bearer: &str) -> u16 {
    server
        .client
        .post(endpoint(server, key, ""))
        .bearer_auth(bearer)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "sandboxd-test", "version": "1"},
            },
        }))
        .send()
        .await
        .expect("send")
        .status()
        .as_u16()
}

/// Makes a session token for `key` (admin token), `ttl_ms` long.
async fn session_token(server: &TestServer, key: &str, ttl_ms: u64) -> (String, String) {
    let (status, v) = server
        .post(
            &format!("/v1/sessions/{key}/tokens"),
            json!({"ttlMs": ttl_ms}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let field = |f: &str| v[f].as_str().expect(f).to_string();
    (field("id"), field("token"))
}

/// A session token opens its own session's endpoint only; revoked or
/// expired, it opens none; the admin token opens every one.
#[tokio::test]
async fn a_session_token_opens_its_own_session_s_endpoint_only() {
    let server = server().await;
    let (a_id, a) = session_token(&server, "chat-a", 600_000).await;
    let (_, b) = session_token(&server, "chat-b", 600_000).await;
    assert_eq!(
        initialize_status(&server, "chat-a", &a).await,
        200,
        "A's own"
    );
    assert_eq!(
        initialize_status(&server, "chat-b", &b).await,
        200,
        "B's own"
    );
    assert_eq!(
        initialize_status(&server, "chat-b", &a).await,
        401,
        "A's token on B's endpoint"
    );
    assert_eq!(
        initialize_status(&server, "chat-a", TOKEN).await,
        200,
        "the admin token"
    );
    assert_eq!(
        initialize_status(&server, "chat-a", "sbx_st_0000").await,
        401,
        "a made-up token"
    );

    let revoked = server
        .client
        .delete(format!("{}/v1/sessions/chat-a/tokens/{a_id}", server.base))
        .header("x-sandboxd-admin-token", TOKEN)
        .send()
        .await
        .expect("send");
    assert_eq!(revoked.status().as_u16(), 200, "revoking A's token");
    assert_eq!(
        initialize_status(&server, "chat-a", &a).await,
        401,
        "a revoked token"
    );

    let (_, short) = session_token(&server, "chat-a", 1_000).await;
    assert_eq!(
        initialize_status(&server, "chat-a", &short).await,
        200,
        "a short-lived token before it expires"
    );
    harness::eventually(
        Duration::from_secs(10),
        "the short-lived token refused once expired",
        || async { initialize_status(&server, "chat-a", &short).await == 401 },
    )
    .await;
}
