//! Workspace checkpoints against a real sandboxd and the real engine: a
//! chat that checkpoints every turn and rewinds to turn 2 gets exactly
//! turn 2's tree (paths, kinds, modes, link targets, content, empty
//! directories), compared by a hash computed inside the sandbox; diffs
//! between turns are exact; a restore is refused while a command runs and
//! ends it when asked; the store is out of the sandbox's sight and goes
//! with the sandbox; checkpoints survive a SIGKILL of sandboxd; the limits
//! refuse with nothing half-made; a checkpoint after a small change
//! stores only that change; a directory swapped for links out of the
//! workspace during checkpoints never gets outside content stored.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{ServerOptions, TestServer, b64, eventually, sha256_hex};

/// A hash of the whole workspace tree as the sandbox sees it: every path
/// with its kind, mode and link target, and every file's content.
const TREE_HASH: &str = "export LC_ALL=C; { find . -mindepth 1 -printf '%p %y %m %l\\n' | sort; \
    find . -type f -print0 | sort -z | xargs -0 -r sha256sum; } | sha256sum | cut -c1-64";

pub(crate) async fn tree_hash(server: &TestServer, sid: &str) -> String {
    let r = server.sh(sid, TREE_HASH).await;
    assert_eq!(r["exitCode"], 0, "{r}");
    let hash = r["stdout"].as_str().expect("stdout").trim().to_string();
    assert_eq!(hash.len(), 64, "{r}");
    hash
}

pub(crate) async fn checkpoint(server: &TestServer, sid: &str, label: &str) -> Value {
    let (status, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/checkpoints"),
            json!({"label": label}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    v
}

/// A checkpoint labelled `label` with `verify`: every file read again.
async fn verified_checkpoint(server: &TestServer, sid: &str, label: &str) -> Value {
    let (status, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/checkpoints"),
            json!({"label": label, "verify": true}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    v
}

/// `count` files of `bytes` random bytes each, `many/f1` on.
async fn random_files(server: &TestServer, sid: &str, count: u32, bytes: u32) {
    let script = format!(
        "mkdir many && for i in $(seq 1 {count}); do head -c {bytes} /dev/urandom > many/f$i; done"
    );
    sh_ok(server, sid, &script).await;
}

/// Asks for a checkpoint that must be refused with `status` and `code`,
/// leaving the list as it was.
async fn refused(server: &TestServer, sid: &str, body: Value, status: u16, code: &str) -> Value {
    let before = labels(server, sid).await;
    let (got, v) = server
        .post(&format!("/v1/sandboxes/{sid}/checkpoints"), body)
        .await;
    assert_eq!((got, v["code"].as_str()), (status, Some(code)), "{v}");
    assert_eq!(labels(server, sid).await, before, "the list is unchanged");
    v
}

/// `DELETE …/checkpoints/{cp}`: its status.
pub(crate) async fn delete(server: &TestServer, sid: &str, cp: &str) -> u16 {
    let url = format!("{}/v1/sandboxes/{sid}/checkpoints/{cp}", server.base);
    let resp = server.client.delete(url).send().await.expect("delete");
    resp.status().as_u16()
}

/// Starts `script`, which prints `started` once it runs: its id.
async fn started(server: &TestServer, sid: &str, script: &str) -> String {
    let cid = server.start_command(sid, json!({"command": script})).await;
    server
        .output_until(sid, &cid, "started", Duration::from_secs(20))
        .await;
    cid
}

async fn labels(server: &TestServer, sid: &str) -> Vec<String> {
    let (status, v) = server
        .get(&format!("/v1/sandboxes/{sid}/checkpoints"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| c["label"].as_str().unwrap_or_default().to_string())
        .collect()
}

pub(crate) fn id(cp: &Value) -> &str {
    cp["checkpointId"].as_str().expect("checkpointId")
}

async fn restore(server: &TestServer, sid: &str, cp: &str, body: Value) -> (u16, Value) {
    server
        .post_within(
            &format!("/v1/sandboxes/{sid}/checkpoints/{cp}:restore"),
            body,
            Duration::from_secs(60),
        )
        .await
}

async fn diff(server: &TestServer, sid: &str, from: &str, to: &str) -> Value {
    let (status, v) = server
        .get(&format!(
            "/v1/sandboxes/{sid}/checkpoints/{from}/diff?to={to}"
        ))
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

/// Runs `script` in the sandbox, asserting it succeeds.
pub(crate) async fn sh_ok(server: &TestServer, sid: &str, script: &str) {
    let r = server.sh(sid, script).await;
    assert_eq!(r["exitCode"], 0, "{r}");
}

/// The sandbox's store on the host.
fn store_dir(server: &TestServer, sid: &str) -> PathBuf {
    server
        .state_dir
        .join("checkpoints")
        .join(&server.instance)
        .join(sid)
}

/// The bytes of the store's content: its objects stored as files of
/// their own, and its packs (the small ones, many to a file).
fn object_bytes(server: &TestServer, sid: &str) -> u64 {
    content_bytes(&store_dir(server, sid))
}

fn content_bytes(store: &std::path::Path) -> u64 {
    let packs: u64 = std::fs::read_dir(store.join("packs"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    bytes_in(&store.join("objects")) + packs
}

/// The hashes of the objects in the store, files and packed, sorted.
fn stored_objects(server: &TestServer, sid: &str) -> Vec<String> {
    let store = store_dir(server, sid);
    let names = |dir: &str| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(store.join(dir))
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let mut all: Vec<String> = names("objects")
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
        .collect();
    for index in names("packs")
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "idx"))
    {
        let text = std::fs::read_to_string(index).expect("a pack's index");
        all.extend(
            text.lines()
                .filter_map(|l| l.split(' ').next())
                .map(str::to_string),
        );
    }
    all.sort();
    all
}

/// The bytes of the files in directory `dir` of the sandbox's store.
fn dir_bytes(server: &TestServer, sid: &str, dir: &str) -> u64 {
    bytes_in(&store_dir(server, sid).join(dir))
}

/// The bytes of the files in `dir` (0 if there is none).
fn bytes_in(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

const TURN_1: &str = "mkdir -p src/lib empty docs && printf 'fn main() {}\\n' > src/main.rs \
    && printf 'one' > src/lib/a.rs && printf 'notes' > docs/notes.md && chmod 640 docs/notes.md \
    && printf '#!/bin/sh\\n' > run.sh && ln -s src/main.rs entry";
const TURN_2: &str = "printf 'fn main() { println!(\"2\"); }\\n' > src/main.rs \
    && chmod 755 run.sh && printf 'two' > src/lib/b.rs && ln -s ../docs src/docs-link \
    && chmod 700 empty";
const TURN_3: &str = "rm -r src/lib docs && printf 'three' > src/lib && rm entry \
    && ln -s run.sh entry && rmdir empty && mkdir -p later/empty && printf 'x' > later/new.txt \
    && chmod 600 run.sh";

/// The checkpoints of the three turns, and the tree hash of turn 2.
struct Turns {
    t1: Value,
    t2: Value,
    t3: Value,
    turn_2_hash: String,
}

/// Runs the three turns, a checkpoint after each; turn 3 changes the tree
/// (the positive control of every comparison with turn 2's hash).
async fn three_turns(server: &TestServer, sid: &str) -> Turns {
    sh_ok(server, sid, TURN_1).await;
    let t1 = checkpoint(server, sid, "turn-1").await;
    sh_ok(server, sid, TURN_2).await;
    let t2 = checkpoint(server, sid, "turn-2").await;
    let turn_2_hash = tree_hash(server, sid).await;
    sh_ok(server, sid, TURN_3).await;
    let t3 = checkpoint(server, sid, "turn-3").await;
    assert_ne!(
        tree_hash(server, sid).await,
        turn_2_hash,
        "turn 3 changed the tree"
    );
    Turns {
        t1,
        t2,
        t3,
        turn_2_hash,
    }
}

#[tokio::test]
async fn a_chat_rewinds_to_turn_two_exactly_and_diffs_are_exact() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let Turns {
        t1,
        t2,
        t3,
        turn_2_hash,
    } = three_turns(&server, &sid).await;
    assert_eq!(t1["files"], 4, "{t1}");
    assert_eq!(labels(&server, &sid).await, ["turn-3", "turn-2", "turn-1"]);
    refused(
        &server,
        &sid,
        json!({"label": "turn-2"}),
        409,
        "checkpoint_label_taken",
    )
    .await;

    let d = diff(&server, &sid, id(&t1), id(&t2)).await;
    assert_eq!(
        d,
        json!({
            "created": [
                {"path": "src/docs-link", "kind": "symlink", "sizeBefore": null, "sizeAfter": null},
                {"path": "src/lib/b.rs", "kind": "file", "sizeBefore": null, "sizeAfter": 3},
            ],
            "modified": [
                {"path": "empty", "kind": "dir", "sizeBefore": null, "sizeAfter": null},
                {"path": "run.sh", "kind": "file", "sizeBefore": 10, "sizeAfter": 10},
                {"path": "src/main.rs", "kind": "file", "sizeBefore": 13, "sizeAfter": 29},
            ],
            "deleted": [],
            "counts": {"created": 2, "modified": 3, "deleted": 0},
            "truncated": false,
        })
    );
    let d = diff(&server, &sid, id(&t2), id(&t3)).await;
    assert_eq!(
        d["counts"],
        json!({"created": 3, "modified": 3, "deleted": 5}),
        "{d}"
    );

    let (status, changed) = restore(&server, &sid, id(&t2), json!({})).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(
        changed["counts"],
        json!({"created": 5, "modified": 3, "deleted": 3}),
        "the restore undid turn 3: {changed}"
    );
    assert_eq!(tree_hash(&server, &sid).await, turn_2_hash);
    let gone = server.sh(&sid, "test -e later || echo gone").await;
    assert_eq!(gone["stdout"], "gone\n", "what turn 3 made is gone");
    let link = server.sh(&sid, "readlink src/docs-link entry").await;
    assert_eq!(link["stdout"], "../docs\nsrc/main.rs\n", "links stay links");
    let now = diff(&server, &sid, id(&t2), "current").await;
    assert_eq!(
        now["counts"],
        json!({"created": 0, "modified": 0, "deleted": 0})
    );
    // And forward again, to turn 3.
    let (status, v) = restore(&server, &sid, id(&t3), json!({})).await;
    assert_eq!(status, 200, "{v}");
    let now = diff(&server, &sid, id(&t3), "current").await;
    assert_eq!(
        now["counts"],
        json!({"created": 0, "modified": 0, "deleted": 0})
    );
}

#[tokio::test]
async fn a_restore_is_refused_while_a_command_runs_and_ends_its_tree_when_asked() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "echo base > f").await;
    let cp = checkpoint(&server, &sid, "base").await;
    sh_ok(&server, &sid, "echo later > f").await;
    let cid = started(&server, &sid, "sleep 300 & sleep 301 & echo started; wait").await;
    let (status, v) = restore(&server, &sid, id(&cp), json!({})).await;
    assert_eq!(
        (status, &v["code"]),
        (409, &json!("commands_running")),
        "{v}"
    );
    assert_eq!(
        server.sh(&sid, "cat f").await["stdout"],
        "later\n",
        "nothing restored"
    );

    let (status, v) = restore(&server, &sid, id(&cp), json!({"endCommands": true})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(server.sh(&sid, "cat f").await["stdout"], "base\n");
    let ended = server.wait_command(&sid, &cid).await;
    assert_ne!(ended["exitCode"], 0, "{ended}");
    let sleeping = server
        .sh(
            &sid,
            "cat /proc/[0-9]*/comm 2>/dev/null | grep -cx sleep || true",
        )
        .await;
    assert_eq!(sleeping["stdout"], "0\n", "the command's tree is gone");
}

#[tokio::test]
async fn the_store_is_out_of_the_sandboxs_sight_and_goes_with_it() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // Written through the API and searched for with a pattern that does
    // not hold it, so no command line or log in the sandbox does either.
    let secret = format!("ckpt{}", crate::harness::unique_instance());
    let (status, v) = server
        .write_files(
            &sid,
            json!([{"path": "s.txt", "contentBase64": b64(&secret)}]),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let search = format!(
        "grep -rlsE '[c]kpt{}' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev || true",
        &secret[4..]
    );
    let found = server.sh_with_timeout(&sid, &search, 120_000).await;
    assert!(
        found["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("s.txt"),
        "the search finds the workspace's copy: {found}"
    );
    checkpoint(&server, &sid, "secret").await;
    sh_ok(&server, &sid, "rm s.txt").await;
    assert_eq!(
        stored_objects(&server, &sid)
            .iter()
            .filter(|o| **o == sha256_hex(secret.as_bytes()))
            .count(),
        1,
        "the store holds the content on the host"
    );
    let packs = std::fs::read_dir(store_dir(&server, &sid).join("packs")).expect("packs");
    assert!(
        packs.filter_map(Result::ok).any(|p| std::fs::read(p.path())
            .is_ok_and(|b| b.windows(secret.len()).any(|w| w == secret.as_bytes()))),
        "a pack on the host holds the secret's bytes"
    );
    let found = server.sh_with_timeout(&sid, &search, 120_000).await;
    assert_eq!(found["exitCode"], 0, "{found}");
    assert_eq!(found["stdout"], "", "no path in the sandbox holds it");

    let (status, v) = server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await;
    assert_eq!(status, 200, "{v}");
    let dir = store_dir(&server, &sid);
    eventually(
        Duration::from_secs(30),
        "the store goes with the sandbox",
        || {
            let dir = dir.clone();
            async move { !dir.exists() }
        },
    )
    .await;
}

#[tokio::test]
async fn checkpoints_survive_a_sigkill_of_sandboxd() {
    let mut server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "mkdir d && echo kept > d/f").await;
    let cp = checkpoint(&server, &sid, "before").await;
    sh_ok(&server, &sid, "rm -r d && echo new > g").await;
    server.crash_and_restart().await;
    assert_eq!(labels(&server, &sid).await, ["before"]);
    let (status, v) = restore(&server, &sid, id(&cp), json!({})).await;
    assert_eq!(status, 200, "{v}");
    let r = server.sh(&sid, "cat d/f; ls").await;
    assert_eq!(r["stdout"], "kept\nd\n", "{r}");
}

#[tokio::test]
async fn limits_refuse_with_nothing_half_made() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_CHECKPOINT_MAX_COUNT", "2")
            .env("SANDBOXD_CHECKPOINT_MAX_STORE_BYTES", "1048576"),
    )
    .await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "echo a > a").await;
    let first = checkpoint(&server, &sid, "1").await;
    checkpoint(&server, &sid, "2").await;
    refused(
        &server,
        &sid,
        json!({"label": "3"}),
        429,
        "too_many_checkpoints",
    )
    .await;
    assert_eq!(labels(&server, &sid).await, ["2", "1"]);

    assert_eq!(delete(&server, &sid, id(&first)).await, 200);
    let before = object_bytes(&server, &sid);
    sh_ok(
        &server,
        &sid,
        "head -c 700000 /dev/urandom > big1 && head -c 700000 /dev/urandom > big2",
    )
    .await;
    refused(
        &server,
        &sid,
        json!({"label": "big"}),
        507,
        "checkpoint_store_full",
    )
    .await;
    assert_eq!(object_bytes(&server, &sid), before, "no content kept");
    // The same with small files, which are stored in batches.
    sh_ok(
        &server,
        &sid,
        "rm big1 big2 && for i in 1 2 3 4 5 6 7 8; do head -c 200000 /dev/urandom > s$i; done",
    )
    .await;
    refused(
        &server,
        &sid,
        json!({"label": "small"}),
        507,
        "checkpoint_store_full",
    )
    .await;
    assert_eq!(object_bytes(&server, &sid), before, "no small file kept");
    sh_ok(&server, &sid, "rm s5 s6 s7 s8").await;
    let fits = checkpoint(&server, &sid, "fits").await;
    assert_eq!(fits["newBytes"], 800_000, "{fits}");
}

/// A checkpoint refused for the store's bytes writes at most one file past
/// them, not every file it had in flight: the store on the host, looked
/// at every millisecond while it runs, never holds more.
#[tokio::test]
async fn a_checkpoint_over_the_store_limit_writes_at_most_one_file_past_it() {
    const LIMIT: u64 = 10 * 1024 * 1024;
    const FILE: u64 = 8 * 1024 * 1024;
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_CHECKPOINT_MAX_STORE_BYTES", &LIMIT.to_string()),
    )
    .await;
    let sid = server.offline_sandbox().await;
    sh_ok(
        &server,
        &sid,
        &format!("for i in 1 2 3 4 5 6 7 8; do head -c {FILE} /dev/urandom > big$i; done"),
    )
    .await;
    let store = store_dir(&server, &sid);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let look = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(content_bytes(&store) + bytes_in(&store.join("tmp")));
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        })
    };
    refused(&server, &sid, json!({}), 507, "checkpoint_store_full").await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = look.join().expect("the look at the store");
    assert!(
        peak >= FILE,
        "control: the look saw the store's writes ({peak} bytes at most)"
    );
    assert!(
        peak <= LIMIT + FILE,
        "the store held {peak} bytes, past {LIMIT} by more than one file of {FILE}"
    );
    assert_eq!(object_bytes(&server, &sid), 0, "nothing kept");
}

#[tokio::test]
async fn a_checkpoint_after_a_small_change_stores_only_that_change() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    random_files(&server, &sid, 300, 10_000).await;
    // A file changed within 20 ms before a checkpoint's walk is read
    // again by the next one (its times may not show a change in the same
    // tick of the file clock): these are not, so the counts are exact.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let listing = |server: &TestServer| {
        let (trees, manifests) = (
            dir_bytes(server, &sid, "trees"),
            dir_bytes(server, &sid, "manifests"),
        );
        (trees, trees + manifests)
    };
    let asked = std::time::Instant::now();
    let first = checkpoint(&server, &sid, "first").await;
    let answered = asked.elapsed().as_millis() as u64;
    assert_eq!(first["files"], 300, "{first}");
    assert_eq!(first["newBytes"], 3_000_000, "{first}");
    // Its time runs to its content on disk, within the client's wait.
    let took = first["durationMs"].as_u64().expect("durationMs");
    assert!(took > 0 && took <= answered, "{took} ms of {answered} ms");
    let (first_trees, first_listing) = listing(&server);
    assert!(first_trees > 0, "the entries are in trees");
    sh_ok(&server, &sid, "head -c 12345 /dev/urandom > many/f7").await;
    let second = checkpoint(&server, &sid, "second").await;
    assert_eq!(second["newBytes"], 12345, "only the changed file: {second}");
    assert_eq!(second["bytes"], 3_002_345, "{second}");
    let (second_trees, second_listing) = listing(&server);
    assert!(
        second_listing - first_listing < first_listing / 2,
        "the second checkpoint's listing shares the unchanged trees: {first_listing} then {second_listing} bytes"
    );
    let verified = verified_checkpoint(&server, &sid, "verified").await;
    assert_eq!(
        verified["newBytes"], 0,
        "everything read again, all of it stored before"
    );
    assert_eq!(
        listing(&server).0,
        second_trees,
        "nothing changed: the verified checkpoint's trees are the second's"
    );
    let d = diff(&server, &sid, id(&first), id(&second)).await;
    assert_eq!(
        d["modified"],
        json!([{"path": "many/f7", "kind": "file", "sizeBefore": 10000, "sizeAfter": 12345}])
    );
    let metrics = server.metrics_text().await;
    assert!(
        metrics.contains("sandboxd_checkpoints_total 3"),
        "{metrics}"
    );
    assert!(metrics.contains("sandboxd_checkpoint_stored_bytes_total 3012345"));
    // 300 files, then the changed one, then all 300 again: read on the
    // host under runc, through the agent under gVisor.
    let (read_by, not_by) = if crate::harness::under_gvisor() {
        ("agent", "host")
    } else {
        ("host", "agent")
    };
    assert!(
        metrics.contains(&format!(
            "sandboxd_checkpoint_files_read_total{{via=\"{read_by}\"}} 601"
        )),
        "{metrics}"
    );
    assert!(
        !metrics.contains(&format!("{{via=\"{not_by}\"}}")),
        "{metrics}"
    );
}

/// Small files are stored many to a pack: deleting the checkpoints that
/// alone hold a pack's content removes it, and a pack left mostly dead
/// is rewritten with only what lives, which restores as before.
#[tokio::test]
async fn deleting_checkpoints_frees_the_small_files_only_they_held() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    random_files(&server, &sid, 300, 10_000).await;
    let a = checkpoint(&server, &sid, "a").await;
    assert_eq!(object_bytes(&server, &sid), 3_000_000);
    sh_ok(
        &server,
        &sid,
        "for f in many/*; do head -c 10000 /dev/urandom > $f; done",
    )
    .await;
    let b = checkpoint(&server, &sid, "b").await;
    assert_eq!(object_bytes(&server, &sid), 6_000_000, "control: both kept");
    assert_eq!(delete(&server, &sid, id(&a)).await, 200);
    assert_eq!(object_bytes(&server, &sid), 3_000_000, "a's pack is gone");
    // Two thirds of b's files change: its pack is a third alive.
    sh_ok(
        &server,
        &sid,
        "for i in $(seq 1 200); do head -c 10000 /dev/urandom > many/f$i; done",
    )
    .await;
    let c = checkpoint(&server, &sid, "c").await;
    let c_tree = tree_hash(&server, &sid).await;
    assert_eq!(c["newBytes"], 2_000_000, "{c}");
    assert_eq!(
        object_bytes(&server, &sid),
        5_000_000,
        "control: b and c kept"
    );
    assert_eq!(delete(&server, &sid, id(&b)).await, 200);
    assert_eq!(
        object_bytes(&server, &sid),
        3_000_000,
        "b's pack rewritten with the 100 files c still holds"
    );
    assert_eq!(stored_objects(&server, &sid).len(), 300);
    sh_ok(&server, &sid, "rm -r many").await;
    let (status, v) = restore(&server, &sid, id(&c), json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(tree_hash(&server, &sid).await, c_tree, "c restores exactly");
    assert_eq!(delete(&server, &sid, id(&c)).await, 200);
    assert_eq!(object_bytes(&server, &sid), 0, "nothing left");
    assert_eq!(stored_objects(&server, &sid), Vec::<String>::new());
}

#[tokio::test]
async fn a_sigkill_mid_checkpoint_leaves_no_checkpoint_and_no_content_behind() {
    let mut server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    random_files(&server, &sid, 200, 1_000_000).await;
    let (client, url) = (
        server.client.clone(),
        format!("{}/v1/sandboxes/{sid}/checkpoints", server.base),
    );
    let pending =
        tokio::spawn(async move { client.post(url).json(&json!({"label": "cut"})).send().await });
    let objects = store_dir(&server, &sid).join("objects");
    // Looked for often: read on the host, the 200 MB take a few hundred
    // milliseconds.
    under_way(&pending, "content is being stored", || {
        std::fs::read_dir(&objects).is_ok_and(|mut d| d.next().is_some())
    })
    .await;
    server.crash_and_restart().await;
    assert!(pending.await.expect("join").is_err(), "no answer came");
    assert_eq!(labels(&server, &sid).await, Vec::<String>::new());
    // New content everywhere: what the cut checkpoint stored is no
    // checkpoint's, and the next checkpoint sweeps it.
    sh_ok(
        &server,
        &sid,
        "for f in many/*; do head -c 1000 /dev/urandom > $f; done",
    )
    .await;
    let cp = checkpoint(&server, &sid, "whole").await;
    assert_eq!(
        (cp["files"].clone(), cp["newBytes"].clone()),
        (json!(200), json!(200_000))
    );
    assert_eq!(object_bytes(&server, &sid), 200_000);
    let tmp = std::fs::read_dir(store_dir(&server, &sid).join("tmp")).expect("tmp");
    assert_eq!(tmp.count(), 0, "no temporary file is left");
}

/// A sandbox that keeps swapping a directory for links out of the
/// workspace (to `/etc`, where a file of the same name is, and up past
/// the volume) while checkpoints are taken: each is whole or refused as
/// changing, and the store holds only the workspace's one content. Under
/// runc the files are read on the host, where those links would lead
/// out of the volume.
#[tokio::test]
async fn checkpoints_while_a_directory_is_swapped_for_links_out_store_only_the_workspaces_content()
{
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "mkdir d && echo inside > d/hostname").await;
    let before = checkpoint(&server, &sid, "before").await;
    started(
        &server,
        &sid,
        "python3 -c \"
import os
print('started', flush=True)
n = 0
while True:
    os.rename('d', 'd.x'); os.symlink('/etc', 'd'); os.unlink('d')
    os.symlink('../../../..', 'd'); os.unlink('d'); os.rename('d.x', 'd')
    n += 1
    with open('/tmp/swaps.new', 'w') as f: f.write(str(n))
    os.rename('/tmp/swaps.new', '/tmp/swaps')
\"",
    )
    .await;
    let swaps = || async {
        let r = server.sh(&sid, "cat /tmp/swaps").await;
        r["stdout"]
            .as_str()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let swaps_before = swaps().await;
    let (mut whole, mut refused) = (Vec::new(), 0);
    for i in 0..20 {
        let (status, v) = server
            .post(
                &format!("/v1/sandboxes/{sid}/checkpoints"),
                json!({"label": format!("during-{i}")}),
            )
            .await;
        match (status, v["code"].as_str()) {
            (201, _) => whole.push(v),
            (409, Some("workspace_changing")) => refused += 1,
            _ => panic!("neither whole nor refused as changing: {status} {v}"),
        }
    }
    // The control: the swaps went on all along.
    let swapped = swaps().await - swaps_before;
    assert!(
        swapped >= 20,
        "the directory was swapped {swapped} times during the checkpoints"
    );
    // A whole one is the workspace at some instant of the loop: nothing
    // of where the links lead (under gVisor an open of `d` as a directory
    // follows a link put there, unless the agent checks what it opened).
    let instants = ["d", "d/hostname", "d.x", "d.x/hostname"];
    for v in &whole {
        let d = diff(&server, &sid, id(&before), id(v)).await;
        for list in ["created", "modified", "deleted"] {
            for e in d[list].as_array().expect("a list") {
                let path = e["path"].as_str().unwrap_or_default();
                assert!(
                    instants.contains(&path),
                    "{path} is not the workspace's: {d}"
                );
            }
        }
    }
    eprintln!(
        "{} checkpoints whole, {refused} refused, over {swapped} swaps; {}",
        whole.len(),
        server
            .metrics_text()
            .await
            .lines()
            .filter(|l| l.starts_with("sandboxd_checkpoint_files_read_total"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert_eq!(
        stored_objects(&server, &sid),
        [sha256_hex(b"inside\n")],
        "the store holds the workspace's one content and nothing else"
    );
}

/// Waits, looking every 2 ms for 30 s at most, until `seen` holds while
/// `request` is still waiting for its answer.
async fn under_way<T>(request: &tokio::task::JoinHandle<T>, what: &str, seen: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !seen() {
        assert!(!request.is_finished(), "answered before {what}");
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        !request.is_finished(),
        "answered before it was seen that {what}"
    );
}

/// A client that gives up on a checkpoint: the checkpoint still ends,
/// whole (listed and restorable), and the next one waits for it.
#[tokio::test]
async fn a_checkpoint_whose_client_goes_away_still_ends_whole() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    random_files(&server, &sid, 200, 1_000_000).await;
    let want = tree_hash(&server, &sid).await;
    // The client goes away once the checkpoint is under way (the store
    // is marked changing), long before it can end.
    let request = server
        .client
        .post(format!("{}/v1/sandboxes/{sid}/checkpoints", server.base))
        .json(&json!({"label": "cut"}))
        .send();
    let cut = tokio::spawn(request);
    let marker = store_dir(&server, &sid).join("changing");
    under_way(&cut, "the store is marked changing", || marker.exists()).await;
    cut.abort();
    assert!(
        cut.await.is_err_and(|e| e.is_cancelled()),
        "the client gave up before the answer"
    );
    checkpoint(&server, &sid, "next").await;
    assert_eq!(labels(&server, &sid).await, ["next", "cut"]);
    let (status, all) = server
        .get(&format!("/v1/sandboxes/{sid}/checkpoints"))
        .await;
    assert_eq!(status, 200, "{all}");
    let cut = all["checkpoints"][1].clone();
    assert_eq!(
        (cut["files"].clone(), cut["newBytes"].clone()),
        (json!(200), json!(200_000_000))
    );
    sh_ok(&server, &sid, "rm -rf many").await;
    let (status, v) = restore(&server, &sid, id(&cut), json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        tree_hash(&server, &sid).await,
        want,
        "the cut-off checkpoint's tree"
    );
}

#[tokio::test]
async fn a_chat_rewinds_under_gvisor_too() {
    let config = std::env::temp_dir().join(format!(
        "{}-checkpoints-gvisor.toml",
        crate::harness::unique_instance()
    ));
    std::fs::write(&config, "[runtimes.gvisor]\noci_runtime = \"runsc\"\n").expect("config");
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_CONFIG", config.to_str().expect("utf8")),
    )
    .await;
    let _ = std::fs::remove_file(&config);
    let sid = server
        .create(json!({"sessionKey": crate::harness::unique_instance(), "runtime": "gvisor", "network": {"mode": "none"}}))
        .await;
    let kernel = server
        .sh_with_timeout(&sid, "dmesg | head -1", 30_000)
        .await;
    assert!(
        kernel["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("gVisor"),
        "{kernel}"
    );
    let Turns {
        t2, turn_2_hash, ..
    } = three_turns(&server, &sid).await;
    let (status, v) = restore(&server, &sid, id(&t2), json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(tree_hash(&server, &sid).await, turn_2_hash);
    // gVisor keeps its own view of the files: the agent reads them all.
    let metrics = server.metrics_text().await;
    assert!(
        metrics.contains("sandboxd_checkpoint_files_read_total{via=\"agent\"}"),
        "{metrics}"
    );
    assert!(!metrics.contains("{via=\"host\"}"), "{metrics}");
}

/// Workspace walks `via` the host or the agent, so far.
async fn walks(server: &TestServer, via: &str) -> u64 {
    let series = format!("sandboxd_checkpoint_walks_total{{via=\"{via}\"}} ");
    server
        .metrics_text()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |v| v.trim().parse().unwrap_or(0))
}

#[tokio::test]
async fn refusals_say_what_went_wrong_and_store_nothing() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let (status, v) = server
        .get(&format!(
            "/v1/sandboxes/{sid}/checkpoints/0123456789abcdef/diff?to=current"
        ))
        .await;
    assert_eq!(
        (status, &v["code"]),
        (404, &json!("checkpoint_not_found")),
        "{v}"
    );
    let (status, v) = restore(&server, &sid, "0123456789abcdef", json!({})).await;
    assert_eq!(
        (status, &v["code"]),
        (404, &json!("checkpoint_not_found")),
        "{v}"
    );
    assert_eq!(delete(&server, &sid, "0123456789abcdef").await, 404);

    sh_ok(&server, &sid, "touch \"$(printf 'bad\\377name')\"").await;
    refused(&server, &sid, json!({}), 409, "workspace_unsupported").await;
    sh_ok(&server, &sid, "rm bad*name").await;
    checkpoint(&server, &sid, "clean").await;

    // What the sandbox user made unreadable is named, under every runtime
    // (under runc the host could read it, and leaves it to the agent).
    sh_ok(
        &server,
        &sid,
        "mkdir locked && echo x > locked/f && chmod 000 locked",
    )
    .await;
    let names = |v: &Value, path: &str| {
        let m = v["error"].as_str().unwrap_or_default();
        assert!(m.starts_with(&format!("{path} cannot be read")), "{v}");
    };
    names(
        &refused(&server, &sid, json!({}), 403, "permission_denied").await,
        "locked",
    );
    sh_ok(&server, &sid, "chmod 700 locked && chmod 000 locked/f").await;
    names(
        &refused(&server, &sid, json!({}), 403, "permission_denied").await,
        "locked/f",
    );
    // Control: readable again, it is kept.
    sh_ok(&server, &sid, "chmod 600 locked/f").await;
    checkpoint(&server, &sid, "readable").await;
    // Under runc the host walked the workspace, except the two the agent
    // must judge (the name that is not UTF-8, the locked directory); the
    // unreadable file was the agent's to read, not to walk.
    let (host, agent) = (walks(&server, "host").await, walks(&server, "agent").await);
    if crate::harness::under_gvisor() {
        assert_eq!((host, agent), (0, 5), "every walk the agent's");
    } else {
        assert_eq!((host, agent), (3, 2));
    }

    // A large file appended to all the time changes during its read (and
    // between the look and the read), on the first try and on the second.
    started(
        &server,
        &sid,
        "head -c 50000000 /dev/zero > busy; echo started; timeout 60 sh -c 'while :; do echo x >> busy; done'",
    )
    .await;
    refused(
        &server,
        &sid,
        json!({"label": "busy"}),
        409,
        "workspace_changing",
    )
    .await;
}

#[tokio::test]
async fn a_restore_writes_large_files_exactly_and_counts_terminal_sessions_as_running() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    // Larger than a write's piece (256 KiB) and than a piece read from
    // the agent (1 MiB): the restore streams them from the store.
    sh_ok(
        &server,
        &sid,
        "head -c 5000000 /dev/urandom > big && head -c 300000 /dev/urandom > mid \
         && printf small > small && : > empty",
    )
    .await;
    let before = tree_hash(&server, &sid).await;
    let cp = checkpoint(&server, &sid, "large").await;
    sh_ok(
        &server,
        &sid,
        "head -c 4000000 /dev/urandom > big && head -c 300000 /dev/urandom > mid && rm small",
    )
    .await;
    assert_ne!(tree_hash(&server, &sid).await, before, "the files changed");

    let (status, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/ptys"),
            json!({"command": "sh"}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let pty = v["ptyId"].as_str().expect("ptyId").to_string();
    let (status, v) = restore(&server, &sid, id(&cp), json!({})).await;
    assert_eq!(
        (status, &v["code"]),
        (409, &json!("commands_running")),
        "a terminal session runs: {v}"
    );
    assert!(
        v["error"].as_str().unwrap_or_default().contains(&pty),
        "{v}"
    );

    let (status, v) = restore(&server, &sid, id(&cp), json!({"endCommands": true})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(tree_hash(&server, &sid).await, before);
    let (status, v) = server.get(&format!("/v1/sandboxes/{sid}/ptys")).await;
    assert_eq!(status, 200, "{v}");
    let session = v["ptys"]
        .as_array()
        .expect("ptys")
        .iter()
        .find(|p| p["ptyId"] == pty.as_str())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(session["state"], "exited", "the session was ended: {v}");
}

/// `POST …/commands:run` with `body`.
async fn run(server: &TestServer, sid: &str, body: Value) -> (u16, Value) {
    server
        .post_within(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            body,
            Duration::from_secs(60),
        )
        .await
}

async fn command_count(server: &TestServer, sid: &str) -> usize {
    let (status, v) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    assert_eq!(status, 200, "{v}");
    v["commands"].as_array().expect("commands").len()
}

#[tokio::test]
async fn a_command_with_a_checkpoint_marks_the_turn_just_before_it_runs() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "echo one > f").await;
    let (status, ran) = run(
        &server,
        &sid,
        json!({"command": "echo two > f && cat f", "checkpoint": "turn-1"}),
    )
    .await;
    assert_eq!((status, &ran["stdout"]), (200, &json!("two\n")), "{ran}");
    let turn_1 = ran["checkpointId"]
        .as_str()
        .expect("checkpointId")
        .to_string();
    assert_eq!(labels(&server, &sid).await, ["turn-1"]);
    let d = diff(&server, &sid, &turn_1, "current").await;
    assert_eq!(
        d["modified"],
        json!([{"path": "f", "kind": "file", "sizeBefore": 4, "sizeAfter": 4}]),
        "the checkpoint is the workspace before the command: {d}"
    );

    let (status, started) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "echo three > f", "checkpoint": "turn-2"}),
        )
        .await;
    assert_eq!(status, 200, "{started}");
    let turn_2 = started["checkpointId"].as_str().expect("checkpointId");
    let cid = started["commandId"].as_str().expect("commandId");
    server.wait_command(&sid, cid).await;
    assert_eq!(labels(&server, &sid).await, ["turn-2", "turn-1"]);

    // A label the sandbox has: the same refusal as the checkpoints route,
    // and the command does not start.
    let before = command_count(&server, &sid).await;
    for path in ["commands", "commands:run"] {
        let (status, v) = server
            .post(
                &format!("/v1/sandboxes/{sid}/{path}"),
                json!({"command": "echo ran > marker", "checkpoint": "turn-1"}),
            )
            .await;
        assert_eq!(
            (status, v["code"].as_str()),
            (409, Some("checkpoint_label_taken")),
            "{path}: {v}"
        );
    }
    assert_eq!(
        command_count(&server, &sid).await,
        before,
        "nothing started"
    );
    let marker = server.sh(&sid, "test -e marker || echo absent").await;
    assert_eq!(marker["stdout"], "absent\n", "{marker}");
    // A command refused for its own fields takes no checkpoint.
    let (status, v) = run(&server, &sid, json!({"checkpoint": "turn-3"})).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
    assert_eq!(labels(&server, &sid).await, ["turn-2", "turn-1"]);
    // Without `checkpoint`, no checkpoint and no id.
    let (status, plain) = run(&server, &sid, json!({"command": "true"})).await;
    assert_eq!(status, 200, "{plain}");
    assert!(plain.get("checkpointId").is_none(), "{plain}");

    let (status, v) = restore(&server, &sid, &turn_1, json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(server.sh(&sid, "cat f").await["stdout"], "one\n");
    let (status, v) = restore(&server, &sid, turn_2, json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(server.sh(&sid, "cat f").await["stdout"], "two\n");
}

/// `POST /v1/sandboxes` of a fork of checkpoint `cp` of `sid`.
async fn fork(server: &TestServer, key: &str, sid: &str, cp: &str, more: Value) -> (u16, Value) {
    let mut body = json!({"sessionKey": key, "from": {"sandboxId": sid, "checkpointId": cp}});
    if let (Some(b), Some(m)) = (body.as_object_mut(), more.as_object()) {
        b.extend(m.clone());
    }
    server
        .post_within("/v1/sandboxes", body, Duration::from_secs(120))
        .await
}

#[tokio::test]
async fn a_fork_starts_as_the_checkpoint_and_the_two_then_diverge() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    let Turns {
        t2, turn_2_hash, ..
    } = three_turns(&server, &sid).await;
    let source_hash = tree_hash(&server, &sid).await;
    let key = crate::harness::unique_instance();
    let (status, made) = fork(
        &server,
        &key,
        &sid,
        id(&t2),
        json!({"network": {"mode": "none"}}),
    )
    .await;
    assert_eq!((status, &made["created"]), (200, &json!(true)), "{made}");
    let forked = made["sandboxId"].as_str().expect("sandboxId").to_string();
    assert_ne!(forked, sid);
    assert_eq!(
        tree_hash(&server, &forked).await,
        turn_2_hash,
        "the fork is turn 2"
    );
    assert_eq!(
        tree_hash(&server, &sid).await,
        source_hash,
        "the source is unchanged"
    );
    assert_eq!(labels(&server, &sid).await, ["turn-3", "turn-2", "turn-1"]);
    assert_eq!(labels(&server, &forked).await, Vec::<String>::new());
    let links = server.sh(&forked, "readlink src/docs-link entry").await;
    assert_eq!(
        links["stdout"], "../docs\nsrc/main.rs\n",
        "links stay links"
    );

    sh_ok(&server, &forked, "echo fork > only-fork && rm run.sh").await;
    sh_ok(&server, &sid, "echo source > only-source").await;
    let present = "for p in only-fork only-source run.sh; do test -e $p && echo $p; done; true";
    let f = server.sh(&forked, present).await;
    let s = server.sh(&sid, present).await;
    assert_eq!(f["stdout"], "only-fork\n", "{f}");
    assert_eq!(s["stdout"], "only-source\nrun.sh\n", "{s}");
}

/// How many containers and volumes this test's sandboxd has.
async fn engine_objects(server: &TestServer) -> (usize, usize) {
    (
        server.containers().await.len(),
        server.volumes().await.len(),
    )
}

/// Sessions with a sandbox, as the API lists them.
async fn session_keys(server: &TestServer) -> Vec<String> {
    let (status, v) = server.get("/v1/sandboxes").await;
    assert_eq!(status, 200, "{v}");
    v["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| s["sessionKey"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn a_fork_that_cannot_be_made_leaves_nothing_behind() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(
        &server,
        &sid,
        "echo a > a && head -c 300000 /dev/urandom > b",
    )
    .await;
    let cp = checkpoint(&server, &sid, "base").await;
    let (status, source) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(status, 200, "{source}");
    let source_key = source["sessionKey"]
        .as_str()
        .expect("sessionKey")
        .to_string();
    let before = engine_objects(&server).await;
    let key = crate::harness::unique_instance();
    let offline = json!({"network": {"mode": "none"}});

    let cases = [
        (
            "0123456789abcdef0123",
            id(&cp),
            &key,
            404,
            "sandbox_not_found",
        ),
        (
            sid.as_str(),
            "0123456789abcdef",
            &key,
            404,
            "checkpoint_not_found",
        ),
        (sid.as_str(), id(&cp), &source_key, 400, "invalid_request"),
    ];
    for (from, checkpoint_id, session, status, code) in cases {
        let (got, v) = fork(&server, session, from, checkpoint_id, offline.clone()).await;
        assert_eq!((got, v["code"].as_str()), (status, Some(code)), "{v}");
    }
    // The store loses an object: the copy fails after the sandbox was
    // made, and the sandbox goes.
    let object = store_dir(&server, &sid).join("objects").join(
        server.sh(&sid, "sha256sum b | cut -c1-64").await["stdout"]
            .as_str()
            .expect("stdout")
            .trim(),
    );
    std::fs::remove_file(&object).expect("remove the object");
    let (got, v) = fork(&server, &key, &sid, id(&cp), offline.clone()).await;
    assert_eq!(
        (got, v["code"].as_str()),
        (503, Some("state_write_failed")),
        "{v}"
    );
    assert!(
        server
            .log_text()
            .lines()
            .any(|l| l.contains("event=\"created\"") && l.contains(&key)),
        "the fork made a sandbox before it failed"
    );
    assert!(!session_keys(&server).await.contains(&key));
    eventually(
        Duration::from_secs(30),
        "no container or volume of the fork is left",
        || async { engine_objects(&server).await == before },
    )
    .await;
    // A checkpoint with `verify` reads every file again and stores the
    // lost content anew.
    let repaired = verified_checkpoint(&server, &sid, "repaired").await;
    assert_eq!(repaired["newBytes"], 300_000, "{repaired}");
    assert!(object.is_file(), "the lost object is back");
    let (got, v) = fork(&server, &key, &sid, id(&repaired), offline.clone()).await;
    assert_eq!((got, &v["created"]), (200, &json!(true)), "{v}");
    // The store loses its packs (the small files, many to a file), whose
    // indexes sandboxd holds in memory: `verify` trusts them no more than
    // the disk, and stores the small file anew.
    let packs = store_dir(&server, &sid).join("packs");
    let lost: Vec<PathBuf> = std::fs::read_dir(&packs)
        .expect("packs")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pack"))
        .collect();
    assert!(!lost.is_empty(), "a's content is in a pack");
    for pack in &lost {
        std::fs::remove_file(pack).expect("remove a pack");
    }
    let repacked = verified_checkpoint(&server, &sid, "repacked").await;
    assert_eq!(repacked["newBytes"], 2, "a's content again: {repacked}");
    let again = crate::harness::unique_instance();
    let (got, v) = fork(&server, &again, &sid, id(&repacked), offline).await;
    assert_eq!((got, &v["created"]), (200, &json!(true)), "{v}");
    let forked = v["sandboxId"].as_str().expect("sandboxId");
    assert_eq!(server.sh(forked, "cat a").await["stdout"], "a\n");
}

/// A client that goes away while its fork copies (the request dropped):
/// the sandbox the fork made is removed, not left with part of the
/// checkpoint. The client is cut off once the fork's sandbox was made, so
/// the copy of 200 MB is under way; a fork that answered first would make
/// this test fail, not pass.
#[tokio::test]
async fn a_fork_whose_client_goes_away_mid_copy_leaves_nothing_behind() {
    let server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(
        &server,
        &sid,
        "for i in 1 2 3 4; do head -c 50000000 /dev/urandom > big$i; done",
    )
    .await;
    let cp = checkpoint(&server, &sid, "big").await;
    let before = engine_objects(&server).await;
    let key = crate::harness::unique_instance();
    let request = {
        let (client, url) = (
            server.client.clone(),
            format!("{}/v1/sandboxes", server.base),
        );
        let body = json!({"sessionKey": key, "network": {"mode": "none"},
            "from": {"sandboxId": sid, "checkpointId": id(&cp)}});
        tokio::spawn(async move { client.post(url).json(&body).send().await })
    };
    eventually(
        Duration::from_secs(60),
        "the fork's sandbox is made",
        || async {
            server
                .log_text()
                .lines()
                .any(|l| l.contains("event=\"created\"") && l.contains(&key))
        },
    )
    .await;
    assert!(
        !request.is_finished(),
        "the fork answered before its client went away: make the workspace bigger"
    );
    request.abort();
    eventually(
        Duration::from_secs(60),
        "the cut-off fork's sandbox, container and volume are gone",
        || async {
            !session_keys(&server).await.contains(&key) && engine_objects(&server).await == before
        },
    )
    .await;
    assert!(
        server
            .log_text()
            .contains("a fork's request went away before its copy ended"),
        "removed by the fork's guard"
    );
}

#[tokio::test]
async fn checkpoints_survive_a_restart_of_sandboxd_and_of_the_sandbox() {
    let mut server = TestServer::start().await;
    let sid = server.offline_sandbox().await;
    sh_ok(&server, &sid, "mkdir d && echo kept > d/f && ln -s d/f l").await;
    let kept = tree_hash(&server, &sid).await;
    let cp = checkpoint(&server, &sid, "before").await;
    sh_ok(&server, &sid, "rm -r d l && echo new > g").await;
    assert_ne!(tree_hash(&server, &sid).await, kept);
    server.restart().await;
    assert_eq!(labels(&server, &sid).await, ["before"]);
    let (status, v) = server
        .post_within(
            &format!("/v1/sandboxes/{sid}:restart"),
            json!(null),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(labels(&server, &sid).await, ["before"]);
    let (status, v) = restore(&server, &sid, id(&cp), json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(tree_hash(&server, &sid).await, kept);
    let again = checkpoint(&server, &sid, "after").await;
    assert_eq!(
        again["newBytes"], 0,
        "the store still holds it all: {again}"
    );
}

#[tokio::test]
async fn checkpoints_and_forks_work_in_claimed_sandboxes() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_POOL_SIZE", "1")).await;
    crate::pool::wait_for_members(&server, "default", 1).await;
    let sid = server
        .create(json!({"sessionKey": crate::harness::unique_instance()}))
        .await;
    assert!(crate::pool::from_pool(&server, &sid), "a claim");
    let Turns {
        t2, turn_2_hash, ..
    } = three_turns(&server, &sid).await;
    let (status, v) = restore(&server, &sid, id(&t2), json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(tree_hash(&server, &sid).await, turn_2_hash);

    crate::pool::wait_for_members(&server, "default", 1).await;
    let key = crate::harness::unique_instance();
    let (status, made) = fork(&server, &key, &sid, id(&t2), json!({})).await;
    assert_eq!(status, 200, "{made}");
    let forked = made["sandboxId"].as_str().expect("sandboxId");
    assert!(
        crate::pool::from_pool(&server, forked),
        "the fork is a claim"
    );
    assert_eq!(tree_hash(&server, forked).await, turn_2_hash);
}
