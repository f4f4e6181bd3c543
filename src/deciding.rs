//! [`Deciding`]: a request's decision on its way, as its response future waits for it: the
//! store's answer, or first the answer to another request of this instance that is asking the
//! store for the lease this one needs (then the request is planned again).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use crate::decision::Decision;
use crate::error::StoreError;
use crate::limiter::{Abandoned, Begin, Charges, Later, Limiter, Settled};
use crate::store::Store;
use crate::store::private::Sealed;

/// A decision on its way (`C`: the store's future). Dropped before it comes (the client went
/// away), a store's decision finishes on its own and gives back the slots it took (of a
/// concurrency limit, or reserved for a wait), which would otherwise stay taken until their
/// leases end.
pub(crate) struct Deciding<C> {
    /// What is awaited; `None` once it came.
    later: Option<Later<C>>,
    /// What lets the store's decision finish without the request, and gives its slots back.
    abandoned: Option<Abandoned<C>>,
}

impl<C> Drop for Deciding<C> {
    fn drop(&mut self) {
        if let (Some(Later::Store(call, _)), Some(abandoned)) =
            (self.later.take(), self.abandoned.take())
        {
            abandoned(call);
        }
    }
}

impl<C> Deciding<C>
where
    C: Future<Output = Result<Decision, StoreError>> + Unpin,
{
    /// Waits for `later`, as the engine began the request.
    pub(crate) fn new<St>(limiter: &Arc<Limiter<St>>, later: Later<C>) -> Self
    where
        St: Store + Sealed<Future = C>,
    {
        let abandoned = match &later {
            Later::Store(_, ticket) => limiter.abandoned(ticket),
            Later::Lease(..) => None,
        };
        Deciding {
            later: Some(later),
            abandoned,
        }
    }

    /// The decision, settled by `limiter` once it came: what to do, and the charges still to
    /// make after the response.
    pub(crate) fn poll_settled<St>(
        &mut self,
        limiter: &Arc<Limiter<St>>,
        cx: &mut Context<'_>,
    ) -> Poll<(Settled, Charges)>
    where
        St: Store + Sealed<Future = C>,
    {
        loop {
            let Some(later) = self.later.as_mut() else {
                panic!("a decision polled after it came");
            };
            // Polled in place; taken only once it came.
            let next = match later {
                Later::Store(call, _) => {
                    let result = ready!(Pin::new(call).poll(cx));
                    let Some(Later::Store(_, ticket)) = self.later.take() else {
                        unreachable!("the store's answer came");
                    };
                    return Poll::Ready(limiter.settle(ticket, result));
                }
                Later::Lease(wait, _) => {
                    ready!(Pin::new(wait).poll(cx));
                    let Some(Later::Lease(_, planned)) = self.later.take() else {
                        unreachable!("the lease came");
                    };
                    // The lease came (or not): plan again.
                    match limiter.resume(*planned) {
                        Begin::Later(later) => later,
                        Begin::Settled(settled, after) => return Poll::Ready((settled, after)),
                        Begin::Unlimited => {
                            return Poll::Ready((Settled::nothing(), Charges::new()));
                        }
                    }
                }
            };
            *self = Deciding::new(limiter, next);
        }
    }
}
