//! Ports: a server in a sandbox becomes a URL that works from the host;
//! publishing in the background after create, the first port taking the
//! spare proxy made ahead (cold and claimed) and a sandbox without ports
//! giving it back, the allowlist, network none,
//! concurrent lookups, `waitMs`, restarts of sandboxd and of the sandbox, a
//! stopped proxy, a taken relay port, cleanup (stop, idle expiry), proxy
//! hardening, and isolation between sandboxes; and a port reached by name
//! (`PORT-ID.HOST` in `Host`), allowlisted ports only, which keeps its
//! sandbox in use while its answer streams (a port's own URL does not).

use std::time::Duration;

use bollard::query_parameters::InspectContainerOptions;
use serde_json::{Value, json};

use crate::harness::{ServerOptions, TestServer, eventually};

/// Starts `script`, a server meant to outlive the test, as a command.
async fn start_server(server: &TestServer, sid: &str, script: &str) -> String {
    server
        .start_command(sid, json!({"command": script, "timeoutMs": 600000}))
        .await
}

/// A python http.server on 127.0.0.1:PORT serving `body` as index.html.
fn server_script(port: u16, body: &str) -> String {
    format!(
        "mkdir -p /tmp/site{port} && echo '{body}' > /tmp/site{port}/index.html && cd /tmp/site{port} && exec python3 -m http.server {port} --bind 127.0.0.1"
    )
}

async fn port(server: &TestServer, sid: &str, p: u16, query: &str) -> (u16, Value) {
    server
        .get(&format!("/v1/sandboxes/{sid}/ports/{p}{query}"))
        .await
}

async fn fetch(url: &str) -> Option<String> {
    let resp = reqwest::Client::new()
        .get(format!("{url}/index.html"))
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}

/// Polls `url` until it serves `body`, for at most `within`.
async fn serves_eventually(url: &str, body: &str, what: &str, within: Duration) {
    eventually(within, what, || async {
        fetch(url).await.as_deref() == Some(body)
    })
    .await;
}

async fn proxies(server: &TestServer, sid: &str) -> Vec<bollard::models::ContainerSummary> {
    server
        .containers_with("sandboxd.sandbox_id", sid)
        .await
        .into_iter()
        .filter(|c| {
            c.labels
                .as_ref()
                .and_then(|l| l.get("sandboxd.role"))
                .map(String::as_str)
                == Some("proxy")
        })
        .collect()
}

/// Sandbox `sid`'s proxy of port `p`, found by its name: a proxy made
/// for the port has the label `sandboxd.port`, a spare that became the
/// port's proxy (made before its port was known) only the name.
async fn proxy_of(
    server: &TestServer,
    sid: &str,
    p: u16,
) -> Option<bollard::models::ContainerInspectResponse> {
    server
        .docker
        .inspect_container(
            &format!("{}-{sid}-port-{p}", server.instance),
            None::<InspectContainerOptions>,
        )
        .await
        .ok()
}

/// The instance's spare proxies: (the sandbox id each is for, its
/// container id).
async fn spares(server: &TestServer) -> Vec<(String, String)> {
    server
        .containers_with("sandboxd.role", "proxy")
        .await
        .into_iter()
        .filter(|c| c.names.iter().flatten().any(|n| n.ends_with("-port-spare")))
        .filter_map(|c| Some((c.labels?.get("sandboxd.sandbox_id")?.clone(), c.id?)))
        .collect()
}

/// A label of an inspected container.
fn label<'a>(info: &'a bollard::models::ContainerInspectResponse, key: &str) -> Option<&'a str> {
    info.config
        .as_ref()?
        .labels
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

#[tokio::test]
async fn a_loopback_server_becomes_a_url_that_works_from_the_host() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "web", "ports": [3000, 4000]}))
        .await;
    start_server(
        &server,
        &sid,
        &server_script(3000, "hello from the sandbox"),
    )
    .await;
    let (s, v) = port(&server, &sid, 3000, "?waitMs=10000").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["found"], true);
    assert_eq!(v["ready"], true);
    let host_port = v["hostPort"].as_u64().expect("hostPort");
    let url = v["url"].as_str().expect("url").to_string();
    assert_eq!(url, format!("http://127.0.0.1:{host_port}"));
    assert_eq!(
        fetch(&url).await.as_deref(),
        Some("hello from the sandbox\n")
    );

    // Idempotent: same URL, one proxy.
    let (_, again) = port(&server, &sid, 3000, "").await;
    assert_eq!(again["url"], json!(url));
    assert_eq!(again.get("ready"), None, "ready only with waitMs");
    // The view shows it.
    let (_, view) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(view["ports"]["published"]["3000"], json!(host_port));

    // Not allowlisted, and bad ports.
    assert_eq!(
        port(&server, &sid, 5000, "").await,
        (200, json!({"found": false}))
    );
    for bad in ["0", "65536", "http", "-1", "+80", "80.0"] {
        let (s, _) = server
            .get(&format!("/v1/sandboxes/{sid}/ports/{bad}"))
            .await;
        assert_eq!(s, 400, "{bad}");
    }
    let (s, _) = port(&server, &sid, 3000, "?waitMs=60001").await;
    assert_eq!(s, 400);
    let (s, _) = port(&server, "0123456789abcdef01234567", 3000, "").await;
    assert_eq!(s, 404);

    // The proxies: hardened like a sandbox, bound to the publish address.
    // (Allowlisted ports are published ahead of time, so 4000 has one too;
    // one of the two was the spare made ahead, made from the same spec.)
    // Port 4000's is published in the background: wait until the spare
    // that one of the two takes has its port's name.
    eventually(Duration::from_secs(20), "both ports' proxies", || async {
        proxy_of(&server, &sid, 3000).await.is_some()
            && proxy_of(&server, &sid, 4000).await.is_some()
    })
    .await;
    assert_eq!(proxies(&server, &sid).await.len(), 2);
    for p in [3000, 4000] {
        let info = proxy_of(&server, &sid, p).await.expect("the port's proxy");
        assert_proxy_hardened(&server, &sid, info);
    }

    stop_leaves_nothing(&server, &sid).await;
    assert_eq!(fetch(&url).await, None);
}

/// `:stop` answers 200 once the sandbox's port proxies and its container
/// are gone; an untaken spare proxy and its link network go right after,
/// in the background.
async fn stop_leaves_nothing(server: &TestServer, sid: &str) {
    let (s, _) = server
        .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
        .await;
    assert_eq!(s, 200);
    let left = server.session_containers(sid).await;
    assert!(left.is_empty(), "containers of {sid} left: {left:?}");
    eventually(
        Duration::from_secs(20),
        "an untaken spare and the link network removed",
        || async {
            server
                .containers_with("sandboxd.sandbox_id", sid)
                .await
                .is_empty()
                && server
                    .networks_with("sandboxd.sandbox_id", sid)
                    .await
                    .is_empty()
        },
    )
    .await;
}

/// A port proxy as docs/API.md describes it: hardened like a sandbox,
/// bound to the publish address, labelled with its sandbox.
fn assert_proxy_hardened(
    server: &TestServer,
    sid: &str,
    info: bollard::models::ContainerInspectResponse,
) {
    let hc = info.host_config.expect("host config");
    assert_eq!(hc.readonly_rootfs, Some(true));
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    assert!(hc.cap_add.unwrap_or_default().is_empty());
    assert_eq!(
        hc.security_opt,
        Some(vec!["no-new-privileges:true".to_string()])
    );
    assert_eq!(hc.privileged, Some(false));
    assert!(hc.memory.is_some_and(|m| m > 0 && m <= 64 * 1024 * 1024));
    assert!(hc.pids_limit.is_some_and(|p| p > 0 && p <= 64));
    assert_eq!(
        info.config.as_ref().and_then(|c| c.user.clone()).as_deref(),
        Some("1000:1000")
    );
    let binding = hc
        .port_bindings
        .unwrap_or_default()
        .into_values()
        .flatten()
        .flatten()
        .next()
        .expect("binding");
    assert_eq!(binding.host_ip.as_deref(), Some("127.0.0.1"));
    let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
    assert_eq!(
        labels.get("sandboxd.role").map(String::as_str),
        Some("proxy")
    );
    assert!(labels.contains_key("sandboxd.relay_port"), "{labels:?}");
    assert_eq!(
        labels.get("sandboxd.sandbox_id").map(String::as_str),
        Some(sid)
    );
    assert_eq!(labels.get("sandboxd.instance"), Some(&server.instance));
}

/// A stop that lands while the allowlisted ports are still being published
/// in the background answers 200, and nothing of the sandbox stays: a proxy
/// that joins the link network meanwhile is removed with it.
#[tokio::test]
async fn a_stop_during_background_publishing_succeeds_and_leaves_nothing() {
    let server = TestServer::start().await;
    for round in 0..3 {
        let sid = server
            .create(
                json!({"sessionKey": format!("hasty-{round}"), "ports": [3000, 4000, 5000, 6000]}),
            )
            .await;
        // Positive control: publishing is under way or done, so the stop
        // can meet it (the link network is the first thing it makes).
        eventually(Duration::from_secs(10), "publishing began", || async {
            !server
                .networks_with("sandboxd.sandbox_id", &sid)
                .await
                .is_empty()
        })
        .await;
        let (s, v) = server
            .post(&format!("/v1/sandboxes/{sid}:stop"), json!(null))
            .await;
        assert_eq!(s, 200, "round {round}: {v}");
        eventually(
            Duration::from_secs(20),
            "nothing of the sandbox left",
            || async {
                server
                    .containers_with("sandboxd.sandbox_id", &sid)
                    .await
                    .is_empty()
                    && server
                        .networks_with("sandboxd.sandbox_id", &sid)
                        .await
                        .is_empty()
            },
        )
        .await;
    }
}

#[tokio::test]
async fn concurrent_gets_make_one_proxy_and_a_late_server_still_works() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "race", "ports": [8000]}))
        .await;
    let results =
        futures_util::future::join_all((0..4).map(|_| port(&server, &sid, 8000, ""))).await;
    let urls: Vec<&Value> = results
        .iter()
        .map(|(s, v)| {
            assert_eq!(*s, 200, "{v}");
            &v["url"]
        })
        .collect();
    assert!(urls.iter().all(|u| *u == urls[0]), "{urls:?}");
    assert_eq!(
        proxies(&server, &sid).await.len(),
        1,
        "one proxy for concurrent GETs"
    );
    // The server starts after the port was published.
    let url = urls[0].as_str().expect("url").to_string();
    assert_eq!(fetch(&url).await, None, "nothing listens yet");
    start_server(&server, &sid, &server_script(8000, "late")).await;
    serves_eventually(
        &url,
        "late\n",
        "the URL serves once the server listens",
        Duration::from_secs(15),
    )
    .await;
}

#[tokio::test]
async fn network_none_is_409() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "offline", "network": {"mode": "none"}, "ports": [3000]}))
        .await;
    let (s, v) = port(&server, &sid, 3000, "").await;
    assert_eq!((s, v["code"].clone()), (409, json!("no_network")), "{v}");
    assert!(proxies(&server, &sid).await.is_empty());
}

#[tokio::test]
async fn wait_ms_reports_ready_or_why_not() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "wait", "ports": [3000]}))
        .await;
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            json!({"command": "echo 'Error: Cannot find module vite'; exit 1"}),
        )
        .await;
    assert_eq!(s, 200);
    let started = std::time::Instant::now();
    let (s, v) = port(&server, &sid, 3000, "?waitMs=1500").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["ready"], false);
    assert!(
        v["lastOutput"]
            .as_str()
            .unwrap_or("")
            .contains("Cannot find module vite"),
        "{v}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "it waited"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    start_server(
        &server,
        &sid,
        &format!("sleep 1; {}", server_script(3000, "up")),
    )
    .await;
    let (_, v) = port(&server, &sid, 3000, "?waitMs=15000").await;
    assert_eq!(v["ready"], true, "{v}");
    assert_eq!(v.get("lastOutput"), None);
    assert_eq!(
        fetch(v["url"].as_str().expect("url")).await.as_deref(),
        Some("up\n")
    );
}

#[tokio::test]
async fn urls_survive_a_sandboxd_restart_and_relays_come_back_after_a_sandbox_restart() {
    let mut server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "keep", "ports": [3000]}))
        .await;
    start_server(&server, &sid, &server_script(3000, "kept")).await;
    let (_, v) = port(&server, &sid, 3000, "?waitMs=10000").await;
    let url = v["url"].as_str().expect("url").to_string();
    assert_eq!(fetch(&url).await.as_deref(), Some("kept\n"));

    server.restart().await;
    assert_eq!(
        fetch(&url).await.as_deref(),
        Some("kept\n"),
        "the proxy kept running"
    );
    let (_, v) = port(&server, &sid, 3000, "").await;
    assert_eq!(v["url"], json!(url), "same host port after the restart");
    assert_eq!(proxies(&server, &sid).await.len(), 1);

    // A sandbox restart ends the server and the relay; the next GET brings
    // the relay back, and the URL works once the server runs again.
    let (s, _) = server
        .post(&format!("/v1/sandboxes/{sid}:restart"), json!(null))
        .await;
    assert_eq!(s, 200);
    start_server(&server, &sid, &server_script(3000, "again")).await;
    let (_, v) = port(&server, &sid, 3000, "?waitMs=10000").await;
    assert_eq!(v["ready"], true);
    assert_eq!(v["url"], json!(url));
    serves_eventually(
        &url,
        "again\n",
        "served after the sandbox restart",
        Duration::from_secs(10),
    )
    .await;

    // The relay is the agent's: killing the agent from inside ends the
    // sandbox's processes; the next GET starts it again with its relay, and
    // the URL works once the server runs again.
    // The killing command goes with the agent (an exec's output could be
    // lost with its container, so its end is what says the kill happened).
    let killed = server
        .sh(&sid, "pkill -KILL -f '^/.sandboxd/sandboxd-agent serve'")
        .await;
    assert_eq!(killed["exitCode"], 137, "{killed}");
    let (s, v) = port(&server, &sid, 3000, "").await;
    assert_eq!((s, v["url"].clone()), (200, json!(url)), "{v}");
    start_server(
        &server,
        &sid,
        "mkdir -p /tmp/s && cd /tmp/s && echo again > index.html && exec python3 -m http.server 3000 --bind 127.0.0.1",
    )
    .await;
    serves_eventually(
        &url,
        "again\n",
        "served after the agent died",
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test]
async fn sandboxes_cannot_reach_each_other() {
    let server = TestServer::start().await;
    let a = server
        .create(json!({"sessionKey": "a", "ports": [3000]}))
        .await;
    let b = server.create(json!({"sessionKey": "b"})).await;
    // a serves on all interfaces, and is published (link network exists).
    start_server(&server, &a, "mkdir -p /tmp/s && cd /tmp/s && echo secret > index.html && exec python3 -m http.server 3000 --bind 0.0.0.0").await;
    let (_, v) = port(&server, &a, 3000, "?waitMs=10000").await;
    assert_eq!(v["ready"], true);
    let info = server.inspect(&a).await;
    let ips: Vec<String> = info
        .network_settings
        .and_then(|n| n.networks)
        .unwrap_or_default()
        .values()
        .filter_map(|e| e.ip_address.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    assert!(!ips.is_empty(), "a's link network address: {ips:?}");
    for ip in ips {
        // The control: the address serves a's server, from a itself.
        let own = server
            .sh(
                &a,
                &format!("curl -s -m 2 --noproxy '*' http://{ip}:3000/index.html"),
            )
            .await;
        assert_eq!(own["stdout"], "secret\n", "{own}");
        let relay = sandboxd::ports::relay_port(3000);
        for p in [3000, relay] {
            // Through b's egress proxy (its default) and around it.
            let script = format!(
                "curl -s -m 2 http://{ip}:{p}/index.html; echo; curl -s -m 2 --noproxy '*' http://{ip}:{p}/index.html; echo done"
            );
            let r = server.sh(&b, &script).await;
            let out = r["stdout"].as_str().unwrap_or_default();
            assert!(out.ends_with("done\n"), "{r}");
            assert!(
                !out.contains("secret"),
                "sandbox b reached a at {ip}:{p}: {out}"
            );
        }
    }
}

/// Allowlisted ports are published in the background right after create:
/// the proxy exists, and the view lists its host port, before any `GET` of
/// the port.
#[tokio::test]
async fn allowlisted_ports_are_published_after_create_without_a_get() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "ahead", "ports": [3000]}))
        .await;
    eventually(
        Duration::from_secs(20),
        "a running proxy for port 3000",
        || async {
            proxy_of(&server, &sid, 3000)
                .await
                .and_then(|i| i.state?.running)
                == Some(true)
        },
    )
    .await;
    let proxy = &proxies(&server, &sid).await[0];
    let host_port = proxy
        .ports
        .as_ref()
        .and_then(|ps| ps.iter().find_map(|p| p.public_port))
        .expect("the proxy's published port");
    eventually(
        Duration::from_secs(10),
        "the view lists the published port",
        || async {
            let (_, view) = server.get(&format!("/v1/sandboxes/{sid}")).await;
            view["ports"]["published"]["3000"] == json!(host_port)
        },
    )
    .await;
}

/// A proxy found stopped is replaced on the next `GET` of its port, and the
/// URL that `GET` answers works again.
#[tokio::test]
async fn a_stopped_proxy_is_replaced_on_the_next_get() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "revive", "ports": [3000]}))
        .await;
    start_server(&server, &sid, &server_script(3000, "revived")).await;
    let (s, v) = port(&server, &sid, 3000, "?waitMs=10000").await;
    assert_eq!((s, v["ready"].clone()), (200, json!(true)), "{v}");
    let mut url = v["url"].as_str().expect("url").to_string();
    assert_eq!(fetch(&url).await.as_deref(), Some("revived\n"));

    // Three rounds: a replacement answers its GET only once it listens, so
    // the URL serves at once, not eventually (a started proxy that was not
    // listening yet refused the first request).
    for round in 0..3 {
        let old = proxies(&server, &sid).await;
        assert_eq!(old.len(), 1);
        let old_id = old[0].id.clone().expect("proxy id");
        server
            .docker
            .stop_container(
                &old_id,
                None::<bollard::query_parameters::StopContainerOptions>,
            )
            .await
            .expect("stop the proxy");
        // The stop broke the URL, so a working URL below is the replacement's.
        assert_eq!(fetch(&url).await, None, "the stopped proxy serves nothing");

        let (s, v) = port(&server, &sid, 3000, "").await;
        assert_eq!((s, v["found"].clone()), (200, json!(true)), "{v}");
        let new = proxies(&server, &sid).await;
        assert_eq!(new.len(), 1, "one proxy, not two");
        assert_ne!(new[0].id.as_ref(), Some(&old_id), "the proxy was replaced");
        let host_port = new[0]
            .ports
            .as_ref()
            .and_then(|ps| ps.iter().find_map(|p| p.public_port))
            .expect("the new proxy's published port");
        assert_eq!(v["hostPort"], json!(host_port), "{v}");
        url = v["url"].as_str().expect("url").to_string();
        assert_eq!(
            fetch(&url).await.as_deref(),
            Some("revived\n"),
            "round {round}: the new URL serves the moment its GET answers"
        );
    }
}

/// The relay listens on `relay_port(PORT)` in the sandbox; when a process
/// there holds that port, the `GET` is `502 port_publish_failed`, and the
/// same port publishes once it is free.
#[tokio::test]
async fn a_taken_relay_port_is_port_publish_failed() {
    let server = TestServer::start().await;
    let relay = sandboxd::ports::relay_port(3000);
    // No ports at create, so nothing publishes before the holder runs.
    let sid = server.create(json!({"sessionKey": "taken"})).await;
    let holder = server
        .start_command(
            &sid,
            json!({"command": format!(
                "exec python3 -c 'import socket, time; s = socket.socket(); s.bind((\"0.0.0.0\", {relay})); s.listen(); time.sleep(600)'"
            ), "timeoutMs": 600000}),
        )
        .await;
    eventually(
        Duration::from_secs(15),
        "the holder listens on the relay port",
        || async {
            server
                .sh(
                    &sid,
                    &format!("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {relay}), 1)'"),
                )
                .await["exitCode"]
                == 0
        },
    )
    .await;
    // The spare proxy made ahead went back after the create (no ports): the
    // port cannot take it and its relay port, and makes its own.
    eventually(Duration::from_secs(20), "no spare left", || async {
        proxies(&server, &sid).await.is_empty()
    })
    .await;
    // A reconnect adds the port to the allowlist (its background publish
    // fails and is only logged).
    let (s, v) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "taken", "ports": [3000]}),
        )
        .await;
    assert_eq!((s, v["created"].clone()), (200, json!(false)), "{v}");
    let (s, v) = port(&server, &sid, 3000, "").await;
    assert_eq!(
        (s, v["code"].clone()),
        (502, json!("port_publish_failed")),
        "{v}"
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("port {relay}, which relays port 3000, is taken")),
        "the reason is the taken relay port: {v}"
    );

    // Control: the same port publishes once the holder is gone.
    let (s, _) = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands/{holder}:kill"),
            json!(null),
        )
        .await;
    assert_eq!(s, 200);
    server.wait_command(&sid, &holder).await;
    start_server(&server, &sid, &server_script(3000, "free")).await;
    let (s, v) = port(&server, &sid, 3000, "?waitMs=10000").await;
    assert_eq!((s, v["ready"].clone()), (200, json!(true)), "{v}");
    // The proxy was made by this GET and may not listen yet.
    let url = v["url"].as_str().expect("url").to_string();
    eventually(Duration::from_secs(10), "the URL serves", || async {
        fetch(&url).await.as_deref() == Some("free\n")
    })
    .await;
}

/// Idle expiry removes the sandbox's proxies and its link network with it.
#[tokio::test]
async fn idle_expiry_removes_the_proxies_and_the_link_network() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "idle", "ports": [3000], "idleTtlMs": 10000}))
        .await;
    // Control: there is something to remove, made in the background.
    eventually(
        Duration::from_secs(10),
        "the proxy and the link network",
        || async {
            !proxies(&server, &sid).await.is_empty()
                && !server
                    .networks_with("sandboxd.sandbox_id", &sid)
                    .await
                    .is_empty()
        },
    )
    .await;
    eventually(
        Duration::from_secs(40),
        "the sandbox expired and nothing of it is left",
        || async {
            let expired = server
                .log_text()
                .lines()
                .any(|l| l.contains("sandbox expired") && l.contains(&sid));
            expired
                && server
                    .containers_with("sandboxd.sandbox_id", &sid)
                    .await
                    .is_empty()
                && server
                    .networks_with("sandboxd.sandbox_id", &sid)
                    .await
                    .is_empty()
        },
    )
    .await;
    assert_eq!(server.get(&format!("/v1/sandboxes/{sid}")).await.0, 404);
}

/// Waits until the link network made ahead (with its spare proxy) is
/// ready, and returns the spare: (the id the next sandbox takes, its
/// container id).
async fn spare_made_ahead(server: &TestServer) -> (String, String) {
    eventually(
        Duration::from_secs(30),
        "the link network made ahead",
        || server.link_ready(),
    )
    .await;
    let list = spares(server).await;
    assert_eq!(list.len(), 1, "one spare, the next sandbox's: {list:?}");
    list[0].clone()
}

/// A cold create on the link network made ahead: its first port takes the
/// spare proxy made with it (the same container, renamed, forwarding to
/// the spare's relay port), whose URL serves the moment the `GET` answers;
/// a second port gets a proxy of its own; both URLs survive a restart of
/// sandboxd; stop removes them all.
#[tokio::test]
async fn a_cold_create_s_first_port_takes_the_spare_made_ahead() {
    let mut server = TestServer::start().await;
    let (next_id, spare_id) = spare_made_ahead(&server).await;
    let sid = server
        .create(json!({"sessionKey": "spare", "ports": [3000, 4000]}))
        .await;
    assert_eq!(sid, next_id, "the create took the link network made ahead");
    start_server(&server, &sid, &server_script(3000, "first")).await;
    start_server(&server, &sid, &server_script(4000, "second")).await;
    let mut urls = Vec::new();
    for (p, body) in [(3000, "first\n"), (4000, "second\n")] {
        let (s, v) = port(&server, &sid, p, "?waitMs=10000").await;
        assert_eq!((s, v["ready"].clone()), (200, json!(true)), "{v}");
        let url = v["url"].as_str().expect("url").to_string();
        assert_eq!(fetch(&url).await.as_deref(), Some(body), "port {p}");
        urls.push((p, url, body));
    }
    let first = proxy_of(&server, &sid, 3000).await.expect("3000's proxy");
    assert_eq!(first.id.as_ref(), Some(&spare_id), "3000 took the spare");
    assert_eq!(label(&first, "sandboxd.relay_port"), Some("49151"));
    let second = proxy_of(&server, &sid, 4000).await.expect("4000's proxy");
    assert_ne!(second.id.as_ref(), Some(&spare_id));
    let own_relay = sandboxd::ports::relay_port(4000).to_string();
    assert_eq!(
        label(&second, "sandboxd.relay_port"),
        Some(own_relay.as_str())
    );
    assert_eq!(label(&second, "sandboxd.port"), Some("4000"));
    assert_proxy_hardened(&server, &sid, first);
    assert_eq!(proxies(&server, &sid).await.len(), 2, "no spare left over");

    // After a restart, each proxy is adopted for its own port (the spare's
    // by its name) and relays to the right one.
    server.restart().await;
    for (p, url, body) in &urls {
        let (s, v) = port(&server, &sid, *p, "").await;
        assert_eq!((s, v["url"].clone()), (200, json!(url)), "{v}");
        assert_eq!(fetch(url).await.as_deref(), Some(*body), "port {p}");
    }
    // A sandbox restart ends the relays; the next GET brings the spare's
    // relay port back for 3000, read from its proxy's label.
    let (s, _) = server
        .post(&format!("/v1/sandboxes/{sid}:restart"), json!(null))
        .await;
    assert_eq!(s, 200);
    start_server(&server, &sid, &server_script(3000, "again")).await;
    let (s, v) = port(&server, &sid, 3000, "?waitMs=10000").await;
    assert_eq!((s, v["url"].clone()), (200, json!(urls[0].1)), "{v}");
    serves_eventually(
        &urls[0].1,
        "again\n",
        "the spare's URL after a sandbox restart",
        Duration::from_secs(10),
    )
    .await;

    stop_leaves_nothing(&server, &sid).await;
    for (_, url, _) in &urls {
        assert_eq!(fetch(url).await, None);
    }
}

/// A claimed pool member's first port takes the spare made with the
/// member; a member claimed without ports, like a cold create without
/// them, gives its spare back once settled; stop leaves nothing.
#[tokio::test]
async fn a_claim_s_first_port_takes_the_member_s_spare_and_no_ports_keep_none() {
    let server = TestServer::start_with(
        crate::harness::ServerOptions::default().env("SANDBOXD_POOL_SIZE", "1"),
    )
    .await;
    crate::pool::wait_for_members(&server, "default", 1).await;
    let before = spares(&server).await;
    let sid = server
        .create(json!({"sessionKey": "claimed-port", "ports": [3000]}))
        .await;
    assert!(
        crate::pool::from_pool(&server, &sid),
        "the create was a claim"
    );
    let spare_id = before
        .iter()
        .find(|(owner, _)| *owner == sid)
        .map(|(_, id)| id.clone())
        .unwrap_or_else(|| panic!("the member {sid} had a spare: {before:?}"));
    start_server(&server, &sid, &server_script(3000, "claimed")).await;
    let (s, v) = port(&server, &sid, 3000, "?waitMs=10000").await;
    assert_eq!((s, v["ready"].clone()), (200, json!(true)), "{v}");
    let url = v["url"].as_str().expect("url").to_string();
    assert_eq!(fetch(&url).await.as_deref(), Some("claimed\n"));
    let proxy = proxy_of(&server, &sid, 3000).await.expect("3000's proxy");
    assert_eq!(proxy.id.as_ref(), Some(&spare_id), "3000 took the spare");

    // Claimed without ports: the member had a spare (the control), and
    // gives it back.
    crate::pool::wait_for_members(&server, "default", 1).await;
    let before = spares(&server).await;
    let bare = server.create(json!({"sessionKey": "claimed-bare"})).await;
    assert!(
        crate::pool::from_pool(&server, &bare),
        "the create was a claim"
    );
    assert!(
        before.iter().any(|(owner, _)| *owner == bare),
        "the member {bare} had a spare: {before:?}"
    );
    eventually(
        Duration::from_secs(40),
        "the claimed member without ports gave its spare back",
        || async { proxies(&server, &bare).await.is_empty() },
    )
    .await;

    for id in [&sid, &bare] {
        stop_leaves_nothing(&server, id).await;
    }
    assert_eq!(fetch(&url).await, None);
}

/// A cold create without ports on the link network made ahead gives the
/// spare made with it back once settled.
#[tokio::test]
async fn a_cold_create_without_ports_gives_the_spare_back() {
    let server = TestServer::start().await;
    let (next_id, _) = spare_made_ahead(&server).await;
    let sid = server.create(json!({"sessionKey": "bare"})).await;
    assert_eq!(
        sid, next_id,
        "the create took the link network (and spare) made ahead"
    );
    eventually(
        Duration::from_secs(40),
        "the sandbox without ports gave its spare back",
        || async { proxies(&server, &sid).await.is_empty() },
    )
    .await;
    // Its way out is untouched: the sandbox is still on its link network.
    assert!(
        !server
            .networks_with("sandboxd.sandbox_id", &sid)
            .await
            .is_empty()
    );
}

/// GET `path` from sandboxd's own address with `host` as `Host`: the
/// status and body.
async fn by_host_at(server: &TestServer, host: &str, path: &str) -> (u16, String) {
    let resp = reqwest::Client::new()
        .get(format!("{}{path}", server.base))
        .header("host", host)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("sandboxd answers");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

async fn by_host(server: &TestServer, host: &str) -> (u16, String) {
    by_host_at(server, host, "/index.html").await
}

#[tokio::test]
async fn a_port_host_reaches_an_allowlisted_port_without_the_token_and_no_other() {
    let server = TestServer::start_with(ServerOptions::default().token("port-host-token")).await;
    let sid = server
        .create(json!({"sessionKey": "by-name", "ports": [3000]}))
        .await;
    start_server(&server, &sid, &server_script(3000, "reached by name")).await;
    start_server(&server, &sid, &server_script(3001, "not allowlisted")).await;
    let authority = server.base.trim_start_matches("http://").to_string();
    let named = |p: u16| format!("{p}-{sid}.{authority}");
    // No token: a port's name opens the port as its URL does, not the API.
    eventually(
        Duration::from_secs(30),
        "port 3000 answers by name",
        || async { by_host(&server, &named(3000)).await == (200, "reached by name\n".to_string()) },
    )
    .await;
    // Positive control: 3001 does serve inside the sandbox.
    let inside = server
        .sh(
            &sid,
            "for i in $(seq 50); do python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:3001/').read().decode(), end='')\" && exit 0; sleep 0.2; done; exit 1",
        )
        .await;
    assert_eq!(inside["stdout"], "not allowlisted\n", "{inside}");
    let (status, body) = by_host(&server, &named(3001)).await;
    assert_eq!(status, 403, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["sandboxId"], sid.as_str(), "{v}");
    assert_eq!(v["port"], 3001, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("not one of this sandbox's ports")),
        "{v}"
    );
    assert!(
        proxy_of(&server, &sid, 3001).await.is_none(),
        "no proxy was made for a port that is not allowlisted"
    );
    // The API itself still wants its token under the plain name.
    let (status, _) = by_host_at(&server, &authority, "/v1/sandboxes").await;
    assert_eq!(
        status, 401,
        "the API under sandboxd's own name wants the token"
    );
    let (status, _) = by_host_at(&server, &named(3000), "/v1/sandboxes").await;
    assert_eq!(
        status, 404,
        "the API's path under a port's name is the port's"
    );
}

/// A python server on 127.0.0.1:PORT whose every answer is a line a second
/// for SECS seconds, started in the background: the command ends at once
/// and the server stays, a leftover, which keeps nothing busy.
fn slow_server_script(port: u16, secs: u32) -> String {
    format!(
        r#"cat > /tmp/slow{port}.py <<'PY'
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        for _ in range({secs}):
            self.wfile.write(b"tick\n")
            self.wfile.flush()
            time.sleep(1)
http.server.ThreadingHTTPServer(("127.0.0.1", {port}), H).serve_forever()
PY
nohup python3 /tmp/slow{port}.py >/dev/null 2>&1 &"#
    )
}

/// Sends GET `url` (with `host` as `Host` if given) until it answers 200,
/// for at most 30 s: the server may still be starting.
async fn slow_answer(url: &str, host: Option<&str>) -> reqwest::Response {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut req = reqwest::Client::new().get(url);
        if let Some(host) = host {
            req = req.header("host", host);
        }
        if let Ok(resp) = req.send().await
            && resp.status() == 200
        {
            return resp;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{url} never answered 200"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A request by name is a use of its sandbox while its answer streams:
/// a sandbox with a 10 s idle TTL outlives it, then idles out as usual.
#[tokio::test]
async fn a_request_by_name_keeps_its_sandbox_from_idling_out_until_its_answer_ends() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "by-name-idle", "ports": [3000], "idleTtlMs": 10000}))
        .await;
    let started = server.sh(&sid, &slow_server_script(3000, 16)).await;
    assert_eq!(started["exitCode"], 0, "{started}");
    let authority = server.base.trim_start_matches("http://");
    let host = format!("3000-{sid}.{authority}");
    let mut answer = slow_answer(&format!("{}/", server.base), Some(&host)).await;
    let reading = tokio::spawn(async move {
        let mut got = 0;
        while let Ok(Some(chunk)) = answer.chunk().await {
            got += chunk.len();
        }
        got
    });
    // Past its 10 s TTL with the answer still streaming: a time, not a
    // condition.
    tokio::time::sleep(Duration::from_secs(13)).await;
    assert!(
        server.listed_sandboxes().await.contains(&sid),
        "a request by name still streaming keeps its sandbox"
    );
    let got = reading.await.expect("the reader");
    assert_eq!(got, 16 * "tick\n".len(), "the whole answer arrived");
    // The answer has ended: the sandbox idles out like any other.
    eventually(
        Duration::from_secs(40),
        "the idle sandbox to be stopped",
        || async { !server.listed_sandboxes().await.contains(&sid) },
    )
    .await;
}

/// A request to the port's own URL does not pass through sandboxd: while
/// one streams, the sandbox still idles out (and the answer is cut short).
#[tokio::test]
async fn a_request_to_a_ports_own_url_does_not_keep_its_sandbox() {
    let server = TestServer::start().await;
    let sid = server
        .create(json!({"sessionKey": "url-idle", "ports": [3000], "idleTtlMs": 10000}))
        .await;
    let started = server.sh(&sid, &slow_server_script(3000, 60)).await;
    assert_eq!(started["exitCode"], 0, "{started}");
    let (status, v) = port(&server, &sid, 3000, "").await;
    assert_eq!(status, 200, "{v}");
    let url = v["url"].as_str().expect("a url").to_string();
    let mut answer = slow_answer(&format!("{url}/"), None).await;
    // Positive control: the answer does stream through the URL.
    let first = answer.chunk().await.expect("a chunk");
    assert_eq!(first.as_deref(), Some(&b"tick\n"[..]));
    let reading = tokio::spawn(async move {
        let mut got = first.map_or(0, |c| c.len());
        while let Ok(Some(chunk)) = answer.chunk().await {
            got += chunk.len();
        }
        got
    });
    eventually(
        Duration::from_secs(40),
        "the sandbox to idle out while its port's URL streams",
        || async { !server.listed_sandboxes().await.contains(&sid) },
    )
    .await;
    let got = reading.await.expect("the reader");
    assert!(
        got < 60 * "tick\n".len(),
        "the answer was cut short by the stop ({got} bytes)"
    );
}
