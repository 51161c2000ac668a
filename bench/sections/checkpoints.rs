//! The checkpoints section (issue 42, `--only checkpoints`), on a sandboxd
//! of its own: no warm pool, its state (so its checkpoint store) in a
//! directory of the bench's own under target/, and the checkpoint and
//! workspace limits written out at their defaults, which hold this
//! workspace (see [`CONFIG`]). One sandbox (network `none`) gets a
//! `node_modules`-shaped tree made by one Python command in it: 20,000
//! files of distinct pseudo-random content (seeded, so every run has the
//! same tree) in nested package directories, 19,980 small ones (1–19 KiB)
//! and 20 large ones (about 15 MB each), 500,000,000 bytes in all. Each
//! request is timed from sending it to the end of its answer, and each
//! answer is checked, so that a path that broke fails the run instead of
//! giving a fast figure:
//! - first checkpoint: its throughput (the workspace's bytes over the
//!   time), one sample a run (it takes minutes at the time of writing);
//!   floor column: `tar cf - . | wc -c` in the workspace by `commands:run`
//!   just before it (into a pipe: GNU tar skips reading files when its
//!   archive is /dev/null; `wc` must count at least the workspace's
//!   bytes). The checkpoint must hold 20,000 files and their 500,000,000
//!   bytes, all stored anew.
//! - next checkpoint: 20 rounds of 10 files rewritten (10,000 new bytes
//!   each) and a checkpoint, which must hold 20,000 files and have stored
//!   exactly the 100,000 new bytes; floor column: the first checkpoint.
//! - diff of each two checkpoints in a row: the counts must be exactly the
//!   10 modified paths the round rewrote, by name.
//! - store: `du -sb` (apparent bytes) of the sandbox's store directory
//!   after those 21 checkpoints; floor column: the workspace's bytes plus
//!   the 2,000,000 bytes the rounds wrote.
//! - restore across 10 changed files: checkpoint 19 and 20 in turn, 10
//!   samples; each answer must name the last round's 10 paths as
//!   modified, and their SHA-256 in the sandbox must then be the
//!   checkpoint's.
//! - restore of the whole workspace: `rm -rf node_modules`, then a restore
//!   of checkpoint 20, whose answer must count every file and directory
//!   created; then the sandbox must hold 20,000 files with the
//!   checkpoint's bytes. During it, and during each restore before it,
//!   sandboxd's VmRSS is read every 2 ms on a thread of its own: the line
//!   is the peak less the reading just before the request (a note gives
//!   the 10-file restores' highest). Its target, 64 MB: a restore holds
//!   one write of at most 32 MiB of small files at a time (larger files
//!   are streamed from the store) and the two trees of 20,000 entries.
//! - fork: `POST /v1/sandboxes` with `"from"` checkpoint 20, 3 samples (the
//!   fork must hold the 20,000 files and bytes and the last round's
//!   content; it is stopped after); floor column: a cold create through
//!   the same sandboxd (no pool, the same body without `from`) plus `cp -a`
//!   of the tree to another directory of the source sandbox's workspace by
//!   `commands:run` (removed after), alternating which goes first. Each
//!   sample starts on a quiet machine (`requests::quiet`).
//!
//! MB is 10^6 bytes in the throughput and store lines (the workspace is
//! 500 of them), 2^20 in the memory line, as in the other RSS lines.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::floor::Floor;
use crate::report::{Line, RunFigures, line, ratio_at_most};
use crate::requests::{create_sandbox, id_of, quiet, stop};
use crate::support::{Instance, Res, Server, ms, rss_kb_of};

const FIRST: &str = "checkpoints: first checkpoint of a 500 MB, 20,000-file workspace (MB/s; floor column: `tar cf - .` of it into `wc -c` in the sandbox)";
const NEXT: &str =
    "checkpoints: next checkpoint, 10 files changed, p50 (ms; floor column: the first checkpoint)";
const DIFF: &str = "checkpoints: diff of two checkpoints, 10 files changed, p50 (ms)";
const RESTORE: &str = "checkpoints: restore across 10 changed files p50 (ms)";
const FORK: &str = "checkpoints: fork of the 500 MB workspace into a new sandbox p50 (ms; floor column: a cold create + `cp -a` of the tree)";
const STORE: &str = "checkpoints: store after the first + 20 checkpoints of 10 files changed each (MB; floor column: the workspace + the changed bytes)";
const RESTORE_ALL: &str = "checkpoints: restore of the whole 500 MB into an emptied workspace (ms)";
const RESTORE_RSS: &str = "checkpoints: sandboxd's RSS rise during that restore (MB)";

pub(crate) const LINES: &[Line] = &[
    line(
        FIRST,
        "≥ 0.5× `tar` (floor column)",
        Some(|v, f| f.is_some_and(|f| v >= 0.5 * f)),
    ),
    line(
        NEXT,
        "≤ 200 ms and ≤ 0.1× the first (floor column)",
        Some(|v, f| v <= 200.0 && ratio_at_most(v, f, 0.1)),
    ),
    line(RESTORE, "≤ 200 ms", Some(|v, _| v <= 200.0)),
    line(DIFF, "≤ 50 ms", Some(|v, _| v <= 50.0)),
    line(
        FORK,
        "≤ 2× floor column",
        Some(|v, f| ratio_at_most(v, f, 2.0)),
    ),
    line(
        STORE,
        "≤ 1.05× floor column",
        Some(|v, f| ratio_at_most(v, f, 1.05)),
    ),
    line(RESTORE_ALL, "report", None),
    line(RESTORE_RSS, "≤ 64 MB", Some(|v, _| v <= 64.0)),
];

/// A MB of the workspace's bytes (its throughput, the store).
const MB: f64 = 1_000_000.0;
/// The workspace: files, their bytes, of them large.
const FILES: u64 = 20_000;
const WORKSPACE_BYTES: u64 = 500_000_000;
const LARGE_FILES: u64 = 20;
/// Files each round rewrites, and the bytes of each.
const CHANGED_FILES: usize = 10;
const CHANGED_BYTES: u64 = 10_000;
/// Checkpoints after the first, one a round.
const ROUNDS: usize = 20;
/// Samples of the 10-file restore, and of the fork (and its floor).
const RESTORES: usize = 10;
const FORKS: usize = 3;
/// `timeoutMs` of the commands that make, read or copy the tree.
const LONG_MS: u64 = 600_000;

/// The run's sandboxd: no warm pool, so a fork and its floor's create are
/// both cold; the rest are the defaults, written out because they decide
/// whether this workspace fits (no workspace size limit, files up to 1
/// GiB, 100 checkpoints, 4 GiB of store, 200,000 entries). `{state}` is
/// its state directory.
const CONFIG: &str = "pool_size = 0\n\
     state_dir = \"{state}\"\n\
     workspace_size_mb = 0\n\
     file_size_limit_mb = 1024\n\
     checkpoint_max_count = 100\n\
     checkpoint_max_store_bytes = 4294967296\n\
     checkpoint_max_entries = 200000\n";

/// Makes the tree (`make`) or rewrites a round's files (`change R`),
/// printing `FILES BYTES DIRS`, or per file `PATH OLD_SHA256 NEW_SHA256`.
/// Its arguments: files, bytes, large files, files a round changes, their
/// bytes, then the mode.
const TREE_PY: &str = r#"
import hashlib, os, random, sys
files, total, large_files, changed, changed_bytes = map(int, sys.argv[1:6])

def path(i):
    p = i // 50
    sub = ("lib", "dist", "src/util", "node_modules/dep-%d/lib" % (p % 7), "types")[i % 5]
    return "node_modules/@scope-%d/pkg-%d/%s/f%d.js" % (p % 20, p, sub, i)

def large(i):
    return i % (files // large_files) == files // large_files - 1

def write(i, data):
    os.makedirs(os.path.dirname(path(i)), exist_ok=True)
    with open(path(i), "wb") as f:
        f.write(data)

if sys.argv[6] == "make":
    rng = random.Random(42)
    sizes = [1024 + i * 7919 % 18432 for i in range(files)]
    rest = total - sum(s for i, s in enumerate(sizes) if not large(i))
    big = [i for i in range(files) if large(i)]
    for n, i in enumerate(big):
        sizes[i] = rest // len(big) + (rest % len(big) if n == len(big) - 1 else 0)
    for i in range(files):
        write(i, rng.randbytes(sizes[i]))
    print(files, sum(sizes), sum(len(d) for _, d, _ in os.walk(".")))
else:
    r = int(sys.argv[7])
    for k in range(changed):
        n = r * changed + k
        i = n * 7919 % files
        if large(i):
            i -= 1
        data = random.Random(1000000 + n).randbytes(changed_bytes)
        with open(path(i), "rb") as f:
            old = hashlib.sha256(f.read()).hexdigest()
        write(i, data)
        print(path(i), old, hashlib.sha256(data).hexdigest())
"#;

/// A file a round rewrote: its path and SHA-256 before and after.
struct Changed {
    path: String,
    before: String,
    after: String,
}

/// See the module docs.
pub(crate) async fn measure(floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    let name = format!("{}-checkpoints", floor.instance);
    // Declared first, dropped last: after the sandboxd using it.
    let state = StateDir(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/bench-state")
            .join(&name),
    );
    let config = CONFIG.replace("{state}", &state.0.display().to_string());
    let own = Instance::start(&floor.docker, &name, &config, 100).await?;
    let server = &own.server;
    let sid = create_sandbox(
        server,
        json!({"sessionKey": "checkpoints", "network": {"mode": "none"}}),
    )
    .await?;
    let made = tree(server, &sid, &["make"]).await?;
    let counts: Vec<u64> = made
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    let [files, bytes, dirs] = counts[..] else {
        return Err(format!("checkpoints: the tree script printed {made:?}").into());
    };
    if (files, bytes) != (FILES, WORKSPACE_BYTES) {
        return Err(format!("checkpoints: the tree script made {made:?}").into());
    }

    let first = first_checkpoint(server, &sid, fig).await?;
    let first_ms = first.1;
    let mut cps = vec![first];
    let mut rounds: Vec<Vec<Changed>> = Vec::new();
    let mut next = Vec::new();
    for r in 1..=ROUNDS {
        rounds.push(change(server, &sid, r).await?);
        let (took, v) = timed(server.post(&checkpoints_of(&sid), json!({}))).await?;
        let new_bytes = CHANGED_FILES as u64 * CHANGED_BYTES;
        if v["files"] != FILES || v["newBytes"] != new_bytes {
            return Err(format!(
                "checkpoints: round {r}'s checkpoint is not {FILES} files with {new_bytes} new bytes: {v}"
            )
            .into());
        }
        next.push(took);
        let bytes = v["bytes"].as_u64().ok_or("checkpoints: no bytes")?;
        cps.push((id_of(&v, "checkpointId")?, took, bytes));
    }
    fig.p50(NEXT, &next, &[first_ms]);

    let mut diffs = Vec::new();
    for (k, changed) in rounds.iter().enumerate() {
        let route = format!(
            "{}/{}/diff?to={}",
            checkpoints_of(&sid),
            cps[k].0,
            cps[k + 1].0
        );
        let (took, v) = timed(server.get(&route)).await?;
        ten_modified(&v, changed, &format!("the diff of round {}", k + 1))?;
        diffs.push(took);
    }
    fig.p50(DIFF, &diffs, &[]);

    store_size(&state.0, &name, &sid, fig)?;

    let last = &cps[ROUNDS];
    let before_last = &cps[ROUNDS - 1];
    let last_round = &rounds[ROUNDS - 1];
    let pid = server.child.id();
    let mut restores = Vec::new();
    let mut rises = Vec::new();
    for i in 0..RESTORES {
        let back = i % 2 == 0;
        let to = if back { before_last } else { last };
        let (took, rise, v) = restore(server, &sid, &to.0, pid).await?;
        ten_modified(&v, last_round, "a restore")?;
        let expected: Vec<&str> = last_round
            .iter()
            .map(|c| if back { &c.before } else { &c.after }.as_str())
            .collect();
        same_content(server, &sid, last_round, &expected).await?;
        restores.push(took);
        rises.push(rise);
    }
    fig.p50(RESTORE, &restores, &[]);
    fig.note(format!(
        "checkpoints: sandboxd's RSS rise during the 10-file restores: at most {:.2} MB",
        rises.iter().copied().fold(0.0, f64::max)
    ));

    sh(server, &sid, "rm -rf node_modules").await?;
    let (took, rise, v) = restore(server, &sid, &last.0, pid).await?;
    if v["counts"] != json!({"created": files + dirs, "modified": 0, "deleted": 0}) {
        return Err(format!(
            "checkpoints: the whole restore did not create {files} files and {dirs} directories: {}",
            v["counts"]
        )
        .into());
    }
    let last_bytes = last.2;
    tree_is(server, &sid, "node_modules", last_bytes).await?;
    let after: Vec<&str> = last_round.iter().map(|c| c.after.as_str()).collect();
    same_content(server, &sid, last_round, &after).await?;
    fig.value(RESTORE_ALL, took, None);
    fig.value(RESTORE_RSS, rise, None);

    forks(
        server,
        floor,
        &name,
        &sid,
        (&last.0, last_bytes),
        last_round,
        fig,
    )
    .await
}

/// A checkpoint: its id, how long it took (ms) and its bytes.
type Taken = (String, f64, u64);

/// `tar` of the workspace, then its first checkpoint, one sample each (a
/// first checkpoint of this tree takes minutes at the time of writing:
/// the line is the median over the runs).
async fn first_checkpoint(server: &Server, sid: &str, fig: &mut RunFigures) -> Res<Taken> {
    let mb = WORKSPACE_BYTES as f64 / MB;
    let (tar, out) = timed(sh(server, sid, "set -o pipefail; tar cf - . | wc -c")).await?;
    let read: u64 = out.trim().parse().unwrap_or(0);
    if read < WORKSPACE_BYTES {
        return Err(format!("checkpoints: tar gave {read} bytes").into());
    }
    let (took, v) = timed(server.post(&checkpoints_of(sid), json!({}))).await?;
    if v["files"] != FILES || v["bytes"] != WORKSPACE_BYTES || v["newBytes"] != WORKSPACE_BYTES {
        return Err(format!(
            "checkpoints: the first checkpoint is not {FILES} files of {WORKSPACE_BYTES} bytes, all new: {v}"
        )
        .into());
    }
    fig.p50(FIRST, &[mb / (took / 1000.0)], &[mb / (tar / 1000.0)]);
    fig.note(format!(
        "checkpoints: the first checkpoint took {took:.0} ms, tar {tar:.0} ms"
    ));
    Ok((id_of(&v, "checkpointId")?, took, WORKSPACE_BYTES))
}

/// The store's apparent size after the first + [`ROUNDS`] checkpoints.
fn store_size(state: &Path, instance: &str, sid: &str, fig: &mut RunFigures) -> Res<()> {
    let dir = state.join("checkpoints").join(instance).join(sid);
    let du = |args: &[&str], at: &Path| -> Res<f64> {
        let out = std::process::Command::new("du")
            .args(args)
            .arg(at)
            .output()?;
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<f64>().ok())
            .filter(|_| out.status.success())
            .ok_or_else(|| format!("checkpoints: du {args:?} {} failed", at.display()).into())
    };
    let apparent = du(&["-sb"], &dir)?;
    let manifests = du(&["-sb"], &dir.join("manifests"))?;
    let trees = du(&["-sb"], &dir.join("trees"))?;
    let allocated = du(&["-sk"], &dir)? * 1024.0;
    let written = WORKSPACE_BYTES + (ROUNDS * CHANGED_FILES) as u64 * CHANGED_BYTES;
    fig.value(STORE, apparent / MB, Some(written as f64 / MB));
    fig.note(format!(
        "checkpoints: the store's manifests {:.1} MB and trees of entries {:.1} MB of it; on disk (du -sk) {:.1} MB",
        manifests / MB,
        trees / MB,
        allocated / MB
    ));
    Ok(())
}

/// The forks and their floor, alternating which goes first.
async fn forks(
    server: &Server,
    floor: &Floor,
    instance: &str,
    sid: &str,
    (cp, bytes): (&str, u64),
    last_round: &[Changed],
    fig: &mut RunFigures,
) -> Res<()> {
    let after: Vec<&str> = last_round.iter().map(|c| c.after.as_str()).collect();
    let (mut forked, mut floors) = (Vec::new(), Vec::new());
    for i in 0..FORKS {
        for fork in [i % 2 == 0, i % 2 == 1] {
            quiet(server, &floor.docker, instance).await?;
            if fork {
                let body = json!({
                    "sessionKey": format!("checkpoints-fork-{i}"),
                    "network": {"mode": "none"},
                    "from": {"sandboxId": sid, "checkpointId": cp},
                });
                let (took, v) = timed(server.post("/v1/sandboxes", body)).await?;
                let id = id_of(&v, "sandboxId")?;
                tree_is(server, &id, "node_modules", bytes).await?;
                same_content(server, &id, last_round, &after).await?;
                stop(server, &id).await?;
                forked.push(took);
            } else {
                let body = json!({
                    "sessionKey": format!("checkpoints-cold-{i}"),
                    "network": {"mode": "none"},
                });
                let (create, v) = timed(server.post("/v1/sandboxes", body)).await?;
                let (copy, _) = timed(sh(server, sid, "cp -a node_modules .floor-copy")).await?;
                tree_is(server, sid, ".floor-copy", bytes).await?;
                sh(server, sid, "rm -rf .floor-copy").await?;
                stop(server, &id_of(&v, "sandboxId")?).await?;
                floors.push(create + copy);
            }
        }
    }
    fig.p50(FORK, &forked, &floors);
    Ok(())
}

/// `POST …:restore` of checkpoint `cp`, with sandboxd's RSS (`pid`)
/// sampled meanwhile: (ms, RSS rise in MB, the answer).
async fn restore(server: &Server, sid: &str, cp: &str, pid: u32) -> Res<(f64, f64, Value)> {
    let route = format!("{}/{cp}:restore", checkpoints_of(sid));
    let before = rss_kb_of(pid);
    // A reading of 0 is /proc failing, not a small sandboxd: a rise
    // from it would be no measurement at all.
    if before == 0 {
        return Err(format!("checkpoints: cannot read the RSS of sandboxd (pid {pid})").into());
    }
    let watch = RssPeak::watch(pid);
    let (took, v) = timed(server.post(&route, json!({}))).await?;
    let peak = watch.peak_kb()?;
    Ok((took, peak.saturating_sub(before) as f64 / 1024.0, v))
}

/// Checks that a diff (or a restore's answer) is exactly `changed`
/// modified.
fn ten_modified(v: &Value, changed: &[Changed], what: &str) -> Res<()> {
    let counts = json!({"created": 0, "modified": changed.len(), "deleted": 0});
    let mut paths: Vec<&str> = v["modified"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["path"].as_str()).collect())
        .unwrap_or_default();
    paths.sort_unstable();
    let mut expected: Vec<&str> = changed.iter().map(|c| c.path.as_str()).collect();
    expected.sort_unstable();
    if v["counts"] != counts || paths != expected {
        return Err(format!("checkpoints: {what} is not {expected:?} modified: {v}").into());
    }
    Ok(())
}

/// Checks, in the sandbox, that the files of `changed` hold the content
/// of SHA-256 `expected` (in their order).
async fn same_content(
    server: &Server,
    sid: &str,
    changed: &[Changed],
    expected: &[&str],
) -> Res<()> {
    let paths: Vec<&str> = changed.iter().map(|c| c.path.as_str()).collect();
    let out = sh(server, sid, &format!("sha256sum {}", paths.join(" "))).await?;
    let got: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if got != expected {
        return Err(format!("checkpoints: {paths:?} hold {got:?}, not {expected:?}").into());
    }
    Ok(())
}

/// Checks that directory `dir` of the workspace holds [`FILES`] files of
/// `bytes` in all.
async fn tree_is(server: &Server, sid: &str, dir: &str, bytes: u64) -> Res<()> {
    let script = format!(
        "find {dir} -type f -printf '%s\\n' | awk '{{n++; s+=$1}} END {{printf \"%d %d\\n\", n, s}}'"
    );
    let out = sh(server, sid, &script).await?;
    if out.trim() != format!("{FILES} {bytes}") {
        return Err(format!("checkpoints: {dir} in {sid} holds {out:?} (files, bytes)").into());
    }
    Ok(())
}

/// Round `r`'s rewrite of [`CHANGED_FILES`] files.
async fn change(server: &Server, sid: &str, r: usize) -> Res<Vec<Changed>> {
    let out = tree(server, sid, &["change", &r.to_string()]).await?;
    let changed: Vec<Changed> = out
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().map(str::to_string);
            Some(Changed {
                path: words.next()?,
                before: words.next()?,
                after: words.next()?,
            })
        })
        .collect();
    if changed.len() != CHANGED_FILES || changed.iter().any(|c| c.before == c.after) {
        return Err(format!("checkpoints: round {r} printed {out:?}").into());
    }
    Ok(changed)
}

/// [`TREE_PY`] in the sandbox with `mode`: its stdout.
async fn tree(server: &Server, sid: &str, mode: &[&str]) -> Res<String> {
    let mut args = vec!["-c".to_string(), TREE_PY.to_string()];
    args.extend(
        [FILES, WORKSPACE_BYTES, LARGE_FILES]
            .iter()
            .chain(&[CHANGED_FILES as u64, CHANGED_BYTES])
            .map(u64::to_string),
    );
    args.extend(mode.iter().map(|m| m.to_string()));
    let body = json!({"cmd": "python3", "args": args, "login": false, "timeoutMs": LONG_MS});
    ok_stdout(server, sid, body).await
}

/// `commands:run` of `script` (bash, no login profile), which must exit
/// 0: its stdout.
async fn sh(server: &Server, sid: &str, script: &str) -> Res<String> {
    let body = json!({"command": script, "login": false, "timeoutMs": LONG_MS});
    ok_stdout(server, sid, body).await
}

async fn ok_stdout(server: &Server, sid: &str, body: Value) -> Res<String> {
    let v = server
        .post(&format!("/v1/sandboxes/{sid}/commands:run"), body)
        .await?;
    if v["exitCode"] != 0 {
        return Err(format!("checkpoints: a command failed: {v}").into());
    }
    Ok(v["stdout"].as_str().unwrap_or_default().to_string())
}

fn checkpoints_of(sid: &str) -> String {
    format!("/v1/sandboxes/{sid}/checkpoints")
}

/// `request` timed from sending it to its answer: (ms, the answer).
async fn timed<T>(request: impl std::future::Future<Output = Res<T>>) -> Res<(f64, T)> {
    let t = Instant::now();
    let answer = request.await?;
    Ok((ms(t.elapsed()), answer))
}

/// The bench's state directory for its sandboxd, removed when dropped.
struct StateDir(PathBuf);

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The peak VmRSS of a process, read every 2 ms on a thread of its own
/// until [`RssPeak::peak_kb`] (or a drop) stops it.
struct RssPeak {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl RssPeak {
    fn watch(pid: u32) -> RssPeak {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = rss_kb_of(pid);
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
                peak = peak.max(rss_kb_of(pid));
            }
            peak
        });
        RssPeak {
            stop,
            thread: Some(thread),
        }
    }

    /// The peak, in kB.
    fn peak_kb(mut self) -> Res<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join())
            .ok_or("checkpoints: the RSS sampler was stopped before")?
            .map_err(|_| "checkpoints: the RSS sampler panicked".into())
    }
}

impl Drop for RssPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
