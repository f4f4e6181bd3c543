//! Adaptive concurrency: an in-flight limit that finds itself ([`Adaptive`]), moved by what
//! completed requests took. `learn.rs` is how the limit moves (Gradient2, AIMD); `limits.rs`
//! the limits of a policy's keys in this process, and the permits requests hold.

mod learn;
mod limits;

use std::time::Duration;

use crate::error::ConfigError;

pub(crate) use limits::{AdaptiveLimits, AdaptivePermit, Admission};

/// The permits a request holds, of the adaptive limits that admitted it.
pub(crate) type Permits = Vec<AdaptivePermit>;

/// How an adaptive limit moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Rule {
    /// The long-term round trip against the short-term, with a tolerance.
    Gradient2 {
        tolerance: f64,
        smoothing: f64,
        long_window: u32,
    },
    /// Failures and slow requests multiply the limit by `backoff`; successes add one a round
    /// trip. A request is slow past `timeout_us` when set, else when it took more than
    /// `tolerance` times the unloaded round trip (see `Learner`).
    Aimd {
        backoff: f64,
        timeout_us: Option<u64>,
        tolerance: f64,
    },
}

/// An adaptive concurrency limit ([`Policy::adaptive_concurrency`](crate::Policy::adaptive_concurrency)):
/// how many requests may be in flight at once, moved by what completed requests took.
///
/// Two rules move it, as Netflix's concurrency-limits and Envoy's adaptive concurrency do:
///
/// - [`gradient2`](Self::gradient2): every window of samples (a second and 10 requests at
///   least), the mean round trip of the window (the short term) is compared with a slow
///   average of the windows (the long term). While the short term stays within
///   [`tolerance`](Self::tolerance) (1.5) times the long term, the limit grows by its square
///   root, smoothed; past it, it shrinks in proportion, by half at most. The service's
///   latency rising with its load is what holds the limit back, before errors show.
/// - [`aimd`](Self::aimd): a request that fails (an error, a `5xx`) or is slow multiplies the
///   limit by [`backoff`](Self::backoff) (0.5); each success adds its share of one, so the
///   limit grows by one a round trip. Slow is longer than [`timeout`](Self::timeout) when it
///   is set, else more than [`tolerance`](Self::tolerance) (2.0) times the unloaded round
///   trip (the least seen, forgotten slowly) and a millisecond more: an overloaded service
///   answers slowly before it fails. Slow requests that began before the limit last moved
///   down for one were in the same queue, and move it no further.
///
/// Either way the limit stays within [`min`](Self::min) and [`max`](Self::max), starting from
/// [`initial`](Self::initial), and a window whose requests never reached half the limit
/// leaves it as it is. A limit is per instance by nature: latency is what this process saw,
/// so it is never shared through the store. A request over the limit is answered `503`
/// (the IETF problem type `temporary-reduced-capacity`, with `Retry-After: 1`), or waits in
/// a bounded [`queue`](Self::queue) for a request in flight to end.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::{policy::Adaptive, Policy, RateLimitLayer};
///
/// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
/// let layer = RateLimitLayer::builder()
///     .policy(
///         Policy::adaptive_concurrency(Adaptive::gradient2().min(4).max(256))
///             .name("backend")
///             .path("/work"),
///     )
///     .build()?;
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    rule: Rule,
    initial: Option<u32>,
    min: u32,
    max: u32,
    queue: Option<(u32, Duration)>,
}

impl Adaptive {
    /// Gradient2 (tolerance 1.5, smoothing 0.2, a long-term average over 600 windows), from
    /// 4 to 1,000 requests in flight, starting at the minimum.
    pub fn gradient2() -> Self {
        Self::of(Rule::Gradient2 {
            tolerance: 1.5,
            smoothing: 0.2,
            long_window: 600,
        })
    }

    /// AIMD (backoff 0.5; a request slower than twice the unloaded round trip counts as a
    /// failure), from 4 to 1,000 requests in flight, starting at the minimum.
    pub fn aimd() -> Self {
        Self::of(Rule::Aimd {
            backoff: 0.5,
            timeout_us: None,
            tolerance: 2.0,
        })
    }

    fn of(rule: Rule) -> Self {
        Adaptive {
            rule,
            initial: None,
            min: 4,
            max: 1_000,
            queue: None,
        }
    }

    /// The limit it starts from (the minimum unless set). Start low: a limit learns the
    /// unloaded round trip from its first windows.
    #[must_use]
    pub fn initial(mut self, limit: u32) -> Self {
        self.initial = Some(limit);
        self
    }

    /// The lowest it goes (at least 1; 4 unless set).
    #[must_use]
    pub fn min(mut self, limit: u32) -> Self {
        self.min = limit;
        self
    }

    /// The highest it goes (1,000 unless set).
    #[must_use]
    pub fn max(mut self, limit: u32) -> Self {
        self.max = limit;
        self
    }

    /// How much longer than usual a round trip may be (at least 1.0). Gradient2: the
    /// short-term round trip against the long term, before the limit shrinks (1.5 unless
    /// set). AIMD without a [`timeout`](Self::timeout): one request's round trip against the
    /// unloaded one, before it counts as a failure (2.0 unless set).
    #[must_use]
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        match &mut self.rule {
            Rule::Gradient2 { tolerance: t, .. } | Rule::Aimd { tolerance: t, .. } => {
                *t = tolerance;
            }
        }
        self
    }

    /// AIMD: what a failure or a timeout multiplies the limit by (above 0, below 1; 0.5
    /// unless set).
    #[must_use]
    pub fn backoff(mut self, ratio: f64) -> Self {
        if let Rule::Aimd { backoff, .. } = &mut self.rule {
            *backoff = ratio;
        }
        self
    }

    /// AIMD: a request that takes longer counts as a failure. Unless set, a request slower
    /// than [`tolerance`](Self::tolerance) times the unloaded round trip (the least seen,
    /// forgotten slowly) and a millisecond more does: an overloaded service answers slowly
    /// before it answers with errors.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        if let Rule::Aimd { timeout_us, .. } = &mut self.rule {
            *timeout_us = Some(u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX));
        }
        self
    }

    /// A request over the limit waits, up to `max_wait`, for a request in flight to end,
    /// with at most `size` waiting at once (the others are answered `503` at once).
    #[must_use]
    pub fn queue(mut self, size: u32, max_wait: Duration) -> Self {
        self.queue = Some((size, max_wait));
        self
    }

    /// The highest it goes.
    pub(crate) fn most(&self) -> u32 {
        self.max
    }

    /// The limit it starts from.
    fn start(&self) -> u32 {
        self.initial.unwrap_or(self.min)
    }

    /// Checked: bounds in order, a tolerance of at least 1, a backoff within (0, 1), a
    /// timeout, a queue of at least one request waiting at most an hour.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let fail = |what: String| Err(ConfigError::new(format!("adaptive concurrency: {what}")));
        let (min, max, start) = (self.min, self.max, self.start());
        if min == 0 || min > max || !(min..=max).contains(&start) {
            return fail(format!(
                "the limits must be 1 <= min <= initial <= max (got min {min}, initial {start}, max {max})"
            ));
        }
        match self.rule {
            Rule::Gradient2 { tolerance, .. } | Rule::Aimd { tolerance, .. }
                if !(tolerance >= 1.0 && tolerance.is_finite()) =>
            {
                return fail(format!(
                    "the tolerance must be at least 1.0 (got {tolerance})"
                ));
            }
            Rule::Aimd { backoff, .. } if !(backoff > 0.0 && backoff < 1.0) => {
                return fail(format!(
                    "the backoff must be above 0 and below 1 (got {backoff})"
                ));
            }
            Rule::Aimd {
                timeout_us: Some(0),
                ..
            } => return fail("the timeout must not be zero".into()),
            _ => {}
        }
        match self.queue {
            Some((0, _)) => fail("a queue holds at least one request".into()),
            Some((_, wait)) if wait.is_zero() || wait > Duration::from_secs(3600) => fail(format!(
                "a queue's wait is above zero and at most an hour (got {wait:?})"
            )),
            _ => Ok(()),
        }
    }
}
