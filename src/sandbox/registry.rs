//! The in-memory registry: sandboxes by id and by session key, the per-key
//! create lock, and recency for capacity eviction. Pure bookkeeping with no
//! engine calls, so every rule here is unit-tested.
//!
//! Locking: the dashmaps are never held across `.await` (lookups clone the
//! `Arc` out). `occupancy` is a std mutex taken only for short, synchronous
//! sections. The per-key lock is a tokio mutex held across engine calls on
//! purpose: it is what makes concurrent creates for one key yield one sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dashmap::DashMap;
use lru::LruCache;

use super::labels::SandboxRecord;
use super::lifetime::Lifetime;
use super::metadata::Metadata;
use super::spec::{NetworkMode, Resources};
use crate::agent_client::AgentConn;
use crate::clock::now_ms;
use crate::engine::ExecSession;

/// Locks one of the registry's std mutexes, each held only for a short
/// synchronous section that cannot leave its data half-changed (one
/// insert, remove or promote). So a lock poisoned by a panic elsewhere is
/// taken over, and the panic is reported rather than swallowed.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| {
        tracing::error!("a registry lock was poisoned by a panic; carrying on with its data");
        poisoned.into_inner()
    })
}

/// One live sandbox. Immutable facts are plain fields; what changes while it
/// lives is atomic or behind a short std mutex.
#[derive(Debug)]
pub struct Sandbox {
    pub id: String,
    pub session_key: String,
    pub runtime: String,
    pub created_at: u64,
    pub resources: Resources,
    pub network: NetworkMode,
    /// Mode `allowlist`: what the request allowed.
    pub allow: Vec<String>,
    /// What its creator gave it; fixed at create (it is in the labels).
    pub metadata: Metadata,
    /// Its processes' variables; fixed at create (it is in the labels).
    pub env: super::environment::Environment,
    /// Engine name of the container.
    pub container: String,
    /// Engine name of the workspace volume.
    pub volume: String,
    idle_ttl_ms: AtomicU64,
    last_used_at: AtomicU64,
    /// An end time that replaces the idle TTL (see `lifetime`).
    lifetime: Mutex<Option<Lifetime>>,
    ports: Mutex<PortState>,
    running_commands: AtomicUsize,
    open_requests: AtomicUsize,
    /// Its processes are frozen (see `pause`).
    paused: AtomicBool,
    stops: AtomicStops,
    /// The connection to its agent, once made (see `agent_link`).
    agent: Mutex<Option<Arc<AgentConn>>>,
    /// Held while a connection to the agent is being made.
    pub(super) agent_connect: tokio::sync::Mutex<()>,
    /// The agent's own stdio, attached when this sandboxd started the
    /// container and not yet made a connection (see `agent_link`).
    stdio: Mutex<Option<ExecSession>>,
}

/// How often the container stopped under its commands, by whose hand.
/// Commands compare these with what they saw at their start to tell a
/// sandbox that died (and maybe came back) from one sandboxd stopped.
#[derive(Debug, Default)]
struct AtomicStops {
    /// sandboxd found the container stopped and started it again.
    unexpected: AtomicU64,
    /// Of those, the times the engine said its memory limit had stopped it
    /// (a gVisor sandbox's kernel goes with its memory).
    out_of_memory: AtomicU64,
    /// sandboxd stopped, restarted or removed it.
    planned: AtomicU64,
}

/// A snapshot of [`Sandbox::stops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stops {
    pub unexpected: u64,
    pub out_of_memory: u64,
    pub planned: u64,
}

/// Allowed and published ports of one sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortState {
    pub allowed: BTreeSet<u16>,
    /// Sandbox port -> host port.
    pub published: BTreeMap<u16, u16>,
    /// The subnet of the link network the sandbox is attached to (see
    /// `ports`), once it is.
    pub link_subnet: Option<String>,
}

impl Sandbox {
    /// A sandbox from its label record; engine names derive from the id.
    pub fn from_record(instance: &str, r: &SandboxRecord, last_used_at: u64) -> Sandbox {
        Sandbox {
            id: r.id.clone(),
            session_key: r.session_key.clone(),
            runtime: r.runtime.clone(),
            created_at: r.created_at,
            resources: r.resources,
            network: r.network,
            allow: r.allow.clone(),
            metadata: r.metadata.clone(),
            env: r.env.clone(),
            container: container_name(instance, &r.id),
            volume: volume_name(instance, &r.id),
            idle_ttl_ms: AtomicU64::new(r.idle_ttl_ms),
            last_used_at: AtomicU64::new(last_used_at),
            lifetime: Mutex::new(None),
            ports: Mutex::new(PortState {
                allowed: r.ports.clone(),
                published: BTreeMap::new(),
                link_subnet: None,
            }),
            running_commands: AtomicUsize::new(0),
            open_requests: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            stops: AtomicStops::default(),
            agent: Mutex::new(None),
            agent_connect: tokio::sync::Mutex::new(()),
            stdio: Mutex::new(None),
        }
    }

    pub(super) fn set_stdio(&self, session: ExecSession) {
        *lock(&self.stdio) = Some(session);
    }

    /// The attached stdio of the agent, once: a connection made of it that
    /// fails is not made again (the agent has let it go).
    pub(super) fn take_stdio(&self) -> Option<ExecSession> {
        lock(&self.stdio).take()
    }

    /// The connection to the agent, if one is open.
    pub fn live_agent(&self) -> Option<Arc<AgentConn>> {
        lock(&self.agent)
            .as_ref()
            .filter(|c| c.closed_because().is_none())
            .cloned()
    }

    pub(super) fn set_agent(&self, conn: Option<Arc<AgentConn>>) {
        *lock(&self.agent) = conn;
    }

    pub fn stops(&self) -> Stops {
        Stops {
            unexpected: self.stops.unexpected.load(Ordering::Acquire),
            out_of_memory: self.stops.out_of_memory.load(Ordering::Acquire),
            planned: self.stops.planned.load(Ordering::Acquire),
        }
    }

    /// The container was found stopped (by its memory limit when
    /// `out_of_memory`) and is being started again.
    pub fn note_unexpected_stop(&self, out_of_memory: bool) {
        if out_of_memory {
            self.stops.out_of_memory.fetch_add(1, Ordering::AcqRel);
        }
        self.stops.unexpected.fetch_add(1, Ordering::AcqRel);
    }

    /// sandboxd is about to stop, restart or remove the container.
    pub fn note_planned_stop(&self) {
        self.stops.planned.fetch_add(1, Ordering::AcqRel);
    }

    pub fn idle_ttl_ms(&self) -> u64 {
        self.idle_ttl_ms.load(Ordering::Relaxed)
    }

    pub fn set_idle_ttl_ms(&self, ms: u64) {
        self.idle_ttl_ms.store(ms, Ordering::Relaxed);
    }

    pub fn last_used_at(&self) -> u64 {
        self.last_used_at.load(Ordering::Relaxed)
    }

    /// When it ends if nothing changes: its lifetime's end time, else its
    /// last use plus its idle TTL.
    pub fn expires_at(&self) -> u64 {
        match self.lifetime() {
            Some(l) => l.ends_at,
            None => self.last_used_at().saturating_add(self.idle_ttl_ms()),
        }
    }

    pub fn lifetime(&self) -> Option<Lifetime> {
        *lock(&self.lifetime)
    }

    pub(super) fn set_lifetime(&self, lifetime: Option<Lifetime>) {
        *lock(&self.lifetime) = lifetime;
    }

    /// Whether the reaper ends it at `now`: a lifetime's end time has come
    /// and it is not paused (busy or not), or it has no lifetime and has
    /// been idle for its TTL.
    pub fn is_due(&self, now: u64) -> bool {
        match self.lifetime() {
            Some(l) => !self.is_paused() && now >= l.ends_at,
            None => !self.is_busy() && now >= self.expires_at(),
        }
    }

    pub fn ports(&self) -> PortState {
        lock(&self.ports).clone()
    }

    /// Adds ports to the allowlist unless that would pass `max`; returns the
    /// resulting allowlist, or the size it would have had.
    pub fn allow_ports(&self, add: &BTreeSet<u16>, max: usize) -> Result<BTreeSet<u16>, usize> {
        let mut ports = lock(&self.ports);
        let union: BTreeSet<u16> = ports.allowed.union(add).copied().collect();
        if union.len() > max {
            return Err(union.len());
        }
        ports.allowed = union.clone();
        Ok(union)
    }

    /// Records a published port (`host` = None forgets it).
    pub fn set_published(&self, port: u16, host: Option<u16>) {
        let mut p = lock(&self.ports);
        match host {
            Some(h) => p.published.insert(port, h),
            None => p.published.remove(&port),
        };
    }

    /// Records that the sandbox is attached to its link network.
    pub fn set_linked(&self, subnet: String) {
        lock(&self.ports).link_subnet = Some(subnet);
    }

    pub fn running_commands(&self) -> usize {
        self.running_commands.load(Ordering::Relaxed)
    }

    /// A sandbox is busy while a command runs or a request (a log stream, a
    /// wait) is open on it, and while it is paused: it neither expires nor
    /// is evicted then.
    pub fn is_busy(&self) -> bool {
        self.running_commands() > 0
            || self.open_requests.load(Ordering::Relaxed) > 0
            || self.is_paused()
    }

    /// Whether a create at capacity may remove it: not while busy, and
    /// not before an end time it was given (E2B's `timeout`): its owner
    /// was told it lives until then.
    pub fn is_evictable(&self) -> bool {
        !self.is_busy() && self.lifetime().is_none()
    }

    /// Whether its processes are frozen (see `pause`).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    pub(super) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }

    /// Marks a request as open until the guard drops.
    pub fn open_request(self: &Arc<Self>) -> OpenRequest {
        self.open_requests.fetch_add(1, Ordering::Relaxed);
        OpenRequest(Arc::clone(self))
    }

    /// Counts a command as running until the guard drops, unless `max`
    /// already run (checked and counted in one step, so racing starts
    /// cannot pass the limit together).
    pub fn command_started(self: &Arc<Self>, max: usize) -> Option<RunningCommand> {
        self.running_commands
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| RunningCommand(Arc::clone(self)))
    }

    /// The facts the labels carry.
    pub fn record(&self) -> SandboxRecord {
        SandboxRecord {
            id: self.id.clone(),
            session_key: self.session_key.clone(),
            runtime: self.runtime.clone(),
            created_at: self.created_at,
            idle_ttl_ms: self.idle_ttl_ms(),
            resources: self.resources,
            network: self.network,
            allow: self.allow.clone(),
            ports: self.ports().allowed,
            metadata: self.metadata.clone(),
            env: self.env.clone(),
        }
    }
}

/// Keeps a sandbox busy while alive; see [`Sandbox::open_request`].
#[derive(Debug)]
pub struct OpenRequest(Arc<Sandbox>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.open_requests.fetch_sub(1, Ordering::Relaxed);
        self.0.last_used_at.store(now_ms(), Ordering::Relaxed);
    }
}

/// Keeps a sandbox busy while a command runs; see [`Sandbox::command_started`].
#[derive(Debug)]
pub struct RunningCommand(Arc<Sandbox>);

impl Drop for RunningCommand {
    fn drop(&mut self) {
        self.0.running_commands.fetch_sub(1, Ordering::Relaxed);
        self.0.last_used_at.store(now_ms(), Ordering::Relaxed);
    }
}

/// Engine name of a sandbox's container.
pub fn container_name(instance: &str, id: &str) -> String {
    format!("{instance}-{id}")
}

/// Engine name of a sandbox's workspace volume.
pub fn volume_name(instance: &str, id: &str) -> String {
    format!("{instance}-{id}-workspace")
}

/// Engine name of the volume that records who claimed a pool member (see
/// `labels::encode_claim`).
pub fn claim_volume_name(instance: &str, id: &str) -> String {
    format!("{instance}-{id}-claim")
}

/// A fresh sandbox id: 96 random bits as 24 lowercase hex digits.
pub fn new_sandbox_id() -> Result<String, crate::id::RandomUnavailable> {
    crate::id::random_hex(12)
}

/// True for strings [`new_sandbox_id`] could have made.
pub fn is_sandbox_id(s: &str) -> bool {
    crate::id::is_hex_id(s, 24)
}

#[derive(Debug)]
struct Occupancy {
    /// Creates in flight that hold a slot but are not registered yet.
    reserved: usize,
    /// Every registered sandbox, most recently used first.
    recency: LruCache<String, Arc<Sandbox>>,
}

/// No slot free: every registered sandbox busy, and the other slots held by
/// creates still under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtCapacity {
    pub max: usize,
    /// Slots held by creates in flight (not registered yet).
    pub creating: usize,
}

/// See the module docs.
#[derive(Debug)]
pub struct SandboxRegistry {
    max: usize,
    by_id: DashMap<String, Arc<Sandbox>>,
    by_key: DashMap<String, String>,
    create_locks: DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    occupancy: Mutex<Occupancy>,
}

/// A capacity slot held by a create in flight; released on drop unless the
/// sandbox was registered with it.
#[derive(Debug)]
pub struct Reservation<'a> {
    registry: &'a SandboxRegistry,
    held: bool,
    /// The idle sandbox that was evicted to make room; the caller removes its
    /// engine objects.
    pub evicted: Option<Arc<Sandbox>>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.held {
            let mut occ = lock(&self.registry.occupancy);
            occ.reserved = occ.reserved.saturating_sub(1);
        }
    }
}

/// Holds a session key's create lock; see [`SandboxRegistry::lock_key`].
#[derive(Debug)]
pub struct KeyLock<'a> {
    registry: &'a SandboxRegistry,
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for KeyLock<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Forget the mutex once nobody holds or waits for it. remove_if runs
        // under the shard lock, which is also where waiters clone the Arc, so
        // no waiter can be between "cloned" and "counted".
        self.registry
            .create_locks
            .remove_if(&self.key, |_, m| Arc::strong_count(m) == 1);
    }
}

impl SandboxRegistry {
    pub fn new(max: usize) -> Self {
        SandboxRegistry {
            max,
            by_id: DashMap::new(),
            by_key: DashMap::new(),
            create_locks: DashMap::new(),
            occupancy: Mutex::new(Occupancy {
                reserved: 0,
                recency: LruCache::unbounded(),
            }),
        }
    }

    /// Serialises creates, reconnects and stops of one session key.
    pub async fn lock_key(&self, key: &str) -> KeyLock<'_> {
        let mutex = self
            .create_locks
            .entry(key.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        let guard = mutex.lock_owned().await;
        KeyLock {
            registry: self,
            key: key.to_string(),
            guard: Some(guard),
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.by_id.get(id).map(|s| Arc::clone(&s))
    }

    pub fn by_session(&self, key: &str) -> Option<Arc<Sandbox>> {
        let id = self.by_key.get(key).map(|id| id.clone())?;
        self.get(&id)
    }

    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        let mut all: Vec<Arc<Sandbox>> = self.by_id.iter().map(|s| Arc::clone(&s)).collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        all
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Slots taken: registered sandboxes and creates in flight.
    pub fn occupied(&self) -> usize {
        let occ = lock(&self.occupancy);
        occ.recency.len() + occ.reserved
    }

    /// The most sandboxes alive at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Records a use: refreshes the idle clock and the recency order.
    pub fn touch(&self, sandbox: &Sandbox) {
        sandbox.last_used_at.store(now_ms(), Ordering::Relaxed);
        lock(&self.occupancy).recency.promote(&sandbox.id);
    }

    /// Takes a capacity slot, evicting the least recently used idle sandbox
    /// when all are taken.
    pub fn reserve(&self) -> Result<Reservation<'_>, AtCapacity> {
        let mut occ = lock(&self.occupancy);
        let mut evicted = None;
        if occ.recency.len() + occ.reserved >= self.max {
            let victim = occ
                .recency
                .iter()
                .rev()
                .find(|(_, s)| s.is_evictable())
                .map(|(id, _)| id.clone());
            let Some(victim) = victim else {
                return Err(AtCapacity {
                    max: self.max,
                    creating: occ.reserved,
                });
            };
            if let Some(s) = occ.recency.pop(&victim) {
                self.forget_maps(&s);
                s.note_planned_stop();
                evicted = Some(s);
            }
        }
        occ.reserved += 1;
        Ok(Reservation {
            registry: self,
            held: true,
            evicted,
        })
    }

    /// Registers a sandbox into the slot `reservation` holds.
    pub fn insert(&self, mut reservation: Reservation<'_>, sandbox: Arc<Sandbox>) {
        reservation.held = false;
        {
            let mut occ = lock(&self.occupancy);
            occ.reserved = occ.reserved.saturating_sub(1);
            occ.recency.put(sandbox.id.clone(), Arc::clone(&sandbox));
        }
        self.by_key
            .insert(sandbox.session_key.clone(), sandbox.id.clone());
        self.by_id.insert(sandbox.id.clone(), sandbox);
    }

    /// Registers an adopted sandbox (rehydration), ignoring capacity: adopted
    /// sandboxes already exist in the engine.
    pub fn adopt(&self, sandbox: Arc<Sandbox>) {
        lock(&self.occupancy)
            .recency
            .put(sandbox.id.clone(), Arc::clone(&sandbox));
        self.by_key
            .insert(sandbox.session_key.clone(), sandbox.id.clone());
        self.by_id.insert(sandbox.id.clone(), sandbox);
    }

    /// Forgets a sandbox; returns it if it was registered.
    pub fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        let s = lock(&self.occupancy).recency.pop(id);
        let s = s.or_else(|| self.get(id))?;
        self.forget_maps(&s);
        s.note_planned_stop();
        Some(s)
    }

    fn forget_maps(&self, s: &Sandbox) {
        self.by_id.remove(&s.id);
        self.by_key.remove_if(&s.session_key, |_, id| *id == s.id);
    }

    /// The sandboxes the reaper ends at `now` (see [`Sandbox::is_due`]).
    pub fn expired(&self, now: u64) -> Vec<Arc<Sandbox>> {
        self.list().into_iter().filter(|s| s.is_due(now)).collect()
    }
}

#[cfg(test)]
impl Sandbox {
    fn set_running(&self, n: usize) {
        self.running_commands.store(n, Ordering::Relaxed);
    }
    fn set_last_used(&self, t: u64) {
        self.last_used_at.store(t, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, key: &str) -> Arc<Sandbox> {
        Arc::new(Sandbox::from_record(
            "t",
            &SandboxRecord {
                id: id.into(),
                session_key: key.into(),
                runtime: "default".into(),
                created_at: 1,
                idle_ttl_ms: 10_000,
                resources: Resources {
                    vcpus: 1,
                    memory_mb: 256,
                },
                network: NetworkMode::None,
                allow: Vec::new(),
                ports: BTreeSet::new(),
                metadata: Default::default(),
                env: Default::default(),
            },
            now_ms(),
        ))
    }

    fn add(reg: &SandboxRegistry, id: &str, key: &str) -> Arc<Sandbox> {
        let s = sandbox(id, key);
        let r = reg.reserve().expect("slot");
        assert!(r.evicted.is_none());
        reg.insert(r, Arc::clone(&s));
        s
    }

    #[test]
    fn lookups_by_id_and_key() {
        let reg = SandboxRegistry::new(4);
        add(&reg, "a", "k1");
        assert_eq!(
            reg.by_session("k1").map(|s| s.id.clone()).as_deref(),
            Some("a")
        );
        assert!(reg.get("a").is_some());
        assert!(reg.remove("a").is_some());
        assert!(reg.by_session("k1").is_none());
        assert!(reg.remove("a").is_none());
    }

    #[test]
    fn eviction_takes_least_recent_idle_one() {
        let reg = SandboxRegistry::new(2);
        let a = add(&reg, "a", "ka");
        let b = add(&reg, "b", "kb");
        reg.touch(&a); // b is now least recently used
        let r = reg.reserve().expect("evicts b");
        assert_eq!(r.evicted.as_ref().map(|s| s.id.as_str()), Some("b"));
        assert!(reg.get("b").is_none());
        drop(r);
        drop(b);
        // The slot came back when the reservation was dropped unused.
        let r = reg.reserve().expect("free slot");
        assert!(r.evicted.is_none());
    }

    #[test]
    fn busy_sandboxes_are_never_evicted() {
        let reg = SandboxRegistry::new(2);
        let a = add(&reg, "a", "ka");
        let b = add(&reg, "b", "kb");
        a.set_running(1);
        let guard = b.open_request();
        assert_eq!(
            reg.reserve().unwrap_err(),
            AtCapacity {
                max: 2,
                creating: 0
            }
        );
        drop(guard);
        let r = reg.reserve().expect("b is idle now");
        assert_eq!(r.evicted.as_ref().map(|s| s.id.as_str()), Some("b"));
    }

    #[test]
    fn reservations_count_against_capacity() {
        let reg = SandboxRegistry::new(1);
        let r1 = reg.reserve().expect("slot");
        assert!(reg.reserve().is_err());
        drop(r1);
        assert!(reg.reserve().is_ok());
    }

    #[test]
    fn expiry_skips_busy_and_fresh() {
        let reg = SandboxRegistry::new(4);
        let a = add(&reg, "a", "ka");
        let b = add(&reg, "b", "kb");
        let c = add(&reg, "c", "kc");
        a.set_last_used(0);
        b.set_last_used(0);
        b.set_running(1);
        c.set_last_used(now_ms());
        let ids: Vec<String> = reg.expired(now_ms()).iter().map(|s| s.id.clone()).collect();
        assert_eq!(ids, ["a"]);
    }

    #[test]
    fn ports_are_capped() {
        let s = sandbox("a", "k");
        assert_eq!(
            s.allow_ports(&BTreeSet::from([1, 2]), 3),
            Ok(BTreeSet::from([1, 2]))
        );
        assert_eq!(
            s.allow_ports(&BTreeSet::from([2, 3]), 3),
            Ok(BTreeSet::from([1, 2, 3]))
        );
        assert_eq!(s.allow_ports(&BTreeSet::from([4]), 3), Err(4));
        assert_eq!(s.ports().allowed, BTreeSet::from([1, 2, 3]));
    }

    #[test]
    fn ids_are_url_safe_and_distinct() {
        let a = new_sandbox_id().expect("random");
        let b = new_sandbox_id().expect("random");
        assert!(is_sandbox_id(&a) && is_sandbox_id(&b));
        assert_ne!(a, b);
        assert!(!is_sandbox_id("../etc"));
    }

    #[tokio::test]
    async fn key_lock_serialises_and_is_forgotten() {
        let reg = SandboxRegistry::new(1);
        let g = reg.lock_key("k").await;
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), reg.lock_key("k"))
                .await
                .is_err(),
            "second holder must wait"
        );
        let other = reg.lock_key("other").await;
        drop(other);
        drop(g);
        assert!(reg.create_locks.is_empty());
        let _again = reg.lock_key("k").await;
    }
}
