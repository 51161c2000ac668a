//! Egress policy: what a sandbox's network reaches in each mode. The
//! "internet" is a network namespace on this machine (harness/fakenet.rs):
//! a "public" server on 203.0.113.10, a "private" one on 10.250.77.10 and
//! a name server that answers the test's names; the engine host is a
//! listener the test binds. Every refusal is checked next to a positive
//! control through the same route, and the private server's and the host
//! listener's counts show that nothing refused got through.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::fakenet::{DNS, FakeNet, HOST_SIDE, PRIVATE, PUBLIC};
use crate::harness::{ServerOptions, TestServer, eventually};

/// A sandboxd whose egress proxies ask the fake name server.
async fn server(extra: &[(&str, &str)]) -> TestServer {
    let mut options = ServerOptions::default().env("SANDBOXD_EGRESS_DNS", DNS);
    for (k, v) in extra {
        options = options.env(k, v);
    }
    TestServer::start_with(options).await
}

/// What `curl <args>` in the sandbox got: the HTTP status (0: no answer
/// at all) and the body.
async fn curl(server: &TestServer, sid: &str, args: &str) -> (u16, String) {
    let out = server
        .sh(
            sid,
            &format!("curl -sS --max-time 10 -o /tmp/body -w '%{{http_code}}' {args}; echo; cat /tmp/body 2>/dev/null; rm -f /tmp/body"),
        )
        .await;
    let stdout = out["stdout"].as_str().unwrap_or_default();
    let (code, body) = stdout.split_once('\n').unwrap_or((stdout, ""));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A listener on every address of the engine host; counts connections.
async fn host_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, count)
}

/// The gateway address of an engine network: the host, as its
/// containers see it (for a link network, whose gateway address is never
/// assigned, the address the engine reserves for it: the block's first).
async fn gateway(server: &TestServer, network: &str) -> String {
    let n = server
        .docker
        .inspect_network(
            network,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .expect("network");
    let config = n
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().next())
        .expect("an address range");
    config.gateway.unwrap_or_else(|| {
        let subnet = config.subnet.expect("subnet");
        let base: std::net::Ipv4Addr = subnet
            .split('/')
            .next()
            .and_then(|b| b.parse().ok())
            .expect("an IPv4 subnet");
        std::net::Ipv4Addr::from(u32::from(base) + 1).to_string()
    })
}

fn refused(what: &str, (code, body): &(u16, String)) {
    assert_eq!(*code, 403, "{what}: {code} {body}");
    assert!(body.contains("refused"), "{what}: the reason line: {body}");
}

#[tokio::test]
async fn internet_reaches_public_addresses_and_never_the_host_or_private_ones() {
    let net = FakeNet::start().await;
    let (host_port, host_hits) = host_listener().await;
    let server = server(&[]).await;
    // What RemcoChat sends.
    let sid = server
        .create(json!({"sessionKey": "egress", "network": {"mode": "default"}}))
        .await;
    let (_, info) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(info["network"]["mode"], "internet", "{info}");

    // Positive controls: by name and by address, plain and tunnelled.
    let public = |r: (u16, String)| assert_eq!(r, (200, "public\n".into()));
    public(curl(&server, &sid, "http://public.test/").await);
    public(curl(&server, &sid, &format!("http://{PUBLIC}/")).await);
    public(curl(&server, &sid, "--proxytunnel http://public.test/").await);
    public(curl(&server, &sid, &format!("http://{PUBLIC}:8022/")).await);
    let py = server
        .sh(
            &sid,
            "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://public.test/\").read().decode(), end=\"\")'",
        )
        .await;
    assert_eq!(py["stdout"], "public\n", "python's urllib: {py}");
    // Node 18's own fetch ignores the proxy variables (docs/API.md says
    // so): it gets no connection, rather than going around the proxy.
    let node = server
        .sh(
            &sid,
            "node -e 'fetch(\"http://public.test/\").then(() => console.log(\"reached\"), () => console.log(\"no connection\"))'",
        )
        .await;
    assert_eq!(node["stdout"], "no connection\n", "node's fetch: {node}");
    // Package managers as they are (RemcoChat installs with both).
    let pip = server
        .sh(
            &sid,
            "pip install -q --disable-pip-version-check --no-cache-dir --user --break-system-packages \
               --index-url http://public.test/simple/ --trusted-host public.test sbtpkg \
             && python3 -c 'import sbtpkg; print(sbtpkg.VALUE)'",
        )
        .await;
    assert_eq!(pip["stdout"], "installed\n", "pip: {pip}");
    let npm = server
        .sh(
            &sid,
            "mkdir -p npmtest && cd npmtest && npm install --silent --no-audit --no-fund --registry http://public.test/npm/ sbtpkg \
             && node -e 'process.stdout.write(require(\"sbtpkg\") + \"\\n\")'",
        )
        .await;
    assert_eq!(npm["stdout"], "installed\n", "npm: {npm}");

    // Private addresses: by address, by name, a name with a private
    // answer among public ones, an unusual port, a tunnel, IPv6.
    let private_before = net.hits(PRIVATE).await;
    refused(
        "private address",
        &curl(&server, &sid, &format!("http://{PRIVATE}/")).await,
    );
    refused(
        "private name",
        &curl(&server, &sid, "http://private.test/").await,
    );
    refused(
        "mixed answers",
        &curl(&server, &sid, "http://mixed.test/").await,
    );
    refused(
        "unusual port",
        &curl(&server, &sid, &format!("http://{PRIVATE}:8022/")).await,
    );
    let tunnel = server
        .sh(
            &sid,
            &format!("curl -s -o /dev/null -w '%{{http_connect}}' --proxytunnel http://{PRIVATE}/"),
        )
        .await;
    assert_eq!(
        tunnel["stdout"], "403",
        "a CONNECT to a private address: {tunnel}"
    );
    refused(
        "IPv6 unique-local",
        &curl(&server, &sid, "http://v6private.test/").await,
    );
    refused(
        "IPv6 literal",
        &curl(&server, &sid, "http://[fd00::10]/").await,
    );
    refused(
        "IPv4-mapped IPv6",
        &curl(&server, &sid, &format!("http://[::ffff:{PRIVATE}]/")).await,
    );
    refused(
        "loopback",
        &curl(&server, &sid, "--noproxy '' http://127.0.0.1:3128/").await,
    );
    // A redirect to a private address: the follow-up request is checked.
    let redirected = curl(&server, &sid, "-L http://public.test/redirect-private").await;
    refused("redirect to private", &redirected);
    // DNS rebinding: the name answers public, then private, then public
    // (TTL 0). Whatever it answers, the proxy connects only to the address
    // it checked.
    let (mut served, mut refusals) = (0, 0);
    for i in 0..10 {
        let r = curl(&server, &sid, "http://rebind.test/").await;
        match r.0 {
            200 if r.1 == "public\n" => served += 1,
            403 => refusals += 1,
            _ => panic!("rebinding round {i}: {r:?}"),
        }
    }
    assert!(
        served > 0 && refusals > 0,
        "the name did change its answer: {served} served, {refusals} refused"
    );
    // Around the proxy: without its variables there is no route at all.
    let public_before = net.hits(PUBLIC).await;
    for target in [PUBLIC, PRIVATE] {
        let direct = curl(
            &server,
            &sid,
            &format!("--noproxy '*' --connect-timeout 3 http://{target}/"),
        )
        .await;
        assert_eq!(direct.0, 0, "direct to {target}: {direct:?}");
    }
    let unset = server
        .sh(
            &sid,
            &format!("unset HTTP_PROXY http_proxy; env | grep -ic _proxy=; curl -sS --connect-timeout 3 http://{PUBLIC}/ || echo no-route"),
        )
        .await;
    assert!(
        unset["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("no-route"),
        "with the variables unset: {unset}"
    );
    assert_eq!(
        net.hits(PUBLIC).await,
        public_before,
        "nothing went around the proxy"
    );
    assert_eq!(
        net.hits(PRIVATE).await,
        private_before,
        "the private server got nothing"
    );

    // The engine host: its listener answers the test (positive control),
    // and never a sandbox: through the proxy at the instance network's
    // gateway, at the host's own address on the fake internet's link, and
    // directly at the link network's gateway address.
    tokio::net::TcpStream::connect(("127.0.0.1", host_port))
        .await
        .expect("the host listener works");
    eventually(
        Duration::from_secs(5),
        "the listener counts the test's connection",
        || async { host_hits.load(Ordering::SeqCst) == 1 },
    )
    .await;
    let hits_before = host_hits.load(Ordering::SeqCst);
    let instance_gw = gateway(&server, &format!("{}-net", server.instance)).await;
    refused(
        "the host at the bridge gateway",
        &curl(&server, &sid, &format!("http://{instance_gw}:{host_port}/")).await,
    );
    refused(
        "the host at its own address",
        &curl(&server, &sid, &format!("http://{HOST_SIDE}:{host_port}/")).await,
    );
    let link_gw = gateway(&server, &format!("{}-{sid}-link", server.instance)).await;
    for target in [instance_gw.as_str(), link_gw.as_str(), HOST_SIDE] {
        let direct = curl(
            &server,
            &sid,
            &format!("--noproxy '*' --connect-timeout 3 http://{target}:{host_port}/"),
        )
        .await;
        assert_eq!(direct.0, 0, "direct to the host at {target}: {direct:?}");
    }
    assert_eq!(
        host_hits.load(Ordering::SeqCst),
        hits_before,
        "no sandbox reached the host"
    );

    // Refusals are counted and logged with the sandbox and destination.
    eventually(
        Duration::from_secs(10),
        "the refusals are logged",
        || async {
            server.log_text().contains("egress_denied")
                && server.log_text().contains(&format!("{PRIVATE}:80"))
        },
    )
    .await;
    let log = server.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("egress_denied") && l.contains(&format!("{PRIVATE}:80")))
        .expect("a refusal line");
    assert!(line.contains(&sid), "the line names the sandbox: {line}");
    let metrics = server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let denied: f64 = metrics
        .lines()
        .find(|l| l.starts_with("sandboxd_egress_denied_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("the denial counter");
    assert!(denied >= 8.0, "denials counted: {denied}");
}

#[tokio::test]
async fn allowlist_reaches_only_listed_names_and_never_private_answers() {
    let net = FakeNet::start().await;
    let server = server(&[]).await;
    let sid = server
        .create(json!({"sessionKey": "allow", "network": {"mode": "allowlist", "allow": ["allowed.test", "*.allowed.test"]}}))
        .await;
    let (_, info) = server.get(&format!("/v1/sandboxes/{sid}")).await;
    assert_eq!(info["network"]["mode"], "allowlist", "{info}");
    assert_eq!(
        info["network"]["allow"],
        json!(["allowed.test", "*.allowed.test"])
    );
    let ok = (200, "public\n".to_string());
    assert_eq!(curl(&server, &sid, "http://allowed.test/").await, ok);
    assert_eq!(curl(&server, &sid, "http://sub.allowed.test/").await, ok);
    assert_eq!(
        curl(&server, &sid, "--proxytunnel http://allowed.test/").await,
        ok
    );
    // The same server under a name not listed, or by address: refused.
    refused(
        "an unlisted name",
        &curl(&server, &sid, "http://public.test/").await,
    );
    refused(
        "an unlisted address",
        &curl(&server, &sid, &format!("http://{PUBLIC}/")).await,
    );
    // A listed name that resolves privately: still refused.
    let private_before = net.hits(PRIVATE).await;
    refused(
        "a listed name, private",
        &curl(&server, &sid, "http://privately.allowed.test/").await,
    );
    assert_eq!(net.hits(PRIVATE).await, private_before);

    // A listed CIDR allows its addresses.
    let sid2 = server
        .create(json!({"sessionKey": "allow-cidr", "network": {"mode": "allowlist", "allow": [format!("{PUBLIC}/32")]}}))
        .await;
    assert_eq!(curl(&server, &sid2, &format!("http://{PUBLIC}/")).await, ok);
    refused(
        "outside the CIDR",
        &curl(&server, &sid2, &format!("http://{PRIVATE}/")).await,
    );
}

#[tokio::test]
async fn none_has_no_network_and_open_needs_the_operator() {
    let net = FakeNet::start().await;
    let server = server(&[]).await;
    let (s, v) = server
        .post(
            "/v1/sandboxes",
            json!({"sessionKey": "open", "network": {"mode": "open"}}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    let e = v["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("network.mode") && e.contains("not enabled"),
        "{v}"
    );

    let sid = server
        .create(json!({"sessionKey": "none", "network": {"mode": "none"}}))
        .await;
    let r = curl(
        &server,
        &sid,
        &format!("--connect-timeout 3 http://{PUBLIC}/"),
    )
    .await;
    assert_eq!(r.0, 0, "mode none: {r:?}");
    let env = server.sh(&sid, "env | grep -ci _proxy= || true").await;
    assert_eq!(env["stdout"], "0\n", "no proxy variables: {env}");
    // The positive control: the same request from an internet sandbox.
    let sid_net = server.create(json!({"sessionKey": "net"})).await;
    assert_eq!(
        curl(&server, &sid_net, &format!("http://{PUBLIC}/")).await,
        (200, "public\n".into())
    );

    drop(server);
    // Enabled by the operator: open is the engine's bridge, no proxy.
    let server = server_open().await;
    let sid = server
        .create(json!({"sessionKey": "open", "network": {"mode": "open"}}))
        .await;
    let before = net.hits(PUBLIC).await;
    let r = curl(&server, &sid, &format!("--noproxy '*' http://{PUBLIC}/")).await;
    assert_eq!(r, (200, "public\n".into()), "open goes direct");
    assert_eq!(net.hits(PUBLIC).await, before + 1);
}

async fn server_open() -> TestServer {
    server(&[("SANDBOXD_NETWORK_MODES", "none,internet,allowlist,open")]).await
}

#[tokio::test]
async fn ports_publish_in_internet_and_allowlist_modes() {
    let server = server(&[]).await;
    for (key, network) in [
        ("p-internet", json!({"mode": "internet"})),
        (
            "p-allowlist",
            json!({"mode": "allowlist", "allow": ["allowed.test"]}),
        ),
    ] {
        let sid = server
            .create(json!({"sessionKey": key, "network": network, "ports": [3000]}))
            .await;
        server
            .start_command(
                &sid,
                json!({"command": "echo served > index.html && exec python3 -m http.server 3000 --bind 127.0.0.1", "timeoutMs": 600000}),
            )
            .await;
        let (s, v) = server
            .get(&format!("/v1/sandboxes/{sid}/ports/3000?waitMs=10000"))
            .await;
        assert_eq!((s, v["ready"].clone()), (200, json!(true)), "{key}: {v}");
        let url = format!("{}/index.html", v["url"].as_str().expect("url"));
        let body = reqwest::get(&url)
            .await
            .expect("fetch")
            .text()
            .await
            .expect("body");
        assert_eq!(body, "served\n", "{key}");
    }
}

#[tokio::test]
async fn the_way_out_survives_a_sandboxd_restart_and_stop_leaves_nothing() {
    let _net = FakeNet::start().await;
    let mut server = server(&[]).await;
    let sid = server.create(json!({"sessionKey": "restart"})).await;
    let sid_allow = server
        .create(json!({"sessionKey": "restart-allow", "network": {"mode": "allowlist", "allow": ["allowed.test"]}}))
        .await;
    let ok = (200, "public\n".to_string());
    assert_eq!(curl(&server, &sid, "http://public.test/").await, ok);
    server.restart().await;
    assert_eq!(curl(&server, &sid, "http://public.test/").await, ok);
    assert_eq!(curl(&server, &sid_allow, "http://allowed.test/").await, ok);
    refused(
        "still the allowlist",
        &curl(&server, &sid_allow, "http://public.test/").await,
    );
    // A stop removes the sandbox's network and its own egress proxy; the
    // shared one stays for the others.
    for id in [&sid, &sid_allow] {
        let (s, v) = server
            .post(&format!("/v1/sandboxes/{id}:stop"), Value::Null)
            .await;
        assert_eq!(s, 200, "{v}");
    }
    let left: Vec<String> = server
        .containers_with("sandboxd.role", "egress")
        .await
        .into_iter()
        .filter_map(|c| c.names.and_then(|n| n.into_iter().next()))
        .collect();
    assert_eq!(
        left,
        vec![format!("/{}-egress", server.instance)],
        "only the shared proxy"
    );
    assert!(
        server
            .networks_with("sandboxd.role", "link")
            .await
            .is_empty(),
        "no link network left"
    );
}
