//! The official MCP TypeScript SDK (`@modelcontextprotocol/sdk`, pinned in
//! clients/mcp-typescript) against a real sandboxd: its client, unchanged,
//! initialises on a session's endpoint with a session token, lists the
//! tools and drives them (clients/mcp-typescript/check.mjs says what each
//! check asserts). Under gVisor it runs the short smoke and says so. A
//! missing node or npm fails the test: it is never skipped.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::harness::{self, ServerOptions, TestServer};

const TOKEN: &str = "mcp-ts-Admin-Token-3";

/// Every check check.mjs prints, in order, for the full run and the smoke.
const FULL: &[&str] = &[
    "initialize",
    "tools",
    "bash",
    "files",
    "editFile",
    "errors",
    "progress",
    "cancel",
    "sandboxUrl",
    "done",
];
const SMOKE: &[&str] = &["initialize", "tools", "bash", "files", "done"];

#[tokio::test]
async fn the_typescript_sdk_client_drives_every_tool_with_a_session_token() {
    let server = TestServer::start_with(ServerOptions::default().token(TOKEN)).await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/mcp-typescript");
    let (status, minted) = server
        .post("/v1/sessions/ts-chat/tokens", json!({"ttlMs": 600_000}))
        .await;
    assert_eq!(status, 201, "a session token: {minted}");
    let session_token = minted["token"].as_str().expect("token").to_string();
    let npm = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("npm");
        cmd.args(args)
            .current_dir(&dir)
            .env(
                "SANDBOXD_MCP_URL",
                format!("{}/v1/sessions/ts-chat/mcp?ports=3000", server.base),
            )
            .env("SANDBOXD_TOKEN", &session_token)
            .kill_on_drop(true);
        cmd
    };
    harness::npm_ci(&dir).await;
    let (checks, which) = if harness::under_gvisor() {
        (SMOKE, "smoke")
    } else {
        (FULL, "full")
    };
    eprintln!("mcp_typescript: the {which} run (gVisor runs the smoke only)");
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        npm(&["run", "check"]).env("CHECKS", which).output(),
    )
    .await
    .expect("the TypeScript client took over 5 minutes")
    .expect("run `npm run check` (node 20 and npm are needed for this test)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for info in stdout.lines().filter(|l| l.starts_with("info ")) {
        eprintln!("mcp_typescript: {info}");
    }
    let passed: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ok "))
        .collect();
    assert!(
        out.status.success() && passed == checks,
        "the TypeScript SDK's client (checks passed: {passed:?}, wanted {checks:?}):\n{stdout}{}\nsandboxd log: {}",
        String::from_utf8_lossy(&out.stderr),
        server.log.display()
    );
}
