//! The world outside, on this machine: a network namespace holding a
//! "public" web server (203.0.113.10, a documentation address), a
//! "private" one (10.250.77.10) and a name server (203.0.113.53) that
//! answers the tests' names (see `fakenet.py`), reached from the host by
//! host routes over a veth pair. The engine's bridge NAT carries a
//! container's traffic there as it would to the internet, so egress tests
//! send nothing off this machine.
//!
//! One at a time: the addresses are fixed. Within a test process a mutex
//! serialises; across nextest's processes the `fakenet` test group does
//! (`.config/nextest.toml`). Whatever an earlier run left is removed first,
//! and everything goes when the guard drops, also when a test fails.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};

pub(crate) const PUBLIC: &str = "203.0.113.10";
pub(crate) const PRIVATE: &str = "10.250.77.10";
pub(crate) const DNS: &str = "203.0.113.53";
/// The host's end of the veth pair (what the bridge NAT rewrites to).
pub(crate) const HOST_SIDE: &str = "198.51.100.1";

const NETNS: &str = "sbt-fakenet";
const HOST_IF: &str = "sbt-fn-h";
const NS_IF: &str = "sbt-fn-n";

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// A running fake outside world; removed on drop.
#[derive(Debug)]
pub(crate) struct FakeNet {
    server: Child,
    _one: MutexGuard<'static, ()>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e} (the egress tests need iproute2 and root)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn teardown() {
    // The host end goes with its peer; routes go with the device.
    let _ = ip(&["netns", "del", NETNS]);
    let _ = ip(&["link", "del", HOST_IF]);
}

impl FakeNet {
    pub(crate) async fn start() -> FakeNet {
        let one = ONE_AT_A_TIME.lock().await;
        teardown();
        let setup = || -> Result<(), String> {
            ip(&["netns", "add", NETNS])?;
            ip(&[
                "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF,
            ])?;
            ip(&["link", "set", NS_IF, "netns", NETNS])?;
            ip(&["addr", "add", &format!("{HOST_SIDE}/32"), "dev", HOST_IF])?;
            ip(&["link", "set", HOST_IF, "up"])?;
            for a in [PUBLIC, PRIVATE, DNS] {
                ip(&["route", "add", &format!("{a}/32"), "dev", HOST_IF])?;
            }
            let ns = |args: &[&str]| {
                let mut all = vec!["netns", "exec", NETNS, "ip"];
                all.extend_from_slice(args);
                ip(&all)
            };
            ns(&["link", "set", "lo", "up"])?;
            ns(&["link", "set", NS_IF, "up"])?;
            for a in [PUBLIC, PRIVATE, DNS] {
                ns(&["addr", "add", &format!("{a}/32"), "dev", NS_IF])?;
            }
            // A route back to the host's end only (the engine's NAT makes
            // every client that address): nothing here can send elsewhere.
            ns(&["route", "add", &format!("{HOST_SIDE}/32"), "dev", NS_IF])?;
            Ok(())
        };
        if let Err(e) = setup() {
            teardown();
            panic!("setting up the fake outside world failed: {e}");
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/fakenet.py");
        let mut server = match Command::new("ip")
            .args(["netns", "exec", NETNS, "python3", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                teardown();
                panic!("starting fakenet.py: {e}");
            }
        };
        let stdout = server.stdout.take();
        let ready = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            stdout
                .map(|s| BufReader::new(s).read_line(&mut line))
                .is_some_and(|r| r.is_ok() && line.contains("fakenet ready"))
        });
        let ready = tokio::time::timeout(Duration::from_secs(20), ready).await;
        let net = FakeNet { server, _one: one };
        assert!(matches!(ready, Ok(Ok(true))), "fakenet.py did not come up");
        net
    }

    /// How many requests the server on `addr` ("public" or "private") got.
    pub(crate) async fn hits(&self, addr: &str) -> u64 {
        let body = reqwest::Client::new()
            .get(format!("http://{addr}/hits"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .expect("the fake server answers the host")
            .text()
            .await
            .expect("hits");
        body.trim().parse().expect("a count")
    }
}

impl Drop for FakeNet {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        teardown();
    }
}
