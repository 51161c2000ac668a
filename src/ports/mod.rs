//! Ports: a web server running in a sandbox becomes a URL the chat user can
//! open. Path of a connection: host port (published by a proxy container) ->
//! proxy (socat) -> relay inside the sandbox (the agent's, on a port derived
//! from the target) -> 127.0.0.1:PORT, so servers bound to loopback work too.
//!
//! The instance network has inter-container traffic off, so sandboxes cannot
//! reach each other. A proxy lives on its sandbox's link network instead: a
//! small bridge holding only that sandbox and its proxies (the engine keeps
//! bridge networks apart from each other). Link networks get explicit
//! subnets from `link_subnet_pool`, each just big enough for `max_ports`
//! proxies (/28 for the default four; see `subnet::link_prefix`), so they
//! do not use up the engine's address pools. The ports a sandbox allowlists
//! are published in the background right after create (or a reconnect that
//! adds some), the first on the spare proxy made ahead (see
//! `sandbox::port_proxy`), so the first GET of a port is a quick check, not
//! a container start. A proxy's relay port is read from its label.

mod forward;

pub use forward::{ForwardError, Opening};

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use crate::agent_client::{AgentError, Probed};
use crate::config::Config;
use crate::engine::{EngineError, ProxyState};
use crate::sandbox::network::{LINK_ALIAS, link_name};
use crate::sandbox::port_proxy::{PROXY_LISTEN_PORT, proxy_name, relay_port_of};
use crate::sandbox::spec::NetworkMode;
use crate::sandbox::{Sandbox, SandboxError, Sandboxes};

/// Longest `waitMs` honoured.
pub const MAX_WAIT_MS: u64 = 60_000;
/// Bytes of recent output returned when a server did not come up.
const LAST_OUTPUT_BYTES: usize = 4096;

/// What can go wrong publishing a port.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error(
        "this sandbox was created with network mode \"none\": it has no network to publish a port on"
    )]
    NoNetwork,
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("could not publish the port: {0}")]
    Failed(String),
}

impl From<EngineError> for PortError {
    fn from(e: EngineError) -> Self {
        PortError::Sandbox(e.into())
    }
}

/// A published port: its host port and URL, and with a wait, whether a
/// server answered (and if not, the sandbox's recent output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub host_port: u16,
    pub url: String,
    pub ready: Option<bool>,
    pub last_output: Option<String>,
}

/// The relay port inside the sandbox for target `port`: stable, in the
/// dynamic range, never equal to `port` itself.
pub fn relay_port(port: u16) -> u16 {
    49152 + ((port as u32 + 8191) % 16384) as u16
}

/// The URL a user opens for `host_port`: public_host when set, else the
/// publish address when it is a specific one, else the host the request
/// was sent to, else the bind address. Never 0.0.0.0.
pub fn public_url(config: &Config, request_host: Option<&str>, host_port: u16) -> String {
    let proto = &config.public_proto;
    let specific = |ip: IpAddr| !ip.is_unspecified();
    let host = if let Some(h) = config.public_host.as_deref().filter(|h| !h.is_empty()) {
        h.to_string()
    } else if specific(config.publish_host_ip) {
        bracket(config.publish_host_ip)
    } else if let Some(h) = request_host
        .and_then(host_of)
        .filter(|h| h != "0.0.0.0" && h != "[::]")
    {
        h
    } else if specific(config.bind_host) {
        bracket(config.bind_host)
    } else {
        "127.0.0.1".to_string()
    };
    format!("{proto}://{host}:{host_port}")
}

fn bracket(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The host part of a Host header value ("example.com:8080" -> "example.com",
/// "[::1]:80" -> "[::1]"); None for anything that is not a plain host.
fn host_of(header: &str) -> Option<String> {
    let h = header.trim();
    let host = if h.starts_with('[') {
        &h[..=h.find(']')?]
    } else {
        h.rsplit_once(':').map(|(h, _)| h).unwrap_or(h)
    };
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':'));
    ok.then(|| host.to_ascii_lowercase())
}

/// See the module docs.
#[derive(Debug)]
pub struct Ports {
    config: Arc<Config>,
    sandboxes: Arc<Sandboxes>,
    /// One publish at a time per (sandbox, port); key port 0 guards the
    /// sandbox's link network.
    locks: LockMap,
}

impl Ports {
    pub fn new(config: Arc<Config>, sandboxes: Arc<Sandboxes>) -> Self {
        Ports {
            config,
            sandboxes,
            locks: DashMap::new(),
        }
    }

    /// Takes the lock of one (sandbox, port); port 0 is the link network.
    async fn lock(&self, sandbox: &str, port: u16) -> PortLock<'_> {
        let key = (sandbox.to_string(), port);
        let mutex = self
            .locks
            .entry(key.clone())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        let guard = mutex.lock_owned().await;
        PortLock {
            locks: &self.locks,
            key,
            guard: Some(guard),
        }
    }

    /// Makes sure `port` of the sandbox is published and answers its URL;
    /// `None` when the port is not allowlisted. With `wait`, also waits
    /// (bounded) until something answers on the port inside the sandbox;
    /// the sandbox's most recent output explains a server that did not
    /// come up.
    pub async fn publish(
        &self,
        sandbox_id: &str,
        port: u16,
        request_host: Option<&str>,
        wait: Option<Duration>,
    ) -> Result<Option<Published>, PortError> {
        let sandbox = self.sandboxes.lookup(sandbox_id).await?;
        if !sandbox.ports().allowed.contains(&port) {
            return Ok(None);
        }
        if sandbox.network == NetworkMode::None {
            return Err(PortError::NoNetwork);
        }
        let _busy = sandbox.open_request();
        let host_port = {
            let _one = self.lock(&sandbox.id, port).await;
            self.ensure_published(&sandbox, port)
                .await
                .map_err(|e| self.sandboxes.gone_or(&sandbox, e))?
        };
        let mut answer = Published {
            host_port,
            url: public_url(&self.config, request_host, host_port),
            ready: None,
            last_output: None,
        };
        if let Some(wait) = wait {
            let (ready, recent) = self.wait_ready(&sandbox, port, wait).await?;
            answer.ready = Some(ready);
            if !ready {
                answer.last_output = Some(recent);
            }
        }
        Ok(Some(answer))
    }

    async fn ensure_published(&self, sandbox: &Arc<Sandbox>, port: u16) -> Result<u16, PortError> {
        let subnet = self.ensure_link(sandbox).await?;
        let engine = self.sandboxes.engine();
        let name = proxy_name(&self.config.instance, &sandbox.id, port);
        let mut proxy = engine.proxy_state(&name, PROXY_LISTEN_PORT).await?;
        let mut from_spare = false;
        if proxy.is_none() && self.sandboxes.take_spare_proxy(&sandbox.id, port).await? {
            from_spare = true;
            proxy = engine.proxy_state(&name, PROXY_LISTEN_PORT).await?;
        }
        if let Some(ProxyState {
            host_port: Some(host),
            labels,
        }) = proxy
        {
            // Its label says where it forwards: a spare's relay port is
            // not its port's own.
            let relay = relay_port_of(&labels).unwrap_or_else(|| relay_port(port));
            self.ensure_relay(sandbox, port, relay, &subnet).await?;
            sandbox.set_published(port, Some(host));
            if from_spare {
                tracing::info!(event = "port_published", sandbox_id = %sandbox.id, session_key = %sandbox.session_key, port, host_port = host, relay, "port published on the spare proxy");
            }
            return Ok(host);
        }
        // Missing, or there but stopped (its host port is gone with it).
        engine.remove_container(&name).await?;
        let relay = relay_port(port);
        let spec = self.sandboxes.proxy_spec(
            &sandbox.id,
            Some((port, sandbox.session_key.as_str())),
            relay,
        );
        // The relay and the proxy do not depend on each other: start both.
        let (relay_ok, proxy_ok) = tokio::join!(
            self.ensure_relay(sandbox, port, relay, &subnet),
            engine.start_proxy(&spec)
        );
        if let Err(e) = proxy_ok.map_err(PortError::from).and(relay_ok) {
            let _ = engine.remove_container(&name).await;
            return Err(e);
        }
        let host = engine
            .proxy_state(&name, PROXY_LISTEN_PORT)
            .await?
            .and_then(|p| p.host_port)
            .ok_or_else(|| PortError::Failed("the proxy started but publishes no port".into()))?;
        sandbox.set_published(port, Some(host));
        tracing::info!(event = "port_published", sandbox_id = %sandbox.id, session_key = %sandbox.session_key, port, host_port = host, "port published");
        Ok(host)
    }

    /// Publishes, in the background, every port a sandbox allowlisted: the
    /// allowlist is known at create, so doing it before anyone asks makes
    /// the first GET a quick check. The first port takes the sandbox's
    /// spare proxy (see `sandbox::port_proxy`): a rename and a relay, not
    /// a container start. Failures only cost that speed: they are logged,
    /// and the GET retries.
    pub async fn prepare(&self, sandbox_id: &str) {
        let Some(sandbox) = self.sandboxes.registry().get(sandbox_id) else {
            return;
        };
        if sandbox.network == NetworkMode::None {
            return;
        }
        for port in sandbox.ports().allowed {
            {
                let _one = self.lock(&sandbox.id, port).await;
                if sandbox.ports().published.contains_key(&port) {
                    continue;
                }
                if let Err(e) = self.ensure_published(&sandbox, port).await {
                    tracing::warn!(sandbox_id, port, error = %e, "could not prepare the port");
                }
            }
            // Stopped meanwhile: sweep what was just made (stop of an id
            // sandboxd no longer knows removes whatever carries its label).
            if self.sandboxes.registry().get(sandbox_id).is_none() {
                let _ = self.sandboxes.stop(sandbox_id).await;
                return;
            }
        }
    }

    /// Makes sure the sandbox is on its link network (made for it at
    /// create in the egress modes; here, at its first port, in mode
    /// `open`); returns the network's subnet.
    async fn ensure_link(&self, sandbox: &Arc<Sandbox>) -> Result<String, PortError> {
        if let Some(subnet) = sandbox.ports().link_subnet {
            return Ok(subnet);
        }
        let _one = self.lock(&sandbox.id, 0).await;
        if let Some(subnet) = sandbox.ports().link_subnet {
            return Ok(subnet);
        }
        let subnet = match self.sandboxes.link_network(&sandbox.id).await {
            Err(e @ SandboxError::NoLinkBlock { .. }) => {
                return Err(PortError::Failed(e.to_string()));
            }
            other => other?,
        };
        self.sandboxes
            .engine()
            .connect_network(
                &link_name(&self.config.instance, &sandbox.id),
                &sandbox.container,
                &[LINK_ALIAS],
                None,
            )
            .await?;
        sandbox.set_linked(subnet.clone());
        Ok(subnet)
    }

    /// Makes sure the agent relays `relay` to `port`, for the link
    /// network's peers only. Idempotent, and one round trip.
    async fn ensure_relay(
        &self,
        sandbox: &Arc<Sandbox>,
        port: u16,
        relay: u16,
        subnet: &str,
    ) -> Result<(), PortError> {
        let limit = self.config.agent_timeout;
        let relayed = self
            .sandboxes
            .with_agent(sandbox, |conn| async move {
                conn.relay(port, relay, subnet.to_string(), limit).await
            })
            .await;
        match relayed {
            Ok(_) => Ok(()),
            Err(SandboxError::Agent(AgentError::Refused(f))) => {
                Err(PortError::Failed(format!("relay: {}", f.message)))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Waits (bounded) until something answers on `port` inside the
    /// sandbox; when nothing does, the sandbox's most recent output.
    async fn wait_ready(
        &self,
        sandbox: &Arc<Sandbox>,
        port: u16,
        wait: Duration,
    ) -> Result<(bool, String), PortError> {
        let wait_ms = u32::try_from(wait.as_millis().min(u128::from(MAX_WAIT_MS))).unwrap_or(0);
        let limit = wait + self.config.agent_timeout;
        let probed = self
            .sandboxes
            .with_agent(sandbox, |conn| async move {
                conn.probe(port, wait_ms, limit).await
            })
            .await;
        match probed {
            Ok(Probed {
                ready,
                recent_output,
            }) => {
                // The agent's text is the sandbox's own output; keep it bounded.
                let cut = recent_output.len().saturating_sub(LAST_OUTPUT_BYTES);
                let start = (cut..=recent_output.len())
                    .find(|i| recent_output.is_char_boundary(*i))
                    .unwrap_or(recent_output.len());
                Ok((ready, recent_output[start..].to_string()))
            }
            Err(SandboxError::Agent(AgentError::Unexpected(_))) => Err(PortError::Failed(
                "the sandbox's agent answered oddly".into(),
            )),
            Err(e) => Err(e.into()),
        }
    }
}

type LockMap = DashMap<(String, u16), Arc<tokio::sync::Mutex<()>>>;

/// Holds one (sandbox, port) lock; the map forgets the mutex once nobody
/// holds or waits for it, so it does not grow with every sandbox ever made.
struct PortLock<'a> {
    locks: &'a LockMap,
    key: (String, u16),
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for PortLock<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // remove_if runs under the shard lock, which is also where waiters
        // clone the Arc: none can be between "cloned" and "counted".
        self.locks
            .remove_if(&self.key, |_, m| Arc::strong_count(m) == 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml: &str) -> Config {
        Config::from_toml_and_env(toml, |_| None).expect("config")
    }

    #[tokio::test]
    async fn port_locks_are_forgotten_once_released() {
        let cfg = Arc::new(config(""));
        let sandboxes = Arc::new(Sandboxes::new(
            Arc::clone(&cfg),
            crate::engine::Engine::new(),
        ));
        let ports = Ports::new(cfg, sandboxes);
        let held = ports.lock("s", 3000).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), ports.lock("s", 3000))
                .await
                .is_err(),
            "a second holder waits"
        );
        let other = ports.lock("s", 0).await;
        drop(other);
        drop(held);
        assert!(ports.locks.is_empty(), "nothing is kept once released");
    }

    #[test]
    fn relay_ports_are_stable_and_never_the_target() {
        for p in [1u16, 80, 3000, 8080, 49152, 57343, 57344, 65535] {
            let r = relay_port(p);
            assert!(r >= 49152, "{p} -> {r}");
            assert_ne!(r, p);
            assert_eq!(r, relay_port(p));
        }
    }

    #[test]
    fn no_port_s_own_relay_port_is_the_spare_s() {
        use crate::sandbox::port_proxy::SPARE_RELAY_PORT;
        assert!((1..=u16::MAX).all(|p| relay_port(p) != SPARE_RELAY_PORT));
    }

    #[test]
    fn url_prefers_public_host_then_publish_ip_then_request_host() {
        let c = config("public_host = \"sandbox.example\"\npublic_proto = \"https\"");
        assert_eq!(
            public_url(&c, Some("other:1"), 32768),
            "https://sandbox.example:32768"
        );
        let c = config("publish_host_ip = \"127.0.0.1\"");
        assert_eq!(
            public_url(&c, Some("other:1"), 32768),
            "http://127.0.0.1:32768"
        );
        let c = config("publish_host_ip = \"0.0.0.0\"");
        assert_eq!(
            public_url(&c, Some("myhost.lan:8080"), 5),
            "http://myhost.lan:5"
        );
        assert_eq!(public_url(&c, Some("[::1]:8080"), 5), "http://[::1]:5");
        assert_eq!(
            public_url(&c, Some("0.0.0.0:8080"), 5),
            "http://127.0.0.1:5"
        );
        assert_eq!(public_url(&c, Some("bad host/"), 5), "http://127.0.0.1:5");
        assert_eq!(public_url(&c, None, 5), "http://127.0.0.1:5");
        let c = config(
            "publish_host_ip = \"0.0.0.0\"\nbind_host = \"0.0.0.0\"\nallow_insecure_no_token = true",
        );
        assert_eq!(
            public_url(&c, None, 5),
            "http://127.0.0.1:5",
            "never 0.0.0.0"
        );
    }
}
