//! The warm pool: for each runtime with a `pool_size`, sandboxes made and
//! started before anyone asks (hardened like every sandbox, their agent
//! connected, their workspace empty) that belong to no session yet. A
//! create for a new session key that a member can serve claims it instead
//! of making a container; the answer is the same either way.
//!
//! A member serves a request of its image and OCI runtime (any runtime name
//! that maps to both), network mode and allowlist;
//! other CPU and memory are set on the running container (not under
//! gVisor, whose runsc cannot change them: such requests are made cold).
//! Whose a claimed member is goes on a claim volume before the create
//! answers (see `labels`); a member is handed out once and removed by its
//! session's stop like any sandbox.
//!
//! Members live in the room sessions leave: the pool fills only while
//! sessions and members together stay under `max_concurrent`, and a cold
//! create that finds no room removes a member before it evicts a session.
//! The pool fills one member at a time and starts none while creates for
//! new sessions run, so a burst of creates does not compete with its
//! refill. Every
//! [`KEEP_WARM`] each member's agent is asked for its commands (a member
//! whose agent does not answer is replaced) and members of a runtime whose
//! image was rebuilt are replaced.
//!
//! [`Pool`] is the bookkeeping (unit-tested); the engine work is in the
//! `Sandboxes` methods below, run by [`run_pool`] from `main`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::labels::{self, SandboxRecord};
use super::registry::{self, Sandbox};
use super::spec::{NetworkMode, Resources, SandboxSpec};
use super::{SandboxError, SandboxResult, Sandboxes};
use crate::agent_client::AgentError;
use crate::clock::now_ms;

/// How often members are checked: their agent asked, their image compared.
const KEEP_WARM: Duration = Duration::from_secs(10);

/// How long a runtime whose member could not be made waits before the next
/// try.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// How long a member's agent may take to answer the keep-warm call.
const KEEP_WARM_LIMIT: Duration = Duration::from_secs(5);

/// A started sandbox that no session has claimed.
#[derive(Debug)]
pub(super) struct Member {
    pub(super) sandbox: Arc<Sandbox>,
    /// The image it was made from (`sha256:…`).
    image_id: String,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Pool {
    state: Mutex<PoolState>,
    /// Something changed that may let the pool fill (a claim, a stop, the
    /// end of a cold create).
    wake: Notify,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Oldest first.
    members: Vec<Member>,
    /// A member being made (the pool makes one at a time).
    filling: bool,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Every section under this lock is a push, a remove or a count:
        // nothing a panic could leave half-done.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Members and the one being made: the room the pool takes.
    fn room_taken(&self) -> usize {
        let st = self.lock();
        st.members.len() + usize::from(st.filling)
    }

    /// Members ready, by runtime.
    fn sizes(&self) -> BTreeMap<String, usize> {
        let mut sizes = BTreeMap::new();
        for m in &self.lock().members {
            *sizes.entry(m.sandbox.runtime.clone()).or_insert(0) += 1;
        }
        sizes
    }

    /// Every member.
    pub(super) fn sandboxes(&self) -> Vec<Arc<Sandbox>> {
        let st = self.lock();
        st.members.iter().map(|m| Arc::clone(&m.sandbox)).collect()
    }

    /// Whether the member `id` is still unclaimed.
    pub(super) fn holds(&self, id: &str) -> bool {
        self.lock().members.iter().any(|m| m.sandbox.id == id)
    }

    /// Takes the oldest member that `fits`.
    pub(super) fn take(&self, fits: impl Fn(&Sandbox) -> bool) -> Option<Member> {
        let mut st = self.lock();
        let i = st.members.iter().position(|m| fits(&m.sandbox))?;
        Some(st.members.remove(i))
    }

    /// Takes every member `stale` says goes.
    fn take_all(&self, stale: impl Fn(&Member) -> bool) -> Vec<Member> {
        let mut st = self.lock();
        let (gone, kept) = std::mem::take(&mut st.members)
            .into_iter()
            .partition(|m| stale(m));
        st.members = kept;
        gone
    }

    /// Starts making a member of `runtime` if it has fewer than `target`,
    /// nothing else is being made, and `room` (slots left besides the
    /// pool's) takes one more.
    fn start_fill(&self, runtime: &str, target: usize, room: usize) -> bool {
        let mut st = self.lock();
        let have = st
            .members
            .iter()
            .filter(|m| m.sandbox.runtime == runtime)
            .count();
        if st.filling || have >= target || st.members.len() >= room {
            return false;
        }
        st.filling = true;
        true
    }

    /// Ends a fill; a made member joins unless `room` has shrunk under the
    /// pool meanwhile, in which case it is handed back for removal.
    fn end_fill(&self, made: Option<Member>, room: usize) -> Option<Member> {
        let mut st = self.lock();
        st.filling = false;
        let m = made?;
        if st.members.len() < room {
            st.members.push(m);
            None
        } else {
            Some(m)
        }
    }

    /// Lets the pool look again.
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }
}

/// Fills and keeps the pool until `shutdown`. Starts once rehydration is
/// done. Members are left running at shutdown: the next start removes the
/// unclaimed ones (see `rehydrate`).
pub async fn run_pool(sandboxes: Arc<Sandboxes>, shutdown: CancellationToken) {
    let mut ready = sandboxes.ready.subscribe();
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = ready.wait_for(|r| *r) => {}
    }
    let mut tick = tokio::time::interval(KEEP_WARM);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sandboxes.fill(&mut failed) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sandboxes.pool.wake.notified() => {}
            // A create ended: the pool may fill now.
            _ = sandboxes.foreground.changed() => {}
            _ = tick.tick() => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = sandboxes.keep_warm() => {}
                }
            }
        }
    }
}

impl Sandboxes {
    /// Members ready, by runtime (every runtime with a pool, also empty).
    pub fn pool_sizes(&self) -> BTreeMap<String, usize> {
        let mut sizes = self.pool.sizes();
        for name in self.config.runtimes.keys() {
            if self.config.pool_size(name) > 0 {
                sizes.entry(name.clone()).or_insert(0);
            }
        }
        sizes
    }

    /// Slots the pool may take: what sessions leave of `max_concurrent`.
    fn pool_room(&self) -> usize {
        self.registry.max().saturating_sub(self.registry.occupied())
    }

    /// A cold create is about to take a slot: while sessions and members
    /// together pass `max_concurrent`, members make room.
    pub(super) async fn make_room_for_session(&self) {
        while self.registry.occupied() + self.pool.room_taken() > self.registry.max() {
            let Some(m) = self.pool.take(|_| true) else {
                // Only a member in the making: it is removed when done.
                return;
            };
            tracing::info!(sandbox_id = %m.sandbox.id, "removing a pool member to make room for a session");
            self.remove_member(&m.sandbox.id, "made room for a session")
                .await;
        }
    }

    /// Claims a member for `spec` if one can serve it: the same image and
    /// OCI runtime (so the built-in runtimes, which share both, share
    /// members), network mode and allowlist; other CPU and memory are set on the
    /// running container where the OCI runtime allows. A member that cannot
    /// be claimed after all is removed, and `None` sends the create down
    /// the cold path.
    pub(super) async fn claim(&self, spec: &SandboxSpec) -> Option<Arc<Sandbox>> {
        let updatable = !self.engine.is_gvisor(spec.oci_runtime.as_deref()).await;
        let wanted = Some((spec.image.clone(), spec.oci_runtime.clone()));
        let member = self.pool.take(|m| {
            self.config.runtime(&m.runtime) == wanted
                && m.network == spec.network
                && m.allow == spec.allow
                && (m.resources == spec.resources || updatable)
        })?;
        self.pool.wake();
        match self.claim_member(&member.sandbox, spec).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(sandbox_id = %member.sandbox.id, error = %e, "a pool member could not be claimed; removing it and making a sandbox");
                self.remove_member(&member.sandbox.id, "its claim failed")
                    .await;
                None
            }
        }
    }

    async fn claim_member(&self, m: &Sandbox, spec: &SandboxSpec) -> SandboxResult<Arc<Sandbox>> {
        if m.resources != spec.resources {
            self.engine
                .update_resources(&m.container, spec.resources.vcpus, spec.resources.memory_mb)
                .await?;
        }
        let record = SandboxRecord {
            id: m.id.clone(),
            session_key: spec.session_key.clone(),
            runtime: spec.runtime.clone(),
            created_at: now_ms(),
            idle_ttl_ms: spec.idle_ttl_ms.unwrap_or(m.idle_ttl_ms()),
            resources: spec.resources,
            network: m.network,
            allow: m.allow.clone(),
            ports: spec.ports.clone(),
        };
        let instance = &self.config.instance;
        self.engine
            .create_volume(
                &registry::claim_volume_name(instance, &m.id),
                0,
                labels::encode_claim(instance, &record),
            )
            .await?;
        let s = Sandbox::from_record(instance, &record, now_ms());
        if let Some(subnet) = m.ports().link_subnet {
            s.set_linked(subnet);
        }
        // The agent was told the member's memory (its output budget
        // follows it); with other memory the session connects anew.
        if m.resources == spec.resources {
            s.set_agent(m.live_agent());
        }
        Ok(Arc::new(s))
    }

    /// Makes members until every runtime has its `pool_size`, room allows
    /// and no cold create runs. A runtime whose member could not be made
    /// waits [`RETRY_AFTER`].
    async fn fill(&self, failed: &mut HashMap<String, Instant>) {
        let runtimes: Vec<(String, usize)> = self
            .config
            .runtimes
            .keys()
            .map(|name| (name.clone(), self.config.pool_size(name)))
            .filter(|(_, n)| *n > 0)
            .collect();
        for (runtime, target) in runtimes {
            if failed
                .get(&runtime)
                .is_some_and(|at| at.elapsed() < RETRY_AFTER)
            {
                continue;
            }
            while !self.foreground.is_busy()
                && self.pool.start_fill(&runtime, target, self.pool_room())
            {
                let started = Instant::now();
                let made = self.make_member(&runtime).await;
                let made = match made {
                    Ok(m) => {
                        failed.remove(&runtime);
                        crate::telemetry::pool_filled(started);
                        Some(m)
                    }
                    Err(e) => {
                        tracing::warn!(runtime, error = %e, "could not make a pool member; trying again in {} s", RETRY_AFTER.as_secs());
                        failed.insert(runtime.clone(), Instant::now());
                        None
                    }
                };
                let failed_now = made.is_none();
                if let Some(surplus) = self.pool.end_fill(made, self.pool_room()) {
                    self.remove_member(&surplus.sandbox.id, "sessions took its room")
                        .await;
                }
                if failed_now {
                    break;
                }
            }
        }
    }

    /// A member of `runtime`: the default resources and network mode, no
    /// ports, its agent connected.
    async fn make_member(&self, runtime: &str) -> SandboxResult<Member> {
        let (image, oci_runtime) = self.config.runtime(runtime).ok_or_else(|| {
            SandboxError::EngineUnavailable(format!("runtime {runtime:?} is not configured"))
        })?;
        let network = NetworkMode::parse(&self.config.network_default).unwrap_or(NetworkMode::None);
        let resources = Resources {
            vcpus: self.config.default_vcpus,
            memory_mb: self.config.default_memory_mb,
        };
        let spec = SandboxSpec {
            session_key: String::new(),
            runtime: runtime.to_string(),
            image,
            oci_runtime,
            idle_ttl_ms: None,
            resources,
            network,
            allow: Vec::new(),
            ports: Default::default(),
        };
        let record = SandboxRecord {
            id: registry::new_sandbox_id()?,
            session_key: String::new(),
            runtime: runtime.to_string(),
            created_at: now_ms(),
            idle_ttl_ms: u64::try_from(self.config.default_idle_ttl.as_millis())
                .unwrap_or(u64::MAX),
            resources,
            network,
            allow: Vec::new(),
            ports: Default::default(),
        };
        let sandbox = Arc::new(Sandbox::from_record(
            &self.config.instance,
            &record,
            now_ms(),
        ));
        let labels = labels::encode_member(&self.config.instance, &record);
        let made = async {
            self.launch(&sandbox, &spec, labels, None).await?;
            self.agent(&sandbox).await?;
            self.make_spare_proxy(&sandbox.id, network).await;
            let status = self.engine.container_status(&sandbox.container).await?;
            status
                .map(|s| s.image_id)
                .ok_or_else(|| SandboxError::NotFound(sandbox.id.clone()))
        };
        match made.await {
            Ok(image_id) => {
                tracing::info!(sandbox_id = %sandbox.id, runtime, "pool member ready");
                Ok(Member { sandbox, image_id })
            }
            Err(e) => {
                self.remove_member(&sandbox.id, "it could not be made")
                    .await;
                Err(e)
            }
        }
    }

    /// Asks every member's agent for its commands, which keeps it warm and
    /// shows it alive, and replaces members whose agent does not answer or
    /// whose runtime image was rebuilt since.
    async fn keep_warm(&self) {
        let mut current: HashMap<String, Option<String>> = HashMap::new();
        for name in self.pool.sizes().into_keys() {
            let id = match self.config.runtime(&name) {
                Some((image, _)) => self.engine.image_id(&image).await.ok().flatten(),
                None => None,
            };
            current.insert(name, id);
        }
        let stale = self.pool.take_all(|m| {
            current
                .get(&m.sandbox.runtime)
                .is_some_and(|id| id.as_deref() != Some(m.image_id.as_str()))
        });
        for m in stale {
            self.remove_member(&m.sandbox.id, "its runtime image was rebuilt")
                .await;
        }
        for s in self.pool.sandboxes() {
            let answered = match s.live_agent() {
                // An answer of the wrong kind is an answer all the same:
                // the agent is alive.
                Some(conn) => matches!(
                    conn.list(KEEP_WARM_LIMIT).await,
                    Ok(_) | Err(AgentError::Unexpected(_))
                ),
                None => self.agent(&s).await.is_ok(),
            };
            if !answered && let Some(m) = self.pool.take(|c| c.id == s.id) {
                self.remove_member(&m.sandbox.id, "its agent stopped answering")
                    .await;
            }
        }
        self.pool.wake();
    }

    /// Removes a member's engine objects, saying why.
    async fn remove_member(&self, id: &str, why: &str) {
        tracing::info!(sandbox_id = %id, why, "pool member removed");
        if let Err(e) = self.remove_objects_checked(id).await {
            tracing::warn!(sandbox_id = %id, error = %e, "could not remove all engine objects of a pool member");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(runtime: &str) -> Member {
        let record = SandboxRecord {
            id: registry::new_sandbox_id().expect("random"),
            session_key: String::new(),
            runtime: runtime.into(),
            created_at: 1,
            idle_ttl_ms: 60_000,
            resources: Resources {
                vcpus: 1,
                memory_mb: 1024,
            },
            network: NetworkMode::Internet,
            allow: Vec::new(),
            ports: Default::default(),
        };
        Member {
            sandbox: Arc::new(Sandbox::from_record("t", &record, 1)),
            image_id: "sha256:a".into(),
        }
    }

    #[test]
    fn fills_one_at_a_time_up_to_the_target_and_the_room() {
        let pool = Pool::default();
        assert!(pool.start_fill("default", 2, 10));
        assert!(!pool.start_fill("default", 2, 10), "one fill at a time");
        assert_eq!(pool.room_taken(), 1, "the member in the making takes room");
        assert!(pool.end_fill(Some(member("default")), 10).is_none());
        assert!(pool.start_fill("default", 2, 10));
        assert!(pool.end_fill(Some(member("default")), 10).is_none());
        assert!(!pool.start_fill("default", 2, 10), "target reached");
        assert!(pool.start_fill("gvisor", 1, 10), "per runtime");
        assert!(pool.end_fill(None, 10).is_none(), "a failed fill ends too");
        assert!(!pool.start_fill("gvisor", 1, 2), "no room left");
        assert_eq!(pool.sizes().get("default"), Some(&2));
    }

    #[test]
    fn a_member_made_after_its_room_went_is_handed_back() {
        let pool = Pool::default();
        assert!(pool.start_fill("default", 2, 1));
        // Sessions took the last slot meanwhile.
        assert!(pool.end_fill(Some(member("default")), 0).is_some());
        assert_eq!(pool.room_taken(), 0);
    }

    #[test]
    fn claims_take_the_oldest_fitting_member_once() {
        let pool = Pool::default();
        for rt in ["default", "gvisor", "default"] {
            assert!(pool.start_fill(rt, 5, 10));
            assert!(pool.end_fill(Some(member(rt)), 10).is_none());
        }
        let first = pool.take(|s| s.runtime == "default").expect("a member");
        let second = pool.take(|s| s.runtime == "default").expect("another");
        assert_ne!(first.sandbox.id, second.sandbox.id);
        assert!(pool.take(|s| s.runtime == "default").is_none());
        assert_eq!(pool.sizes().get("gvisor"), Some(&1));
    }
}
