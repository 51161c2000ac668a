//! The E2B dialect driven by E2B's own Python SDK (`e2b`, pinned in
//! clients/e2b-python/requirements.txt, installed into a venv under
//! target/), with only E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set to
//! sandboxd: clients/e2b-python/check.py runs each scenario and asserts
//! what the SDK gave; here the same sandboxes are checked through
//! sandboxd's own API (an E2B sandbox is an ordinary one), and the wire's
//! edges (credentials, restarts, what answers `unimplemented`, checkpoints
//! taken through /v1 since E2B has no counterpart) are checked by hand.
//! sandboxd runs on its defaults (but for its admin token), so
//! E2B's home `/home/user` is the workspace by default. `smoke_*` is the short run kept under
//! gVisor. A missing python3 or venv fails the test: nothing is skipped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer};

/// The admin token, which is also the E2B API key (in E2B's key format).
pub(crate) const KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";

fn python() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(|| harness::python_venv("clients/e2b-python", "e2b-python-venv"))
        .clone()
}

/// A sandboxd on its defaults but for its admin token (the API key):
/// E2B's home is one of the workspace's default spellings.
pub(crate) async fn server() -> TestServer {
    TestServer::start_with(ServerOptions::default().token(KEY)).await
}

/// The only settings an E2B SDK gets: the key and sandboxd's address as
/// both of its URLs (and nothing of E2B's own from the environment).
pub(crate) fn sdk_env<'a>(
    cmd: &'a mut tokio::process::Command,
    server: &TestServer,
) -> &'a mut tokio::process::Command {
    cmd.env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", &server.base)
        .env("E2B_SANDBOX_URL", &server.base)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .kill_on_drop(true)
}

/// Runs check.py's scenarios; the `ok NAME JSON` lines, by name.
async fn check(server: &TestServer, scenarios: &[&str]) -> Vec<(String, Value)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/e2b-python/check.py");
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(script).args(scenarios);
    let run = sdk_env(&mut cmd, server).output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("check.py ends within 300 s")
        .expect("run check.py");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "done"),
        "check.py {scenarios:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ok "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, json)| {
            (
                name.to_string(),
                serde_json::from_str(json).expect("an ok line's JSON"),
            )
        })
        .collect()
}

/// The fields of the first `ok` line named `name`.
fn line<'a>(lines: &'a [(String, Value)], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no `ok {name}` line in {lines:?}"))
}

/// The sandbox a scenario made.
fn sandbox_of(lines: &[(String, Value)]) -> String {
    line(lines, "created")["sandbox"]
        .as_str()
        .expect("a sandbox id")
        .to_string()
}

/// Whether the exception's classes include `name`.
fn raised(v: &Value, name: &str) -> bool {
    v["classes"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c == name))
}

/// A control-plane call with the API key.
async fn control(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut rb = server
        .client
        .request(method, format!("{}{path}", server.base))
        .header("x-api-key", KEY);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let resp = rb.send().await.expect("control-plane call");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        headers,
    )
}

/// A unary envd call with the sandbox's id and `token`.
async fn envd(
    server: &TestServer,
    sid: &str,
    token: &str,
    method: &str,
    body: Value,
) -> (u16, Value) {
    let resp = server
        .client
        .post(format!("{}/{method}", server.base))
        .header("e2b-sandbox-id", sid)
        .header("x-access-token", token)
        .header("connect-protocol-version", "1")
        .json(&body)
        .send()
        .await
        .expect("envd call");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// envd's `GET /health` status for the sandbox with `token`.
async fn health(server: &TestServer, sid: &str, token: &str) -> u16 {
    server
        .client
        .get(format!("{}/health", server.base))
        .header("e2b-sandbox-id", sid)
        .header("x-access-token", token)
        .send()
        .await
        .expect("health")
        .status()
        .as_u16()
}

/// `POST /v2/sandboxes`: the sandbox and its access token.
async fn create(server: &TestServer, headers: &[(&str, &str)]) -> (String, String) {
    let (status, body, _) = control(
        server,
        reqwest::Method::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "metadata": {}, "envVars": {}})),
        headers,
    )
    .await;
    assert_eq!(status, 201, "create: {body}");
    (
        body["sandboxID"].as_str().expect("sandboxID").to_string(),
        body["envdAccessToken"].as_str().expect("token").to_string(),
    )
}

#[tokio::test]
async fn smoke_create_run_write_read_and_kill() {
    let server = server().await;
    let lines = check(&server, &["smoke"]).await;
    let sid = line(&lines, "smoke")["sandbox"].as_str().expect("id");
    // The SDK's kill went through the domain: the sandbox is gone.
    let (status, _) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(status, 404, "the killed sandbox is gone from /v1/sandboxes");
}

#[tokio::test]
async fn commands_stream_take_cwd_and_env_fail_with_their_code_and_run_in_the_background() {
    let server = server().await;
    let lines = check(&server, &["commands"]).await;
    let sid = sandbox_of(&lines);
    assert!(line(&lines, "streaming")["spread"].as_f64().unwrap_or(0.0) > 0.7);
    line(&lines, "cwd_env");
    let exit = line(&lines, "exit");
    assert_eq!(exit["exit_code"], 3);
    assert!(raised(exit, "CommandExitException"), "{exit}");
    line(&lines, "killed");
    // The same commands, as sandboxd lists them: the background one was
    // killed, its tree ended by the domain's kill.
    let (status, listed) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert_eq!(status, 200, "{listed}");
    let sleeper = listed["commands"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["summary"].as_str() == Some("sleep 300"))
        })
        .unwrap_or_else(|| panic!("no sleep 300 in {listed}"))
        .clone();
    assert_eq!(sleeper["state"], "exited", "{sleeper}");
    assert_eq!(sleeper["killed"], true, "{sleeper}");
}

/// `Sandbox.create(envs=…)` (the create's `envVars`) reaches every
/// command and terminal of the sandbox, under a command's own `envs`;
/// another sandbox made without it has none (the script's control).
#[tokio::test]
async fn envs_given_at_create_reach_every_command_and_terminal_under_their_own() {
    let server = server().await;
    let lines = check(&server, &["sandbox_envs"]).await;
    line(&lines, "sandbox_envs");
}

/// An E2B sandbox lives until its end time: at `max_concurrent` a create
/// evicts an idle sandbox without one (the control: eviction happens),
/// not the E2B one, though it is the least recently used; with only
/// such sandboxes left, a create is 429.
#[tokio::test]
async fn a_sandbox_with_an_end_time_is_not_evicted_before_it() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .token(KEY)
            .env("SANDBOXD_MAX_CONCURRENT", "2"),
    )
    .await;
    let (first, _) = create(&server, &[]).await;
    let idle = server.offline_sandbox().await;
    let third = server.offline_sandbox().await;
    let now = crate::metadata::listed(&server, "").await;
    assert!(!now.contains(&idle), "the idle one was evicted: {now:?}");
    assert!(now.contains(&first), "the E2B one was kept: {now:?}");
    let (second, _) = create(&server, &[]).await;
    let now = crate::metadata::listed(&server, "").await;
    assert!(
        now.contains(&first) && now.contains(&second) && !now.contains(&third),
        "{now:?}"
    );
    let (status, v) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "one-more", "network": {"mode": "none"}}),
        )
        .await;
    assert_eq!(
        (status, v["code"].clone()),
        (429, json!("at_capacity")),
        "{v}"
    );
    assert!(
        v["error"].as_str().unwrap_or("").contains("end time"),
        "{v}"
    );
}

#[tokio::test]
async fn files_land_in_the_workspace_and_a_missing_one_is_not_found() {
    let server = server().await;
    let lines = check(&server, &["files"]).await;
    let sid = sandbox_of(&lines);
    line(&lines, "files");
    assert!(raised(line(&lines, "missing"), "NotFoundException"));
    // What the SDK wrote under /home/user is the workspace's.
    let (status, read) = server.read_file(&sid, "/workspace/b.bin").await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["contentBase64"], harness::b64(b"\x00\x01\x02beta"));
    let (_, gone) = server.read_file(&sid, "/workspace/dir/a.txt").await;
    assert_eq!(
        gone["found"], false,
        "the SDK removed the directory: {gone}"
    );
}

#[tokio::test]
async fn a_terminal_session_takes_keys_a_new_size_and_a_kill() {
    let server = server().await;
    let lines = check(&server, &["pty"]).await;
    let sid = sandbox_of(&lines);
    line(&lines, "pty");
    harness::eventually(Duration::from_secs(30), "the killed session ended", || {
        let server = &server;
        let sid = sid.clone();
        async move {
            let (_, ptys) = server.get(&format!("/v1/sandboxes/{sid}/ptys")).await;
            ptys["ptys"]
                .as_array()
                .is_some_and(|p| !p.is_empty() && p.iter().all(|p| p["state"] == "exited"))
        }
    })
    .await;
}

#[tokio::test]
async fn info_list_connect_and_kill_and_a_killed_sandbox_is_not_running() {
    let server = server().await;
    let lines = check(&server, &["lifecycle"]).await;
    assert_eq!(line(&lines, "info_list")["template"], "base");
    let after = line(&lines, "after_kill");
    assert!(
        after["message"]
            .as_str()
            .is_some_and(|m| m.contains("was not found")),
        "{after}"
    );
    assert!(raised(after, "SandboxNotRunningException"), "{after}");
}

#[tokio::test]
async fn wrong_credentials_unknown_sandboxes_and_templates_raise_the_sdks_exceptions() {
    let server = server().await;
    let lines = check(&server, &["errors"]).await;
    assert!(raised(line(&lines, "api_key"), "AuthenticationException"));
    assert!(raised(
        line(&lines, "other_token"),
        "AuthenticationException"
    ));
    assert!(raised(
        line(&lines, "wrong_token"),
        "AuthenticationException"
    ));
    let template = line(&lines, "template");
    assert!(
        template["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-template")),
        "{template}"
    );
    let unknown = line(&lines, "unknown");
    assert!(raised(unknown, "SandboxNotFoundException"), "{unknown}");
}

#[tokio::test]
async fn the_access_token_opens_its_own_sandbox_only_and_survives_a_restart() {
    let mut server = server().await;
    let (a, token_a) = create(&server, &[]).await;
    let (b, token_b) = create(&server, &[]).await;
    assert_ne!(token_a, token_b);
    assert!(!token_a.contains(KEY) && token_a.len() == 64, "{token_a}");
    assert_eq!(
        health(&server, &a, &token_a).await,
        204,
        "the positive control"
    );
    assert_eq!(
        health(&server, &a, &token_b).await,
        401,
        "another sandbox's token"
    );
    assert_eq!(
        health(&server, &a, KEY).await,
        401,
        "the API key is no access token"
    );
    let (status, body) = envd(
        &server,
        &a,
        "",
        "filesystem.Filesystem/Stat",
        json!({"path": "/home/user"}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("unauthenticated")),
        "{body}"
    );

    server.restart().await;
    assert_eq!(
        health(&server, &a, &token_a).await,
        204,
        "tokens survive a restart"
    );
    assert_eq!(health(&server, &b, &token_a).await, 401);

    // A sandbox that is gone: 502, "was not found".
    let (status, _, _) = control(
        &server,
        reqwest::Method::DELETE,
        &format!("/sandboxes/{a}"),
        None,
        &[],
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, _) = control(
        &server,
        reqwest::Method::DELETE,
        &format!("/sandboxes/{a}"),
        None,
        &[],
    )
    .await;
    assert_eq!(status, 404, "a second kill finds nothing");
    let (status, body) = envd(&server, &a, &token_a, "process.Process/List", json!({})).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("was not found")),
        "{body}"
    );
}

#[tokio::test]
async fn an_e2b_sandbox_is_an_ordinary_one_and_a_retried_create_finds_it() {
    let server = server().await;
    let (first, _) = create(&server, &[("idempotency-key", "retry-1")]).await;
    let (again, _) = create(&server, &[("idempotency-key", "retry-1")]).await;
    assert_eq!(first, again, "the same Idempotency-Key, the same sandbox");
    let (other, _) = create(&server, &[]).await;
    assert_ne!(first, other);
    let (status, info) = server.get(&format!("/v1/sandboxes/{first}")).await;
    assert_eq!(status, 200, "{info}");
    assert!(
        info["sessionKey"]
            .as_str()
            .is_some_and(|k| k.starts_with("e2b-")),
        "{info}"
    );

    // Paging: one at a time, the next page's token in x-next-token.
    let (status, page, headers) = control(
        &server,
        reqwest::Method::GET,
        "/v2/sandboxes?limit=1",
        None,
        &[],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page.as_array().map(Vec::len), Some(1));
    let next = headers
        .get("x-next-token")
        .and_then(|v| v.to_str().ok())
        .expect("a next page")
        .to_string();
    let (_, rest, headers) = control(
        &server,
        reqwest::Method::GET,
        &format!("/v2/sandboxes?limit=1&nextToken={next}"),
        None,
        &[],
    )
    .await;
    assert_eq!(rest.as_array().map(Vec::len), Some(1));
    assert!(
        headers.get("x-next-token").is_none(),
        "two sandboxes, two pages"
    );
    assert_ne!(page[0]["sandboxID"], rest[0]["sandboxID"]);

    let (status, body, _) = control(
        &server,
        reqwest::Method::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "nope"})),
        &[],
    )
    .await;
    assert_eq!((status, body["code"].as_u64()), (404, Some(404)), "{body}");
    let wrong = server
        .client
        .get(format!("{}/v2/sandboxes", server.base))
        .header("x-api-key", "e2b_ffff")
        .send()
        .await
        .expect("list");
    assert_eq!(wrong.status().as_u16(), 401);
}

#[tokio::test]
async fn stdin_reaches_a_command_pids_are_the_sandboxs_and_connect_follows_a_running_one() {
    let server = server().await;
    let lines = check(&server, &["stdin_pids_connect"]).await;
    let sid = sandbox_of(&lines);
    assert_eq!(line(&lines, "stdin")["stdout"], "first line\nsecond\n");
    assert_eq!(line(&lines, "stream_input")["stdout"], "one\ntwo\nthree\n");
    assert_eq!(line(&lines, "connect")["exit_code"], 4);
    // The pid the SDK was given is the one sandboxd's own API shows.
    let pid = line(&lines, "pid")["pid"].as_u64().expect("a pid");
    let (status, listed) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert_eq!(status, 200, "{listed}");
    let cat = listed["commands"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["summary"].as_str() == Some("cat")))
        .unwrap_or_else(|| panic!("no cat in {listed}"));
    assert_eq!(cat["exitCode"], 0, "cat read its stdin to the end: {cat}");
    let sleeper = listed["commands"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["summary"].as_str() == Some("sleep 300"))
        })
        .unwrap_or_else(|| panic!("no sleep 300 in {listed}"));
    assert_eq!(sleeper["pid"].as_u64(), Some(pid), "{sleeper}");
}

/// The tagged processes in the answer of envd's `List`, by pid.
async fn listed_tags(server: &TestServer, sid: &str, token: &str) -> Vec<(u64, Value)> {
    let (status, listed) = envd(server, sid, token, "process.Process/List", json!({})).await;
    assert_eq!(status, 200, "{listed}");
    listed["processes"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| (p["pid"].as_u64().unwrap_or(0), p["tag"].clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Process tags, which neither SDK sets: check.py starts tagged commands
/// and a tagged session with raw `Start` calls, reads the tags back
/// through the SDK's `list()` and addresses the processes by tag with
/// raw calls; here its answers are checked, and the tags of what it left
/// running are checked again after a restart of sandboxd.
#[tokio::test]
async fn a_tag_names_a_process_for_every_call_and_survives_a_restart() {
    let mut server = server().await;
    let lines = check(&server, &["tags"]).await;
    let sid = sandbox_of(&lines);
    assert_eq!(
        line(&lines, "connect_input_close")["stdout"],
        "hello by tag\n"
    );
    assert_eq!(line(&lines, "session_by_tag")["size"], "30 100");
    line(&lines, "duplicates");
    let not_found = line(&lines, "not_found");
    let error = |v: &Value| (v["code"].clone(), v["message"].clone());
    assert_eq!(not_found["gone_tag"][0], 404, "{not_found}");
    assert_eq!(
        error(&not_found["gone_tag"][1]),
        (
            json!("not_found"),
            json!("process with tag web server not found")
        )
    );
    assert_eq!(
        error(&not_found["unknown_tag"]),
        (
            json!("not_found"),
            json!("process with tag no such tag not found")
        )
    );
    assert_eq!(not_found["unknown_pid"][0], 404, "{not_found}");
    assert_eq!(
        error(&not_found["unknown_pid"][1]),
        (
            json!("not_found"),
            json!("process with pid 999999 not found")
        )
    );
    assert_eq!(not_found["by_pid"], 200, "the positive control");
    let invalid = line(&lines, "invalid")["errors"].clone();
    let invalid = invalid.as_array().expect("errors");
    assert_eq!(invalid.len(), 4, "{invalid:?}");
    for (e, names) in invalid
        .iter()
        .zip(["tag: ", "tag: ", "tag: ", "a pid or a tag, not both"])
    {
        assert_eq!(e["code"], "invalid_argument", "{e}");
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(names)),
            "{e}"
        );
    }

    // What was refused did not start; the summaries match as they read
    // (the keeper's is the positive control).
    let (status, listed) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert_eq!(status, 200, "{listed}");
    let summaries: Vec<&str> = listed["commands"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["summary"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        summaries.contains(&"sleep 304") && !summaries.contains(&"echo refused-tag"),
        "{summaries:?}"
    );
    let (status, ptys) = server.get(&format!("/v1/sandboxes/{sid}/ptys")).await;
    assert_eq!(status, 200, "{ptys}");
    assert_eq!(
        ptys["ptys"].as_array().map(Vec::len),
        Some(1),
        "only the session with a valid tag opened: {ptys}"
    );

    let left = line(&lines, "left");
    let (keeper, term) = (left["keeper"].as_u64(), left["term"].as_u64());
    let token = left["token"]
        .as_str()
        .expect("the access token")
        .to_string();
    server.restart().await;
    let tags = listed_tags(&server, &sid, &token).await;
    assert!(
        tags.contains(&(keeper.unwrap_or(0), json!("keeper")))
            && tags.contains(&(term.unwrap_or(0), json!("term"))),
        "both keep their tags across the restart: {tags:?}"
    );
    let (status, body) = envd(
        &server,
        &sid,
        &token,
        "process.Process/SendSignal",
        json!({"process": {"tag": "keeper"}, "signal": "SIGNAL_SIGKILL"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    harness::eventually(
        Duration::from_secs(30),
        "the keeper ended by its tag",
        || {
            let (server, sid, token) = (&server, &sid, &token);
            async move {
                let tags = listed_tags(server, sid, token).await;
                !tags.iter().any(|(pid, _)| Some(*pid) == keeper)
                    && tags.contains(&(term.unwrap_or(0), json!("term")))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn files_move_make_directories_and_are_watched_by_polling_and_by_stream() {
    let server = server().await;
    let lines = check(&server, &["files_more", "watch_async"]).await;
    let sid = sandbox_of(&lines);
    line(&lines, "rename_make_dir");
    line(&lines, "watch_sync");
    line(&lines, "watch_async");
    let (status, read) = server.read_file(&sid, "/workspace/made/deep/new.txt").await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["contentBase64"], harness::b64(b"moved"), "{read}");
}

#[tokio::test]
async fn metadata_filters_the_list_and_a_pause_keeps_processes_for_connect_to_resume() {
    let server = server().await;
    let lines = check(&server, &["pause_metadata"]).await;
    assert_eq!(line(&lines, "metadata")["listed"], 1);
    line(&lines, "paused");
    line(&lines, "resumed");
    let sid = sandbox_of(&lines);
    let (status, _) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(status, 404, "the SDK's kill removed the resumed sandbox");
}

/// E2B's `endAt` of a sandbox, which must exist.
async fn end_at_of(server: &TestServer, sid: &str) -> String {
    let path = format!("/sandboxes/{sid}");
    let (status, body, _) = control(server, reqwest::Method::GET, &path, None, &[]).await;
    assert_eq!(status, 200, "{sid} is there: {body}");
    body["endAt"].as_str().expect("endAt").to_string()
}

/// `POST /sandboxes/{id}/timeout` with `body`.
async fn set_timeout(server: &TestServer, sid: &str, body: Value) -> (u16, Value) {
    let path = format!("/sandboxes/{sid}/timeout");
    let (status, body, _) = control(server, reqwest::Method::POST, &path, Some(body), &[]).await;
    (status, body)
}

/// E2B's `timeout` is a lifetime, not an idle TTL: check.py's `lifetimes`
/// shortens one under a running command (it ends), lengthens one past its
/// first end time, and lets an `on_timeout: pause` one pause and resumes
/// it. Here: the ended one left nothing; the lengthened one outlives an
/// idle TTL that a plain sandbox made later ran out of (the positive
/// control that the reaper ran), and keeps its end time across a restart
/// of sandboxd, whose reaper then ends it at a new one.
#[tokio::test]
async fn a_timeout_ends_or_pauses_a_sandbox_at_its_end_time_busy_or_idle_and_survives_a_restart() {
    let mut server = TestServer::start_with(
        ServerOptions::default()
            .token(KEY)
            .env("SANDBOXD_DEFAULT_IDLE_TTL_MS", "10000"),
    )
    .await;
    let lines = check(&server, &["lifetimes"]).await;
    let ended = line(&lines, "ended")["sandbox"]
        .as_str()
        .expect("id")
        .to_string();
    let (status, _) = server.get(&format!("/v1/sandboxes/{ended}")).await;
    assert_eq!(status, 404, "the shortened sandbox is gone");
    assert!(server.session_containers(&ended).await.is_empty());
    line(&lines, "auto_paused");
    line(&lines, "resumed");

    let kept = line(&lines, "lengthened")["sandbox"]
        .as_str()
        .expect("id")
        .to_string();
    let control_id = server
        .create(json!({"sessionKey": "idle-control", "network": {"mode": "none"}}))
        .await;
    // Polled by the list, which is no use of a sandbox (a GET of it is).
    harness::eventually(
        Duration::from_secs(40),
        "the idle control expires",
        || async {
            let (_, list) = server.get("/v1/sandboxes").await;
            !list.to_string().contains(&control_id)
        },
    )
    .await;
    let end_at = end_at_of(&server, &kept).await;
    server.restart().await;
    assert_eq!(
        end_at_of(&server, &kept).await,
        end_at,
        "the end time survives a restart"
    );

    for bad in [json!({"timeout": -1}), json!({}), json!({"timeout": "x"})] {
        let (status, body) = set_timeout(&server, &kept, bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    assert_eq!(
        end_at_of(&server, &kept).await,
        end_at,
        "a refused timeout changed nothing"
    );
    let (status, body) = set_timeout(&server, &kept, json!({"timeout": 1})).await;
    assert_eq!(status, 204, "{body}");
    harness::eventually(
        Duration::from_secs(30),
        "the restarted reaper ends it",
        || async { server.get(&format!("/v1/sandboxes/{kept}")).await.0 == 404 },
    )
    .await;
}

#[tokio::test]
async fn get_host_names_a_port_sandboxd_forwards_to_and_signed_urls_open_their_own_sandbox_only() {
    let server = server().await;
    let lines = check(&server, &["port_hosts", "signed_urls"]).await;
    let named = line(&lines, "port_hosts");
    let sid = named["sandbox"].as_str().expect("id");
    let authority = server.base.trim_start_matches("http://");
    assert_eq!(named["host"], format!("8000-{sid}.{authority}"));
    // The ports opened on first use are the sandbox's: published through
    // proxies like any port URL.
    let proxies = server.containers_with("sandboxd.sandbox_id", sid).await;
    let names: Vec<String> = proxies
        .iter()
        .flat_map(|c| c.names.iter().flatten().cloned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.ends_with(&format!("{sid}-port-8000"))),
        "port 8000 has its proxy: {names:?}"
    );
    let signed = line(&lines, "signed_urls")["sandbox"]
        .as_str()
        .expect("id")
        .to_string();
    let (status, _) = server.get(&format!("/v1/sandboxes/{signed}")).await;
    assert_eq!(status, 404, "check.py killed the signed URLs' sandbox");
}

#[tokio::test]
async fn what_the_domain_lacks_answers_unimplemented_naming_it() {
    let server = server().await;
    let (sid, token) = create(&server, &[]).await;
    let (status, body, _) = control(
        &server,
        reqwest::Method::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "autoPause": true, "autoResume": {"enabled": true}})),
        &[],
    )
    .await;
    assert_eq!(status, 501, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("autoResume")),
        "{body}"
    );
    let (status, body) = envd(&server, &sid, &token, "process.Process/Pause", json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (501, Some("unimplemented")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("process.Process/Pause")),
        "{body}"
    );
    let (status, body) = envd(&server, &sid, &token, "process.Process/List", json!({})).await;
    assert_eq!(status, 200, "the positive control: {body}");
}

/// E2B's snapshots are not served (a snapshot of the whole sandbox, not a
/// workspace checkpoint); a sandbox made through E2B takes checkpoints
/// through sandboxd's own routes, by its `sandboxID`.
#[tokio::test]
async fn an_e2b_sandbox_takes_checkpoints_through_the_v1_routes() {
    let server = server().await;
    let (sid, _) = create(&server, &[]).await;
    let (status, body, _) = control(
        &server,
        reqwest::Method::POST,
        &format!("/sandboxes/{sid}/snapshots"),
        Some(json!({})),
        &[],
    )
    .await;
    assert_eq!(status, 404, "E2B's snapshots are not served: {body}");

    assert_eq!(server.sh(&sid, "echo one > turn.txt").await["exitCode"], 0);
    let (status, cp) = server
        .post(
            &format!("/v1/sandboxes/{sid}/checkpoints"),
            json!({"label": "e2b-turn"}),
        )
        .await;
    assert_eq!(status, 201, "{cp}");
    let later = "echo two > turn.txt && echo new > new.txt";
    assert_eq!(server.sh(&sid, later).await["exitCode"], 0);
    let cp_id = cp["checkpointId"].as_str().expect("checkpointId");
    let (status, changed) = server
        .post(
            &format!("/v1/sandboxes/{sid}/checkpoints/{cp_id}:restore"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    let back = server
        .sh(&sid, "cat turn.txt; test -e new.txt || echo gone")
        .await;
    assert_eq!(back["stdout"], "one\ngone\n", "{back} after {changed}");
}
