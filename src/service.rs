//! [`RateLimit`], the middleware service.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::error::{StoreError, StoreErrorKind};
use crate::future::ResponseFuture;
use crate::future::{AfterResponse, Guard};
use crate::key::RequestRef;
use crate::layer::Shared;
use crate::resilience::Permit;
use crate::store::{Check, Checks, Mode, Store};

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
        // The inner service was driven to readiness. It is called right here when the answer
        // is known at once; when it must wait for the store, the ready one goes with the
        // future and a clone stays behind.
        let inner = &mut self.inner;
        let take_ready = |inner: &mut S| {
            let clone = inner.clone();
            mem::replace(inner, clone)
        };
        if shared.exempt.as_ref().is_some_and(|f| f(&view)) {
            return ResponseFuture::unlimited(inner.call(request));
        }
        let mut checks = Checks::default();
        let mut fallback = shared.fallback.as_ref().map(|_| Checks::default());
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
                    return ResponseFuture::ready(response);
                }
            };
            let tier = policy.tier(&view, &key);
            let handle = &policy.tiers[tier];
            let cost = policy.cost(&view);
            if let Some(when) = &policy.charge_if {
                after.push(AfterResponse::new(handle, &key, cost, Mode::Enforce, when));
            }
            if let Some(when) = &policy.refund_if {
                after.push(AfterResponse::new(handle, &key, cost, Mode::Refund, when));
            }
            if let (Some(fallback), Some(local)) = (&mut fallback, &policy.fallback) {
                fallback.push(Check::new(
                    local[tier].clone(),
                    key.clone(),
                    cost,
                    policy.mode(),
                ));
            }
            checks.push(Check::new(handle.clone(), key, cost, policy.mode()));
        }
        if checks.is_empty() {
            return ResponseFuture::unlimited(inner.call(request));
        }
        // The layer's clock is read only when the deny cache or an open breaker needs it.
        let now = std::cell::OnceCell::new();
        let now = || *now.get_or_init(|| shared.clock.now_micros());
        if let Some(decision) = shared
            .deny_cache
            .as_ref()
            .and_then(|c| c.lookup(&checks, now()))
        {
            metrics::counter!("ratelimit_deny_cache_hits_total").increment(1);
            return ResponseFuture::denied(shared, decision);
        }
        let remember = shared.deny_cache.is_some().then(|| {
            checks
                .iter()
                .map(|c| (c.policy.id, c.key.clone(), c.cost))
                .collect()
        });
        let permit = shared
            .breaker
            .as_ref()
            .map_or(Permit::Call, |b| b.permit(now));
        let mut guard = Guard {
            permit,
            fallback,
            remember,
            started: None,
            decision: None,
        };
        if permit == Permit::Reject {
            let error = StoreError::with_kind(
                StoreErrorKind::CircuitOpen,
                "the circuit breaker is open; the store was not asked",
            );
            let inner = take_ready(inner);
            return ResponseFuture::failed(shared, error, request, inner, guard);
        }
        if let Some(decision) = shared.store.decide_now(&checks) {
            return ResponseFuture::decided(shared, decision, request, inner, after, guard);
        }
        guard.started = Some(std::time::Instant::now());
        let check = shared.store.check(checks);
        let inner = take_ready(inner);
        ResponseFuture::checking(shared, check, request, inner, after, guard)
    }
}
