//! What the layer reports: the metrics it emits, and its tracing.
//!
//! # Metrics
//!
//! The layer counts its decisions through the [`metrics`](https://docs.rs/metrics) facade, so
//! any recorder sees them; [`METRICS`] lists every metric it emits, and
//! [`describe_metrics`] gives their help texts and units to the installed recorder. With
//! `metrics-exporter-prometheus`, the two histograms need buckets to be histograms
//! in Prometheus (otherwise they are summaries):
//!
//! ```
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let prometheus = PrometheusBuilder::new()
//!     .set_buckets_for_metric(
//!         Matcher::Suffix("_seconds".into()),
//!         &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0],
//!     )?
//!     .install_recorder()?;
//! tower_ratelimit::telemetry::describe_metrics();
//! // Answer `GET /metrics` with `prometheus.render()`, outside the rate limit.
//! # let _ = prometheus.render();
//! # Ok(()) }
//! ```
//!
//! The repository's `dashboards/tower-ratelimit.json` is a Grafana dashboard of them all.
//! Metrics never carry a key: one series per client would overwhelm the backend. To see which
//! keys are limited, keep a [summary of them](crate::top).
//!
//! # Tracing
//!
//! Each decision is a `debug` span named `rate_limit`, a child of the request's span, with
//! these fields:
//!
//! | field | what |
//! |---|---|
//! | `policies` | the policies that applied, comma-separated |
//! | `outcome` | `allowed`, `delayed` (waits for a booked time), `limited`, `key_rejected`, or for a failed store `allowed` (failure policy open) or `unavailable` (closed) |
//! | `limited_by` | the policies that denied the request, shadow ones included |
//! | `wait_ms` | how long a `delayed` request waits |
//! | `store_us` | how long an asynchronous store (Redis) took to decide |
//! | `deny_cache` | `true` when the deny cache answered |
//! | `lease` | `true` when a lease held here admitted the request |
//! | `degraded`, `failure_policy` | why the store did not decide (`failed`, `timeout`, `circuit_open`), and what answered instead (`open`, `closed`, `local`, `lease`) |
//!
//! Nothing is logged at `info` or above per request. A failing store is logged at `warn` at
//! most once a second, with how many failures went by since; the breaker logs when it opens
//! and closes.

use tracing::Span;

use crate::decision::Decision;

/// The kind of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of values (in Prometheus, `_bucket`, `_sum` and `_count` series).
    Histogram,
}

/// One metric the layer emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Its kind.
    pub kind: MetricKind,
    /// The labels it carries.
    pub labels: &'static [&'static str],
    /// What it counts.
    pub help: &'static str,
}

const fn metric(
    name: &'static str,
    kind: MetricKind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        labels,
        help,
    }
}

/// Every metric the layer emits.
pub const METRICS: &[Metric] = &[
    metric(
        "ratelimit_decisions_total",
        MetricKind::Counter,
        &["policy", "outcome"],
        "Decisions per policy, made by the store or the local fallback; outcome is allowed, \
         limited or shadow_limited",
    ),
    metric(
        "ratelimit_degraded_total",
        MetricKind::Counter,
        &["reason", "failure_policy"],
        "Decisions the store did not make (reason failed, timeout or circuit_open), and what \
         answered instead (failure_policy open, closed, local or lease)",
    ),
    metric(
        "ratelimit_store_duration_seconds",
        MetricKind::Histogram,
        &[],
        "Time an asynchronous store (Redis) took to answer a decision, failures included",
    ),
    metric(
        "ratelimit_circuit_open",
        MetricKind::Gauge,
        &[],
        "1 while the circuit breaker keeps the store from being asked, 0 once it is closed",
    ),
    metric(
        "ratelimit_deny_cache_hits_total",
        MetricKind::Counter,
        &[],
        "Requests the deny cache answered 429 without asking the store",
    ),
    metric(
        "ratelimit_leases_total",
        MetricKind::Counter,
        &["policy"],
        "Leases the store granted to this instance",
    ),
    metric(
        "ratelimit_lease_units_returned_total",
        MetricKind::Counter,
        &["policy"],
        "Unspent units of ended leases given back to the store",
    ),
    metric(
        "ratelimit_requests_delayed_total",
        MetricKind::Counter,
        &["policy"],
        "Requests admitted at a later time, which waited for it (policy: the longest wait)",
    ),
    metric(
        "ratelimit_delay_seconds",
        MetricKind::Histogram,
        &["policy"],
        "How long delayed requests waited for their booked time",
    ),
    metric(
        "ratelimit_costs_clamped_total",
        MetricKind::Counter,
        &["policy", "reason"],
        "Real costs reported after a response that were not taken as reported (reason \
         too_large or negative: clamped; not_a_number or missing: the estimate kept)",
    ),
    metric(
        "ratelimit_reservations_released_total",
        MetricKind::Counter,
        &[],
        "Delayed requests whose client went away, whose booked times were given back",
    ),
    metric(
        "ratelimit_adaptive_limit",
        MetricKind::Gauge,
        &["policy"],
        "An adaptive concurrency limit: the requests it lets be in flight at once",
    ),
    metric(
        "ratelimit_adaptive_rtt_seconds",
        MetricKind::Histogram,
        &["policy"],
        "Round trips an adaptive concurrency limit learnt from, from admission to the end of \
         the response body",
    ),
    metric(
        "ratelimit_adaptive_shed_total",
        MetricKind::Counter,
        &["policy"],
        "Requests an adaptive concurrency limit shed (503), at once or when their wait in its \
         queue ran out",
    ),
    metric(
        "ratelimit_listed_total",
        MetricKind::Counter,
        &["list", "by"],
        "Requests the allow or deny lists decided (list allow or deny; by network, key or store: \
         an entry added at runtime)",
    ),
    metric(
        "ratelimit_body_rejected_total",
        MetricKind::Counter,
        &["code"],
        "Requests whose body could not be read as their policies need, answered without a \
         decision (code body_too_large, body_timeout, body_unreadable or body_not_json)",
    ),
    metric(
        "ratelimit_blocks_total",
        MetricKind::Counter,
        &["policy", "level"],
        "Blocks of keys that kept being denied (Policy::block_on_violation), by the level of \
         the block (1: the first)",
    ),
    metric(
        "ratelimit_near_limit_total",
        MetricKind::Counter,
        &["policy"],
        "Keys warned of near their limit (Policy::near_limit), once per key and window",
    ),
    metric(
        "ratelimit_late_replies_given_back_total",
        MetricKind::Counter,
        &[],
        "Decisions that came back after their deadline and took slots, a lease's units or \
         booked time, which were given back",
    ),
    metric(
        "ratelimit_near_limit_hook_dropped_total",
        MetricKind::Counter,
        &["policy"],
        "Warnings near the limit not handed to the on_near_limit hook, because 256 hooks were \
         running (counted, not queued)",
    ),
    metric(
        "ratelimit_messages_limited_total",
        MetricKind::Counter,
        &["policy", "direction", "answer"],
        "Messages of long-lived connections refused (streams::StreamLimiter), by the policy \
         over its limit (none: the lists, the store or the key refused), the direction \
         (inbound, outbound) and the answer (close or error)",
    ),
    metric(
        "ratelimit_connections_refused_total",
        MetricKind::Counter,
        &["policy", "at"],
        "Long-lived connections refused by a StreamLimiter's connections (at upgrade: answered \
         429 before upgrading) or by a LimitedListener (at listener: closed once accepted), by \
         the policy that refused them (none: the lists, the store or the key)",
    ),
    metric(
        "ratelimit_message_wait_seconds",
        MetricKind::Histogram,
        &["policy"],
        "Waits of messages over a limit whose answer waits, before they are decided again",
    ),
    metric(
        "ratelimit_egress_waited_total",
        MetricKind::Counter,
        &["policy"],
        "Outbound calls that waited for their booked time, by the policy that made them wait \
         longest",
    ),
    metric(
        "ratelimit_egress_wait_seconds",
        MetricKind::Histogram,
        &["policy"],
        "How long outbound calls waited for their booked time",
    ),
    metric(
        "ratelimit_egress_gave_up_total",
        MetricKind::Counter,
        &["policy", "reason"],
        "Outbound calls not sent (reason: limited, key_rejected, store_unavailable), by the \
         policy that refused them (none: the key or the store)",
    ),
    metric(
        "ratelimit_egress_upstream_refused_total",
        MetricKind::Counter,
        &["status"],
        "Outbound calls the upstream answered 429 or 503 (grpc-8, grpc-14: a gRPC server's \
         RESOURCE_EXHAUSTED, UNAVAILABLE)",
    ),
    metric(
        "ratelimit_egress_pauses_total",
        MetricKind::Counter,
        &["source"],
        "Pauses learned from an upstream's answers and kept in the store for every instance \
         (source: retry-after, grpc-retry-pushback, ratelimit, x-ratelimit)",
    ),
    metric(
        "ratelimit_egress_adapted_total",
        MetricKind::Counter,
        &["policy", "direction"],
        "Keys' limits lowered after a refusal that named no time (direction: down) or raised \
         back (up) by an egress layer's adaptive rate",
    ),
    metric(
        "ratelimit_egress_corrected_total",
        MetricKind::Counter,
        &["policy"],
        "Policies charged the units an upstream's remaining count says were spent by callers \
         the layer does not see",
    ),
    metric(
        "ratelimit_egress_retries_total",
        MetricKind::Counter,
        &[],
        "Outbound calls sent again by a RetryLayer after the time their upstream named",
    ),
];

/// Describes every metric of [`METRICS`] to the installed `metrics` recorder: help text, and
/// the unit of the histograms (seconds). Call it once, after installing the recorder.
pub fn describe_metrics() {
    for m in METRICS {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.help),
            MetricKind::Histogram => {
                metrics::describe_histogram!(m.name, metrics::Unit::Seconds, m.help)
            }
        }
    }
}

/// Whether a subscriber wants the decisions' spans: when not, a decision that nothing else
/// reads needs no span at all.
#[inline]
pub(crate) fn spans_enabled() -> bool {
    tracing::enabled!(tracing::Level::DEBUG)
}

/// The `debug` span of one decision: the policies that apply, what was decided, and how long
/// the store took. `Span::none()` unless a subscriber enables `debug` for this crate: a
/// disabled span of ten fields would still have its fields gathered for the `log` crate
/// when tracing's `log` feature is on (axum's default features turn it on), several hundred
/// instructions a request for nothing.
#[inline]
pub(crate) fn decision_span() -> Span {
    if !spans_enabled() {
        return Span::none();
    }
    tracing::debug_span!(
        "rate_limit",
        policies = tracing::field::Empty,
        outcome = tracing::field::Empty,
        limited_by = tracing::field::Empty,
        wait_ms = tracing::field::Empty,
        store_us = tracing::field::Empty,
        deny_cache = tracing::field::Empty,
        lease = tracing::field::Empty,
        degraded = tracing::field::Empty,
        failure_policy = tracing::field::Empty,
    )
}

/// Runs `f` on `span` only when it is enabled: recording a field looks it up by name.
#[inline(always)]
pub(crate) fn traced(span: &Span, f: impl FnOnce(&Span)) {
    if !span.is_disabled() {
        f(span);
    }
}

/// Records the `names` of the policies a decision asks in its span, if a subscriber wants it.
pub(crate) fn record_policies<'a>(span: &Span, names: impl Iterator<Item = &'a str>) {
    traced(span, |span| {
        let names: Vec<&str> = names.collect();
        span.record("policies", names.join(","));
    });
}

/// Records what `decision` says in its span: `outcome` (`allowed`, `delayed` or `limited`),
/// and the policies that denied it (shadow ones too) in `limited_by`.
pub(crate) fn record_outcome(span: &Span, decision: &Decision, waits: bool) {
    let wait = if waits {
        decision.wait()
    } else {
        Default::default()
    };
    let outcome = match (decision.is_allowed(), wait.is_zero()) {
        (false, _) => "limited",
        (true, false) => "delayed",
        (true, true) => "allowed",
    };
    span.record("outcome", outcome);
    if !wait.is_zero() {
        span.record("wait_ms", wait.as_millis() as u64);
    }
    let limited: Vec<&str> = decision
        .outcomes()
        .iter()
        .filter(|o| !o.is_allowed())
        .map(|o| o.policy())
        .collect();
    if !limited.is_empty() {
        span.record("limited_by", limited.join(","));
    }
}

/// Counts a block a policy that blocks on violation started, at `level`
/// (`ratelimit_blocks_total`), and traces it.
pub(crate) fn count_block(tier: &crate::policy::Tier, level: u32) {
    metrics::counter!(
        "ratelimit_blocks_total",
        "policy" => tier.label(),
        "level" => level.to_string()
    )
    .increment(1);
    tracing::info!(
        policy = tier.name(),
        level,
        "rate-limit key blocked on violation"
    );
}
