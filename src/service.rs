//! [`RateLimit`], the middleware service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::adaptive::Permits;
use crate::body::BodyGuard;
use crate::body::{MakeBody, Wrapped};
use crate::future::{ResponseFuture, with_decision};
use crate::key::RequestRef;
use crate::limiter::{Limiter, Next};
use crate::store::Store;

/// The middleware made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// For each request it extracts the keys, asks the store for a decision, and then either calls
/// the inner service (adding the rate-limit headers to its response) or answers by itself.
/// `poll_ready` only asks the inner service: being over the limit is a `429` response, never
/// back-pressure, and store failures are answered according to the
/// [`FailurePolicy`](crate::FailurePolicy), so the error type is the inner service's.
///
/// `M` says how responses carry their bodies (see [`MakeBody`]).
pub struct RateLimit<S, St, M = Wrapped> {
    inner: S,
    limiter: Arc<Limiter<St>>,
    body: PhantomData<fn() -> M>,
}

impl<S, St, M> RateLimit<S, St, M> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter<St>>) -> Self {
        RateLimit {
            inner,
            limiter,
            body: PhantomData,
        }
    }

    /// The engine it asks.
    pub(crate) fn limiter(&self) -> &Arc<Limiter<St>> {
        &self.limiter
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

impl<S: Clone, St, M> Clone for RateLimit<S, St, M> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            body: PhantomData,
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, M> fmt::Debug for RateLimit<S, St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .finish()
    }
}

impl<S, St, M, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, St, M>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store,
    M: MakeBody<ResB>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, St, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqB>) -> Self::Future {
        let mut permits = Permits::new();
        match self.limiter.begin(&RequestRef::new(&request), &mut permits) {
            // The common case, with the request moved as little as it can be.
            Next::Call(go) => {
                let (headers, decision, held, after) = go.into_parts();
                let held = BodyGuard::held_with(held, permits);
                with_decision(&mut request, decision);
                let future = self.inner.call(request);
                ResponseFuture::called(&self.limiter, headers, held, after, future)
            }
            next => {
                let limiter = &self.limiter;
                ResponseFuture::next(limiter, next, request, &mut self.inner, permits)
            }
        }
    }
}
