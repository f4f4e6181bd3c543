//! The services of an [`EgressLayer`](super::EgressLayer): [`Egress`] outside the engine
//! (a refusal becomes an error), [`Upstream`] inside it, around the client (what the
//! upstream's answer says is learned).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use smallvec::SmallVec;

use super::adaptive::{self, Adapt, Change};
use super::error::{EgressError, GaveUp, Reason};
use super::{counts, upstream};
use crate::body::ResponseBody;
use crate::decision::Decision;
use crate::future::ResponseFuture;
use crate::key::{Key, KeyExtractor, RequestRef};
use crate::layer::RateLimitLayer;
use crate::policy::Tier;
use crate::refusal::Refused;
use crate::service::RateLimit;
use crate::store::{Op, Store};

/// What an egress layer learns from its upstream with: the layer (to pause a key on every
/// instance), the key a pause applies to, and the longest pause it takes.
pub(super) struct Learn<St> {
    pub(super) layer: RateLimitLayer<St>,
    pub(super) key: Arc<dyn KeyExtractor>,
    pub(super) max_pause: Duration,
    /// One policy never charged, whose key is blocked for as long as its upstream's pause:
    /// what a call that booked its time looks at before it is sent (the layer's own policies
    /// cannot tell a pause from a schedule booked ahead).
    pub(super) pause: RateLimitLayer<St>,
    /// The adaptive rate, if the layer has one.
    pub(super) adapt: Option<Adapt<St>>,
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
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    St: Store,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = EgressError<S::Error>;
    type Future = EgressFuture<S, ReqB, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.limit.poll_ready(cx)
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
        Upstream<S, St>: Service<Request<ReqB>>,
        St: Store,
    {
        #[pin]
        inner: ResponseFuture<Upstream<S, St>, ReqB, St>,
    }
}

impl<S, St, ReqB, ResB> Future for EgressFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    St: Store,
{
    type Output = Result<Response<ResponseBody<ResB>>, EgressError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = ready!(self.project().inner.poll(cx))?;
        if !response.body().is_limiters() {
            return Poll::Ready(Ok(response));
        }
        Poll::Ready(Err(EgressError::GaveUp(gave_up(&response))))
    }
}

/// Why the engine answered a call itself (not sending it), as its answer says, counted.
fn gave_up<B>(response: &Response<B>) -> GaveUp {
    let refused = response.extensions().get::<Refused>();
    let gave_up = refused.map_or_else(GaveUp::unknown, GaveUp::of);
    let policy = match gave_up.policy.as_str() {
        "" => "none".to_owned(),
        policy => policy.to_owned(),
    };
    metrics::counter!(
        "ratelimit_egress_gave_up_total",
        "policy" => policy,
        "reason" => gave_up.reason.label()
    )
    .increment(1);
    gave_up
}

/// The client, inside the engine: what reaches it was admitted (after its wait), and its
/// upstream's answer is read for a pause. A call that waited for its booked time first asks
/// whether its upstream paused meanwhile (another instance may have learned it): if so, it
/// books a time after the pause, or gives up.
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

/// A call held until its upstream's pause is over, then sent.
type Held<R, E> = Pin<Box<dyn Future<Output = Result<R, EgressError<E>>> + Send>>;

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for Upstream<S, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    St: Store,
{
    type Response = Response<ResB>;
    type Error = EgressError<S::Error>;
    type Future = UpstreamFuture<S::Future, ResB, S::Error, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(EgressError::Upstream)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let decision = request.extensions().get::<Decision>();
        let booked = decision.and_then(|d| {
            waited(d);
            let units = d
                .outcomes()
                .iter()
                .filter_map(|o| o.booking())
                .map(|g| g.units);
            units.max()
        });
        let learning = self.learn.as_ref().and_then(|learn| {
            let key = learn.key.extract(&RequestRef::new(&request)).ok()?;
            Some(Learning {
                learn: learn.clone(),
                key,
                seen: decision.map(seen).unwrap_or_default(),
            })
        });
        match (learning, booked) {
            (Some(learning), Some(units)) => {
                // The ready service goes with the call; a clone stays for the next one.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let held = State::Held {
                    held: Box::pin(async move {
                        hold(&learning.learn, &learning.key, units)
                            .await
                            .map_err(EgressError::GaveUp)?;
                        let response = inner.call(request).await.map_err(EgressError::Upstream)?;
                        if let Some(learned) = learning.learned(&response) {
                            learned.await;
                        }
                        Ok(response)
                    }),
                };
                UpstreamFuture { state: held }
            }
            (learning, _) => UpstreamFuture {
                state: State::Sent {
                    call: self.inner.call(request),
                    learning,
                    pausing: None,
                },
            },
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

/// Holds a call that waited for its booked time while its upstream is paused (a pause learned
/// after the call booked it): books `units` again, after the pause, and waits for that time;
/// gives up when that is past the longest wait. A store that cannot answer holds nothing. A
/// call dropped while it waits gives the time it booked again back, as the engine's future
/// gives back the first.
async fn hold<St: Store>(learn: &Learn<St>, key: &Key, units: u64) -> Result<(), GaveUp> {
    let units = u32::try_from(units).unwrap_or(u32::MAX);
    while let Ok(seen) = learn.pause.control().peek(key).await
        && !seen.is_allowed()
    {
        let Ok(again) = learn.layer.check(key, units).await else {
            return Ok(());
        };
        if !again.is_allowed() {
            let policy = again.tightest().policy().to_owned();
            return Err(GaveUp {
                reason: Reason::Limited,
                policy,
                retry_after: again.retry_after(),
            });
        }
        // Dropped while it waits (a timeout above the call), the call gives its time back.
        let booked = learn.layer.limiter().booked_for(key, &again);
        tokio::time::sleep(again.wait()).await;
        if let Some(booked) = booked {
            booked.keep();
        }
    }
    Ok(())
}

/// The adaptive rate's directions (the metric's labels).
const DOWN: &str = "down";
const UP: &str = "up";

/// What a call's learning works with: the layer's, the call's key, and what its policies
/// had left when they admitted it.
struct Learning<St> {
    learn: Arc<Learn<St>>,
    key: Key,
    seen: Seen,
}

/// What each rate policy that admitted a call had.
type Seen = SmallVec<[Admitted; 2]>;

/// A rate policy that admitted a call: its tier, its limit and window, and what it had left.
struct Admitted {
    tier: Arc<Tier>,
    limit: u64,
    window: Duration,
    remaining: u64,
}

/// What `decision`'s rate policies had left.
fn seen(decision: &Decision) -> Seen {
    let outcomes = decision.outcomes().iter();
    let rates = outcomes.filter(|o| !o.tier().limits_in_flight());
    rates
        .map(|o| Admitted {
            tier: o.tier().clone(),
            limit: o.limit(),
            window: o.window(),
            remaining: o.remaining(),
        })
        .collect()
}

impl<St: Store> Learning<St> {
    /// What the layer learns from `response`, kept in the store by the future returned (none
    /// when there is nothing to learn): the pause it asks for, and the units the upstream
    /// says it has left under a policy's limit, fewer than the policy had left when it
    /// admitted the call (the others' calls the upstream counted: charged here too).
    fn learned<B>(self, response: &Response<B>) -> Option<BoxFuture> {
        let (status, headers) = (response.status(), response.headers());
        let refusal = upstream::refusal(status, headers);
        let (pause, fewer) = match refusal.is_some() || upstream::names_a_limit(headers) {
            true => (asked(refusal, response), self.fewer(response)),
            false => (None, SmallVec::new()),
        };
        // An adaptive rate moves on answers that say nothing else: down on a refusal, up on
        // an answer the upstream gave (not its own failure).
        let quiet = pause.is_none() && fewer.is_empty();
        let step = match refusal {
            Some(_) => quiet.then_some(DOWN),
            None => (quiet && !status.is_server_error()).then_some(UP),
        };
        let adapting = step.and_then(|step| self.adapting(step));
        if quiet && adapting.is_none() {
            return None;
        }
        Some(Box::pin(async move {
            if let Some(duration) = pause {
                keep(&self.learn, &self.key, duration).await;
            }
            if !fewer.is_empty() {
                self.correct(&fewer).await;
            }
            if let Some((changes, direction)) = adapting {
                self.adapt(&changes, direction).await;
            }
        }))
    }

    /// The changes of the key's limits the adaptive rate makes in direction `step`: lower
    /// ([`DOWN`]), or higher ([`UP`]) while a limit is lowered and this instance may try;
    /// with their direction.
    fn adapting(&self, step: &'static str) -> Option<(Vec<Change>, &'static str)> {
        let adapt = self.learn.adapt.as_ref()?;
        if self.seen.is_empty() {
            return None;
        }
        let control = self.learn.layer.controls();
        let configured = |t: &Tier| control.configured_limit(t.id()).unwrap_or(t.limit());
        let seen = self.seen.iter().map(|a| (&a.tier, a.limit));
        let changes = match step {
            DOWN => adapt.lowered(seen, configured),
            _ => adapt.raised(&self.key, control.engine().now_us(), seen, configured)?,
        };
        (!changes.is_empty()).then_some((changes, step))
    }

    /// Makes `changes` of the key's limits (a raise once the gate lets it through).
    async fn adapt(&self, changes: &[Change], direction: &'static str) {
        let Some(adapt) = &self.learn.adapt else {
            return;
        };
        let now = self.learn.layer.limiter().now_us();
        match direction {
            DOWN => adapt.hold_raises(&self.key, now).await,
            _ if !adapt.may_raise(&self.key).await => return,
            _ => {}
        }
        let until = adapt.until(now);
        adaptive::apply(&self.learn.layer, &self.key, changes, until, direction).await;
    }

    /// Of each policy whose limit the upstream reports: its tier's id and how many units
    /// fewer the upstream has left than it had.
    fn fewer<B>(&self, response: &Response<B>) -> SmallVec<[(u32, u64); 2]> {
        if self.seen.is_empty() {
            return SmallVec::new();
        }
        let counts = counts::counts(response.headers());
        let mut fewer = SmallVec::new();
        for seen in &self.seen {
            let left = counts.iter().filter(|c| c.is_of(seen.limit, seen.window));
            let left = left.map(|c| c.remaining()).min();
            if let Some(left) = left.filter(|&l| l < seen.remaining) {
                fewer.push((seen.tier.id(), seen.remaining - left));
            }
        }
        fewer
    }

    /// Charges the call's key `fewer`'s units in each policy named (at most its capacity).
    async fn correct(&self, fewer: &[(u32, u64)]) {
        let units = |tier: &Tier| {
            let found = fewer.iter().find(|(id, _)| *id == tier.id());
            let units = found.map_or(0, |(_, units)| *units);
            units.min(tier.algorithm().reported_limit())
        };
        let limiter = self.learn.layer.limiter();
        let corrected = limiter.key_decision(&self.key, Some(Op::Penalize), units);
        match corrected.await {
            Ok(decision) => {
                let policies = decision.outcomes().iter();
                let policies =
                    policies.filter(|o| fewer.iter().any(|(id, _)| *id == o.tier().id()));
                for outcome in policies {
                    let policy = outcome.policy().to_owned();
                    metrics::counter!("ratelimit_egress_corrected_total", "policy" => policy)
                        .increment(1);
                }
            }
            Err(error) => {
                tracing::warn!(%error, "the upstream's remaining count could not be kept in the store");
            }
        }
    }
}

/// Keeps a pause of `key` in the store for every instance: for the decisions to come (a
/// block of the policies' key), and for the calls that booked a time before it (which look
/// at the pause's own policy before they are sent).
async fn keep<St: Store>(learn: &Learn<St>, key: &Key, duration: Duration) {
    let duration = duration.min(learn.max_pause);
    let kept = learn.layer.control().block_for(key, duration).await;
    let seen = learn.pause.control().block_for(key, duration).await;
    if let Some(error) = kept.err().or(seen.err()) {
        tracing::warn!(%error, "the upstream's pause could not be kept in the store");
    }
}

/// The pause `response` (a `refusal`, or not) asks for, if any, counted.
fn asked<B>(refusal: Option<&'static str>, response: &Response<B>) -> Option<Duration> {
    if let Some(status) = refusal {
        metrics::counter!("ratelimit_egress_upstream_refused_total", "status" => status)
            .increment(1);
    }
    let (duration, source) =
        upstream::pause(response.status(), response.headers(), SystemTime::now())?;
    metrics::counter!("ratelimit_egress_pauses_total", "source" => source.label()).increment(1);
    Some(duration)
}

/// What is learned from a response being kept in the store.
type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What is learned from a response being kept in the store, with the response.
type Pausing<R> = (BoxFuture, Option<R>);

pin_project! {
    /// The response future of [`Upstream`]: the client's response, once any pause it asks
    /// for is kept in the store (so that no call admitted after it is sent before it ends).
    pub struct UpstreamFuture<F, ResB, E, St> {
        #[pin]
        state: State<F, ResB, E, St>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, ResB, E, St> {
        // Sent at once: the common case, not boxed.
        Sent {
            #[pin]
            call: F,
            learning: Option<Learning<St>>,
            pausing: Option<Pausing<Response<ResB>>>,
        },
        // Sent once its upstream's pause is over (a call that waited).
        Held { held: Held<Response<ResB>, E> },
    }
}

impl<F, ResB, E, St> Future for UpstreamFuture<F, ResB, E, St>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    ResB: Send + 'static,
    St: Store,
{
    type Output = Result<Response<ResB>, EgressError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (mut call, learning, pausing) = match self.project().state.project() {
            StateProj::Held { held } => return held.as_mut().poll(cx),
            StateProj::Sent {
                call,
                learning,
                pausing,
            } => (call, learning, pausing),
        };
        loop {
            if let Some((pause, response)) = pausing {
                ready!(pause.as_mut().poll(cx));
                let response = response.take().expect("polled after completion");
                return Poll::Ready(Ok(response));
            }
            let response = ready!(call.as_mut().poll(cx)).map_err(EgressError::Upstream)?;
            let learned = learning.take().and_then(|l| l.learned(&response));
            let Some(learned) = learned else {
                return Poll::Ready(Ok(response));
            };
            *pausing = Some((learned, Some(response)));
        }
    }
}
