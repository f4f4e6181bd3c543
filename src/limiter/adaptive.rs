//! The adaptive concurrency limits' step, before a request's checks are planned: each adaptive
//! policy that applies admits it (a permit, held until its response body ends), queues it, or
//! sheds it (`503`). Decided in this process; the store is never asked.

use super::route::Carried;
use super::{Limiter, Next};
use crate::adaptive::{Admission, Permits, Queued};
use crate::body::BodyGuard;
use crate::key::RequestRef;
use crate::policy::CompiledPolicy;
use crate::store::Store;

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
                    let queued = Queued::new(wait, held, policy.name());
                    return Some(Next::Queued(Box::new(queued)));
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

    /// A request whose queued wait came: its steps and its decision again, holding `held`.
    pub(crate) fn begin_holding(
        &self,
        request: &RequestRef<'_>,
        held: Permits,
    ) -> Next<St::Future> {
        let route = self.policies.load();
        let mut carried = Carried::holding(held);
        self.go(request, &route, &mut carried)
    }
}

impl<F> Next<F> {
    /// This step, holding `permits` until its response body ends: given to the inner
    /// service's call (or to the ticket of a step that waits, which gives them to the call it
    /// leads to); dropped with a response of the limiter's own.
    #[inline(always)]
    pub(crate) fn holding(self, permits: Permits) -> Self {
        if permits.is_empty() {
            return self;
        }
        match self {
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
                then: Box::new(then.holding(permits)),
            },
            Next::Store(call, mut ticket) => {
                ticket.permits = Some(Box::new(permits));
                Next::Store(call, ticket)
            }
            Next::Lease(wait, mut planned) => {
                planned.1.permits = Some(Box::new(permits));
                Next::Lease(wait, planned)
            }
            Next::Queued(mut queued) => {
                queued.hold(permits);
                Next::Queued(queued)
            }
            respond @ Next::Respond(_) => respond,
        }
    }

    /// [`holding`](Self::holding) the permits a ticket kept, if any.
    #[inline(always)]
    pub(crate) fn holding_boxed(self, permits: Option<Box<Permits>>) -> Self {
        match permits {
            Some(permits) => self.holding(*permits),
            None => self,
        }
    }
}
