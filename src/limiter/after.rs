//! The charges and refunds that wait for the response: for its status (`charge_if`,
//! `refund_if`), made once it is known, and the leases their units go back to; or for its
//! real cost (`settle`), read from its head, or counted by a [`Meter`] its body carries.

use std::sync::Arc;

use http::{HeaderMap, StatusCode};

use super::{AfterResponse, Limiter};
use crate::decision::Decision;
use crate::key::Key;
use crate::policy::{CompiledPolicy, Tier};
use crate::settle::meter::Meter;
use crate::store::{Check, Checks, Op, Store};

impl AfterResponse {
    /// The charges after the response that a request of `policy` (its `tier`, `key` and
    /// `cost`) makes: on a status (`charge_if`, `refund_if`), at the real cost (`settle`);
    /// added to `after`.
    #[inline(always)]
    pub(super) fn planned(
        policy: &CompiledPolicy,
        tier: &Arc<Tier>,
        key: &Key,
        cost: u64,
        after: &mut Vec<AfterResponse>,
    ) {
        let check = |op| Check::new(tier.clone(), key.clone(), cost, op);
        for (accepts, op) in [
            (tier.charge_if(), Op::Enforce),
            (policy.refund_if(), Op::Refund),
        ] {
            if let Some(accepts) = accepts {
                let (check, accepts) = (check(op), accepts.clone());
                let lease_end = None;
                after.push(AfterResponse::Status {
                    check,
                    accepts,
                    lease_end,
                });
            }
        }
        if let Some(settle) = policy.settle() {
            let check = check(Op::Settle { estimate: cost });
            let settle = settle.clone();
            after.push(AfterResponse::Cost { check, settle });
        }
    }
}

impl<St: Store> Limiter<St> {
    /// The charges and refunds `charges` makes for a response of `status` and `headers`, as
    /// one store call (`None` when there are none), and the meter its body carries when a
    /// policy settles from the body.
    pub(crate) fn after_response(
        &self,
        charges: Vec<AfterResponse>,
        (status, headers, extensions): (StatusCode, &HeaderMap, &http::Extensions),
    ) -> (Option<Charged<St::Future>>, Option<Meter>) {
        let mut checks = Checks::new();
        let mut from_body = Vec::new();
        for a in charges {
            let (check, accepts, lease_end) = match a {
                AfterResponse::Status {
                    check,
                    accepts,
                    lease_end,
                } => (check, accepts, lease_end),
                AfterResponse::Cost { check, settle } => {
                    if settle.reads_body() {
                        from_body.push((check, settle));
                    } else if let Some(check) = settle.settled_by(check, headers, extensions) {
                        checks.push(check);
                    }
                    continue;
                }
            };
            if !accepts(status) {
                continue;
            }
            match (lease_end, self.leases()) {
                // Units from a lease go back to it while it is held here, else to the store
                // as that lease's.
                (Some(end), Some(leases)) => {
                    let now = self.clock.now_micros();
                    if !leases.put_back(check.tier().id(), check.key(), end, check.cost(), now) {
                        checks.push(check.with_op(Op::GiveBack { end }));
                    }
                }
                _ => checks.push(check),
            }
        }
        let meter = (!from_body.is_empty()).then(|| {
            let store = self.store.clone();
            // A stream of server-sent events reports its cost in an event, not as its JSON.
            let events = (headers.get(http::header::CONTENT_TYPE))
                .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
            Meter::new(
                from_body,
                events,
                Box::new(move |checks| store.check_detached(checks)),
            )
        });
        // The checks kept for the headers of their decision (few responses are charged).
        let call = (!checks.is_empty()).then(|| {
            let kept = checks.to_vec();
            (self.store.check(checks), kept)
        });
        (call, meter)
    }

    /// Marks each charge after the response with the end of the lease its policy tier's units
    /// came from, as the decision's outcome for the tier says (`None` when not from a lease), so
    /// that refunds go back to that lease.
    pub(super) fn set_lease_ends(&self, after: &mut [AfterResponse], decision: &Decision) {
        for a in after {
            let AfterResponse::Status {
                check, lease_end, ..
            } = a
            else {
                continue;
            };
            let tier = check.tier();
            *lease_end = tier.lease().and_then(|_| {
                let o = decision
                    .outcomes()
                    .iter()
                    .find(|o| o.tier().id() == tier.id())?;
                Some(o.grant()?.end)
            });
        }
    }
}

/// The charges after a response on their way to the store, and the checks they make (for the
/// headers of their decision).
pub(crate) type Charged<F> = (F, Vec<Check>);
