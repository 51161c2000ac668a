//! The web console at `/ui/`, driven in a real headless Chromium (Debian's
//! `chromium` and `chromium-driver`) through Selenium
//! (clients/ui-browser/drive.py, pinned in its requirements.txt, installed
//! into a venv under target/) against a real sandboxd with an admin token.
//! The driver reports what the browser saw line by line; this side set up
//! the sandbox, command, file and port server through the API, checks the
//! upload, the checkpoint restore and the stop through the API, and judges
//! the browser's network and console logs. A second run uses the keyboard
//! alone. Screenshots land in target/ui-screenshots/.
//! `smoke_signs_in` is the short one kept under gVisor.
//! `firefox_shows_the_log_terminal_and_files` runs the main scenario's
//! core in Debian's Firefox ESR through geckodriver.

use serde_json::json;
use std::path::{Path, PathBuf};

use crate::harness::{self, ScriptRun, ServerOptions, TestServer};

const TOKEN: &str = "ui-Test-Token-43";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(|| harness::python_venv("clients/ui-browser", "ui-browser-venv"))
        .clone()
}

/// geckodriver, which Debian does not package: scripts/test.sh builds it
/// from crates.io into target/ when it is missing.
fn geckodriver() -> PathBuf {
    let path = repo().join("target/geckodriver/bin/geckodriver");
    assert!(
        path.exists(),
        "{} is missing: scripts/test.sh builds it (cargo install geckodriver)",
        path.display()
    );
    path
}

/// Starts the browser driver on one scenario.
fn drive(server: &TestServer, scenario: &str, args: &[&str]) -> ScriptRun {
    let browser: &[(&str, &str)] = if scenario == "firefox" {
        &[("/usr/bin/firefox-esr", "firefox-esr")]
    } else {
        &[
            ("/usr/bin/chromium", "chromium"),
            ("/usr/bin/chromedriver", "chromium-driver"),
        ]
    };
    for (tool, package) in browser {
        assert!(
            Path::new(tool).exists(),
            "{tool} is missing: install Debian's {package} (scripts/test.sh does)"
        );
    }
    let shots = repo().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).expect("screenshot directory");
    let shots = shots.to_str().expect("a UTF-8 path");
    let mut all = vec![scenario, server.base.as_str(), shots];
    all.extend_from_slice(args);
    ScriptRun::start(&python(), "clients/ui-browser/drive.py", &all, TOKEN)
}

/// The rest of the line after `prefix`.
async fn until(driver: &mut ScriptRun, prefix: &str) -> String {
    let line = driver.until(prefix).await;
    line[prefix.len()..].trim().to_string()
}

/// Waits for the end; every request URL and console message it logged.
async fn finish(driver: ScriptRun) -> (Vec<String>, Vec<String>) {
    let seen = driver.finish().await;
    assert_eq!(seen.last().map(String::as_str), Some("done"), "{seen:?}");
    let of = |kind: &str| -> Vec<String> {
        seen.iter()
            .filter_map(|l| l.strip_prefix(kind).map(|r| r.trim().to_string()))
            .collect()
    };
    (of("request "), of("console "))
}

async fn server() -> TestServer {
    TestServer::start_with(ServerOptions::default().token(TOKEN)).await
}

/// `scheme://host:port` of a URL.
fn origin_of(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split('/').next().unwrap_or("");
    format!("{scheme}://{authority}")
}

/// Every request went to the console's own origin (its WebSocket as
/// `ws://` of the same host and port), or, while the port link was
/// followed, to that port's URL.
fn assert_only_own_origin(requests: &[String], base: &str, port_url: &str) {
    let own = origin_of(base);
    let own_ws = own.replacen("http://", "ws://", 1);
    let port = origin_of(port_url);
    assert!(
        requests.iter().any(|r| r.starts_with("console ")),
        "the network log was read: {requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("console ws://") && r.contains("ticket=")),
        "the terminal's WebSocket is in the network log: {requests:?}"
    );
    for r in requests {
        let (phase, url) = r.split_once(' ').unwrap_or(("", r));
        let origin = origin_of(url);
        let allowed = origin == own || origin == own_ws || (phase == "port" && origin == port);
        assert!(allowed, "a request to another origin ({phase}): {url}");
    }
}

/// A sandbox with a file, a finished command and one printing a line a
/// second (its id returned too).
async fn sandbox_to_show(server: &TestServer) -> (String, String) {
    let sid = server
        .create(json!({"sessionKey": "ui:console", "ports": [8000]}))
        .await;
    let (status, body) = server
        .write_files(
            &sid,
            json!([{"path": "notes/readme.txt", "contentBase64": harness::b64("written through the API\n")}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let finished = server.sh(&sid, "echo finished-output").await;
    assert_eq!(finished["exitCode"], 0, "{finished}");
    let ticker = server
        .start_command(
            &sid,
            json!({"command": "for i in $(seq 1 90); do echo tick-$i; sleep 1; done", "timeoutMs": 600000}),
        )
        .await;
    (sid, ticker)
}

#[tokio::test]
async fn the_console_shows_and_drives_a_sandbox() {
    let server = server().await;
    let client = harness::http_client();

    // The page and its headers, and the same Host and Origin rules.
    let page = client
        .get(format!("{}/ui/", server.base))
        .send()
        .await
        .expect("GET /ui/");
    assert_eq!(page.status(), 200);
    let header = |name: &str| {
        page.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let csp = header("content-security-policy");
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "CSP {csp:?} lacks {directive}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(header("x-frame-options"), "DENY");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("referrer-policy"), "no-referrer");
    assert_eq!(header("cache-control"), "no-cache");
    assert!(header("content-type").starts_with("text/html"));
    let html = page.text().await.expect("body");
    assert!(
        html.contains("app.js"),
        "the built console, not the how-to page: {html}"
    );
    let js = client
        .get(format!("{}/ui/app.js", server.base))
        .send()
        .await
        .expect("GET app.js");
    assert_eq!(js.status(), 200);
    assert!(
        js.headers()[reqwest::header::CONTENT_TYPE]
            .to_str()
            .is_ok_and(|t| t.starts_with("text/javascript"))
    );
    let bare = client
        .get(format!("{}/ui", server.base))
        .send()
        .await
        .expect("GET /ui");
    assert!(
        bare.url().path() == "/ui/" && bare.status() == 200,
        "/ui redirects to /ui/"
    );
    let rebound = client
        .get(format!("{}/ui/", server.base))
        .header("host", "rebound.example")
        .send()
        .await
        .expect("GET with another Host");
    assert_eq!(
        rebound.status(),
        421,
        "a rebound name is refused at /ui/ too"
    );
    let foreign = client
        .get(format!("{}/ui/", server.base))
        .header("origin", "http://other.example")
        .send()
        .await
        .expect("GET with another Origin");
    assert_eq!(
        foreign.status(),
        403,
        "another site's Origin is refused at /ui/ too"
    );

    // What the console is to show: a sandbox with a port, a file, a
    // command printing for a while, and a web server on the port.
    let (sid, ticker) = sandbox_to_show(&server).await;
    server
        .start_command(
            &sid,
            json!({"command": "mkdir -p /tmp/www && echo served-to-the-console > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1", "timeoutMs": 600000}),
        )
        .await;
    let (status, port) = server
        .get(&format!("/v1/sandboxes/{sid}/ports/8000?waitMs=20000"))
        .await;
    assert_eq!(status, 200, "{port}");
    assert_eq!(port["ready"], true, "{port}");
    let port_url = port["url"].as_str().expect("url").to_string();

    let mut driver = drive(&server, "full", &[&sid, &ticker, &port_url]);
    until(&mut driver, "ok refused").await;
    until(&mut driver, "ok signed-in").await;
    until(&mut driver, "ok listed").await;
    // Two different tick lines seen in the log view, a second apart: it
    // followed the running command.
    let live = until(&mut driver, "ok live-log").await;
    assert!(live.contains("tick-"), "{live}");
    until(&mut driver, "ok terminal").await;
    until(&mut driver, "ok file-viewed").await;
    let uploaded = until(&mut driver, "uploaded").await;
    let (path, content) = uploaded.split_once(' ').expect("path and content");
    let (status, read) = server.read_file(&sid, path).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(
        read["contentBase64"].as_str(),
        Some(harness::b64(format!("{content}\n")).as_str()),
        "the uploaded file as the API reads it: {read}"
    );
    driver.tell("checked").await;
    let served = until(&mut driver, "ok port-page").await;
    assert!(served.contains("served-to-the-console"), "{served}");
    until(&mut driver, "ok status").await;
    until(&mut driver, "ok restarted").await;
    let ended = server.wait_command(&sid, &ticker).await;
    assert_eq!(
        ended["exitCode"], 137,
        "the restart ended the running command: {ended}"
    );
    // The console does not wait for the restart to be over; the
    // checkpoint steps need the container up again.
    harness::eventually(
        std::time::Duration::from_secs(60),
        "the restarted sandbox runs a command",
        || async {
            let (status, done) = server
                .post(
                    &format!("/v1/sandboxes/{sid}/commands:run"),
                    json!({"command": "true"}),
                )
                .await;
            status == 200 && done["exitCode"] == 0
        },
    )
    .await;
    driver.tell("running again").await;
    checkpoint_through_the_console(&server, &sid, &mut driver).await;
    until(&mut driver, "ok stopped").await;
    let (status, gone) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(
        status, 404,
        "the sandbox is gone after the console stopped it: {gone}"
    );
    let (requests, console) = finish(driver).await;
    assert_only_own_origin(&requests, &server.base, &port_url);
    let refused: Vec<&String> = console
        .iter()
        .filter(|m| m.contains("Content Security Policy") || m.contains("Refused"))
        .collect();
    assert!(refused.is_empty(), "the CSP refused something: {refused:?}");
}

/// The console took a checkpoint, showed the API's refusal of its label
/// taken again, and deleted another checkpoint; this side changes
/// a file and starts a command; the console's diff shows the change and
/// its restore, confirmed twice (the second to end the command), brings
/// the file's old content back.
async fn checkpoint_through_the_console(server: &TestServer, sid: &str, driver: &mut ScriptRun) {
    let refused = until(driver, "checkpoint-refused").await;
    let (status, again) = server
        .post(
            &format!("/v1/sandboxes/{sid}/checkpoints"),
            json!({"label": "before-edit"}),
        )
        .await;
    assert_eq!(status, 409, "{again}");
    let sentence = again["error"].as_str().expect("the API's message");
    assert!(
        refused.contains(sentence),
        "the console shows the API's message {sentence:?}: {refused}"
    );
    let taken = until(driver, "checkpoint-taken").await;
    let (status, list) = server
        .get(&format!("/v1/sandboxes/{sid}/checkpoints"))
        .await;
    assert_eq!(status, 200, "{list}");
    let labels: Vec<(&str, &str)> = list["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| {
            (
                c["checkpointId"].as_str().unwrap_or_default(),
                c["label"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        labels,
        [(taken.as_str(), "before-edit")],
        "the console's checkpoint, and not the one it deleted: {list}"
    );
    let readme = "/workspace/notes/readme.txt";
    let (status, body) = server
        .write_files(
            sid,
            json!([{"path": readme, "contentBase64": harness::b64("changed after the checkpoint\n")}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sleeper = server
        .start_command(sid, json!({"command": "sleep 300", "timeoutMs": 600000}))
        .await;
    driver.tell("changed").await;
    let diff = until(driver, "ok diff").await;
    assert_eq!(
        diff.split_whitespace().collect::<Vec<_>>(),
        ["notes/readme.txt"],
        "the console's diff against now lists the changed file alone"
    );
    until(driver, "ok checkpoint-restored").await;
    let (status, read) = server.read_file(sid, readme).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(
        read["contentBase64"].as_str(),
        Some(harness::b64("written through the API\n").as_str()),
        "the restore brought back the content at the checkpoint: {read}"
    );
    let ended = server.wait_command(sid, &sleeper).await;
    assert_ne!(
        ended["exitCode"], 0,
        "the second confirmation ended the running command: {ended}"
    );
}

/// Only keys (clients/ui-browser/drive.py, `keyboard`): signed in, every
/// control of each page reached by Tab with its focus shown, a terminal
/// keeping Tab and left by Shift+Tab, the sandbox opened from the list,
/// its stop dialog kept focus and closed on Escape (the sandbox stays),
/// then stopped after confirming.
#[tokio::test]
async fn keyboard_alone_reaches_every_control_and_stops_a_sandbox() {
    let server = server().await;
    // Something on every tab: a file, commands, a port, a checkpoint.
    let (sid, _) = sandbox_to_show(&server).await;
    let (status, taken) = server
        .post(
            &format!("/v1/sandboxes/{sid}/checkpoints"),
            json!({"label": "kept"}),
        )
        .await;
    assert_eq!(status, 201, "{taken}");

    let mut driver = drive(&server, "keyboard", &[&sid]);
    // Each page's controls all reached, in this order, and a terminal
    // left with Shift+Tab (Tab itself typed into the shell).
    for step in [
        "ok reachable signin ",
        "ok reachable sandboxes ",
        "ok reachable commands ",
        "ok reachable files ",
        "ok reachable terminal ",
        "ok reachable ports ",
        "ok reachable checkpoints ",
        "ok terminal-left",
        "ok reachable status ",
    ] {
        until(&mut driver, step).await;
    }
    until(&mut driver, "ok escaped").await;
    let (status, still) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(status, 200, "Escape stopped nothing: {still}");
    driver.tell("still there").await;
    until(&mut driver, "ok stopped").await;
    let (status, gone) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(status, 404, "stopped with keys alone: {gone}");
    finish(driver).await;
}

/// The main scenario's core in Debian's Firefox ESR (geckodriver):
/// refused, then signed in; the sandbox listed; a finished command's
/// output and a running one's live; `echo hello-from-ui` answered in a
/// terminal, and again after attaching anew; a file viewed; and every
/// request to the console's own origin (the page's resource timing).
#[tokio::test]
async fn firefox_shows_the_log_terminal_and_files() {
    let server = server().await;
    let (sid, ticker) = sandbox_to_show(&server).await;
    let gecko = geckodriver();
    let gecko = gecko.to_str().expect("a UTF-8 path");
    let mut driver = drive(&server, "firefox", &[gecko, &sid, &ticker]);
    for step in [
        "ok refused",
        "ok signed-in",
        "ok listed",
        "ok live-log",
        "ok terminal",
        "ok file-viewed",
    ] {
        until(&mut driver, step).await;
    }
    let browser = until(&mut driver, "ok browser").await;
    assert!(browser.starts_with("firefox "), "{browser}");
    let (requests, _) = finish(driver).await;
    let own = origin_of(&server.base);
    assert!(
        requests.iter().any(|r| r.contains("/v1/sandboxes")),
        "the resource timing was read: {requests:?}"
    );
    for r in &requests {
        let url = r.split_once(' ').map_or(r.as_str(), |(_, u)| u);
        assert_eq!(origin_of(url), own, "a request to another origin: {url}");
    }
}

#[tokio::test]
async fn smoke_signs_in() {
    let server = server().await;
    let driver = drive(&server, "smoke", &[]);
    let (requests, console) = finish(driver).await;
    assert!(
        requests.iter().all(|r| r
            .split_once(' ')
            .is_some_and(|(_, u)| origin_of(u) == origin_of(&server.base))),
        "{requests:?}"
    );
    assert!(
        !console
            .iter()
            .any(|m| m.contains("Content Security Policy")),
        "{console:?}"
    );
}
