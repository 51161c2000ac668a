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
    let denied = denied_total(&server).await;
    assert!(denied >= 8.0, "denials counted: {denied}");
}

/// `sandboxd_egress_denied_total` (0 before the first refusal).
async fn denied_total(server: &TestServer) -> f64 {
    let metrics = server.metrics_text().await;
    metrics
        .lines()
        .find(|l| l.starts_with("sandboxd_egress_denied_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
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
    // UDP does not leave an internet sandbox: a name server on the fake
    // internet gets no query (names are resolved by the proxy).
    assert_eq!(
        server.sh(&sid_net, &dns_query()).await["stdout"],
        "no answer\n",
        "a DNS query from an internet sandbox"
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
    // The control for the DNS query above: from an open sandbox the same
    // query is answered.
    assert_eq!(
        server.sh(&sid, &dns_query()).await["stdout"],
        "answered\n",
        "a DNS query from an open sandbox"
    );
}

/// A script that asks the fake name server for `public.test` over UDP
/// and prints `answered` or `no answer` (within 3 s).
fn dns_query() -> String {
    format!(
        r#"python3 - <<'EOF'
import socket, struct
q = struct.pack(">HHHHHH", 0x5eed, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in "public.test".split(".")) + b"\0"
q += struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
try:
    s.sendto(q, ("{DNS}", 53))
    print("answered" if s.recv(512)[:2] == b"\x5e\xed" else "garbage")
except OSError:
    print("no answer")
EOF"#
    )
}

/// No container sandboxd makes has IPv6 (an IPv6 link-local address would
/// reach the host side of a bridge on engines that leave it on), and none
/// forwards between its networks: the sandbox, its port proxy and the
/// egress proxy each carry the settings, and inside the sandbox the kernel
/// shows them (without them the engine gives a container `ip_forward` 1,
/// inherited from the host). The engine hands out link-network addresses
/// from the block's lower half only, so no proxy can take the egress
/// proxy's address at the top.
#[tokio::test]
async fn no_container_has_ipv6_or_forwards_and_the_egress_address_stays_free() {
    let server = server(&[]).await;
    let sid = server
        .create(json!({"sessionKey": "v6", "ports": [3000]}))
        .await;
    let (s, v) = server.get(&format!("/v1/sandboxes/{sid}/ports/3000")).await;
    assert_eq!(s, 200, "{v}");
    let mut names = vec![
        server.container_name(&sid),
        format!("{}-egress", server.instance),
    ];
    // The sandbox's port proxy (the next sandbox's spare is not counted).
    names.extend(
        server
            .containers_with("sandboxd.sandbox_id", &sid)
            .await
            .into_iter()
            .filter_map(|c| c.names.and_then(|n| n.into_iter().next()))
            .map(|n| n.trim_start_matches('/').to_string())
            .filter(|n| n.contains("-port-")),
    );
    assert_eq!(
        names.len(),
        3,
        "sandbox, egress proxy, port proxy: {names:?}"
    );
    for name in &names {
        let sysctls = server
            .docker
            .inspect_container(
                name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .expect("inspect")
            .host_config
            .and_then(|h| h.sysctls)
            .unwrap_or_default();
        for (k, v) in [
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv6.conf.default.disable_ipv6", "1"),
            ("net.ipv4.ip_forward", "0"),
        ] {
            assert_eq!(sysctls.get(k).map(String::as_str), Some(v), "{name}: {k}");
        }
    }
    let inside = server
        .sh(
            &sid,
            r#"echo "v6 addresses: $(wc -l < /proc/net/if_inet6)"; echo "forwarding: $(cat /proc/sys/net/ipv4/ip_forward)""#,
        )
        .await;
    assert_eq!(
        inside["stdout"], "v6 addresses: 0\nforwarding: 0\n",
        "{inside}"
    );

    let link = format!("{}-{sid}-link", server.instance);
    let network = server
        .docker
        .inspect_network(
            &link,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .expect("the link network");
    let ipam = network
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().next())
        .expect("its address range");
    let subnet = ipam.subnet.expect("subnet");
    let (base, bits) = subnet.split_once('/').expect("a CIDR");
    let bits: u32 = bits.parse().expect("prefix");
    assert_eq!(
        ipam.ip_range,
        Some(format!("{base}/{}", bits + 1)),
        "addresses come from the lower half of {subnet}"
    );
    let base = u32::from(base.parse::<std::net::Ipv4Addr>().expect("IPv4"));
    let half = 1u32 << (32 - bits - 1);
    let endpoints: Vec<_> = network
        .containers
        .unwrap_or_default()
        .into_values()
        .collect();
    assert_eq!(endpoints.len(), 3, "sandbox, port proxy, egress proxy");
    for endpoint in endpoints {
        let addr = endpoint.ipv4_address.expect("an address");
        let ip = u32::from(
            addr.split('/')
                .next()
                .and_then(|a| a.parse::<std::net::Ipv4Addr>().ok())
                .expect("IPv4"),
        );
        let egress = endpoint.name.as_deref() == Some(&format!("{}-egress", server.instance));
        assert_eq!(
            ip >= base + half,
            egress,
            "{:?} at {addr}: only the egress proxy is in the upper half",
            endpoint.name
        );
    }
}

/// The shared egress proxy is replaced when it is removed or stopped
/// behind sandboxd's back (the sandbox's way out comes back by itself),
/// and when the policy changes (a restart with a new `egress_deny`
/// refuses what the old proxy let through).
#[tokio::test]
async fn a_lost_or_outdated_egress_proxy_is_replaced() {
    let _net = FakeNet::start().await;
    let mut server = server(&[]).await;
    let sid = server.create(json!({"sessionKey": "repair"})).await;
    let ok = (200, "public\n".to_string());
    assert_eq!(curl(&server, &sid, "http://public.test/").await, ok);
    let egress = format!("{}-egress", server.instance);
    let id_of = |server: &TestServer| {
        let docker = server.docker.clone();
        let egress = egress.clone();
        async move {
            docker
                .inspect_container(
                    &egress,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
                .ok()
                .filter(|c| c.state.as_ref().and_then(|s| s.running) == Some(true))
                .and_then(|c| c.id)
        }
    };
    // Restarted in place: its log is read on from the last refusal
    // counted, not counted again. The second refusal (another port) shows
    // that the proxy's log is followed again; by then a recount of the
    // first would have happened.
    refused(
        "a private address",
        &curl(&server, &sid, &format!("http://{PRIVATE}/")).await,
    );
    eventually(
        Duration::from_secs(10),
        "the refusal is counted",
        || async { denied_total(&server).await == 1.0 },
    )
    .await;
    server
        .docker
        .restart_container(
            &egress,
            None::<bollard::query_parameters::RestartContainerOptions>,
        )
        .await
        .expect("restart the proxy");
    eventually(
        Duration::from_secs(20),
        "the proxy serves again",
        || async { curl(&server, &sid, "http://public.test/").await == ok },
    )
    .await;
    refused(
        "a private address at another port",
        &curl(&server, &sid, &format!("http://{PRIVATE}:8022/")).await,
    );
    eventually(
        Duration::from_secs(10),
        "the second refusal is logged",
        || async { server.log_text().contains(&format!("{PRIVATE}:8022")) },
    )
    .await;
    assert_eq!(
        denied_total(&server).await,
        2.0,
        "each refusal counted once"
    );
    let first = id_of(&server).await.expect("the shared proxy runs");

    // Removed out of band.
    server
        .docker
        .remove_container(
            &egress,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .expect("remove the proxy");
    eventually(Duration::from_secs(20), "a new proxy runs", || async {
        id_of(&server).await.is_some_and(|id| id != first)
    })
    .await;
    assert_eq!(
        curl(&server, &sid, "http://public.test/").await,
        ok,
        "after removal"
    );

    // Stopped (a clean exit: the engine does not restart it).
    let second = id_of(&server).await.expect("the new proxy");
    server
        .docker
        .stop_container(
            &egress,
            None::<bollard::query_parameters::StopContainerOptions>,
        )
        .await
        .expect("stop the proxy");
    eventually(Duration::from_secs(20), "a running proxy again", || async {
        id_of(&server).await.is_some_and(|id| id != second)
    })
    .await;
    assert_eq!(
        curl(&server, &sid, "http://public.test/").await,
        ok,
        "after a stop"
    );
    assert!(
        server.log_text().contains("a new one runs"),
        "the replacement is logged"
    );

    // A new policy: the public server is denied from now on.
    server.set_env("SANDBOXD_EGRESS_DENY", &format!("{PUBLIC}/32"));
    server.restart().await;
    refused(
        "a destination the new policy denies",
        &curl(&server, &sid, "http://public.test/").await,
    );
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
    // What stays is at most the link network made ahead for the next
    // sandbox, which no sandbox has (the stopped ones' go right after the
    // answer, in the background).
    eventually(
        Duration::from_secs(20),
        "no link network of a stopped sandbox left",
        || async {
            let links = server.networks_with("sandboxd.role", "link").await;
            links.len() <= 1
                && links
                    .iter()
                    .all(|n| !n.contains(&sid) && !n.contains(&sid_allow))
        },
    )
    .await;
}

/// The sandbox ids of this instance's link networks.
async fn link_ids(server: &TestServer) -> Vec<String> {
    let prefix = format!("{}-", server.instance);
    let mut ids: Vec<String> = server
        .networks_with("sandboxd.role", "link")
        .await
        .into_iter()
        .filter_map(|n| Some(n.strip_prefix(&prefix)?.strip_suffix("-link")?.to_string()))
        .collect();
    ids.sort();
    ids
}

/// A cold create in the default mode takes the link network sandboxd made
/// ahead (its id is the sandbox's), gets out through it, and the next one
/// is made after it; a create in mode `none` leaves it alone.
#[tokio::test]
async fn a_cold_internet_create_takes_the_link_network_made_ahead() {
    let _net = FakeNet::start().await;
    let server = server(&[]).await;
    eventually(Duration::from_secs(30), "a link network made ahead", || {
        server.link_ready()
    })
    .await;
    let ahead = link_ids(&server).await;
    assert_eq!(ahead.len(), 1, "one network made ahead: {ahead:?}");
    let none = server
        .create(json!({"sessionKey": "ahead-none", "network": {"mode": "none"}}))
        .await;
    assert_eq!(
        link_ids(&server).await,
        ahead,
        "mode none takes no link network"
    );
    assert!(server.link_ready().await);
    let sid = server.create(json!({"sessionKey": "ahead"})).await;
    assert_eq!(
        vec![sid.clone()],
        ahead,
        "the sandbox took the network made ahead"
    );
    // Its way out works through it (positive control of the egress path),
    // and the private network stays refused.
    let ok = (
        200,
        "public
"
        .to_string(),
    );
    assert_eq!(curl(&server, &sid, "http://public.test/").await, ok);
    refused(
        "private, through the prepared network",
        &curl(&server, &sid, &format!("http://{PRIVATE}/")).await,
    );
    eventually(
        Duration::from_secs(30),
        "the next link network made",
        || server.link_ready(),
    )
    .await;
    let now = link_ids(&server).await;
    assert_eq!(now.len(), 2, "the sandbox's and the next one: {now:?}");
    assert!(now.contains(&sid), "{now:?}");
    for id in [&sid, &none] {
        let (s, v) = server
            .post(&format!("/v1/sandboxes/{id}:stop"), Value::Null)
            .await;
        assert_eq!(s, 200, "{v}");
    }
    // The stopped sandbox's goes right after the answer, in the background.
    eventually(
        Duration::from_secs(20),
        "only the next one stays",
        || async {
            let left = link_ids(&server).await;
            left.len() == 1 && !left.contains(&sid)
        },
    )
    .await;
}

/// With `links_ahead = 3`, three cold creates sent one after another each
/// take a link network made ahead (none waits for one of its own) and get
/// out through it; the three are made again after the series.
#[tokio::test]
async fn cold_creates_one_after_another_take_the_link_networks_made_ahead() {
    let _net = FakeNet::start().await;
    let server = server(&[("SANDBOXD_LINKS_AHEAD", "3")]).await;
    eventually(
        Duration::from_secs(60),
        "three link networks made ahead",
        || server.link_ready(),
    )
    .await;
    let ahead = link_ids(&server).await;
    assert_eq!(ahead.len(), 3, "three made ahead: {ahead:?}");
    let mut sids = Vec::new();
    for i in 0..3 {
        sids.push(
            server
                .create(json!({"sessionKey": format!("series-{i}")}))
                .await,
        );
    }
    let mut taken = sids.clone();
    taken.sort();
    assert_eq!(taken, ahead, "each create took one made ahead");
    let ok = (200, "public\n".to_string());
    for sid in &sids {
        assert_eq!(curl(&server, sid, "http://public.test/").await, ok, "{sid}");
    }
    eventually(Duration::from_secs(60), "three made ahead again", || {
        server.link_ready()
    })
    .await;
    let now = link_ids(&server).await;
    assert_eq!(now.len(), 6, "the three sandboxes' and three new: {now:?}");
}

/// One sandbox cannot take the shared egress proxy from the others: the
/// proxy tells sandboxes apart by their addresses on their own link
/// networks, so one that holds more connections than its cap has the rest
/// closed, while another sandbox is served at the same time.
#[tokio::test]
async fn one_sandbox_cannot_take_the_shared_proxy_from_another() {
    let _net = FakeNet::start().await;
    let server = server(&[]).await;
    let greedy = server.create(json!({"sessionKey": "greedy"})).await;
    let other = server.create(json!({"sessionKey": "other"})).await;
    let ok = (200, "public\n".to_string());
    assert_eq!(curl(&server, &greedy, "http://public.test/").await, ok);
    // 140 idle connections: the proxy keeps 128 and closes the rest at
    // once; the script writes how many it closed, then holds them.
    let holder = server
        .start_command(
            &greedy,
            json!({"command": r#"python3 - <<'EOF'
import os, select, socket, time, urllib.parse
proxy = urllib.parse.urlparse(os.environ["HTTP_PROXY"])
socks = [socket.create_connection((proxy.hostname, proxy.port)) for _ in range(140)]
time.sleep(2)
closed = 0
for s in socks:
    r, _, _ = select.select([s], [], [], 0)
    if r and s.recv(1) == b"":
        closed += 1
open("closed.tmp", "w").write(f"{closed}\n")
os.rename("closed.tmp", "closed")
time.sleep(60)
EOF"#, "timeoutMs": 90000}),
        )
        .await;
    eventually(Duration::from_secs(30), "the holder counted", || async {
        !server.sh(&greedy, "cat closed 2>/dev/null").await["stdout"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    assert_eq!(
        server.sh(&greedy, "cat closed").await["stdout"],
        "12\n",
        "connections past 128 are closed"
    );
    // While the greedy one holds its 128, the other is served, and the
    // greedy one gets nothing more.
    assert_eq!(curl(&server, &other, "http://public.test/").await, ok);
    let (code, _) = curl(&server, &greedy, "http://public.test/").await;
    assert_eq!(code, 0, "the greedy sandbox is at its cap");
    let (s, v) = server
        .post(
            &format!("/v1/sandboxes/{greedy}/commands/{holder}:kill"),
            Value::Null,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    eventually(
        Duration::from_secs(10),
        "served again once it lets go",
        || async { curl(&server, &greedy, "http://public.test/").await == ok },
    )
    .await;
}

/// A warm pool member finds its way out once claimed, also when the shared
/// egress proxy was removed while it waited: the repair covers members,
/// not only sessions (with no session at all here, nothing else would
/// start a new proxy).
#[tokio::test]
async fn a_claimed_pool_member_gets_out_also_after_the_egress_proxy_was_replaced() {
    let _net = FakeNet::start().await;
    let server = server(&[("SANDBOXD_POOL_SIZE", "1")]).await;
    crate::pool::wait_for_members(&server, "default", 1).await;
    let egress = format!("{}-egress", server.instance);
    let running_id = || {
        let docker = server.docker.clone();
        let egress = egress.clone();
        async move {
            docker
                .inspect_container(
                    &egress,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
                .ok()
                .filter(|c| c.state.as_ref().and_then(|s| s.running) == Some(true))
                .and_then(|c| c.id)
        }
    };
    let first = running_id().await.expect("the member's proxy runs");
    server
        .docker
        .remove_container(
            &egress,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .expect("remove the proxy");
    eventually(Duration::from_secs(20), "a new proxy runs", || async {
        running_id().await.is_some_and(|id| id != first)
    })
    .await;
    let sid = server.create(json!({"sessionKey": "claimed"})).await;
    assert!(crate::pool::from_pool(&server, &sid), "a claim");
    assert_eq!(
        curl(&server, &sid, "http://public.test/").await,
        (200, "public\n".to_string())
    );
    refused(
        "a private address",
        &curl(&server, &sid, &format!("http://{PRIVATE}/")).await,
    );
}
