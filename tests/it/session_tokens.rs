//! Session tokens against a real sandboxd: made, listed (never with their
//! secret), revoked one by one or all at once; refused on the admin routes;
//! a TTL over the max stores nothing; expired ones drop out; tokens and
//! revocations survive a restart; the state file holds hashes only, mode
//! 0600, out of every sandbox's sight; an unusable state directory or file
//! stops startup with a line naming it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, eventually};

const TOKEN: &str = "session-tokens-Test-Token-3";
const FILE_NAME: &str = "session-tokens.json";

async fn server() -> TestServer {
    TestServer::start_with(ServerOptions::default().token(TOKEN)).await
}

/// A request with the admin token.
async fn admin(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = server
        .client
        .request(method.clone(), format!("{}{path}", server.base))
        .header("x-sandboxd-admin-token", TOKEN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Makes a token for `key`, asserting 201.
async fn issue(server: &TestServer, key: &str, body: Value) -> Value {
    let (status, v) = admin(
        server,
        reqwest::Method::POST,
        &format!("/v1/sessions/{key}/tokens"),
        Some(body),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    v
}

/// The ids `GET …/tokens` lists for `key`, and the whole answer.
async fn listed(server: &TestServer, key: &str) -> (Vec<String>, Value) {
    let (status, v) = admin(
        server,
        reqwest::Method::GET,
        &format!("/v1/sessions/{key}/tokens"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let ids = v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t["id"].as_str().expect("id").to_string())
        .collect();
    (ids, v)
}

fn state_file(server: &TestServer) -> std::path::PathBuf {
    server.state_dir.join(FILE_NAME)
}

#[tokio::test]
async fn made_listed_without_the_secret_and_revoked_one_by_one_or_all() {
    let server = server().await;
    let key = format!("chat:{}", harness::unique_instance());
    let before = sandboxd_now();
    let a = issue(&server, &key, json!({"ttlMs": 600_000})).await;
    let b = issue(&server, &key, json!({})).await;
    let other = issue(&server, "chat:other", json!({})).await;
    let token = a["token"].as_str().expect("token");
    assert!(
        token.starts_with("sbx_st_") && token.len() == 7 + 64,
        "{token}"
    );
    assert_eq!(a["sessionKey"], key.as_str());
    let created = a["createdAt"].as_u64().expect("createdAt");
    assert!(created >= before, "epoch milliseconds");
    assert_eq!(a["expiresAt"].as_u64(), Some(created + 600_000));
    let b_created = b["createdAt"].as_u64().expect("createdAt");
    assert_eq!(
        b["expiresAt"].as_u64(),
        Some(b_created + 3_600_000),
        "the default lifetime, an hour"
    );

    let (ids, body) = listed(&server, &key).await;
    assert_eq!(
        ids,
        [a["id"].clone(), b["id"].clone()].map(|v| v.as_str().expect("id").to_string())
    );
    let text = body.to_string();
    for secret in [&a["token"], &b["token"]] {
        assert!(!text.contains(secret.as_str().expect("token")), "{text}");
    }
    assert_eq!(
        body["tokens"][0],
        json!({"id": a["id"], "createdAt": a["createdAt"], "expiresAt": a["expiresAt"]}),
        "only the id and the times"
    );

    let one = format!(
        "/v1/sessions/{key}/tokens/{}",
        a["id"].as_str().expect("id")
    );
    let (status, v) = admin(&server, reqwest::Method::DELETE, &one, None).await;
    assert_eq!((status, v.clone()), (200, json!({"ok": true})), "{v}");
    let (status, v) = admin(&server, reqwest::Method::DELETE, &one, None).await;
    assert_eq!((status, v["code"].clone()), (404, json!("token_not_found")));
    let elsewhere = format!(
        "/v1/sessions/chat:other/tokens/{}",
        b["id"].as_str().expect("id")
    );
    let (status, _) = admin(&server, reqwest::Method::DELETE, &elsewhere, None).await;
    assert_eq!(status, 404, "another session's id is unknown there");
    assert_eq!(
        listed(&server, &key).await.0,
        [b["id"].as_str().expect("id")]
    );

    let all = format!("/v1/sessions/{key}/tokens");
    let (status, v) = admin(&server, reqwest::Method::DELETE, &all, None).await;
    assert_eq!(
        (status, v.clone()),
        (200, json!({"ok": true, "revoked": 1})),
        "{v}"
    );
    assert!(listed(&server, &key).await.0.is_empty());
    assert_eq!(
        listed(&server, "chat:other").await.0,
        [other["id"].as_str().expect("id")],
        "other sessions keep theirs"
    );

    let (status, v) = admin(
        &server,
        reqwest::Method::GET,
        &format!("/v1/sessions/{}/tokens", "k".repeat(257)),
        None,
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("sessionKey:")),
        "{v}"
    );
}

fn sandboxd_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[tokio::test]
async fn a_session_token_opens_none_of_the_admin_routes() {
    let server = server().await;
    let key = format!("chat:{}", harness::unique_instance());
    let issued = issue(&server, &key, json!({})).await;
    let bearer = format!("Bearer {}", issued["token"].as_str().expect("token"));
    for path in [
        "/v1/sandboxes".to_string(),
        format!("/v1/sessions/{key}/tokens"),
        "/metrics".to_string(),
    ] {
        let with = |header: &str, value: &str| {
            server
                .client
                .get(format!("{}{path}", server.base))
                .header(header, value)
                .send()
        };
        let refused = with("authorization", &bearer).await.expect("send");
        assert_eq!(refused.status().as_u16(), 401, "{path}");
        let body: Value = refused.json().await.expect("json");
        assert_eq!(body["code"], "unauthorized");
        let admitted = with("authorization", &format!("Bearer {TOKEN}"))
            .await
            .expect("send");
        assert_eq!(
            admitted.status().as_u16(),
            200,
            "{path}: the admin token works"
        );
    }
}

#[tokio::test]
async fn a_ttl_out_of_range_is_a_400_naming_it_and_stores_nothing() {
    let server = server().await;
    let key = format!("chat:{}", harness::unique_instance());
    for ttl in [86_400_001_i64, 999, -5] {
        let (status, v) = admin(
            &server,
            reqwest::Method::POST,
            &format!("/v1/sessions/{key}/tokens"),
            Some(json!({"ttlMs": ttl})),
        )
        .await;
        assert_eq!(
            (status, v["code"].clone()),
            (400, json!("invalid_request")),
            "{v}"
        );
        assert!(
            v["error"].as_str().is_some_and(|e| e.starts_with("ttlMs:")),
            "{v}"
        );
    }
    assert!(listed(&server, &key).await.0.is_empty());
    let text = std::fs::read_to_string(state_file(&server)).expect("the state file");
    assert!(
        !text.contains(&key),
        "nothing of the session is stored: {text}"
    );
    // The control: a TTL at the max is made, and stored.
    issue(&server, &key, json!({"ttlMs": 86_400_000})).await;
    let text = std::fs::read_to_string(state_file(&server)).expect("the state file");
    assert!(text.contains(&key), "{text}");
}

#[tokio::test]
async fn an_expired_token_drops_out_of_the_list_and_out_of_the_file_at_restart() {
    let mut server = server().await;
    let key = format!("chat:{}", harness::unique_instance());
    let short = issue(&server, &key, json!({"ttlMs": 1_000})).await;
    let long = issue(&server, &key, json!({"ttlMs": 600_000})).await;
    let short_id = short["id"].as_str().expect("id").to_string();
    let long_id = long["id"].as_str().expect("id").to_string();
    assert_eq!(
        listed(&server, &key).await.0,
        [short_id.clone(), long_id.clone()]
    );
    eventually(
        Duration::from_secs(10),
        "the expired token drops out",
        || async { listed(&server, &key).await.0 == [long_id.clone()] },
    )
    .await;
    server.restart().await;
    let text = std::fs::read_to_string(state_file(&server)).expect("the state file");
    assert!(!text.contains(&short_id), "pruned: {text}");
    assert!(text.contains(&long_id), "the live one stays: {text}");
}

#[tokio::test]
async fn tokens_and_revocations_survive_a_restart() {
    let mut server = server().await;
    let key = format!("chat:{}", harness::unique_instance());
    let a = issue(&server, &key, json!({})).await;
    issue(&server, &key, json!({})).await;
    let revoked = format!(
        "/v1/sessions/{key}/tokens/{}",
        a["id"].as_str().expect("id")
    );
    let (status, _) = admin(&server, reqwest::Method::DELETE, &revoked, None).await;
    assert_eq!(status, 200);
    let (_, before) = listed(&server, &key).await;
    assert_eq!(before["tokens"].as_array().map(Vec::len), Some(1));

    server.restart().await;
    let (_, after) = listed(&server, &key).await;
    assert_eq!(after, before, "the same ids and times after a restart");

    // And after a crash, with one more revocation in between.
    let all = format!("/v1/sessions/{key}/tokens");
    let (status, v) = admin(&server, reqwest::Method::DELETE, &all, None).await;
    assert_eq!((status, v["revoked"].clone()), (200, json!(1)));
    server.crash_and_restart().await;
    assert!(listed(&server, &key).await.0.is_empty());
}

#[tokio::test]
async fn the_state_file_holds_no_token_and_only_its_owner_reads_it() {
    let server = server().await;
    let key = format!("chat:{}", harness::unique_instance());
    let issued = issue(&server, &key, json!({})).await;
    let token = issued["token"].as_str().expect("token");
    let path = state_file(&server);
    let text = std::fs::read_to_string(&path).expect("the state file");
    assert!(
        text.contains(issued["id"].as_str().expect("id")),
        "positive control: {text}"
    );
    assert!(!text.contains(&token["sbx_st_".len()..]), "{text}");
    assert!(
        text.contains(&harness::sha256_hex(token)),
        "its hash is kept: {text}"
    );
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&server.state_dir), 0o700);
}

#[tokio::test]
async fn no_sandbox_sees_the_state_file() {
    let server = server().await;
    issue(&server, "chat:seen", json!({})).await;
    let sid = server.offline_sandbox().await;
    // The control: a file of that name in the workspace is found.
    let out = server
        .sh(
            &sid,
            &format!(
                "mkdir -p control && touch control/{FILE_NAME}; \
                 find / -xdev -name {FILE_NAME} 2>/dev/null; \
                 find / -name {FILE_NAME} -not -path '/proc/*' 2>/dev/null; \
                 grep -c {dir} /proc/self/mountinfo",
                dir = server.state_dir.display()
            ),
        )
        .await;
    let stdout = out["stdout"].as_str().expect("stdout");
    let found: Vec<&str> = stdout.lines().filter(|l| l.ends_with(FILE_NAME)).collect();
    assert!(!found.is_empty(), "the control is found: {out}");
    assert!(
        found
            .iter()
            .all(|l| l.ends_with(&format!("/control/{FILE_NAME}"))),
        "only the control: {out}"
    );
    assert_eq!(
        stdout.lines().last(),
        Some("0"),
        "no mount of the state dir: {out}"
    );
    let mounts = server.inspect(&sid).await.mounts.unwrap_or_default();
    let state = server.state_dir.display().to_string();
    assert!(
        mounts
            .iter()
            .all(|m| !m.source.as_deref().unwrap_or_default().starts_with(&state)),
        "{mounts:?}"
    );
}

/// Runs sandboxd with `state_dir` until it exits (it must within 10 s);
/// returns its exit code and stderr.
fn start_expecting_exit(state_dir: &Path) -> (Option<i32>, String) {
    let (dir, port) = (
        state_dir.display().to_string(),
        harness::free_port().to_string(),
    );
    crate::config::run_expecting_exit(
        &[("SANDBOXD_STATE_DIR", &dir), ("SANDBOXD_PORT", &port)],
        &[],
    )
}

#[test]
fn an_unusable_state_dir_or_file_stops_startup_naming_it() {
    let base = std::env::temp_dir().join(harness::unique_instance());
    std::fs::create_dir_all(&base).expect("tmp dir");
    let blocker = base.join("a-file");
    std::fs::write(&blocker, "not a directory").expect("write");
    let (code, stderr) = start_expecting_exit(&blocker.join("state"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&blocker.display().to_string()), "{stderr}");

    let corrupt = base.join("corrupt");
    std::fs::create_dir_all(&corrupt).expect("dir");
    std::fs::write(corrupt.join(FILE_NAME), "{\"version\": 1, \"tok").expect("write");
    let (code, stderr) = start_expecting_exit(&corrupt);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&corrupt.join(FILE_NAME).display().to_string()),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(corrupt.join(FILE_NAME)).expect("read"),
        "{\"version\": 1, \"tok",
        "left as it was"
    );
    let _ = std::fs::remove_dir_all(&base);
}
