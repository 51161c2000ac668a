//! Removing a sandbox's engine objects, in two steps. Its containers (the
//! sandbox's own, its port proxies, an `allowlist` sandbox's egress proxy)
//! go before a stop, an expiry or an eviction is done, so nothing of the
//! session runs after it. The rest (an untaken spare port proxy, which
//! never carried a port of the session; its workspace and claim volumes;
//! and its link network, which the shared egress proxy leaves first) holds
//! nothing of the session and only takes engine time: it goes to [`Teardowns`], a queue
//! that [`run_teardown`] drains in the background, yielding to the creates
//! a user waits for (for a bounded time) while the queue is short; past
//! [`DEFERRED_AT_MOST`] it stops yielding, runs several at once, and cold
//! creates wait for it. The sandbox's checkpoints, in
//! sandboxd's state directory, go with its volumes.
//!
//! Nothing is lost: a retried stop of an id finishes its teardown at once;
//! a create that finds no free link block finishes every pending teardown
//! before it gives up (their link networks hold blocks); at shutdown the
//! queue is finished within a bound, and whatever sandboxd did not finish
//! (killed, or past the bound) is swept by the next start's reconciliation,
//! which removes volumes and link networks of sandboxes it does not adopt
//! (see `rehydrate`).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::port_proxy::spare_name;
use super::registry::{Sandbox, container_name, volume_name};
use super::{Event, SandboxError, SandboxResult, Sandboxes, labels};
use crate::engine::EngineError;

/// The longest a teardown waits for the user's creates to end: under a
/// steady stream of them, teardowns still progress one at a time.
const YIELD_AT_MOST: Duration = Duration::from_secs(2);
/// Pending teardowns past which they no longer yield, and a cold create
/// waits until they are back to this many (see [`Sandboxes::wait_for_teardowns`]).
/// Without a bound, new sessions arriving faster than the engine removes
/// the stopped ones (a session a second or more on two cores, in mode
/// `internet`) left link networks and volumes piling up, and every engine
/// call slowed with them: a sandboxd under such a stream got slower the
/// longer it ran.
pub(super) const DEFERRED_AT_MOST: usize = 8;
/// How many teardowns run at once past the bound: one at a time, each
/// mostly waits on the engine (a network's removal takes its locks and
/// firewall rules), and the backlog shrank slower than a steady stream of
/// sessions grew it (about 1.5 sessions a second here, against the engine's
/// 2.8 for the same work by 4 clients).
const AT_ONCE_PAST_THE_BOUND: usize = 4;
/// The longest a cold create waits for the backlog to shrink: teardowns
/// that keep failing (an engine restarting) do not hold creates forever.
const BACKLOG_WAIT_AT_MOST: Duration = Duration::from_secs(10);
/// How often one teardown is tried before it is left to the next start's
/// reconciliation.
const ATTEMPTS: u32 = 5;
/// The pause after a failed teardown (the engine may be restarting).
const AFTER_FAILURE: Duration = Duration::from_secs(1);
/// How long shutdown waits for the pending teardowns: well inside the
/// 10 s a supervisor gives sandboxd before SIGKILL, next to the engine
/// calls under way that it also waits for (see `server`).
const AT_SHUTDOWN: Duration = Duration::from_secs(3);

/// Whether a removal of a sandbox's containers takes its untaken spare
/// port proxy along.
#[derive(Debug, Clone, Copy)]
enum Spare {
    /// Now, with the rest.
    Too,
    /// Not now: its queued teardown does.
    Later,
}

/// One pending teardown.
#[derive(Debug)]
struct Pending {
    id: String,
    /// Failed tries so far.
    failures: u32,
}

/// Sandboxes whose containers are gone and whose volumes and link network
/// are still to go; see the module docs.
#[derive(Debug)]
pub(super) struct Teardowns {
    queue: watch::Sender<VecDeque<Pending>>,
    /// Read while a background teardown runs (several at once only past
    /// the bound); written by whoever must see them finished (a retried
    /// stop, a create short of a link block, a spare port proxy given
    /// back), so two never remove the same objects at once.
    running: tokio::sync::RwLock<()>,
}

impl Default for Teardowns {
    fn default() -> Self {
        Teardowns {
            queue: watch::channel(VecDeque::new()).0,
            running: tokio::sync::RwLock::new(()),
        }
    }
}

impl Teardowns {
    /// Queues sandbox `id`'s teardown (once).
    fn push(&self, id: &str) {
        self.queue.send_if_modified(|q| {
            if q.iter().any(|p| p.id == id) {
                return false;
            }
            q.push_back(Pending {
                id: id.to_string(),
                failures: 0,
            });
            true
        });
    }

    fn requeue(&self, pending: Pending) {
        self.queue.send_modify(|q| q.push_back(pending));
    }

    fn pop(&self) -> Option<Pending> {
        let mut first = None;
        self.queue.send_if_modified(|q| {
            first = q.pop_front();
            first.is_some()
        });
        first
    }

    /// Takes `id`'s teardown out of the queue, if it is there.
    fn take(&self, id: &str) {
        self.queue.send_if_modified(|q| {
            let before = q.len();
            q.retain(|p| p.id != id);
            q.len() != before
        });
    }

    /// Held by a background teardown: beside the others run with it.
    async fn beside_others(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.running.read().await
    }

    /// Held by a removal that runs alone: once the teardowns under way
    /// are done, and none starts until it is.
    pub(super) async fn alone(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.running.write().await
    }

    /// How many are pending.
    pub(super) fn len(&self) -> usize {
        self.queue.borrow().len()
    }

    /// Returns once at most `n` are pending.
    async fn at_most(&self, n: usize) {
        let mut rx = self.queue.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = rx.wait_for(|q| q.len() <= n).await;
    }

    /// Returns once one is pending.
    async fn pending(&self) {
        let mut rx = self.queue.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = rx.wait_for(|q| !q.is_empty()).await;
    }
}

/// Drains the teardown queue until `shutdown`, then finishes it within a
/// bound (see the module docs).
pub async fn run_teardown(sandboxes: Arc<Sandboxes>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = sandboxes.teardown.pending() => {}
        }
        // A create a request waits for goes first, for a while, unless
        // the backlog is past its bound: then several go at once.
        let at_once = if sandboxes.teardown.len() > DEFERRED_AT_MOST {
            AT_ONCE_PAST_THE_BOUND
        } else {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::timeout(YIELD_AT_MOST, sandboxes.foreground.quiet()) => {}
            }
            1
        };
        let next = (0..at_once).map(|_| sandboxes.tear_down_next());
        let done = futures_util::future::join_all(next).await;
        if done.contains(&false) {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(AFTER_FAILURE) => {}
            }
        }
    }
    if tokio::time::timeout(AT_SHUTDOWN, sandboxes.finish_teardowns())
        .await
        .is_err()
    {
        tracing::info!(
            pending = sandboxes.teardown.len(),
            "teardowns left at shutdown; the next start removes what they leave"
        );
    }
}

impl Sandboxes {
    /// Removes sandbox `id` (dropped from the registry by the caller):
    /// its containers now, the rest after (see the module docs). Records
    /// `why`; failures are logged, and the queued teardown tries again.
    pub(super) async fn remove_objects(&self, id: &str, why: Event, s: Option<&Arc<Sandbox>>) {
        if let Err(e) = self.remove_containers_then_queue(id).await {
            tracing::warn!(sandbox_id = %id, error = %e, "could not remove the sandbox's containers; its teardown tries again");
        }
        why.record(id, s.map(|s| s.session_key.as_str()).unwrap_or(""));
        // Its slot may be the pool's now.
        self.pool.wake();
    }

    /// Removes `id`'s containers but an untaken spare port proxy, then
    /// queues the removal of the rest (the spare too: it never carried a
    /// port of the session, and forwards to a relay port no agent serves).
    /// The teardown is queued even when the removal failed: it removes
    /// whatever container is left too.
    pub(super) async fn remove_containers_then_queue(&self, id: &str) -> SandboxResult<()> {
        let removed = self.remove_containers(id, Spare::Later).await;
        self.teardown.push(id);
        removed
    }

    /// How many stopped sandboxes' teardowns are pending.
    pub fn teardowns_pending(&self) -> usize {
        self.teardown.len()
    }

    /// Before a cold create makes its engine objects: waits (at most
    /// [`BACKLOG_WAIT_AT_MOST`]) until no more than [`DEFERRED_AT_MOST`]
    /// teardowns are pending, which the background task, no longer
    /// yielding, brings about. Under a stream of new sessions faster than
    /// the engine makes and removes sandboxes, creates then go at the pace
    /// the engine keeps, instead of leaving a growing debt behind them.
    pub(super) async fn wait_for_teardowns(&self) {
        if self.teardown.len() <= DEFERRED_AT_MOST {
            return;
        }
        let started = std::time::Instant::now();
        let shrunk = tokio::time::timeout(
            BACKLOG_WAIT_AT_MOST,
            self.teardown.at_most(DEFERRED_AT_MOST),
        )
        .await
        .is_ok();
        tracing::debug!(
            waited_ms = started.elapsed().as_millis() as u64,
            shrunk,
            pending = self.teardown.len(),
            "a cold create waited for the teardown backlog"
        );
    }

    /// Everything of `id` is removed before this returns: its queued
    /// teardown (or the one under way) is finished. For a retried stop and
    /// a sweep of an id sandboxd no longer knows. One that fails is queued
    /// again: a sweep's caller (a port published while its sandbox
    /// stopped) drops the error, and the teardown it took out of the
    /// queue would otherwise be left to the next start.
    pub(super) async fn finish_teardown(&self, id: &str) -> SandboxResult<()> {
        let _alone = self.teardown.alone().await;
        self.teardown.take(id);
        let removed = self.remove_objects_checked(id).await;
        if let Err(e) = &removed {
            tracing::warn!(sandbox_id = %id, error = %e, "teardown failed; trying again later");
            self.teardown.push(id);
        }
        self.next_link.wake();
        removed
    }

    /// Finishes every pending teardown (and waits for the one under way);
    /// a failed one is queued again.
    pub(super) async fn finish_teardowns(&self) {
        let _alone = self.teardown.alone().await;
        let mut failed = Vec::new();
        while let Some(p) = self.teardown.pop() {
            if let Err(e) = self.remove_objects_checked(&p.id).await {
                tracing::warn!(sandbox_id = %p.id, error = %e, "teardown failed; trying again later");
                failed.push(p);
            }
        }
        for p in failed {
            self.teardown.requeue(p);
        }
        self.next_link.wake();
    }

    /// Runs the next pending teardown; false when it failed.
    async fn tear_down_next(&self) -> bool {
        let _beside = self.teardown.beside_others().await;
        let Some(mut p) = self.teardown.pop() else {
            return true;
        };
        match self.remove_objects_checked(&p.id).await {
            Ok(()) => {
                // Its link block may be free now.
                self.next_link.wake();
                true
            }
            Err(e) => {
                p.failures += 1;
                if p.failures < ATTEMPTS {
                    tracing::warn!(sandbox_id = %p.id, error = %e, failures = p.failures, "teardown failed; trying again");
                    self.teardown.requeue(p);
                } else {
                    tracing::warn!(sandbox_id = %p.id, error = %e, "teardown failed repeatedly; the next start of sandboxd removes what is left");
                }
                false
            }
        }
    }

    /// Removes proxies, containers, volumes and link network of `id`,
    /// found by label as well as by name so nothing of ours is left. A
    /// port being published meanwhile can attach a proxy to the link
    /// network after the containers were listed: the network then has
    /// active endpoints, and another round removes the newcomer (its
    /// publisher sweeps after itself too, see `Ports::prepare`).
    pub(super) async fn remove_objects_checked(&self, id: &str) -> SandboxResult<()> {
        const ROUNDS: usize = 5;
        for round in 1.. {
            match self.remove_objects_once(id).await {
                Err(SandboxError::Engine(EngineError::Failed(m)))
                    if m.contains("active endpoints") && round < ROUNDS =>
                {
                    tracing::debug!(sandbox_id = %id, round, "a proxy joined the link network meanwhile");
                }
                other => return other,
            }
        }
        Ok(())
    }

    async fn remove_objects_once(&self, id: &str) -> SandboxResult<()> {
        self.remove_containers(id, Spare::Too).await?;
        self.remove_volumes_and_link(id).await
    }

    /// Removes every container of `id` (its untaken spare port proxy only
    /// with [`Spare::Too`]): the sandbox's own by name, at once (the
    /// longest removal: a running container on a network), and beside it
    /// the others found by label, all at once (the engine removes them in
    /// parallel). A proxy whose publishing raced the
    /// removal can appear after the listing: the list is read again until
    /// it holds none (a few rounds). One still being made after that
    /// relays to nothing (the sandbox's container is gone); its publisher
    /// removes it when it finds the sandbox gone, and the teardown does
    /// too.
    async fn remove_containers(&self, id: &str, spare: Spare) -> SandboxResult<()> {
        const ROUNDS: usize = 3;
        let inst = self.config.instance.as_str();
        let filter = [(labels::INSTANCE, inst), (labels::SANDBOX_ID, id)];
        let own = container_name(inst, id);
        let kept = match spare {
            Spare::Later => Some(spare_name(inst, id)),
            Spare::Too => None,
        };
        let others = async {
            for _ in 0..ROUNDS {
                let listed: Vec<String> = self
                    .engine
                    .list_containers(&filter)
                    .await?
                    .into_iter()
                    .map(|c| c.name)
                    .filter(|name| *name != own && Some(name) != kept.as_ref())
                    .collect();
                if listed.is_empty() {
                    break;
                }
                let removals = listed.iter().map(|name| self.engine.remove_container(name));
                for removed in futures_util::future::join_all(removals).await {
                    removed?;
                }
            }
            Ok::<(), SandboxError>(())
        };
        let (own_removed, others_removed) =
            tokio::join!(self.engine.remove_container(&own), others);
        own_removed?;
        others_removed
    }

    /// Removes `id`'s volumes (workspace, claim) and link network, once
    /// no container holds them (the shared egress proxy leaves first).
    async fn remove_volumes_and_link(&self, id: &str) -> SandboxResult<()> {
        let inst = self.config.instance.as_str();
        let filter = [(labels::INSTANCE, inst), (labels::SANDBOX_ID, id)];
        let mut volumes: BTreeSet<String> = self
            .engine
            .list_volumes(&filter)
            .await?
            .into_iter()
            .map(|v| v.name)
            .collect();
        volumes.insert(volume_name(inst, id));
        for name in &volumes {
            self.engine.remove_volume(name).await?;
        }
        for n in self.engine.list_networks(&filter).await? {
            self.detach_shared_egress(&n.name).await?;
            self.engine.remove_network(&n.name).await?;
        }
        // Its checkpoints go with its workspace.
        if let Some(dir) = self.config.checkpoint_dir(id) {
            match tokio::fs::remove_dir_all(&dir).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(sandbox_id = %id, error = %e, "could not remove the sandbox's checkpoints");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_queue_holds_each_id_once_in_order_and_wakes_its_drainer() {
        let q = Teardowns::default();
        let waiting = tokio::spawn({
            let mut rx = q.queue.subscribe();
            async move { rx.wait_for(|q| !q.is_empty()).await.map(|_| ()) }
        });
        q.push("a");
        q.push("b");
        q.push("a");
        assert_eq!(q.len(), 2, "a second push of an id adds nothing");
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken by the push")
            .expect("task")
            .expect("sender alive");
        q.push("c");
        q.take("b");
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).map(|p| p.id).collect();
        assert_eq!(order, ["a", "c"], "b was taken out");
        tokio::time::timeout(Duration::from_millis(50), q.pending())
            .await
            .expect_err("nothing pending");
    }
}
