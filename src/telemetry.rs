//! Telemetry: Prometheus metrics and request ids. Domain code records
//! events through the small functions here (metric names live in one
//! place); the recorder is installed once, by the server, so tests that
//! build an `App` in-process record nothing and collide with nothing.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower_http::request_id::{MakeRequestId, RequestId};

/// Buckets (seconds) for request, create and command durations.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Installs the process-wide Prometheus recorder; None if one already is.
pub fn install() -> Option<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .ok()?
        .install_recorder()
        .ok()
}

/// A sandbox lifecycle event (created, reconnected, expired, evicted, ...).
pub fn sandbox_event(event: &'static str) {
    counter!("sandboxd_sandbox_events_total", "event" => event).increment(1);
}

/// How long a create that made a new sandbox took.
pub fn create_took(started: Instant) {
    histogram!("sandboxd_create_duration_seconds").record(started.elapsed().as_secs_f64());
}

/// A create made a sandbox: from the warm pool (a hit), or cold (a miss).
pub fn pool_claim(hit: bool) {
    let outcome = if hit { "hit" } else { "miss" };
    counter!("sandboxd_pool_claims_total", "outcome" => outcome).increment(1);
}

/// A create waited for a pool member being made: it was handed the member
/// (`claimed`, counted as a hit too), or its fill failed or ran late and
/// the create was made cold (`cold`, counted as a miss too).
pub fn pool_handoff(claimed: bool) {
    let outcome = if claimed { "claimed" } else { "cold" };
    counter!("sandboxd_pool_handoffs_total", "outcome" => outcome).increment(1);
}

/// What the pool gauges show of one runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGauge {
    /// Members ready to be claimed.
    pub ready: usize,
    /// Members being made.
    pub filling: usize,
    /// The size the pool aims for.
    pub target: usize,
    /// What set the target: one of `reasons`.
    pub reason: &'static str,
    /// Every reason there is (each gets a series, 1 for `reason`).
    pub reasons: &'static [&'static str],
}

/// How long making one warm pool member took.
pub fn pool_filled(started: Instant) {
    histogram!("sandboxd_pool_refill_duration_seconds").record(started.elapsed().as_secs_f64());
}

/// A checkpoint was made: how long it took, the bytes it stored anew and
/// the bytes it shares with what the store held.
pub fn checkpoint_made(started: Instant, new_bytes: u64, deduplicated_bytes: u64) {
    counter!("sandboxd_checkpoints_total").increment(1);
    counter!("sandboxd_checkpoint_stored_bytes_total").increment(new_bytes);
    counter!("sandboxd_checkpoint_deduplicated_bytes_total").increment(deduplicated_bytes);
    histogram!("sandboxd_checkpoint_duration_seconds").record(started.elapsed().as_secs_f64());
}

/// A checkpoint read `n` files `via` the host (the workspace's directory
/// there) or the agent.
pub fn checkpoint_files_read(via: &'static str, n: u64) {
    if n == 0 {
        return;
    }
    counter!("sandboxd_checkpoint_files_read_total", "via" => via).increment(n);
}

/// A workspace walked for a checkpoint, a restore or a diff, `via` the
/// host or the agent.
pub fn checkpoint_walked(via: &'static str) {
    counter!("sandboxd_checkpoint_walks_total", "via" => via).increment(1);
}

/// A terminal session opened.
pub fn pty_opened() {
    counter!("sandboxd_ptys_opened_total").increment(1);
}

/// A terminal session's process ended.
pub fn pty_ended() {
    counter!("sandboxd_ptys_ended_total").increment(1);
}

/// A command started.
pub fn command_started() {
    counter!("sandboxd_commands_started_total").increment(1);
}

/// A command ended; `outcome` is exit_zero, exit_nonzero, timeout or killed.
pub fn command_ended(outcome: &'static str, seconds: f64) {
    counter!("sandboxd_commands_ended_total", "outcome" => outcome).increment(1);
    histogram!("sandboxd_command_duration_seconds").record(seconds);
}

/// An MCP tool call answered; `outcome` is ok, tool_error or cancelled.
pub fn mcp_tool_call(tool: &'static str, outcome: &'static str) {
    counter!("sandboxd_mcp_tool_calls_total", "tool" => tool, "outcome" => outcome).increment(1);
}

/// The egress policy refused a sandbox's connection.
pub fn egress_denied(count: u64) {
    counter!("sandboxd_egress_denied_total").increment(count);
}

/// An engine call failed; `kind` is the error class.
pub fn engine_error(kind: &'static str) {
    counter!("sandboxd_engine_errors_total", "kind" => kind).increment(1);
}

/// Current gauges, set just before a scrape renders them; `pool` is each
/// pooled runtime's members and target, `links_ahead` how many link
/// networks are made ahead for the next `internet` sandboxes and how many
/// are kept, `teardowns` how many stopped sandboxes' engine objects are
/// still to remove.
pub fn set_gauges(
    sandboxes: usize,
    running_commands: usize,
    pool: &std::collections::BTreeMap<String, PoolGauge>,
    links_ahead: (usize, usize),
    teardowns: usize,
) {
    gauge!("sandboxd_sandboxes", "state" => "running").set(sandboxes as f64);
    gauge!("sandboxd_teardowns_pending").set(teardowns as f64);
    gauge!("sandboxd_link_networks_ready").set(links_ahead.0 as f64);
    gauge!("sandboxd_link_networks_wanted").set(links_ahead.1 as f64);
    gauge!("sandboxd_commands_running").set(running_commands as f64);
    for (runtime, p) in pool {
        for (state, n) in [("ready", p.ready), ("filling", p.filling)] {
            gauge!("sandboxd_pool_members", "runtime" => runtime.clone(), "state" => state)
                .set(n as f64);
        }
        gauge!("sandboxd_pool_target", "runtime" => runtime.clone()).set(p.target as f64);
        for reason in p.reasons {
            let holds = f64::from(u8::from(*reason == p.reason));
            gauge!("sandboxd_pool_target_reason", "runtime" => runtime.clone(), "reason" => *reason)
                .set(holds);
        }
    }
}

/// Counts every HTTP request by route template, method and status, and
/// times it. Route templates, not paths: ids would make unbounded labels.
pub async fn track_http(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    let started = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    counter!("sandboxd_http_requests_total", "route" => route.clone(), "method" => method.clone(), "status" => status)
        .increment(1);
    histogram!("sandboxd_http_request_duration_seconds", "route" => route, "method" => method)
        .record(started.elapsed().as_secs_f64());
    resp
}

/// Request ids: 16 random hex digits, unless the client sent one.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    /// None (the answer carries no id) when the OS random source fails.
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let id = crate::id::random_hex(8).ok()?;
        HeaderValue::from_str(&id).ok().map(RequestId::new)
    }
}
