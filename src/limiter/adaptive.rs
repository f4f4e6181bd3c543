//! The adaptive concurrency limits' step, before a request's checks are planned: each adaptive
//! policy that applies admits it (a permit, held until its response body ends), queues it, or
//! sheds it (`503`). Decided in this process; the store is never asked.

use super::route::Pending;
use super::{Limiter, Next};
use crate::adaptive::{Admission, Permits};
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
                Err(rejection) => return Some(self.key_rejected(policy, rejection)),
            };
            match limits.admit(&key, &self.clock) {
                Admission::Admitted(permit) => held.push(permit),
                Admission::Shed => return Some(self.shed(policy.name())),
                Admission::Queued(wait) => {
                    let policy: Box<str> = policy.name().into();
                    return Some(Next::Pending(Pending::new(async move {
                        wait.await.map(Some).ok_or(policy)
                    })));
                }
            }
        }
        None
    }

    /// The answer to a request over the adaptive limit of `policy`.
    pub(crate) fn shed<F>(&self, policy: &str) -> Next<F> {
        tracing::debug!(policy, "adaptive concurrency limit reached; request shed");
        Next::Refuse(crate::refusal::Refusal::Shed(policy.into()))
    }
}
