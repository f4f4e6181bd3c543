//! [`Policy::adaptive_concurrency`]: a policy decided in this process by an adaptive limit of
//! requests in flight (`crate::adaptive`), never in the store.

use std::num::NonZeroU32;
use std::sync::Arc;

use super::builder::{DEFAULT_MAX_DURATION, Policy};
use crate::adaptive::Adaptive;
use crate::algorithm::Algorithm;
use crate::error::ConfigError;
use crate::quota::Quota;
use crate::store::Op;

impl Policy {
    /// At most as many requests in flight at once as an [`Adaptive`] limit says, moved by what
    /// completed requests took: the service's own latency, not a number chosen in advance,
    /// decides how much it takes. A request over the limit gets `503` (the IETF problem type
    /// `temporary-reduced-capacity`, `Retry-After: 1`), or waits in the limit's queue if it has
    /// one. It holds its place until its response body ends, as a concurrency limit's slot.
    ///
    /// Decided in this process, never in the store: latency is what this instance saw, so
    /// each instance learns its own limit. Its key is the whole policy (one limit for the
    /// requests it applies to: a [route](Self::route), or all) unless it is given one
    /// ([`key`](Self::key): a limit per client). Not with tiers, leases, waits, a shadow,
    /// status charges or refunds, settled costs or a reserve: an error of
    /// [`build`](crate::RateLimitLayerBuilder::build). Metrics:
    /// `ratelimit_adaptive_limit{policy}` (gauge), `ratelimit_adaptive_rtt_seconds{policy}`
    /// (histogram of the round trips it learnt from), `ratelimit_adaptive_shed_total{policy}`.
    pub fn adaptive_concurrency(adaptive: Adaptive) -> Self {
        // Its tier is a nominal one, of its highest limit: never sent to a store.
        let mut policy = Self::new(Algorithm::SlidingLog, Quota::per_minute(NonZeroU32::MIN));
        policy.quota = Quota::new(adaptive.most().max(1), DEFAULT_MAX_DURATION)
            .map_err(|e| ConfigError::new(format!("adaptive concurrency: {e}")));
        policy.key = Some(Arc::new(crate::key::GlobalKey));
        policy.adaptive = Some(adaptive);
        policy
    }

    /// What an adaptive concurrency policy cannot have, checked: it is decided in this
    /// process, on its own.
    pub(super) fn check_adaptive(&self) -> Result<(), ConfigError> {
        let Some(adaptive) = &self.adaptive else {
            return Ok(());
        };
        adaptive.validate()?;
        let conflict = [
            (
                !matches!(self.takes, Ok(Op::Enforce)),
                "a second way to take part",
            ),
            (self.lease.is_some(), "leases"),
            (!self.tiers.is_empty(), "tiers"),
            (self.refund_if.is_some(), "refund_if"),
            (self.settle.is_some(), "a settled cost"),
            (self.reserve.is_some(), "a reserve"),
            (self.burst.is_some(), "a burst"),
            (self.calendar.is_some(), "a calendar"),
        ];
        match conflict.iter().find(|(found, _)| *found) {
            Some((_, what)) => Err(ConfigError::new(format!(
                "an adaptive concurrency policy is decided in this process, on its own; it takes no {what}"
            ))),
            None => Ok(()),
        }
    }
}
