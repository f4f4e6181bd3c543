//! [`ResponseFuture`], the state machine of one request: tower glue around the
//! [engine](crate::limiter), which makes every decision.
//!
//! The future is one enum of four states. The common one is the inner service's future and
//! what goes on its response (a few words); a request waiting (for its decision, then maybe
//! for a booked time) and the charges after the response are boxed; the limiter's own
//! response (a `429`) is held inline. So the future is the size of the larger of the inner
//! future plus a few words and that response (`http::Response<Bytes>`), and building it in
//! `call` writes the inner future where it stays.

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

use crate::adaptive::Permits;
use crate::body::{BodyGuard, MakeBody, Wrapped};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::headers::RateLimitHeaders;
use crate::key::RequestRef;
use crate::limiter::{AfterResponse, Go, Limiter, Next};
use crate::refusal::Refusal;
use crate::store::Store;
use crate::store::private::Sealed;
use crate::waiting::Waiting;

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
        state: Phase<S, ReqB, S::Future, <St as Sealed>::Future, S::Response, Limiter<St>>,
        body: PhantomData<fn() -> M>,
    }
}

/// The charges and refunds to make once the response's status is known, with the engine that
/// makes them.
struct Charging<L> {
    limiter: Arc<L>,
    charges: Vec<AfterResponse>,
}

/// What goes with the inner service's response: the headers to add, the slots of concurrency
/// limits its body holds, and the charges its status decides (boxed, as few requests have
/// any). One value beside the future: the state is then built where it stays (with the three
/// as fields of the state, it is built aside and copied whole: about 70 instructions more a
/// request, `scripts/instructions.sh`).
struct With<L> {
    headers: Option<RateLimitHeaders>,
    held: Option<BodyGuard>,
    charging: Option<Box<Charging<L>>>,
}

/// The inner service's response (`R`) and the slots its body holds, waiting for the charges
/// after it (`C`: the store's future), with the headers the decision gave it and what makes
/// the headers of the charges' decision: a charge after the response tells what is left
/// after it (`RateLimitHeaders::after_charges`).
struct Adjusting<C, R> {
    charges: C,
    response: Option<R>,
    held: Option<BodyGuard>,
    headers: Option<RateLimitHeaders>,
    retell: Option<Retell>,
}

/// The headers of the decision of the charges after a response.
type Retell = Box<dyn FnOnce(&Decision) -> RateLimitHeaders + Send>;

pin_project! {
    #[project = PhaseProj]
    enum Phase<S, ReqB, F, C, R, L> {
        // The inner service called: the common state, not boxed.
        Calling {
            #[pin]
            future: F,
            with: With<L>,
        },
        // Before the inner service is called: boxed with the request.
        Waiting {
            waiting: Option<Box<Waiting<S, ReqB, C, L>>>,
        },
        // The charges after the response on their way to the store: boxed.
        Adjusting {
            adjusting: Box<Adjusting<C, R>>,
        },
        // The limiter's own response, inline (see the module's docs).
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
    fn new(state: Phase<S, ReqB, S::Future, St::Future, S::Response, Limiter<St>>) -> Self {
        ResponseFuture {
            state,
            body: PhantomData,
        }
    }

    /// A request as the engine began it (its `Next`): waiting (for its decision, or its
    /// booked time), answered with the limiter's response, or the inner service called.
    pub(crate) fn next(
        limiter: &Arc<Limiter<St>>,
        next: Next<<St as Sealed>::Future>,
        request: Request<ReqB>,
        inner: &mut S,
        permits: Permits,
    ) -> Self {
        let next = match next.settled() {
            Ok(answer) => return Self::new(answered(limiter, answer, request, inner, permits)),
            Err(next) => next,
        };
        // The inner service was made ready: that one waits with the request, and a clone
        // stays behind.
        let clone = inner.clone();
        let inner = std::mem::replace(inner, clone);
        let waiting = Waiting::new(limiter, next, request, inner, permits);
        Self::new(Phase::Waiting {
            waiting: Some(Box::new(waiting)),
        })
    }

    /// A request admitted at once ([`Next::Call`]'s parts), the inner service called
    /// (with the decision, if any, in the request's extensions): the headers to go on its
    /// response, the held slots with its body, and `after` to charge once its status is known.
    #[inline(always)]
    pub(crate) fn called(
        limiter: &Arc<Limiter<St>>,
        headers: Option<RateLimitHeaders>,
        held: Option<BodyGuard>,
        after: Vec<AfterResponse>,
        future: S::Future,
    ) -> Self {
        Self::new(calling(future, headers, held, charging(limiter, after)))
    }
}

/// The inner service's `future`, with the `headers` to go on its response, the `held` slots
/// to go with its body, and the charges `after` its status decides.
#[inline(always)]
fn calling<S, ReqB, F, C, R, L>(
    future: F,
    headers: Option<RateLimitHeaders>,
    held: Option<BodyGuard>,
    charging: Option<Box<Charging<L>>>,
) -> Phase<S, ReqB, F, C, R, L> {
    let with = With {
        headers,
        held,
        charging,
    };
    Phase::Calling { future, with }
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
fn charging<L>(limiter: &Arc<L>, charges: Vec<AfterResponse>) -> Option<Box<Charging<L>>> {
    (!charges.is_empty()).then(|| {
        let limiter = limiter.clone();
        Box::new(Charging { limiter, charges })
    })
}

/// Polls a waiting request: for its decision, then for its booked time, if any; then the
/// state it goes to (the inner service called, or the limiter's response; a waiting
/// request's booked units are then spent, not given back).
#[allow(clippy::type_complexity)]
fn poll_waiting<S, ReqB, St, R>(
    waiting: &mut Option<Box<Waiting<S, ReqB, <St as Sealed>::Future, Limiter<St>>>>,
    cx: &mut Context<'_>,
) -> Poll<Phase<S, ReqB, S::Future, <St as Sealed>::Future, R, Limiter<St>>>
where
    S: Service<Request<ReqB>>,
    St: Store,
{
    let w = waiting.as_mut().expect(POLLED_AFTER_READY);
    let (answer, request, permits) = ready!(w.poll_answer(cx));
    let limiter = w.limiter().clone();
    let phase = answered(&limiter, answer, request, &mut w.inner, permits);
    *waiting = None;
    Poll::Ready(phase)
}

/// The state a request's answer leads to: the limiter's own response (rendered as the
/// request is answered), or the inner service called.
fn answered<S, ReqB, C, R, St: Store>(
    limiter: &Arc<Limiter<St>>,
    answer: Result<Go, Refusal>,
    request: Request<ReqB>,
    inner: &mut S,
    permits: Permits,
) -> Phase<S, ReqB, S::Future, C, R, Limiter<St>>
where
    S: Service<Request<ReqB>>,
{
    match answer {
        Ok(go) => {
            let (headers, decision, held, after) = go.into_parts();
            let held = BodyGuard::held_with(held, permits);
            call(
                headers,
                decision,
                held,
                charging(limiter, after),
                request,
                inner,
            )
        }
        Err(refusal) => Phase::Ready {
            response: Some(rendered(limiter, refusal, &RequestRef::new(&request))),
        },
    }
}

/// The HTTP answer of `refusal` to `request`: its problem document (naming the calls over
/// of a denied batch), or its gRPC form.
pub(crate) fn rendered<St>(
    limiter: &Limiter<St>,
    refusal: Refusal,
    request: &RequestRef<'_>,
) -> Response<Bytes> {
    let responses = limiter.responses();
    let grpc = responses.style.is_grpc(request.headers());
    let calls = (!grpc)
        .then(|| limiter.calls_over(request, &refusal))
        .flatten();
    responses.render(refusal, grpc, calls)
}

/// Calls the inner service with the decision (if any) in the request's extensions; `headers`
/// go on its response, `held` with its body, and `after` is charged once its status is known.
#[inline(always)]
fn call<S, ReqB, C, R, L>(
    headers: Option<RateLimitHeaders>,
    decision: Option<Decision>,
    held: Option<BodyGuard>,
    charging: Option<Box<Charging<L>>>,
    mut request: Request<ReqB>,
    inner: &mut S,
) -> Phase<S, ReqB, S::Future, C, R, L>
where
    S: Service<Request<ReqB>>,
{
    with_decision(&mut request, decision);
    calling(inner.call(request), headers, held, charging)
}

impl<S, ReqB, St, M> fmt::Debug for ResponseFuture<S, ReqB, St, M>
where
    S: Service<Request<ReqB>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            Phase::Waiting { .. } => "waiting",
            Phase::Calling { .. } => "calling",
            Phase::Adjusting { .. } => "adjusting",
            Phase::Ready { .. } => "ready",
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
                PhaseProj::Calling { future, with } => {
                    match ready!(poll_called(future, with, cx)) {
                        Ok(Ok((response, held))) => {
                            return Poll::Ready(Ok(body::<M, _>(response, held)));
                        }
                        Ok(Err(adjusting)) => Phase::Adjusting { adjusting },
                        Err(error) => return Poll::Ready(Err(error)),
                    }
                }
                PhaseProj::Waiting { waiting } => ready!(poll_waiting(waiting, cx)),
                PhaseProj::Adjusting { adjusting } => {
                    let (response, held) = ready!(adjusting.poll(cx));
                    return Poll::Ready(Ok(body::<M, _>(response, held)));
                }
                PhaseProj::Ready { response } => {
                    let response = response.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(response.map(M::full)));
                }
            };
            state.set(next);
        }
    }
}

/// What the inner service's future gave, once it did: its error (the held slots told the
/// request failed), or its response as [`responded`] makes it.
#[allow(clippy::type_complexity)]
#[inline(always)]
fn poll_called<St: Store, F, B, E>(
    future: Pin<&mut F>,
    with: &mut With<Limiter<St>>,
    cx: &mut Context<'_>,
) -> Poll<Result<Responded<St, B>, E>>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    let response = match ready!(future.poll(cx)) {
        Ok(response) => response,
        Err(error) => {
            if let Some(held) = &mut with.held {
                held.responded(true);
            }
            return Poll::Ready(Err(error));
        }
    };
    let (headers, held, charging) = (with.headers.take(), with.held.take(), with.charging.take());
    Poll::Ready(Ok(responded(headers, held, charging, response)))
}

/// The inner service's response with the slots its body holds, or the charges after it on
/// their way with it.
type Responded<St, B> =
    Result<(Response<B>, Option<BodyGuard>), Box<Adjusting<<St as Sealed>::Future, Response<B>>>>;

/// The inner service's response with the headers it gets, and the slots its body holds; or,
/// when its status calls for charges after it, those charges on their way with it.
#[allow(clippy::type_complexity)]
#[inline(always)]
fn responded<St: Store, B>(
    headers: Option<RateLimitHeaders>,
    mut held: Option<BodyGuard>,
    charging: Option<Box<Charging<Limiter<St>>>>,
    mut response: Response<B>,
) -> Responded<St, B> {
    if let Some(held) = &mut held {
        held.responded(response.status().is_server_error());
    }
    let mut retell = None;
    let charges = charging.and_then(|charging| {
        let Charging { limiter, charges } = *charging;
        let (call, meter) = limiter.after_response(charges, head(&response));
        if let Some(meter) = meter {
            held = Some(BodyGuard::metered(held.take(), meter));
        }
        let (call, checks) = call?;
        retell = Some(Box::new(move |decision: &Decision| {
            limiter.response_headers(decision, Some(&checks))
        }) as Retell);
        Some(call)
    });
    match charges {
        None => {
            if let Some(headers) = headers {
                headers.apply(response.headers_mut());
            }
            Ok((response, held))
        }
        Some(charges) => Err(Box::new(Adjusting {
            charges,
            response: Some(response),
            held,
            headers,
            retell,
        })),
    }
}

impl<C, B> Adjusting<C, Response<B>>
where
    C: Future<Output = Result<Decision, StoreError>> + Unpin,
{
    /// The response once the charges after it are made, or failed (then logged: the response
    /// goes on), with its headers: the charges' where they tell what is left after them.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<(Response<B>, Option<BodyGuard>)> {
        let charged = ready!(Pin::new(&mut self.charges).poll(cx));
        let mut headers = self.headers.take();
        match charged {
            Ok(decision) => {
                if let Some(retell) = self.retell.take() {
                    headers = headers.map(|said| said.after_charges(retell(&decision)));
                }
            }
            Err(error) => {
                tracing::warn!(%error, "rate-limit charge or refund after the response failed");
            }
        }
        let mut response = self.response.take().expect(POLLED_AFTER_READY);
        if let Some(headers) = headers {
            headers.apply(response.headers_mut());
        }
        Poll::Ready((response, self.held.take()))
    }
}

/// What the charges after `response` read of it: its status, headers and extensions.
fn head<B>(response: &Response<B>) -> (http::StatusCode, &http::HeaderMap, &http::Extensions) {
    (response.status(), response.headers(), response.extensions())
}

/// The inner service's response in the body `M` makes, holding `held` (the slots of its
/// concurrency limits) until the body ends.
fn body<M: MakeBody<B>, B>(response: Response<B>, held: Option<BodyGuard>) -> Response<M::Body> {
    match held {
        None => response.map(M::inner),
        Some(held) => response.map(|b| M::held(b, held)),
    }
}
