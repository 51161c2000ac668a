//! Port proxy containers as the domain names and makes them (the work of
//! publishing a port is `ports`'), and the spare proxy made ahead. A proxy
//! takes about as long to start as any container, longer than a chat user
//! should wait for a URL; it is made before its port is known instead: a
//! *spare*, on the link network of a pool member or of the next `internet`
//! sandbox, forwarding to [`SPARE_RELAY_PORT`]. The sandbox's first port
//! takes it: the engine renames it to that port's proxy (one call, atomic,
//! so of two ports publishing at once one gets it and the other makes its
//! own proxy), and the agent relays the spare relay port to that port. A
//! proxy's relay port is a label, read back whenever it is published, so a
//! restart of sandboxd relays the right port. A new sandbox whose ports
//! did not take its spare gives it back a little later (see
//! [`SPARE_KEPT`]); until then it costs an idle container (about 13 MB of
//! engine shim on the host).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::network::{LINK_ALIAS, link_name};
use super::spec::NetworkMode;
use super::{SandboxError, SandboxResult, Sandboxes, labels};
use crate::engine::{EngineError, ProxyContainer};

/// The port a proxy listens on inside its own container.
pub const PROXY_LISTEN_PORT: u16 = 8080;

/// The relay port a spare forwards to: the last registered port, below the
/// dynamic range every port's own relay port is in (see
/// `ports::relay_port`), so it is never another port's relay.
pub const SPARE_RELAY_PORT: u16 = 49151;

/// How long a new sandbox keeps a spare proxy no port took before giving
/// it back: a burst's next creates, a first command and a stop right after
/// the create find the engine free of that removal (a stop in that time
/// leaves it to the teardown after its answer). An idle spare costs about
/// 13 MB of engine shim on the host for that long.
const SPARE_KEPT: Duration = Duration::from_secs(10);

/// Engine name of a port's proxy container.
pub fn proxy_name(instance: &str, sandbox_id: &str, port: u16) -> String {
    format!("{instance}-{sandbox_id}-port-{port}")
}

/// Engine name of a sandbox's spare proxy: no port's name.
pub(super) fn spare_name(instance: &str, sandbox_id: &str) -> String {
    format!("{instance}-{sandbox_id}-port-spare")
}

/// The port whose proxy `name` is (see [`proxy_name`]); `None` for a spare
/// or anything else.
pub fn port_of_proxy(instance: &str, sandbox_id: &str, name: &str) -> Option<u16> {
    name.strip_prefix(&format!("{instance}-{sandbox_id}-port-"))?
        .parse()
        .ok()
}

/// The relay port a proxy forwards to, from its labels; `None` on a proxy
/// of a sandboxd that did not write it (it forwards to its port's own).
pub fn relay_port_of(labels: &HashMap<String, String>) -> Option<u16> {
    labels.get(labels::RELAY_PORT)?.parse().ok()
}

impl Sandboxes {
    /// What a proxy of sandbox `sandbox_id` is made from: forwarding to
    /// the agent's relay on `relay`; `port` is the port and the session it
    /// is made for, `None` for a spare (made before both are known).
    pub fn proxy_spec(
        &self,
        sandbox_id: &str,
        port: Option<(u16, &str)>,
        relay: u16,
    ) -> ProxyContainer {
        let instance = &self.config.instance;
        let mut labels = labels::instance_only(instance);
        labels.insert(labels::ROLE.into(), labels::ROLE_PROXY.into());
        labels.insert(labels::SANDBOX_ID.into(), sandbox_id.to_string());
        labels.insert(labels::RELAY_PORT.into(), relay.to_string());
        let name = match port {
            Some((port, session_key)) => {
                labels.insert(labels::SESSION_KEY.into(), session_key.to_string());
                labels.insert(labels::PORT.into(), port.to_string());
                proxy_name(instance, sandbox_id, port)
            }
            None => spare_name(instance, sandbox_id),
        };
        ProxyContainer {
            name,
            image: self
                .config
                .proxy_image
                .clone()
                .unwrap_or_else(|| self.config.image.clone()),
            user: self.config.sandbox_user.clone(),
            network: self.config.network_name().to_string(),
            link_network: link_name(instance, sandbox_id),
            publish_ip: self.config.publish_host_ip.to_string(),
            listen_port: PROXY_LISTEN_PORT,
            target_host: LINK_ALIAS.to_string(),
            target_port: relay,
            labels,
        }
    }

    /// Makes the spare proxy of sandbox `id`, whose link network exists
    /// (modes with one from the start only). A failure costs only the
    /// first port's speed: it is logged, and nothing half-made stays.
    pub(super) async fn make_spare_proxy(&self, id: &str, network: NetworkMode) {
        if !network.through_egress() {
            return;
        }
        let spec = self.proxy_spec(id, None, SPARE_RELAY_PORT);
        let made = async {
            // It publishes through the instance network, which the first
            // sandbox of a new instance would otherwise make.
            if !self.network_ready.load(Ordering::Relaxed) {
                self.ensure_network().await?;
            }
            self.engine.start_proxy(&spec).await?;
            Ok::<_, SandboxError>(())
        };
        if let Err(e) = made.await {
            tracing::warn!(sandbox_id = %id, error = %e, "could not make a spare port proxy; the first port makes its own");
            self.remove_spare_proxy(id).await;
        }
    }

    /// Makes the spare proxy of sandbox `id` the proxy of `port`; false
    /// when there is none to take (the port then makes its own proxy).
    /// Port [`SPARE_RELAY_PORT`] cannot take it (a relay never listens on
    /// its own target): the spare goes, so the sandbox never holds more
    /// proxies than ports.
    pub async fn take_spare_proxy(&self, id: &str, port: u16) -> SandboxResult<bool> {
        let instance = &self.config.instance;
        if port == SPARE_RELAY_PORT {
            self.remove_spare_proxy(id).await;
            return Ok(false);
        }
        match self
            .engine
            .rename_container(&spare_name(instance, id), &proxy_name(instance, id, port))
            .await
        {
            Ok(()) => Ok(true),
            Err(EngineError::NotFound(_)) => Ok(false),
            Err(e) => {
                tracing::warn!(sandbox_id = %id, port, error = %e, "could not take the spare port proxy; removing it");
                self.remove_spare_proxy(id).await;
                Ok(false)
            }
        }
    }

    /// Removes the spare proxy of sandbox `id`, if it still has one (a
    /// port takes it), [`SPARE_KEPT`] after this is called and once no
    /// create or stop a request waits for is under way, one such removal
    /// at a time: the work of a background task.
    pub async fn give_back_spare_proxy(&self, id: &str) {
        tokio::time::sleep(SPARE_KEPT).await;
        self.foreground.quiet().await;
        let _alone = self.teardown.alone().await;
        // Stopped meanwhile: the stop removed the spare with the sandbox.
        if self.registry.get(id).is_some() {
            self.remove_spare_proxy(id).await;
        }
    }

    /// Removes the spare proxy of sandbox `id`, if it has one.
    pub(super) async fn remove_spare_proxy(&self, id: &str) {
        let name = spare_name(&self.config.instance, id);
        if let Err(e) = self.engine.remove_container(&name).await {
            tracing::warn!(sandbox_id = %id, error = %e, "could not remove a spare port proxy (the sandbox's removal does)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_name_says_its_port_and_a_spare_s_says_none() {
        let name = proxy_name("inst", "abc", 3000);
        assert_eq!(port_of_proxy("inst", "abc", &name), Some(3000));
        assert_eq!(
            port_of_proxy("inst", "abd", &name),
            None,
            "another sandbox's"
        );
        assert_eq!(
            port_of_proxy("inst", "abc", &spare_name("inst", "abc")),
            None
        );
        assert_eq!(port_of_proxy("inst", "abc", "inst-abc-port-70000"), None);
    }
}
