//! [`RateLimit`], the middleware service.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::future::ResponseFuture;
use crate::key::RequestRef;
use crate::limiter::{Begin, Limiter};
use crate::store::Store;

/// The middleware made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// For each request it extracts the keys, asks the store for a decision, and then either calls
/// the inner service (adding the rate-limit headers to its response) or answers by itself.
/// `poll_ready` only asks the inner service: being over the limit is a `429` response, never
/// back-pressure, and store failures are answered according to the
/// [`FailurePolicy`](crate::FailurePolicy), so the error type is the inner service's.
pub struct RateLimit<S, St> {
    inner: S,
    limiter: Arc<Limiter<St>>,
}

impl<S, St> RateLimit<S, St> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter<St>>) -> Self {
        RateLimit { inner, limiter }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Takes the inner service out.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St> Clone for RateLimit<S, St> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug> fmt::Debug for RateLimit<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .finish()
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let begin = self.limiter.begin(&RequestRef::new(&request));
        match begin {
            Begin::Unlimited => ResponseFuture::unlimited(self.inner.call(request)),
            Begin::Settled(settled, after) => {
                ResponseFuture::settled(&self.limiter, settled, after, request, &mut self.inner)
            }
            Begin::Wait(check, ticket) => {
                // The inner service was driven to readiness: that one goes with the future, and
                // a clone stays behind.
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::waiting(&self.limiter, check, ticket, request, inner)
            }
        }
    }
}
