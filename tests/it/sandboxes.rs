//! The sandbox lifecycle: create and reconnect, the hardening as
//! `docker inspect` shows it and as it looks from inside, concurrent
//! creates, failure cleanup, image autobuild, networks, stop, restart,
//! expiry, eviction, rehydration and out-of-band changes.

use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters::{KillContainerOptions, RemoveContainerOptions};
use serde_json::json;

use crate::harness::{self, ServerOptions, TestServer, eventually};

#[tokio::test]
async fn create_hardens_the_container_and_reconnect_reuses_it() {
    let server = TestServer::start().await;
    let (status, body) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "chat:42", "runtime": "node24", "idleTtlMs": 900000,
                   "resources": {"vcpus": 2, "memoryMb": 512}, "network": {"mode": "default"}, "ports": [3000]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["created"], true);
    let id = body["sandboxId"].as_str().expect("id").to_string();
    assert!(id.chars().all(|c| c.is_ascii_alphanumeric()), "URL-safe id");

    let info = server.inspect(&id).await;
    let hc = info.host_config.clone().expect("host config");
    let cfg = info.config.clone().expect("config");
    assert_eq!(hc.readonly_rootfs, Some(true), "ReadonlyRootfs");
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]), "CapDrop");
    assert!(hc.cap_add.unwrap_or_default().is_empty(), "CapAdd");
    assert_eq!(
        hc.security_opt,
        Some(vec!["no-new-privileges:true".to_string()]),
        "SecurityOpt (seccomp default)"
    );
    assert_eq!(hc.privileged, Some(false), "Privileged");
    // Under gVisor the limit also holds the sentry's own host tasks (the
    // sandbox's own processes are held by RLIMIT_NPROC there).
    let pids = if harness::under_gvisor() {
        1024 + 512 * 20
    } else {
        512
    };
    assert_eq!(hc.pids_limit, Some(pids), "PidsLimit");
    assert_eq!(hc.nano_cpus, Some(2_000_000_000), "NanoCpus");
    assert_eq!(hc.memory, Some(512 * 1024 * 1024), "Memory");
    assert_eq!(hc.memory_swap, hc.memory, "MemorySwap == Memory");
    assert_eq!(hc.init, Some(true), "Init");
    let tmp = hc
        .tmpfs
        .clone()
        .unwrap_or_default()
        .get("/tmp")
        .cloned()
        .expect("tmpfs /tmp");
    for opt in ["rw", "noexec", "nosuid"] {
        assert!(tmp.split(',').any(|o| o == opt), "/tmp has {opt}: {tmp}");
    }
    assert!(
        tmp.split(',').any(|o| o.starts_with("size=")),
        "/tmp is size-limited: {tmp}"
    );
    assert!(hc.binds.unwrap_or_default().is_empty(), "no bind mounts");
    assert!(hc.devices.unwrap_or_default().is_empty(), "no devices");
    for (what, mode) in [
        ("pid", &hc.pid_mode),
        ("ipc", &hc.ipc_mode),
        ("uts", &hc.uts_mode),
        ("userns", &hc.userns_mode),
    ] {
        assert_ne!(mode.as_deref(), Some("host"), "no host {what} namespace");
    }
    assert_ne!(hc.network_mode.as_deref(), Some("host"));
    assert_eq!(
        hc.restart_policy
            .and_then(|r| r.name)
            .map(|n| n.to_string()),
        Some("no".to_string()),
        "RestartPolicy"
    );
    assert_eq!(cfg.user.as_deref(), Some("1000:1000"), "non-root user");
    assert_eq!(cfg.working_dir.as_deref(), Some("/workspace"), "WorkingDir");
    let env = cfg.env.clone().unwrap_or_default();
    assert!(
        env.contains(&"HOME=/workspace".to_string()),
        "HOME: {env:?}"
    );
    assert!(env.contains(&"GIT_DISCOVERY_ACROSS_FILESYSTEM=1".to_string()));
    let mounts = info.mounts.clone().unwrap_or_default();
    let volume = format!("{}-workspace", server.container_name(&id));
    let mut workspace: Vec<&str> = mounts
        .iter()
        .filter(|m| m.name.as_deref() == Some(volume.as_str()))
        .filter_map(|m| m.destination.as_deref())
        .collect();
    workspace.sort();
    assert_eq!(
        workspace,
        ["/home/user", "/vercel/sandbox/workspace", "/workspace"],
        "the one workspace volume, at each spelling: {mounts:?}"
    );
    let agent: Vec<&bollard::models::MountPoint> = mounts
        .iter()
        .filter(|m| m.destination.as_deref() == Some("/.sandboxd"))
        .collect();
    assert_eq!(agent.len(), 1, "the agent is mounted: {mounts:?}");
    assert_eq!(
        agent[0].rw,
        Some(false),
        "read-only: the sandbox cannot replace it"
    );
    assert_eq!(
        server
            .agent_volumes()
            .await
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        [agent[0].name.as_deref().unwrap_or_default()],
        "one volume carries the agent"
    );
    assert_eq!(
        mounts.len(),
        4,
        "nothing but the workspace (at its three spellings) and the agent: {mounts:?}"
    );
    for m in &mounts {
        assert_eq!(
            m.typ.as_ref().map(|t| t.to_string()),
            Some("volume".to_string())
        );
        assert_eq!(
            m.rw,
            Some(m.destination.as_deref() != Some("/.sandboxd")),
            "{m:?}"
        );
    }
    assert!(
        !mounts.iter().any(|m| m
            .source
            .as_deref()
            .is_some_and(|s| s.contains("docker.sock"))),
        "no engine socket"
    );
    let labels = cfg.labels.clone().unwrap_or_default();
    for (k, v) in [
        ("sandboxd.instance", server.instance.as_str()),
        ("sandboxd.role", "sandbox"),
        ("sandboxd.sandbox_id", id.as_str()),
        ("sandboxd.session_key", "chat:42"),
        ("sandboxd.runtime", "node24"),
        ("sandboxd.ports", "3000"),
        ("sandboxd.network", "internet"),
        ("sandboxd.vcpus", "2"),
        ("sandboxd.memory_mb", "512"),
        ("sandboxd.idle_ttl_ms", "900000"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
    }
    assert!(labels.contains_key("sandboxd.created_at"));
    let volumes = server.volumes().await;
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].labels.get("sandboxd.sandbox_id"), Some(&id));
    assert_eq!(
        volumes[0].labels.get("sandboxd.role").map(String::as_str),
        Some("sandbox")
    );

    // From inside: the same properties, tried.
    let (code, out) = server.docker_exec(&id, "id -u").await;
    assert_eq!((code, out.trim()), (0, "1000"), "not root");
    let (code, _) = server.docker_exec(&id, "touch /evil").await;
    assert_ne!(code, 0, "writing / must fail");
    let (code, _) = server.docker_exec(&id, "touch /usr/evil").await;
    assert_ne!(code, 0, "writing /usr must fail");
    let (code, out) = server
        .docker_exec(&id, "cp /bin/true /tmp/t && /tmp/t")
        .await;
    assert_eq!(code, 126, "a binary copied to /tmp must not run: {out}");
    let (_, status) = server.docker_exec(&id, "cat /proc/self/status").await;
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    // gVisor's /proc reports neither (the inspect checks above hold).
    if !harness::under_gvisor() {
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
        assert!(status.contains("Seccomp:\t2"), "{status}");
    }
    let (code, _) = server
        .docker_exec(&id, "echo hi > /workspace/ok && cat /workspace/ok")
        .await;
    assert_eq!(code, 0, "the workspace is writable");

    // Reconnect: same id, TTL refreshed, ports added.
    let (status, body) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "chat:42", "idleTtlMs": 60000, "ports": [3001]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"sandboxId": id, "created": false}));
    let (status, view) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["idleTtlMs"], 60000);
    assert_eq!(view["ports"]["allowed"], json!([3000, 3001]));
    assert_eq!(view["sessionKey"], "chat:42");
    assert_eq!(view["runtime"], "node24");
    assert_eq!(view["state"], "running");
    assert_eq!(view["resources"], json!({"vcpus": 2, "memoryMb": 512}));
    assert_eq!(view["network"], json!({"mode": "internet"}));
    assert_eq!(view["runningCommands"], 0);
    let expires = view["expiresAt"].as_u64().expect("expiresAt");
    let last = view["lastUsedAt"].as_u64().expect("lastUsedAt");
    assert_eq!(expires, last + 60000);
    // Past the port cap: 400, and nothing changes.
    let (status, body) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "chat:42", "ports": [1, 2, 3]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("ports"),
        "{body}"
    );
    assert_eq!(
        server
            .containers_with("sandboxd.role", "sandbox")
            .await
            .len(),
        1
    );

    let log = server.log_text();
    assert!(
        log.contains("event=\"created\"") || log.contains("event=created"),
        "{log}"
    );
    assert!(log.contains("reconnected"), "{log}");
}

#[tokio::test]
async fn invalid_create_requests_are_400_naming_the_field() {
    let server = TestServer::start().await;
    let long_key = "k".repeat(257);
    for (body, field) in [
        (json!({"sessionKey": ""}), "sessionKey"),
        (json!({"sessionKey": long_key}), "sessionKey"),
        (json!({"sessionKey": "k", "runtime": "cobol"}), "runtime"),
        (json!({"sessionKey": "k", "idleTtlMs": 5}), "idleTtlMs"),
        (
            json!({"sessionKey": "k", "idleTtlMs": 21_600_001}),
            "idleTtlMs",
        ),
        (
            json!({"sessionKey": "k", "resources": {"vcpus": 9}}),
            "resources.vcpus",
        ),
        (
            json!({"sessionKey": "k", "resources": {"memoryMb": 100}}),
            "resources.memoryMb",
        ),
        (
            json!({"sessionKey": "k", "network": {"mode": "host"}}),
            "network.mode",
        ),
        (json!({"sessionKey": "k", "ports": [70000]}), "ports[0]"),
        (
            json!({"sessionKey": "k", "ports": [1, 2, 3, 4, 5]}),
            "ports",
        ),
        (json!({"sessionKey": "k", "idleTtlMs": -1}), "idleTtlMs"),
    ] {
        let (status, resp) = server.post("/v1/sandboxes", body.clone()).await;
        assert_eq!(status, 400, "{body} -> {resp}");
        assert_eq!(resp["code"], "invalid_request");
        assert!(
            resp["error"].as_str().unwrap_or("").contains(field),
            "{field} in {resp}"
        );
    }
    let (_, resp) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "k", "runtime": "cobol"}),
        )
        .await;
    assert!(
        resp["error"].as_str().unwrap_or("").contains("python3.13"),
        "known runtimes listed: {resp}"
    );
    assert!(server.containers().await.is_empty());
    assert!(server.volumes().await.is_empty());
}

#[tokio::test]
async fn concurrent_creates_for_one_key_make_one_sandbox() {
    let server = TestServer::start().await;
    let results = futures_util::future::join_all((0..6).map(|_| {
        server.post(
            "/v1/sandboxes",
            json!({"sessionKey": "same-key", "network": {"mode": "none"}}),
        )
    }))
    .await;
    let ids: Vec<&str> = results
        .iter()
        .map(|(s, b)| {
            assert_eq!(*s, 200, "{b}");
            b["sandboxId"].as_str().expect("id")
        })
        .collect();
    assert!(ids.iter().all(|i| *i == ids[0]), "one id for all: {ids:?}");
    let created = results.iter().filter(|(_, b)| b["created"] == true).count();
    assert_eq!(created, 1, "exactly one created:true");
    assert_eq!(
        server
            .containers_with("sandboxd.session_key", "same-key")
            .await
            .len(),
        1
    );
    assert_eq!(server.volumes().await.len(), 1);
}

#[tokio::test]
async fn a_create_that_fails_half_way_leaves_nothing() {
    let image = format!("sbt-missing-{}:none", std::process::id());
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_IMAGE", &image)
            .env("SANDBOXD_DISABLE_AUTOBUILD", "1"),
    )
    .await;
    let (status, body) = server
        .post("/v1/sandboxes", json!({"sessionKey": "k"}))
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "image_missing");
    let msg = body["error"].as_str().unwrap_or("");
    assert!(
        msg.contains(&image) && msg.contains("sandbox-images/build.sh"),
        "{msg}"
    );
    assert!(server.containers().await.is_empty(), "no container left");
    assert!(server.volumes().await.is_empty(), "no volume left");
    let (status, list) = server.get("/v1/sandboxes").await;
    assert_eq!((status, list), (200, json!({"sandboxes": []})));
}

#[tokio::test]
async fn a_missing_runtime_image_is_built_once_from_the_embedded_dockerfile() {
    let docker = harness::docker().await;
    // Whichever base this machine has: the registry's, or build.sh's offline one.
    let base = if docker.inspect_image("debian:bookworm-slim").await.is_ok() {
        "debian:bookworm-slim"
    } else {
        "sandboxd-base:bookworm"
    };
    docker
        .inspect_image(base)
        .await
        .expect("a base image (run sandbox-images/build.sh)");
    let image = format!("sbt-autobuild-{}:latest", std::process::id());
    let _guard = harness::ImageGuard(docker.clone(), image.clone());
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("SANDBOXD_IMAGE", &image)
            .env("SANDBOXD_BASE_IMAGE", base),
    )
    .await;
    let (a, b) = tokio::join!(
        server.post(
            "/v1/sandboxes",
            json!({"sessionKey": "a", "network": {"mode": "none"}})
        ),
        server.post(
            "/v1/sandboxes",
            json!({"sessionKey": "b", "network": {"mode": "none"}})
        ),
    );
    assert_eq!(a.0, 200, "{}", a.1);
    assert_eq!(b.0, 200, "{}", b.1);
    docker.inspect_image(&image).await.expect("image was built");
    let log = server.log_text();
    assert_eq!(
        log.matches("runtime image built").count(),
        1,
        "one build for both: {log}"
    );
    let id = a.1["sandboxId"].as_str().expect("id");
    let (code, out) = server
        .docker_exec(
            id,
            "id -un; command -v socat git rg jq python3 node npm tini",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("sandbox"), "{out}");
}

#[tokio::test]
async fn networks_internet_and_none() {
    let server = TestServer::start().await;
    let none = server
        .create(json!({"sessionKey": "offline", "network": {"mode": "none"}}))
        .await;
    let info = server.inspect(&none).await;
    assert_eq!(
        info.host_config.and_then(|h| h.network_mode).as_deref(),
        Some("none")
    );
    let (_, ifaces) = server
        .docker_exec(&none, "tail -n +3 /proc/net/dev | cut -d: -f1")
        .await;
    assert_eq!(
        ifaces.split_whitespace().collect::<Vec<_>>(),
        ["lo"],
        "only loopback"
    );

    // The default, internet: a network of its own, internal, with no
    // address of the host on it (see tests/it/egress.rs for what it reaches).
    let online = server.create(json!({"sessionKey": "online"})).await;
    let link = format!("{}-{online}-link", server.instance);
    let info = server.inspect(&online).await;
    assert_eq!(
        info.host_config.and_then(|h| h.network_mode).as_deref(),
        Some(link.as_str())
    );
    let nets = info
        .network_settings
        .and_then(|n| n.networks)
        .unwrap_or_default();
    assert_eq!(
        nets.keys().collect::<Vec<_>>(),
        [&link],
        "only its link network, not docker0's bridge or the instance network"
    );
    let net = server
        .docker
        .inspect_network(
            &link,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .expect("network");
    assert_eq!(net.driver.as_deref(), Some("bridge"));
    assert_eq!(net.internal, Some(true), "no route out");
    let labels = net.labels.unwrap_or_default();
    assert_eq!(labels.get("sandboxd.instance"), Some(&server.instance));
    assert_eq!(labels.get("sandboxd.sandbox_id"), Some(&online));
    assert_eq!(
        net.options
            .unwrap_or_default()
            .get("com.docker.network.bridge.inhibit_ipv4")
            .map(String::as_str),
        Some("true"),
        "no address of the host on it"
    );
    // The instance network, where proxies publish and egress goes out,
    // has inter-container traffic off.
    let instance_net = server
        .docker
        .inspect_network(
            &format!("{}-net", server.instance),
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .expect("instance network");
    assert_eq!(
        instance_net
            .options
            .unwrap_or_default()
            .get("com.docker.network.bridge.enable_icc")
            .map(String::as_str),
        Some("false"),
        "nothing on it reaches anything else on it"
    );
}

#[tokio::test]
async fn get_list_stop_and_unknown_ids() {
    let server = TestServer::start().await;
    let a = server
        .create(json!({"sessionKey": "a", "network": {"mode": "none"}}))
        .await;
    let b = server
        .create(json!({"sessionKey": "b", "network": {"mode": "none"}}))
        .await;
    let (status, list) = server.get("/v1/sandboxes").await;
    assert_eq!(status, 200);
    let mut ids: Vec<&str> = list["sandboxes"]
        .as_array()
        .expect("array")
        .iter()
        .map(|s| s["sandboxId"].as_str().expect("id"))
        .collect();
    ids.sort();
    let mut expected = vec![a.as_str(), b.as_str()];
    expected.sort();
    assert_eq!(ids, expected);

    let (status, body) = server.get("/v1/sandboxes/0123456789abcdef01234567").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "sandbox_not_found");

    let (status, body) = server
        .post(&format!("/v1/sandboxes/{a}:stop"), json!(null))
        .await;
    assert_eq!((status, body), (200, json!({"ok": true})));
    assert!(
        server.session_containers(&a).await.is_empty(),
        "container removed"
    );
    // The volume (and an untaken spare port proxy) go right after the
    // answer, in the background.
    eventually(Duration::from_secs(20), "volume removed", || {
        no_volume_of(&server, &a)
    })
    .await;
    eventually(
        Duration::from_secs(20),
        "every container removed",
        || async {
            server
                .containers_with("sandboxd.sandbox_id", &a)
                .await
                .is_empty()
        },
    )
    .await;
    let (status, _) = server.get(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(status, 404);
    // Idempotent, and fine for ids never seen.
    for id in [a.as_str(), "0123456789abcdef01234567", "not-even-an-id"] {
        let (status, body) = server
            .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
            .await;
        assert_eq!((status, body), (200, json!({"ok": true})), "{id}");
    }
    let (status, body) = server
        .post(&format!("/v1/sandboxes/{b}:explode"), json!(null))
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = server.get(&format!("/v1/sandboxes/{b}")).await;
    assert_eq!(status, 200, "b untouched");
}

#[tokio::test]
async fn restart_ends_every_process_and_keeps_the_workspace() {
    let server = TestServer::start().await;
    let id = server
        .create(json!({"sessionKey": "k", "network": {"mode": "none"}}))
        .await;
    let (code, _) = server
        .docker_exec(
            &id,
            "echo kept > /workspace/file; nohup sleep 4242 >/dev/null 2>&1 &",
        )
        .await;
    assert_eq!(code, 0);
    let (_, ps) = server.docker_exec(&id, "ps -eo args").await;
    assert!(ps.contains("sleep 4242"), "{ps}");
    let cid = server
        .start_command(&id, json!({"command": "sleep 300", "timeoutMs": 600000}))
        .await;
    harness::eventually(Duration::from_secs(10), "the command runs", || async {
        server
            .docker_exec(&id, "ps -eo args")
            .await
            .1
            .lines()
            .any(|l| l == "sleep 300")
    })
    .await;
    let (status, body) = server
        .post(&format!("/v1/sandboxes/{id}:restart"), json!(null))
        .await;
    assert_eq!((status, body), (200, json!({"ok": true})));
    // The command ended with the restart: killed, and the log says why,
    // not that the sandbox stopped on its own.
    let waited = server.wait_command(&id, &cid).await;
    assert_eq!(waited["exitCode"], 137, "{waited}");
    let log = server.open_logs(&id, &cid).await.text().await.expect("log");
    assert!(
        log.contains("the sandbox was restarted or stopped while the command ran"),
        "{log}"
    );
    let (_, ps) = server.docker_exec(&id, "ps -eo args").await;
    assert!(!ps.contains("sleep 4242"), "processes ended: {ps}");
    let (_, file) = server.docker_exec(&id, "cat /workspace/file").await;
    assert_eq!(file.trim(), "kept");
    let (status, _) = server
        .post(
            "/v1/sandboxes/0123456789abcdef01234567:restart",
            json!(null),
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_idle_sandbox_expires() {
    let server = TestServer::start().await;
    let id = server
        .create(json!({"sessionKey": "short", "idleTtlMs": 10000, "network": {"mode": "none"}}))
        .await;
    let keep = server
        .create(json!({"sessionKey": "long", "network": {"mode": "none"}}))
        .await;
    // The container goes first, its workspace volume right after.
    eventually(
        Duration::from_secs(30),
        "the idle sandbox's container and volume are removed",
        || async {
            server
                .containers_with("sandboxd.sandbox_id", &id)
                .await
                .is_empty()
                && server
                    .volumes()
                    .await
                    .iter()
                    .all(|v| v.labels.get("sandboxd.sandbox_id") != Some(&id))
        },
    )
    .await;
    let (status, _) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(status, 404);
    let (status, _) = server.get(&format!("/v1/sandboxes/{keep}")).await;
    assert_eq!(status, 200, "the other one is still there");
    assert!(server.log_text().contains("expired"));
}

#[tokio::test]
async fn at_capacity_the_least_recently_used_idle_sandbox_is_evicted() {
    let server =
        TestServer::start_with(ServerOptions::default().env("SANDBOXD_MAX_CONCURRENT", "2")).await;
    let a = server
        .create(json!({"sessionKey": "a", "network": {"mode": "none"}}))
        .await;
    let b = server
        .create(json!({"sessionKey": "b", "network": {"mode": "none"}}))
        .await;
    // Use a, so b is the least recently used.
    assert_eq!(server.get(&format!("/v1/sandboxes/{a}")).await.0, 200);
    let c = server
        .create(json!({"sessionKey": "c", "network": {"mode": "none"}}))
        .await;
    assert_eq!(
        server.get(&format!("/v1/sandboxes/{b}")).await.0,
        404,
        "b evicted"
    );
    assert!(
        server
            .containers_with("sandboxd.sandbox_id", &b)
            .await
            .is_empty()
    );
    assert_eq!(server.get(&format!("/v1/sandboxes/{a}")).await.0, 200);
    assert_eq!(server.get(&format!("/v1/sandboxes/{c}")).await.0, 200);
    assert_eq!(server.containers().await.len(), 2);
    assert!(server.log_text().contains("evicted"));
}

#[tokio::test]
async fn a_restart_of_sandboxd_loses_no_session() {
    let mut server = TestServer::start().await;
    let id = server
        .create(json!({"sessionKey": "persist", "ports": [3000], "idleTtlMs": 120000}))
        .await;
    let (code, _) = server
        .docker_exec(&id, "echo survives > /workspace/note")
        .await;
    assert_eq!(code, 0);
    let stopped = server
        .create(json!({"sessionKey": "was-stopped", "network": {"mode": "none"}}))
        .await;

    server.stop_process();
    // While sandboxd is down: a container stops, a proxy and a volume lose
    // their sandbox, and another instance owns objects on the same engine.
    server
        .docker
        .kill_container(
            &server.container_name(&stopped),
            None::<KillContainerOptions>,
        )
        .await
        .expect("kill");
    let orphan_id = "ffffffffffffffffffffffff";
    let mine = |role: &str| {
        HashMap::from([
            ("sandboxd.instance".to_string(), server.instance.clone()),
            ("sandboxd.role".to_string(), role.to_string()),
            ("sandboxd.sandbox_id".to_string(), orphan_id.to_string()),
        ])
    };
    let orphan_volume = format!("{}-{orphan_id}-workspace", server.instance);
    server
        .docker
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(orphan_volume.clone()),
            labels: Some(mine("sandbox")),
            ..Default::default()
        })
        .await
        .expect("orphan volume");
    let orphan_proxy = format!("{}-{orphan_id}-proxy-3000", server.instance);
    server
        .docker
        .create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(orphan_proxy.clone()),
                platform: String::new(),
            }),
            bollard::models::ContainerCreateBody {
                image: Some("sandboxd-runtime:latest".into()),
                cmd: Some(vec!["sleep".into(), "infinity".into()]),
                labels: Some(mine("proxy")),
                ..Default::default()
            },
        )
        .await
        .expect("orphan proxy");
    let other_instance = format!("{}-other", server.instance);
    let foreign = format!("{other_instance}-volume");
    server
        .docker
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(foreign.clone()),
            labels: Some(HashMap::from([
                ("sandboxd.instance".to_string(), other_instance.clone()),
                ("sandboxd.role".to_string(), "sandbox".to_string()),
                ("sandboxd.sandbox_id".to_string(), orphan_id.to_string()),
            ])),
            ..Default::default()
        })
        .await
        .expect("foreign volume");

    server.restart().await;
    let (status, body) = server
        .post("/v1/sandboxes", json!({"sessionKey": "persist"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"sandboxId": id, "created": false}));
    let (_, note) = server.docker_exec(&id, "cat /workspace/note").await;
    assert_eq!(note.trim(), "survives");
    let (_, view) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(view["ports"]["allowed"], json!([3000]));
    assert_eq!(view["idleTtlMs"], 120000);
    let info = server.inspect(&stopped).await;
    assert_eq!(
        info.state.and_then(|s| s.running),
        Some(true),
        "stopped sandbox started again"
    );
    assert_eq!(
        server
            .containers_with("sandboxd.session_key", "was-stopped")
            .await
            .len(),
        1
    );

    assert!(
        server
            .containers_with("sandboxd.sandbox_id", orphan_id)
            .await
            .is_empty(),
        "orphan proxy removed"
    );
    assert!(
        server
            .volumes()
            .await
            .iter()
            .all(|v| v.name != orphan_volume),
        "orphan volume removed"
    );
    let foreign_still_there = server.docker.inspect_volume(&foreign).await.is_ok();
    let _ = server
        .docker
        .remove_volume(
            &foreign,
            None::<bollard::query_parameters::RemoveVolumeOptions>,
        )
        .await;
    assert!(
        foreign_still_there,
        "another instance's volume is never touched"
    );
    assert!(server.log_text().contains("rehydrated"));
}

#[tokio::test]
async fn out_of_band_removal_is_404_and_a_stopped_container_comes_back() {
    let server = TestServer::start().await;
    let gone = server
        .create(json!({"sessionKey": "gone", "network": {"mode": "none"}}))
        .await;
    let stopped = server
        .create(json!({"sessionKey": "stopped", "network": {"mode": "none"}}))
        .await;

    server
        .docker
        .remove_container(
            &server.container_name(&gone),
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .expect("rm -f");
    let (status, body) = server.get(&format!("/v1/sandboxes/{gone}")).await;
    assert_eq!(status, 404, "{body}");
    // Its volume goes in the background.
    eventually(Duration::from_secs(20), "its volume is cleaned up", || {
        no_volume_of(&server, &gone)
    })
    .await;
    let (status, body) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "gone", "network": {"mode": "none"}}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["created"], true);
    assert_ne!(body["sandboxId"], json!(gone));

    server
        .docker
        .kill_container(
            &server.container_name(&stopped),
            None::<KillContainerOptions>,
        )
        .await
        .expect("kill");
    let (status, view) = server.get(&format!("/v1/sandboxes/{stopped}")).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["state"], "running");
    assert_eq!(
        server.inspect(&stopped).await.state.and_then(|s| s.running),
        Some(true)
    );
    // A reconnect also restarts a stopped container rather than replacing it.
    server
        .docker
        .kill_container(
            &server.container_name(&stopped),
            None::<KillContainerOptions>,
        )
        .await
        .expect("kill");
    let (_, body) = server
        .post("/v1/sandboxes", json!({"sessionKey": "stopped"}))
        .await;
    assert_eq!(body, json!({"sandboxId": stopped, "created": false}));
}

/// On rehydration a sandbox whose `sandboxd.agent` label names another
/// agent version is recreated with this one: a new container on the same
/// workspace volume. The engine cannot relabel a container, so while
/// sandboxd is down the test makes the sandbox's container again, as it
/// was but for that label.
#[tokio::test]
async fn a_sandbox_of_another_agent_version_is_recreated_on_rehydration() {
    let mut server = TestServer::start().await;
    let id = server
        .create(json!({"sessionKey": "old-agent", "network": {"mode": "none"}}))
        .await;
    assert_eq!(
        server.sh(&id, "echo kept > /workspace/note").await["exitCode"],
        0
    );
    let made = server.inspect(&id).await;
    let agent_version = made
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.get("sandboxd.agent"))
        .cloned()
        .expect("the sandbox's agent label");
    // Control: with this agent's label, a restart keeps the container.
    server.restart().await;
    assert_eq!(server.inspect(&id).await.id, made.id, "container kept");

    server.stop_process();
    let old = remake_container(&server, &id, made, &[("sandboxd.agent", "another-build")]).await;

    server.restart().await;
    let now = server.inspect(&id).await;
    assert_ne!(now.id.as_ref(), Some(&old), "the container was recreated");
    assert_eq!(
        now.config
            .and_then(|c| c.labels)
            .and_then(|mut l| l.remove("sandboxd.agent")),
        Some(agent_version),
        "with this agent"
    );
    assert!(
        server
            .docker
            .inspect_container(
                &old,
                None::<bollard::query_parameters::InspectContainerOptions>
            )
            .await
            .is_err(),
        "the old container, and every process in it, is gone"
    );
    let r = server.sh(&id, "cat /workspace/note").await;
    assert_eq!(r["stdout"], "kept\n", "the workspace stays: {r}");
    assert!(
        server
            .log_text()
            .contains("sandbox recreated with this sandboxd's agent"),
        "the log says so"
    );
}

/// While sandboxd is down: makes sandbox `id`'s container again, as
/// `made` was but for `labels` (the engine cannot relabel a container),
/// and starts it; returns the new container's id.
async fn remake_container(
    server: &TestServer,
    id: &str,
    made: bollard::models::ContainerInspectResponse,
    changed: &[(&str, &str)],
) -> String {
    let name = server.container_name(id);
    let config = made.config.expect("config");
    let mut labels = config.labels.clone().unwrap_or_default();
    for (k, v) in changed {
        labels.insert(k.to_string(), v.to_string());
    }
    server
        .docker
        .remove_container(
            &name,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .expect("remove the container");
    let old = server
        .docker
        .create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(name.clone()),
                platform: String::new(),
            }),
            bollard::models::ContainerCreateBody {
                image: config.image,
                entrypoint: config.entrypoint,
                cmd: config.cmd,
                env: config.env,
                user: config.user,
                working_dir: config.working_dir,
                labels: Some(labels),
                host_config: made.host_config,
                ..Default::default()
            },
        )
        .await
        .expect("the remade container")
        .id;
    server
        .docker
        .start_container(
            &old,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .expect("start it");
    old
}

/// A sandbox made before egress policies (network label `default`: the
/// instance's bridge, the host included), or in mode `open` that the
/// configuration no longer allows, is recreated in the default mode when
/// sandboxd starts with a new agent: behind the egress proxy, its
/// workspace kept.
#[tokio::test]
async fn a_recreated_sandbox_of_a_mode_no_longer_allowed_gets_the_default_mode() {
    let mut server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_NETWORK_MODES", "none,internet,allowlist,open"),
    )
    .await;
    let id = server
        .create(json!({"sessionKey": "legacy", "network": {"mode": "open"}}))
        .await;
    assert_eq!(
        server
            .sh(
                &id,
                "echo kept > /workspace/note; env | grep -c ^HTTP_PROXY= || true"
            )
            .await["stdout"],
        "0\n",
        "open: no proxy"
    );
    let made = server.inspect(&id).await;
    server.stop_process();
    remake_container(
        &server,
        &id,
        made,
        &[
            ("sandboxd.agent", "another-build"),
            ("sandboxd.network", "default"),
        ],
    )
    .await;
    server.set_env("SANDBOXD_NETWORK_MODES", "none,internet,allowlist");
    server.restart().await;

    let (_, info) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(info["network"]["mode"], "internet", "{info}");
    let labels = server
        .inspect(&id)
        .await
        .config
        .and_then(|c| c.labels)
        .unwrap_or_default();
    assert_eq!(
        labels.get("sandboxd.network").map(String::as_str),
        Some("internet")
    );
    let r = server
        .sh(&id, "cat /workspace/note; env | grep -c ^HTTP_PROXY=")
        .await;
    assert_eq!(
        r["stdout"], "kept\n1\n",
        "workspace kept, behind the proxy: {r}"
    );
    assert!(
        server
            .log_text()
            .contains("network mode open is not allowed any more"),
        "the log says so"
    );
}

/// `:restart` gives a command no SIGTERM and no grace: the engine's
/// SIGTERM goes to the agent, which ends on it, and every process in the
/// sandbox ends with the container. The command's log ends with an `error`
/// record, then `exit`.
#[tokio::test]
async fn restart_ends_commands_without_sigterm_and_their_log_says_why() {
    let server = TestServer::start().await;
    let id = server.offline_sandbox().await;
    let cid = server
        .start_command(
            &id,
            json!({"command": "trap 'echo got TERM >> /workspace/term' TERM; echo $$ > /workspace/pid; while :; do sleep 0.1; done", "timeoutMs": 600000}),
        )
        .await;
    eventually(Duration::from_secs(10), "the trap is set", || async {
        server.docker_exec(&id, "test -s /workspace/pid").await.0 == 0
    })
    .await;
    // Control: a SIGTERM that reaches the command leaves its mark, and the
    // command carries on.
    let (code, out) = server
        .docker_exec(&id, "kill -TERM $(cat /workspace/pid)")
        .await;
    assert_eq!(code, 0, "{out}");
    eventually(
        Duration::from_secs(10),
        "the trap wrote its mark",
        || async { server.docker_exec(&id, "cat /workspace/term").await.1 == "got TERM\n" },
    )
    .await;
    assert_eq!(server.docker_exec(&id, "rm /workspace/term").await.0, 0);
    let (_, list) = server.get(&format!("/v1/sandboxes/{id}/commands")).await;
    assert_eq!(list["commands"][0]["state"], "running", "{list}");

    let (status, body) = server
        .post(&format!("/v1/sandboxes/{id}:restart"), json!(null))
        .await;
    assert_eq!((status, body), (200, json!({"ok": true})));
    let waited = server.wait_command(&id, &cid).await;
    assert_eq!(
        (waited["exitCode"].clone(), waited["killed"].clone()),
        (json!(137), json!(false)),
        "{waited}"
    );
    let (_, term) = server.docker_exec(&id, "cat /workspace/term").await;
    assert!(
        term.contains("No such file"),
        "the restart sent the command no SIGTERM it could act on: {term}"
    );
    let records = server.log_records(&id, &cid, "").await;
    let kinds: Vec<&str> = records
        .iter()
        .rev()
        .take(2)
        .map(|r| r["stream"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["exit", "error"], "{records:?}");
    assert_eq!(
        records[records.len() - 2]["message"],
        "the sandbox was restarted or stopped while the command ran"
    );
}

/// Whether no workspace volume of this instance belongs to sandbox `sid`
/// (a removed sandbox's goes right after the answer, in the background).
async fn no_volume_of(server: &TestServer, sid: &str) -> bool {
    server
        .volumes()
        .await
        .iter()
        .all(|v| v.labels.get("sandboxd.sandbox_id").map(String::as_str) != Some(sid))
}
