//! [`Waiting`]: a request not yet sent to the inner service, with the engine's
//! [`Driver`] of what it waits for (a place in a queue, another's lease, the store's answer,
//! a booked time), as its response future waits for it.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;

use crate::adaptive::Permits;
use crate::key::RequestRef;
use crate::limiter::{Driver, Go, Limiter, Next};
use crate::refusal::Refusal;
use crate::store::Store;
use crate::store::private::Sealed;

/// A request with the inner service it goes to, and its answer on its way.
pub(crate) struct Waiting<S, ReqB, C, L> {
    /// The request; `None` once it went on.
    request: Option<Request<ReqB>>,
    pub(crate) inner: S,
    driver: Driver<C, L>,
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
        Waiting {
            request: Some(request),
            inner,
            driver: Driver::new(limiter, next, permits),
        }
    }

    /// The engine.
    pub(crate) fn limiter(&self) -> &Arc<Limiter<St>> {
        self.driver.limiter()
    }

    /// The request's answer once it came, with the request and what the steps before the
    /// decision gave.
    #[allow(clippy::type_complexity)]
    pub(crate) fn poll_answer(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<(Result<Go, Refusal>, Request<ReqB>, Permits)> {
        let request = self.request.as_ref().expect("a waiting request");
        let answer = std::task::ready!(self.driver.poll(cx, &RequestRef::new(request)));
        let request = self.request.take().expect("a waiting request");
        Poll::Ready((answer, request, self.driver.take_permits()))
    }
}
