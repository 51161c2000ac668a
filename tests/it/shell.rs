//! `sandboxd shell`, the client of interactive terminals, run as a user
//! runs it: under a real terminal (a pty pair this test holds; `setsid -c`
//! makes its slave the client's controlling terminal, so the kernel's
//! SIGWINCH reaches the client) against the real server and engine. It
//! finds the sandbox by session key, runs a shell there, forwards typed
//! bytes, the terminal's size and its changes, exits with the remote exit
//! code and leaves the terminal as it found it. Also: the argv form by
//! sandbox id without a terminal (80x24), and the refusals (no token, a
//! wrong token, an unknown sandbox, an https URL) with exit 2 and a message
//! that says what to do.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
use rustix::termios::{self, LocalModes, Termios, Winsize};
use serde_json::json;

use crate::harness::{self, ServerOptions, TestServer};

const TOKEN: &str = "shell-test-token";

/// A pty pair: the test types into and reads from the master; the slave is
/// the client's terminal. Everything the master reads is kept.
struct Pty {
    master: File,
    slave: OwnedFd,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    fn open() -> Pty {
        let master =
            openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).expect("openpt");
        grantpt(&master).expect("grantpt");
        unlockpt(&master).expect("unlockpt");
        let name = ptsname(&master, Vec::new()).expect("ptsname");
        // NOCTTY: the slave must become the client's controlling terminal,
        // never the test's.
        let slave = rustix::fs::open(
            name.as_c_str(),
            OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open the pty slave");
        let master = File::from(master);
        let output = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().expect("clone the master");
        let sink = Arc::clone(&output);
        // Ends with EIO once every slave descriptor is closed (the test's
        // included, when the Pty is dropped).
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .expect("output lock")
                    .extend_from_slice(&buf[..n]);
            }
        });
        Pty {
            master,
            slave,
            output,
        }
    }

    fn set_size(&self, rows: u16, cols: u16) {
        termios::tcsetwinsize(
            &self.master,
            Winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .expect("tcsetwinsize");
    }

    fn termios(&self) -> Termios {
        termios::tcgetattr(&self.slave).expect("tcgetattr on the slave")
    }

    fn type_in(&mut self, text: &str) {
        self.master.write_all(text.as_bytes()).expect("type");
    }

    fn len(&self) -> usize {
        self.output.lock().expect("output lock").len()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().expect("output lock")).into_owned()
    }

    /// Whether `line` appeared on a line of its own after byte `from`. A
    /// line may start after `\r` alone: bash ends its bracketed-paste mode
    /// with `ESC[?2004l\r` before a command's output.
    fn shows_line(&self, line: &str, from: usize) -> bool {
        let out = self.output.lock().expect("output lock");
        let Some(out) = out.get(from..) else {
            return false;
        };
        ["\r", "\n"].iter().any(|start| {
            let needle = format!("{start}{line}\r\n");
            out.windows(needle.len()).any(|w| w == needle.as_bytes())
        })
    }

    fn stdio(&self) -> Stdio {
        Stdio::from(self.slave.try_clone().expect("dup the slave"))
    }
}

/// Kills the client if the test fails while it runs.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().expect("try_wait")
    }
}

/// Waits until `line` shows as a line after byte `from`, or `within` passes, while
/// the client lives; false on timeout.
async fn appears(
    pty: &Pty,
    client: &mut Running,
    line: &str,
    from: usize,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if pty.shows_line(line, from) {
            return true;
        }
        if let Some(status) = client.exited() {
            panic!(
                "sandboxd shell exited ({status}) before {line:?} appeared; terminal:\n{:?}",
                pty.text()
            );
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn shell_cmd(args: &[&str]) -> std::process::Output {
    let run = tokio::process::Command::new(harness::binary())
        .arg("shell")
        .args(args)
        .env_remove("SANDBOXD_URL")
        .env_remove("SANDBOXD_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("sandboxd shell ended within 60 s")
        .expect("run sandboxd shell")
}

#[tokio::test]
async fn under_a_real_terminal_runs_a_shell_forwards_a_resize_and_exits_with_the_remote_code() {
    let server = TestServer::start_with(ServerOptions::default().token(TOKEN)).await;
    let key = format!("chat:{}", harness::unique_instance());
    server
        .create(json!({"sessionKey": key, "network": {"mode": "none"}}))
        .await;

    let mut pty = Pty::open();
    pty.set_size(25, 90);
    let before = pty.termios();
    assert!(
        before
            .local_modes
            .contains(LocalModes::ICANON | LocalModes::ECHO),
        "a fresh terminal is cooked"
    );
    let mut client = Running(
        Command::new("setsid")
            .args(["-w", "-c", harness::binary(), "shell"])
            .args(["--url", &server.base, "--token", TOKEN, &key])
            .env_remove("SANDBOXD_URL")
            .env_remove("SANDBOXD_ADMIN_TOKEN")
            .stdin(pty.stdio())
            .stdout(pty.stdio())
            .stderr(pty.stdio())
            .spawn()
            .expect("spawn setsid -c sandboxd shell"),
    );

    // The client makes the terminal raw once it is attached: from then on
    // what is typed goes to the session.
    let deadline = Instant::now() + Duration::from_secs(60);
    while pty.termios().local_modes.contains(LocalModes::ICANON) {
        if let Some(status) = client.exited() {
            panic!(
                "sandboxd shell exited ({status}) before attaching; terminal:\n{}",
                pty.text()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the terminal never became raw; terminal:\n{:?}",
            pty.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mark = pty.len();
    pty.type_in("echo hi\r");
    assert!(
        appears(&pty, &mut client, "hi", mark, Duration::from_secs(30)).await,
        "`hi` on a line of its own; terminal:\n{:?}",
        pty.text()
    );

    // The create carried the terminal's size.
    let mark = pty.len();
    pty.type_in("stty size\r");
    assert!(
        appears(&pty, &mut client, "25 90", mark, Duration::from_secs(30)).await,
        "the initial size; terminal:\n{:?}",
        pty.text()
    );

    // The kernel tells the client (SIGWINCH) and the client the server. The
    // resize message and the typed bytes race inside the client, so ask
    // again until the new size shows.
    pty.set_size(40, 120);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mark = pty.len();
        pty.type_in("stty size\r");
        if appears(&pty, &mut client, "40 120", mark, Duration::from_secs(2)).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new size never reached the session; terminal:\n{:?}",
            pty.text()
        );
    }

    pty.type_in("exit 7\r");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = client.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "sandboxd shell did not exit; terminal:\n{:?}",
            pty.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        status.code(),
        Some(7),
        "the remote exit code; terminal:\n{:?}",
        pty.text()
    );

    // The terminal is as the client found it.
    let after = pty.termios();
    assert!(
        after
            .local_modes
            .contains(LocalModes::ICANON | LocalModes::ECHO),
        "cooked again: {after:?}"
    );
    assert_eq!(after.local_modes, before.local_modes);
    assert_eq!(after.input_modes, before.input_modes);
    assert_eq!(after.output_modes, before.output_modes);
    assert_eq!(after.control_modes, before.control_modes);
    assert!(
        !pty.text().contains("sandboxd shell:"),
        "no complaint; terminal:\n{:?}",
        pty.text()
    );
}

#[tokio::test]
async fn without_a_terminal_runs_argv_by_sandbox_id_at_80x24() {
    let server = TestServer::start_with(ServerOptions::default().token(TOKEN)).await;
    let sid = server.offline_sandbox().await;

    let out = shell_cmd(&[
        "--url",
        &server.base,
        "--token",
        TOKEN,
        &sid,
        "--",
        "stty",
        "size",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout {stdout:?} stderr {stderr:?}"
    );
    assert!(
        stdout.contains("24 80"),
        "stdout {stdout:?} stderr {stderr:?}"
    );

    let out = shell_cmd(&[
        "--url",
        &server.base,
        "--token",
        TOKEN,
        &sid,
        "--",
        "sh",
        "-c",
        "echo argv-$((6*7)); exit 3",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "stdout {stdout:?} stderr {stderr:?}"
    );
    assert!(
        stdout.contains("argv-42"),
        "stdout {stdout:?} stderr {stderr:?}"
    );
}

#[tokio::test]
async fn refusals_exit_2_with_a_message_that_says_why() {
    let server = TestServer::start_with(ServerOptions::default().token(TOKEN)).await;
    let key = format!("chat:{}", harness::unique_instance());
    server
        .create(json!({"sessionKey": key, "network": {"mode": "none"}}))
        .await;
    let base = server.base.as_str();
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["--url", base, &key],
            &[
                "401 unauthorized",
                "pass --token or set SANDBOXD_ADMIN_TOKEN",
            ],
        ),
        (
            &["--url", base, "--token", "wrong", &key],
            &["401 unauthorized", "the token given was refused"],
        ),
        (
            &["--url", base, "--token", TOKEN, "chat:no-such-session"],
            &["no sandbox has the id or session key `chat:no-such-session`"],
        ),
        (
            &["--url", "https://127.0.0.1:1", "--token", TOKEN, &key],
            &["only http:// URLs are supported"],
        ),
    ];
    for (args, needles) in cases {
        let out = shell_cmd(args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("sandboxd shell: "), "{args:?}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {stderr}");
        }
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // Nothing was created for the unknown session.
    let (status, list) = server.get("/v1/sandboxes").await;
    assert_eq!(status, 200);
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    assert!(
        !server.log_text().contains(TOKEN),
        "the token is never logged"
    );
}
