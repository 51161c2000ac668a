//! A runtime configured with the OCI runtime `runsc` runs its sandboxes
//! under gVisor, hardened as under the default runtime, and commands, files
//! and ports work there. scripts/ensure-docker.sh registers runsc on our
//! machines; an engine without it fails this test and says so.

use std::time::Duration;

use serde_json::json;

use crate::harness::{self, ServerOptions, TestServer};

#[tokio::test]
async fn a_gvisor_runtime_runs_sandboxes_under_gvisor() {
    let docker = harness::docker().await;
    let runtimes = docker
        .info()
        .await
        .expect("info")
        .runtimes
        .unwrap_or_default();
    assert!(
        runtimes.contains_key("runsc"),
        "the engine has no runsc runtime (runtimes: {:?}); scripts/ensure-docker.sh registers it on Debian",
        runtimes.keys().collect::<Vec<_>>()
    );
    let config = std::env::temp_dir().join(format!("{}-gvisor.toml", harness::unique_instance()));
    std::fs::write(&config, "[runtimes.gvisor]\noci_runtime = \"runsc\"\n").expect("config");
    let server = TestServer::start_with(
        ServerOptions::default().env("SANDBOXD_CONFIG", config.to_str().expect("utf8")),
    )
    .await;
    let sid = server
        .create(json!({"sessionKey": "g", "runtime": "gvisor", "ports": [3000]}))
        .await;
    let info = server.inspect(&sid).await;
    let hc = info.host_config.expect("host config");
    assert_eq!(hc.runtime.as_deref(), Some("runsc"));
    assert_eq!(hc.readonly_rootfs, Some(true), "hardening still applies");
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));

    let r = server
        .sh_with_timeout(&sid, "dmesg | head -1; id -u", 30000)
        .await;
    let out = r["stdout"].as_str().unwrap_or("");
    assert!(out.contains("gVisor"), "the kernel is gVisor's: {r}");
    assert!(out.ends_with("1000\n"), "{r}");
    // Escape attempts fail under gVisor too. (`unshare -r` is allowed
    // there: it makes a user namespace inside gVisor's own kernel.)
    for (what, script) in [
        ("mount", "mount -t tmpfs none /mnt"),
        ("chroot", "/usr/sbin/chroot / true"),
        ("write /", "touch /evil"),
        ("exec from /tmp", "cp /bin/true /tmp/t && /tmp/t"),
        (
            "raw socket",
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
        ),
        ("engine socket", "test -e /var/run/docker.sock"),
    ] {
        let r = server.sh_with_timeout(&sid, script, 30000).await;
        assert_ne!(r["exitCode"], 0, "{what} must fail under gVisor: {r}");
        assert_ne!(r["exitCode"], 127, "{what} must be tried, not missing: {r}");
    }
    let caps = server
        .sh_with_timeout(
            &sid,
            "grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status",
            30000,
        )
        .await;
    assert_eq!(
        caps["stdout"],
        "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n",
        "{caps}"
    );
    // Files.
    let (s, _) = server
        .write_files(
            &sid,
            json!([{"path": "g.txt", "contentBase64": "Z3Zpc29y"}]),
        )
        .await;
    assert_eq!(s, 200);
    let (s, v) = server.read_file(&sid, "g.txt").await;
    assert_eq!((s, v["contentBase64"].clone()), (200, json!("Z3Zpc29y")));
    // Commands: a timeout ends the tree.
    let r = server
        .post(
            &format!("/v1/sandboxes/{sid}/commands:run"),
            json!({"command": "sleep 100 & setsid sleep 101 & wait", "timeoutMs": 1500}),
        )
        .await
        .1;
    assert_eq!(r["exitCode"], 124);
    let ps = server.sh_with_timeout(&sid, "ps -eo args", 30000).await;
    assert!(
        !ps["stdout"]
            .as_str()
            .unwrap_or("")
            .lines()
            .any(|l| l.starts_with("sleep 10")),
        "{ps}"
    );
    // Ports: a loopback server, fetched from the host.
    let (s, _) = server
        .post(&format!("/v1/sandboxes/{sid}/commands"), json!({"command": "cd /tmp && echo gvisor-page > index.html && exec python3 -m http.server 3000 --bind 127.0.0.1", "timeoutMs": 600000}))
        .await;
    assert_eq!(s, 200);
    let (s, v) = server
        .get(&format!("/v1/sandboxes/{sid}/ports/3000?waitMs=15000"))
        .await;
    assert_eq!((s, v["ready"].clone()), (200, json!(true)), "{v}");
    let url = v["url"].as_str().expect("url").to_string();
    let body = reqwest::Client::new()
        .get(format!("{url}/index.html"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("fetch")
        .text()
        .await
        .expect("body");
    assert_eq!(body, "gvisor-page\n");
    let _ = std::fs::remove_file(config);
}
