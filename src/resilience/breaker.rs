//! The circuit breaker.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Stops asking a failing store for a while.
///
/// After `failures` decisions in a row have failed (errors or missed deadlines), the breaker
/// opens: for `open_for`, decisions go straight to the
/// [`FailurePolicy`](crate::FailurePolicy) without calling the store, so a dead Redis costs no
/// latency. Then one decision is let through as a probe: if it succeeds the breaker closes,
/// if it fails the breaker opens again.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::CircuitBreaker;
///
/// let breaker = CircuitBreaker::new(5, Duration::from_secs(1));
/// assert_eq!(breaker, CircuitBreaker::default());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CircuitBreaker {
    failures: u32,
    open_for: Duration,
}

impl CircuitBreaker {
    /// Opens after `failures` failures in a row (at least 1), for `open_for`.
    pub const fn new(failures: u32, open_for: Duration) -> Self {
        CircuitBreaker {
            failures: if failures == 0 { 1 } else { failures },
            open_for,
        }
    }
}

impl Default for CircuitBreaker {
    /// Opens after 5 failures in a row, for 1 second.
    fn default() -> Self {
        CircuitBreaker::new(5, Duration::from_secs(1))
    }
}

/// The breaker's state, shared by every clone of a layer.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: CircuitBreaker,
    failures: AtomicU32,
    /// While non-zero: the breaker is open until this time (microseconds, layer clock). A
    /// probe moves it one period on, so that there is one probe per period, and a probe that
    /// never reports (its request was dropped) cannot keep the breaker open for good.
    open_until: AtomicU64,
}

/// What the breaker says about one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Ask the store.
    Call,
    /// Ask the store: this decision is the probe.
    Probe,
    /// Do not ask the store.
    Reject,
}

impl Breaker {
    pub(crate) fn new(config: CircuitBreaker) -> Self {
        Breaker {
            config,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    /// `now` is only called when the breaker is open.
    pub(crate) fn gate(&self, now: impl FnOnce() -> u64) -> Gate {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Gate::Call;
        }
        let now = now();
        if now < until {
            return Gate::Reject;
        }
        match self.open_until.compare_exchange(
            until,
            self.reopen_at(now),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Gate::Probe,
            Err(_) => Gate::Reject,
        }
    }

    pub(crate) fn success(&self, gate: Gate) {
        // Read first: a write on every decision would bounce this line between cores.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Release);
        }
        if gate == Gate::Probe || self.open_until.load(Ordering::Acquire) != 0 {
            self.open_until.store(0, Ordering::Release);
            tracing::info!("rate-limit store is back; circuit breaker closed");
            metrics::gauge!("ratelimit_circuit_open").set(0.0);
        }
    }

    pub(crate) fn failure(&self, gate: Gate, now: u64) {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if gate == Gate::Probe || failures >= self.config.failures {
            if self.open_until.swap(self.reopen_at(now), Ordering::AcqRel) == 0 {
                tracing::warn!(
                    failures,
                    open_for = ?self.config.open_for,
                    "rate-limit store keeps failing; circuit breaker open"
                );
            }
            metrics::gauge!("ratelimit_circuit_open").set(1.0);
        }
    }

    /// The end of an open period starting at `now`.
    fn reopen_at(&self, now: u64) -> u64 {
        now + (self.config.open_for.as_micros() as u64).max(1)
    }

    #[cfg(test)]
    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_probes_and_closes() {
        let b = Breaker::new(CircuitBreaker::new(2, Duration::from_micros(100)));
        assert_eq!(b.gate(|| 0), Gate::Call);
        b.failure(Gate::Call, 0);
        assert_eq!(b.gate(|| 1), Gate::Call);
        b.failure(Gate::Call, 1);
        assert!(b.is_open());
        assert_eq!(b.gate(|| 50), Gate::Reject);
        assert_eq!(b.gate(|| 101), Gate::Probe);
        assert_eq!(b.gate(|| 101), Gate::Reject, "one probe at a time");
        b.failure(Gate::Probe, 101);
        assert_eq!(
            b.gate(|| 150),
            Gate::Reject,
            "a failed probe opens it again"
        );
        assert_eq!(b.gate(|| 201), Gate::Probe);
        b.success(Gate::Probe);
        assert!(!b.is_open());
        assert_eq!(b.gate(|| 202), Gate::Call);
        b.failure(Gate::Call, 203);
        assert_eq!(
            b.gate(|| 204),
            Gate::Call,
            "the count restarted after success"
        );
    }

    #[test]
    fn a_probe_that_never_reports_does_not_keep_it_open() {
        let b = Breaker::new(CircuitBreaker::new(1, Duration::from_micros(100)));
        b.failure(Gate::Call, 0);
        assert_eq!(b.gate(|| 100), Gate::Probe);
        // The probe's request is dropped: neither success nor failure is reported.
        assert_eq!(b.gate(|| 150), Gate::Reject);
        assert_eq!(
            b.gate(|| 200),
            Gate::Probe,
            "the next period brings a probe"
        );
        b.success(Gate::Probe);
        assert_eq!(b.gate(|| 201), Gate::Call);
    }
}
