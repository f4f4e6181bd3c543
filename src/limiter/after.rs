//! The charges and refunds that wait for the response's status (`charge_if`, `refund_if`),
//! made once it is known, and the leases their units go back to.

use http::StatusCode;

use super::{Charges, Limiter};
use crate::decision::Decision;
use crate::store::{Checks, Op, Store};

impl<St: Store> Limiter<St> {
    /// The charges and refunds `charges` makes for a response of `status`, as one store call;
    /// `None` when there are none.
    pub(crate) fn after_response(
        &self,
        charges: Charges,
        status: StatusCode,
    ) -> Option<St::Future> {
        let mut checks = Checks::new();
        for a in charges.into_iter().filter(|a| (a.when)(status)) {
            match (a.lease_end, self.leases()) {
                // Units from a lease go back to it while it is held here, else to the store
                // as that lease's.
                (Some(end), Some(leases)) => {
                    let now = self.clock.now_micros();
                    let c = a.check;
                    if !leases.put_back(c.tier().id(), c.key(), end, c.cost(), now) {
                        checks.push(c.with_op(Op::GiveBack { end }));
                    }
                }
                _ => checks.push(a.check),
            }
        }
        (!checks.is_empty()).then(|| self.store.check(checks))
    }

    /// Marks each charge after the response with the end of the lease its policy tier's units
    /// came from, as the decision's outcome for the tier says (`None` when not from a lease), so
    /// that refunds go back to that lease.
    pub(super) fn set_lease_ends(&self, after: &mut Charges, decision: &Decision) {
        for a in after {
            let tier = a.check.tier();
            a.lease_end = tier.lease().and_then(|_| {
                let o = decision
                    .outcomes()
                    .iter()
                    .find(|o| o.tier().id() == tier.id())?;
                Some(o.grant()?.end)
            });
        }
    }
}
