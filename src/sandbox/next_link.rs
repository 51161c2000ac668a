//! The link network of the next `internet` sandbox, made ahead. A sandbox
//! of that mode needs a network of its own, joined by the shared egress
//! proxy; the engine takes about as long to make and join one as to start
//! the container, and a cold create used to wait for both in turn. One is
//! kept ready under the id the next such sandbox takes, so a cold create
//! makes only its volume and container. It is refilled in the background
//! after each use; when the link pool has no other free block, whoever
//! needs one takes this one's (see `Sandboxes::link_network`). It comes
//! with a spare port proxy (see `port_proxy`), so the new sandbox's first
//! port does not wait for a container start either. It holds no
//! state of any session: a restart of sandboxd removes it like any link
//! network without a sandbox (see `rehydrate`), and makes a new one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::spec::NetworkMode;
use super::{Sandboxes, registry};

/// How long a failed preparation waits before the next try (a stop or a
/// use wakes it earlier).
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A link network ready for a sandbox that takes its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PreparedLink {
    pub(super) id: String,
    pub(super) subnet: String,
}

/// The prepared link network, if one is ready.
#[derive(Debug, Default)]
pub(super) struct NextLink {
    ready: Mutex<Option<PreparedLink>>,
    /// Held while one is being made: whoever finds no free block waits
    /// for it, then takes its block back.
    making: tokio::sync::Mutex<()>,
    wake: Arc<Notify>,
}

impl NextLink {
    /// Takes the prepared network (for a sandbox, or to give its block
    /// back). The taker wakes the preparer once done: preparing the next
    /// one meanwhile would compete with it for the engine.
    pub(super) fn take(&self) -> Option<PreparedLink> {
        self.ready.lock().ok()?.take()
    }

    fn put(&self, link: PreparedLink) -> Result<(), PreparedLink> {
        match self.ready.lock() {
            Ok(mut slot) if slot.is_none() => {
                *slot = Some(link);
                Ok(())
            }
            _ => Err(link),
        }
    }

    /// Wakes the preparer when the last clone is dropped: a create that
    /// took the prepared network hands it to the work that follows its
    /// answer (connecting to the agent, publishing ports), which the
    /// engine would otherwise do next to the making of the next one.
    pub(super) fn refill_after(&self) -> Arc<RefillAfter> {
        Arc::new(RefillAfter(Arc::clone(&self.wake)))
    }

    /// Whether one is ready.
    pub(super) fn is_ready(&self) -> bool {
        self.ready.lock().map(|s| s.is_some()).unwrap_or(false)
    }

    /// Lets the preparer look again (a link block may be free now).
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }
}

/// Wakes the preparer of the next link network when dropped (see
/// `NextLink::refill_after`).
#[derive(Debug)]
pub struct RefillAfter(Arc<Notify>);

impl Drop for RefillAfter {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// Keeps one link network ready until `shutdown`, when `internet` is the
/// mode a create gets by default. Starts once rehydration is done (which
/// removes the one an earlier run left). The one ready at shutdown stays
/// for the next start to remove.
pub async fn run_next_link(sandboxes: Arc<Sandboxes>, shutdown: CancellationToken) {
    if sandboxes.config.network_default != NetworkMode::Internet.as_str() {
        return;
    }
    let mut ready = sandboxes.ready.subscribe();
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = ready.wait_for(|r| *r) => {}
    }
    loop {
        let mut wait = Duration::MAX;
        if !sandboxes.next_link.is_ready() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                // A create a request waits for goes first.
                _ = sandboxes.foreground.quiet() => {}
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                ok = sandboxes.prepare_link() => if !ok { wait = RETRY_AFTER },
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sandboxes.next_link.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

impl Sandboxes {
    /// Whether the next `internet` sandbox's link network is made.
    pub fn link_network_ready(&self) -> bool {
        self.next_link.is_ready()
    }

    /// Makes a link network for a new id and keeps it ready, then joins
    /// the shared egress proxy to it (a create that takes it before that
    /// joins it itself); false when it could not be made.
    async fn prepare_link(&self) -> bool {
        let Ok(id) = registry::new_sandbox_id() else {
            tracing::warn!("no id for the next link network: the OS random source failed");
            return false;
        };
        // Held until the proxy has joined: a link taken back for its block
        // is then removed whole. Before, the proxy could join it between
        // the detach and the removal, and the engine refused the removal
        // (active endpoint), so the block stayed taken.
        let _making = self.next_link.making.lock().await;
        let subnet = match self.make_link_network(&id).await {
            Ok(subnet) => subnet,
            Err(e) => {
                tracing::debug!(error = %e, "could not prepare the next link network");
                self.release_link(&id).await;
                return false;
            }
        };
        // Its spare port proxy before it is handed out: a create that took
        // it earlier would publish its first port the slow way.
        self.make_spare_proxy(&id, NetworkMode::Internet).await;
        let link = PreparedLink {
            id: id.clone(),
            subnet: subnet.clone(),
        };
        if let Err(extra) = self.next_link.put(link) {
            self.release_link(&extra.id).await;
            return true;
        }
        if let Err(e) = self
            .attach_egress(&id, NetworkMode::Internet, &[], &subnet)
            .await
        {
            tracing::debug!(error = %e, "the shared egress proxy did not join the prepared link network");
        }
        true
    }

    /// The prepared link network (once any being made is), to give its
    /// block back.
    pub(super) async fn take_link_for_its_block(&self) -> Option<PreparedLink> {
        let _made = self.next_link.making.lock().await;
        self.next_link.take()
    }

    /// Removes a prepared link network no sandbox took, and its spare
    /// port proxy (which holds an endpoint on it).
    pub(super) async fn release_link(&self, id: &str) {
        let name = super::network::link_name(&self.config.instance, id);
        self.remove_spare_proxy(id).await;
        let removed = async {
            self.detach_shared_egress(&name).await?;
            self.engine.remove_network(&name).await?;
            Ok::<_, super::SandboxError>(())
        }
        .await;
        if let Err(e) = removed {
            tracing::warn!(network = %name, error = %e, "could not remove a prepared link network");
        }
    }
}
