//! The lanes of [`Limiter::begin`] on borrowed values ([`Lane::Alone`](super::route::Lane::Alone), [`Lane::Together`](super::route::Lane::Together)):
//! requests of policies enforced up front that nothing else has a say in, on a store that
//! decides at once (the memory store), decided before anything else is planned: no `Check`,
//! no ticket, no tier or key cloned, and for one policy no `Decision` when nothing reads one.

use std::sync::Arc;

use smallvec::SmallVec;

use arc_swap::Guard;

use super::route::{Lane, Loaded, Route, Steps};
use super::{Go, Limiter, Next};
use crate::adaptive::Permits;
use crate::algorithm::Verdict;
use crate::decision::{Decision, PolicyOutcome};
use crate::error::KeyRejection;
use crate::headers::{HeaderStyle, RateLimitHeaders};
use crate::key::{Key, RequestRef};
use crate::policy::{CompiledPolicy, Tier};
use crate::store::{Check, Enforced, Op, Store, TOGETHER};
use crate::telemetry::{decision_span, record_policies, spans_enabled, traced};

/// The key of a connection's messages, taken once ([`Limiter::keyed`]), its hash in the store
/// (when the store hashes keys), and the policies it was taken with (`None`: those the layer
/// was built with).
pub(crate) struct Keyed {
    route: Option<Arc<Route>>,
    key: Key,
    hash: Option<u64>,
}

impl<St: Store> Limiter<St> {
    /// A request of [`Lane::Alone`](super::route::Lane::Alone): no check or ticket is made, no tier or key is cloned.
    #[inline(always)]
    pub(super) fn begin_alone(
        &self,
        policy: &CompiledPolicy,
        request: &RequestRef<'_>,
        route: &Route,
    ) -> Next<St::Future> {
        if !policy.applies(request) {
            return Next::nothing();
        }
        let key = match policy.key(request) {
            Ok(key) => key,
            Err(rejection) => return self.key_rejected(policy, rejection),
        };
        let (tier, cost) = match Self::priced(policy, request, &key) {
            Ok(priced) => priced,
            Err(rejection) => return self.key_rejected(policy, rejection),
        };
        match self.store.check_alone(tier, &key, None, cost) {
            Some((verdict, own)) => {
                let tier = own.as_ref().unwrap_or(tier);
                // A connection's message: nothing reads its decision or its headers.
                let quiet = request.is_message();
                self.answer_alone(tier, &key, cost, verdict, route.steps(), quiet)
            }
            // A store that says it decides alone always does; were it not to, the general way.
            None => self.plan(request, route, None),
        }
    }

    /// The key of a connection's messages, taken once when it opens (keyed as the request
    /// that opened it), when its route decides in [`Lane::Alone`](super::route::Lane::Alone):
    /// each message then pays for no key (`begin_keyed`).
    pub(crate) fn keyed(&self, request: &RequestRef<'_>) -> Option<Keyed> {
        let loaded = self.policies.load();
        if loaded.lane() != Lane::Alone {
            return None;
        }
        let key = loaded[0].key(request).ok()?;
        let hash = self.store.key_hash(&key);
        let route = match loaded {
            Loaded::First(_) => None,
            Loaded::Reloaded(guard) => Some(Guard::into_inner(guard)),
        };
        Some(Keyed { route, key, hash })
    }

    /// [`begin`](Limiter::begin) for a message of a connection `keyed`: its key as taken,
    /// while the policies are those it was taken with (after a reload, the general way).
    /// `None`: admitted, with nothing more to do (nothing reads a message's decision or
    /// headers).
    pub(crate) fn begin_keyed(
        &self,
        keyed: &Keyed,
        request: &RequestRef<'_>,
        permits: &mut Permits,
    ) -> Option<Next<St::Future>> {
        if self.exempt.as_ref().is_some_and(|f| f(request)) {
            return Some(Next::nothing());
        }
        let route = self.policies.load();
        let same = match (&route, &keyed.route) {
            (Loaded::First(_), None) => true,
            (Loaded::Reloaded(now), Some(then)) => Arc::ptr_eq(now, then),
            _ => false,
        };
        if !same {
            return Some(self.go(request, &route, permits));
        }
        let mut listed = None;
        if let Some(answer) = self.steps_before(request, &route, permits, &mut listed) {
            return Some(answer);
        }
        let (policy, key) = (&route[0], &keyed.key);
        if !policy.applies(request) {
            return Some(Next::nothing());
        }
        let (tier, cost) = match Self::priced(policy, request, key) {
            Ok(priced) => priced,
            Err(rejection) => return Some(self.key_rejected(policy, rejection)),
        };
        // An admission is told without its verdict: nothing reads it.
        if let Some(hash) = keyed.hash
            && !spans_enabled()
            && self.store.admits_alone(tier, key, hash, cost)
        {
            tier.count(true, false);
            return None;
        }
        match self.store.check_alone(tier, key, keyed.hash, cost) {
            Some((verdict, own)) => {
                let tier = own.as_ref().unwrap_or(tier);
                Some(self.answer_alone(tier, key, cost, verdict, route.steps(), true))
            }
            None => Some(self.plan(request, &route, None)),
        }
    }

    /// The tier and the cost of `request` keyed `key` in `policy`, or what its cost rejected.
    #[inline(always)]
    fn priced<'p>(
        policy: &'p CompiledPolicy,
        request: &RequestRef<'_>,
        key: &Key,
    ) -> Result<(&'p Arc<Tier>, u64), KeyRejection> {
        let tier = policy.tier(policy.tier_index(request, key));
        Ok((tier, policy.cost(request)?))
    }

    /// A request of [`Lane::Together`](super::route::Lane::Together): the policies that apply decided together on their
    /// borrowed tiers and keys (no check or ticket is made).
    pub(super) fn begin_together(
        &self,
        request: &RequestRef<'_>,
        route: &Route,
        packed: bool,
    ) -> Next<St::Future> {
        let mut keys: SmallVec<[(&Arc<Tier>, Key, u64); TOGETHER]> = SmallVec::new();
        for policy in route.iter().filter(|p| p.applies(request)) {
            let key = match policy.key(request) {
                Ok(key) => key,
                Err(rejection) => return self.key_rejected(policy, rejection),
            };
            let tier = policy.tier(policy.tier_index(request, &key));
            let cost = match policy.cost(request) {
                Ok(cost) => cost,
                Err(rejection) => return self.key_rejected(policy, rejection),
            };
            keys.push((tier, key, cost));
        }
        if keys.is_empty() {
            return Next::nothing();
        }
        let mut together: SmallVec<[Enforced<'_>; TOGETHER]> = SmallVec::new();
        for (tier, key, cost) in &keys {
            together.push((tier, key, *cost));
        }
        let Some(decision) = self.store.check_together(&together, packed) else {
            // As `begin_alone`: a store that says it decides at once always does.
            return self.plan(request, route, None);
        };
        let span = decision_span();
        let _entered = span.enter();
        record_policies(&span, keys.iter().map(|(tier, ..)| tier.name()));
        let steps = route.steps();
        let kept = steps.keeps_checks().then(|| {
            let kept = keys.iter().map(|(tier, key, cost)| {
                Check::new(Arc::clone(tier), key.clone(), *cost, Op::Enforce)
            });
            kept.collect::<Vec<_>>()
        });
        self.finish(decision, Vec::new(), kept.as_deref(), false, &span, steps)
    }

    /// The verdict of a request decided alone: the headers of an admitted request made from
    /// it directly where nothing else reads it (none for a `quiet` one, a connection's
    /// message), else its `Decision` settled the general way.
    #[inline(always)]
    fn answer_alone(
        &self,
        tier: &Arc<Tier>,
        key: &Key,
        cost: u64,
        verdict: Verdict,
        steps: Steps,
        quiet: bool,
    ) -> Next<St::Future> {
        if verdict.allowed
            && (quiet || !self.decision_extension && !self.headers.writes_ietf())
            && !spans_enabled()
        {
            return self.admitted_alone(tier, &verdict, quiet);
        }
        let span = decision_span();
        let _entered = span.enter();
        traced(&span, |span| {
            span.record("policies", tier.name());
        });
        let decision = Decision::one(PolicyOutcome::new(tier, false, verdict));
        let keys = (steps.keeps_checks())
            .then(|| vec![Check::new(tier.clone(), key.clone(), cost, Op::Enforce)]);
        self.finish(decision, Vec::new(), keys.as_deref(), false, &span, steps)
    }

    /// A request its one policy admitted when nothing reads the decision but the
    /// `X-RateLimit-*` headers (no extension, no IETF fields, no span; none at all when
    /// `quiet`): no `Decision` is made.
    #[inline(always)]
    fn admitted_alone(&self, tier: &Tier, verdict: &Verdict, quiet: bool) -> Next<St::Future> {
        tier.count(true, false);
        let headers = (!quiet && self.headers.style != HeaderStyle::None).then(|| {
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
        Next::Call(Go {
            headers,
            decision: None,
            held: None,
            after: Vec::new(),
        })
    }
}
