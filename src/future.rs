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
    pub(crate) started: Instant,
    /// The decision, on its way into the request's extensions.
    pub(crate) decision: Option<Decision>,
}

impl Guard {
    fn none() -> Self {
        Guard {
            permit: Permit::Call,
            fallback: None,
            remember: None,
            started: Instant::now(),
            decision: None,
        }
    }
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
        shared: Arc<Shared<St>>,
        after: Vec<AfterResponse>,
        guard: Guard,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, F, C, R> {
        Checking {
            #[pin]
            check: C,
            request: Option<Request<ReqB>>,
            inner: Option<S>,
        },
        Failed {
            error: Option<StoreError>,
            request: Option<Request<ReqB>>,
            inner: Option<S>,
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
        shared: Arc<Shared<St>>,
        check: St::Future,
        request: Request<ReqB>,
        inner: S,
        after: Vec<AfterResponse>,
        guard: Guard,
    ) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                request: Some(request),
                inner: Some(inner),
            },
            shared,
            after,
            guard,
        }
    }

    /// The store was not asked (the breaker is open): straight to the failure policy.
    pub(crate) fn failed(
        shared: Arc<Shared<St>>,
        error: StoreError,
        request: Request<ReqB>,
        inner: S,
        guard: Guard,
    ) -> Self {
        ResponseFuture {
            state: State::Failed {
                error: Some(error),
                request: Some(request),
                inner: Some(inner),
            },
            shared,
            after: Vec::new(),
            guard,
        }
    }

    /// A denial known without asking the store (the deny cache).
    pub(crate) fn denied(shared: Arc<Shared<St>>, decision: Decision) -> Self {
        let headers = RateLimitHeaders::new(&decision, shared.headers);
        let mut response = shared.responses.limited(&decision, &headers);
        response.extensions_mut().insert(decision);
        Self::ready(shared, response)
    }

    /// A request no policy applies to: the inner service's response, without headers.
    pub(crate) fn unlimited(shared: Arc<Shared<St>>, future: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                headers: None,
            },
            shared,
            after: Vec::new(),
            guard: Guard::none(),
        }
    }

    pub(crate) fn ready(shared: Arc<Shared<St>>, response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
            shared,
            after: Vec::new(),
            guard: Guard::none(),
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
            let (result, request, inner) = match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    request,
                    inner,
                } => {
                    let result = ready!(check.poll(cx));
                    (result, request.take(), inner.take())
                }
                StateProj::Failed {
                    error,
                    request,
                    inner,
                } => {
                    let error = error.take().expect(POLLED_AFTER_READY);
                    (Err(error), request.take(), inner.take())
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
                    let adjust = this.shared.store.check(adjust);
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
            let request = request.expect(POLLED_AFTER_READY);
            let inner = inner.expect(POLLED_AFTER_READY);
            match settle(this.shared, this.guard, this.after, result) {
                Settled::Respond(r) => return Poll::Ready(Ok(r.map(ResponseBody::full))),
                Settled::Call(headers) => {
                    let future = call(inner, request, this.guard);
                    this.state.set(State::Calling { future, headers });
                }
            }
        }
    }
}

/// Calls the inner service, with the decision (if any) in the request's extensions.
fn call<S, ReqB>(mut inner: S, mut request: Request<ReqB>, guard: &mut Guard) -> S::Future
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
    metrics::histogram!("ratelimit_store_duration_seconds")
        .record(guard.started.elapsed().as_secs_f64());
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
        let outcome = match (o.is_allowed(), o.is_shadow()) {
            (true, _) => "allowed",
            (false, false) => "limited",
            (false, true) => "shadow_limited",
        };
        metrics::counter!(
            "ratelimit_decisions_total",
            "policy" => o.policy_name(),
            "outcome" => outcome
        )
        .increment(1);
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
