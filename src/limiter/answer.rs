//! The store's answer, or its failure, made into what the request does next
//! ([`Next`]: counts, headers, the deny cache, the breaker, the failure policy).

use tracing::Span;

use super::route::{After, Steps};
use super::{AfterResponse, Go, Limiter, Next, Ticket};
use crate::body::BodyGuard;
use crate::decision::{Decision, PolicyOutcome};
use crate::error::StoreError;
use crate::headers::RateLimitHeaders;
use crate::refusal::Refusal;
use crate::store::{Check, Store};
use crate::telemetry::{record_outcome, traced};

impl<St: Store> Limiter<St> {
    /// Turns the store's answer into what to do, applying the breaker, the deny
    /// cache, the failure policy and the metrics. Returns the charges still to make after the
    /// response (none when the store failed: nothing was charged there).
    pub(crate) fn answered<F>(
        &self,
        mut ticket: Ticket,
        result: Result<Decision, StoreError>,
    ) -> Next<F> {
        if let Some(rejection) = ticket.rejected.take() {
            return Next::Refuse(self.charged(ticket, result, *rejection));
        }
        let span = std::mem::replace(&mut ticket.span, Span::none());
        let _entered = span.enter();
        if let Some(started) = ticket.started {
            let elapsed = started.elapsed();
            traced(&span, |span| {
                span.record("store_us", elapsed.as_micros() as u64);
            });
            metrics::histogram!("ratelimit_store_duration_seconds").record(elapsed.as_secs_f64());
        }
        let mut local = false;
        let decision = match result {
            Ok(mut decision) => {
                if let Some(breaker) = &self.breaker {
                    breaker.success(ticket.gate);
                }
                if ticket.lists
                    && let Some(next) = self.unlisted(&decision, &mut ticket.keys)
                {
                    return next;
                }
                if let Some(asking) = ticket.asking.take() {
                    decision = asking.answered(decision, self.clock.now_micros());
                }
                if let (Some(keys), false) = (&ticket.keys, decision.is_allowed()) {
                    let now = self.clock.now_micros();
                    if let Some(cache) = &self.deny_cache {
                        cache.remember(keys, &decision, now);
                    }
                    if let Some(remembered) = &self.remembered {
                        remembered.denied(keys, &decision, now);
                    }
                }
                decision
            }
            Err(error) => match self.degraded(&mut ticket, error, &span) {
                Ok(decision) => {
                    local = true;
                    decision
                }
                Err(next) => return next,
            },
        };
        let keys = ticket.keys.as_deref();
        self.finish(decision, ticket.after, keys, local, &span, ticket.steps)
    }

    /// The decision's response: counts, headers, the limiter's own response
    /// for a denied request; for an admitted one, the charges still to make after the response
    /// (`local`: the decision is the local fallback's, where booked times go back to).
    #[inline(always)]
    pub(super) fn finish<F>(
        &self,
        decision: Decision,
        mut after: Vec<AfterResponse>,
        keys: Option<&[Check]>,
        local: bool,
        span: &Span,
        steps: Steps,
    ) -> Next<F> {
        traced(span, |span| {
            record_outcome(span, &decision, steps.has(After::Booked));
        });
        if self.leases().is_some() {
            self.set_lease_ends(&mut after, &decision);
        }
        for o in decision.outcomes() {
            o.tier().count(o.is_allowed(), o.is_shadow());
        }
        let headers = self.response_headers(&decision, keys);
        self.record_limited(&decision, keys);
        self.after_steps(steps, decision, headers, keys, local, after)
    }

    /// An admitted request that waits `wait` for the time booked for it: what gives its
    /// booked units back if it goes away before, and the counts of requests delayed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn delayed<F>(
        &self,
        decision: Decision,
        wait: std::time::Duration,
        headers: RateLimitHeaders,
        keys: Option<&[Check]>,
        local: bool,
        held: Option<BodyGuard>,
        after: Vec<AfterResponse>,
    ) -> Next<F> {
        let released = Some("ratelimit_reservations_released_total");
        let release = self.giving_back(&decision, keys, local, PolicyOutcome::booking, released);
        let policy = decision
            .outcomes()
            .iter()
            .max_by_key(|o| o.wait())
            .map_or(metrics::SharedString::const_str(""), |o| o.tier().label());
        metrics::counter!("ratelimit_requests_delayed_total", "policy" => policy.clone())
            .increment(1);
        metrics::histogram!("ratelimit_delay_seconds", "policy" => policy)
            .record(wait.as_secs_f64());
        let decision = self.decision_extension.then_some(decision);
        let then = Go {
            headers: Some(headers),
            decision,
            held,
            after,
        };
        Next::Wait {
            wait,
            release,
            then: Box::new(then),
        }
    }

    /// The refusal of a denied request.
    pub(super) fn limited<F>(&self, decision: Decision, headers: RateLimitHeaders) -> Next<F> {
        Next::Refuse(Refusal::Limited { decision, headers })
    }

    pub(crate) fn response_headers(
        &self,
        decision: &Decision,
        keys: Option<&[Check]>,
    ) -> RateLimitHeaders {
        let key_of = |tier| Check::key_of(keys?, tier);
        RateLimitHeaders::new(decision, &self.headers, || self.clock.now_micros(), key_of)
    }
}
