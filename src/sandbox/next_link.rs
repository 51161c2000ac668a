//! The link networks of the next `internet` sandboxes, made ahead. A
//! sandbox of that mode needs a network of its own, joined by the shared
//! egress proxy; the engine takes about as long to make and join one as to
//! start the container, and a cold create that makes its own pays for it
//! (on two cores the network's making competes with the container's). Up
//! to `links_ahead` are kept ready, each under the id the sandbox that
//! takes it gets, so the cold creates of a series of new sessions, one
//! after another past the warm pool, each make only their volume and
//! container. They are made again in the background once the creates that
//! took them and the work after their answers are done; when the link
//! pool has no other free block, whoever needs one takes one of these
//! blocks (see `Sandboxes::link_network`). Each comes with a spare port
//! proxy (see `port_proxy`), so the new sandbox's first port does not wait
//! for a container start either. They hold no state of any session: a
//! restart of sandboxd removes them like any link network without a
//! sandbox (see `rehydrate`), and makes new ones.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// The link networks made ahead, oldest first.
#[derive(Debug)]
pub(super) struct NextLinks {
    ready: Mutex<VecDeque<PreparedLink>>,
    /// How many are kept (`links_ahead`).
    wanted: usize,
    /// Held while one is being made: whoever finds no free block waits
    /// for it, then takes its block back.
    making: tokio::sync::Mutex<()>,
    /// Creates that took one and whose work after the answer is not done.
    following: Arc<Following>,
}

/// The creates that took a prepared link network and are not done yet,
/// and the preparer's wake-up.
#[derive(Debug, Default)]
struct Following {
    count: AtomicUsize,
    wake: Notify,
}

impl NextLinks {
    pub(super) fn new(wanted: usize) -> Self {
        NextLinks {
            ready: Mutex::new(VecDeque::with_capacity(wanted)),
            wanted,
            making: tokio::sync::Mutex::new(()),
            following: Arc::default(),
        }
    }

    /// Takes the oldest prepared network (for a sandbox, or to give its
    /// block back). The taker holds [`NextLinks::refill_after`] until it
    /// is done: preparing the next one meanwhile would compete with it for
    /// the engine.
    pub(super) fn take(&self) -> Option<PreparedLink> {
        self.ready.lock().ok()?.pop_front()
    }

    /// Keeps `link` unless as many as wanted are ready already.
    fn put(&self, link: PreparedLink) -> Result<(), PreparedLink> {
        match self.ready.lock() {
            Ok(mut ready) if ready.len() < self.wanted => {
                ready.push_back(link);
                Ok(())
            }
            _ => Err(link),
        }
    }

    /// Held by a create that took a prepared network and by the work that
    /// follows its answer (connecting to the agent, publishing ports),
    /// which the engine would otherwise do next to the making of the next
    /// one; the preparer waits until every such hold is dropped.
    pub(super) fn refill_after(&self) -> Arc<RefillAfter> {
        self.following.count.fetch_add(1, Ordering::SeqCst);
        Arc::new(RefillAfter(Arc::clone(&self.following)))
    }

    /// How many are ready.
    pub(super) fn ready(&self) -> usize {
        self.ready.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// How many are kept.
    pub(super) fn wanted(&self) -> usize {
        self.wanted
    }

    /// Lets the preparer look again (a link block may be free now).
    pub(super) fn wake(&self) {
        self.following.wake.notify_one();
    }

    /// Returns once no create that took one is still following up.
    async fn followed_up(&self) {
        loop {
            let woken = self.following.wake.notified();
            if self.following.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            woken.await;
        }
    }
}

/// Counts a create that took a prepared link network until dropped, then
/// wakes the preparer (see [`NextLinks::refill_after`]).
#[derive(Debug)]
pub struct RefillAfter(Arc<Following>);

impl Drop for RefillAfter {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.wake.notify_one();
    }
}

/// Keeps `links_ahead` link networks ready until `shutdown`, when
/// `internet` is the mode a create gets by default. Starts once
/// rehydration is done (which removes those an earlier run left). Those
/// ready at shutdown stay for the next start to remove.
pub async fn run_next_link(sandboxes: Arc<Sandboxes>, shutdown: CancellationToken) {
    if sandboxes.config.network_default != NetworkMode::Internet.as_str()
        || sandboxes.next_link.wanted() == 0
    {
        return;
    }
    let mut ready = sandboxes.ready.subscribe();
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = ready.wait_for(|r| *r) => {}
    }
    loop {
        let mut wait = Duration::MAX;
        let links = &sandboxes.next_link;
        if links.ready() < links.wanted() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                // A create a request waits for goes first, and the work
                // after the answer of one that took a network.
                _ = async {
                    links.followed_up().await;
                    sandboxes.foreground.quiet().await;
                } => {}
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                ok = sandboxes.prepare_link() => if ok { continue } else { wait = RETRY_AFTER },
            }
        }
        let woken = links.following.wake.notified();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = woken => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

impl Sandboxes {
    /// How many link networks are made ahead for the next `internet`
    /// sandboxes, and how many are kept (`links_ahead`; 0 when `internet`
    /// is not the default mode).
    pub fn link_networks_ahead(&self) -> (usize, usize) {
        let wanted = if self.config.network_default == NetworkMode::Internet.as_str() {
            self.next_link.wanted()
        } else {
            0
        };
        (self.next_link.ready(), wanted)
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

    /// A prepared link network (once any being made is), to give its
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

#[cfg(test)]
mod tests {
    use super::*;

    fn link(id: &str) -> PreparedLink {
        PreparedLink {
            id: id.into(),
            subnet: format!("10.213.0.{id}/28"),
        }
    }

    #[test]
    fn keeps_as_many_as_wanted_and_hands_out_the_oldest_first() {
        let links = NextLinks::new(2);
        assert!(links.put(link("1")).is_ok());
        assert!(links.put(link("2")).is_ok());
        assert_eq!(links.put(link("3")), Err(link("3")), "two are wanted");
        assert_eq!(links.ready(), 2);
        assert_eq!(links.take(), Some(link("1")));
        assert!(links.put(link("3")).is_ok(), "room for one again");
        assert_eq!(links.take(), Some(link("2")));
        assert_eq!(links.take(), Some(link("3")));
        assert_eq!(links.take(), None);
        let none = NextLinks::new(0);
        assert_eq!(none.put(link("1")), Err(link("1")), "0 keeps none");
    }

    #[tokio::test]
    async fn the_preparer_waits_until_every_create_that_took_one_is_done() {
        let links = NextLinks::new(2);
        tokio::time::timeout(Duration::from_secs(1), links.followed_up())
            .await
            .expect("nothing to wait for");
        let first = links.refill_after();
        let held = Arc::clone(&first);
        let second = links.refill_after();
        drop(first);
        let waiting = tokio::time::timeout(Duration::from_millis(50), links.followed_up()).await;
        assert!(waiting.is_err(), "two creates still follow up");
        drop(held);
        drop(second);
        tokio::time::timeout(Duration::from_secs(1), links.followed_up())
            .await
            .expect("both done");
    }
}
