//! [`RateLimitLayer`] and its builder.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_layer::Layer;

use crate::algorithm::Compiled;
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::error::{ConfigError, FailurePolicy, KeyRejection, StoreError};
use crate::headers::{HeaderConfig, HeaderStyle, ResetFormat};
use crate::key::{Key, KeyExtractor, PeerIp, RequestRef};
use crate::policy::{CostFn, Policy, RequestFn, Route, StatusFn, TierFn};
use crate::resilience::{Breaker, CircuitBreaker, DenyCache};
use crate::response::Responses;
use crate::service::RateLimit;
use crate::store::private::Sealed as _;
use crate::store::{Check, Checks, MemoryStore, Mode, PolicyHandle, Store};

/// Applies rate limits to every request that reaches the wrapped service.
///
/// Build one with [`RateLimitLayer::builder`]. The layer is cheap to clone, and every clone, and
/// every service it makes, shares one limiter: the state lives behind an `Arc` (or in Redis), so
/// it does not matter how often axum or tower clone the service.
///
/// ```
/// use axum::{Router, routing::get};
/// use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp};
///
/// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
/// let limit = RateLimitLayer::builder()
///     .policy(Policy::gcra("10/s"))
///     .key(PeerIp::new())
///     .build()?;
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(limit);
/// # Ok(()) }
/// ```
pub struct RateLimitLayer<St = MemoryStore> {
    shared: Arc<Shared<St>>,
}

impl<St> Clone for RateLimitLayer<St> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for RateLimitLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

/// Everything a layer and its services share.
pub(crate) struct Shared<St> {
    pub(crate) store: St,
    pub(crate) policies: Box<[PolicyRuntime]>,
    pub(crate) responses: Responses,
    pub(crate) failure: FailurePolicy,
    pub(crate) headers: HeaderConfig,
    pub(crate) exempt: Option<RequestFn>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) breaker: Option<Breaker>,
    pub(crate) deny_cache: Option<DenyCache>,
    /// The local store of [`FailurePolicy::Local`].
    pub(crate) fallback: Option<MemoryStore>,
}

/// A policy ready to run: its tiers' handles (the policy's own quota first) and its options.
pub(crate) struct PolicyRuntime {
    pub(crate) tiers: Box<[Arc<PolicyHandle>]>,
    /// The same tiers, divided, in the local fallback store.
    pub(crate) fallback: Option<Box<[Arc<PolicyHandle>]>>,
    pub(crate) tier_names: HashMap<String, usize>,
    pub(crate) tier_of: Option<TierFn>,
    pub(crate) tier_overrides: HashMap<Key, usize>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) cost: Option<CostFn>,
    pub(crate) shadow: bool,
    pub(crate) charge_if: Option<StatusFn>,
    pub(crate) refund_if: Option<StatusFn>,
    pub(crate) routes: Vec<Route>,
    pub(crate) exempt: Option<RequestFn>,
}

impl PolicyRuntime {
    /// Whether the policy applies to `request` (its routes match and it is not exempt).
    pub(crate) fn applies(&self, request: &RequestRef<'_>) -> bool {
        (self.routes.is_empty() || self.routes.iter().any(|r| r.matches(request)))
            && !self.exempt.as_ref().is_some_and(|f| f(request))
    }

    /// The index of the tier for this request and key.
    pub(crate) fn tier(&self, request: &RequestRef<'_>, key: &Key) -> usize {
        if self.tiers.len() == 1 {
            return 0;
        }
        self.tier_for_key(key)
            .or_else(|| {
                let tier = self.tier_of.as_ref()?(request)?;
                self.tier_names.get(&tier).copied()
            })
            .unwrap_or(0)
    }

    /// The tier `key` is put in by [`Policy::tier_for_key`], if any.
    pub(crate) fn tier_for_key(&self, key: &Key) -> Option<usize> {
        self.tier_overrides.get(key).copied()
    }

    pub(crate) fn cost(&self, request: &RequestRef<'_>) -> u64 {
        self.cost.as_ref().map_or(1, |f| u64::from(f(request)))
    }

    pub(crate) fn mode(&self) -> Mode {
        if self.shadow {
            Mode::Shadow
        } else if self.charge_if.is_some() {
            Mode::Dry
        } else {
            Mode::Enforce
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for Shared<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policies: Vec<_> = self
            .policies
            .iter()
            .map(|p| (&*p.tiers[0].name, &p.key))
            .collect();
        f.debug_struct("RateLimitLayer")
            .field("store", &self.store)
            .field("policies", &policies)
            .field("responses", &self.responses)
            .field("failure", &self.failure)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<MemoryStore> {
    /// Starts configuring a layer; it uses a fresh [`MemoryStore`] unless given another store.
    pub fn builder() -> RateLimitLayerBuilder<MemoryStore> {
        RateLimitLayerBuilder {
            store: MemoryStore::new(),
            o: Options {
                policies: Vec::new(),
                key: Arc::new(PeerIp::new()),
                responses: Responses::default(),
                failure: FailurePolicy::default(),
                headers: HeaderConfig::default(),
                exempt: None,
                cost: None,
                clock: Arc::new(SystemClock::new()),
                breaker: Some(CircuitBreaker::default()),
                deny_cache: None,
            },
        }
    }
}

impl<St> RateLimitLayer<St> {
    /// The store the layer decides in.
    pub fn store(&self) -> &St {
        &self.shared.store
    }

    /// The names of the layer's policies, in order.
    pub fn policy_names(&self) -> impl Iterator<Item = &str> {
        self.shared.policies.iter().map(|p| &*p.tiers[0].name)
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// Decides for `key` at `cost` against every policy of the layer (in the tier
    /// [`Policy::tier_for_key`] puts the key in, else the policy's own quota), without
    /// a request: the same atomic decision the middleware makes, for rate-limiting work that is
    /// not an HTTP request (jobs, messages) or for tests. A cost of 0 only looks: nothing is
    /// charged.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::Key};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimitLayer::builder().policy(Policy::fixed_window("2/min")).build()?;
    /// let job = Key::from("nightly-export");
    /// assert!(limiter.check(&job, 1).await?.is_allowed());
    /// assert!(limiter.check(&job, 1).await?.is_allowed());
    /// assert!(!limiter.check(&job, 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, key: &Key, cost: u32) -> Result<Decision, StoreError> {
        self.decide_key(key, None, |_| u64::from(cost)).await
    }

    /// Every policy's check for `key` (in the tier the key is put in), in the mode given or the
    /// policy's own, at the units `units` gives for the policy's handle.
    async fn decide_key(
        &self,
        key: &Key,
        mode: Option<Mode>,
        units: impl Fn(&PolicyHandle) -> u64,
    ) -> Result<Decision, StoreError> {
        let checks = self
            .shared
            .policies
            .iter()
            .map(|p| {
                let handle = &p.tiers[p.tier_for_key(key).unwrap_or(0)];
                let mode = mode.unwrap_or(p.mode());
                Check::new(handle.clone(), key.clone(), units(handle), mode)
            })
            .collect::<Checks>();
        if let Some(decision) = self.shared.store.decide_now(&checks) {
            return Ok(decision);
        }
        self.shared.store.check(checks).await
    }

    /// Gives `units` back to `key` in every policy of the layer (in the same tier as
    /// [`check`](Self::check)), as if that many units had never been charged: the inverse of a charge, never past a fresh state
    /// (a token bucket never above its capacity, a window never below zero). Returns the
    /// decision a request of cost 0 would get afterwards.
    pub async fn refund(&self, key: &Key, units: u32) -> Result<Decision, StoreError> {
        self.decide_key(key, Some(Mode::Refund), |_| u64::from(units))
            .await
    }

    /// Denies `key` in every policy for `duration` (at most [`MAX_WINDOW`](crate::MAX_WINDOW)),
    /// whatever its state: every request is answered `429` with a `Retry-After` that runs to
    /// the end of the block. [`reset`](Self::reset) lifts it. Returns the decision a request of
    /// cost 0 gets afterwards.
    pub async fn block_for(&self, key: &Key, duration: Duration) -> Result<Decision, StoreError> {
        let micros = duration.min(crate::MAX_WINDOW).as_micros() as u64;
        self.decide_key(key, Some(Mode::Block), |_| micros).await
    }

    /// Looks at `key` in every policy without charging it: the decision a request of cost 0
    /// would get. The same as [`check`](Self::check) with a cost of 0.
    pub async fn peek(&self, key: &Key) -> Result<Decision, StoreError> {
        self.decide_key(key, None, |_| 0).await
    }

    /// Forgets everything about `key` in every policy, as if it had never been seen, and lifts
    /// any block. Returns
    /// the decision a request of cost 0 gets afterwards.
    pub async fn reset(&self, key: &Key) -> Result<Decision, StoreError> {
        self.decide_key(key, Some(Mode::Reset), |_| 0).await
    }

    /// Charges `key` `units` in every policy whatever its state (a penalty, e.g. for abuse),
    /// at most each policy's capacity (its limit, or the burst of a bucket algorithm): a
    /// window counts them, a bucket empties (a token bucket never below zero tokens), GCRA
    /// moves its theoretical arrival time on. Returns the decision a request of cost 0 gets
    /// afterwards. [`refund`](Self::refund) is the reward.
    pub async fn penalize(&self, key: &Key, units: u32) -> Result<Decision, StoreError> {
        self.decide_key(key, Some(Mode::Penalize), |handle| {
            u64::from(units).min(handle.algorithm.reported_limit())
        })
        .await
    }
}

impl<S, St> Layer<S> for RateLimitLayer<St> {
    type Service = RateLimit<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.shared.clone())
    }
}

/// Configures a [`RateLimitLayer`]; every mistake is reported by [`build`](Self::build).
#[must_use]
pub struct RateLimitLayerBuilder<St = MemoryStore> {
    store: St,
    o: Options,
}

/// Everything a builder holds but the store.
struct Options {
    policies: Vec<Policy>,
    key: Arc<dyn KeyExtractor>,
    responses: Responses,
    failure: FailurePolicy,
    headers: HeaderConfig,
    exempt: Option<RequestFn>,
    cost: Option<CostFn>,
    clock: Arc<dyn Clock>,
    breaker: Option<CircuitBreaker>,
    deny_cache: Option<usize>,
}

impl<St: fmt::Debug> fmt::Debug for RateLimitLayerBuilder<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("store", &self.store)
            .field("policies", &self.o.policies)
            .field("key", &self.o.key)
            .field("responses", &self.o.responses)
            .field("failure", &self.o.failure)
            .field("headers", &self.o.headers)
            .field("breaker", &self.o.breaker)
            .field("deny_cache", &self.o.deny_cache)
            .finish_non_exhaustive()
    }
}

impl<St: Store> RateLimitLayerBuilder<St> {
    /// Adds a policy. A request goes on only when every policy admits it, and then every policy
    /// is charged; when one denies it, none is.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.o.policies.push(policy);
        self
    }

    /// The key requests are charged to, for every policy without its own
    /// ([`Policy::key`]). Defaults to [`PeerIp`].
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.o.key = Arc::new(key);
        self
    }

    /// Decides in `store` instead of a fresh [`MemoryStore`]. Layers given clones of one store
    /// share its state.
    pub fn store<T: Store>(self, store: T) -> RateLimitLayerBuilder<T> {
        RateLimitLayerBuilder { store, o: self.o }
    }

    /// Which rate-limit headers responses carry (default [`HeaderStyle::Legacy`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.o.headers.style = style;
        self
    }

    /// How `X-RateLimit-Reset` is written (default [`ResetFormat::DeltaSeconds`]).
    pub fn reset_format(mut self, format: ResetFormat) -> Self {
        self.o.headers.reset = format;
        self
    }

    /// Lets requests the predicate accepts through without any policy (an allow-list, e.g.
    /// health checks or internal callers): they consume nothing and get no rate-limit headers.
    pub fn exempt_if<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> bool + Send + Sync + 'static,
    {
        self.o.exempt = Some(Arc::new(predicate));
        self
    }

    /// How many units a request costs, for every policy without its own
    /// ([`Policy::cost`]); default 1.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> u32 + Send + Sync + 'static,
    {
        self.o.cost = Some(Arc::new(cost));
        self
    }

    /// The status of a limited response (default `429 Too Many Requests`).
    pub fn limited_status(mut self, status: StatusCode) -> Self {
        self.o.responses.status = status;
        self
    }

    /// Writes the whole response to a limited request. The rate-limit headers and
    /// `Retry-After` are added to it unless it sets them itself.
    pub fn on_limited<F>(mut self, f: F) -> Self
    where
        F: Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.o.responses.on_limited = Some(Arc::new(f));
        self
    }

    /// Writes the response to a request whose key could not be extracted (default: the
    /// rejection's status with a problem+json body).
    pub fn on_key_rejected<F>(mut self, f: F) -> Self
    where
        F: Fn(&KeyRejection) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.o.responses.on_rejected = Some(Arc::new(f));
        self
    }

    /// What to do when the store cannot decide: an error, a missed deadline, or an open
    /// circuit breaker (default [`FailurePolicy::Open`]).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.o.failure = policy;
        self
    }

    /// The circuit breaker in front of the store (default [`CircuitBreaker::default`]: opens
    /// after 5 failures in a row, for 1 second); `None` asks the store every time.
    pub fn circuit_breaker(mut self, breaker: Option<CircuitBreaker>) -> Self {
        self.o.breaker = breaker;
        self
    }

    /// Remembers, in this process, up to `max_entries` keys the store said are limited, until
    /// they may go on again: further requests for them are answered `429` without a round trip
    /// to the store (default: off).
    ///
    /// The trade-off: until that time this instance does not see changes made elsewhere, such
    /// as an admin reset of the key or a refund from another instance.
    pub fn deny_cache(mut self, max_entries: usize) -> Self {
        self.o.deny_cache = Some(max_entries.max(1));
        self
    }

    /// The clock of the circuit breaker and the deny cache (default [`SystemClock`]). The
    /// store keeps its own clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.o.clock = Arc::new(clock);
        self
    }

    /// Checks the whole configuration and builds the layer.
    ///
    /// Fails when no policy was given, when a policy is invalid (see [`Policy`]), or when two
    /// different policies share a name in one store.
    pub fn build(self) -> Result<RateLimitLayer<St>, ConfigError> {
        let o = self.o;
        if o.policies.is_empty() {
            return Err(ConfigError::new(
                "no policy: add one with .policy(Policy::gcra(\"10/s\")) or similar",
            ));
        }
        // Check everything before registering anything in the (maybe shared) store.
        let mut compiled = Vec::with_capacity(o.policies.len());
        let mut names: Vec<Arc<str>> = Vec::new();
        for policy in &o.policies {
            let tiers = policy.compile()?;
            for (name, _) in &tiers {
                if names.contains(name) {
                    return Err(ConfigError::new(format!(
                        "two policies are named {name:?}; give each its own name"
                    )));
                }
                names.push(name.clone());
            }
            let fallback = match o.failure {
                FailurePolicy::Local { divisor } => Some(policy.divided(divisor).compile()?),
                _ => None,
            };
            compiled.push((policy, tiers, fallback));
        }
        let fallback_store = matches!(o.failure, FailurePolicy::Local { .. })
            .then(|| MemoryStore::builder().clock(o.clock.clone()).build());
        let register = |store: &dyn Fn(Arc<str>, Compiled) -> Result<u32, ConfigError>,
                        tiers: Vec<(Arc<str>, Compiled)>|
         -> Result<Box<[Arc<PolicyHandle>]>, ConfigError> {
            tiers
                .into_iter()
                .map(|(name, algorithm)| {
                    let id = store(name.clone(), algorithm.clone())?;
                    Ok(Arc::new(PolicyHandle::new(name, id, algorithm)))
                })
                .collect()
        };
        let mut policies = Vec::with_capacity(compiled.len());
        for (policy, tiers, fallback) in compiled {
            let handles = register(&|n, a| self.store.register(n, a), tiers)?;
            let fallback = match (fallback, &fallback_store) {
                (Some(tiers), Some(store)) => Some(register(&|n, a| store.register(n, a), tiers)?),
                _ => None,
            };
            let tier_names: HashMap<String, usize> = policy
                .tiers
                .iter()
                .enumerate()
                .map(|(i, (t, _))| (t.clone(), i + 1))
                .collect();
            let tier_overrides = policy
                .tier_overrides
                .iter()
                .map(|(k, t)| (k.clone(), tier_names[t]))
                .collect();
            policies.push(PolicyRuntime {
                tiers: handles,
                fallback,
                tier_names,
                tier_of: policy.tier_of.clone(),
                tier_overrides,
                key: policy.key.clone().unwrap_or_else(|| o.key.clone()),
                cost: policy.cost.clone().or_else(|| o.cost.clone()),
                shadow: policy.shadow,
                charge_if: policy.charge_if.clone(),
                refund_if: policy.refund_if.clone(),
                routes: policy.routes.clone(),
                exempt: policy.exempt.clone(),
            });
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                store: self.store,
                policies: policies.into_boxed_slice(),
                responses: o.responses,
                failure: o.failure,
                headers: o.headers,
                exempt: o.exempt,
                clock: o.clock,
                breaker: o.breaker.map(Breaker::new),
                deny_cache: o.deny_cache.map(DenyCache::new),
                fallback: fallback_store,
            }),
        })
    }
}
