//! The warm pool: a create for a new session claims a started sandbox. A
//! claimed sandbox is as hardened as a cold one and starts empty; other
//! resources are set live (cold under gVisor); the claim survives a crash
//! of sandboxd and nothing a sandbox writes moves it; a stopped session's
//! sandbox never comes back; bursts, capacity and a rebuilt image behave as
//! docs/API.md ("Warm pool") says; a create is handed the member being
//! made; the pool grows with demand and shrinks after quiet; fifty
//! concurrent creates from a pool of fifty are fifty claims.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bollard::query_parameters::InspectContainerOptions;
use serde_json::{Value, json};

use crate::harness::{self, ServerOptions, TestServer, eventually};

/// What the pool's gauge says of `runtime`: members ready.
pub(crate) async fn members(server: &TestServer, runtime: &str) -> usize {
    let series = format!("sandboxd_pool_members{{runtime=\"{runtime}\",state=\"ready\"}}");
    server.metric(&series).await as usize
}

/// The pool's target for `runtime`, and whether `reason` is what set it.
async fn target(server: &TestServer, runtime: &str, reason: &str) -> (usize, bool) {
    let size = server
        .metric(&format!("sandboxd_pool_target{{runtime=\"{runtime}\"}}"))
        .await;
    let holds = server
        .metric(&format!(
            "sandboxd_pool_target_reason{{runtime=\"{runtime}\",reason=\"{reason}\"}}"
        ))
        .await;
    (size as usize, holds == 1.0)
}

/// Waits until `runtime` has `n` members ready.
pub(crate) async fn wait_for_members(server: &TestServer, runtime: &str, n: usize) {
    eventually(
        Duration::from_secs(60),
        &format!("{n} pool members of {runtime}"),
        || async { members(server, runtime).await == n },
    )
    .await;
}

/// Whether the log says sandbox `sid` was created from the pool.
pub(crate) fn from_pool(server: &TestServer, sid: &str) -> bool {
    let text = server.log_text();
    let line = text
        .lines()
        .find(|l| l.contains("event=\"created\"") && l.contains(&format!("sandbox_id=\"{sid}\"")))
        .unwrap_or_else(|| panic!("no created event for {sid}"));
    line.contains("from_pool=true")
}

/// A server with a pool of `n` for the default runtime.
async fn with_pool(n: usize, more: ServerOptions) -> TestServer {
    TestServer::start_with(more.env("SANDBOXD_POOL_SIZE", &n.to_string())).await
}

#[tokio::test]
async fn a_claimed_sandbox_is_hardened_empty_and_counted() {
    let server = with_pool(
        1,
        ServerOptions::default().env("SANDBOXD_WORKSPACE_ALIASES", "/srv/workspace"),
    )
    .await;
    wait_for_members(&server, "default", 1).await;
    let sid = server.create(json!({"sessionKey": "claimed"})).await;
    assert!(from_pool(&server, &sid), "the create was a claim");

    // The engine's view: every CIS section 5 check, as for cold sandboxes.
    let info = server
        .docker
        .inspect_container(
            &server.container_name(&sid),
            None::<InspectContainerOptions>,
        )
        .await
        .expect("inspect");
    let engine = crate::security::EngineSecurity::of(&server.docker).await;
    let failed: Vec<_> = crate::security::cis_section_5()
        .into_iter()
        .filter(|(_, _, check)| !check(&info, engine))
        .map(|(id, what, _)| format!("CIS {id} {what}"))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    // From inside: the same escape attempts fail as in a cold sandbox.
    crate::security::escape_attempts_fail(&server, &sid).await;
    // Nothing in the workspace but what the escape attempts left (none
    // succeeded, so nothing), and no file of anyone before.
    let r = server
        .sh(
            &sid,
            "ls -A /workspace /srv/workspace | grep -v ':$' | grep -c . || true",
        )
        .await;
    assert_eq!(r["stdout"], "0\n", "an empty workspace: {r}");
    // The session's record: its key, and the sandbox is listed as its.
    let (s, v) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["sessionKey"], "claimed", "{v}");

    // The pool refills, and its metrics say what happened.
    wait_for_members(&server, "default", 1).await;
    let cold = server
        .create(json!({"sessionKey": "cold", "network": {"mode": "none"}}))
        .await;
    assert!(!from_pool(&server, &cold), "mode none is not the pool's");
    let text = server.metrics_text().await;
    for series in [
        "sandboxd_pool_claims_total{outcome=\"hit\"} 1",
        "sandboxd_pool_claims_total{outcome=\"miss\"} 1",
    ] {
        assert!(text.contains(series), "{series} in\n{text}");
    }
    let refills = text
        .lines()
        .find_map(|l| l.strip_prefix("sandboxd_pool_refill_duration_seconds_count "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(refills >= 2, "the first member and its refill: {text}");
}

#[tokio::test]
async fn a_claim_with_other_resources_gets_them_live_or_goes_cold_under_gvisor() {
    let server = with_pool(1, ServerOptions::default()).await;
    wait_for_members(&server, "default", 1).await;
    let sid = server
        .create(json!({"sessionKey": "big", "resources": {"vcpus": 2, "memoryMb": 2048}}))
        .await;
    let gib2 = 2048_i64 * 1024 * 1024;
    let hc = server.inspect(&sid).await.host_config.expect("host config");
    assert_eq!(hc.memory, Some(gib2));
    assert_eq!(hc.memory_swap, Some(gib2), "no swap on top");
    assert_eq!(hc.nano_cpus, Some(2_000_000_000));
    if harness::under_gvisor() {
        // runsc cannot change a running sandbox's limits.
        eprintln!("under gVisor a claim needs the pool's resources; this create was cold");
        assert!(!from_pool(&server, &sid));
        return;
    }
    assert!(from_pool(&server, &sid), "runc: claimed and updated");
    // In force from inside: the cgroup limits the sandbox's processes see.
    let r = server
        .sh(
            &sid,
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        )
        .await;
    assert_eq!(r["stdout"], format!("{gib2}\n200000\n"), "{r}");
    // A claim with the pool's own resources keeps them (the control).
    wait_for_members(&server, "default", 1).await;
    let same = server.create(json!({"sessionKey": "same"})).await;
    assert!(from_pool(&server, &same));
    let r = server
        .sh(&same, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
        .await;
    assert_eq!(r["stdout"], format!("{}\n", 1024_i64 * 1024 * 1024), "{r}");
}

#[tokio::test]
async fn a_claim_survives_a_crash_and_nothing_a_sandbox_writes_moves_another_key_to_it() {
    let mut server = with_pool(2, ServerOptions::default()).await;
    wait_for_members(&server, "default", 2).await;
    let mallory = server.create(json!({"sessionKey": "mallory"})).await;
    let alice = server.create(json!({"sessionKey": "alice"})).await;
    assert!(from_pool(&server, &mallory) && from_pool(&server, &alice));
    let (s, v) = server
        .write_files(
            &alice,
            json!([{"path": "/workspace/notes.txt", "contentBase64": "YWxpY2U="}]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    // Mallory writes alice's key everywhere it can write, in every shape
    // a record could take, then ends its own agent.
    let forge = format!(
        "for d in /workspace /tmp; do \
         printf alice > $d/.sandboxd-claim; \
         printf 'sandboxd.session_key=alice\\nsandboxd.sandbox_id={alice}\\n' > $d/labels; \
         printf '{{\"sessionKey\":\"alice\",\"sandboxId\":\"{alice}\"}}' > $d/claim.json; \
         done; cat /tmp/claim.json"
    );
    let r = server.sh(&mallory, &forge).await;
    assert!(
        r["stdout"].as_str().unwrap_or("").contains("alice"),
        "the forgeries are in place: {r}"
    );
    let _ = server
        .post(
            &format!("/v1/sandboxes/{mallory}/commands:run"),
            json!({"command": "pkill -f sandboxd-agent"}),
        )
        .await;

    server.crash_and_restart().await;
    for (key, sid) in [("alice", &alice), ("mallory", &mallory)] {
        let (s, v) = server
            .post("/v1/sandboxes", json!({"sessionKey": key}))
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            v["sandboxId"],
            json!(sid),
            "{key} reconnects to its own: {v}"
        );
        assert_eq!(v["created"], false, "{v}");
    }
    let (s, v) = server.read_file(&alice, "/workspace/notes.txt").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["contentBase64"], "YWxpY2U=", "alice's file: {v}");
    // The unclaimed members were not adopted as anyone's; new keys get
    // neither claimed sandbox.
    let eve = server.create(json!({"sessionKey": "eve"})).await;
    assert!(eve != alice && eve != mallory);
    let (s, list) = server.get("/v1/sandboxes").await;
    assert_eq!(s, 200);
    let keys: Vec<&str> = list["sandboxes"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["sessionKey"].as_str())
        .collect();
    assert_eq!(keys.len(), 3, "alice, mallory, eve and no member: {list}");
}

#[tokio::test]
async fn a_stopped_sessions_sandbox_is_never_handed_out_again() {
    let server = with_pool(1, ServerOptions::default()).await;
    wait_for_members(&server, "default", 1).await;
    let first = server.create(json!({"sessionKey": "k1"})).await;
    assert!(from_pool(&server, &first));
    server.sh(&first, "echo secret > /workspace/left.txt").await;
    let (s, v) = server
        .post(&format!("/v1/sandboxes/{first}:stop"), json!({}))
        .await;
    assert_eq!(s, 200, "{v}");
    // They go right after the answer, in the background.
    eventually(
        Duration::from_secs(20),
        "its workspace and claim are gone",
        || async {
            let volumes = server.volumes().await;
            !volumes.iter().any(|v| v.name.contains(&first))
        },
    )
    .await;
    for key in ["k2", "k1", "k3"] {
        wait_for_members(&server, "default", 1).await;
        let sid = server.create(json!({"sessionKey": key})).await;
        assert!(from_pool(&server, &sid), "{key} claimed a member");
        assert_ne!(sid, first, "{key} got a new sandbox");
        let r = server.sh(&sid, "ls -A /workspace | wc -l").await;
        assert_eq!(r["stdout"], "0\n", "{key}: nothing left from before: {r}");
    }
}

#[tokio::test]
async fn a_burst_larger_than_the_pool_gets_a_correct_sandbox_for_every_key() {
    let server = with_pool(2, ServerOptions::default()).await;
    wait_for_members(&server, "default", 2).await;
    let keys: Vec<String> = (0..10).map(|i| format!("burst-{i}")).collect();
    let answers = futures_util::future::join_all(
        keys.iter()
            .map(|k| server.post("/v1/sandboxes", json!({"sessionKey": k}))),
    )
    .await;
    let mut ids = std::collections::BTreeSet::new();
    let mut claims = 0;
    for (key, (s, v)) in keys.iter().zip(&answers) {
        assert_eq!(*s, 200, "{key}: {v}");
        assert_eq!(v["created"], true, "{v}");
        let sid = v["sandboxId"].as_str().expect("id").to_string();
        claims += usize::from(from_pool(&server, &sid));
        let (s, info) = server.get(&format!("/v1/sandboxes/{sid}")).await;
        assert_eq!(s, 200);
        assert_eq!(info["sessionKey"], json!(key), "{info}");
        ids.insert(sid);
    }
    assert_eq!(ids.len(), 10, "ten sandboxes");
    assert!(
        claims >= 2,
        "at least the two members were claimed: {claims}"
    );
    // Each works, starts empty, and its key finds it again.
    for sid in &ids {
        let r = server.sh(sid, "ls -A /workspace | wc -l").await;
        assert_eq!(r["stdout"], "0\n", "{r}");
    }
    for (key, (_, v)) in keys.iter().zip(&answers) {
        let (_, again) = server
            .post("/v1/sandboxes", json!({"sessionKey": key}))
            .await;
        assert_eq!(again["sandboxId"], v["sandboxId"], "{key}");
        assert_eq!(again["created"], false);
    }
}

#[tokio::test]
async fn members_give_way_to_sessions_at_capacity_and_come_back() {
    let server = with_pool(
        2,
        ServerOptions::default().env("SANDBOXD_MAX_CONCURRENT", "2"),
    )
    .await;
    wait_for_members(&server, "default", 2).await;
    // A claim turns a member into a session: still two in all, and the
    // pool does not grow past the host's room.
    let a = server.create(json!({"sessionKey": "a"})).await;
    assert!(from_pool(&server, &a));
    // A cold create takes the last member's room rather than evicting `a`.
    let b = server
        .create(json!({"sessionKey": "b", "network": {"mode": "none"}}))
        .await;
    assert!(!from_pool(&server, &b));
    assert_eq!(members(&server, "default").await, 0);
    let (_, list) = server.get("/v1/sandboxes").await;
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );
    assert_eq!(
        server
            .containers_with("sandboxd.role", "sandbox")
            .await
            .len(),
        2,
        "two sessions and no member"
    );
    // Sessions at capacity evict the least recently used idle one, as
    // without a pool.
    let c = server
        .create(json!({"sessionKey": "c", "network": {"mode": "none"}}))
        .await;
    let (s, _) = server.get(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(s, 404, "a was evicted for c");
    // Room again: the pool fills back to its size.
    for sid in [&b, &c] {
        let (s, v) = server
            .post(&format!("/v1/sandboxes/{sid}:stop"), json!({}))
            .await;
        assert_eq!(s, 200, "{v}");
    }
    wait_for_members(&server, "default", 2).await;
}

/// Removes an image tag when dropped, so a failed test leaves none.
struct ImageTag(String);

impl Drop for ImageTag {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", &self.0])
            .output();
    }
}

#[tokio::test]
async fn a_rebuilt_runtime_image_replaces_idle_members() {
    let instance = harness::unique_instance();
    let tag = format!("{instance}-pooled:latest");
    let _guard = ImageTag(tag.clone());
    let docker = harness::docker().await;
    let tagged = std::process::Command::new("docker")
        .args(["tag", "sandboxd-runtime:latest", &tag])
        .status()
        .expect("docker tag");
    assert!(tagged.success());
    let config = std::env::temp_dir().join(format!("{instance}-pool.toml"));
    std::fs::write(
        &config,
        format!("[runtimes.pooled]\nimage = \"{tag}\"\npool_size = 1\n"),
    )
    .expect("config");
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_CONFIG", config.to_str().expect("utf8")),
    )
    .await;
    let _ = std::fs::remove_file(&config);
    wait_for_members(&server, "pooled", 1).await;
    assert_eq!(
        members(&server, "default").await,
        0,
        "default has none here"
    );
    let before = member_images(&server).await;
    assert_eq!(before.len(), 1, "{before:?}");

    // Rebuild: the same tag names a new image (a layer on top).
    let dir = std::env::temp_dir().join(format!("{instance}-build"));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("Dockerfile"),
        format!("FROM {tag}\nLABEL rebuilt={instance}\n"),
    )
    .expect("Dockerfile");
    let built = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &tag])
        .arg(&dir)
        .output()
        .expect("docker build");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(built.status.success(), "{built:?}");
    let new_id = docker
        .inspect_image(&tag)
        .await
        .expect("inspect")
        .id
        .expect("id");
    assert_ne!(before[0].1, new_id);

    eventually(
        Duration::from_secs(60),
        "the member of the old image is replaced by one of the new",
        || async {
            let now = member_images(&server).await;
            now.len() == 1 && now[0].0 != before[0].0 && now[0].1 == new_id
        },
    )
    .await;
    wait_for_members(&server, "pooled", 1).await;
    // A claim gets the new image.
    let sid = server
        .create(json!({"sessionKey": "new", "runtime": "pooled"}))
        .await;
    assert!(from_pool(&server, &sid));
    let image = server.inspect(&sid).await.image.unwrap_or_default();
    assert_eq!(image, new_id);
}

/// The unclaimed members' containers: (name, image id).
async fn member_images(server: &TestServer) -> Vec<(String, String)> {
    let (_, list) = server.get("/v1/sandboxes").await;
    let claimed: Vec<String> = list["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s: &Value| s["sandboxId"].as_str().map(|id| server.container_name(id)))
        .collect();
    server
        .containers_with("sandboxd.pool", "member")
        .await
        .into_iter()
        .filter(|c| c.state.as_ref().map(|s| s.to_string()) == Some("running".into()))
        .filter_map(|c| {
            let name = c.names?.first()?.trim_start_matches('/').to_string();
            (!claimed.contains(&name)).then_some((name, c.image_id?))
        })
        .collect()
}

#[tokio::test]
async fn a_create_during_a_refill_is_handed_the_member_being_made() {
    let server = with_pool(1, ServerOptions::default()).await;
    wait_for_members(&server, "default", 1).await;
    let first = server.create(json!({"sessionKey": "first"})).await;
    // The refill starts once the claim has settled (100 ms); while the
    // pool makes the member that replaces the one claimed, a create
    // waits for that member instead of making a sandbox of its own beside
    // it.
    eventually(Duration::from_secs(10), "the refill under way", || async {
        server.metrics_text().await.lines().any(|l| {
            l.starts_with("sandboxd_pool_members{")
                && l.contains("state=\"filling\"")
                && l.ends_with(" 1")
        })
    })
    .await;
    let second = server.create(json!({"sessionKey": "second"})).await;
    assert!(from_pool(&server, &first), "the first create was a claim");
    assert!(
        from_pool(&server, &second),
        "the second was handed the member being made"
    );
    assert_ne!(first, second);
    let text = server.metrics_text().await;
    for series in [
        "sandboxd_pool_claims_total{outcome=\"hit\"} 2",
        "sandboxd_pool_handoffs_total{outcome=\"claimed\"} 1",
    ] {
        assert!(text.contains(series), "{series} in\n{text}");
    }
    assert!(!text.contains("outcome=\"miss\""), "no cold create: {text}");
    let r = server
        .sh(&second, "echo ok; ls -A /workspace | wc -l")
        .await;
    assert_eq!(r["stdout"], "ok\n0\n", "it works and starts empty: {r}");
    let (s, v) = server.get(&format!("/v1/sandboxes/{second}")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["sessionKey"], "second", "{v}");
}

#[tokio::test]
async fn an_adaptive_pool_grows_under_a_burst_and_shrinks_after_quiet() {
    let server = with_pool(
        1,
        ServerOptions::default()
            .env("SANDBOXD_POOL_MAX", "3")
            .env("SANDBOXD_POOL_RATE_HALFLIFE_SECS", "4")
            // Mode none: the cheapest sandboxes, members and creates alike.
            .env("SANDBOXD_NETWORK_DEFAULT", "none")
            .env("SANDBOXD_MAX_CONCURRENT", "100"),
    )
    .await;
    wait_for_members(&server, "default", 1).await;
    assert_eq!(
        target(&server, "default", "floor").await,
        (1, true),
        "before the burst: the floor"
    );
    // The burst: three clients create new sessions back to back for two
    // half-lives.
    let until = Instant::now() + Duration::from_secs(8);
    let clients = (0..3).map(|c| {
        let server = &server;
        async move {
            let mut n = 0;
            while Instant::now() < until {
                server
                    .create(json!({"sessionKey": format!("burst-{c}-{n}")}))
                    .await;
                n += 1;
            }
            n
        }
    });
    let made: usize = futures_util::future::join_all(clients)
        .await
        .into_iter()
        .sum();
    eprintln!("{made} creates in the burst");
    eventually(
        Duration::from_secs(30),
        "the pool grows above its floor",
        || async { members(&server, "default").await >= 2 },
    )
    .await;
    // Why, in the log: the rule's inputs with the target they gave.
    let log = server.log_text();
    let grew = log
        .lines()
        .find(|l| {
            l.contains("pool target changed")
                && (l.contains("reason=\"demand\"") || l.contains("reason=\"ceiling\""))
        })
        .unwrap_or_else(|| panic!("no growth logged in\n{log}"));
    eprintln!("{grew}");
    for input in [
        "rate_per_sec=",
        "refill_ms=",
        "floor=1",
        "ceiling=3",
        "memory_budget_mb=512",
        "member_cost_mb=32",
        "room=",
        "target=",
    ] {
        assert!(grew.contains(input), "{input} in {grew}");
    }
    // Quiet: the rate decays, the target falls back to the floor and the
    // members above it go.
    eventually(
        Duration::from_secs(60),
        "the pool shrinks back to its floor",
        || async {
            target(&server, "default", "floor").await == (1, true)
                && members(&server, "default").await == 1
        },
    )
    .await;
    let log = server.log_text();
    assert!(
        log.contains("the pool shrank to its target"),
        "a member was removed for the lower target"
    );
}

#[tokio::test]
async fn fifty_concurrent_creates_from_a_pool_of_fifty_are_fifty_distinct_claims() {
    let server = with_pool(
        50,
        ServerOptions::default()
            .env("SANDBOXD_MAX_CONCURRENT", "50")
            // Mode none keeps filling fifty members light on the engine;
            // claims are the same in every mode.
            .env("SANDBOXD_NETWORK_DEFAULT", "none"),
    )
    .await;
    eventually(Duration::from_secs(300), "a pool of 50", || async {
        members(&server, "default").await == 50
    })
    .await;
    let pooled: BTreeSet<String> = member_images(&server)
        .await
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(pooled.len(), 50, "{pooled:?}");
    let keys: Vec<String> = (0..50).map(|i| format!("many-{i}")).collect();
    let server = &server;
    let answers = futures_util::future::join_all(keys.iter().map(|k| async move {
        let started = Instant::now();
        let answer = server.post("/v1/sandboxes", json!({"sessionKey": k})).await;
        (answer, started.elapsed())
    }))
    .await;
    let mut ids = BTreeSet::new();
    let mut took: Vec<Duration> = Vec::new();
    for (key, ((s, v), t)) in keys.iter().zip(&answers) {
        assert_eq!(*s, 200, "{key}: {v}");
        assert_eq!(v["created"], true, "{v}");
        let sid = v["sandboxId"].as_str().expect("id").to_string();
        assert!(from_pool(server, &sid), "{key} claimed");
        assert!(
            pooled.contains(&server.container_name(&sid)),
            "{key} got one of the members"
        );
        ids.insert(sid);
        took.push(*t);
    }
    assert_eq!(ids.len(), 50, "fifty distinct sandboxes");
    took.sort();
    eprintln!(
        "50 concurrent claims: p50 {:?}, p99 {:?}",
        took[24], took[49]
    );
    let text = server.metrics_text().await;
    assert!(
        text.contains("sandboxd_pool_claims_total{outcome=\"hit\"} 50"),
        "{text}"
    );
    assert!(!text.contains("outcome=\"miss\""), "no cold create: {text}");
    for (key, ((_, v), _)) in keys.iter().zip(&answers) {
        let sid = v["sandboxId"].as_str().expect("id");
        let (s, info) = server.get(&format!("/v1/sandboxes/{sid}")).await;
        assert_eq!(s, 200, "{info}");
        assert_eq!(info["sessionKey"], json!(key), "each its own: {info}");
    }
    // Clean up: every session stopped, nothing of theirs left.
    let stops = futures_util::future::join_all(ids.iter().map(|sid| async move {
        server
            .post(&format!("/v1/sandboxes/{sid}:stop"), json!({}))
            .await
    }))
    .await;
    for (s, v) in stops {
        assert_eq!(s, 200, "{v}");
    }
    let left: Vec<String> = server
        .containers_with("sandboxd.role", "sandbox")
        .await
        .into_iter()
        .filter_map(|c| c.names?.first().cloned())
        .filter(|n| ids.iter().any(|id| n.contains(id.as_str())))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
