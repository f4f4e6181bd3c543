//! The one driver of a request's [`Next`] steps while they wait: a place in an adaptive
//! concurrency limit's queue or another request's lease (then the request is planned again),
//! the store's answer, then the time booked for it, if the answer is to wait; to its end, a
//! [`Go`] or a [`Refusal`]. Every adapter waits through it, and none takes `Next` apart.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use super::{Go, Limiter, Next};
use crate::adaptive::Permits;
use crate::key::RequestRef;
use crate::refusal::Refusal;
use crate::store::Store;

/// A request's answer on its way (`C`: the store's future; `L`: the engine). Dropped before
/// the decision comes (the client went away), a store's decision finishes on its own and
/// gives back the slots it took (of a concurrency limit, or booked for a wait), which would
/// otherwise stay taken until their leases end; a booked time is given back by its wait's
/// `release`.
pub(crate) struct Driver<C, L> {
    limiter: Arc<L>,
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

impl<C, L> Drop for Driver<C, L> {
    fn drop(&mut self) {
        if let (Some(Next::Store(call, _)), Some(abandoned)) =
            (self.awaited.take(), self.abandoned.take())
        {
            abandoned(call);
        }
    }
}

impl<St: Store> Driver<St::Future, Limiter<St>> {
    /// The answer of a request whose step is `next`, with what its steps gave (`permits`).
    pub(crate) fn new(
        limiter: &Arc<Limiter<St>>,
        next: Next<St::Future>,
        permits: Permits,
    ) -> Self {
        let mut driver = Driver {
            limiter: limiter.clone(),
            awaited: None,
            sleep: None,
            abandoned: None,
            permits,
        };
        driver.awaits(next);
        driver
    }

    /// The engine.
    pub(crate) fn limiter(&self) -> &Arc<Limiter<St>> {
        &self.limiter
    }

    /// What the steps before the decision gave, taken to the call.
    pub(crate) fn take_permits(&mut self) -> Permits {
        std::mem::take(&mut self.permits)
    }

    /// Waits for what `next` waits for from now on.
    fn awaits(&mut self, next: Next<St::Future>) {
        (self.abandoned, self.sleep) = match &next {
            Next::Store(_, ticket) => (self.limiter.abandoned(ticket), None),
            Next::Wait { wait, .. } => (None, Some(Box::pin(tokio::time::sleep(*wait)))),
            _ => (None, None),
        };
        self.awaited = Some(next);
    }

    /// The request's answer once what it waited for came (`request`: its head, to plan it
    /// again): a booked time that came goes on, its units spent.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        request: &RequestRef<'_>,
    ) -> Poll<Result<Go, Refusal>> {
        loop {
            // Polled in place; taken only once it came.
            let next = match self.awaited.as_mut().expect(POLLED_AFTER_READY) {
                Next::Store(call, _) => {
                    let result = ready!(Pin::new(call).poll(cx));
                    let Some(Next::Store(_, ticket)) = self.awaited.take() else {
                        unreachable!("the store's answer came");
                    };
                    self.limiter.answered(ticket, result)
                }
                Next::Pending(pending) => {
                    let given = ready!(pending.poll(cx));
                    self.awaited = None;
                    self.limiter.resumed(request, given, &mut self.permits)
                }
                Next::Wait { .. } => {
                    if let Some(sleep) = &mut self.sleep {
                        ready!(sleep.as_mut().poll(cx));
                    }
                    let Some(Next::Wait { release, then, .. }) = self.awaited.take() else {
                        unreachable!("the booked time came");
                    };
                    // Its booked time came: the request goes on, its units spent.
                    if let Some(release) = release {
                        release.spend();
                    }
                    return Poll::Ready(Ok(*then));
                }
                // A step that waits for nothing is the answer as it is.
                Next::Call(_) | Next::Refuse(_) => self.awaited.take().expect("matched"),
            };
            match next.settled() {
                Ok(answer) => return Poll::Ready(answer),
                Err(next) => self.awaits(next),
            }
        }
    }
}

const POLLED_AFTER_READY: &str = "a request's answer polled after it came";
