//! The files API: binary-exact round trips, ownership and modes, every
//! refused path form, every symlink escape (and proof that nothing outside
//! the workspace changed), the symlink-swap race, all-or-nothing writes,
//! list, delete, limits and special files; editing (hashes, preconditions,
//! line ranges), stat, and search with rg and with the built-in search.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, b64, sha256_hex};

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    getrandom::fill(&mut v).expect("random");
    v
}

/// The agent gets a write's content in pieces of 256 KiB: sizes around
/// that, in one write, each come back exactly.
#[tokio::test]
async fn one_write_of_files_around_the_piece_size_round_trips_each() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let piece = 256 * 1024;
    let sizes = [0, 1, piece - 1, piece, piece + 1, 4 * piece + 3];
    let files: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .map(|&n| (format!("pieces/{n}.bin"), random_bytes(n)))
        .collect();
    let body: Vec<_> = files
        .iter()
        .map(|(path, data)| json!({"path": path, "contentBase64": b64(data)}))
        .collect();
    let (s, v) = server.write_files(&sid, json!(body)).await;
    assert_eq!((s, v), (200, json!({"ok": true})));
    for (path, data) in &files {
        let (s, v) = server.read_file(&sid, path).await;
        assert_eq!((s, &v["found"]), (200, &json!(true)), "{path}");
        let back = base64::engine::general_purpose::STANDARD
            .decode(v["contentBase64"].as_str().expect("content"))
            .expect("base64");
        assert!(back == *data, "{path}: {} bytes came back", back.len());
    }
}

#[tokio::test]
async fn binary_round_trips_are_exact() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    for (name, size) in [
        ("empty.bin", 0usize),
        ("one.bin", 1),
        ("big.bin", 4 * 1024 * 1024),
    ] {
        let data = random_bytes(size);
        let (s, v) = server
            .write_files(
                &sid,
                json!([{"path": format!("/workspace/dir/{name}"), "contentBase64": b64(&data)}]),
            )
            .await;
        assert_eq!((s, v), (200, json!({"ok": true})), "{name}");
        let (s, v) = server.read_file(&sid, &format!("dir/{name}")).await;
        assert_eq!(s, 200);
        assert_eq!(v["found"], true);
        let back = base64::engine::general_purpose::STANDARD
            .decode(v["contentBase64"].as_str().expect("content"))
            .expect("base64");
        assert!(
            back == data,
            "{name}: {} bytes came back for {size}",
            back.len()
        );
    }
    let (s, v) = server.read_file(&sid, "dir/missing.bin").await;
    assert_eq!((s, v), (200, json!({"found": false})));
    // Ownership and modes as the sandbox sees them.
    let (s, _) = server.write_files(&sid, json!([{"path": "modes/default", "contentBase64": ""}, {"path": "modes/exec", "contentBase64": "", "mode": 0o755}, {"path": "modes/private", "contentBase64": "", "mode": 0o600}])).await;
    assert_eq!(s, 200);
    let st = server
        .sh(&sid, "stat -c '%n %U %a' modes/* modes dir/big.bin")
        .await;
    assert_eq!(
        st["stdout"],
        "modes/default sandbox 644\nmodes/exec sandbox 755\nmodes/private sandbox 600\nmodes sandbox 755\ndir/big.bin sandbox 644\n"
    );
    // Overwriting replaces the content.
    server
        .write_files(
            &sid,
            json!([{"path": "dir/one.bin", "contentBase64": b64(b"new")}]),
        )
        .await;
    assert_eq!(
        server.read_file(&sid, "dir/one.bin").await.1["contentBase64"],
        b64(b"new")
    );
    // Names with dots are names; repeated slashes and "." normalise.
    for name in ["a..b.txt", ".env", "...", "x/./y//z.txt"] {
        let (s, v) = server
            .write_files(
                &sid,
                json!([{"path": name, "contentBase64": b64(name.as_bytes())}]),
            )
            .await;
        assert_eq!(s, 200, "{name}: {v}");
    }
    assert_eq!(
        server.read_file(&sid, "/workspace//x/y/z.txt").await.1["found"],
        true
    );
    assert_eq!(server.sh(&sid, "cat ...").await["stdout"], "...");
}

#[tokio::test]
async fn refused_path_forms_are_400() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let long = "a/".repeat(2100);
    let long_component = "n".repeat(256);
    for bad in [
        "",
        "a/../b",
        "..",
        "/etc/passwd",
        "/workspacex/a",
        "/",
        "a\u{0}b",
        long.as_str(),
        long_component.as_str(),
        "/workspace/../etc",
    ] {
        let (s, v) = server
            .write_files(&sid, json!([{"path": bad, "contentBase64": "aGk="}]))
            .await;
        assert_eq!(s, 400, "write {bad:?}: {v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()));
        let (s, v) = server.read_file(&sid, bad).await;
        assert_eq!(s, 400, "read {bad:?}: {v}");
    }
    let (s, v) = server.get(&format!("/v1/sandboxes/{sid}/files:read")).await;
    assert_eq!(s, 400, "path is required: {v}");
    // Nothing was written anywhere.
    assert_eq!(
        server.sh(&sid, "ls -A /workspace | wc -l").await["stdout"],
        "0\n"
    );
}

/// Paths whose content or existence outside the workspace must not change.
async fn changes_outside_workspace(server: &TestServer, sid: &str) -> Vec<String> {
    let changes = server
        .docker
        .container_changes(&server.container_name(sid))
        .await
        .expect("docker diff")
        .unwrap_or_default();
    changes
        .into_iter()
        .map(|c| c.path)
        .filter(|p| {
            !(p == "/workspace"
                || p.starts_with("/workspace/")
                || p == "/tmp"
                || p.starts_with("/tmp/"))
        })
        // The engine's own init, mounted because Init is on (/sbin is /usr/sbin),
        // the mount point of the agent's volume, and the one of the
        // workspace's E2B spelling, which the image does not make (so its
        // parent changes too).
        .filter(|p| {
            ![
                "/usr",
                "/usr/sbin",
                "/usr/sbin/docker-init",
                "/.sandboxd",
                "/home",
                "/home/user",
            ]
            .contains(&p.as_str())
        })
        .collect()
}

#[tokio::test]
async fn no_symlink_leads_out_of_the_workspace() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let r = server.sh(&sid, "ln -s /etc l && ln -s ../.. up && ln -s / root && ln -s /etc/passwd p && ln -s /tmp t && mkdir -p real/sub && echo in > real/sub/f && ln -s real inside && ln -s /workspace/real abs_inside && ln -s real/sub/f file_link && echo secret > /tmp/outside").await;
    assert_eq!(r["exitCode"], 0, "{r}");

    let refused = |what: &str, s: u16, v: &Value| {
        assert!((400..500).contains(&s), "{what} must be refused: {s} {v}");
        assert_eq!(v["code"], "symlink_escape", "{what}: {v}");
    };
    for p in [
        "l/hostname",
        "root/etc/hostname",
        "p",
        "up/etc/hostname",
        "t/outside",
    ] {
        let (s, v) = server.read_file(&sid, p).await;
        refused(&format!("read {p}"), s, &v);
    }
    for p in ["l/evil", "p", "t/evil", "up/evil", "root/tmp/evil"] {
        let (s, v) = server
            .write_files(&sid, json!([{"path": p, "contentBase64": b64(b"pwned")}]))
            .await;
        refused(&format!("write {p}"), s, &v);
    }
    for p in ["root", "l", "t", "up"] {
        let (s, v) = server
            .get(&format!("/v1/sandboxes/{sid}/files:list?path={p}"))
            .await;
        refused(&format!("list {p}"), s, &v);
    }
    for p in ["up/x", "l/hostname", "t/outside"] {
        let (s, v) = server
            .post(
                &format!("/v1/sandboxes/{sid}/files:delete"),
                json!({"paths": [p]}),
            )
            .await;
        refused(&format!("delete {p}"), s, &v);
    }
    // Nothing outside changed: /tmp/outside intact, no /etc/evil, no diff.
    assert_eq!(
        server
            .sh(
                &sid,
                "cat /tmp/outside; ls /etc/evil /tmp/evil 2>&1 | wc -l"
            )
            .await["stdout"],
        "secret\n2\n"
    );
    assert_eq!(
        changes_outside_workspace(&server, &sid).await,
        Vec::<String>::new()
    );

    // Symlinks that stay inside work normally; deleting a link removes the link.
    assert_eq!(
        server.read_file(&sid, "inside/sub/f").await.1["contentBase64"],
        b64(b"in\n")
    );
    assert_eq!(
        server.read_file(&sid, "abs_inside/sub/f").await.1["contentBase64"],
        b64(b"in\n")
    );
    assert_eq!(
        server.read_file(&sid, "file_link").await.1["contentBase64"],
        b64(b"in\n")
    );
    let (s, _) = server
        .write_files(
            &sid,
            json!([{"path": "inside/sub/g", "contentBase64": b64(b"via link")}]),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        server.sh(&sid, "cat real/sub/g").await["stdout"],
        "via link"
    );
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/files:list?path=/workspace"))
        .await;
    assert_eq!(s, 200);
    let entries = v["entries"].as_array().expect("entries");
    let l = entries.iter().find(|e| e["name"] == "l").expect("l listed");
    assert_eq!(l["type"], "symlink", "listed as a symlink, not followed");
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "sorted by name");
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/files:delete"),
            json!({"paths": ["l", "p"]}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        server
            .sh(&sid, "test -e /etc/passwd && test ! -L l && echo ok")
            .await["stdout"],
        "ok\n"
    );
}

/// `d` flips between a real directory and a symlink to /tmp/target
/// (outside the workspace) while writes to `d/x.txt` keep coming. Each
/// write lands in the directory, or is refused as exactly one of two
/// things: `400 symlink_escape` (it met the symlink) or `409 path_changed`
/// (the swap came between the walk's check and its open); any other
/// answer fails the test. The race is shown to have run, not assumed: the
/// swapper counts its swaps, and the answers must flip between landed and
/// refused many times, each flip a swap that came between two requests.
#[tokio::test]
async fn swapping_a_directory_for_a_symlink_mid_write_never_escapes() {
    // Enough flips that the requests met the swapper over and over, and
    // enough requests that an answer that comes one time in a hundred
    // shows up too.
    const MIN_FLIPS: u32 = 20;
    const MIN_REQUESTS: u32 = 300;
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // Until the test writes `stop`; then it says how many swaps it made.
    let swapper = server
        .start_command(
            &sid,
            json!({"command": "mkdir -p /tmp/target; n=0; while [ ! -e stop ]; do rm -rf d; mkdir d; rm -rf d; ln -s /tmp/target d; n=$((n+1)); done; echo \"swaps $n\"", "timeoutMs": 120000}),
        )
        .await;
    let (mut landed, mut escape, mut changed, mut flips, mut requests) =
        (0u32, 0u32, 0u32, 0u32, 0u32);
    // Whether the last answer was a refusal, for counting flips.
    let mut last_refused: Option<bool> = None;
    // Any other answer: status and code, how many, the first seen.
    let mut unexpected: std::collections::BTreeMap<String, (u32, Value)> = Default::default();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60)
        && (flips < MIN_FLIPS || requests < MIN_REQUESTS)
    {
        requests += 1;
        let (s, v) = server
            .write_files(
                &sid,
                json!([{"path": "d/x.txt", "contentBase64": b64(b"race")}]),
            )
            .await;
        let refused = match (s, v["code"].as_str()) {
            (200, _) if v == json!({"ok": true}) => {
                landed += 1;
                false
            }
            (400, Some("symlink_escape")) => {
                escape += 1;
                true
            }
            (409, Some("path_changed")) => {
                changed += 1;
                true
            }
            (s, code) => {
                let key = format!("{s} {}", code.unwrap_or("-"));
                unexpected.entry(key).or_insert((0, v)).0 += 1;
                continue;
            }
        };
        if last_refused.is_some_and(|r| r != refused) {
            flips += 1;
        }
        last_refused = Some(refused);
    }
    let took = started.elapsed();
    let (s, v) = server
        .write_files(&sid, json!([{"path": "stop", "contentBase64": ""}]))
        .await;
    assert_eq!(s, 200, "{v}");
    let w = server.wait_command(&sid, &swapper).await;
    assert_eq!(w["exitCode"], 0, "the swapper ran to its end: {w}");
    let out: String = server
        .log_records(&sid, &swapper, "")
        .await
        .iter()
        .filter(|r| r["stream"] == "stdout")
        .filter_map(|r| r["data"].as_str().map(str::to_string))
        .collect();
    let swaps: u32 = out
        .trim()
        .strip_prefix("swaps ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the swapper says how many swaps it made: {out:?}"));
    let stats = format!(
        "{swaps} swaps; {requests} writes in {took:?}: {landed} landed, {escape} symlink_escape, \
         {changed} path_changed, {flips} flips, other answers: {unexpected:?}"
    );
    eprintln!("swap race: {stats}");
    let leaked = server.sh(&sid, "ls -A /tmp/target | wc -l").await;
    assert_eq!(
        leaked["stdout"], "0\n",
        "a write escaped into /tmp/target: {stats}"
    );
    assert!(
        unexpected.is_empty(),
        "answers other than 200, 400 symlink_escape and 409 path_changed: {stats}"
    );
    assert!(
        flips >= MIN_FLIPS,
        "the writes did not meet the swapper: fewer than {MIN_FLIPS} flips between landed \
         and refused: {stats}"
    );
    assert!(swaps >= flips / 2, "a flip needs a swap: {stats}");
}

#[tokio::test]
async fn writes_are_all_or_nothing() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    for files in [
        json!([{"path": "new/a.txt", "contentBase64": "aGk="}, {"path": "new/b.txt", "contentBase64": "not base64!"}]),
        json!([{"path": "new/a.txt", "contentBase64": "aGk="}, {"path": "../b.txt", "contentBase64": "aGk="}]),
        json!([{"path": "new/a.txt", "contentBase64": "aGk="}, {"path": "new/b.txt", "contentBase64": "aGk=", "mode": 4096}]),
        json!([{"path": "new/a.txt", "contentBase64": "aGk="}, {"path": "/workspace/new/a.txt", "contentBase64": "aGk="}]),
        json!([{"path": "new/a.txt", "contentBase64": "aGk\n="}]),
        json!([]),
    ] {
        let (s, v) = server.write_files(&sid, files.clone()).await;
        assert_eq!(s, 400, "{files}: {v}");
    }
    // A failure inside the sandbox (the second target is a directory) also
    // leaves nothing: not the first file, not the directories made for it.
    server.sh(&sid, "mkdir -p isdir").await;
    let (s, v) = server.write_files(&sid, json!([{"path": "fresh/deep/a.txt", "contentBase64": "aGk="}, {"path": "isdir", "contentBase64": "aGk="}])).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(
        server.sh(&sid, "ls -A").await["stdout"],
        "isdir\n",
        "nothing half-written"
    );
}

#[tokio::test]
async fn list_and_delete() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    server.write_files(&sid, json!([{"path": "t/b.txt", "contentBase64": b64(b"bb")}, {"path": "t/a.txt", "contentBase64": b64(b"a")}, {"path": "t/sub/c", "contentBase64": ""}])).await;
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/files:list?path=t"))
        .await;
    assert_eq!(s, 200);
    let e = v["entries"].as_array().expect("entries");
    assert_eq!(e.len(), 3);
    assert_eq!(
        (
            e[0]["name"].clone(),
            e[0]["type"].clone(),
            e[0]["size"].clone(),
            e[0]["mode"].clone()
        ),
        (json!("a.txt"), json!("file"), json!(1), json!(420))
    );
    assert_eq!(
        (e[1]["name"].clone(), e[1]["size"].clone()),
        (json!("b.txt"), json!(2))
    );
    assert_eq!(
        (e[2]["name"].clone(), e[2]["type"].clone()),
        (json!("sub"), json!("dir"))
    );
    assert!(
        e[0]["mtimeMs"]
            .as_u64()
            .is_some_and(|m| m > 1_600_000_000_000)
    );
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/files:list?path=t/a.txt"))
        .await;
    assert_eq!((s, v["code"].clone()), (400, json!("not_a_directory")));
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/files:list?path=nope"))
        .await;
    assert_eq!((s, v["code"].clone()), (404, json!("file_not_found")));

    let del = |body: Value| {
        let server = &server;
        let sid = sid.clone();
        async move {
            server
                .post(&format!("/v1/sandboxes/{sid}/files:delete"), body)
                .await
        }
    };
    let (s, v) = del(json!({"paths": ["t/sub"]})).await;
    assert_eq!(
        (s, v["code"].clone()),
        (409, json!("needs_recursive")),
        "{v}"
    );
    let (s, _) = del(json!({"paths": ["/workspace"], "recursive": true})).await;
    assert_eq!(s, 400, "the workspace root is refused");
    let (s, _) = del(json!({"paths": ["."]})).await;
    assert_eq!(s, 400);
    let (s, v) = del(json!({"paths": ["t/a.txt", "t/missing"]})).await;
    assert_eq!((s, v), (200, json!({"ok": true})));
    let (s, _) = del(json!({"paths": ["t"], "recursive": true})).await;
    assert_eq!(s, 200);
    assert_eq!(server.sh(&sid, "ls -A").await["stdout"], "");
}

#[tokio::test]
async fn limits_and_special_files() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_MAX_FILE_BYTES", "1000")
            .env("SANDBOXD_MAX_BODY_BYTES", "100000"),
    )
    .await;
    let sid = server.offline_sandbox().await;
    server
        .sh(&sid, "head -c 1001 /dev/zero > big; mkfifo fifo")
        .await;
    let (s, v) = server.read_file(&sid, "big").await;
    assert_eq!(
        (s, v["code"].clone()),
        (413, json!("file_too_large")),
        "{v}"
    );
    assert!(
        v["error"].as_str().unwrap_or("").contains("1001"),
        "names the size: {v}"
    );
    let started = Instant::now();
    let (s, v) = server.read_file(&sid, "fifo").await;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("not_a_regular_file")),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no hang on a FIFO"
    );
    let (s, v) = server.read_file(&sid, "/workspace").await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "huge", "contentBase64": b64(vec![0u8; 90_000])}]),
        )
        .await;
    assert_eq!(
        (s, v["code"].clone()),
        (413, json!("body_too_large")),
        "{v}"
    );
    let (s, _) = server.read_file(&sid, "/dev/null").await;
    assert_eq!(s, 400);
    // A Unix socket is a special file too.
    server
        .sh(
            &sid,
            "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"",
        )
        .await;
    let (s, v) = server.read_file(&sid, "sock").await;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("not_a_regular_file")),
        "{v}"
    );
}

#[tokio::test]
async fn odd_names_and_an_agent_that_died() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // A name that is not UTF-8 is listed (lossily), not a 502.
    server.sh(&sid, "touch \"$(printf 'bad\\377name')\"").await;
    let (s, v) = server.get(&format!("/v1/sandboxes/{sid}/files:list")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["entries"][0]["name"], "bad\u{FFFD}name");
    // The agent is killed from inside the sandbox: the sandbox starts
    // again, its workspace kept, and files work as before.
    server
        .write_files(
            &sid,
            json!([{"path": "a.txt", "contentBase64": b64(b"one")}]),
        )
        .await;
    let killed = server
        .sh(&sid, "pkill -KILL -f '^/.sandboxd/sandboxd-agent serve'")
        .await;
    assert_eq!(
        killed["exitCode"], 137,
        "its command went with it: {killed}"
    );
    let (s, v) = server.read_file(&sid, "a.txt").await;
    assert_eq!((s, v["contentBase64"].clone()), (200, json!(b64(b"one"))));
}

/// The `path` of every match, with its line.
fn match_lines(v: &Value) -> Vec<(String, u64)> {
    v["matches"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|m| {
                    (
                        m["path"].as_str().unwrap_or_default().to_string(),
                        m["line"].as_u64().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_edit_flow_refuses_stale_writes_whole() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let (s, _) = server
        .write_files(
            &sid,
            json!([{"path": "a.txt", "contentBase64": b64(b"one\n")}, {"path": "b.txt", "contentBase64": b64(b"bee\n")}]),
        )
        .await;
    assert_eq!(s, 200);
    // Read: the hash of the content.
    let (_, a) = server.read_file(&sid, "a.txt").await;
    let (_, b) = server.read_file(&sid, "b.txt").await;
    assert_eq!(a["sha256"], sha256_hex(b"one\n"));
    let (a_hash, b_hash) = (a["sha256"].clone(), b["sha256"].clone());
    // The file changes behind the model's back.
    server.sh(&sid, "echo changed > a.txt").await;
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "a.txt", "contentBase64": b64(b"mine\n"), "ifMatch": a_hash}]),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["code"], "precondition_failed");
    assert_eq!(
        v["failed"],
        json!([{"path": "a.txt", "currentSha256": sha256_hex(b"changed\n")}])
    );
    // Several files, one stale: none is written, no new file, no new dir.
    let (s, v) = server
        .write_files(
            &sid,
            json!([
                {"path": "b.txt", "contentBase64": b64(b"B\n"), "ifMatch": b_hash},
                {"path": "/workspace/a.txt", "contentBase64": b64(b"mine\n"), "ifMatch": a_hash},
                {"path": "new/dir/c.txt", "contentBase64": b64(b"c\n")},
            ]),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(
        v["failed"],
        json!([{"path": "/workspace/a.txt", "currentSha256": sha256_hex(b"changed\n")}])
    );
    let left = server
        .sh(&sid, "cat a.txt b.txt; ls -A; ls -A new 2>&1 | wc -l")
        .await;
    assert_eq!(left["stdout"], "changed\nbee\na.txt\nb.txt\n1\n", "{left}");
    // A file deleted since: the current hash is null.
    server.sh(&sid, "cp b.txt gone.txt").await;
    let gone_hash = server.read_file(&sid, "gone.txt").await.1["sha256"].clone();
    server.sh(&sid, "rm gone.txt").await;
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "gone.txt", "contentBase64": "", "ifMatch": gone_hash}]),
        )
        .await;
    assert_eq!(
        (s, v["failed"].clone()),
        (409, json!([{"path": "gone.txt", "currentSha256": null}]))
    );
    // With the fresh hash (read again), the write goes through.
    let fresh = server.read_file(&sid, "a.txt").await.1["sha256"].clone();
    let (s, v) = server
        .write_files(
            &sid,
            json!([
                {"path": "a.txt", "contentBase64": b64(b"mine\n"), "ifMatch": fresh},
                {"path": "b.txt", "contentBase64": b64(b"B\n"), "ifMatch": b_hash.as_str().map(str::to_uppercase)},
            ]),
        )
        .await;
    assert_eq!((s, v), (200, json!({"ok": true})));
    assert_eq!(
        server.sh(&sid, "cat a.txt b.txt").await["stdout"],
        "mine\nB\n"
    );
    // Create only: refused over an existing file, fine where none is.
    let (s, v) = server
        .write_files(
            &sid,
            json!([{"path": "a.txt", "contentBase64": b64(b"x"), "ifNoneMatch": "*"}]),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(
        v["failed"],
        json!([{"path": "a.txt", "currentSha256": sha256_hex(b"mine\n")}])
    );
    let (s, _) = server
        .write_files(
            &sid,
            json!([{"path": "fresh/new.txt", "contentBase64": b64(b"n"), "ifNoneMatch": "*"}]),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(server.sh(&sid, "cat a.txt").await["stdout"], "mine\n");
    // Bad preconditions are 400, naming the field, before the sandbox.
    for (file, field) in [
        (
            json!({"path": "a", "contentBase64": "", "ifMatch": "abc"}),
            "files[0].ifMatch",
        ),
        (
            json!({"path": "a", "contentBase64": "", "ifNoneMatch": "a"}),
            "files[0].ifNoneMatch",
        ),
        (
            json!({"path": "a", "contentBase64": "", "ifMatch": sha256_hex(b""), "ifNoneMatch": "*"}),
            "files[0].ifMatch",
        ),
    ] {
        let (s, v) = server.write_files(&sid, json!([file])).await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("invalid_request")),
            "{v}"
        );
        assert!(
            v["error"].as_str().is_some_and(|e| e.starts_with(field)),
            "{v}"
        );
    }
}

#[tokio::test]
async fn line_ranges_are_exact_and_binary_is_not_sent() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let plain = b"one\ntwo\nthree\nfour";
    let crlf = b"a\r\nb\r\nc\r\n";
    let binary = b"PK\x03\x04\x00\x01";
    let latin1 = b"caf\xe9\n";
    server
        .write_files(
            &sid,
            json!([
                {"path": "plain.txt", "contentBase64": b64(plain)},
                {"path": "crlf.txt", "contentBase64": b64(crlf)},
                {"path": "bin.zip", "contentBase64": b64(binary)},
                {"path": "latin1.txt", "contentBase64": b64(latin1)},
                {"path": "empty.txt", "contentBase64": ""},
            ]),
        )
        .await;
    let lines = |path: &str, q: &str| {
        let url = format!("/v1/sandboxes/{sid}/files:read?path={path}&{q}");
        let server = &server;
        async move { server.get(&url).await }
    };
    let text = |content: &str, start: u64, end: u64, total: u64, whole: &[u8]| {
        json!({"found": true, "binary": false, "content": content, "startLine": start,
            "endLine": end, "totalLines": total, "size": whole.len(), "sha256": sha256_hex(whole)})
    };
    let cases: Vec<(&str, &str, Value)> = vec![
        (
            "plain.txt",
            "startLine=1&endLine=1",
            text("one\n", 1, 1, 4, plain),
        ),
        (
            "plain.txt",
            "startLine=4&endLine=4",
            text("four", 4, 4, 4, plain),
        ),
        (
            "plain.txt",
            "startLine=2&endLine=3",
            text("two\nthree\n", 2, 3, 4, plain),
        ),
        (
            "plain.txt",
            "startLine=3",
            text("three\nfour", 3, 4, 4, plain),
        ),
        ("plain.txt", "endLine=2", text("one\ntwo\n", 1, 2, 4, plain)),
        (
            "plain.txt",
            "startLine=3&endLine=99",
            text("three\nfour", 3, 4, 4, plain),
        ),
        (
            "plain.txt",
            "startLine=5&endLine=9",
            text("", 5, 4, 4, plain),
        ),
        (
            "crlf.txt",
            "startLine=2&endLine=3",
            text("b\r\nc\r\n", 2, 3, 3, crlf),
        ),
        ("empty.txt", "startLine=1", text("", 1, 0, 0, b"")),
    ];
    for (path, q, want) in cases {
        let (s, v) = lines(path, q).await;
        assert_eq!((s, v), (200, want), "{path}?{q}");
    }
    for (path, bytes) in [("bin.zip", &binary[..]), ("latin1.txt", &latin1[..])] {
        let (s, v) = lines(path, "startLine=1&endLine=10").await;
        assert_eq!(
            (s, v),
            (
                200,
                json!({"found": true, "binary": true, "size": bytes.len(), "sha256": sha256_hex(bytes)})
            ),
            "{path}"
        );
    }
    let (s, v) = lines("missing.txt", "startLine=1").await;
    assert_eq!((s, v), (200, json!({"found": false})));
    for (q, field) in [
        ("startLine=0", "startLine"),
        ("endLine=0", "endLine"),
        ("startLine=3&endLine=2", "endLine"),
    ] {
        let (s, v) = lines("plain.txt", q).await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("invalid_request")),
            "{q}: {v}"
        );
        assert!(
            v["error"].as_str().is_some_and(|e| e.starts_with(field)),
            "{q}: {v}"
        );
    }
    for q in ["startLine=x", "startLine=-1", "startLine=1.5", "lines=3"] {
        let (s, v) = lines("plain.txt", q).await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("invalid_request")),
            "{q}: {v}"
        );
    }
}

#[tokio::test]
async fn stat_tells_files_dirs_symlinks_and_missing() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    server
        .write_files(
            &sid,
            json!([{"path": "d/f.txt", "contentBase64": b64(b"hello"), "mode": 0o640}]),
        )
        .await;
    server
        .sh(
            &sid,
            "ln -s d/f.txt link && ln -s /etc/passwd out && touch -d @1700000000.5 d/f.txt",
        )
        .await;
    let (s, v) = server
        .stat(
            &sid,
            &[
                "d/f.txt",
                "/workspace/d",
                "link",
                "missing",
                "d/nope/x",
                "out",
            ],
            true,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let e = &v["entries"];
    assert_eq!(
        e[0],
        json!({"path": "d/f.txt", "type": "file", "size": 5, "mode": "0640",
            "mtimeMs": 1_700_000_000_500i64, "sha256": sha256_hex(b"hello")})
    );
    assert_eq!(
        (e[1]["type"].clone(), e[1]["mode"].clone()),
        (json!("dir"), json!("0755"))
    );
    assert!(e[1].get("sha256").is_none(), "only files have a hash");
    assert_eq!(
        (e[2]["type"].clone(), e[2]["size"].clone()),
        (json!("symlink"), json!(7)),
        "a final symlink is not followed"
    );
    for i in [3, 4] {
        assert_eq!(
            e[i],
            json!({"path": v["entries"][i]["path"], "type": "missing", "size": 0, "mode": "0000", "mtimeMs": 0})
        );
    }
    assert_eq!(e[5]["type"], "symlink", "a final symlink out is only named");
    // Without sha256 no hash; the path rules of every file route.
    let (_, v) = server.stat(&sid, &["d/f.txt"], false).await;
    assert!(v["entries"][0].get("sha256").is_none(), "{v}");
    let (s, v) = server.stat(&sid, &["out/x"], false).await;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("symlink_escape")),
        "{v}"
    );
    for bad in ["../etc/passwd", "/etc/passwd", ""] {
        let (s, v) = server.stat(&sid, &["d", bad], false).await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("invalid_request")),
            "{bad}: {v}"
        );
        assert!(
            v["error"]
                .as_str()
                .is_some_and(|m| m.starts_with("paths[1]")),
            "{v}"
        );
    }
    let (s, _) = server.stat(&sid, &[], false).await;
    assert_eq!(s, 400);
}

/// Files for the search tests: `many.txt` with 500 matching lines, a
/// source tree, a binary file, `node_modules`.
async fn search_fixture(server: &TestServer, sid: &str) {
    let many: String = (1..=500).map(|i| format!("hit {i}\n")).collect();
    let (s, v) = server
        .write_files(
            sid,
            json!([
                {"path": "many.txt", "contentBase64": b64(many.as_bytes())},
                {"path": "src/main.rs", "contentBase64": b64(b"// top\nfn helper() {}\n\nfn main() {\n    helper();\n}\n")},
                {"path": "src/lib/util.ts", "contentBase64": b64(b"export function Main() {}\n")},
                {"path": "node_modules/x/index.js", "contentBase64": b64(b"function main() {}\n")},
                {"path": "blob.bin", "contentBase64": b64(b"\0fn main binary")},
                {"path": ".hidden/h.rs", "contentBase64": b64(b"fn main_hidden() {}\n")},
            ]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
}

/// The same searches give the same answers whichever search runs.
async fn check_searches(server: &TestServer, sid: &str, engine: &str, rg: bool) {
    let search = |body: Value| {
        let mut body = body;
        body["engine"] = json!(engine);
        async move { server.search(sid, body).await }
    };
    // The cap: 500 matches, 10 returned, all counted.
    let (s, v) =
        search(json!({"pattern": "^hit \\d+$", "maxResults": 10, "globs": ["many.txt"]})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            v["totalMatches"].clone(),
            v["returned"].clone(),
            v["truncated"].clone(),
            v["filesSearched"].clone(),
            v["usedRg"].clone()
        ),
        (json!(500), json!(10), json!(true), json!(1), json!(rg)),
        "{engine}: {v}"
    );
    let got = match_lines(&v);
    let want: Vec<(String, u64)> = (1..=10)
        .map(|i| ("/workspace/many.txt".to_string(), i))
        .collect();
    assert_eq!(got, want, "{engine}");
    assert_eq!(
        v["matches"][9],
        json!({"path": "/workspace/many.txt", "line": 10, "column": 1, "text": "hit 10", "before": [], "after": []})
    );
    // Context lines, a column, a glob that includes and one that excludes.
    let (s, v) =
        search(json!({"pattern": "main", "context": 2, "globs": ["*.rs", "!.hidden"]})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["matches"],
        json!([{"path": "/workspace/src/main.rs", "line": 4, "column": 4, "text": "fn main() {",
            "before": ["fn helper() {}", ""], "after": ["    helper();", "}"]}]),
        "{engine}: {v}"
    );
    assert_eq!(
        (v["totalMatches"].clone(), v["truncated"].clone()),
        (json!(1), json!(false))
    );
    // Everything: hidden files and node_modules too, binary skipped, in
    // path order; case-insensitive finds Main.
    let (s, v) = search(
        json!({"pattern": "fn main|function main", "caseInsensitive": true, "path": "/workspace"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let paths: Vec<String> = match_lines(&v).into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        paths,
        [
            "/workspace/.hidden/h.rs",
            "/workspace/node_modules/x/index.js",
            "/workspace/src/lib/util.ts",
            "/workspace/src/main.rs",
        ],
        "{engine}: {v}"
    );
    // A subdirectory, and its paths stay absolute.
    let (_, v) = search(json!({"pattern": "helper", "path": "src"})).await;
    assert_eq!(
        match_lines(&v),
        [
            ("/workspace/src/main.rs".to_string(), 2),
            ("/workspace/src/main.rs".to_string(), 5)
        ],
        "{engine}: {v}"
    );
}

#[tokio::test]
async fn search_with_rg_and_the_builtin_agree_exactly() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    search_fixture(&server, &sid).await;
    // The runtime image has rg: used unless the request asks otherwise.
    check_searches(&server, &sid, "auto", true).await;
    check_searches(&server, &sid, "builtin", false).await;
    let (_, v) = server
        .search(&sid, json!({"pattern": "x", "engine": "builtin"}))
        .await;
    assert_eq!(
        v["rgUnavailable"],
        "the request asked for the built-in search"
    );
    assert_eq!(v["filesSkipped"], 1, "blob.bin, as binary: {v}");
    // Bad requests are 400 naming the field; a missing directory is 404.
    for (body, field) in [
        (json!({"pattern": "("}), "pattern"),
        (json!({"pattern": ""}), "pattern"),
        (json!({"pattern": "x", "maxResults": 0}), "maxResults"),
        (json!({"pattern": "x", "maxResults": 10001}), "maxResults"),
        (json!({"pattern": "x", "context": 11}), "context"),
        (json!({"pattern": "x", "path": "../x"}), "path"),
        (json!({"pattern": "x", "globs": ["!"]}), "globs"),
    ] {
        let (s, v) = server.search(&sid, body.clone()).await;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("invalid_request")),
            "{body}: {v}"
        );
        assert!(
            v["error"].as_str().is_some_and(|e| e.starts_with(field)),
            "{body}: {v}"
        );
    }
    let (s, v) = server
        .search(&sid, json!({"pattern": "x", "path": "nope"}))
        .await;
    assert_eq!(
        (s, v["code"].clone()),
        (404, json!("file_not_found")),
        "{v}"
    );
    let (s, v) = server
        .search(&sid, json!({"pattern": "x", "path": "many.txt"}))
        .await;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("not_a_directory")),
        "{v}"
    );
}

#[tokio::test]
async fn search_without_rg_in_the_image_uses_the_builtin() {
    // The debootstrap base has no rg (see agent::a_bare_image_runs_…).
    let base = std::process::Command::new("sandbox-images/build.sh")
        .arg("--base-only")
        .output()
        .expect("build.sh --base-only");
    assert!(
        base.status.success(),
        "{}",
        String::from_utf8_lossy(&base.stderr)
    );
    let image = String::from_utf8_lossy(&base.stdout).trim().to_string();
    let config = std::env::temp_dir().join(format!("{}.toml", harness::unique_instance()));
    std::fs::write(&config, format!("[runtimes.bare]\nimage = \"{image}\"\n")).expect("config");
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_CONFIG", &config.display().to_string()),
    )
    .await;
    let sid = server
        .create(
            json!({"sessionKey": "bare-search", "runtime": "bare", "network": {"mode": "none"}}),
        )
        .await;
    assert_eq!(
        server.sh(&sid, "command -v rg || echo none").await["stdout"],
        "none\n"
    );
    search_fixture(&server, &sid).await;
    check_searches(&server, &sid, "auto", false).await;
    let (_, v) = server.search(&sid, json!({"pattern": "x"})).await;
    assert_eq!(v["rgUnavailable"], "rg is not on the sandbox's PATH", "{v}");
}
