//! Faults short of an engine restart: sandboxd killed mid-command or right
//! after a stop answered, many clients creating, stopping and running in
//! one session at once, a container and its volume removed behind
//! sandboxd's back, and an open request that outlasts the idle TTL. (Stopped containers and a missing
//! image are in `sandboxes`, an engine that appears late in `engine`, an
//! engine restart in `engine_restart`.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{self, TestServer};

#[tokio::test]
async fn sandboxd_killed_mid_command_finds_it_still_running() {
    let mut server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "crash", "network": {"mode": "none"}}))
        .await;
    let (_, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands"),
            json!({"command": "sleep 6161", "timeoutMs": 600000}),
        )
        .await;
    let cid = v["commandId"].as_str().expect("cid").to_string();
    harness::eventually(Duration::from_secs(5), "the command runs", || async {
        let (code, out) = server.docker_exec(&sid, "ps -eo args").await;
        code == 0 && out.lines().any(|l| l.trim() == "sleep 6161")
    })
    .await;
    server.crash_and_restart().await;
    let (s, body) = server
        .post("/v1/sandboxes", json!({"sessionKey": "crash"}))
        .await;
    assert_eq!(
        (s, body),
        (200, json!({"sandboxId": sid, "created": false}))
    );
    let (_, list) = server.get(&format!("/v1/sandboxes/{sid}/commands")).await;
    let entry = list["commands"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["commandId"] == json!(cid)).cloned())
        .expect("listed");
    assert_eq!(entry["state"], "running", "{list}");
    assert_eq!(entry["summary"], "sleep 6161");
    server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{cid}:kill"),
            json!(null),
        )
        .await;
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/commands/{cid}/wait"))
        .await;
    assert_eq!(
        (s, v["exitCode"].clone(), v["killed"].clone()),
        (200, json!(143), json!(true)),
        "{v}"
    );
    let (_, out) = server.docker_exec(&sid, "ps -eo args").await;
    assert!(
        !out.lines().any(|l| l.trim() == "sleep 6161"),
        "killed: {out}"
    );
    // Nothing else was left: one sandbox container, one volume.
    assert_eq!(server.containers().await.len(), 1);
    assert_eq!(server.volumes().await.len(), 1);
}

/// Eight clients create, stop, run, write and look up the sandbox of one
/// session key at once. Every create succeeds: the one 429 a create can
/// earn is `at_capacity`, when `max_concurrent` (20) sandboxes exist and
/// all are busy, and creates and stops of one key take its lock one at a
/// time, so this key never holds more than one sandbox (network mode
/// `none` needs no link block either). The other calls succeed, or find
/// the sandbox stopped by another client meanwhile (404
/// `sandbox_not_found`); each kind must have succeeded at least once, so
/// the storm did more than fail fast.
#[tokio::test]
async fn interleaved_calls_for_one_key_leave_engine_and_registry_agreeing() {
    let server = TestServer::start().await;
    // Eight seconds of storm, and on until every kind of call has
    // succeeded once (a run, say, is often beaten by another client's
    // stop, so stops end with the eight seconds), at most 30 s.
    let (deadline, hard) = (
        Instant::now() + Duration::from_secs(8),
        Instant::now() + Duration::from_secs(30),
    );
    // Successes by call: create, stop, run, write, get.
    let done: [AtomicU32; 5] = Default::default();
    let more = |done: &[AtomicU32; 5]| {
        let now = Instant::now();
        now < deadline || (now < hard && done.iter().any(|d| d.load(Ordering::Relaxed) == 0))
    };
    let gone = |what: &str, s: u16, v: &serde_json::Value| {
        assert_eq!(
            (s, v["code"].as_str()),
            (404, Some("sandbox_not_found")),
            "{what}: neither done nor the sandbox gone: {v}"
        );
    };
    let client = |n: usize| {
        let (server, done, more) = (&server, &done, &more);
        async move {
            let mut i = n;
            while more(done) {
                i += 1;
                let (s, v) = server
                    .post(
                        "/v1/sandboxes",
                        json!({"sessionKey": "storm", "network": {"mode": "none"}}),
                    )
                    .await;
                assert_eq!(s, 200, "create: {v}");
                done[0].fetch_add(1, Ordering::Relaxed);
                let id = v["sandboxId"].as_str().expect("sandboxId").to_string();
                // Past the eight seconds, stops give way to runs: under
                // gVisor a fresh sandbox's first command can take longer
                // than the gap between two clients' stops, so a kind
                // still at zero would otherwise wait out the 30 s.
                let kind = match i % 4 {
                    0 if Instant::now() >= deadline => 1,
                    k => k,
                };
                match kind {
                    0 => {
                        let (s, v) = server
                            .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
                            .await;
                        assert_eq!(s, 200, "stop: {v}");
                        done[1].fetch_add(1, Ordering::Relaxed);
                    }
                    1 => {
                        let (s, v) = server
                            .post(
                                &format!("/v1/sandboxes/{id}/commands:run"),
                                json!({"command": "echo ran"}),
                            )
                            .await;
                        if s == 200 {
                            assert_eq!(
                                (&v["exitCode"], &v["stdout"]),
                                (&json!(0), &json!("ran\n")),
                                "run: {v}"
                            );
                            done[2].fetch_add(1, Ordering::Relaxed);
                        } else {
                            gone("run", s, &v);
                        }
                    }
                    2 => {
                        let (s, v) = server
                            .post(
                                &format!("/v1/sandboxes/{id}/files:write"),
                                json!({"files": [{"path": "x", "contentBase64": "eA=="}]}),
                            )
                            .await;
                        if s == 200 {
                            assert_eq!(v, json!({"ok": true}), "write");
                            done[3].fetch_add(1, Ordering::Relaxed);
                        } else {
                            gone("write", s, &v);
                        }
                    }
                    _ => {
                        let (s, v) = server.get(&format!("/v1/sandboxes/{id}")).await;
                        if s == 200 {
                            assert_eq!(v["sandboxId"], json!(id), "get: {v}");
                            done[4].fetch_add(1, Ordering::Relaxed);
                        } else {
                            gone("get", s, &v);
                        }
                    }
                }
            }
        }
    };
    futures_util::future::join_all((0..8).map(client)).await;
    let done = done.map(AtomicU32::into_inner);
    eprintln!("succeeded: create, stop, run, write, get = {done:?}");
    for (n, what) in done.iter().zip(["create", "stop", "run", "write", "get"]) {
        assert!(*n > 0, "no {what} succeeded in the storm: {done:?}");
    }
    // Settle: one last create, then compare the engine with the registry.
    let id = server
        .create(json!({"sessionKey": "storm", "network": {"mode": "none"}}))
        .await;
    let (_, list) = server.get("/v1/sandboxes").await;
    let listed: Vec<&str> = list["sandboxes"]
        .as_array()
        .expect("list")
        .iter()
        .map(|s| s["sandboxId"].as_str().expect("id"))
        .collect();
    assert_eq!(listed, [id.as_str()], "one sandbox for the key");
    let containers = server.containers().await;
    assert_eq!(containers.len(), 1, "one container: {containers:?}");
    assert_eq!(
        containers[0]
            .labels
            .as_ref()
            .and_then(|l| l.get("sandboxd.sandbox_id"))
            .map(String::as_str),
        Some(id.as_str())
    );
    // The stopped ones' volumes go right after each stop, in the background.
    harness::eventually(Duration::from_secs(30), "one volume", || async {
        server.volumes().await.len() == 1
    })
    .await;
}

#[tokio::test]
async fn container_and_volume_removed_out_of_band_are_forgotten_cleanly() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "vanish", "network": {"mode": "none"}}))
        .await;
    let name = server.container_name(&sid);
    server
        .docker
        .remove_container(
            &name,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .expect("rm");
    server
        .docker
        .remove_volume(
            &format!("{name}-workspace"),
            None::<bollard::query_parameters::RemoveVolumeOptions>,
        )
        .await
        .expect("volume rm");
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            json!({"command": "true"}),
        )
        .await;
    assert_eq!(
        (s, v["code"].clone()),
        (404, json!("sandbox_not_found")),
        "{v}"
    );
    let (s, v) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "vanish", "network": {"mode": "none"}}),
        )
        .await;
    assert_eq!((s, v["created"].clone()), (200, json!(true)), "{v}");
    assert_eq!(server.containers().await.len(), 1);
    assert_eq!(server.volumes().await.len(), 1);
}

#[tokio::test]
async fn an_open_request_keeps_a_sandbox_from_expiring() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "held", "idleTtlMs": 10000, "ports": [3000]}))
        .await;
    // Nothing listens on 3000, so this waits its full 14 s, past the TTL.
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/ports/3000?waitMs=14000"))
        .await;
    assert_eq!((s, v["ready"].clone()), (200, json!(false)), "{v}");
    let (s, _) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(s, 200, "not expired while the request was open");
}

/// How many containers, volumes and networks of this instance carry
/// sandbox `sid`'s label.
async fn objects_of(server: &TestServer, sid: &str) -> (usize, usize, usize) {
    let volumes = server
        .volumes()
        .await
        .iter()
        .filter(|v| v.labels.get("sandboxd.sandbox_id").map(String::as_str) == Some(sid))
        .count();
    (
        server
            .containers_with("sandboxd.sandbox_id", sid)
            .await
            .len(),
        volumes,
        server.networks_with("sandboxd.sandbox_id", sid).await.len(),
    )
}

/// An `internet` sandbox with a published port, once all its objects
/// exist (the proxy is made after the create answers): its container and
/// proxy, its workspace volume, its link network.
async fn sandbox_with_everything(server: &TestServer, key: &str) -> String {
    let sid = server
        .create(json!({"sessionKey": key, "ports": [3000]}))
        .await;
    harness::eventually(
        Duration::from_secs(20),
        "container, proxy, volume and link network",
        || async { objects_of(server, &sid).await == (2, 1, 1) },
    )
    .await;
    sid
}

/// A stop answers once the sandbox's containers are gone (nothing of the
/// session runs after it); its volume and link network follow within a
/// deadline, and the session gets a new sandbox right away.
#[tokio::test]
async fn a_stop_answers_without_containers_and_the_rest_follows() {
    let server = TestServer::start().await;
    let sid = sandbox_with_everything(&server, "stopped").await;
    let (s, v) = server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await;
    assert_eq!(s, 200, "{v}");
    let (containers, _, _) = objects_of(&server, &sid).await;
    assert_eq!(
        containers, 0,
        "no container of the sandbox after the answer"
    );
    // The same session right after: a new sandbox (its own link block).
    let again = server
        .create(json!({"sessionKey": "stopped", "ports": [3000]}))
        .await;
    assert_ne!(again, sid, "a new sandbox for the session");
    harness::eventually(
        Duration::from_secs(20),
        "the stopped sandbox's volume and link network removed",
        || async { objects_of(&server, &sid).await == (0, 0, 0) },
    )
    .await;
    assert_eq!(server.sh(&again, "echo ok").await["stdout"], "ok\n");
}

/// sandboxd killed right after a stop answered, before it removed the
/// sandbox's volume and link network: the next start removes them.
#[tokio::test]
async fn sandboxd_killed_right_after_a_stop_leaves_nothing_behind() {
    let mut server = TestServer::start().await;
    let sid = sandbox_with_everything(&server, "killed").await;
    let pid = server.pid().expect("sandboxd runs");
    let (s, v) = server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await;
    assert_eq!(s, 200, "{v}");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    // Positive control: the kill came before the teardown was done, so
    // what removes the rest is the next start.
    let (containers, _, networks) = objects_of(&server, &sid).await;
    assert_eq!(containers, 0, "the containers went before the answer");
    assert_eq!(networks, 1, "the link network was still there at the kill");
    server.crash_and_restart().await;
    harness::eventually(
        Duration::from_secs(30),
        "no container, volume or network of the stopped sandbox",
        || async { objects_of(&server, &sid).await == (0, 0, 0) },
    )
    .await;
    let (s, _) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(s, 404);
}

/// A retried stop whose teardown fails (a container sandboxd does not
/// know holds the link network) leaves that teardown queued: once the
/// holder is gone, the volume and link network go without another stop.
/// A port published while its sandbox stopped sweeps the same way and
/// drops the error, so nothing else would try again before the next
/// start.
#[tokio::test]
async fn a_retried_stop_that_fails_leaves_its_teardown_queued() {
    let server = TestServer::start().await;
    let sid = server.create(json!({"sessionKey": "held"})).await;
    let link = server
        .networks_with("sandboxd.sandbox_id", &sid)
        .await
        .pop()
        .expect("the sandbox's link network");
    // Labelled with the instance only: the harness removes it whatever
    // happens, sandboxd's teardown does not.
    let holder = format!("{}-link-holder", server.instance);
    server
        .docker
        .create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(holder.clone()),
                platform: String::new(),
            }),
            bollard::models::ContainerCreateBody {
                image: Some("sandboxd-runtime:latest".into()),
                cmd: Some(vec!["sleep".into(), "infinity".into()]),
                labels: Some([("sandboxd.instance".to_string(), server.instance.clone())].into()),
                host_config: Some(bollard::models::HostConfig {
                    network_mode: Some(link),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("create the holder");
    server
        .docker
        .start_container(
            &holder,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .expect("start the holder");
    let (s, v) = server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await;
    assert_eq!(s, 200, "{v}");
    // Positive control: the retried stop's own teardown fails.
    let (s, v) = server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await;
    assert_ne!(s, 200, "the held link network cannot go yet: {v}");
    assert_eq!(
        objects_of(&server, &sid).await.2,
        1,
        "the link network stays"
    );
    server
        .docker
        .remove_container(
            &holder,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .expect("remove the holder");
    harness::eventually(
        Duration::from_secs(20),
        "the stopped sandbox's volume and link network removed",
        || async { objects_of(&server, &sid).await == (0, 0, 0) },
    )
    .await;
}

/// Pending teardowns past which a cold create waits for them (docs/API.md,
/// Stop).
const TEARDOWNS_DEFERRED_AT_MOST: f64 = 8.0;

/// New sessions arriving faster than the engine removes the stopped ones
/// (workers that each create a sandbox and stop it, again and again) keep
/// the teardown backlog within its bound: a create waits for it, instead
/// of leaving link networks and volumes piling up. Each worker can be past
/// that wait with one sandbox when the others stop theirs, so the backlog
/// reaches at most the bound plus the workers. Positive control: the
/// stream did outpace the teardowns (the backlog reached the bound), so it
/// is the bound that held it there; afterwards every teardown is done.
#[tokio::test]
async fn a_steady_stream_of_sessions_keeps_the_teardown_backlog_bounded() {
    const WORKERS: usize = 3;
    const SESSIONS_EACH: usize = 14;
    let server = TestServer::start().await;
    let pending = || server.metric("sandboxd_teardowns_pending");
    let worker = |w: usize| {
        let server = &server;
        async move {
            let mut most: f64 = 0.0;
            for i in 0..SESSIONS_EACH {
                let sid = server
                    .create(json!({"sessionKey": format!("stream-{w}-{i}")}))
                    .await;
                let (s, v) = server
                    .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
                    .await;
                assert_eq!(s, 200, "{v}");
                most = most.max(server.metric("sandboxd_teardowns_pending").await);
            }
            most
        }
    };
    let most = futures_util::future::join_all((0..WORKERS).map(worker))
        .await
        .into_iter()
        .fold(0.0, f64::max);
    println!("teardowns pending at most: {most}");
    assert!(
        most >= TEARDOWNS_DEFERRED_AT_MOST,
        "the stream outpaced the teardowns (else the bound was not tested): {most}"
    );
    assert!(
        most <= TEARDOWNS_DEFERRED_AT_MOST + WORKERS as f64,
        "the backlog stayed within its bound: {most}"
    );
    harness::eventually(Duration::from_secs(60), "every teardown done", || async {
        pending().await == 0.0
    })
    .await;
}
