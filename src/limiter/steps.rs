//! The engine's loops over a route's steps ([`Route`]): before the decision, and on a decision
//! that admitted the request.

use super::route::{Admitted, Before, Carried, Lane, Resumed, Route, Steps};
use super::{AfterResponse, Limiter, Next};
use crate::body::BodyGuard;
use crate::decision::{Decision, PolicyOutcome};
use crate::headers::RateLimitHeaders;
use crate::key::RequestRef;
use crate::store::{Check, Store};

/// What a step before the decision says.
// Returned by value into the engine's loop, which returns the answer at once: nothing large is
// moved twice.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Flow<F> {
    /// Go on to the next step, and then to the decision.
    Go,
    /// Answer with this (a response, or a wait after which the request begins again).
    Answer(Next<F>),
}

impl<St: Store> Limiter<St> {
    /// The route's steps before the decision for `request`, then its lane, with what a wait
    /// that came `carried` (the permits of the adaptive limits that admitted it).
    #[inline(always)]
    pub(super) fn go(
        &self,
        request: &RequestRef<'_>,
        route: &Route,
        carried: &mut Carried,
    ) -> Next<St::Future> {
        for step in route.before() {
            if let Flow::Answer(next) = self.before(*step, request, route, carried) {
                return next;
            }
        }
        match route.lane() {
            Lane::Alone => self.begin_alone(&route[0], request, route, carried),
            Lane::Together => self.begin_together(request, route, carried),
            Lane::Checks => self.plan(request, route, carried.listed().take()),
        }
    }

    /// Runs the step `step` before `request`'s decision, with what the earlier ones `carried`.
    #[inline]
    pub(super) fn before(
        &self,
        step: Before,
        request: &RequestRef<'_>,
        route: &Route,
        carried: &mut Carried,
    ) -> Flow<St::Future> {
        let answer = match step {
            Before::Lists if St::DECIDES_ALONE => self.listed_at_once(request),
            Before::Lists => match self.listed(request) {
                Ok(key) => {
                    *carried.listed() = key;
                    None
                }
                Err(answer) => Some(answer),
            },
            Before::Adaptive => self.admitted(request, route, carried.permits()),
        };
        answer.map_or(Flow::Go, Flow::Answer)
    }

    /// A request whose step before the decision waited, and gave `resumed`: its steps and its
    /// decision again, with what it gave.
    pub(crate) fn resumed(
        &self,
        request: &RequestRef<'_>,
        resumed: Resumed,
        carried: &mut Carried,
    ) -> Next<St::Future> {
        match resumed {
            Resumed::Permit(permit) => carried.permits().push(permit),
            Resumed::Shed(policy) => return self.shed(&policy),
        }
        let route = self.policies.load();
        self.go(request, &route, carried)
    }

    /// Runs the steps of an admitted `decision` (its checks `keys`; `local`: decided by the
    /// local fallback) and calls the inner service with `headers` and the charges `after`, or
    /// makes the request wait first.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn admitted_steps<F>(
        &self,
        steps: Steps,
        decision: Decision,
        headers: RateLimitHeaders,
        keys: Option<&[Check]>,
        local: bool,
        after: Vec<AfterResponse>,
    ) -> Next<F> {
        let mut slots: Option<BodyGuard> = None;
        for step in steps.iter() {
            match step {
                Admitted::Warn => self.warn_near(&decision, keys),
                Admitted::Slots => {
                    slots = self.giving_back(&decision, keys, local, PolicyOutcome::held, None);
                }
                Admitted::Reserved => {
                    let wait = decision.wait();
                    if !wait.is_zero() {
                        return self.delayed(decision, wait, headers, keys, local, slots, after);
                    }
                }
            }
        }
        let decision = self.decision_extension.then_some(decision);
        Next::Call {
            headers: Some(headers),
            decision,
            held: slots,
            after,
        }
    }
}
