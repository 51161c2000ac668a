//! Configuration at startup: a bad value stops sandboxd with exit code 2
//! and one line naming the key; a non-loopback address needs a token unless
//! running without one is explicitly allowed.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{self, ServerOptions, TestServer};

/// Runs the binary with `env` and returns (exit code, stderr) once it exits.
/// A configuration it accepts would start a server: that fails the test
/// after 10 s instead of hanging it.
pub(crate) fn run_expecting_exit(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let stderr_path = std::env::temp_dir().join(format!("{}.stderr", harness::unique_instance()));
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut child = Command::new(harness::binary())
        .args(args)
        .env("SANDBOXD_INSTANCE", harness::unique_instance())
        .env_remove("SANDBOXD_PORT")
        .env_remove("SANDBOXD_CONFIG")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("run sandboxd");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sandboxd accepted {env:?} {args:?} and kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let _ = std::fs::remove_file(&stderr_path);
    (status.code(), text)
}

#[test]
fn bad_configuration_exits_2_with_one_line_naming_the_key() {
    let dir = std::env::temp_dir().join(harness::unique_instance());
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let unknown = dir.join("unknown.toml");
    std::fs::write(&unknown, "prot = 8080\n").expect("write");
    let zero = dir.join("zero.toml");
    std::fs::write(&zero, "port = 0\n").expect("write");

    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<&'a str>, &'a str);
    let cases: Vec<Case> = vec![
        (vec![("SANDBOXD_PORT", "eighty")], vec![], "SANDBOXD_PORT"),
        (vec![("SANDBOXD_PORT", "0")], vec![], "port"),
        (
            vec![("SANDBOXD_WORKSPACE_DIR", "workspace")],
            vec![],
            "SANDBOXD_WORKSPACE_DIR",
        ),
        (
            vec![("SANDBOXD_MAX_CONCURRENT", "many")],
            vec![],
            "SANDBOXD_MAX_CONCURRENT",
        ),
        (
            vec![],
            vec!["--config", unknown.to_str().expect("utf8")],
            "prot",
        ),
        (
            vec![],
            vec!["--config", zero.to_str().expect("utf8")],
            "port",
        ),
        (
            vec![("SANDBOXD_CONFIG", zero.to_str().expect("utf8"))],
            vec![],
            "port",
        ),
    ];
    for (env, args, key) in cases {
        let (code, stderr) = run_expecting_exit(&env, &args);
        assert_eq!(code, Some(2), "{env:?} {args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(lines[0].contains(key), "{key} named in: {stderr}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn non_loopback_bind_without_token_refuses_to_start() {
    let (code, stderr) = run_expecting_exit(&[("SANDBOXD_BIND_HOST", "0.0.0.0")], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("SANDBOXD_ADMIN_TOKEN"), "{stderr}");
    assert!(stderr.contains("allow_insecure_no_token"), "{stderr}");
}

#[tokio::test]
async fn insecure_non_loopback_starts_when_explicitly_allowed() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_BIND_HOST", "0.0.0.0")
            .env("SANDBOXD_ALLOW_INSECURE_NO_TOKEN", "true"),
    )
    .await;
    let (status, body) = server.get("/v1/health").await;
    assert_eq!(status, 200, "{body}");
}
