//! The E2B dialect driven by E2B's own JavaScript SDK (`e2b`, pinned in
//! clients/e2b-js), unchanged, with only E2B_API_KEY, E2B_API_URL and
//! E2B_SANDBOX_URL set to sandboxd (clients/e2b-js/check.mjs says what
//! each check asserts): create, commands in the foreground and the
//! background, files, a terminal session, stdin, make_dir, rename and a
//! streamed watch, pause and connect resuming, `getHost` reaching a server
//! in the sandbox by name and a signed `downloadUrl`, info and list, a timeout
//! shortened under a running command (the sandbox ends), a wrong API key,
//! kill. A missing node or npm fails the test: it is never skipped.

use std::path::Path;
use std::time::Duration;

use crate::e2b::{sdk_env, server};
use crate::harness;

/// Every check check.mjs prints, in order.
const CHECKS: &[&str] = &[
    "create",
    "commands",
    "background",
    "files",
    "pty",
    "stdin",
    "dirs_watch",
    "pause",
    "host",
    "info",
    "timeout",
    "errors",
    "kill",
];

#[tokio::test]
async fn the_javascript_sdk_drives_commands_files_a_terminal_and_the_lifecycle() {
    let server = server().await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/e2b-js");
    harness::npm_ci(&dir).await;
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        sdk_env(
            tokio::process::Command::new("npm")
                .args(["run", "--silent", "check"])
                .current_dir(&dir),
            &server,
        )
        .output(),
    )
    .await
    .expect("the JavaScript client took over 5 minutes")
    .expect("run `npm run check` (node 20 and npm are needed for this test)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let passed: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ok "))
        .map(|l| l.split(' ').next().unwrap_or_default())
        .collect();
    assert!(
        out.status.success() && passed == CHECKS && stdout.lines().any(|l| l == "done"),
        "E2B's JavaScript SDK (checks passed: {passed:?}, wanted {CHECKS:?}):\n{stdout}{}\nsandboxd log: {}",
        String::from_utf8_lossy(&out.stderr),
        server.log.display()
    );
    let (_, sandboxes) = server.get("/v1/sandboxes").await;
    assert_eq!(
        sandboxes["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "the SDK's kill removed its sandbox: {sandboxes}"
    );
}
