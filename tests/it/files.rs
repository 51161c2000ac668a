//! The files API: binary-exact round trips, ownership and modes, every
//! refused path form, every symlink escape (and proof that nothing outside
//! the workspace changed), the symlink-swap race, all-or-nothing writes,
//! list, delete, limits and special files.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::harness::{ServerOptions, TestServer, b64};

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    getrandom::fill(&mut v).expect("random");
    v
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
        // and the mount point of the agent's volume.
        .filter(|p| {
            !["/usr", "/usr/sbin", "/usr/sbin/docker-init", "/.sandboxd"].contains(&p.as_str())
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

#[tokio::test]
async fn swapping_a_directory_for_a_symlink_mid_write_never_escapes() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // Inside the sandbox, flip d between a real directory and a link to /tmp.
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "mkdir -p /tmp/target; end=$((SECONDS+6)); while [ $SECONDS -lt $end ]; do rm -rf d; mkdir d; rm -rf d; ln -s /tmp/target d; done", "timeoutMs": 20000}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ok = 0;
    let mut refused = 0;
    while Instant::now() < deadline {
        let (s, v) = server
            .write_files(
                &sid,
                json!([{"path": "d/x.txt", "contentBase64": b64(b"race")}]),
            )
            .await;
        match s {
            200 => ok += 1,
            400..=499 => refused += 1,
            _ => panic!("unexpected {s}: {v}"),
        }
    }
    let leaked = server.sh(&sid, "ls -A /tmp/target | wc -l").await;
    assert_eq!(
        leaked["stdout"], "0\n",
        "a write escaped into /tmp/target ({ok} ok, {refused} refused)"
    );
    assert!(
        ok + refused > 5,
        "the race ran ({ok} ok, {refused} refused)"
    );
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
