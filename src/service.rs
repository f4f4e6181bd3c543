//! [`RateLimit`], the middleware service.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::future::AfterResponse;
use crate::future::ResponseFuture;
use crate::key::RequestRef;
use crate::layer::Shared;
use crate::store::{Check, Mode, Store};

/// The middleware made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// For each request it extracts the keys, asks the store for a decision, and then either calls
/// the inner service (adding the rate-limit headers to its response) or answers by itself.
/// `poll_ready` only asks the inner service: being over the limit is a `429` response, never
/// back-pressure, and store failures are answered according to the
/// [`FailurePolicy`](crate::FailurePolicy), so the error type is the inner service's.
pub struct RateLimit<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S, St> RateLimit<S, St> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St>>) -> Self {
        RateLimit { inner, shared }
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
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug> fmt::Debug for RateLimit<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared)
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
        let shared = &self.shared;
        let view = RequestRef::new(&request);
        // The inner service was driven to readiness; keep that one and leave a clone behind.
        let clone = self.inner.clone();
        let mut inner = mem::replace(&mut self.inner, clone);
        if shared.exempt.as_ref().is_some_and(|f| f(&view)) {
            return ResponseFuture::unlimited(shared.clone(), inner.call(request));
        }
        let mut checks = Vec::with_capacity(shared.policies.len());
        let mut after = Vec::new();
        for policy in shared.policies.iter() {
            if !policy.applies(&view) {
                continue;
            }
            let key = match policy.key.extract(&view) {
                Ok(key) => key,
                Err(rejection) => {
                    tracing::debug!(
                        policy = &*policy.tiers[0].name,
                        code = rejection.code(),
                        "rate-limit key rejected"
                    );
                    let response = shared.responses.rejected(&rejection);
                    return ResponseFuture::ready(shared.clone(), response);
                }
            };
            let handle = policy.handle(&view, &key).clone();
            let cost = policy.cost(&view);
            if let Some(when) = &policy.charge_if {
                after.push(AfterResponse::new(&handle, &key, cost, Mode::Enforce, when));
            }
            if let Some(when) = &policy.refund_if {
                after.push(AfterResponse::new(&handle, &key, cost, Mode::Refund, when));
            }
            checks.push(Check::new(handle, key, cost, policy.mode()));
        }
        if checks.is_empty() {
            return ResponseFuture::unlimited(shared.clone(), inner.call(request));
        }
        let check = shared.store.check(checks);
        ResponseFuture::checking(shared.clone(), check, request, inner, after)
    }
}
