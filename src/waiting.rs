//! [`Waiting`]: a request not yet sent to the inner service, and what it waits for before it
//! goes on, as its response future waits for it: a place in an adaptive concurrency limit's
//! queue (then the request is planned again), the store's answer, or first the answer to
//! another request of this instance that is asking the store for the lease this one needs
//! (then the request is planned again); then the time booked for it, if the answer is to
//! wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Request;

use crate::adaptive::Permits;
use crate::key::RequestRef;
use crate::limiter::{Limiter, Next};
use crate::store::Store;
use crate::store::private::Sealed;

/// A request with the inner service it goes to and the engine (`L`), and what it awaits: a
/// decision on its way (`C`: the store's future), or a booked time. Dropped before the
/// decision comes (the client went away), a store's decision finishes on its own and gives
/// back the slots it took (of a concurrency limit, or booked for a wait), which would
/// otherwise stay taken until their leases end; a booked time is given back by its wait's
/// `release`.
pub(crate) struct Waiting<S, ReqB, C, L> {
    /// The request; `None` once it went on.
    pub(crate) request: Option<Request<ReqB>>,
    pub(crate) inner: S,
    pub(crate) limiter: Arc<L>,
    /// What is awaited ([`Next::Store`], [`Next::Pending`] or [`Next::Wait`]); `None` once it
    /// came.
    awaited: Option<Next<C>>,
    /// The sleep until the booked time of a [`Next::Wait`].
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// What lets the store's decision finish without the request, and gives back what it took.
    abandoned: Option<Box<dyn FnOnce(C) + Send>>,
    /// What the steps before the decision gave, kept to the call.
    permits: Permits,
}

impl<S, ReqB, C, L> Drop for Waiting<S, ReqB, C, L> {
    fn drop(&mut self) {
        if let (Some(Next::Store(call, _)), Some(abandoned)) =
            (self.awaited.take(), self.abandoned.take())
        {
            abandoned(call);
        }
    }
}

impl<S, ReqB, St> Waiting<S, ReqB, <St as Sealed>::Future, Limiter<St>>
where
    St: Store,
{
    /// `request`, to `inner`, waiting for what `next` waits for, as the engine said.
    pub(crate) fn new(
        limiter: &Arc<Limiter<St>>,
        next: Next<<St as Sealed>::Future>,
        request: Request<ReqB>,
        inner: S,
        permits: Permits,
    ) -> Self {
        let mut waiting = Waiting {
            permits,
            request: Some(request),
            inner,
            limiter: limiter.clone(),
            awaited: None,
            sleep: None,
            abandoned: None,
        };
        waiting.awaits(next);
        waiting
    }

    /// What the steps before the decision gave, taken to the call.
    pub(crate) fn take_permits(&mut self) -> Permits {
        std::mem::take(&mut self.permits)
    }

    /// Waits for what `next` waits for from now on.
    fn awaits(&mut self, next: Next<<St as Sealed>::Future>) {
        (self.abandoned, self.sleep) = match &next {
            Next::Store(_, ticket) => (self.limiter.abandoned(ticket), None),
            Next::Wait { wait, .. } => (None, Some(Box::pin(tokio::time::sleep(*wait)))),
            _ => (None, None),
        };
        self.awaited = Some(next);
    }

    /// The request's next step once what it waited for came, as the engine answers it: one
    /// that waits for nothing more (a [`Next::Wait`] whose time came goes on).
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Next<<St as Sealed>::Future>> {
        loop {
            // Polled in place; taken only once it came.
            let next = match self.awaited.as_mut() {
                Some(Next::Store(call, _)) => {
                    let result = ready!(Pin::new(call).poll(cx));
                    let Some(Next::Store(_, ticket)) = self.awaited.take() else {
                        unreachable!("the store's answer came");
                    };
                    self.limiter.answered(ticket, result)
                }
                Some(Next::Pending(pending)) => {
                    let given = ready!(pending.poll(cx));
                    self.awaited = None;
                    let request =
                        RequestRef::new(self.request.as_ref().expect("a waiting request"));
                    self.limiter.resumed(&request, given, &mut self.permits)
                }
                Some(Next::Wait { .. }) => {
                    if let Some(sleep) = &mut self.sleep {
                        ready!(sleep.as_mut().poll(cx));
                    }
                    // Its booked time came: the request goes on.
                    return Poll::Ready(self.awaited.take().expect("the booked time came"));
                }
                // A step that waits for nothing is the next one as it is.
                _ => {
                    let next = self.awaited.take();
                    return Poll::Ready(next.expect("a decision polled after it came"));
                }
            };
            if !next.waits() {
                return Poll::Ready(next);
            }
            self.awaits(next);
        }
    }
}
