//! [`ResponseFuture`], the state machine of one request: tower glue around the
//! [engine](crate::limiter), which makes every decision.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::{HeldSlots, MakeBody, Wrapped};
use crate::decision::Decision;
use crate::grpc::{self, ResponseStyle};
use crate::headers::RateLimitHeaders;
use crate::lease::LeaseWait;
use crate::limiter::{Abandoned, Begin, Charges, Delayed, Limiter, Planned, Settled, Ticket};
use crate::store::Store;
use crate::store::private::Sealed;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): waits for the decision, then
    /// either calls the inner service or yields the limiter's own response; after the inner
    /// response, makes the charges and refunds that depend on its status.
    ///
    /// `M` says how the response carries its body (see [`MakeBody`]).
    pub struct ResponseFuture<S, ReqB, St, M = Wrapped>
    where
        S: Service<Request<ReqB>>,
        St: Store,
    {
        #[pin]
        state: State<S, ReqB, S::Future, <St as Sealed>::Future, S::Response>,
        // The engine, kept only while the future still needs it (a decision to wait for, or
        // charges after the response): most requests touch no shared reference count.
        limiter: Option<Arc<Limiter<St>>>,
        after: Charges,
        body: PhantomData<fn() -> M>,
    }
}

/// A store's decision on its way. Dropped before it comes (the client went away), it lets the
/// decision finish on its own and gives back the slots it took (of a concurrency limit, or
/// reserved for a wait), which would otherwise stay taken until their leases end.
struct InFlight<C> {
    check: Option<C>,
    abandoned: Option<Abandoned<C>>,
}

impl<C> Drop for InFlight<C> {
    fn drop(&mut self) {
        if let (Some(check), Some(abandoned)) = (self.check.take(), self.abandoned.take()) {
            abandoned(check);
        }
    }
}

/// What waits for a decision from an asynchronous store, or for a lease another request is
/// asking for: boxed, so that the response future, which is moved several times on its way
/// into the server, stays the size of the inner service's future plus a little.
struct Pending<S, ReqB, T> {
    request: Request<ReqB>,
    inner: S,
    then: T,
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, F, C, R> {
        Checking {
            check: InFlight<C>,
            pending: Option<Box<Pending<S, ReqB, Ticket>>>,
        },
        Leasing {
            #[pin]
            wait: LeaseWait,
            pending: Option<Box<Pending<S, ReqB, Box<Planned>>>>,
        },
        Delaying {
            sleep: Pin<Box<tokio::time::Sleep>>,
            pending: Option<Box<Pending<S, ReqB, Box<Delayed>>>>,
        },
        Calling {
            #[pin]
            future: F,
            headers: Option<RateLimitHeaders>,
            held: Option<HeldSlots>,
        },
        Adjusting {
            #[pin]
            adjust: C,
            response: Option<R>,
            held: Option<HeldSlots>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB, St, M> ResponseFuture<S, ReqB, St, M>
where
    S: Service<Request<ReqB>> + Clone,
    St: Store,
{
    /// A request whose decision is yet to come (`begin`, as the engine began it): waits for
    /// the store's decision or a lease, then goes on from there.
    pub(crate) fn waiting(
        limiter: &Arc<Limiter<St>>,
        begin: Begin<<St as Sealed>::Future>,
        request: Request<ReqB>,
        inner: S,
    ) -> Self {
        let mut after = Charges::new();
        let state = resume(limiter, begin, request, inner, &mut after);
        ResponseFuture {
            state,
            limiter: Some(limiter.clone()),
            after,
            body: PhantomData,
        }
    }

    /// A request already settled: the limiter's response, or the inner service called.
    pub(crate) fn settled(
        limiter: &Arc<Limiter<St>>,
        settled: Settled,
        after: Charges,
        request: Request<ReqB>,
        inner: &mut S,
    ) -> Self {
        ResponseFuture {
            state: next(settled, request, inner, limiter.style()),
            limiter: (!after.is_empty()).then(|| limiter.clone()),
            after,
            body: PhantomData,
        }
    }

    /// A request no policy applies to: the inner service's response, without headers.
    pub(crate) fn unlimited(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                headers: None,
                held: None,
            },
            limiter: None,
            after: Charges::new(),
            body: PhantomData,
        }
    }
}

/// The state a request goes on in from `begin`, the inner service moved along with it when
/// there is more to wait for (the charges after the response go to `after`).
fn resume<S, ReqB, St, R>(
    limiter: &Arc<Limiter<St>>,
    begin: Begin<<St as Sealed>::Future>,
    request: Request<ReqB>,
    mut inner: S,
    after: &mut Charges,
) -> State<S, ReqB, S::Future, <St as Sealed>::Future, R>
where
    S: Service<Request<ReqB>> + Clone,
    St: Store,
{
    match begin {
        Begin::Unlimited => State::Calling {
            future: inner.call(request),
            headers: None,
            held: None,
        },
        Begin::Settled(settled, charges) => {
            *after = charges;
            next_owned(settled, request, inner, limiter.style())
        }
        Begin::Wait(check, ticket) => State::Checking {
            check: InFlight {
                abandoned: limiter.abandoned(&ticket),
                check: Some(check),
            },
            pending: Some(Box::new(Pending {
                request,
                inner,
                then: ticket,
            })),
        },
        Begin::Lease(wait, planned) => State::Leasing {
            wait,
            pending: Some(Box::new(Pending {
                request,
                inner,
                then: planned,
            })),
        },
    }
}

/// The state that follows a settled decision, the inner service moved along when the request
/// waits for its slot.
fn next_owned<S, ReqB, C, R>(
    settled: Settled,
    request: Request<ReqB>,
    mut inner: S,
    style: ResponseStyle,
) -> State<S, ReqB, S::Future, C, R>
where
    S: Service<Request<ReqB>> + Clone,
{
    match settled {
        Settled::Wait(delayed) => State::Delaying {
            sleep: Box::pin(tokio::time::sleep(delayed.wait)),
            pending: Some(Box::new(Pending {
                request,
                inner,
                then: delayed,
            })),
        },
        settled => next(settled, request, &mut inner, style),
    }
}

/// A waiting request whose slots came: they are spent, and it goes on.
fn go_on<S, ReqB, C, R>(
    delayed: Delayed,
    request: Request<ReqB>,
    inner: &mut S,
) -> State<S, ReqB, S::Future, C, R>
where
    S: Service<Request<ReqB>>,
{
    let Delayed {
        headers,
        decision,
        release,
        held,
        ..
    } = delayed;
    if let Some(release) = release {
        release.keep();
    }
    call(Some(headers), decision, held, request, inner)
}

/// Calls the inner service with the decision (if any) in the request's extensions; `headers`
/// go on its response, and `held` with its body.
fn call<S, ReqB, C, R>(
    headers: Option<RateLimitHeaders>,
    decision: Option<Decision>,
    held: Option<HeldSlots>,
    mut request: Request<ReqB>,
    inner: &mut S,
) -> State<S, ReqB, S::Future, C, R>
where
    S: Service<Request<ReqB>>,
{
    if let Some(decision) = decision {
        request.extensions_mut().insert(decision);
    }
    State::Calling {
        future: inner.call(request),
        headers,
        held,
    }
}

/// The state that follows a settled decision. A request that waits for its slot takes the
/// inner service, which was made ready, along, and leaves a clone in its place. The limiter's
/// own response takes the form `style` gives the request.
fn next<S, ReqB, C, R>(
    settled: Settled,
    request: Request<ReqB>,
    inner: &mut S,
    style: ResponseStyle,
) -> State<S, ReqB, S::Future, C, R>
where
    S: Service<Request<ReqB>> + Clone,
{
    match settled {
        Settled::Respond(response) => State::Ready {
            response: Some(if style.is_grpc(&request) {
                grpc::answer(response)
            } else {
                response
            }),
        },
        Settled::Call(headers, decision, held) => call(headers, decision, held, request, inner),
        Settled::Wait(delayed) => {
            let clone = inner.clone();
            let ready = std::mem::replace(inner, clone);
            next_owned(Settled::Wait(delayed), request, ready, style)
        }
    }
}

impl<S, ReqB, St, M> fmt::Debug for ResponseFuture<S, ReqB, St, M>
where
    S: Service<Request<ReqB>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Leasing { .. } => "waiting for a lease",
            State::Delaying { .. } => "waiting for its slot",
            State::Calling { .. } => "calling",
            State::Adjusting { .. } => "adjusting",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

const POLLED_AFTER_READY: &str = "ResponseFuture polled after completion";
const KEPT_FOR_LATER: &str = "the engine is kept while a decision or a charge is to come";

impl<S, ReqB, ResB, St, M> Future for ResponseFuture<S, ReqB, St, M>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store,
    M: MakeBody<ResB>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, pending } => {
                    let decision = check.check.as_mut().expect(POLLED_AFTER_READY);
                    let result = ready!(Pin::new(decision).poll(cx));
                    // Come: nothing to finish or give back on a drop.
                    check.check = None;
                    let Pending {
                        request,
                        inner,
                        then: ticket,
                    } = *pending.take().expect(POLLED_AFTER_READY);
                    let limiter = this.limiter.as_ref().expect(KEPT_FOR_LATER);
                    let (settled, after) = limiter.settle(ticket, result);
                    *this.after = after;
                    this.state
                        .set(next_owned(settled, request, inner, limiter.style()));
                }
                StateProj::Leasing { wait, pending } => {
                    ready!(wait.poll(cx));
                    let Pending {
                        request,
                        inner,
                        then: planned,
                    } = *pending.take().expect(POLLED_AFTER_READY);
                    let limiter = this.limiter.as_ref().expect(KEPT_FOR_LATER);
                    let begin = limiter.resume(*planned);
                    let state = resume(limiter, begin, request, inner, this.after);
                    this.state.set(state);
                }
                StateProj::Delaying { sleep, pending } => {
                    ready!(sleep.as_mut().poll(cx));
                    let Pending {
                        request,
                        mut inner,
                        then: delayed,
                    } = *pending.take().expect(POLLED_AFTER_READY);
                    this.state.set(go_on(*delayed, request, &mut inner));
                }
                StateProj::Calling {
                    future,
                    headers,
                    held,
                } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    let adjust = match this.limiter.as_ref() {
                        Some(limiter) if !this.after.is_empty() => {
                            let after = std::mem::take(this.after);
                            limiter.after_response(after, response.status())
                        }
                        _ => None,
                    };
                    let Some(adjust) = adjust else {
                        return Poll::Ready(Ok(body::<M, _>(response, held.take())));
                    };
                    let held = held.take();
                    this.state.set(State::Adjusting {
                        adjust,
                        response: Some(response),
                        held,
                    });
                }
                StateProj::Adjusting {
                    adjust,
                    response,
                    held,
                } => {
                    if let Err(error) = ready!(adjust.poll(cx)) {
                        tracing::warn!(%error, "rate-limit charge or refund after the response failed");
                    }
                    let response = response.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(body::<M, _>(response, held.take())));
                }
                StateProj::Ready { response } => {
                    let response = response.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(response.map(M::full)));
                }
            }
        }
    }
}

/// The inner service's response in the body `M` makes, holding `held` (the slots of its
/// concurrency limits) until the body ends.
fn body<M: MakeBody<B>, B>(response: Response<B>, held: Option<HeldSlots>) -> Response<M::Body> {
    match held {
        None => response.map(M::inner),
        Some(held) => response.map(|b| M::held(b, held)),
    }
}
