//! The engine's loops over a route's steps ([`Route`]): before the decision, and on a decision
//! that admitted the request.

use super::route::{After, Before, Given, Lane, Route, Steps};
use super::{AfterResponse, Go, Limiter, Next};
use crate::adaptive::Permits;
use crate::body::BodyGuard;
use crate::decision::{Decision, PolicyOutcome};
use crate::headers::RateLimitHeaders;
use crate::key::{Key, RequestRef};
use crate::store::{Check, Store};

impl<St: Store> Limiter<St> {
    /// The route's steps before the decision for `request`, then its lane; what the steps
    /// give goes in `permits`.
    #[inline(always)]
    pub(super) fn go(
        &self,
        request: &RequestRef<'_>,
        route: &Route,
        permits: &mut Permits,
    ) -> Next<St::Future> {
        let mut listed = None;
        if let Some(answer) = self.steps_before(request, route, permits, &mut listed) {
            return answer;
        }
        match route.lane() {
            Lane::Alone => self.begin_alone(&route[0], request, route),
            Lane::Together { packed } => self.begin_together(request, route, packed),
            Lane::Checks => self.plan(request, route, listed),
        }
    }

    /// The route's steps before the decision for `request`, in order: the answer of the first
    /// that answers, if one does; what they give goes in `permits`. and the key whose runtime
    /// list entries the store call reads in `listed`.
    #[inline(always)]
    pub(super) fn steps_before(
        &self,
        request: &RequestRef<'_>,
        route: &Route,
        permits: &mut Permits,
        listed: &mut Option<Key>,
    ) -> Option<Next<St::Future>> {
        for step in route.steps().before() {
            if let Some(answer) = self.before(step, request, route, permits, listed) {
                return Some(answer);
            }
        }
        None
    }

    /// Runs the step `step` before `request`'s decision, with what the earlier ones gave (`permits`)
    /// (and `listed`, as `steps_before`): `None` to go on, or the answer (a response, or a
    /// wait after which the request begins again).
    #[inline]
    fn before(
        &self,
        step: Before,
        request: &RequestRef<'_>,
        route: &Route,
        permits: &mut Permits,
        listed: &mut Option<Key>,
    ) -> Option<Next<St::Future>> {
        match step {
            Before::Lists if St::DECIDES_ALONE => self.listed_at_once(request),
            Before::Lists => match self.listed(request) {
                Ok(key) => {
                    *listed = key;
                    None
                }
                Err(answer) => Some(answer),
            },
            Before::Adaptive => self.admitted(request, route, permits),
        }
    }

    /// A request that waited before its plan (`Next::Pending`), which gave `given`: its steps
    /// and its decision again, with what it gave.
    pub(crate) fn resumed(
        &self,
        request: &RequestRef<'_>,
        given: Given,
        permits: &mut Permits,
    ) -> Next<St::Future> {
        match given {
            Ok(Some(permit)) => permits.push(permit),
            Ok(None) => {}
            Err(policy) => return self.shed(&policy),
        }
        // Its steps again, then the general way: a route with a step that waits takes no
        // faster lane (and the lanes stay inlined in `begin` alone).
        let route = self.policies.load();
        let mut listed = None;
        if let Some(answer) = self.steps_before(request, &route, permits, &mut listed) {
            return answer;
        }
        self.plan(request, &route, listed)
    }

    /// Runs the steps after `decision` (its checks `keys`; `local`: decided by the local
    /// fallback), then answers a denial, or calls the inner service with `headers` and the
    /// charges `after` (an admitted request may wait first).
    #[inline(always)]
    pub(super) fn after_steps<F>(
        &self,
        steps: Steps,
        decision: Decision,
        headers: RateLimitHeaders,
        keys: Option<&[Check]>,
        local: bool,
        after: Vec<AfterResponse>,
    ) -> Next<F> {
        let allowed = decision.is_allowed();
        let mut slots: Option<BodyGuard> = None;
        for step in steps.after() {
            match step {
                After::Warn if allowed => self.warn_near(&decision, keys),
                After::Slots if allowed => {
                    slots = self.giving_back(&decision, keys, local, PolicyOutcome::held, None);
                }
                After::Booked if allowed => {
                    let wait = decision.wait();
                    if !wait.is_zero() {
                        return self.delayed(decision, wait, headers, keys, local, slots, after);
                    }
                }
                After::Warn | After::Slots | After::Booked => {}
            }
        }
        if !allowed {
            tracing::debug!(policy = decision.tightest().policy(), "rate limit exceeded");
            return self.limited(decision, headers);
        }
        if decision.shadow_violated().next().is_some() {
            tracing::debug!(
                policies = ?decision.shadow_violated().map(|o| o.policy()).collect::<Vec<_>>(),
                "shadow rate limit exceeded; request let through"
            );
        }
        let decision = self.decision_extension.then_some(decision);
        Next::Call(Go {
            headers: Some(headers),
            decision,
            held: slots,
            after,
        })
    }
}
