//! The request engine: where a request is decided.
//!
//! A [`Limiter`] owns the compiled policies, the store and everything around it (deny cache,
//! circuit breaker, failure policy, responses, metrics). A request goes through three steps,
//! all of them here:
//!
//! 1. **plan**: which policies apply, each one's key, tier and cost, the checks of the local
//!    fallback, and the charges that wait for the response's status;
//! 2. **pre-check**: the deny cache may answer at once, the circuit breaker may keep the store
//!    from being asked; otherwise the store decides, at once (memory) or later (Redis);
//! 3. **answer**: the store's answer, or its failure, becomes the request's [`Next`] step: call
//!    the inner service with headers to add, or answer with the limiter's own response. The
//!    breaker, the deny cache, the failure policy and the metrics are updated on the way.
//!
//! [`Limiter::begin`] does the first two, through the lane the policy set was given when it
//! was built ([`Lane`](route::Lane)), and answers when the store's answer is known at once;
//! [`Limiter::answered`] takes an answer that came later, and [`Limiter::after_response`] the
//! charges that depend on the response's status. The service and its future only move requests,
//! responses and futures between these calls. The administrative operations of
//! [`RateLimitLayer`](crate::RateLimitLayer) are decided here too.

use std::cell::OnceCell;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tracing::Span;

use crate::adaptive::Permits;
use crate::clock::Clock;
use crate::error::{ConfigError, FailurePolicy, KeyRejection, StoreError, StoreErrorKind};
use crate::headers::HeaderConfig;
use crate::key::{Key, KeyExtractor, RequestRef};
use crate::lease::{self, Leases};
use crate::lists::LayerLists;
use crate::policy::{CompiledPolicy, CostFn, Policy, RequestFn};
use crate::refusal::Refusal;
use crate::resilience::{Breaker, CircuitBreaker, DenyCache, Gate, Remembered};
use crate::response::Responses;
use crate::store::{Check, Checks, MemoryStore, Store};
use crate::telemetry::{decision_span, record_outcome, record_policies, traced};
use crate::top::{TopLimited, Tracker};

mod adaptive;
mod alone;
pub(crate) use alone::Keyed;
mod bodies;
mod head;
pub(crate) use head::{Charged, Head, Looking};
mod answer;
mod admin;
mod control;
pub(crate) use control::Control;
mod after;
mod policies;
mod route;
mod give_back;
mod failure;
mod lists;
mod near;
mod steps;
mod next;
mod drive;
pub(crate) use drive::Driver;
use next::Planned;
pub(crate) use next::{AfterResponse, Go, Next, Ticket};

use route::{Around, Pending, PolicySet, Route, Steps};

/// What a layer is configured with, besides its store: the builder fills it in, and
/// [`Limiter::new`] checks and compiles it.
pub(crate) struct Config {
    pub(crate) policies: Vec<Policy>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) cost: Option<CostFn>,
    pub(crate) exempt: Option<RequestFn>,
    pub(crate) responses: Responses,
    pub(crate) failure: FailurePolicy,
    pub(crate) headers: HeaderConfig,
    /// The secret of the IETF `pk` parameter, if it is sent.
    pub(crate) partition_secret: Option<Vec<u8>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) breaker: Option<CircuitBreaker>,
    pub(crate) deny_cache: Option<usize>,
    /// Whether an admitted request carries its [`Decision`] in its extensions.
    pub(crate) decision_extension: bool,
    /// The summary of the keys each policy denied, if kept.
    pub(crate) top: Option<TopLimited>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("policies", &self.policies)
            .field("key", &self.key)
            .field("responses", &self.responses)
            .field("failure", &self.failure)
            .field("headers", &self.headers)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache)
            .field("decision_extension", &self.decision_extension)
            .field("top", &self.top)
            .finish_non_exhaustive()
    }
}

/// The engine every clone of a layer, and every service it makes, shares.
pub(crate) struct Limiter<St> {
    store: St,
    /// The route of the policies, swapped whole by [`Limiter::reload`].
    policies: PolicySet,
    /// The layer's key (for the policies without their own, the lists' entries, the bodies
    /// being read).
    key: Arc<dyn KeyExtractor>,
    responses: Responses,
    failure: FailurePolicy,
    headers: HeaderConfig,
    exempt: Option<RequestFn>,
    clock: Arc<dyn Clock>,
    breaker: Option<Breaker>,
    deny_cache: Option<DenyCache>,
    /// What this instance saw denied, answered while the store fails (a store that may fail).
    remembered: Option<Remembered>,
    decision_extension: bool,
    /// The local store of [`FailurePolicy::Local`].
    fallback: Option<MemoryStore>,
    /// The leases this instance holds, once a policy takes leases.
    leases: OnceLock<Arc<Leases>>,
    /// The keys warned of being near their limit.
    near: crate::near::Warned,
    /// The keys each policy denied most, when the layer keeps them.
    top: Option<Arc<Tracker>>,
    /// The allow and deny lists, when the layer has them.
    lists: Option<LayerLists>,
    /// How the layer reads the bodies its policies need, if it does.
    bodies: Option<crate::request_body::BodyLimits>,
    /// The bodies being read per key, when it reads bodies.
    readers: Option<Arc<crate::request_body::Readers>>,
    /// When (layer clock) a store failure was last logged at `warn`, and how many were
    /// logged at `debug` since.
    warned: AtomicU64,
    unwarned: AtomicU64,
}

impl<St: fmt::Debug> fmt::Debug for Limiter<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("store", &self.store)
            .field("policies", &self.policies)
            .field("responses", &self.responses)
            .field("failure", &self.failure)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl<St> Limiter<St> {
    /// How the limiter's own responses are written.
    pub(crate) fn responses(&self) -> &Responses {
        &self.responses
    }

    /// The status of a request over a limit.
    pub(crate) fn limited_status(&self) -> http::StatusCode {
        self.responses.status
    }

    /// The store.
    pub(crate) fn store(&self) -> &St {
        &self.store
    }

    /// The leases this instance holds, if a policy takes leases.
    fn leases(&self) -> Option<&Arc<Leases>> {
        self.leases.get()
    }
}

impl<St: Store> Limiter<St> {
    /// Checks the whole configuration, registers the policies in `store`, and builds the
    /// engine, with the allow and deny `lists`, the hook of warnings near the limit, and the
    /// limits of the bodies it reads (`None`: it reads none); with what its administration
    /// keeps.
    pub(crate) fn build(
        store: St,
        config: Config,
        lists: Option<crate::lists::Lists>,
        on_near_limit: Option<crate::near::NearHook>,
        bodies: Option<crate::request_body::BodyLimits>,
    ) -> Result<Control<St>, ConfigError> {
        let headers = config
            .headers
            .with_partition(config.partition_secret.as_deref())?;
        let fallback = config
            .failure
            .divisor()
            .map(|_| MemoryStore::builder().clock(config.clock.clone()).build());
        let (deny_cache, local) = (config.deny_cache.is_some(), fallback.is_some());
        let (top, partition) = (config.top.is_some(), headers.partition.is_some());
        let around = Around::new::<St>(deny_cache, local, top, partition, lists.is_some());
        let store = store.suited(route::Lane::shared(&config.policies) && around.plain());
        bodies::check_bodies(&config.policies, &config.key, bodies)?;
        let set = policies::compile(
            &config.policies,
            &store,
            fallback.as_ref(),
            config.failure.divisor(),
            &config.key,
            &config.cost,
            &|_| false,
        )?;
        let names = set.policies.iter().map(|p| p.name());
        let top = (config.top.as_ref())
            .map(|top| Tracker::new(top, headers.partition.as_ref(), names).map(Arc::new))
            .transpose()?;
        let lists = LayerLists::of(lists.as_ref(), &config.key, &store, set.leases)?;
        let route = Route::compile(set.policies, &config.policies, around);
        let leases = (set.leases.then(Leases::new)).map_or_else(OnceLock::new, OnceLock::from);
        let engine = Limiter {
            store,
            policies: PolicySet::new(route),
            key: config.key,
            responses: config.responses,
            failure: config.failure,
            headers,
            exempt: config.exempt,
            clock: config.clock,
            breaker: config.breaker.map(Breaker::new),
            deny_cache: config.deny_cache.map(DenyCache::new),
            remembered: (!St::DECIDES_ALONE).then(Remembered::new),
            decision_extension: config.decision_extension,
            fallback,
            leases,
            near: crate::near::Warned::new(on_near_limit),
            top,
            lists,
            readers: bodies.as_ref().map(crate::request_body::Readers::new),
            bodies,
            warned: AtomicU64::new(0),
            unwarned: AtomicU64::new(0),
        };
        Ok(Control::new(Arc::new(engine), set.summary, config.cost))
    }

    /// Plans `request` and, where it can, decides it at once (steps 1 and 2); what its steps
    /// before the decision give (the adaptive limits' permits) goes in `permits`, which the request keeps to its call.
    #[inline]
    pub(crate) fn begin(
        &self,
        request: &RequestRef<'_>,
        permits: &mut Permits,
    ) -> Next<St::Future> {
        if self.exempt.as_ref().is_some_and(|f| f(request)) {
            return Next::nothing();
        }
        let route = self.policies.load();
        self.go(request, &route, permits)
    }

    /// Plans `request` against every policy of `route` that applies (and the runtime entries of
    /// the key `listed`, if any), and decides it (the general way).
    pub(super) fn plan(
        &self,
        request: &RequestRef<'_>,
        route: &Route,
        listed: Option<Key>,
    ) -> Next<St::Future> {
        let mut checks = Checks::new();
        let mut fallback = self.fallback.as_ref().map(|_| Checks::new());
        let mut after = Vec::new();
        let planned = (&mut checks, &mut fallback, &mut after);
        if let Some(answer) = self.checks(request, route, planned) {
            return answer;
        }
        let lists = self.push_list_check(listed, &mut checks);
        if checks.is_empty() {
            return Next::nothing();
        }
        let span = decision_span();
        let _entered = span.enter();
        record_policies(&span, checks.iter().map(|c| c.tier().name()));
        // Pre-check. The layer's clock is read only when the deny cache, a lease or an open
        // breaker needs it.
        if let Some(denied) = self.known_denied(&checks, &span, route.steps()) {
            return denied;
        }
        let mut ticket = Ticket::planned(fallback, after, span.clone(), route.steps());
        ticket.lists = lists;
        self.ask_store(checks, ticket)
    }

    /// Adds the checks of every policy of `route` that applies to `request` but the adaptive
    /// limits (their step came before) to the `planned` checks, the local fallback's and the
    /// charges after the response (filled in place: they are large); or answers a key a
    /// policy rejected.
    #[inline(always)]
    fn checks(
        &self,
        request: &RequestRef<'_>,
        route: &Route,
        planned: Planned<'_>,
    ) -> Option<Next<St::Future>> {
        let (checks, fallback, after) = planned;
        for policy in route.iter() {
            if !policy.applies(request) || policy.adaptive().is_some() {
                continue;
            }
            #[cfg(feature = "json")]
            if let Some(calls) = bodies::batch(policy, request) {
                let planned = (&mut *checks, &mut *fallback, &mut *after);
                match self.batch_checks(policy, request, calls, planned) {
                    Ok(()) => continue,
                    Err(rejection) => return Some(self.body_key_rejected(request, rejection)),
                }
            }
            let key_and_cost = policy
                .key(request)
                .and_then(|k| Ok((k, policy.cost(request)?)));
            let (key, cost) = match key_and_cost {
                Ok(both) => both,
                Err(rejection) if policy.reads_body() => {
                    return Some(self.body_key_rejected(request, rejection));
                }
                Err(rejection) => return Some(self.key_rejected(policy, rejection)),
            };
            let index = policy.tier_index(request, &key);
            // A batch is one request in flight, however many calls it makes.
            #[cfg(feature = "json")]
            let cost = match self.bodies {
                Some(_) if !policy.tier(index).limits_in_flight() => {
                    bodies::per_call(cost, request)
                }
                _ => cost,
            };
            let planned = (&mut *checks, &mut *fallback, &mut *after);
            Self::push_check(policy, request, index, key, cost, planned);
        }
        None
    }

    /// Adds the check of `policy` (its tier at `index`) on `key` at `cost` for `request`, its
    /// local fallback's and its charges after the response.
    fn push_check(
        policy: &CompiledPolicy,
        request: &RequestRef<'_>,
        index: usize,
        key: Key,
        cost: u64,
        (checks, fallback, after): Planned<'_>,
    ) {
        let tier = policy.tier(index).seen_by(request);
        let op = tier.part().op();
        AfterResponse::planned(policy, tier, &key, cost, after);
        if let (Some(fallback), Some(local)) = (&mut *fallback, policy.fallback_tier(index)) {
            let local = local.seen_by(request);
            let op = local.part().op();
            fallback.push(Check::new(local.clone(), key.clone(), cost, op));
        }
        checks.push(Check::new(tier.clone(), key, cost, op));
    }

    /// The answer of the deny cache, if it knows one of `checks`' keys to be limited.
    fn known_denied(
        &self,
        checks: &[Check],
        span: &Span,
        steps: Steps,
    ) -> Option<Next<St::Future>> {
        let cache = self.deny_cache.as_ref()?;
        let decision = cache.lookup(checks, self.clock.now_micros())?;
        traced(span, |span| {
            span.record("deny_cache", true);
            record_outcome(span, &decision, false);
        });
        metrics::counter!("ratelimit_deny_cache_hits_total").increment(1);
        let keys = Self::keys(checks, steps);
        self.record_limited(&decision, keys.as_deref());
        let headers = self.response_headers(&decision, keys.as_deref());
        Some(self.limited(decision, headers))
    }

    /// The answer to a request whose key `policy` rejected.
    fn key_rejected<F>(&self, policy: &CompiledPolicy, rejection: KeyRejection) -> Next<F> {
        let span = decision_span();
        let _entered = span.enter();
        traced(&span, |span| {
            span.record("policies", policy.name());
            span.record("outcome", "key_rejected");
        });
        tracing::debug!(
            policy = policy.name(),
            code = rejection.code(),
            "rate-limit key rejected"
        );
        Next::Refuse(Refusal::Rejected(rejection))
    }

    /// The rest of the plan of a request: the leases held here, then the breaker and
    /// the store.
    #[inline(always)]
    fn ask_store(&self, mut checks: Checks, mut ticket: Ticket) -> Next<St::Future> {
        let now = OnceCell::new();
        let now = || *now.get_or_init(|| self.clock.now_micros());
        // Leases: every check admitted from one held here (no store call, whatever the
        // breaker says), or the checks that ask the store for one.
        if let Some(leases) = self.leases() {
            match leases.plan(&mut checks, now(), !ticket.after.is_empty()) {
                lease::Plan::Local(decision) => {
                    let keys = Self::keys(&checks, ticket.steps);
                    traced(&ticket.span, |span| {
                        span.record("lease", true);
                    });
                    let (after, span) = (ticket.after, &ticket.span);
                    let keys = keys.as_deref();
                    return self.finish(decision, after, keys, false, span, ticket.steps);
                }
                lease::Plan::Store(a) => ticket.asking = a.map(Box::new),
                lease::Plan::Wait(wait) => {
                    return Next::Pending(Pending::new(async move {
                        wait.await;
                        Ok(None)
                    }));
                }
            }
        }
        if let Some(breaker) = &self.breaker {
            ticket.gate = breaker.gate(now);
        }
        let own = ticket
            .asking
            .as_ref()
            .map_or(&checks[..], |a| a.own(&checks));
        ticket.keys = Self::keys(own, ticket.steps);
        self.send(checks, ticket)
    }

    /// `checks` sent to the store with their ticket, unless the breaker is open.
    #[inline(always)]
    fn send(&self, checks: Checks, mut ticket: Ticket) -> Next<St::Future> {
        if ticket.gate == Gate::Reject {
            let error = StoreError::with_kind(
                StoreErrorKind::CircuitOpen,
                "the circuit breaker is open; the store was not asked",
            );
            return self.answered(ticket, Err(error));
        }
        if let Some(decision) = self.store.check_now(&checks) {
            return self.answered(ticket, Ok(decision));
        }
        ticket.started = Some(Instant::now());
        ticket.gives_back_later =
            ticket.steps.gives_back() && checks.iter().any(|c| c.op().gives_back_later());
        Next::Store(self.store.check(checks), ticket)
    }

    /// `checks` as the ticket keeps them, when the route's `steps` keep them (for the deny
    /// cache, the IETF `pk`, booked units to give back...).
    fn keys(checks: &[Check], steps: Steps) -> Option<Vec<Check>> {
        steps.keeps_checks().then(|| checks.to_vec())
    }

    /// What stands around the policies of this layer, for their route.
    fn around(&self) -> Around {
        let (deny_cache, local) = (self.deny_cache.is_some(), self.fallback.is_some());
        let (top, partition) = (self.top.is_some(), self.headers.partition.is_some());
        Around::new::<St>(deny_cache, local, top, partition, self.lists.is_some())
    }
}
