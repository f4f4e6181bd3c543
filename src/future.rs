//! [`ResponseFuture`], the state machine of one request.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::error::FailurePolicy;
use crate::headers::RateLimitHeaders;
use crate::key::Key;
use crate::layer::Shared;
use crate::policy::StatusFn;
use crate::store::{Check, Mode, PolicyHandle, Store};

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
    ) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                request: Some(request),
                inner: Some(inner),
            },
            shared,
            after,
        }
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
        }
    }

    pub(crate) fn ready(shared: Arc<Shared<St>>, response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
            shared,
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
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    request,
                    inner,
                } => {
                    let result = ready!(check.poll(cx));
                    let mut request = request.take().expect(POLLED_AFTER_READY);
                    let mut inner = inner.take().expect(POLLED_AFTER_READY);
                    let headers = match result {
                        Ok(decision) if decision.is_allowed() => {
                            let headers = RateLimitHeaders::new(&decision, this.shared.headers);
                            if decision.shadow_violated().next().is_some() {
                                tracing::info!(
                                    policies = ?decision.shadow_violated().map(|o| o.policy()).collect::<Vec<_>>(),
                                    "shadow rate limit exceeded; request let through"
                                );
                            }
                            request.extensions_mut().insert(decision);
                            Some(headers)
                        }
                        Ok(decision) => {
                            let headers = RateLimitHeaders::new(&decision, this.shared.headers);
                            tracing::debug!(
                                policy = decision.binding().policy(),
                                "rate limit exceeded"
                            );
                            let mut response = this.shared.responses.limited(&decision, &headers);
                            response.extensions_mut().insert(decision);
                            return Poll::Ready(Ok(response.map(ResponseBody::full)));
                        }
                        Err(error) => {
                            // No decision, so nothing to charge or refund afterwards.
                            this.after.clear();
                            match this.shared.failure {
                                FailurePolicy::Open => {
                                    tracing::warn!(%error, "rate-limit store failed; letting the request through");
                                    None
                                }
                                FailurePolicy::Closed => {
                                    tracing::warn!(%error, "rate-limit store failed; answering 503");
                                    let response = this.shared.responses.unavailable();
                                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                                }
                            }
                        }
                    };
                    let future = inner.call(request);
                    this.state.set(State::Calling { future, headers });
                }
                StateProj::Calling { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    let status = response.status();
                    let adjust: Vec<Check> = this
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
            }
        }
    }
}
