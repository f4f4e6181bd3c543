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
use crate::layer::Shared;
use crate::store::Store;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): waits for the decision, then
    /// either calls the inner service or yields the limiter's own response.
    pub struct ResponseFuture<S, ReqB, St>
    where
        S: Service<Request<ReqB>>,
        St: Store,
    {
        #[pin]
        state: State<S, ReqB, S::Future, St::Future>,
        shared: Arc<Shared<St>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, F, C> {
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
    ) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                request: Some(request),
                inner: Some(inner),
            },
            shared,
        }
    }

    pub(crate) fn ready(shared: Arc<Shared<St>>, response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
            shared,
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
                            let headers = RateLimitHeaders::new(&decision);
                            request.extensions_mut().insert(decision);
                            Some(headers)
                        }
                        Ok(decision) => {
                            let headers = RateLimitHeaders::new(&decision);
                            tracing::debug!(
                                policy = decision.binding().policy(),
                                "rate limit exceeded"
                            );
                            let mut response =
                                this.shared.responses.limited(&decision, &headers);
                            response.extensions_mut().insert(decision);
                            return Poll::Ready(Ok(response.map(ResponseBody::full)));
                        }
                        Err(error) => match this.shared.failure {
                            FailurePolicy::Open => {
                                tracing::warn!(%error, "rate-limit store failed; letting the request through");
                                None
                            }
                            FailurePolicy::Closed => {
                                tracing::warn!(%error, "rate-limit store failed; answering 503");
                                let response = this.shared.responses.unavailable();
                                return Poll::Ready(Ok(response.map(ResponseBody::full)));
                            }
                        },
                    };
                    let future = inner.call(request);
                    this.state.set(State::Calling { future, headers });
                }
                StateProj::Calling { future, headers } => {
                    let response = ready!(future.poll(cx))?;
                    let mut response = response.map(ResponseBody::inner);
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Ready { response } => {
                    let response = response.take().expect(POLLED_AFTER_READY);
                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                }
            }
        }
    }
}
