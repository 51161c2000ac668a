//! Keeping the warm pool: sizing it ([`sizing`]) and logging the rule's
//! inputs when a target changes, making members (up to
//! [`sizing::MAX_FILLS`] at once, each a task of its own, so a create can be
//! handed a member the moment it is made), removing members above the
//! target, and every [`KEEP_WARM`] checking members' agents and images.
//! No fill starts and no member is removed while a create for a new
//! session or a stop runs, and a fill under way waits for them between its
//! steps: the engine serves the request first.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::sizing::{self, Demand, Limits, Target};
use super::{Member, Pool};
use crate::agent_client::AgentError;
use crate::clock::now_ms;
use crate::sandbox::labels::{self, SandboxRecord};
use crate::sandbox::registry::{self, Sandbox};
use crate::sandbox::spec::SandboxSpec;
use crate::sandbox::{SandboxError, SandboxResult, Sandboxes};

/// How often members are checked: their agent asked, their image compared.
const KEEP_WARM: Duration = Duration::from_secs(10);

/// How often the targets are worked out again when nothing else happens:
/// the arrival rate decays with time alone.
const RESIZE_EVERY: Duration = Duration::from_secs(1);

/// How long a runtime whose member could not be made waits before the next
/// try.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// How long a member's agent may take to answer the keep-warm call.
const KEEP_WARM_LIMIT: Duration = Duration::from_secs(5);

/// The longest one step of a fill waits for the user's creates and stops
/// to end: under a steady stream of them, the pool still fills. Longer
/// than 8 cold creates one after another (about 4 s here).
const YIELD_AT_MOST: Duration = Duration::from_secs(5);

/// Fills and keeps the pool until `shutdown`. Starts once rehydration is
/// done. Members are left running at shutdown, and fills under way are
/// dropped: the next start removes the unclaimed ones (see `rehydrate`).
pub async fn run_pool(sandboxes: Arc<Sandboxes>, shutdown: CancellationToken) {
    let mut ready = sandboxes.ready.subscribe();
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = ready.wait_for(|r| *r) => {}
    }
    let mut keep_warm = tokio::time::interval(KEEP_WARM);
    keep_warm.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut resize = tokio::time::interval(RESIZE_EVERY);
    resize.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed: HashMap<String, Instant> = HashMap::new();
    // Each fill's runtime and whether it made a member.
    let mut fills: JoinSet<(String, bool)> = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sandboxes.upkeep(&mut fills, &failed) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(done) = fills.join_next(), if !fills.is_empty() => {
                // A fill that panicked has ended its own bookkeeping.
                if let Ok((runtime, made)) = done {
                    if made {
                        failed.remove(&runtime);
                    } else {
                        failed.insert(runtime, Instant::now());
                    }
                }
            }
            _ = sandboxes.pool.wake.notified() => {}
            // A create started or ended: the pool may fill or shrink now.
            _ = sandboxes.foreground.changed() => {}
            // The user's work settled: fills may start.
            _ = sandboxes.foreground.quiet(), if sandboxes.foreground.is_busy() => {}
            _ = resize.tick() => {}
            _ = keep_warm.tick() => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = sandboxes.keep_warm() => {}
                }
            }
        }
    }
}

/// Ends its fill without a member when dropped before the fill ended (the
/// pool task stopped, or making the member panicked), so a create waiting
/// for it goes cold at once.
struct Filling<'a> {
    pool: &'a Pool,
    id: u64,
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        // A fill that ended already is not found: nothing happens.
        self.pool.end_fill(self.id, None, 0);
    }
}

impl Sandboxes {
    /// Works out the targets, then, unless a create is under way, removes
    /// members above them (oldest first) and starts the fills they call
    /// for. A runtime whose member could not be made waits
    /// [`RETRY_AFTER`].
    async fn upkeep(
        self: &Arc<Self>,
        fills: &mut JoinSet<(String, bool)>,
        failed: &HashMap<String, Instant>,
    ) {
        let targets = self.size_pool();
        for (runtime, target) in &targets {
            while !self.foreground.is_busy()
                && let Some(m) = self.pool.take_surplus(runtime, target.size)
            {
                self.remove_member(&m.sandbox.id, "the pool shrank to its target")
                    .await;
            }
        }
        for (runtime, target) in targets {
            if failed
                .get(&runtime)
                .is_some_and(|at| at.elapsed() < RETRY_AFTER)
            {
                continue;
            }
            while !self.foreground.is_busy()
                && let Some(id) = self
                    .pool
                    .start_fill(&runtime, target.size, self.pool_room())
            {
                let sandboxes = Arc::clone(self);
                let runtime = runtime.clone();
                fills.spawn(async move {
                    let made = sandboxes.fill(&runtime, id).await;
                    (runtime, made)
                });
            }
        }
    }

    /// Each runtime's target now ([`sizing::targets`]), recorded for the
    /// metrics; a target that changed is logged with the rule's inputs.
    fn size_pool(&self) -> Vec<(String, Target)> {
        let now = Instant::now();
        let half_life = Duration::from_secs(self.config.pool_rate_halflife_secs);
        let floors: Vec<(&str, usize)> = self
            .config
            .runtimes
            .keys()
            .map(|name| (name.as_str(), self.config.pool_size(name)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let (rates, refill) = self.pool.demand(&floors, now, half_life);
        let demands: Vec<Demand<'_>> = floors
            .iter()
            .zip(rates)
            .map(|(&(runtime, floor), rate)| Demand {
                runtime,
                floor,
                rate,
            })
            .collect();
        let limits = Limits {
            ceiling: self.config.pool_max,
            memory_mb: self.config.pool_memory_mb,
            room: self.pool_room(),
        };
        let targets = sizing::targets(&demands, refill, limits);
        for (d, t) in demands.iter().zip(&targets) {
            if let Some(before) = self.pool.set_target(d.runtime, *t) {
                tracing::info!(
                    runtime = d.runtime,
                    rate_per_sec = (d.rate * 1000.0).round() / 1000.0,
                    refill_ms = refill.map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
                    floor = d.floor,
                    ceiling = limits.ceiling,
                    memory_budget_mb = limits.memory_mb,
                    member_cost_mb = sizing::MEMBER_COST_MB,
                    room = limits.room,
                    target = t.size,
                    reason = t.reason.as_str(),
                    before = before.map(|b| b.size),
                    "pool target changed"
                );
            }
        }
        demands
            .iter()
            .map(|d| d.runtime.to_string())
            .zip(targets)
            .collect()
    }

    /// Makes one member of `runtime` for fill `id`, and ends the fill;
    /// whether a member was made.
    async fn fill(&self, runtime: &str, id: u64) -> bool {
        let _filling = Filling {
            pool: &self.pool,
            id,
        };
        let started = Instant::now();
        let made = match self.make_member(runtime, id).await {
            Ok(m) => {
                crate::telemetry::pool_filled(started);
                Some(m)
            }
            Err(e) => {
                tracing::warn!(runtime, error = %e, "could not make a pool member; trying again in {} s", RETRY_AFTER.as_secs());
                None
            }
        };
        let was_made = made.is_some();
        if let Some(surplus) = self.pool.end_fill(id, made, self.pool_room()) {
            self.remove_member(&surplus.sandbox.id, "sessions took its room")
                .await;
        }
        was_made
    }

    /// A member of `runtime`: the default resources and network mode, no
    /// ports, its agent connected.
    async fn make_member(&self, runtime: &str, fill: u64) -> SandboxResult<Member> {
        let (image, oci_runtime) = self.config.runtime(runtime).ok_or_else(|| {
            SandboxError::EngineUnavailable(format!("runtime {runtime:?} is not configured"))
        })?;
        let (network, resources) = self.member_shape();
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
            metadata: Default::default(),
            env: Default::default(),
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
            metadata: Default::default(),
            env: Default::default(),
        };
        let sandbox = Arc::new(Sandbox::from_record(
            &self.config.instance,
            &record,
            now_ms(),
        ));
        let labels = labels::encode_member(&self.config.instance, &record);
        let made = async {
            self.fill_turn(fill).await;
            self.launch(&sandbox, &spec, labels, None).await?;
            self.fill_turn(fill).await;
            self.agent(&sandbox).await?;
            self.fill_turn(fill).await;
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

    /// Before each step of fill `id`: while the user's creates or stops
    /// run, waits for them to end (at most [`YIELD_AT_MOST`]), unless a
    /// create waits for this very member (then it goes on at once, also
    /// when that create comes during the wait).
    async fn fill_turn(&self, id: u64) {
        let Some((promised, on_promise)) = self.pool.promise_of(id) else {
            return;
        };
        if promised || !self.foreground.is_busy() {
            return;
        }
        let turn = async {
            tokio::select! {
                _ = self.foreground.quiet() => {}
                _ = on_promise.notified() => {}
            }
        };
        let _ = tokio::time::timeout(YIELD_AT_MOST, turn).await;
    }

    /// Asks every member's agent for its commands, which keeps it warm and
    /// shows it alive, and replaces members whose agent does not answer or
    /// whose runtime image was rebuilt since.
    async fn keep_warm(&self) {
        let mut current: HashMap<String, Option<String>> = HashMap::new();
        for name in self.pool.counts().into_keys() {
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
    pub(super) async fn remove_member(&self, id: &str, why: &str) {
        tracing::info!(sandbox_id = %id, why, "pool member removed");
        if let Err(e) = self.remove_objects_checked(id).await {
            tracing::warn!(sandbox_id = %id, error = %e, "could not remove all engine objects of a pool member");
        }
    }
}
