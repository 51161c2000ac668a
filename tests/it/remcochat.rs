//! RemcoChat's client, as it is, against sandboxd's defaults.
//!
//! RemcoChat's `docker-sandbox-client.ts` sends `content-type:
//! application/json` on every request, the bodies below and nothing else,
//! and hard-codes `/vercel/sandbox/workspace` in its tools. A sandboxd
//! started with no workspace setting at all must serve one whole chat turn
//! of it: create, a seed upload, its `bash -lc` commands read through their
//! log stream and `wait`, a kill, `readFile`, a preview URL, stop. The
//! second test checks that the second spelling of the workspace opens no
//! way out of it.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, b64, eventually};

/// The workspace path RemcoChat's tools use.
const REMCO_WS: &str = "/vercel/sandbox/workspace";
/// The timeout RemcoChat asks for; above sandboxd's maximum.
const REMCO_TIMEOUT_MS: u64 = 3_600_000;
/// sandboxd's default `max_timeout_ms`.
const MAX_TIMEOUT_MS: u64 = 1_800_000;

/// RemcoChat's client: every request with `content-type:
/// application/json` and no other header.
#[derive(Clone)]
struct Remco {
    base: String,
    http: reqwest::Client,
}

/// A command as RemcoChat starts it: its id and the answer's `timeoutMs`.
struct Started {
    cid: String,
    timeout_ms: u64,
}

impl Remco {
    fn new(server: &TestServer) -> Self {
        Remco {
            base: server.base.clone(),
            http: reqwest::Client::new(),
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("content-type", "application/json")
    }

    async fn parts(resp: reqwest::Response) -> (u16, Value) {
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .request(reqwest::Method::POST, path)
            .body(body.to_string())
            .send()
            .await
            .expect("request");
        Self::parts(resp).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("request");
        Self::parts(resp).await
    }

    /// RemcoChat's bash tool: `bash -lc SCRIPT`, detached.
    async fn bash(&self, sid: &str, script: &str) -> Started {
        let (s, v) = self
            .post(
                &format!("/v1/sandboxes/{sid}/commands"),
                json!({"cmd": "bash", "args": ["-lc", script], "timeoutMs": REMCO_TIMEOUT_MS, "detached": true}),
            )
            .await;
        assert_eq!(s, 200, "starting {script:?}: {v}");
        Started {
            cid: v["commandId"].as_str().expect("commandId").to_string(),
            timeout_ms: v["timeoutMs"].as_u64().expect("timeoutMs in the answer"),
        }
    }

    /// Reads a command's NDJSON log stream to its end, as RemcoChat does:
    /// stdout and stderr `data` in order, the other records skipped. The
    /// stream must end within `within` (a tool call that never returns is
    /// a hung chat turn). Also returns the last record, for the test's own
    /// checks (RemcoChat ignores it).
    async fn output(&self, sid: &str, cid: &str, within: Duration) -> (String, Value) {
        let resp = self
            .request(
                reqwest::Method::GET,
                &format!("/v1/sandboxes/{sid}/commands/{cid}/logs"),
            )
            .send()
            .await
            .expect("logs");
        assert_eq!(resp.status(), 200, "logs of {cid}");
        let body = tokio::time::timeout(within, resp.text())
            .await
            .unwrap_or_else(|_| panic!("the log stream of {cid} did not end within {within:?}"))
            .expect("log body");
        let mut text = String::new();
        let mut last = Value::Null;
        for line in body.lines() {
            let rec: Value = serde_json::from_str(line).expect("an NDJSON line");
            if rec["stream"] == "stdout" || rec["stream"] == "stderr" {
                text.push_str(rec["data"].as_str().expect("data"));
            }
            last = rec;
        }
        (text, last)
    }

    async fn wait(&self, sid: &str, cid: &str) -> Value {
        let (s, v) = self
            .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
            .await;
        assert_eq!(s, 200, "wait {cid}: {v}");
        v
    }

    /// One bash tool call: start, read the log to its end, wait. Asserts
    /// exit code 0; returns the output.
    async fn turn(&self, sid: &str, script: &str) -> String {
        let started = self.bash(sid, script).await;
        let (out, last) = self
            .output(sid, &started.cid, Duration::from_secs(60))
            .await;
        assert_eq!(
            last["stream"], "exit",
            "{script:?}: the stream ends with exit"
        );
        let w = self.wait(sid, &started.cid).await;
        assert_eq!(w["exitCode"], 0, "{script:?}: {w}\n{out}");
        out
    }

    /// RemcoChat's readFile: the content, decoded.
    async fn read(&self, sid: &str, path: &str) -> Option<Vec<u8>> {
        let (s, v) = self
            .get(&format!(
                "/v1/sandboxes/{sid}/files:read?path={}",
                query_encode(path)
            ))
            .await;
        assert_eq!(s, 200, "read {path}: {v}");
        if v["found"] == false {
            return None;
        }
        assert_eq!(v["found"], true, "read {path}: {v}");
        Some(
            base64::engine::general_purpose::STANDARD
                .decode(v["contentBase64"].as_str().expect("contentBase64"))
                .expect("base64"),
        )
    }
}

/// `encodeURIComponent`, as RemcoChat's client encodes the path.
fn query_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'-'
            | b'_'
            | b'.'
            | b'!'
            | b'~'
            | b'*'
            | b'\''
            | b'('
            | b')' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    getrandom::fill(&mut v).expect("random");
    v
}

/// The seed of a chat: 60 files in nested directories, some binary; paths
/// relative to the workspace.
fn seed(tag: &str) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        (
            "package.json".to_string(),
            format!("{{\n  \"name\": \"seed-{tag}\",\n  \"version\": \"1.0.0\"\n}}\n").into_bytes(),
        ),
        ("README.md".to_string(), b"# Seeded project\n".to_vec()),
        (
            "src/index.js".to_string(),
            b"console.log('index');\n".to_vec(),
        ),
        ("data/blob.bin".to_string(), random_bytes(256 * 1024)),
    ];
    for i in 0..20 {
        files.push((
            format!("src/lib/util{i}.js"),
            format!("export const u{i} = {i};\n").into_bytes(),
        ));
    }
    for i in 0..15 {
        files.push((
            format!("src/components/deep/nested/c{i}.tsx"),
            format!("export const C{i} = () => null; // {tag}\n").into_bytes(),
        ));
    }
    for i in 0..10 {
        files.push((format!("public/img{i}.png"), random_bytes(1000 + i * 777)));
    }
    for i in 0..11 {
        files.push((
            format!("docs/page{i}.md"),
            format!("page {i}\n").into_bytes(),
        ));
    }
    assert_eq!(files.len(), 60);
    files
}

/// Sorted names of an `ls` listing.
fn names(listing: &str) -> Vec<&str> {
    let mut v: Vec<&str> = listing.lines().filter(|l| !l.is_empty()).collect();
    v.sort_unstable();
    v
}

#[tokio::test]
async fn remcochat_chat_turn_runs_unchanged_against_the_defaults() {
    // No workspace variable: sandboxd's defaults, as issue 13 asks; the
    // warm pool and the link networks made ahead too (the harness turns
    // them down unless asked; "" counts as unset). RemcoChat's runtime,
    // node24, shares the default runtime's image, so its create claims a
    // member.
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_POOL_SIZE", "")
            .env("SANDBOXD_LINKS_AHEAD", ""),
    )
    .await;
    crate::pool::wait_for_members(&server, "default", 2).await;
    let remco = Remco::new(&server);
    let chat = format!("remcochat:{}", crate::harness::unique_instance());

    // Create.
    let (s, v) = remco
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": chat, "runtime": "node24", "idleTtlMs": 900000, "resources": {"vcpus": 1, "memoryMb": 1024}, "network": {"mode": "default"}, "ports": [3000]}),
        )
        .await;
    assert_eq!(s, 200, "create: {v}");
    assert_eq!(v["created"], true, "{v}");
    let sid = v["sandboxId"].as_str().expect("sandboxId").to_string();
    assert!(
        sid.len() == 24 && sid.bytes().all(|b| b.is_ascii_hexdigit()),
        "{sid}"
    );
    assert!(crate::pool::from_pool(&server, &sid), "a claim");

    // Seed upload: one files:write with every file, under RemcoChat's path.
    let files = seed(&sid);
    let body: Vec<Value> = files
        .iter()
        .map(|(p, c)| json!({"path": format!("{REMCO_WS}/{p}"), "contentBase64": b64(c)}))
        .collect();
    let (s, v) = remco
        .post(
            &format!("/v1/sandboxes/{sid}/files:write"),
            json!({"files": body}),
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok": true})), "seed upload");

    // The first command, as RemcoChat sends it: the timeout is capped.
    let started = remco
        .bash(
            &sid,
            "cd \"/vercel/sandbox/workspace\" && ls -R | head -50 && cat package.json",
        )
        .await;
    assert_eq!(
        started.timeout_ms, MAX_TIMEOUT_MS,
        "timeoutMs {REMCO_TIMEOUT_MS} is capped to the maximum"
    );
    let (out, last) = remco
        .output(&sid, &started.cid, Duration::from_secs(60))
        .await;
    for name in [
        ".:",
        "package.json",
        "README.md",
        "blob.bin",
        "page10.md",
        "img9.png",
        "./src/components/deep/nested:",
    ] {
        assert!(
            out.lines().any(|l| l == name),
            "{name} is not in the listing:\n{out}"
        );
    }
    assert!(
        out.ends_with(std::str::from_utf8(&files[0].1).expect("package.json")),
        "package.json's content is printed:\n{out}"
    );
    assert_eq!(last["stream"], "exit", "{last}");
    let w = remco.wait(&sid, &started.cid).await;
    assert_eq!(w["exitCode"], 0, "{w}");
    assert_eq!(
        (w["timedOut"].clone(), w["killed"].clone()),
        (json!(false), json!(false))
    );
    // The list carries the effective timeout too.
    let (s, list) = remco.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert_eq!(s, 200);
    let entry = list["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .find(|c| c["commandId"] == json!(started.cid))
        .expect("the command is listed")
        .clone();
    assert_eq!(entry["timeoutMs"], json!(MAX_TIMEOUT_MS), "{entry}");
    // So does commands:run (sandboxd's own route; RemcoChat does not use it).
    let (s, run) = remco
        .post(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            json!({"cmd": "bash", "args": ["-lc", "true"], "timeoutMs": REMCO_TIMEOUT_MS}),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["timeoutMs"], json!(MAX_TIMEOUT_MS), "{run}");

    // Every seeded file arrived byte for byte (read back the way RemcoChat
    // reads: its own path).
    for (p, content) in &files {
        let back = remco
            .read(&sid, &format!("{REMCO_WS}/{p}"))
            .await
            .unwrap_or_else(|| panic!("{p} was not found"));
        assert!(
            back == *content,
            "{p}: {} bytes back for {}",
            back.len(),
            content.len()
        );
    }

    // Both spellings list the same files; answers use /workspace.
    let via_alias = remco
        .turn(&sid, "cd \"/vercel/sandbox/workspace\" && ls")
        .await;
    let via_canonical = remco.turn(&sid, "cd \"/workspace\" && ls").await;
    assert_eq!(
        names(&via_alias),
        vec!["README.md", "data", "docs", "package.json", "public", "src"],
        "{via_alias}"
    );
    assert_eq!(names(&via_alias), names(&via_canonical));
    assert_eq!(remco.turn(&sid, "pwd").await, "/workspace\n");

    // A kill of a command that ignores SIGTERM: answered at once, then 137.
    let marker = format!("{REMCO_WS}/.term-ignored");
    let stubborn = remco
        .bash(&sid, &format!("trap '' TERM; touch {marker}; sleep 600"))
        .await;
    // RemcoChat streams the log while the command runs.
    let logs = {
        let (remco, sid, cid) = (remco.clone(), sid.clone(), stubborn.cid.clone());
        tokio::spawn(async move { remco.output(&sid, &cid, Duration::from_secs(60)).await })
    };
    eventually(
        Duration::from_secs(20),
        "the SIGTERM-ignoring command set its trap",
        || async { remco.read(&sid, &marker).await.is_some() },
    )
    .await;
    let (s, list) = remco.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert_eq!(s, 200);
    assert!(
        list["commands"]
            .as_array()
            .expect("commands")
            .iter()
            .any(|c| c["commandId"] == json!(stubborn.cid) && c["state"] == "running"),
        "{list}"
    );
    let t = Instant::now();
    let (s, v) = remco
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{}:kill", stubborn.cid),
            json!({}),
        )
        .await;
    let kill_took = t.elapsed();
    assert_eq!((s, v), (200, json!({"ok": true})), "kill");
    eprintln!("kill answered in {kill_took:?}");
    assert!(
        kill_took <= Duration::from_millis(100),
        ":kill must answer once SIGTERM is on its way, not after the grace period; took {kill_took:?}"
    );
    let w = remco.wait(&sid, &stubborn.cid).await;
    assert_eq!(
        (
            w["exitCode"].clone(),
            w["killed"].clone(),
            w["timedOut"].clone()
        ),
        (json!(137), json!(true), json!(false)),
        "{w}"
    );
    let (_, last) = logs.await.expect("the log reader");
    assert_eq!(last["stream"], "exit", "{last}");
    assert_eq!(last["exitCode"], 137, "{last}");

    // readFile by every spelling.
    let expected = files
        .iter()
        .find(|(p, _)| p == "src/lib/util7.js")
        .expect("seeded")
        .1
        .clone();
    for path in [
        "/vercel/sandbox/workspace/src/lib/util7.js",
        "/workspace/src/lib/util7.js",
        "src/lib/util7.js",
    ] {
        let (s, v) = remco
            .get(&format!(
                "/v1/sandboxes/{sid}/files:read?path={}",
                query_encode(path)
            ))
            .await;
        assert_eq!(
            (s, v),
            (
                200,
                json!({"found": true, "contentBase64": b64(&expected), "sha256": harness::sha256_hex(&expected)})
            ),
            "{path}"
        );
    }

    // The preview URL.
    let (s, v) = remco.get(&format!("/v1/sandboxes/{sid}/ports/3000")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["found"], true, "{v}");
    let host_port = v["hostPort"].as_u64().expect("hostPort");
    let url = v["url"].as_str().expect("url").to_string();
    assert_eq!(url, format!("http://127.0.0.1:{host_port}"));
    // A server started in the background the way a model writes it: its
    // output left on the command's pipes. The command still ends, and its
    // log stream with it.
    let out = remco
        .turn(
            &sid,
            "cd \"/vercel/sandbox/workspace\" && python3 -m http.server 3000 --bind 0.0.0.0 &",
        )
        .await;
    eprintln!("the server's command printed {out:?}");
    let fetcher = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let fetch = |path: String| {
        let fetcher = fetcher.clone();
        let url = url.clone();
        async move {
            let resp = fetcher.get(format!("{url}/{path}")).send().await.ok()?;
            let status = resp.status().as_u16();
            Some((status, resp.bytes().await.ok()?.to_vec()))
        }
    };
    eventually(
        Duration::from_secs(30),
        "the preview server serves package.json through the URL",
        || async {
            fetch("package.json".into())
                .await
                .is_some_and(|(s, body)| s == 200 && body == files[0].1)
        },
    )
    .await;
    // It keeps serving while it writes far more to stderr than a pipe
    // holds (each 404 logs its 4 KiB request line).
    let long = "n".repeat(4000);
    for i in 0..40 {
        let (s, _) = fetch(format!("{long}{i}"))
            .await
            .unwrap_or_else(|| panic!("request {i} with a long path got no answer"));
        assert_eq!(s, 404, "request {i}");
    }
    let img = files
        .iter()
        .find(|(p, _)| p == "public/img3.png")
        .expect("seeded");
    let got = fetch(img.0.clone()).await.expect("an answer");
    assert_eq!(got.0, 200);
    assert!(got.1 == img.1, "the binary file is served exactly");

    // Stop: nothing of the sandbox is left (the pool's members stay).
    let (s, v) = remco
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!({}))
        .await;
    assert_eq!((s, v), (200, json!({"ok": true})), "stop");
    let left: Vec<_> = server
        .containers()
        .await
        .into_iter()
        .filter_map(|c| c.labels)
        .filter(|l| l.get("sandboxd.sandbox_id") == Some(&sid))
        .collect();
    assert!(left.is_empty(), "containers left after stop: {left:?}");
    // Volumes go right after the answer, in the background.
    eventually(
        Duration::from_secs(20),
        "no volume left after stop",
        || async { !server.volumes().await.iter().any(|v| v.name.contains(&sid)) },
    )
    .await;
    assert!(
        fetch("package.json".into()).await.is_none(),
        "the URL is dead after stop"
    );
}

#[tokio::test]
async fn remcochat_workspace_alias_opens_no_way_out() {
    let server = TestServer::start().await;
    let remco = Remco::new(&server);
    let (s, v) = remco
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": format!("remcochat:{}", crate::harness::unique_instance()), "network": {"mode": "none"}}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let sid = v["sandboxId"].as_str().expect("sandboxId").to_string();
    remco
        .turn(
            &sid,
            "cd \"/vercel/sandbox/workspace\" && mkdir -p real && echo inside > real/f \
             && ln -s /vercel/sandbox/workspace/real link \
             && ln -s /workspace/real link2 \
             && ln -s /vercel/sandbox/workspace/real/f flink \
             && ln -s /vercel/sandbox up \
             && ln -s /vercel/sandbox/workspace/../.. upup \
             && ln -s /vercel/sandbox/workspace/.. upone",
        )
        .await;

    // Absolute targets under either spelling are inside: followed.
    for path in [
        "link/f",
        "link2/f",
        "flink",
        "/vercel/sandbox/workspace/link/f",
        "/workspace/link2/f",
        "/vercel/sandbox/workspace/flink",
    ] {
        assert_eq!(
            remco.read(&sid, path).await.as_deref(),
            Some(&b"inside\n"[..]),
            "{path}"
        );
    }
    let (s, v) = remco
        .post(
            &format!("/v1/sandboxes/{sid}/files:write"),
            json!({"files": [{"path": "/vercel/sandbox/workspace/link2/g", "contentBase64": b64(b"through link2")}]}),
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok": true})));
    assert_eq!(
        remco.read(&sid, "real/g").await.as_deref(),
        Some(&b"through link2"[..])
    );

    // The alias's parent, or a climb out of it, is outside: refused.
    for path in [
        "up",
        "up/workspace/real/f",
        "upup/etc/passwd",
        "upup",
        "upone/workspace/real/f",
        "/vercel/sandbox/workspace/up/workspace/real/f",
        "/workspace/upup/etc/hostname",
    ] {
        let (s, v) = remco
            .get(&format!(
                "/v1/sandboxes/{sid}/files:read?path={}",
                query_encode(path)
            ))
            .await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("symlink_escape")),
            "read {path}: {v}"
        );
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
    for path in ["up/workspace/evil", "upup/tmp/evil", "upone/evil"] {
        let (s, v) = remco
            .post(
                &format!("/v1/sandboxes/{sid}/files:write"),
                json!({"files": [{"path": path, "contentBase64": b64(b"evil")}]}),
            )
            .await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("symlink_escape")),
            "write {path}: {v}"
        );
    }
    let leaked = remco
        .turn(
            &sid,
            "ls /vercel/sandbox/workspace/evil /vercel/sandbox/evil /tmp/evil 2>/dev/null | wc -l",
        )
        .await;
    assert_eq!(
        leaked, "0\n",
        "nothing was written through an escaping link"
    );

    // Lexically outside: 400 invalid_request, before any symlink is looked at.
    for path in [
        "/vercel/sandbox/workspace/../etc/passwd",
        "/vercel/sandbox/workspacex/a",
        "/vercel/sandbox",
        "/vercel/sandbox/workspac",
    ] {
        let (s, v) = remco
            .get(&format!(
                "/v1/sandboxes/{sid}/files:read?path={}",
                query_encode(path)
            ))
            .await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("invalid_request")),
            "read {path}: {v}"
        );
        let (s, v) = remco
            .post(
                &format!("/v1/sandboxes/{sid}/files:write"),
                json!({"files": [{"path": path, "contentBase64": b64(b"x")}]}),
            )
            .await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("invalid_request")),
            "write {path}: {v}"
        );
    }

    // A cwd under the alias runs in the canonical directory (made if missing).
    let (s, v) = remco
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"cmd": "bash", "args": ["-lc", "pwd && /bin/pwd -P"], "cwd": "/vercel/sandbox/workspace/sub", "timeoutMs": 30000, "detached": true}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let cid = v["commandId"].as_str().expect("commandId").to_string();
    let (out, _) = remco.output(&sid, &cid, Duration::from_secs(30)).await;
    assert_eq!(out, "/workspace/sub\n/workspace/sub\n");
    assert_eq!(remco.wait(&sid, &cid).await["exitCode"], 0);
    let (s, v) = remco
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"cmd": "bash", "args": ["-lc", "pwd"], "cwd": "/vercel/sandbox/workspace/../etc", "timeoutMs": 30000, "detached": true}),
        )
        .await;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
}
