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
use crate::grpc;
use crate::headers::RateLimitHeaders;
use crate::key::RequestRef;
use crate::limiter::{AfterResponse, Limiter, Next};
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
        if !next.waits() {
            return Self::new(respond_or_call(limiter, next, request, inner, permits));
        }
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
    let next = ready!(w.poll_next(cx));
    let request = w.request.take().expect(POLLED_AFTER_READY);
    let permits = w.take_permits();
    let phase = respond_or_call(&w.limiter, next, request, &mut w.inner, permits);
    *waiting = None;
    Poll::Ready(phase)
}

/// The limiter's own response (in the form its style gives the request), or the inner
/// service called: [`Next::Call`]'s, or a waiting request's whose booked time came (its
/// units are then spent, not given back).
fn respond_or_call<S, ReqB, C, R, St: Store>(
    limiter: &Arc<Limiter<St>>,
    next: Next<<St as Sealed>::Future>,
    request: Request<ReqB>,
    inner: &mut S,
    permits: Permits,
) -> Phase<S, ReqB, S::Future, C, R, Limiter<St>>
where
    S: Service<Request<ReqB>>,
{
    let (headers, decision, held, after) = match next {
        Next::Call {
            headers,
            decision,
            held,
            after,
        } => (headers, decision, held, after),
        Next::Respond(response) => {
            let response = match limiter.style().is_grpc(&request) {
                true => grpc::answer(response),
                false => limiter.responded(&RequestRef::new(&request), response),
            };
            return Phase::Ready {
                response: Some(response),
            };
        }
        Next::Wait { release, then, .. } => {
            if let Some(release) = release {
                release.spend();
            }
            let Next::Call {
                headers,
                decision,
                held,
                after,
            } = *then
            else {
                unreachable!("a request that waited goes on to the inner service");
            };
            (headers, decision, held, after)
        }
        Next::Store(..) | Next::Pending(_) => {
            unreachable!("a step that waits is awaited first")
        }
    };
    call(
        headers,
        decision,
        BodyGuard::held_with(held, permits),
        charging(limiter, after),
        request,
        inner,
    )
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
                    let response = match ready!(future.poll(cx)) {
                        Ok(response) => response,
                        Err(error) => {
                            if let Some(held) = &mut with.held {
                                held.responded(true);
                            }
                            return Poll::Ready(Err(error));
                        }
                    };
                    let (headers, held, charging) =
                        (with.headers.take(), with.held.take(), with.charging.take());
                    match responded(headers, held, charging, response) {
                        Ok((response, held)) => {
                            return Poll::Ready(Ok(body::<M, _>(response, held)));
                        }
                        Err(adjusting) => Phase::Adjusting { adjusting },
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

/// The inner service's response with the headers it gets, and the slots its body holds; or,
/// when its status calls for charges after it, those charges on their way with it.
#[allow(clippy::type_complexity)]
#[inline(always)]
fn responded<St: Store, B>(
    headers: Option<RateLimitHeaders>,
    mut held: Option<BodyGuard>,
    charging: Option<Box<Charging<Limiter<St>>>>,
    mut response: Response<B>,
) -> Result<(Response<B>, Option<BodyGuard>), Box<Adjusting<<St as Sealed>::Future, Response<B>>>> {
    if let Some(held) = &mut held {
        held.responded(response.status().is_server_error());
    }
    let mut retell = None;
    let charges = charging.and_then(|charging| {
        let Charging { limiter, charges } = *charging;
        let (call, meter) = limiter.after_response(charges, &response);
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

/// The inner service's response in the body `M` makes, holding `held` (the slots of its
/// concurrency limits) until the body ends.
fn body<M: MakeBody<B>, B>(response: Response<B>, held: Option<BodyGuard>) -> Response<M::Body> {
    match held {
        None => response.map(M::inner),
        Some(held) => response.map(|b| M::held(b, held)),
    }
}
