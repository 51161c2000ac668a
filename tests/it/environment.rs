//! A sandbox's environment (`env` at create): every command and terminal
//! session started in it gets the variables, under its own `env` (which
//! wins for a name both give); the values are never shown; they survive a
//! restart of sandboxd, come with a claim from the warm pool, and are
//! refused by field when out of bounds.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{ServerOptions, TestServer, eventually};

const ENV: &str = r#"printf '%s|%s|%s' "$GREETING" "$SHARED" "${SECRET:+set}""#;

fn env() -> Value {
    json!({"GREETING": "hello, world = ok", "SHARED": "sandbox", "SECRET": "s3cr3t-value"})
}

/// What [`ENV`] prints in `sid`, with the command's own `env`.
async fn seen(server: &TestServer, sid: &str, own: Value) -> String {
    let r = server
        .run(sid, json!({"command": ENV, "env": own, "timeoutMs": 30000}))
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");
    r["stdout"].as_str().expect("stdout").to_string()
}

#[tokio::test]
async fn a_sandboxs_env_reaches_its_commands_and_terminals_under_their_own_and_survives_a_restart()
{
    let mut server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "env", "network": {"mode": "none"}, "env": env()}))
        .await;
    let plain = server.offline_sandbox().await;

    assert_eq!(
        seen(&server, &sid, json!({})).await,
        "hello, world = ok|sandbox|set"
    );
    assert_eq!(
        seen(&server, &sid, json!({"SHARED": "command"})).await,
        "hello, world = ok|command|set",
        "the command's own value wins"
    );
    assert_eq!(
        seen(&server, &plain, json!({})).await,
        "||",
        "another sandbox has none of it (the control)"
    );

    // A terminal session gets it too, under its own env.
    let (status, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/ptys"),
            json!({"command": format!("{ENV} > pty-env"), "env": {"SHARED": "terminal"}}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    eventually(Duration::from_secs(30), "the terminal's output", || async {
        server.sh(&sid, "test -s pty-env").await["exitCode"] == 0
    })
    .await;
    let r = server.sh(&sid, "cat pty-env").await;
    assert_eq!(r["stdout"], "hello, world = ok|terminal|set", "{r}");

    // Never shown: not in the sandbox, not in the list.
    for path in [format!("/v1/sandboxes/{sid}"), "/v1/sandboxes".to_string()] {
        let (status, v) = server.get(&path).await;
        assert_eq!(status, 200, "{v}");
        assert!(!v.to_string().contains("s3cr3t-value"), "{path}: {v}");
    }

    // Kept across a restart of sandboxd (read back from the labels); a
    // create that finds the session's sandbox keeps the env it has.
    server.restart().await;
    let (status, v) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "env", "network": {"mode": "none"}, "env": {"GREETING": "other"}}),
        )
        .await;
    assert_eq!((status, &v["created"]), (200, &json!(false)), "{v}");
    assert_eq!(
        seen(&server, &sid, json!({})).await,
        "hello, world = ok|sandbox|set"
    );
}

/// A claimed pool member was made before any session: the session's env
/// comes with the claim (on its claim volume), across a crash of sandboxd
/// too.
#[tokio::test]
async fn a_sandbox_claimed_from_the_pool_gets_its_sessions_env() {
    let mut server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_POOL_SIZE", "1")).await;
    crate::pool::wait_for_members(&server, "default", 1).await;
    let sid = server
        .create(json!({"sessionKey": "env-claim", "env": env()}))
        .await;
    assert!(crate::pool::from_pool(&server, &sid), "a claim");
    assert_eq!(
        seen(&server, &sid, json!({})).await,
        "hello, world = ok|sandbox|set"
    );
    server.crash_and_restart().await;
    assert_eq!(
        seen(&server, &sid, json!({})).await,
        "hello, world = ok|sandbox|set"
    );
}

#[tokio::test]
async fn an_env_out_of_bounds_is_refused_by_field_and_nothing_is_made() {
    let server = TestServer::start().await;
    let many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("V{i}"), json!("v"))).collect();
    for (env, says) in [
        (json!({"1BAD": "v"}), "not a valid variable name"),
        (json!({"A-B": "v"}), "not a valid variable name"),
        (json!({"A": "a\u{0}b"}), "env.A"),
        (Value::Object(many), "at most 64"),
        (json!({"A": "x".repeat(32 * 1024)}), "bytes in all"),
    ] {
        let (status, v) = server
            .post(
                "/v1/sandboxes",
                json!({"sessionKey": "x", "network": {"mode": "none"}, "env": env}),
            )
            .await;
        assert_eq!(
            (status, v["code"].clone()),
            (400, json!("invalid_request")),
            "{v}"
        );
        assert!(v.to_string().contains(says), "{says}: {v}");
    }
    let (status, v) = server.get("/v1/sandboxes").await;
    assert_eq!(status, 200);
    assert_eq!(v["sandboxes"], json!([]), "nothing was made");
}
