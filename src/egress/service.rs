//! The services of an [`EgressLayer`](super::EgressLayer): [`Egress`] outside the engine
//! (a refusal becomes an error), [`Upstream`] inside it, around the client (what the
//! upstream's answer says is learned).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::SystemTime;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::error::{EgressError, GaveUp};
use super::upstream;
use crate::body::ResponseBody;
use crate::decision::Decision;
use crate::future::ResponseFuture;
use crate::key::{Key, KeyExtractor, RequestRef};
use crate::layer::RateLimitLayer;
use crate::service::RateLimit;
use crate::store::Store;

/// What an egress layer learns from its upstream with: the layer (to pause a key on every
/// instance), the key a pause applies to, and the longest pause it takes.
pub(super) struct Learn<St> {
    pub(super) layer: RateLimitLayer<St>,
    pub(super) key: Arc<dyn KeyExtractor>,
    pub(super) max_pause: std::time::Duration,
}

/// A client service whose calls wait for their place in the layer's policies before they are
/// sent, and whose upstream's answers teach the policies (see [`EgressLayer`](super::EgressLayer)).
pub struct Egress<S, St> {
    pub(super) limit: RateLimit<Upstream<S, St>, St>,
}

impl<S: Clone, St> Clone for Egress<S, St> {
    fn clone(&self) -> Self {
        Egress {
            limit: self.limit.clone(),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for Egress<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").finish_non_exhaustive()
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for Egress<S, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = EgressError<S::Error>;
    type Future = EgressFuture<Upstream<S, St>, ReqB, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.limit.poll_ready(cx).map_err(EgressError::Upstream)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        EgressFuture {
            inner: self.limit.call(request),
        }
    }
}

pin_project! {
    /// The response future of [`Egress`]: the call's response, or why it was not sent.
    pub struct EgressFuture<S, ReqB, St>
    where
        S: Service<Request<ReqB>>,
        St: Store,
    {
        #[pin]
        inner: ResponseFuture<S, ReqB, St>,
    }
}

impl<S, St, ReqB, ResB> Future for EgressFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store,
{
    type Output = Result<Response<ResponseBody<ResB>>, EgressError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = ready!(self.project().inner.poll(cx)).map_err(EgressError::Upstream)?;
        if !response.body().is_limiters() {
            return Poll::Ready(Ok(response));
        }
        let decision = response.extensions().get::<Decision>();
        let refused = decision.filter(|d| !d.is_allowed()).map(Decision::tightest);
        let gave_up = GaveUp {
            reason: GaveUp::reason_of(response.status()),
            policy: refused.map_or_else(String::new, |p| p.policy().to_owned()),
            retry_after: decision
                .and_then(Decision::retry_after)
                .or_else(|| crate::grpc::retry_after_seconds(response.headers())),
        };
        let policy = if gave_up.policy.is_empty() {
            "none"
        } else {
            &gave_up.policy
        };
        metrics::counter!(
            "ratelimit_egress_gave_up_total",
            "policy" => policy.to_owned(),
            "reason" => gave_up.reason.label()
        )
        .increment(1);
        Poll::Ready(Err(EgressError::GaveUp(gave_up)))
    }
}

/// The client, inside the engine: what reaches it was admitted (after its wait), and its
/// upstream's answer is read for a pause.
pub struct Upstream<S, St> {
    inner: S,
    learn: Option<Arc<Learn<St>>>,
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for Upstream<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("inner", &self.inner)
            .field("learns", &self.learn.is_some())
            .finish()
    }
}

impl<S, St> Upstream<S, St> {
    pub(super) fn new(inner: S, learn: Option<Arc<Learn<St>>>) -> Self {
        Upstream { inner, learn }
    }
}

impl<S: Clone, St> Clone for Upstream<S, St> {
    fn clone(&self) -> Self {
        Upstream {
            inner: self.inner.clone(),
            learn: self.learn.clone(),
        }
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for Upstream<S, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    St: Store,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = UpstreamFuture<S::Future, ResB, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        if let Some(decision) = request.extensions().get::<Decision>() {
            waited(decision);
        }
        let learning = self.learn.as_ref().and_then(|learn| {
            let key = learn.key.extract(&RequestRef::new(&request)).ok()?;
            Some((learn.clone(), key))
        });
        UpstreamFuture {
            call: self.inner.call(request),
            learning,
            pausing: None,
        }
    }
}

/// Counts a call's wait for its booked time, by the policy that made it wait longest.
fn waited(decision: &Decision) {
    let longest = decision.outcomes().iter().max_by_key(|o| o.wait());
    if let Some(outcome) = longest.filter(|o| !o.wait().is_zero()) {
        let policy = outcome.policy().to_owned();
        metrics::counter!("ratelimit_egress_waited_total", "policy" => policy.clone()).increment(1);
        metrics::histogram!("ratelimit_egress_wait_seconds", "policy" => policy)
            .record(outcome.wait().as_secs_f64());
    }
}

/// A pause being kept in the store, with the response that asked for it.
type Pausing<R> = (Pin<Box<dyn Future<Output = ()> + Send>>, Option<R>);

pin_project! {
    /// The response future of [`Upstream`]: the client's response, once any pause it asks
    /// for is kept in the store (so that no call admitted after it is sent before it ends).
    pub struct UpstreamFuture<F, ResB, St> {
        #[pin]
        call: F,
        learning: Option<(Arc<Learn<St>>, Key)>,
        pausing: Option<Pausing<Response<ResB>>>,
    }
}

impl<F, ResB, E, St> Future for UpstreamFuture<F, ResB, St>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    St: Store,
{
    type Output = Result<Response<ResB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let Some((pause, response)) = this.pausing {
                ready!(pause.as_mut().poll(cx));
                let response = response.take().expect("polled after completion");
                return Poll::Ready(Ok(response));
            }
            let response = ready!(this.call.as_mut().poll(cx))?;
            let status = response.status();
            if upstream::refused(status) {
                metrics::counter!("ratelimit_egress_upstream_refused_total", "status" => status.as_str().to_owned())
                    .increment(1);
            }
            let asked = upstream::pause(status, response.headers(), SystemTime::now());
            let (Some((duration, source)), Some((learn, key))) = (asked, this.learning.take())
            else {
                return Poll::Ready(Ok(response));
            };
            metrics::counter!("ratelimit_egress_pauses_total", "source" => source.label())
                .increment(1);
            let duration = duration.min(learn.max_pause);
            let pause = async move {
                if let Err(error) = learn.layer.block_for(&key, duration).await {
                    tracing::warn!(%error, "the upstream's pause could not be kept in the store");
                }
            };
            *this.pausing = Some((Box::pin(pause), Some(response)));
        }
    }
}
