//! What the store decided for one request.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::Verdict;
use crate::policy::Tier;
use crate::store::Listing;

/// The outcome of one policy for one request.
#[derive(Clone)]
pub struct PolicyOutcome {
    /// The policy's tier decided: its name, limit and window, shared with the layer.
    policy: Arc<Tier>,
    allowed: bool,
    shadow: bool,
    remaining: u64,
    /// Microseconds (kept as the store gives them: a `Duration` is made when read).
    reset_after_us: u64,
    /// [`NO_RETRY`] for none (an `Option` would make the outcome 8 bytes longer, and a
    /// decision keeps two inline).
    retry_after_us: u64,
    /// What was granted with this outcome (a lease, a booked time, concurrency slots), if
    /// the check asked for it and got units.
    grant: Option<Box<Grant>>,
}

/// What a store granted with a decision, for the operations that grant (`Op::grants`): a
/// lease's units (the request's cost among them) and its end; the units of a booked time
/// and that time; or the slots of a concurrency limit and when they were charged. `end` is on
/// the store's clock, `lasts_us` the microseconds from the decision until then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) units: u64,
    pub(crate) end: u64,
    pub(crate) lasts_us: u64,
}

impl Grant {
    pub(crate) fn new(units: u64, end: u64, lasts_us: u64) -> Self {
        Grant {
            units,
            end,
            lasts_us,
        }
    }
}

impl PartialEq for PolicyOutcome {
    fn eq(&self, other: &Self) -> bool {
        self.policy() == other.policy()
            && self.limit() == other.limit()
            && self.window() == other.window()
            && self.allowed == other.allowed
            && self.shadow == other.shadow
            && self.remaining == other.remaining
            && self.reset_after_us == other.reset_after_us
            && self.retry_after_us == other.retry_after_us
            && self.grant == other.grant
    }
}

impl Eq for PolicyOutcome {}

impl fmt::Debug for PolicyOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyOutcome")
            .field("policy", &self.policy())
            .field("allowed", &self.allowed)
            .field("shadow", &self.shadow)
            .field("limit", &self.limit())
            .field("window", &self.window())
            .field("remaining", &self.remaining)
            .field("reset_after", &self.reset_after())
            .field("retry_after", &self.retry_after())
            .field("grant", &self.grant)
            .finish()
    }
}

impl PolicyOutcome {
    #[inline]
    pub(crate) fn new(policy: &Arc<Tier>, shadow: bool, verdict: Verdict) -> Self {
        PolicyOutcome {
            policy: policy.clone(),
            allowed: verdict.allowed,
            shadow,
            remaining: verdict.remaining,
            reset_after_us: verdict.reset_after_us,
            // A concurrency slot frees when a request in flight ends: no time is known.
            retry_after_us: match verdict.retry_after_us {
                Some(us) if !policy.limits_in_flight() => us,
                _ => NO_RETRY,
            },
            grant: None,
        }
    }

    /// The same outcome with the lease granted with it, if any (none when it has no units).
    pub(crate) fn with_grant(mut self, grant: Option<Grant>) -> Self {
        self.grant = grant.filter(|g| g.units > 0).map(Box::new);
        self
    }

    /// The lease granted with this outcome, if any.
    pub(crate) fn grant(&self) -> Option<&Grant> {
        self.grant.as_deref()
    }

    /// An admission this policy gave but the decision did not charge (another policy denied):
    /// the state as it `stays` reported (as [`Verdict::uncharged`]).
    pub(crate) fn uncharged(&mut self, stays: Verdict) {
        self.remaining = stays.remaining;
        self.reset_after_us = stays.reset_after_us;
    }

    /// Counts `units` more as remaining (the units of a lease held by this instance).
    pub(crate) fn add_remaining(&mut self, units: u64) {
        self.remaining += units;
    }

    /// The policy tier this is the outcome of.
    pub(crate) fn tier(&self) -> &Arc<Tier> {
        &self.policy
    }

    /// The same denial, `wait` before the policy admits the request again.
    pub(crate) fn waiting(&self, wait: u64) -> Self {
        PolicyOutcome {
            remaining: 0,
            reset_after_us: self.reset_after_us.max(wait),
            retry_after_us: wait,
            ..self.clone()
        }
    }

    /// How long the request waits for the time this policy booked for it
    /// ([`Policy::wait_up_to`](crate::Policy::wait_up_to)): zero when it was admitted at once,
    /// or denied.
    pub fn wait(&self) -> Duration {
        match (&self.grant, self.policy.wait_us()) {
            (Some(g), 1..) => Duration::from_micros(g.lasts_us),
            _ => Duration::ZERO,
        }
    }

    /// The time this policy booked for the request, on the store's clock, with its units.
    pub(crate) fn booking(&self) -> Option<&Grant> {
        self.grant.as_deref().filter(|_| self.policy.wait_us() > 0)
    }

    /// The concurrency slots this policy gave the request, with when they were taken.
    pub(crate) fn held(&self) -> Option<&Grant> {
        self.grant
            .as_deref()
            .filter(|_| self.policy.limits_in_flight())
    }

    /// The policy's name.
    pub fn policy(&self) -> &str {
        self.policy.name()
    }

    /// Whether this policy admitted the request.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the policy runs in shadow mode: decided and reported, never enforced.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The window that goes with [`limit`](Self::limit): the quota's window, or for bucket
    /// algorithms the time in which the burst refills (`limit / window` is the real rate).
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.policy.algorithm().window_us())
    }

    /// The limit clients are told about: units per window, or the burst for bucket algorithms;
    /// for a request of a priority that may use only a share of the capacity
    /// ([`Reserve`](crate::policy::Reserve)), that share.
    pub fn limit(&self) -> u64 {
        self.policy.limit()
    }

    /// Units left: after this request if it was admitted, right now if it was not.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the key is back to a fresh, unused state.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }

    /// For a denied request, how long until the same request would be admitted; `None` when it
    /// was admitted, when it never can be (its cost exceeds the policy's capacity), or for a
    /// [concurrency](crate::Policy::concurrency) policy, whose slots free when requests in
    /// flight end, at a time no one knows.
    pub fn retry_after(&self) -> Option<Duration> {
        (self.retry_after_us != NO_RETRY).then(|| Duration::from_micros(self.retry_after_us))
    }
}

/// A decision's outcomes: two kept inline (one policy, or the usual two decided together),
/// more allocated.
pub(crate) type Outcomes = SmallVec<[PolicyOutcome; 2]>;

/// An outcome's `retry_after_us` when it has none.
const NO_RETRY: u64 = u64::MAX;

/// The decision for one request: one [`PolicyOutcome`] per policy that applied.
///
/// The layer puts it in the request's extensions, so handlers can read it (with axum, take it
/// as an extractor or with `Extension<Decision>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    outcomes: Outcomes,
    allowed: bool,
    /// What the key's runtime list entries said, when the store read them in the same call
    /// (then there are no outcomes: the policies were not decided); packed, to keep the
    /// decision of two policies within 120 bytes.
    listing: u32,
}

impl Decision {
    /// A decision from its outcomes: allowed when every enforced outcome is.
    pub(crate) fn new(outcomes: Outcomes) -> Self {
        let allowed = outcomes.iter().all(|o| o.allowed || o.shadow);
        Decision {
            outcomes,
            allowed,
            listing: 0,
        }
    }

    /// A decision of enforced outcomes whose verdict the caller knows: `allowed` when every
    /// outcome is.
    #[inline]
    pub(crate) fn enforced(outcomes: Outcomes, allowed: bool) -> Self {
        debug_assert_eq!(allowed, outcomes.iter().all(|o| o.allowed && !o.shadow));
        Decision {
            outcomes,
            allowed,
            listing: 0,
        }
    }

    /// A decision of one outcome (the common case: no loop, no push).
    #[inline]
    pub(crate) fn one(outcome: PolicyOutcome) -> Self {
        let allowed = outcome.allowed || outcome.shadow;
        let mut outcomes = Outcomes::new();
        outcomes.push(outcome);
        Decision {
            outcomes,
            allowed,
            listing: 0,
        }
    }

    /// The answer of a key's runtime entries, which the store read before any policy: no
    /// outcome.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn listed(listing: Listing) -> Self {
        Decision {
            outcomes: Outcomes::new(),
            allowed: true,
            listing: listing.pack(),
        }
    }

    /// What the key's runtime entries said, if the store read them in this decision's call.
    pub(crate) fn listing(&self) -> Listing {
        Listing::unpack(self.listing)
    }

    /// The outcomes, to update the leases' remaining units in.
    pub(crate) fn outcomes_mut(&mut self) -> &mut [PolicyOutcome] {
        &mut self.outcomes
    }

    /// The same decision without its first `n` outcomes (the checks a store call carried for
    /// other purposes: units given back).
    pub(crate) fn without_first(mut self, n: usize) -> Self {
        if n == 0 {
            return self;
        }
        self.outcomes.drain(..n.min(self.outcomes.len()));
        Decision::new(self.outcomes)
    }

    /// Whether the request may go on.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Every policy's outcome, in the order the policies were configured.
    pub fn outcomes(&self) -> &[PolicyOutcome] {
        &self.outcomes
    }

    /// The enforced policies that denied the request.
    pub fn violated(&self) -> impl Iterator<Item = &PolicyOutcome> {
        self.outcomes.iter().filter(|o| !o.allowed && !o.shadow)
    }

    /// The shadow policies that would have denied the request.
    pub fn shadow_violated(&self) -> impl Iterator<Item = &PolicyOutcome> {
        self.outcomes.iter().filter(|o| !o.allowed && o.shadow)
    }

    /// The tightest policy's outcome, which the legacy response headers describe: for a denied
    /// request, the violated policy with the longest wait; for an admitted one, the enforced
    /// policy with the fewest units left (any policy, if all are shadows).
    pub fn tightest(&self) -> &PolicyOutcome {
        let first = self
            .outcomes
            .iter()
            .find(|o| !o.shadow)
            .unwrap_or(&self.outcomes[0]);
        if self.allowed {
            self.outcomes
                .iter()
                .filter(|o| o.shadow == first.shadow)
                .fold(first, |b, o| if o.remaining < b.remaining { o } else { b })
        } else {
            // No retry time is the longest wait (`NO_RETRY` is the largest value).
            let wait = |o: &PolicyOutcome| o.retry_after_us;
            self.violated()
                .fold(None::<&PolicyOutcome>, |b, o| match b {
                    Some(b) if wait(b) >= wait(o) => Some(b),
                    _ => Some(o),
                })
                .unwrap_or(first)
        }
    }

    /// How long an admitted request waits before it goes on: the longest of its policies'
    /// [`wait`](PolicyOutcome::wait)s (zero for most requests).
    pub fn wait(&self) -> Duration {
        self.outcomes
            .iter()
            .map(PolicyOutcome::wait)
            .max()
            .unwrap_or_default()
    }

    /// For a denied request, how long until every violated policy would admit it; `None` when
    /// it was admitted or can never be.
    pub fn retry_after(&self) -> Option<Duration> {
        if self.allowed {
            return None;
        }
        self.violated()
            .map(|o| o.retry_after())
            .try_fold(Duration::ZERO, |acc, r| r.map(|r| acc.max(r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_keeps_two_outcomes_in_120_bytes() {
        // Two outcomes inline: a decision of two policies allocates nothing. An outcome is 48
        // bytes (no retry time is `NO_RETRY`, not an `Option`), so that the decision of one
        // policy, moved from the store to the caller, stays short.
        assert!(
            size_of::<PolicyOutcome>() <= 48,
            "{}",
            size_of::<PolicyOutcome>()
        );
        assert!(size_of::<Decision>() <= 120, "{}", size_of::<Decision>());
        assert_eq!(Outcomes::new().inline_size(), 2);
    }
}
