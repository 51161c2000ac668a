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
//! A create that finds no member ready but one being made that would serve
//! it waits for that member while it is due sooner than a cold create
//! would take ([`sizing::handoff_wait`]); the member is promised to that
//! one create, and a failed fill sends it down the cold path at once.
//!
//! How many members a runtime keeps follows demand ([`sizing`]): its
//! `pool_size` is the floor, `pool_max` and `pool_memory_mb` bound the
//! growth, and members above the target are removed once it falls.
//! Members live in the room sessions leave: the pool fills only while
//! sessions and members together stay under `max_concurrent`, and a cold
//! create that finds no room removes a member before it evicts a session.
//! No fill starts and no member is removed while a create for a new
//! session runs, so a burst does not compete with its refill (see
//! `upkeep`).
//!
//! [`Pool`] is the bookkeeping (unit-tested); the claim is below, the
//! engine work of filling and keeping members in `upkeep`, run by
//! [`run_pool`] from `main`.

mod sizing;
mod upkeep;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use super::labels::{self, SandboxRecord};
use super::registry::{self, Sandbox};
use super::spec::{NetworkMode, Resources, SandboxSpec};
use super::{SandboxResult, Sandboxes};
use crate::clock::now_ms;
use sizing::{Average, Rate, Target};
pub use upkeep::run_pool;

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
    /// Something changed that may let the pool fill or shrink (a claim, a
    /// stop, an arrival, the end of a fill).
    wake: Notify,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Oldest first.
    members: Vec<Member>,
    /// Members being made.
    fills: Vec<Fill>,
    /// The id of the next fill.
    next_fill: u64,
    /// Arrivals of creates a runtime's members could serve.
    arrivals: BTreeMap<String, Rate>,
    /// How long a fill takes.
    refill: Average,
    /// How long a cold create takes.
    cold: Average,
    /// Each runtime's last target, as logged and shown.
    targets: BTreeMap<String, Target>,
}

/// A member being made.
#[derive(Debug)]
struct Fill {
    id: u64,
    runtime: String,
    started: Instant,
    /// The create this member is promised to, if one waits for it.
    promised: Option<oneshot::Sender<Member>>,
    /// Notified when the member is promised: a fill waiting its turn
    /// (see `upkeep`) goes on at once.
    on_promise: Arc<Notify>,
}

/// What a create for a new session gets from the pool.
#[derive(Debug)]
pub(super) enum Claimable {
    /// A member ready now.
    Ready(Member),
    /// A member being made, promised to this create: wait at most `wait`
    /// for it; the sender dropped means its fill failed.
    Promised {
        member: oneshot::Receiver<Member>,
        wait: Duration,
    },
}

/// Members ready and being made, of one runtime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) ready: usize,
    pub(super) filling: usize,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Every section under this lock is a push, a remove, a count or
        // arithmetic: nothing a panic could leave half-done.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Members and the ones being made: the room the pool takes.
    fn room_taken(&self) -> usize {
        let st = self.lock();
        st.members.len() + st.fills.len()
    }

    /// Members ready and being made, by runtime.
    fn counts(&self) -> BTreeMap<String, Counts> {
        let st = self.lock();
        let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
        for m in &st.members {
            counts.entry(m.sandbox.runtime.clone()).or_default().ready += 1;
        }
        for f in &st.fills {
            counts.entry(f.runtime.clone()).or_default().filling += 1;
        }
        counts
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

    /// Takes the oldest member that `fits`, or else promises the oldest
    /// unpromised fill of a runtime `fill_fits` says serves, if it is worth
    /// waiting for (at `now`). One lock for both: a member that joins in
    /// between is not missed.
    pub(super) fn take_or_promise(
        &self,
        fits: impl Fn(&Sandbox) -> bool,
        fill_fits: impl Fn(&str) -> bool,
        now: Instant,
    ) -> Option<Claimable> {
        let mut st = self.lock();
        if let Some(i) = st.members.iter().position(|m| fits(&m.sandbox)) {
            return Some(Claimable::Ready(st.members.remove(i)));
        }
        let (refill, cold) = (st.refill.mean(), st.cold.mean());
        let (fill, wait) = st.fills.iter_mut().find_map(|f| {
            let elapsed = now.saturating_duration_since(f.started);
            let wait = sizing::handoff_wait(refill, cold, elapsed)?;
            (f.promised.is_none() && fill_fits(&f.runtime)).then_some((f, wait))
        })?;
        let (tx, rx) = oneshot::channel();
        fill.promised = Some(tx);
        fill.on_promise.notify_one();
        Some(Claimable::Promised { member: rx, wait })
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

    /// Takes the oldest member of `runtime` while it has more than
    /// `target` ready (members being made are removed once made, if
    /// still too many: a claim may want them).
    fn take_surplus(&self, runtime: &str, target: usize) -> Option<Member> {
        let mut st = self.lock();
        let ready = st.members.iter().filter(|m| m.sandbox.runtime == runtime);
        if ready.count() <= target {
            return None;
        }
        let i = st
            .members
            .iter()
            .position(|m| m.sandbox.runtime == runtime)?;
        Some(st.members.remove(i))
    }

    /// Starts making a member of `runtime` if it has fewer than `target`
    /// ready and being made, fewer than [`sizing::MAX_FILLS`] are being
    /// made, and `room` (slots left besides the pool's) takes one more.
    /// Returns the fill's id, for [`Pool::end_fill`].
    fn start_fill(&self, runtime: &str, target: usize, room: usize) -> Option<u64> {
        let mut st = self.lock();
        let ready = st
            .members
            .iter()
            .filter(|m| m.sandbox.runtime == runtime)
            .count();
        let filling = st.fills.iter().filter(|f| f.runtime == runtime).count();
        if st.fills.len() >= sizing::MAX_FILLS
            || ready + filling >= target
            || st.members.len() + st.fills.len() >= room
        {
            return None;
        }
        let id = st.next_fill;
        st.next_fill += 1;
        st.fills.push(Fill {
            id,
            runtime: runtime.to_string(),
            started: Instant::now(),
            promised: None,
            on_promise: Arc::new(Notify::new()),
        });
        Some(id)
    }

    /// Whether fill `id`'s member is promised to a create, and what is
    /// notified when it is; `None` once the fill ended.
    fn promise_of(&self, id: u64) -> Option<(bool, Arc<Notify>)> {
        let st = self.lock();
        let fill = st.fills.iter().find(|f| f.id == id)?;
        Some((fill.promised.is_some(), Arc::clone(&fill.on_promise)))
    }

    /// Ends fill `id`. A made member goes to the create it was promised
    /// to if that one still waits, else joins unless `room` has shrunk
    /// under the pool meanwhile, in which case it is handed back for
    /// removal. Without a member (the fill failed), a waiting create is
    /// told at once.
    fn end_fill(&self, id: u64, made: Option<Member>, room: usize) -> Option<Member> {
        let mut st = self.lock();
        let i = st.fills.iter().position(|f| f.id == id)?;
        let fill = st.fills.swap_remove(i);
        let mut m = made?;
        st.refill.record(fill.started.elapsed());
        if let Some(waiting) = fill.promised {
            // A create that gave up waiting left only its closed end.
            m = match waiting.send(m) {
                Ok(()) => return None,
                Err(m) => m,
            };
        }
        if st.members.len() + st.fills.len() < room {
            st.members.push(m);
            None
        } else {
            Some(m)
        }
    }

    /// Counts an arrival for `runtime`'s members at `now`.
    fn arrive(&self, runtime: &str, now: Instant, half_life: Duration) {
        self.lock()
            .arrivals
            .entry(runtime.to_string())
            .or_default()
            .record(now, half_life);
    }

    /// The arrival rate at `now` of each runtime in `runtimes`, and the
    /// average fill.
    fn demand(
        &self,
        runtimes: &[(&str, usize)],
        now: Instant,
        half_life: Duration,
    ) -> (Vec<f64>, Option<Duration>) {
        let st = self.lock();
        let rates = runtimes
            .iter()
            .map(|(rt, _)| st.arrivals.get(*rt).map_or(0.0, |r| r.at(now, half_life)))
            .collect();
        (rates, st.refill.mean())
    }

    /// Records `runtime`'s target; the one before, if it differs.
    fn set_target(&self, runtime: &str, target: Target) -> Option<Option<Target>> {
        let before = self.lock().targets.insert(runtime.to_string(), target);
        (before != Some(target)).then_some(before)
    }

    fn target(&self, runtime: &str) -> Option<Target> {
        self.lock().targets.get(runtime).copied()
    }

    /// Records how long a cold create took, which tells how long a
    /// create may wait for a member being made (see `sizing::handoff_wait`).
    pub(super) fn cold_took(&self, took: Duration) {
        self.lock().cold.record(took);
    }

    /// Lets the pool look again.
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }
}

impl Sandboxes {
    /// What the metrics show of each runtime with a pool: members ready
    /// and being made, and the target (the floor until the pool first
    /// sized itself).
    pub fn pool_sizes(&self) -> BTreeMap<String, crate::telemetry::PoolGauge> {
        let counts = self.pool.counts();
        let mut sizes = BTreeMap::new();
        for name in self.config.runtimes.keys() {
            let floor = self.config.pool_size(name);
            let c = counts.get(name).copied().unwrap_or_default();
            if floor == 0 && c == Counts::default() {
                continue;
            }
            let target = self.pool.target(name).unwrap_or(Target {
                size: floor,
                reason: sizing::Reason::Floor,
            });
            sizes.insert(
                name.clone(),
                crate::telemetry::PoolGauge {
                    ready: c.ready,
                    filling: c.filling,
                    target: target.size,
                    reason: target.reason.as_str(),
                    reasons: &sizing::REASON_LABELS,
                },
            );
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
                // Only members in the making: each is removed when done.
                return;
            };
            tracing::info!(sandbox_id = %m.sandbox.id, "removing a pool member to make room for a session");
            self.remove_member(&m.sandbox.id, "made room for a session")
                .await;
        }
    }

    /// The network mode and resources every member is made with.
    fn member_shape(&self) -> (NetworkMode, Resources) {
        let network = NetworkMode::parse(&self.config.network_default).unwrap_or(NetworkMode::None);
        let resources = Resources {
            vcpus: self.config.default_vcpus,
            memory_mb: self.config.default_memory_mb,
        };
        (network, resources)
    }

    /// The runtime with a pool whose members could serve `spec` (its own
    /// name first, else the first that shares its image and OCI runtime),
    /// whatever its resources: where `spec` counts as an arrival.
    fn pooled_runtime(&self, spec: &SandboxSpec) -> Option<String> {
        let (network, _) = self.member_shape();
        if spec.network != network || !spec.allow.is_empty() {
            return None;
        }
        let wanted = Some((spec.image.clone(), spec.oci_runtime.clone()));
        let serves =
            |name: &str| self.config.pool_size(name) > 0 && self.config.runtime(name) == wanted;
        if serves(&spec.runtime) {
            return Some(spec.runtime.clone());
        }
        self.config.runtimes.keys().find(|n| serves(n)).cloned()
    }

    /// Claims a member for `spec` if one can serve it: the same image and
    /// OCI runtime (so the built-in runtimes, which share both, share
    /// members), network mode and allowlist; other CPU and memory are set on the
    /// running container where the OCI runtime allows. With none ready, a
    /// member being made may be waited for (see the module docs). A member
    /// that cannot be claimed after all is removed, and `None` sends the
    /// create down the cold path.
    pub(super) async fn claim(&self, spec: &SandboxSpec) -> Option<Arc<Sandbox>> {
        let now = Instant::now();
        if let Some(runtime) = self.pooled_runtime(spec) {
            let half_life = Duration::from_secs(self.config.pool_rate_halflife_secs);
            self.pool.arrive(&runtime, now, half_life);
        }
        // The pool may grow (or, for a claim, refill) once this create ends.
        self.pool.wake();
        let (network, resources) = self.member_shape();
        // Only a claim with other resources asks whether they can change
        // (gVisor is asked of the engine once, then remembered).
        let updatable = spec.resources == resources
            || !self.engine.is_gvisor(spec.oci_runtime.as_deref()).await;
        let wanted = Some((spec.image.clone(), spec.oci_runtime.clone()));
        let serves = |runtime: &str, net: NetworkMode, allow: &[String], res: Resources| {
            self.config.runtime(runtime) == wanted
                && net == spec.network
                && allow == spec.allow.as_slice()
                && (res == spec.resources || updatable)
        };
        let claimable = self.pool.take_or_promise(
            |m| serves(&m.runtime, m.network, &m.allow, m.resources),
            |runtime| serves(runtime, network, &[], resources),
            now,
        )?;
        let member = match claimable {
            Claimable::Ready(m) => m,
            Claimable::Promised { member, wait } => {
                match tokio::time::timeout(wait, member).await {
                    Ok(Ok(m)) => {
                        tracing::info!(sandbox_id = %m.sandbox.id, session_key = %spec.session_key, waited_ms = now.elapsed().as_millis(), "pool member handed over as it was made");
                        crate::telemetry::pool_handoff(true);
                        m
                    }
                    _ => {
                        tracing::info!(session_key = %spec.session_key, waited_ms = now.elapsed().as_millis(), "the pool member waited for failed or is late; making a sandbox");
                        crate::telemetry::pool_handoff(false);
                        return None;
                    }
                }
            }
        };
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
            metadata: spec.metadata.clone(),
            env: spec.env.clone(),
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
            metadata: Default::default(),
            env: Default::default(),
        };
        Member {
            sandbox: Arc::new(Sandbox::from_record("t", &record, 1)),
            image_id: "sha256:a".into(),
        }
    }

    /// Makes one member of `rt` through a fill, as the pool does.
    fn filled(pool: &Pool, rt: &str) {
        let id = pool.start_fill(rt, 10, 10).expect("a fill");
        assert!(pool.end_fill(id, Some(member(rt)), 10).is_none());
    }

    #[test]
    fn fills_up_to_the_target_two_at_a_time_and_within_the_room() {
        let pool = Pool::default();
        let a = pool.start_fill("default", 3, 10).expect("first");
        let b = pool
            .start_fill("default", 3, 10)
            .expect("a second: two missing");
        assert!(pool.start_fill("default", 3, 10).is_none(), "two at a time");
        assert_eq!(pool.room_taken(), 2, "members in the making take room");
        assert!(pool.end_fill(a, Some(member("default")), 10).is_none());
        assert!(
            pool.end_fill(b, None, 10).is_none(),
            "a failed fill ends too"
        );
        let c = pool.start_fill("default", 2, 10).expect("one missing");
        assert!(
            pool.start_fill("default", 2, 10).is_none(),
            "target reached with the fill"
        );
        assert!(pool.end_fill(c, Some(member("default")), 10).is_none());
        assert!(pool.start_fill("gvisor", 1, 2).is_none(), "no room left");
        assert!(pool.start_fill("gvisor", 1, 3).is_some(), "per runtime");
        let counts = pool.counts();
        assert_eq!(
            counts.get("default"),
            Some(&Counts {
                ready: 2,
                filling: 0
            })
        );
        assert_eq!(
            counts.get("gvisor"),
            Some(&Counts {
                ready: 0,
                filling: 1
            })
        );
    }

    #[test]
    fn a_member_made_after_its_room_went_is_handed_back() {
        let pool = Pool::default();
        let id = pool.start_fill("default", 2, 1).expect("a fill");
        // Sessions took the last slot meanwhile.
        assert!(pool.end_fill(id, Some(member("default")), 0).is_some());
        assert_eq!(pool.room_taken(), 0);
    }

    #[test]
    fn claims_take_the_oldest_fitting_member_once() {
        let pool = Pool::default();
        for rt in ["default", "gvisor", "default"] {
            filled(&pool, rt);
        }
        let first = pool.take(|s| s.runtime == "default").expect("a member");
        let second = pool.take(|s| s.runtime == "default").expect("another");
        assert_ne!(first.sandbox.id, second.sandbox.id);
        assert!(pool.take(|s| s.runtime == "default").is_none());
        assert_eq!(pool.counts().get("gvisor").map(|c| c.ready), Some(1));
    }

    #[tokio::test]
    async fn a_member_being_made_is_promised_to_one_create_and_handed_to_it() {
        let pool = Pool::default();
        let id = pool.start_fill("default", 1, 10).expect("a fill");
        let now = Instant::now();
        let Some(Claimable::Promised { member: rx, wait }) =
            pool.take_or_promise(|_| true, |rt| rt == "default", now)
        else {
            panic!("the fill is promised");
        };
        assert!(wait > Duration::ZERO);
        assert!(
            pool.take_or_promise(|_| true, |_| true, now).is_none(),
            "not to a second create"
        );
        let made = member("default");
        let made_id = made.sandbox.id.clone();
        assert!(pool.end_fill(id, Some(made), 10).is_none());
        assert_eq!(rx.await.expect("handed").sandbox.id, made_id);
        assert_eq!(pool.room_taken(), 0, "counted once: not also a member");
        assert!(pool.take(|_| true).is_none());
    }

    #[tokio::test]
    async fn a_failed_or_abandoned_promise_goes_cold_or_back_to_the_pool() {
        let pool = Pool::default();
        let id = pool.start_fill("default", 2, 10).expect("a fill");
        let Some(Claimable::Promised { member: rx, .. }) =
            pool.take_or_promise(|_| true, |_| true, Instant::now())
        else {
            panic!("promised");
        };
        assert!(pool.end_fill(id, None, 10).is_none());
        assert!(rx.await.is_err(), "the waiting create hears of the failure");
        // A create that stopped waiting: the member joins the pool.
        let id = pool.start_fill("default", 2, 10).expect("a fill");
        let promised = pool.take_or_promise(|_| true, |_| true, Instant::now());
        assert!(matches!(promised, Some(Claimable::Promised { .. })));
        drop(promised);
        assert!(pool.end_fill(id, Some(member("default")), 10).is_none());
        assert_eq!(pool.counts().get("default").map(|c| c.ready), Some(1));
        // A fill of a runtime that does not serve is not promised.
        assert!(pool.start_fill("gvisor", 1, 10).is_some());
        assert!(
            pool.take_or_promise(|_| false, |rt| rt == "default", Instant::now())
                .is_none()
        );
    }

    #[test]
    fn the_surplus_above_the_target_goes_oldest_first() {
        let pool = Pool::default();
        for rt in ["default", "default", "gvisor", "default"] {
            filled(&pool, rt);
        }
        let oldest = pool.sandboxes()[0].id.clone();
        let gone = pool.take_surplus("default", 2).expect("one too many");
        assert_eq!(gone.sandbox.id, oldest);
        assert!(pool.take_surplus("default", 2).is_none());
        assert!(pool.take_surplus("gvisor", 1).is_none());
    }
}
