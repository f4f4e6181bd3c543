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
use crate::deciding::Deciding;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::grpc::{self, ResponseStyle};
use crate::headers::RateLimitHeaders;
use crate::limiter::{Charges, Delayed, Later, Limiter, Settled};
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

/// What goes with the inner service's response: the headers to add, and the slots of
/// concurrency limits its body holds.
struct With {
    headers: Option<RateLimitHeaders>,
    held: Option<HeldSlots>,
}

/// The request and the inner service it goes to, kept while the request waits (for its
/// decision or its reserved slot): boxed with what it waits for, so that the response future,
/// which is moved several times on its way into the server, stays the size of the inner
/// service's future plus a little.
struct Pending<S, ReqB> {
    request: Request<ReqB>,
    inner: S,
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, F, C, R> {
        // Waiting for the decision, boxed with the request.
        Deciding {
            deciding: Option<Box<(Deciding<C>, Pending<S, ReqB>)>>,
        },
        // Admitted at a reserved slot: waiting until it comes.
        Delaying {
            sleep: Pin<Box<tokio::time::Sleep>>,
            pending: Option<Box<(Pending<S, ReqB>, Delayed)>>,
        },
        // The inner service called.
        Calling {
            #[pin]
            future: F,
            with: With,
        },
        // The charges after the response on their way to the store, with the response and the
        // slots it holds.
        Adjusting {
            #[pin]
            adjust: C,
            done: Option<(R, Option<HeldSlots>)>,
        },
        // The limiter's own response.
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
    /// A request whose decision comes later, as the engine began it.
    pub(crate) fn deciding(
        limiter: &Arc<Limiter<St>>,
        later: Later<<St as Sealed>::Future>,
        request: Request<ReqB>,
        inner: S,
    ) -> Self {
        ResponseFuture {
            state: State::Deciding {
                deciding: Some(Box::new((
                    Deciding::new(limiter, later),
                    Pending { request, inner },
                ))),
            },
            limiter: Some(limiter.clone()),
            after: Charges::new(),
            body: PhantomData,
        }
    }

    /// A request already settled: the limiter's response, or the inner service called.
    #[inline]
    pub(crate) fn settled(
        limiter: &Arc<Limiter<St>>,
        settled: Settled,
        after: Charges,
        request: Request<ReqB>,
        inner: &mut S,
    ) -> Self {
        let state = match settled {
            Settled::Wait(delayed) => {
                // The inner service was made ready: that one waits with the request, and a
                // clone stays behind.
                let clone = inner.clone();
                let ready = std::mem::replace(inner, clone);
                wait_for_slot(delayed, request, ready)
            }
            settled => respond_or_call(settled, request, inner, limiter.style()),
        };
        ResponseFuture {
            state,
            limiter: (!after.is_empty()).then(|| limiter.clone()),
            after,
            body: PhantomData,
        }
    }

    /// A request admitted at once ([`Settled::Call`]'s parts): the inner service called with
    /// the decision (if any) in the request's extensions, the headers to go on its response,
    /// the held slots with its body, and `after` to charge once its status is known.
    #[inline(always)]
    pub(crate) fn called(
        limiter: &Arc<Limiter<St>>,
        (headers, decision, held): (
            Option<RateLimitHeaders>,
            Option<Decision>,
            Option<HeldSlots>,
        ),
        after: Charges,
        request: Request<ReqB>,
        inner: &mut S,
    ) -> Self {
        ResponseFuture {
            state: call(headers, decision, held, request, inner),
            limiter: (!after.is_empty()).then(|| limiter.clone()),
            after,
            body: PhantomData,
        }
    }

    /// A request no policy applies to: the inner service's response, without headers.
    pub(crate) fn unlimited(future: S::Future) -> Self {
        let with = With {
            headers: None,
            held: None,
        };
        ResponseFuture {
            state: State::Calling { future, with },
            limiter: None,
            after: Charges::new(),
            body: PhantomData,
        }
    }
}

/// The state after a decision that came later: as [`respond_or_call`], the inner service
/// waiting with the request when it is admitted at a reserved slot.
fn decided<S, ReqB, C, R>(
    settled: Settled,
    Pending { request, mut inner }: Pending<S, ReqB>,
    style: ResponseStyle,
) -> State<S, ReqB, S::Future, C, R>
where
    S: Service<Request<ReqB>>,
{
    match settled {
        Settled::Wait(delayed) => wait_for_slot(delayed, request, inner),
        settled => respond_or_call(settled, request, &mut inner, style),
    }
}

/// Sleeps until the slot reserved for the request, with the inner service it then calls.
fn wait_for_slot<S, ReqB, C, R>(
    delayed: Box<Delayed>,
    request: Request<ReqB>,
    inner: S,
) -> State<S, ReqB, S::Future, C, R>
where
    S: Service<Request<ReqB>>,
{
    State::Delaying {
        sleep: Box::pin(tokio::time::sleep(delayed.wait)),
        pending: Some(Box::new((Pending { request, inner }, *delayed))),
    }
}

/// The limiter's own response (in the form `style` gives the request), or the inner service
/// called: [`Settled::Call`]'s, or a waiting request's whose slot came (its slots are then
/// spent, not given back).
#[inline]
fn respond_or_call<S, ReqB, C, R>(
    settled: Settled,
    request: Request<ReqB>,
    inner: &mut S,
    style: ResponseStyle,
) -> State<S, ReqB, S::Future, C, R>
where
    S: Service<Request<ReqB>>,
{
    match settled {
        Settled::Call(headers, decision, held) => call(headers, decision, held, request, inner),
        Settled::Respond(response) => {
            let response = match style.is_grpc(&request) {
                true => grpc::answer(response),
                false => response,
            };
            State::Ready {
                response: Some(response),
            }
        }
        Settled::Wait(delayed) => {
            let Delayed {
                headers,
                decision,
                release,
                held,
                ..
            } = *delayed;
            if let Some(release) = release {
                release.keep();
            }
            call(Some(headers), decision, held, request, inner)
        }
    }
}

/// Calls the inner service with the decision (if any) in the request's extensions; `headers`
/// go on its response, and `held` with its body.
#[inline(always)]
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
    let with = With { headers, held };
    State::Calling {
        future: inner.call(request),
        with,
    }
}

/// A waiting request whose slot came: it goes on (see [`respond_or_call`]).
fn slot_came<S, ReqB, C, R>(
    (Pending { request, mut inner }, delayed): (Pending<S, ReqB>, Delayed),
) -> State<S, ReqB, S::Future, C, R>
where
    S: Service<Request<ReqB>>,
{
    let settled = Settled::Wait(Box::new(delayed));
    respond_or_call(settled, request, &mut inner, ResponseStyle::Http)
}

impl<S, ReqB, St, M> fmt::Debug for ResponseFuture<S, ReqB, St, M>
where
    S: Service<Request<ReqB>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Deciding { .. } => "deciding",
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
            let next = match this.state.as_mut().project() {
                StateProj::Deciding { deciding } => {
                    let limiter = this.limiter.as_ref().expect(KEPT_FOR_LATER);
                    let waiting = &mut deciding.as_mut().expect(POLLED_AFTER_READY).0;
                    let (settled, after) = ready!(waiting.poll_settled(limiter, cx));
                    *this.after = after;
                    let (_, pending) = *deciding.take().expect(POLLED_AFTER_READY);
                    decided(settled, pending, limiter.style())
                }
                StateProj::Delaying { sleep, pending } => {
                    ready!(sleep.as_mut().poll(cx));
                    slot_came(*pending.take().expect(POLLED_AFTER_READY))
                }
                StateProj::Calling { future, with } => {
                    let mut response = ready!(future.poll(cx))?;
                    let (held, after) = (with.held.take(), std::mem::take(this.after));
                    let limiter = this.limiter.as_deref();
                    match charge_after(&mut response, with.headers.take(), limiter, after) {
                        None => return Poll::Ready(Ok(body::<M, _>(response, held))),
                        Some(adjust) => adjusting(adjust, response, held),
                    }
                }
                StateProj::Adjusting { adjust, done } => {
                    adjusted(ready!(adjust.poll(cx)));
                    let (response, held) = done.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(body::<M, _>(response, held)));
                }
                StateProj::Ready { response } => {
                    let response = response.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(response.map(M::full)));
                }
            };
            this.state.set(next);
        }
    }
}

/// The response waits for the charges after it.
fn adjusting<S, ReqB, F, C, R>(
    adjust: C,
    response: R,
    held: Option<HeldSlots>,
) -> State<S, ReqB, F, C, R> {
    State::Adjusting {
        adjust,
        done: Some((response, held)),
    }
}

/// The charges after the response are made, or failed (then logged: the response goes on).
fn adjusted(result: Result<Decision, StoreError>) {
    if let Err(error) = result {
        tracing::warn!(%error, "rate-limit charge or refund after the response failed");
    }
}

/// Adds `headers` to the inner service's response, and starts the charges and refunds
/// `after` makes for its status, if any.
#[inline]
fn charge_after<St: Store, B>(
    response: &mut Response<B>,
    headers: Option<RateLimitHeaders>,
    limiter: Option<&Limiter<St>>,
    after: Charges,
) -> Option<<St as Sealed>::Future> {
    if let Some(headers) = headers {
        headers.apply(response.headers_mut());
    }
    match limiter {
        Some(limiter) if !after.is_empty() => limiter.after_response(after, response.status()),
        _ => None,
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
