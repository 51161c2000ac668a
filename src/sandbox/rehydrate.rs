//! Startup reconciliation: rebuild the registry from this instance's labelled
//! engine objects, so a restart of sandboxd loses no session. Running
//! sandboxes are adopted; stopped ones are started again or, failing that,
//! removed; proxies (spare proxies too), volumes and link networks without
//! an adopted sandbox are removed (so is whatever a stop's teardown left
//! when sandboxd was killed before finishing it: see `teardown`); every
//! sandbox behind the egress proxy gets its way out again.
//! A warm pool member is adopted only as the session its claim volume names
//! (see `labels`); one without a claim is removed, and the pool refills.
//! Objects of other instances are never looked at.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::registry::Sandbox;
use super::spec::NetworkMode;
use super::{Event, Sandboxes, labels, port_proxy};
use crate::clock::now_ms;
use crate::engine::{ContainerRecord, EngineResult};

impl Sandboxes {
    /// Waits for the engine, then reconciles; returns true once done (false
    /// on shutdown). The caller lets requests in with `mark_ready`.
    pub async fn rehydrate_when_connected(self: Arc<Self>, shutdown: CancellationToken) -> bool {
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = self.engine().connected() => {}
        }
        loop {
            match self.rehydrate().await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "rehydration failed; retrying in 1 s");
                    tokio::select! {
                        _ = shutdown.cancelled() => return false,
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    }
                }
            }
        }
        true
    }

    async fn rehydrate(&self) -> EngineResult<()> {
        let instance = self.config().instance.clone();
        let mine = [(labels::INSTANCE, instance.as_str())];
        let ByRole {
            sandboxes,
            proxies,
            egresses,
        } = self.containers_by_role(&mine).await?;
        let claims = self.claims(&instance).await?;
        let adopted = self.adopt_sandboxes(&instance, sandboxes, &claims).await?;
        self.reconcile_proxies(proxies, &adopted).await?;
        self.reconcile_egresses(egresses, &adopted).await?;
        self.reconcile_link_networks(&mine, &adopted).await?;
        self.restore_ways_out().await;
        self.remove_orphan_volumes(&mine, &adopted).await?;
        self.remove_stale_agent_volumes().await;
        self.restore_lifetimes().await;
        tracing::info!(sandboxes = adopted.len(), "rehydration done");
        Ok(())
    }

    /// This instance's containers by role; one with no known role is
    /// removed.
    async fn containers_by_role(&self, mine: &[(&str, &str)]) -> EngineResult<ByRole> {
        let mut by_role = ByRole::default();
        for c in self.engine().list_containers(mine).await? {
            match c.labels.get(labels::ROLE).map(String::as_str) {
                Some(labels::ROLE_SANDBOX) => by_role.sandboxes.push(c),
                Some(labels::ROLE_PROXY) => by_role.proxies.push(c),
                Some(labels::ROLE_EGRESS) => by_role.egresses.push(c),
                _ => {
                    tracing::warn!(container = %c.name, "container of this instance has no known role; removing it");
                    self.engine().remove_container(&c.name).await?;
                }
            }
        }
        Ok(by_role)
    }

    /// Who claimed which pool member: the claim volumes' labels, by sandbox
    /// id.
    async fn claims(&self, instance: &str) -> EngineResult<Claims> {
        Ok(self
            .engine()
            .list_volumes(&[
                (labels::INSTANCE, instance),
                (labels::ROLE, labels::ROLE_CLAIM),
            ])
            .await?
            .into_iter()
            .filter_map(|v| Some((v.labels.get(labels::SANDBOX_ID)?.clone(), v.labels)))
            .collect())
    }

    /// Adopts the sandbox containers whose labels read, one per session
    /// key, each running this sandboxd's agent (recreated if not) and
    /// started; the others are removed. Returns the ids adopted.
    async fn adopt_sandboxes(
        &self,
        instance: &str,
        sandboxes: Vec<ContainerRecord>,
        claims: &Claims,
    ) -> EngineResult<BTreeSet<String>> {
        // Oldest first, so if a session key somehow has two, the first wins.
        let mut records: Vec<_> = sandboxes
            .into_iter()
            .map(|c| {
                let record = if labels::is_member(&c.labels) {
                    let id = c.labels.get(labels::SANDBOX_ID);
                    labels::decode_member(&c.labels, id.and_then(|id| claims.get(id)))
                } else {
                    labels::decode(&c.labels)
                };
                (record, c)
            })
            .collect();
        records.sort_by_key(|(r, _)| r.as_ref().map(|r| r.created_at).unwrap_or(0));

        let mut adopted: BTreeSet<String> = BTreeSet::new();
        let mut keys: HashMap<String, String> = HashMap::new();
        for (record, c) in records {
            let mut record = match record {
                Ok(r) => r,
                Err(e) => {
                    if labels::is_member(&c.labels) {
                        tracing::info!(container = %c.name, reason = %e, "pool member not adopted; removing it (the pool refills)");
                    } else {
                        tracing::warn!(container = %c.name, error = %e, "unreadable sandbox labels; removing it");
                    }
                    if let Some(id) = c.labels.get(labels::SANDBOX_ID) {
                        self.remove_objects(id, Event::Removed, None).await;
                    } else {
                        self.engine().remove_container(&c.name).await?;
                    }
                    continue;
                }
            };
            if keys.contains_key(&record.session_key) {
                tracing::warn!(sandbox_id = %record.id, session_key = %record.session_key, "second sandbox for one session key; removing it");
                self.remove_objects(&record.id, Event::Removed, None).await;
                continue;
            }
            let Some(recreated) = self.make_current(&mut record, &c).await else {
                self.remove_objects(&record.id, Event::Removed, None).await;
                continue;
            };
            let sandbox = Arc::new(Sandbox::from_record(instance, &record, now_ms()));
            // The engine keeps a pause across a restart of sandboxd (a
            // recreated container is not paused).
            sandbox.set_paused(c.paused && !recreated);
            Event::Rehydrated.record(&record.id, &record.session_key);
            keys.insert(record.session_key.clone(), record.id.clone());
            adopted.insert(record.id.clone());
            self.registry().adopt(sandbox);
        }
        Ok(adopted)
    }

    /// Makes a sandbox container fit to adopt: recreated when another
    /// sandboxd version made it (it must run this agent), started when it
    /// is stopped (a paused one stays paused). Whether it was recreated;
    /// `None`, with the reason logged, when that failed.
    async fn make_current(
        &self,
        record: &mut labels::SandboxRecord,
        c: &ContainerRecord,
    ) -> Option<bool> {
        if c.labels.get(labels::AGENT).map(String::as_str)
            != Some(super::agent_delivery::AGENT_VERSION)
        {
            // Mode `open` (also what sandboxes made before egress
            // policies had) that the configuration no longer allows:
            // the new container gets the default mode, never more.
            if record.network == NetworkMode::Open
                && !self.config().network_modes.iter().any(|m| m == "open")
                && let Some(mode) = NetworkMode::parse(&self.config().network_default)
            {
                tracing::info!(sandbox_id = %record.id, mode = %self.config().network_default, "network mode open is not allowed any more; the recreated sandbox gets the default mode");
                record.network = mode;
            }
            // A paused container is thawed first: its processes take the
            // removal's kill.
            if c.paused
                && let Err(e) = self.engine().unpause_container(&c.name).await
            {
                tracing::debug!(sandbox_id = %record.id, error = %e, "unpause before recreating");
            }
            match self.recreate(record).await {
                Ok(()) => {
                    tracing::info!(sandbox_id = %record.id, "sandbox recreated with this sandboxd's agent; its workspace is kept");
                }
                Err(e) => {
                    tracing::warn!(sandbox_id = %record.id, error = %e, "sandbox could not be recreated with this agent; removing it");
                    return None;
                }
            }
            return Some(true);
        } else if !c.running
            && !c.paused
            && let Err(e) = self.engine().start_container(&c.name).await
        {
            tracing::warn!(sandbox_id = %record.id, error = %e, "stopped sandbox would not start; removing it");
            return None;
        }
        Some(false)
    }

    /// Port proxies: a running one of an adopted sandbox keeps its host
    /// port; a stopped one goes (its port stays allowed); one of a sandbox
    /// that is gone goes.
    async fn reconcile_proxies(
        &self,
        proxies: Vec<ContainerRecord>,
        adopted: &BTreeSet<String>,
    ) -> EngineResult<()> {
        for p in proxies {
            let owner = p
                .labels
                .get(labels::SANDBOX_ID)
                .cloned()
                .unwrap_or_default();
            // A spare that became a port's proxy says its port by its name
            // only; one still spare says none.
            let port = p
                .labels
                .get(labels::PORT)
                .and_then(|v| v.parse::<u16>().ok())
                .or_else(|| port_proxy::port_of_proxy(&self.config().instance, &owner, &p.name));
            let sandbox = self
                .registry()
                .get(&owner)
                .filter(|_| adopted.contains(&owner));
            match (sandbox, port, p.published.first()) {
                // A running proxy keeps its host port: adopt it. Its port was
                // allowed, also if only a reconnect added it (labels are
                // written once, at create).
                (Some(s), Some(port), Some((_, host))) if p.running => {
                    let _ = s.allow_ports(&BTreeSet::from([port]), usize::MAX);
                    s.set_published(port, Some(*host));
                    tracing::info!(sandbox_id = %owner, port, host_port = host, "proxy rehydrated");
                }
                // A stopped one lost its host port; the next GET makes a new one.
                (Some(s), Some(port), _) => {
                    let _ = s.allow_ports(&BTreeSet::from([port]), usize::MAX);
                    self.engine().remove_container(&p.name).await?;
                }
                // A spare no port took before the restart: the first port
                // makes its own proxy.
                (Some(_), None, _) => {
                    tracing::info!(container = %p.name, sandbox_id = %owner, "removing an unused spare port proxy");
                    self.engine().remove_container(&p.name).await?;
                }
                _ => {
                    tracing::info!(container = %p.name, sandbox_id = %owner, "removing proxy of a sandbox that is gone");
                    self.engine().remove_container(&p.name).await?;
                }
            }
        }
        Ok(())
    }

    /// Egress proxies: one of another agent version or of a sandbox that
    /// is gone goes.
    async fn reconcile_egresses(
        &self,
        egresses: Vec<ContainerRecord>,
        adopted: &BTreeSet<String>,
    ) -> EngineResult<()> {
        for e in egresses {
            let owner = e.labels.get(labels::SANDBOX_ID);
            let current = e.labels.get(labels::AGENT).map(String::as_str)
                == Some(super::agent_delivery::AGENT_VERSION);
            if !current || owner.is_some_and(|o| !adopted.contains(o)) {
                tracing::info!(container = %e.name, "removing an egress proxy of another agent or of a sandbox that is gone");
                self.engine().remove_container(&e.name).await?;
            }
        }
        Ok(())
    }

    /// Link networks: kept for adopted sandboxes, removed otherwise (their
    /// sandbox may have vanished while sandboxd was down).
    async fn reconcile_link_networks(
        &self,
        mine: &[(&str, &str)],
        adopted: &BTreeSet<String>,
    ) -> EngineResult<()> {
        for n in self.engine().list_networks(mine).await? {
            if !labels::is_link_network(&n.labels) {
                continue;
            }
            let owner = n
                .labels
                .get(labels::SANDBOX_ID)
                .cloned()
                .unwrap_or_default();
            match self
                .registry()
                .get(&owner)
                .filter(|_| adopted.contains(&owner))
            {
                Some(s) => {
                    if let Some(subnet) = n.subnets.first() {
                        s.set_linked(subnet.clone());
                    }
                }
                None => {
                    tracing::info!(network = %n.name, sandbox_id = %owner, "removing link network of a sandbox that is gone");
                    if let Err(e) = self.detach_shared_egress(&n.name).await {
                        tracing::warn!(network = %n.name, error = %e, "could not detach the shared egress proxy");
                    }
                    self.engine().remove_network(&n.name).await?;
                }
            }
        }
        Ok(())
    }

    /// Every sandbox behind an egress proxy gets its way out (the shared
    /// proxy is made again if missing, and joined to each).
    async fn restore_ways_out(&self) {
        for s in self.registry().list() {
            let Some(subnet) = s.ports().link_subnet.filter(|_| s.network.through_egress()) else {
                continue;
            };
            if let Err(e) = self
                .attach_egress(&s.id, s.network, &s.allow, &subnet)
                .await
            {
                tracing::warn!(sandbox_id = %s.id, error = %e, "could not give the sandbox its egress proxy back; its connections out fail until it is restarted");
            }
        }
    }

    /// Volumes of this instance without an adopted sandbox go (the
    /// agent's volumes are kept; see `remove_stale_agent_volumes`).
    async fn remove_orphan_volumes(
        &self,
        mine: &[(&str, &str)],
        adopted: &BTreeSet<String>,
    ) -> EngineResult<()> {
        for v in self.engine().list_volumes(mine).await? {
            if v.labels.contains_key(labels::AGENT) {
                continue;
            }
            let owner = v
                .labels
                .get(labels::SANDBOX_ID)
                .cloned()
                .unwrap_or_default();
            if !adopted.contains(&owner) {
                tracing::info!(volume = %v.name, sandbox_id = %owner, "removing volume without a sandbox");
                self.engine().remove_volume(&v.name).await?;
            }
        }
        Ok(())
    }
}

/// This instance's containers, by their role label.
#[derive(Default)]
struct ByRole {
    sandboxes: Vec<ContainerRecord>,
    proxies: Vec<ContainerRecord>,
    egresses: Vec<ContainerRecord>,
}

/// The labels of each claim volume, by the id of the sandbox it claims.
type Claims = HashMap<String, HashMap<String, String>>;
