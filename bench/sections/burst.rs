//! The burst section (issue 39, `--only burst`, lines `burst: …`, then the
//! density section's in the same run): new sessions that arrive one after
//! another, at a steady rate, and all at once. Each part runs on sandboxds
//! of its own, started for it and removed after it (sessions and members
//! with them, even when a line fails); their configurations name the pool
//! settings `pool_max` as well as `pool_size`, so this section needs a
//! sandboxd that knows them (issue 39's adaptive pool).
//!
//! - One after another (also alone: `--only sequential`): 5, then 10, new sessions, each create sent when
//!   the one before answered; a series' sessions are stopped only after the
//!   series, so each later create finds the earlier ones running, as a
//!   user's next chat does. On a sandboxd at its defaults (its default
//!   pool), on one with `pool_size = 0`, and the engine floor's create (the
//!   pool section's: volume + container create + start) as many times in a
//!   row, its containers removed after the series. Each series starts on a
//!   quiet machine ([`quiet`]: both sandboxds' objects and pools unchanged
//!   for 1 s, their link networks made ahead). Lines: the default pool's
//!   create p50 and p95 against `pool_size = 0`'s, its p50 against the
//!   floor's, and `pool_size = 0`'s p50 against the floor's.
//! - Sustained (with the rates; also alone: `--only sustained`): 4 clients each make sessions one after
//!   another (create, `exec true`, stop) for 60 s on a fresh sandboxd at
//!   its defaults: sessions per second, time to first command p50, and
//!   the teardowns still pending at the end (`sandboxd_teardowns_pending`;
//!   its bound holds them to 8 plus the clients). The floor column: the
//!   same clients doing mode `internet`'s engine work directly for each
//!   session (an internal network, the container on it, a running
//!   container joining it as the egress proxy does, `exec true`, then all
//!   of it removed): what this machine's engine sustains, against which
//!   the 5/s rate reads.
//! - At a rate (also alone: `--only rate`): a sandboxd at its defaults with
//!   `pool_max = 16` gets new sessions at 5/s, open loop (each sent at its
//!   time, whatever the others do), for 30 s, then 20 more: those 20 are
//!   measured. Then the same on a fresh one at 1/s: 5/s is more than this
//!   2-core machine makes `internet` sandboxes at (the sustained line
//!   says how many, with and without sandboxd), so it measures overload;
//!   1/s is a rate the engine sustains. A session is a
//!   create and `exec true` (time to first command, from sending the
//!   create), then its stop, so that sessions do not pile up against
//!   `max_concurrent` while sandboxd keeps up. The claims among the 20:
//!   `sandboxd_pool_claims_total` by outcome read just before the first of
//!   them is sent and after the last one answered (a warm-up create still
//!   unanswered at the first reading counts with them: a note says how
//!   many there were). A session that fails (an error answer: say, its
//!   sandbox evicted before its first command) is counted, not timed, and
//!   a note gives the first error.
//! - All at once (also alone: `--only fifty`): a sandboxd with `pool_size = 50` (`pool_max = 50`) and
//!   room for 120; once its pool holds 50 and it is quiet, 50 new sessions
//!   at once, each a create and `exec true`: the claims among them (and
//!   that the 50 sandboxes are distinct), time to first command p50 and
//!   p99 (and of it, the create's answer p99), and how long the pool took to hold 50 from sandboxd's start.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::json;

use super::density;
use crate::floor::Floor;
use crate::report::{Line, RunFigures, line, ratio_at_most};
use crate::requests::{claims, first_command, metric, pool_full, quiet, stop, timed_create};
use crate::support::{Instance, Res, Server, ms};

/// The configuration of the sandboxd the rate burst measures: its defaults
/// (an adaptive pool) and a ceiling the pool can grow to at 5/s.
const ADAPTIVE_CONFIG: &str = "pool_max = 16\n";
/// The sandboxd of the 50 at once: a pool of 50, its ceiling as high.
const POOL_OF_50_CONFIG: &str = "pool_size = 50\npool_max = 50\n";

/// A rate burst: one new session every `every`, for WARMUP_FOR before the
/// MEASURED ones, and the lines it fills.
struct Rate {
    /// Its name in notes, e.g. "5/s".
    name: &'static str,
    every: Duration,
    claims: &'static str,
    first_p99: &'static str,
    first: &'static str,
    failed: &'static str,
}
const WARMUP_FOR: Duration = Duration::from_secs(30);
const MEASURED: usize = 20;

/// The rate: more than this 2-core machine makes `internet`
/// sandboxes at, with or without sandboxd (see [`SUSTAINED`]), so it
/// measures overload.
const RATE_5: Rate = Rate {
    name: "5/s",
    every: Duration::from_millis(200),
    claims: "burst: 20 new sessions at 5/s after 30 s at that rate: claims (%)",
    first_p99: "burst: of those 20, time to first command p99 (ms)",
    first: "burst: of those 20, time to first command p50 (ms)",
    failed: "burst: of those 20, sessions that failed",
};
/// A rate this machine sustains: what the adaptive pool does when the
/// engine can keep up.
const RATE_1: Rate = Rate {
    name: "1/s",
    every: Duration::from_secs(1),
    claims: "burst: 20 new sessions at 1/s after 30 s at that rate: claims (%)",
    first_p99: "burst: of those 20 at 1/s, time to first command p99 (ms)",
    first: "burst: of those 20 at 1/s, time to first command p50 (ms)",
    failed: "burst: of those 20 at 1/s, sessions that failed",
};
/// A session of the rate burst sent later than this after its time makes
/// a note (the bench itself fell behind its schedule).
const LATE_MS: f64 = 20.0;

/// The sustained rate: clients each making sessions one after another
/// (create, `exec true`, stop) for this long.
const SUSTAINED_CLIENTS: usize = 4;
const SUSTAINED_FOR: Duration = Duration::from_secs(60);
const SUSTAINED: &str = "burst: new sessions per second 4 clients sustain for 60 s, each a create, `exec true` and stop, one after another";
const SUSTAINED_FIRST: &str = "burst: of those, time to first command p50 (ms)";
const SUSTAINED_PENDING: &str = "burst: of those, teardowns pending at the end";

/// How long a pool of 2 may take to fill; a pool of 50.
const FILL: Duration = Duration::from_secs(60);
const FILL_50: Duration = Duration::from_secs(300);

/// The lines of one series of new sessions one after another.
struct Sequential {
    n: usize,
    p50: &'static str,
    p95: &'static str,
    p50_floor: &'static str,
    no_pool: &'static str,
}

const SEQ_5: Sequential = Sequential {
    n: 5,
    p50: "burst: 5 new sessions one after another, default pool: create p50 (ms)",
    p95: "burst: of those 5, create p95 (ms)",
    p50_floor: "burst: of those 5, create p50 against the engine floor's create (ms)",
    no_pool: "burst: the same 5 with `pool_size = 0`: create p50 (ms)",
};
const SEQ_10: Sequential = Sequential {
    n: 10,
    p50: "burst: 10 new sessions one after another, default pool: create p50 (ms)",
    p95: "burst: of those 10, create p95 (ms)",
    p50_floor: "burst: of those 10, create p50 against the engine floor's create (ms)",
    no_pool: "burst: the same 10 with `pool_size = 0`: create p50 (ms)",
};

const FIFTY_CLAIMS: &str = "burst: 50 new sessions at once from a pool of 50: claims";
const FIFTY_FIRST_P99: &str = "burst: of those 50, time to first command p99 (ms)";
const FIFTY_FIRST: &str = "burst: of those 50, time to first command p50 (ms)";
const FIFTY_CREATE_P99: &str = "burst: of those 50, the create's answer p99 (ms)";
const FIFTY_FILL: &str = "burst: the pool of 50 full, from sandboxd's start (ms)";

/// A series' lines: against `pool_size = 0` (the floor column of the
/// first two) and against the engine floor.
const fn sequential_lines(s: &Sequential) -> [Line; 4] {
    [
        line(
            s.p50,
            "≤ 1.0× `pool_size = 0` (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.0)),
        ),
        line(
            s.p95,
            "≤ 1.0× `pool_size = 0` (floor column)",
            Some(|v, f| ratio_at_most(v, f, 1.0)),
        ),
        line(
            s.p50_floor,
            "≤ 1.1× floor",
            Some(|v, f| ratio_at_most(v, f, 1.1)),
        ),
        line(s.no_pool, "report (floor column: the engine floor)", None),
    ]
}

/// A rate burst's lines, with the targets.
const fn rate_lines(r: &Rate) -> [Line; 4] {
    [
        line(r.claims, "≥ 90%", Some(|v, _| v >= 90.0)),
        line(r.first_p99, "≤ 50 ms", Some(|v, _| v <= 50.0)),
        line(r.first, "report", None),
        line(r.failed, "0", Some(|v, _| v == 0.0)),
    ]
}

const RATE_LINES_5: [Line; 4] = rate_lines(&RATE_5);
const RATE_LINES_1: [Line; 4] = rate_lines(&RATE_1);
const LINES_5: [Line; 4] = sequential_lines(&SEQ_5);
const LINES_10: [Line; 4] = sequential_lines(&SEQ_10);

pub(crate) const LINES: &[Line] = &[
    LINES_5[0],
    LINES_5[1],
    LINES_5[2],
    LINES_5[3],
    LINES_10[0],
    LINES_10[1],
    LINES_10[2],
    LINES_10[3],
    line(
        SUSTAINED,
        "report (floor column: the engine doing mode `internet`'s work the same way)",
        None,
    ),
    line(SUSTAINED_FIRST, "report", None),
    line(
        SUSTAINED_PENDING,
        "≤ 12 (8 + the clients)",
        Some(|v, _| v <= 12.0),
    ),
    RATE_LINES_5[0],
    RATE_LINES_5[1],
    RATE_LINES_5[2],
    RATE_LINES_5[3],
    RATE_LINES_1[0],
    RATE_LINES_1[1],
    RATE_LINES_1[2],
    RATE_LINES_1[3],
    line(FIFTY_CLAIMS, "50 (all)", Some(|v, _| v >= 50.0)),
    line(FIFTY_FIRST_P99, "≤ 100 ms", Some(|v, _| v <= 100.0)),
    line(FIFTY_FIRST, "report", None),
    line(FIFTY_CREATE_P99, "report", None),
    line(FIFTY_FILL, "report", None),
];

/// Every burst line, then the density section's; `server` is the run's
/// own sandboxd, whose instance the floor's containers share.
pub(crate) async fn measure(server: &Server, floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    one_after_another(server, floor, fig).await?;
    rates(floor, fig).await?;
    all_at_once(floor, fig).await?;
    density::measure(floor, fig).await
}

/// The new sessions one after another alone (`--only sequential`).
pub(crate) async fn one_after_another(
    server: &Server,
    floor: &Floor,
    fig: &mut RunFigures,
) -> Res<()> {
    // The floor's network and agent volume are the run's own sandboxd's:
    // its first create makes them.
    series(server, "burst-warmup", 1).await?;
    sequential(floor, fig).await
}

/// The rate bursts alone (`--only rate`), each on a sandboxd of its own at
/// its defaults with `pool_max = 16`: 5/s, then 1/s; before them, the rate
/// a sandboxd at its defaults and the engine floor sustain.
pub(crate) async fn rates(floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    sustained(floor, fig).await?;
    for rate in [&RATE_5, &RATE_1] {
        let name = format!("{}-rate", floor.instance);
        let adaptive = Instance::start(&floor.docker, &name, ADAPTIVE_CONFIG, 100).await?;
        at_a_rate(&adaptive.server, rate, fig).await?;
    }
    Ok(())
}

/// The sessions per second [`SUSTAINED_CLIENTS`] clients get for
/// [`SUSTAINED_FOR`], each making sessions one after another: on a fresh
/// sandboxd at its defaults (its pool full first), and from the engine
/// floor doing mode `internet`'s engine work for each (its own network,
/// which a running container joins; see [`Floor::linked_session`]), all
/// of it removed before the next. sandboxd removes a stopped session's
/// network and volume after the stop's answer: what is still pending at
/// the end is a line of its own.
pub(crate) async fn sustained(floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    let name = format!("{}-sustained", floor.instance);
    let own = Instance::start(&floor.docker, &name, "", 100).await?;
    let server = &own.server;
    pool_full(server, 2, FILL).await?;
    let until = Instant::now() + SUSTAINED_FOR;
    let client = |c: usize| async move {
        let mut firsts = vec![];
        while Instant::now() < until {
            let key = format!("sustained-{c}-{}", firsts.len());
            let f = first_command(server, json!({ "sessionKey": key })).await?;
            stop(server, &f.id).await?;
            firsts.push(f.first);
        }
        Ok::<_, Box<dyn std::error::Error>>(firsts)
    };
    let t = Instant::now();
    let done = futures_util::future::try_join_all((0..SUSTAINED_CLIENTS).map(client)).await?;
    let took = t.elapsed().as_secs_f64();
    let pending = metric(server, "sandboxd_teardowns_pending").await?;
    drop(own);

    let joiner = format!("{}-sustained-joiner", floor.instance);
    floor.create(&joiner).await?;
    let until = Instant::now() + SUSTAINED_FOR;
    let floor_client = |c: usize| {
        let joiner = &joiner;
        async move {
            let mut n = 0usize;
            while Instant::now() < until {
                let name = format!("{}-sustained-{c}-{n}", floor.instance);
                floor.linked_session(&name, joiner).await?;
                n += 1;
            }
            Ok::<_, Box<dyn std::error::Error>>(n)
        }
    };
    let t = Instant::now();
    let floor_done =
        futures_util::future::try_join_all((0..SUSTAINED_CLIENTS).map(floor_client)).await;
    let floor_took = t.elapsed().as_secs_f64();
    floor.remove(&joiner).await?;
    let floor_done: usize = floor_done?.into_iter().sum();

    let firsts: Vec<f64> = done.into_iter().flatten().collect();
    fig.value(
        SUSTAINED,
        firsts.len() as f64 / took,
        Some(floor_done as f64 / floor_took),
    );
    fig.p50(SUSTAINED_FIRST, &firsts, &[]);
    fig.value(SUSTAINED_PENDING, pending, None);
    Ok(())
}

/// 5, then 10, new sessions one after another on a sandboxd with its
/// default pool and on one without, and the engine floor's creates.
async fn sequential(floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    let docker = &floor.docker;
    let pool_name = format!("{}-seq", floor.instance);
    // Its file is empty: sandboxd's defaults.
    let pool = Instance::start(docker, &pool_name, "", 100).await?;
    let none_name = format!("{}-seq0", floor.instance);
    let none = Instance::start(docker, &none_name, "pool_size = 0\n", 100).await?;
    pool_full(&pool.server, 2, FILL).await?;
    let settle = || async {
        quiet(&pool.server, docker, &pool_name).await?;
        quiet(&none.server, docker, &none_name).await?;
        // The floor's containers carry the run's own instance.
        quiet(&none.server, docker, &floor.instance).await
    };
    // Whatever a first create or container start costs (caches, the
    // agent volume) is paid before the series, on each side.
    series(&pool.server, "seq-warmup", 1).await?;
    series(&none.server, "seq-warmup", 1).await?;
    floor_series(floor, 1).await?;
    for s in [&SEQ_5, &SEQ_10] {
        settle().await?;
        let with_pool = series(&pool.server, &format!("seq{}-pool", s.n), s.n).await?;
        settle().await?;
        let no_pool = series(&none.server, &format!("seq{}-none", s.n), s.n).await?;
        settle().await?;
        let engine = floor_series(floor, s.n).await?;
        fig.p50(s.p50, &with_pool, &no_pool);
        fig.p95(s.p95, &with_pool, &no_pool);
        fig.p50(s.p50_floor, &with_pool, &engine);
        fig.p50(s.no_pool, &no_pool, &engine);
    }
    Ok(())
}

/// `n` creates for new keys, each sent when the one before answered;
/// their sessions stopped after the last. The creates' times (ms).
async fn series(server: &Server, prefix: &str, n: usize) -> Res<Vec<f64>> {
    let (mut took, mut ids) = (vec![], vec![]);
    for i in 0..n {
        let (ms, id) = timed_create(server, json!({"sessionKey": format!("{prefix}-{i}")})).await?;
        took.push(ms);
        ids.push(id);
    }
    for id in &ids {
        stop(server, id).await?;
    }
    Ok(took)
}

/// The engine floor's create `n` times in a row, its containers removed
/// after the last, as [`series`] stops its sessions. The creates' times.
async fn floor_series(floor: &Floor, n: usize) -> Res<Vec<f64>> {
    let names: Vec<String> = (0..n)
        .map(|i| format!("{}-seqfloor{n}-{i}", floor.instance))
        .collect();
    let mut took = vec![];
    for name in &names {
        took.push(ms(floor.create(name).await?));
    }
    for name in &names {
        floor.remove(name).await?;
    }
    Ok(took)
}

/// One session of the rate burst, as it went.
struct Arrival {
    /// How late after its time it was sent (ms).
    late: f64,
    /// When its create answered.
    created: Instant,
    /// Time to first command (ms).
    first: f64,
}

/// New sessions at `rate` for 30 s, then 20 more, measured: each a
/// create, `exec true`, and its stop.
async fn at_a_rate(server: &Server, rate: &Rate, fig: &mut RunFigures) -> Res<()> {
    pool_full(server, 2, FILL).await?;
    let warmup = (WARMUP_FOR.as_millis() / rate.every.as_millis()) as usize;
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let at = |i: usize| start + rate.every * i as u32;
    let arrivals = (0..warmup + MEASURED).map(|i| async move {
        tokio::time::sleep_until(at(i)).await;
        let late = ms(at(i).elapsed());
        let sent = Instant::now();
        let f = first_command(server, json!({"sessionKey": format!("rate-{i}")})).await?;
        stop(server, &f.id).await?;
        Ok::<_, Box<dyn std::error::Error>>(Arrival {
            late,
            created: sent + Duration::from_secs_f64(f.create / 1000.0),
            first: f.first,
        })
    });
    // The claims before the first measured session is sent.
    let before = async {
        tokio::time::sleep_until(at(warmup) - Duration::from_millis(10)).await;
        (Instant::now(), claims(server).await)
    };
    let (mut arrivals, (read_at, before)) =
        futures_util::future::join(futures_util::future::join_all(arrivals), before).await;
    let (hits, misses) = before?;
    let (hits_after, misses_after) = claims(server).await?;
    let measured = arrivals.split_off(warmup);
    let name = rate.name;
    let warmup = succeeded(arrivals, &format!("burst at {name}, warm-up"), fig);
    let measured_count = measured.len();
    let measured = succeeded(measured, &format!("burst at {name}, the 20"), fig);
    let unanswered = warmup.iter().filter(|a| a.created > read_at).count();
    if unanswered > 0 {
        fig.note(format!(
            "burst at {name}: {unanswered} warm-up create(s) still unanswered when the claims were read count with the 20"
        ));
    }
    let latest = warmup
        .iter()
        .chain(&measured)
        .map(|a| a.late)
        .fold(0.0, f64::max);
    if latest > LATE_MS {
        fig.note(format!(
            "burst at {name}: a session was sent {latest:.1} ms after its time"
        ));
    }
    let (hit, miss) = (hits_after - hits, misses_after - misses);
    fig.value(rate.claims, 100.0 * hit / (hit + miss).max(1.0), None);
    fig.value(rate.failed, (measured_count - measured.len()) as f64, None);
    let first: Vec<f64> = measured.iter().map(|a| a.first).collect();
    fig.p99(rate.first_p99, &first, &[]);
    fig.p50(rate.first, &first, &[]);
    Ok(())
}

/// The sessions of `results` that went through; the others make a note
/// (how many failed, and the first one's error), named by `what`.
fn succeeded<T>(results: Vec<Res<T>>, what: &str, fig: &mut RunFigures) -> Vec<T> {
    let (mut ok, mut failed, mut first_error) = (vec![], 0, None);
    for r in results {
        match r {
            Ok(t) => ok.push(t),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    if let Some(e) = first_error {
        fig.note(format!(
            "{what}: {failed} session(s) failed, the first: {e}"
        ));
    }
    ok
}

/// 50 new sessions at once from a pool of 50 (also alone: `--only fifty`).
pub(crate) async fn all_at_once(floor: &Floor, fig: &mut RunFigures) -> Res<()> {
    let name = format!("{}-fifty", floor.instance);
    let t = Instant::now();
    let own = Instance::start(&floor.docker, &name, POOL_OF_50_CONFIG, 120).await?;
    let server = &own.server;
    pool_full(server, 50, FILL_50).await?;
    fig.value(FIFTY_FILL, ms(t.elapsed()), None);
    quiet(server, &floor.docker, &name).await?;
    let (hits, _) = claims(server).await?;
    let answers = futures_util::future::join_all(
        (0..50).map(|i| first_command(server, json!({"sessionKey": format!("fifty-{i}")}))),
    )
    .await;
    let (hits_after, _) = claims(server).await?;
    let answers = succeeded(answers, "burst of 50", fig);
    let first: Vec<f64> = answers.iter().map(|a| a.first).collect();
    let ids: HashSet<&str> = answers.iter().map(|a| a.id.as_str()).collect();
    if ids.len() < answers.len() {
        fig.note(format!(
            "burst of 50: {} sessions got only {} distinct sandboxes",
            answers.len(),
            ids.len()
        ));
    }
    // A claim counts only as a sandbox of its own (a failed session has
    // none).
    fig.value(
        FIFTY_CLAIMS,
        (hits_after - hits).min(ids.len() as f64),
        None,
    );
    fig.p99(FIFTY_FIRST_P99, &first, &[]);
    fig.p50(FIFTY_FIRST, &first, &[]);
    let create: Vec<f64> = answers.iter().map(|a| a.create).collect();
    fig.p99(FIFTY_CREATE_P99, &create, &[]);
    Ok(())
}
