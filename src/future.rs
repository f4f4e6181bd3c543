//! [`ResponseFuture`], the state machine of one request.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::decision::Decision;
use crate::error::{FailurePolicy, StoreError, StoreErrorKind};
use crate::headers::RateLimitHeaders;
use crate::key::Key;
use crate::layer::Shared;
use crate::policy::StatusFn;
use crate::resilience::Permit;
use crate::store::{Check, Checks, Mode, PolicyHandle, Store};

/// A charge or refund that depends on the response's status.
pub(crate) struct AfterResponse {
    handle: Arc<PolicyHandle>,
    key: Key,
    cost: u64,
    mode: Mode,
    when: StatusFn,
}

impl AfterResponse {
    pub(crate) fn new(
        handle: &Arc<PolicyHandle>,
        key: &Key,
        cost: u64,
        mode: Mode,
        when: &StatusFn,
    ) -> Self {
        AfterResponse {
            handle: handle.clone(),
            key: key.clone(),
            cost,
            mode,
            when: when.clone(),
        }
    }
}

/// What a request's decision needs besides the store: the breaker's permit, the local fallback
/// checks, and what to remember in the deny cache.
pub(crate) struct Guard {
    pub(crate) permit: Permit,
    pub(crate) fallback: Option<Checks>,
    pub(crate) remember: Option<Vec<(u32, Key, u64)>>,
    /// When the store was asked, for `ratelimit_store_duration_seconds` (not timed for a store
    /// that decides synchronously).
    pub(crate) started: Option<Instant>,
    /// The decision, on its way into the request's extensions.
    pub(crate) decision: Option<Decision>,
}

/// What to do once the decision is known.
enum Settled {
    /// Call the inner service, adding these headers (none when the limiter failed open).
    Call(Option<RateLimitHeaders>),
    /// Answer with the limiter's own response.
    Respond(Response<Bytes>),
}

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): waits for the decision, then
    /// either calls the inner service or yields the limiter's own response; after the inner
    /// response, makes the charges and refunds that depend on its status.
    pub struct ResponseFuture<S, ReqB, St>
    where
        S: Service<Request<ReqB>>,
        St: Store,
    {
        #[pin]
        state: State<S, ReqB, S::Future, St::Future, S::Response>,
        // The layer, kept only while the future still needs it (a decision to wait for, or
        // charges after the response): most requests touch no shared reference count.
        shared: Option<Arc<Shared<St>>>,
        after: Vec<AfterResponse>,
    }
}

/// What waits for a decision from an asynchronous store: boxed, so that the response future,
/// which is moved several times on its way into the server, stays the size of the inner
/// service's future plus a little.
struct Pending<S, ReqB> {
    request: Request<ReqB>,
    inner: S,
    guard: Guard,
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, F, C, R> {
        Checking {
            #[pin]
            check: C,
            pending: Option<Box<Pending<S, ReqB>>>,
        },
        Failed {
            error: Option<StoreError>,
            pending: Option<Box<Pending<S, ReqB>>>,
        },
        Calling {
            #[pin]
            future: F,
            headers: Option<RateLimitHeaders>,
        },
        Adjusting {
            #[pin]
            adjust: C,
            response: Option<R>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB, St> ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>>,
    St: Store,
{
    pub(crate) fn checking(
        shared: &Arc<Shared<St>>,
        check: St::Future,
        request: Request<ReqB>,
        inner: S,
        after: Vec<AfterResponse>,
        guard: Guard,
    ) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                pending: Some(Box::new(Pending {
                    request,
                    inner,
                    guard,
                })),
            },
            shared: Some(shared.clone()),
            after,
        }
    }

    /// A decision made synchronously (the memory store): settled, and the inner service
    /// called, before the future is first polled.
    pub(crate) fn decided(
        shared: &Arc<Shared<St>>,
        decision: Decision,
        request: Request<ReqB>,
        inner: &mut S,
        mut after: Vec<AfterResponse>,
        mut guard: Guard,
    ) -> Self {
        let state = decided(shared, &mut guard, &mut after, Ok(decision), request, inner);
        ResponseFuture {
            state,
            shared: (!after.is_empty()).then(|| shared.clone()),
            after,
        }
    }

    /// The store was not asked (the breaker is open): straight to the failure policy.
    pub(crate) fn failed(
        shared: &Arc<Shared<St>>,
        error: StoreError,
        request: Request<ReqB>,
        inner: S,
        guard: Guard,
    ) -> Self {
        ResponseFuture {
            state: State::Failed {
                error: Some(error),
                pending: Some(Box::new(Pending {
                    request,
                    inner,
                    guard,
                })),
            },
            shared: Some(shared.clone()),
            after: Vec::new(),
        }
    }

    /// A denial known without asking the store (the deny cache).
    pub(crate) fn denied(shared: &Shared<St>, decision: Decision) -> Self {
        let headers = RateLimitHeaders::new(&decision, shared.headers);
        let mut response = shared.responses.limited(&decision, &headers);
        response.extensions_mut().insert(decision);
        Self::ready(response)
    }

    /// A request no policy applies to: the inner service's response, without headers.
    pub(crate) fn unlimited(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                headers: None,
            },
            shared: None,
            after: Vec::new(),
        }
    }

    pub(crate) fn ready(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
            shared: None,
            after: Vec::new(),
        }
    }
}

impl<S, ReqB, St> fmt::Debug for ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Failed { .. } => "failed",
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
const KEPT_FOR_LATER: &str = "the layer is kept while a decision or a charge is to come";

impl<S, ReqB, ResB, St> Future for ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    St: Store,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            // Waiting for the decision (or failed without one) ends here; every other state
            // finishes or moves on by itself.
            let (result, pending) = match this.state.as_mut().project() {
                StateProj::Checking { check, pending } => {
                    let result = ready!(check.poll(cx));
                    (result, pending.take())
                }
                StateProj::Failed { error, pending } => {
                    let error = error.take().expect(POLLED_AFTER_READY);
                    (Err(error), pending.take())
                }
                StateProj::Calling { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    let status = response.status();
                    let adjust: Checks = this
                        .after
                        .drain(..)
                        .filter(|a| (a.when)(status))
                        .map(|a| Check::new(a.handle, a.key, a.cost, a.mode))
                        .collect();
                    if adjust.is_empty() {
                        return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                    }
                    let shared = this.shared.as_ref().expect(KEPT_FOR_LATER);
                    let adjust = shared.store.check(adjust);
                    this.state.set(State::Adjusting {
                        adjust,
                        response: Some(response),
                    });
                    continue;
                }
                StateProj::Adjusting { adjust, response } => {
                    if let Err(error) = ready!(adjust.poll(cx)) {
                        tracing::warn!(%error, "rate-limit charge or refund after the response failed");
                    }
                    let response = response.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
                StateProj::Ready { response } => {
                    let response = response.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                }
            };
            let Pending {
                request,
                mut inner,
                mut guard,
            } = *pending.expect(POLLED_AFTER_READY);
            let shared = this.shared.as_ref().expect(KEPT_FOR_LATER);
            let next = decided(shared, &mut guard, this.after, result, request, &mut inner);
            this.state.set(next);
        }
    }
}

/// The state that follows the store's answer: the limiter's own response, or the inner
/// service called.
fn decided<S, ReqB, St: Store>(
    shared: &Shared<St>,
    guard: &mut Guard,
    after: &mut Vec<AfterResponse>,
    result: Result<Decision, StoreError>,
    request: Request<ReqB>,
    inner: &mut S,
) -> State<S, ReqB, S::Future, St::Future, S::Response>
where
    S: Service<Request<ReqB>>,
{
    match settle(shared, guard, after, result) {
        Settled::Respond(response) => State::Ready {
            response: Some(response),
        },
        Settled::Call(headers) => State::Calling {
            future: call(inner, request, guard),
            headers,
        },
    }
}

/// Calls the inner service, with the decision (if any) in the request's extensions.
fn call<S, ReqB>(inner: &mut S, mut request: Request<ReqB>, guard: &mut Guard) -> S::Future
where
    S: Service<Request<ReqB>>,
{
    if let Some(decision) = guard.decision.take() {
        request.extensions_mut().insert(decision);
    }
    inner.call(request)
}

/// Turns the store's answer into what to do, applying the breaker, the deny cache, the failure
/// policy and the metrics.
fn settle<St: Store>(
    shared: &Shared<St>,
    guard: &mut Guard,
    after: &mut Vec<AfterResponse>,
    result: Result<Decision, StoreError>,
) -> Settled {
    let now = || shared.clock.now_micros();
    if let Some(started) = guard.started {
        metrics::histogram!("ratelimit_store_duration_seconds")
            .record(started.elapsed().as_secs_f64());
    }
    let decision = match result {
        Ok(decision) => {
            if let Some(breaker) = &shared.breaker {
                breaker.success(guard.permit);
            }
            if let (Some(cache), Some(keys), false) =
                (&shared.deny_cache, &guard.remember, decision.is_allowed())
            {
                cache.remember(keys, &decision, now());
            }
            decision
        }
        Err(error) => {
            if let (Some(breaker), true) =
                (&shared.breaker, error.kind() != StoreErrorKind::CircuitOpen)
            {
                breaker.failure(guard.permit, now());
            }
            // No decision from the store: nothing to charge or refund there afterwards.
            after.clear();
            let policy = match shared.failure {
                FailurePolicy::Open => "open",
                FailurePolicy::Closed => "closed",
                FailurePolicy::Local { .. } => "local",
            };
            metrics::counter!(
                "ratelimit_degraded_total",
                "reason" => error.kind().as_str(),
                "failure_policy" => policy
            )
            .increment(1);
            match (shared.failure, &shared.fallback, guard.fallback.take()) {
                (FailurePolicy::Local { .. }, Some(local), Some(checks)) => {
                    tracing::warn!(%error, "rate-limit store failed; deciding locally");
                    local.decide(&checks)
                }
                (FailurePolicy::Closed, _, _) => {
                    tracing::warn!(%error, "rate-limit store failed; answering 503");
                    return Settled::Respond(shared.responses.unavailable());
                }
                _ => {
                    tracing::warn!(%error, "rate-limit store failed; letting the request through");
                    return Settled::Call(None);
                }
            }
        }
    };
    for o in decision.outcomes() {
        o.handle().count(o.outcome());
    }
    let headers = RateLimitHeaders::new(&decision, shared.headers);
    if decision.is_allowed() {
        if decision.shadow_violated().next().is_some() {
            tracing::info!(
                policies = ?decision.shadow_violated().map(|o| o.policy()).collect::<Vec<_>>(),
                "shadow rate limit exceeded; request let through"
            );
        }
        guard.decision = Some(decision);
        Settled::Call(Some(headers))
    } else {
        tracing::debug!(policy = decision.binding().policy(), "rate limit exceeded");
        let mut response = shared.responses.limited(&decision, &headers);
        response.extensions_mut().insert(decision);
        Settled::Respond(response)
    }
}
