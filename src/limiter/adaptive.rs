//! The adaptive concurrency limits' step, before a request's checks are planned: each adaptive
//! policy that applies admits it (a permit, held until its response body ends), queues it, or
//! sheds it (`503`). Decided in this process; the store is never asked.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::{Limiter, Next};
use crate::adaptive::{AdaptivePermit, Admission, Permits};
use crate::body::BodyGuard;
use crate::key::RequestRef;
use crate::policy::CompiledPolicy;
use crate::store::Store;

/// A request waiting in an adaptive limit's queue: the wait, the permits it already holds (of
/// the policies before it), and the policy's name (for the `503` if the wait runs out).
pub(crate) struct Queued {
    wait: Pin<Box<dyn Future<Output = Option<AdaptivePermit>> + Send>>,
    held: Permits,
    policy: Box<str>,
}

impl Queued {
    /// Polls the wait: the permits held then (`Err`: the policy whose wait ran out).
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Permits, Box<str>>> {
        match self.wait.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(permit)) => {
                let mut held = std::mem::take(&mut self.held);
                held.push(permit);
                Poll::Ready(Ok(held))
            }
            Poll::Ready(None) => Poll::Ready(Err(std::mem::take(&mut self.policy))),
        }
    }
}

impl<St: Store> Limiter<St> {
    /// The adaptive limits' step for `request`: `None` when every adaptive policy that applies
    /// admitted it (its permits added to `held`, which holds those of a wait that came), else
    /// the request's next step (shed, or queued).
    pub(super) fn admitted<F>(
        &self,
        request: &RequestRef<'_>,
        policies: &[CompiledPolicy],
        held: &mut Permits,
    ) -> Option<Next<F>> {
        for policy in policies {
            let Some(limits) = policy.adaptive() else {
                continue;
            };
            if !policy.applies(request) || held.iter().any(|p| limits.issued(p)) {
                continue;
            }
            let key = match policy.key(request) {
                Ok(key) => key,
                Err(rejection) => return Some(self.key_rejected(policy, &rejection)),
            };
            match limits.admit(&key, &self.clock) {
                Admission::Admitted(permit) => held.push(permit),
                Admission::Shed => return Some(self.shed(policy.name())),
                Admission::Queued(wait) => {
                    let held = std::mem::take(held);
                    let policy = policy.name().into();
                    return Some(Next::Queued(Box::new(Queued { wait, held, policy })));
                }
            }
        }
        None
    }

    /// The answer to a request over the adaptive limit of `policy`.
    pub(crate) fn shed<F>(&self, policy: &str) -> Next<F> {
        tracing::debug!(policy, "adaptive concurrency limit reached; request shed");
        Next::Respond(self.responses.shed(policy))
    }

    /// A request whose queued wait came: planned again, holding `held`.
    pub(crate) fn begin_holding(
        &self,
        request: &RequestRef<'_>,
        held: Permits,
    ) -> Next<St::Future> {
        let policies = self.policies.load();
        self.plan(request, &policies, held)
    }
}

/// `next`, holding `permits` until its response body ends: given to the inner service's call
/// (or to the ticket of a step that waits, which gives them to the call it leads to);
/// dropped with a response of the limiter's own.
#[inline(always)]
pub(crate) fn holding<F>(next: Next<F>, permits: Permits) -> Next<F> {
    if permits.is_empty() {
        return next;
    }
    match next {
        Next::Call {
            headers,
            decision,
            held,
            after,
        } => Next::Call {
            headers,
            decision,
            held: Some(BodyGuard::holding(held, permits)),
            after,
        },
        Next::Wait {
            wait,
            release,
            then,
        } => Next::Wait {
            wait,
            release,
            then: Box::new(holding(*then, permits)),
        },
        Next::Store(call, mut ticket) => {
            ticket.permits = permits;
            Next::Store(call, ticket)
        }
        Next::Lease(wait, mut planned) => {
            planned.1.permits = permits;
            Next::Lease(wait, planned)
        }
        Next::Queued(mut queued) => {
            queued.held.extend(permits);
            Next::Queued(queued)
        }
        respond @ Next::Respond(_) => respond,
    }
}
