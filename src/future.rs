//! [`ResponseFuture`], the state machine of one request: tower glue around the
//! [engine](crate::limiter), which makes every decision.
//!
//! The future is one enum whose common state is the inner service's future and what goes on
//! its response (a few words): everything rarer (a decision to wait for, a reserved slot, the
//! charges after the response) is boxed, so that building the future in `call` writes the inner
//! future where it stays, and each move on its way into the server copies little more than it.

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
        state: State<S, ReqB, S::Future, <St as Sealed>::Future, S::Response, Limiter<St>>,
        body: PhantomData<fn() -> M>,
    }
}

/// The charges and refunds to make once the response's status is known, with the engine that
/// makes them: boxed, as few requests have any.
type After<L> = Option<Box<(Arc<L>, Charges)>>;

/// What goes with the inner service's response: the headers to add, the slots of concurrency
/// limits its body holds, and the charges its status decides.
struct With<L> {
    headers: Option<RateLimitHeaders>,
    held: Option<HeldSlots>,
    after: After<L>,
}

/// The request and the inner service it goes to, kept while the request waits (for its
/// decision or its reserved slot), boxed with what it waits for.
struct Pending<S, ReqB> {
    request: Request<ReqB>,
    inner: S,
}

/// A request waiting for its decision: what it waits for, the engine that settles it.
type Waiting<S, ReqB, C, L> = (Deciding<C>, Pending<S, ReqB>, Arc<L>);

/// A request admitted at a reserved slot, waiting until it comes.
type ForSlot<S, ReqB, L> = (Pending<S, ReqB>, Delayed, After<L>);

/// The inner service's response waiting for the charges after it (`C`), with the slots its
/// body holds.
type Adjust<C, R> = (C, Option<(R, Option<HeldSlots>)>);

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, F, C, R, L> {
        // The inner service called: the common state, the only one not boxed.
        Calling {
            #[pin]
            future: F,
            with: With<L>,
        },
        // Waiting for the decision, boxed with the request.
        Deciding {
            waiting: Option<Box<Waiting<S, ReqB, C, L>>>,
        },
        // Admitted at a reserved slot: waiting until it comes.
        Delaying {
            sleep: Pin<Box<tokio::time::Sleep>>,
            pending: Option<Box<ForSlot<S, ReqB, L>>>,
        },
        // The charges after the response on their way to the store.
        Adjusting {
            adjust: Box<Adjust<C, R>>,
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
    #[inline(always)]
    fn new(state: State<S, ReqB, S::Future, St::Future, S::Response, Limiter<St>>) -> Self {
        ResponseFuture {
            state,
            body: PhantomData,
        }
    }

    /// A request whose decision comes later, as the engine began it.
    pub(crate) fn deciding(
        limiter: &Arc<Limiter<St>>,
        later: Later<<St as Sealed>::Future>,
        request: Request<ReqB>,
        inner: S,
    ) -> Self {
        let deciding = Deciding::new(limiter, later);
        let waiting = (deciding, Pending { request, inner }, limiter.clone());
        Self::new(State::Deciding {
            waiting: Some(Box::new(waiting)),
        })
    }

    /// A request already settled: the limiter's response, or the inner service called.
    pub(crate) fn settled(
        limiter: &Arc<Limiter<St>>,
        settled: Settled,
        after: Charges,
        request: Request<ReqB>,
        inner: &mut S,
    ) -> Self {
        let after = after_of(limiter, after);
        Self::new(match settled {
            Settled::Wait(delayed) => {
                // The inner service was made ready: that one waits with the request, and a
                // clone stays behind.
                let clone = inner.clone();
                let ready = std::mem::replace(inner, clone);
                wait_for_slot(delayed, request, ready, after)
            }
            settled => respond_or_call(settled, request, inner, limiter.style(), after),
        })
    }

    /// A request admitted at once ([`Settled::Call`]'s parts), the inner service called
    /// (with the decision, if any, in the request's extensions): the headers to go on its
    /// response, the held slots with its body, and `after` to charge once its status is known.
    #[inline(always)]
    pub(crate) fn called(
        limiter: &Arc<Limiter<St>>,
        headers: Option<RateLimitHeaders>,
        held: Option<HeldSlots>,
        after: Charges,
        future: S::Future,
    ) -> Self {
        Self::new(calling(future, headers, held, after_of(limiter, after)))
    }

    /// A request no policy applies to: the inner service's response, without headers.
    #[inline(always)]
    pub(crate) fn unlimited(future: S::Future) -> Self {
        Self::new(calling(future, None, None, None))
    }
}

/// The inner service's `future`, with the `headers` to go on its response, the `held` slots
/// to go with its body, and the charges `after` its status decides.
#[inline(always)]
fn calling<S, ReqB, F, C, R, L>(
    future: F,
    headers: Option<RateLimitHeaders>,
    held: Option<HeldSlots>,
    after: After<L>,
) -> State<S, ReqB, F, C, R, L> {
    let with = With {
        headers,
        held,
        after,
    };
    State::Calling { future, with }
}

/// Puts the decision (if any) in `request`'s extensions, for the inner service.
#[inline(always)]
pub(crate) fn with_decision<B>(request: &mut Request<B>, decision: Option<Decision>) {
    if let Some(decision) = decision {
        request.extensions_mut().insert(decision);
    }
}

/// `charges` with the engine that makes them, if there are any.
#[inline(always)]
fn after_of<L>(limiter: &Arc<L>, charges: Charges) -> After<L> {
    (!charges.is_empty()).then(|| Box::new((limiter.clone(), charges)))
}

/// The state after a decision that came later: as [`respond_or_call`], the inner service
/// waiting with the request when it is admitted at a reserved slot.
fn decided<S, ReqB, C, R, L>(
    settled: Settled,
    Pending { request, mut inner }: Pending<S, ReqB>,
    style: ResponseStyle,
    after: After<L>,
) -> State<S, ReqB, S::Future, C, R, L>
where
    S: Service<Request<ReqB>>,
{
    match settled {
        Settled::Wait(delayed) => wait_for_slot(delayed, request, inner, after),
        settled => respond_or_call(settled, request, &mut inner, style, after),
    }
}

/// Sleeps until the slot reserved for the request, with the inner service it then calls.
fn wait_for_slot<S, ReqB, C, R, L>(
    delayed: Box<Delayed>,
    request: Request<ReqB>,
    inner: S,
    after: After<L>,
) -> State<S, ReqB, S::Future, C, R, L>
where
    S: Service<Request<ReqB>>,
{
    State::Delaying {
        sleep: Box::pin(tokio::time::sleep(delayed.wait)),
        pending: Some(Box::new((Pending { request, inner }, *delayed, after))),
    }
}

/// The limiter's own response (in the form `style` gives the request), or the inner service
/// called: [`Settled::Call`]'s, or a waiting request's whose slot came (its slots are then
/// spent, not given back).
fn respond_or_call<S, ReqB, C, R, L>(
    settled: Settled,
    request: Request<ReqB>,
    inner: &mut S,
    style: ResponseStyle,
    after: After<L>,
) -> State<S, ReqB, S::Future, C, R, L>
where
    S: Service<Request<ReqB>>,
{
    let (headers, decision, held) = match settled {
        Settled::Call {
            headers,
            decision,
            held,
        } => (headers, decision, held),
        Settled::Respond(response) => {
            let response = match style.is_grpc(&request) {
                true => grpc::answer(response),
                false => response,
            };
            return State::Ready {
                response: Some(response),
            };
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
            (Some(headers), decision, held)
        }
    };
    call(headers, decision, held, after, request, inner)
}

/// Calls the inner service with the decision (if any) in the request's extensions; `headers`
/// go on its response, `held` with its body, and `after` is charged once its status is known.
#[inline(always)]
fn call<S, ReqB, C, R, L>(
    headers: Option<RateLimitHeaders>,
    decision: Option<Decision>,
    held: Option<HeldSlots>,
    after: After<L>,
    mut request: Request<ReqB>,
    inner: &mut S,
) -> State<S, ReqB, S::Future, C, R, L>
where
    S: Service<Request<ReqB>>,
{
    with_decision(&mut request, decision);
    calling(inner.call(request), headers, held, after)
}

/// A waiting request whose slot came: it goes on (see [`respond_or_call`]).
fn slot_came<S, ReqB, C, R, L>(
    (Pending { request, mut inner }, delayed, after): ForSlot<S, ReqB, L>,
) -> State<S, ReqB, S::Future, C, R, L>
where
    S: Service<Request<ReqB>>,
{
    let settled = Settled::Wait(Box::new(delayed));
    respond_or_call(settled, request, &mut inner, ResponseStyle::Http, after)
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

impl<S, ReqB, ResB, St, M> Future for ResponseFuture<S, ReqB, St, M>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store,
    M: MakeBody<ResB>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Calling { future, with } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(headers) = with.headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    let held = with.held.take();
                    match with
                        .after
                        .take()
                        .and_then(|after| charge(*after, &response))
                    {
                        None => return Poll::Ready(Ok(body::<M, _>(response, held))),
                        Some(adjust) => State::Adjusting {
                            adjust: Box::new((adjust, Some((response, held)))),
                        },
                    }
                }
                StateProj::Deciding { waiting } => {
                    let (deciding, _, limiter) = &mut **waiting.as_mut().expect(POLLED_AFTER_READY);
                    let (settled, after) = ready!(deciding.poll_settled(limiter, cx));
                    let (_, pending, limiter) = *waiting.take().expect(POLLED_AFTER_READY);
                    let after = after_of(&limiter, after);
                    decided(settled, pending, limiter.style(), after)
                }
                StateProj::Delaying { sleep, pending } => {
                    ready!(sleep.as_mut().poll(cx));
                    slot_came(*pending.take().expect(POLLED_AFTER_READY))
                }
                StateProj::Adjusting { adjust } => {
                    adjusted(ready!(Pin::new(&mut adjust.0).poll(cx)));
                    let (response, held) = adjust.1.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(body::<M, _>(response, held)));
                }
                StateProj::Ready { response } => {
                    let response = response.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(response.map(M::full)));
                }
            };
            state.set(next);
        }
    }
}

/// Starts the charges and refunds that the response's status decides, if any.
fn charge<St: Store, B>(
    (limiter, charges): (Arc<Limiter<St>>, Charges),
    response: &Response<B>,
) -> Option<<St as Sealed>::Future> {
    limiter.after_response(charges, response.status())
}

/// The charges after the response are made, or failed (then logged: the response goes on).
fn adjusted(result: Result<Decision, StoreError>) {
    if let Err(error) = result {
        tracing::warn!(%error, "rate-limit charge or refund after the response failed");
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
