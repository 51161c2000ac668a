//! The warm pool's sizing rule, with nothing of the engine in it: how many
//! members each runtime's pool aims for, given what the pool measured, and
//! how long a create may wait for a member that is being made.
//!
//! The rule, per runtime with a `pool_size` (its floor):
//!
//! - `rate` is an exponentially weighted arrival rate of the creates for
//!   new sessions that its members could serve (claims and cold creates
//!   alike), with the half-life `pool_rate_halflife_secs`;
//! - `refill` is an exponentially weighted average of recent fill
//!   durations (the time to make one member);
//! - demand is `ceil(rate × refill)`: the creates expected while one member
//!   is being made (Little's law), 0 before any fill was timed;
//! - the target is the floor, or the demand where it is higher. Growth
//!   above the floors is shared out in runtime name order and bounded by
//!   `pool_max` (members of all runtimes together) and by
//!   `pool_memory_mb` at [`MEMBER_COST_MB`] a member; floors are always
//!   kept. Last, every target fits the room sessions leave under
//!   `max_concurrent`.
//!
//! As the rate decays after quiet the target falls back to the floor, and
//! members above it are removed.

use std::time::{Duration, Instant};

/// What one idle member costs the host, for `pool_memory_mb`: about 1.5 MB
/// of its memory cgroup, about 13 MB of the engine's per-container shim
/// (runc), and about 14 MB when it holds a spare port proxy made ahead
/// (bench/RESULTS.md, "the warm pool"); 28.5 MB, rounded up.
pub(crate) const MEMBER_COST_MB: u64 = 32;

/// Most members made at once: the second only when two or more are
/// missing, so a refill after one claim competes with nothing.
pub(crate) const MAX_FILLS: usize = 2;

/// How long a create waits for the first member ever made, which no
/// measured fill tells the length of (it may be building the image, which
/// a cold create would wait for too).
const FIRST_FILL_WAIT: Duration = Duration::from_secs(30);

/// Weight of the newest fill in [`Average`].
const AVERAGE_WEIGHT: f64 = 0.3;

/// An exponentially weighted rate of events per second: each event adds a
/// kernel `λ·e^(-λt)` (`λ = ln 2 / half-life`), so steady arrivals at `r`
/// per second read `r`, and the value halves every half-life of quiet.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rate {
    per_sec: f64,
    at: Option<Instant>,
}

impl Rate {
    /// Counts one event at `now`.
    pub(crate) fn record(&mut self, now: Instant, half_life: Duration) {
        self.per_sec = self.at(now, half_life) + std::f64::consts::LN_2 / secs(half_life);
        self.at = Some(now);
    }

    /// The rate at `now`.
    pub(crate) fn at(&self, now: Instant, half_life: Duration) -> f64 {
        let Some(at) = self.at else { return 0.0 };
        let quiet = now.saturating_duration_since(at).as_secs_f64();
        self.per_sec * 0.5_f64.powf(quiet / secs(half_life))
    }
}

/// A half-life in seconds, never zero (the key's range starts at 1 s).
fn secs(d: Duration) -> f64 {
    d.as_secs_f64().max(1e-3)
}

/// An exponentially weighted average of durations.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Average {
    mean: Option<Duration>,
}

impl Average {
    pub(crate) fn record(&mut self, d: Duration) {
        self.mean = Some(match self.mean {
            None => d,
            Some(m) => m.mul_f64(1.0 - AVERAGE_WEIGHT) + d.mul_f64(AVERAGE_WEIGHT),
        });
    }

    /// `None` until something was recorded.
    pub(crate) fn mean(&self) -> Option<Duration> {
        self.mean
    }
}

/// What bounds a target (the `reason` label of `sandboxd_pool_target`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The demand is at most the floor.
    Floor,
    /// The demand, above the floor.
    Demand,
    /// `pool_max` stopped the growth.
    Ceiling,
    /// `pool_memory_mb` stopped the growth.
    MemoryBudget,
    /// Sessions leave no more room under `max_concurrent`.
    Room,
}

/// Every reason's label, for the gauge that shows which one holds.
pub(crate) const REASON_LABELS: [&str; 5] = [
    Reason::Floor.as_str(),
    Reason::Demand.as_str(),
    Reason::Ceiling.as_str(),
    Reason::MemoryBudget.as_str(),
    Reason::Room.as_str(),
];

impl Reason {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Reason::Floor => "floor",
            Reason::Demand => "demand",
            Reason::Ceiling => "ceiling",
            Reason::MemoryBudget => "memory_budget",
            Reason::Room => "room",
        }
    }
}

/// One runtime's input to [`targets`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Demand<'a> {
    pub(crate) runtime: &'a str,
    /// Its `pool_size`.
    pub(crate) floor: usize,
    /// Arrivals per second ([`Rate`]).
    pub(crate) rate: f64,
}

/// The bounds every runtime's pool shares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// `pool_max`.
    pub(crate) ceiling: usize,
    /// `pool_memory_mb`.
    pub(crate) memory_mb: u64,
    /// Slots sessions leave under `max_concurrent`.
    pub(crate) room: usize,
}

/// A runtime's target size and what set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) size: usize,
    pub(crate) reason: Reason,
}

/// Each runtime's target, in the order of `demands`; `refill` is the
/// average fill duration, `None` before any fill was timed. See the module
/// docs for the rule.
pub(crate) fn targets(
    demands: &[Demand<'_>],
    refill: Option<Duration>,
    limits: Limits,
) -> Vec<Target> {
    let floors: usize = demands.iter().map(|d| d.floor).sum();
    let budget = usize::try_from(limits.memory_mb / MEMBER_COST_MB).unwrap_or(usize::MAX);
    let mut ceiling_left = limits.ceiling.saturating_sub(floors);
    let mut budget_left = budget.saturating_sub(floors);
    let mut room_left = limits.room;
    let mut out = Vec::with_capacity(demands.len());
    for d in demands {
        // `as` saturates; a NaN (which no finite rate makes) reads 0.
        let wanted = refill.map_or(0, |t| (d.rate * t.as_secs_f64()).ceil() as usize);
        let mut target = if wanted > d.floor {
            Target {
                size: wanted,
                reason: Reason::Demand,
            }
        } else {
            Target {
                size: d.floor,
                reason: Reason::Floor,
            }
        };
        for (left, reason) in [
            (ceiling_left, Reason::Ceiling),
            (budget_left, Reason::MemoryBudget),
        ] {
            if target.size - d.floor > left {
                target = Target {
                    size: d.floor + left,
                    reason,
                };
            }
        }
        let growth = target.size - d.floor;
        ceiling_left -= growth;
        budget_left -= growth;
        if target.size > room_left {
            target = Target {
                size: room_left,
                reason: Reason::Room,
            };
        }
        room_left -= target.size;
        out.push(target);
    }
    out
}

/// How long a create may wait for a member being made that has run for
/// `elapsed`, or `None` to make its sandbox cold now. A fill takes about
/// `refill` and a cold create about `cold` (a fill does more: it connects
/// the agent and makes a spare port proxy, so it takes longer). The fill
/// is worth waiting for when it is due sooner than a cold create would
/// take, and for no longer than a cold create takes; a fill past twice its
/// usual time is not waited for. Before any cold create was timed, it is
/// taken to take as long as a fill. With no fill timed yet, the create
/// waits (bounded).
pub(crate) fn handoff_wait(
    refill: Option<Duration>,
    cold: Option<Duration>,
    elapsed: Duration,
) -> Option<Duration> {
    let Some(refill) = refill else {
        return FIRST_FILL_WAIT
            .checked_sub(elapsed)
            .filter(|d| !d.is_zero());
    };
    let cold = cold.unwrap_or(refill);
    let due_in = refill.saturating_sub(elapsed);
    (due_in < cold && elapsed < refill * 2).then_some(cold)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(10);

    fn limits(ceiling: usize, memory_mb: u64, room: usize) -> Limits {
        Limits {
            ceiling,
            memory_mb,
            room,
        }
    }

    fn one(floor: usize, rate: f64, refill_ms: u64, limits: Limits) -> Target {
        let d = [Demand {
            runtime: "default",
            floor,
            rate,
        }];
        targets(&d, Some(Duration::from_millis(refill_ms)), limits)[0]
    }

    #[test]
    fn a_steady_rate_reads_itself_and_halves_each_half_life_of_quiet() {
        let t0 = Instant::now();
        let mut r = Rate::default();
        assert_eq!(r.at(t0, H), 0.0);
        // Two arrivals a second for ten half-lives.
        for i in 0..200 {
            r.record(t0 + Duration::from_millis(500 * i), H);
        }
        let end = t0 + Duration::from_millis(500 * 199);
        let steady = r.at(end, H);
        assert!((steady - 2.0).abs() < 0.1, "{steady}");
        let later = r.at(end + H, H);
        assert!((later - steady / 2.0).abs() < 1e-9, "{later}");
    }

    #[test]
    fn the_average_leans_towards_recent_fills() {
        let mut a = Average::default();
        assert_eq!(a.mean(), None);
        a.record(Duration::from_millis(1000));
        assert_eq!(a.mean(), Some(Duration::from_millis(1000)));
        a.record(Duration::from_millis(2000));
        assert_eq!(a.mean(), Some(Duration::from_millis(1300)));
    }

    #[test]
    fn the_target_is_the_demand_between_floor_and_ceiling() {
        let wide = limits(8, 1024, 100);
        // 0.5/s × 0.6 s = 0.3 → 1, under the floor of 2.
        assert_eq!(
            one(2, 0.5, 600, wide),
            Target {
                size: 2,
                reason: Reason::Floor
            }
        );
        // 5/s × 0.6 s = 3.
        assert_eq!(
            one(2, 5.0, 600, wide),
            Target {
                size: 3,
                reason: Reason::Demand
            }
        );
        // 20/s × 0.6 s = 12, past pool_max 8.
        assert_eq!(
            one(2, 20.0, 600, wide),
            Target {
                size: 8,
                reason: Reason::Ceiling
            }
        );
        // No fill timed yet: no demand.
        let d = [Demand {
            runtime: "default",
            floor: 1,
            rate: 50.0,
        }];
        assert_eq!(
            targets(&d, None, wide)[0],
            Target {
                size: 1,
                reason: Reason::Floor
            }
        );
    }

    #[test]
    fn memory_budget_and_room_bound_the_growth_and_floors_stay() {
        // 128 MB is 4 members at 32 MB.
        assert_eq!(
            one(2, 20.0, 600, limits(8, 128, 100)),
            Target {
                size: 4,
                reason: Reason::MemoryBudget
            }
        );
        // Room under max_concurrent bounds even the floor.
        assert_eq!(
            one(2, 20.0, 600, limits(8, 1024, 1)),
            Target {
                size: 1,
                reason: Reason::Room
            }
        );
        // A floor above pool_max is kept, with no growth on top.
        assert_eq!(
            one(50, 200.0, 600, limits(8, 0, 100)),
            Target {
                size: 50,
                reason: Reason::Ceiling
            }
        );
    }

    #[test]
    fn growth_is_shared_in_order_and_floors_come_first() {
        let d = [
            Demand {
                runtime: "a",
                floor: 1,
                rate: 10.0,
            },
            Demand {
                runtime: "b",
                floor: 2,
                rate: 10.0,
            },
        ];
        // pool_max 6: floors 3, growth 3 left; a wants 6 (+5) and gets +3.
        let t = targets(&d, Some(Duration::from_millis(600)), limits(6, 1024, 100));
        assert_eq!(
            t[0],
            Target {
                size: 4,
                reason: Reason::Ceiling
            }
        );
        assert_eq!(
            t[1],
            Target {
                size: 2,
                reason: Reason::Ceiling
            }
        );
    }

    #[test]
    fn a_create_waits_for_a_fill_while_it_ends_sooner_than_a_cold_create() {
        let fill = Some(Duration::from_millis(900));
        let cold = Some(Duration::from_millis(350));
        // Just started: due in 800 ms, a cold create takes 350.
        assert_eq!(handoff_wait(fill, cold, Duration::from_millis(100)), None);
        // Due in 300 ms: wait, at most as long as a cold create.
        assert_eq!(
            handoff_wait(fill, cold, Duration::from_millis(600)),
            Some(Duration::from_millis(350))
        );
        // Late, but not twice as long as usual.
        assert_eq!(
            handoff_wait(fill, cold, Duration::from_millis(1200)),
            Some(Duration::from_millis(350))
        );
        assert_eq!(handoff_wait(fill, cold, Duration::from_millis(1800)), None);
        // No cold create timed yet: taken to take as long as a fill.
        assert_eq!(
            handoff_wait(fill, None, Duration::from_millis(100)),
            Some(Duration::from_millis(900))
        );
        assert_eq!(
            handoff_wait(None, cold, Duration::from_secs(1)),
            Some(Duration::from_secs(29))
        );
    }
}
