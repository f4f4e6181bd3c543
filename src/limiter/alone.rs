//! The one-policy shortcut of [`Limiter::begin`]: a request of one policy that nothing else
//! has a say in (no charge after the response, no lease, no reserved or held slot, no deny
//! cache or fallback), on a store that decides it at once on borrowed values (the memory
//! store), is decided before anything else is planned: no `Check`, no ticket, no tier or key
//! cloned, and no `Decision` when nothing reads one.

use std::sync::Arc;

use super::{Begin, Charges, Limiter, Settled};
use crate::algorithm::Verdict;
use crate::decision::{Decision, PolicyOutcome};
use crate::headers::{HeaderStyle, RateLimitHeaders};
use crate::key::{Key, RequestRef};
use crate::policy::{CompiledPolicy, Tier};
use crate::store::{Keyed, Store};
use crate::telemetry::{decision_span, spans_enabled, traced};

impl<St: Store> Limiter<St> {
    /// Whether the requests of `policy`, the only one, are decided alone: on the borrowed
    /// tier and key, by a store that can (the memory store), with nothing else to say (no
    /// charge after the response, no lease, no reserved or held slot, no deny cache or
    /// fallback). Read once a request, before anything is planned.
    #[inline(always)]
    pub(super) fn alone(&self, policy: &CompiledPolicy) -> bool {
        St::DECIDES_ALONE
            && policy.up_front()
            && self.plain()
            && self.leases().is_none()
            && !self.waits()
            && !self.holds()
    }

    /// The request of one policy decided alone (see [`alone`](Self::alone)): no check or
    /// ticket is made, no tier or key is cloned.
    #[inline(always)]
    pub(super) fn begin_alone(
        &self,
        policy: &CompiledPolicy,
        request: &RequestRef<'_>,
        policies: &[CompiledPolicy],
    ) -> Begin<St::Future> {
        if !policy.applies(request) {
            return Begin::Unlimited;
        }
        let key = match policy.key(request) {
            Ok(key) => key,
            Err(rejection) => return self.key_rejected(policy, &rejection),
        };
        let tier = policy.tier(policy.tier_index(request, &key));
        let cost = policy.cost(request);
        match self.store.decide_enforced(tier, &key, cost) {
            Some((verdict, own)) => {
                self.decided_alone(own.as_ref().unwrap_or(tier), &key, cost, verdict)
            }
            // A store that says it decides alone always does; were it not to, the general way.
            None => self.plan(request, policies),
        }
    }

    /// The verdict of a request decided alone: the headers of an admitted request made from
    /// it directly where nothing else reads it, else its `Decision` settled the general way.
    #[inline(always)]
    fn decided_alone(
        &self,
        tier: &Arc<Tier>,
        key: &Key,
        cost: u64,
        verdict: Verdict,
    ) -> Begin<St::Future> {
        if verdict.allowed
            && !self.decision_extension
            && !self.headers.writes_ietf()
            && !spans_enabled()
        {
            return self.admitted_alone(tier, &verdict);
        }
        let span = decision_span();
        let _entered = span.enter();
        traced(&span, |span| {
            span.record("policies", tier.name());
        });
        let decision = Decision::one(PolicyOutcome::new(tier, false, verdict));
        let keys = self
            .needs_keys()
            .then(|| vec![Keyed::new(tier.id(), key.clone(), cost)]);
        let (settled, after) = self.finish(decision, Charges::new(), keys.as_deref(), false, &span);
        Begin::Settled(settled, after)
    }

    /// A request its one policy admitted when nothing reads the decision but the
    /// `X-RateLimit-*` headers (no extension, no IETF fields, no span): no `Decision` is made.
    #[inline(always)]
    fn admitted_alone(&self, tier: &Tier, verdict: &Verdict) -> Begin<St::Future> {
        tier.count(true, false);
        let headers = (self.headers.style != HeaderStyle::None).then(|| {
            let now = || self.clock.now_micros();
            let (remaining, reset) = (verdict.remaining, verdict.reset_after_us);
            RateLimitHeaders::admitted_one(
                &self.headers,
                now,
                tier.limit_header(),
                remaining,
                reset,
            )
        });
        Begin::Settled(
            Settled::Call {
                headers,
                decision: None,
                held: None,
            },
            Charges::new(),
        )
    }
}
