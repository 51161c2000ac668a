//! Faults short of an engine restart: sandboxd killed mid-command, many
//! clients creating, stopping and running in one session at once, a
//! container and its volume removed behind sandboxd's back, and an open
//! request that outlasts the idle TTL. (Stopped containers and a missing
//! image are in `sandboxes`, an engine that appears late in `engine`, an
//! engine restart in `engine_restart`.)

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

#[tokio::test]
async fn interleaved_calls_for_one_key_leave_engine_and_registry_agreeing() {
    let server = TestServer::start().await;
    let deadline = Instant::now() + Duration::from_secs(8);
    let client = |n: usize| {
        let server = &server;
        async move {
            let mut i = n;
            while Instant::now() < deadline {
                i += 1;
                let (s, v) = server
                    .post(
                        "/v1/sandboxes",
                        json!({"sessionKey": "storm", "network": {"mode": "none"}}),
                    )
                    .await;
                assert!(s == 200 || s == 429, "create: {s} {v}");
                let Some(id) = v["sandboxId"].as_str().map(str::to_string) else {
                    continue;
                };
                match i % 4 {
                    0 => {
                        let (s, v) = server
                            .post(&format!("/v1/sandboxes/{id}:stop"), json!(null))
                            .await;
                        assert_eq!(s, 200, "stop: {v}");
                    }
                    1 => {
                        let (s, v) = server
                            .post(
                                &format!("/v1/sandboxes/{id}/commands:run"),
                                json!({"command": "true"}),
                            )
                            .await;
                        assert!(s == 200 || s == 404, "run: {s} {v}");
                    }
                    2 => {
                        let (s, v) = server
                            .post(
                                &format!("/v1/sandboxes/{id}/files:write"),
                                json!({"files": [{"path": "x", "contentBase64": "eA=="}]}),
                            )
                            .await;
                        assert!(s == 200 || s == 404, "write: {s} {v}");
                    }
                    _ => {
                        let (s, v) = server.get(&format!("/v1/sandboxes/{id}")).await;
                        assert!(s == 200 || s == 404, "get: {s} {v}");
                    }
                }
            }
        }
    };
    futures_util::future::join_all((0..8).map(client)).await;
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
    let volumes = server.volumes().await;
    assert_eq!(
        volumes.len(),
        1,
        "one volume: {:?}",
        volumes.iter().map(|v| &v.name).collect::<Vec<_>>()
    );
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
