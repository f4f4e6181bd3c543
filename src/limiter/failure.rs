//! When the store fails: what the failure policy answers (a lease in hand, the local
//! fallback, a 503, or the request let through), and the failure logged at `warn` at most
//! once a second.

use std::sync::atomic::Ordering;

use tracing::Span;

use super::{Limiter, Next, Ticket};
use crate::decision::Decision;
use crate::error::{FailurePolicy, StoreError, StoreErrorKind};
use crate::lists::Why;
use crate::store::Store;
use crate::telemetry::traced;

impl<St> Limiter<St> {
    /// Logs a decision the store failed: at `warn` at most once a second (with how many
    /// failed since), else at `debug`, so that an outage does not log every request.
    pub(super) fn store_failed(&self, error: &StoreError, then: &str) {
        let now = self.clock.now_micros();
        let last = self.warned.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= 1_000_000;
        if due
            && self
                .warned
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let since = self.unwarned.swap(0, Ordering::Relaxed);
            tracing::warn!(%error, more_since_last = since, "rate-limit store failed; {then}");
        } else {
            self.unwarned.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%error, "rate-limit store failed; {then}");
        }
    }
}

impl<St: Store> Limiter<St> {
    /// The answer of what this instance remembers denied, for a request whose store call failed:
    /// a 403 for a key it saw on the deny list, a 429 for a denial or block it saw, until
    /// their ends; `None` when it remembers nothing of the request's keys.
    // The failure path: what it returns is moved once, into the request's answer.
    #[allow(clippy::result_large_err)]
    fn remembered_answer<F>(&self, ticket: &Ticket) -> Option<Result<Decision, Next<F>>> {
        let (remembered, keys) = (self.remembered.as_ref()?, ticket.keys.as_deref()?);
        let now = self.clock.now_micros();
        if let (true, Some(record)) = (ticket.lists, keys.last())
            && remembered.is_listed(record.key(), now)
        {
            return Some(Err(self.denied(Why::Entry)));
        }
        remembered.denial(keys, now).map(Ok)
    }

    /// The store failed: the failure policy's answer, a decision (a lease's in hand, or the
    /// local fallback's), or the step to take without one.
    // The failure path: what it returns is moved once, into the request's answer.
    #[allow(clippy::result_large_err)]
    pub(super) fn degraded<F>(
        &self,
        ticket: &mut Ticket,
        error: StoreError,
        span: &Span,
    ) -> Result<Decision, Next<F>> {
        if let (Some(breaker), true) = (&self.breaker, error.kind() != StoreErrorKind::CircuitOpen)
        {
            breaker.failure(ticket.gate, self.clock.now_micros());
        }
        // What this instance saw denied; else a lease in hand, for a request that asked ahead.
        let remembered = self.remembered_answer(ticket);
        let leased = (remembered.is_none())
            .then(|| ticket.asking.take())
            .flatten()
            .and_then(|asking| asking.spend_instead(self.clock.now_micros()));
        let policy = match (self.failure, &remembered, &leased) {
            (_, Some(_), _) => "remembered",
            (_, _, Some(_)) => "lease",
            (FailurePolicy::Open, ..) => "open",
            (FailurePolicy::Closed, ..) => "closed",
            (FailurePolicy::Local { .. }, ..) => "local",
        };
        degraded_as(&error, policy, span);
        if let Some(answer) = remembered {
            self.store_failed(&error, "answering from the denials remembered");
            // Charges after the response go to the store, which did not decide: none.
            ticket.after.clear();
            return answer;
        }
        if let Some(decision) = leased {
            tracing::debug!(%error, "rate-limit store failed; admitted from a lease in hand");
            return Ok(decision);
        }
        match (self.failure, &self.fallback, ticket.fallback.take()) {
            (FailurePolicy::Local { .. }, Some(local), Some(checks)) => {
                self.store_failed(&error, "deciding locally");
                // Charges after the response go to the store, which did not decide: none.
                ticket.after.clear();
                Ok(local.check_locked(&checks))
            }
            (FailurePolicy::Closed, _, _) => {
                traced(span, |span| {
                    span.record("outcome", "unavailable");
                });
                self.store_failed(&error, "answering 503");
                Err(Next::Refuse(crate::refusal::Refusal::Unavailable))
            }
            _ => {
                traced(span, |span| {
                    span.record("outcome", "allowed");
                });
                self.store_failed(&error, "letting the request through");
                Err(Next::nothing())
            }
        }
    }
}

/// Counts and traces a decision the store did not make, answered by `policy`.
fn degraded_as(error: &StoreError, policy: &'static str, span: &Span) {
    metrics::counter!(
        "ratelimit_degraded_total",
        "reason" => error.kind().as_str(),
        "failure_policy" => policy
    )
    .increment(1);
    traced(span, |span| {
        span.record("degraded", error.kind().as_str());
        span.record("failure_policy", policy);
    });
}
