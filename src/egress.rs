//! Outbound calls within the upstream's limits: a client-side limiter shared by every
//! instance, that learns from the upstream's own answers.
//!
//! Half of the rate limiting a service does is on the calls it makes: an LLM provider's tokens
//! per minute, a payment API's requests per second, a partner's daily quota. Ten instances that
//! each limit themselves send ten times the budget. An [`EgressLayer`] wraps any client
//! service of `http::Request`s (hyper-util's client, a tonic channel, a `tower` stack of your
//! own) so that each call takes its place in the layer's policies before it is sent:
//!
//! * **Shared**: the policies live in the layer's store; with Redis, every instance takes
//!   its calls from one budget. The key is the upstream ([`UpstreamHost`], its host and port)
//!   unless you key otherwise (an API key, a model name: any [`KeyExtractor`]).
//! * **Waiting, not failing**: a call over the budget waits for the moment the policy books
//!   for it, in the store, first come first served across instances, up to
//!   [`max_wait`](EgressLayerBuilder::max_wait); a call that would wait longer fails at once
//!   with [`EgressError::GaveUp`], which says when to try again.
//! * **Learning**: an upstream that answers `429` or `503` with `Retry-After`, or says it has
//!   nothing left (`RateLimit: "default";r=0;t=30`, `X-RateLimit-Remaining: 0` with its reset),
//!   pauses the key in the store until the time it names: no call of any instance reaches it
//!   before then; the calls that can wait that long wait, the others give up. An answer
//!   saying how much is left of a limit that is one of the policies' charges the key what
//!   others spent; and with an [`AdaptiveRate`], a refusal that says nothing lowers the key's
//!   limit, and answers raise it back.
//! * **Costs**: a call may cost what it will spend (an LLM call's estimated tokens,
//!   [`Policy::cost`]) and be settled from its response as a server's requests are
//!   ([`settle`](crate::settle)).
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_ratelimit::Policy;
//! use tower_ratelimit::egress::{EgressError, EgressLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The upstream: here a function; in production hyper-util's client or a tonic channel.
//! let upstream = tower::service_fn(|_call: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(
//!         EgressLayer::builder()
//!             .policy(Policy::gcra("2/s").name("partner"))
//!             .max_wait(Duration::from_millis(100))
//!             .build()?,
//!     )
//!     .service(upstream);
//! let call = || http::Request::get("https://api.example.com/v1/orders").body(String::new());
//! // Two calls at once are sent at once; the third would wait 500 ms: more than 100 ms.
//! for _ in 0..2 {
//!     assert_eq!(client.clone().oneshot(call()?).await?.status(), 200);
//! }
//! match client.clone().oneshot(call()?).await {
//!     Err(EgressError::GaveUp(gave_up)) => {
//!         assert_eq!(gave_up.policy(), "partner");
//!         assert!(gave_up.retry_after().is_some());
//!     }
//!     other => panic!("{other:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! With the `reqwest` feature, [`EgressLayer::middleware`] is the same layer as
//! reqwest-middleware's `Middleware`.
//!
//! See [`guide::egress`](crate::guide::egress) for an LLM provider's tokens per minute shared
//! across instances, and what happens when the upstream's limit is lower than configured.

mod adaptive;
pub(crate) mod counts;
mod error;
#[cfg(feature = "reqwest")]
mod middleware;
mod retry;
mod service;
pub(crate) mod upstream;

use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

pub use crate::key::UpstreamHost;
use adaptive::Adapt;
pub use adaptive::AdaptiveRate;
pub use error::{EgressError, GaveUp, Reason};
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use middleware::EgressMiddleware;
pub use retry::{RetryBudget, RetryLayer, Retrying};
use service::Learn;
pub use service::{Egress, EgressFuture, Upstream, UpstreamFuture};

use crate::clock::Clock;
use crate::error::{ConfigError, FailurePolicy};
use crate::headers::HeaderStyle;
use crate::key::{ApiKey, ClientIp, EntryError, Key, KeyExtractor, KeyRejection, RequestRef};
use crate::layer::RateLimitLayer;
use crate::policy::Policy;
use crate::store::{MemoryStore, Store};

/// The longest wait a call is given by default.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);

/// The longest pause an upstream's answer makes by default: an upstream asking for more (a
/// bug, a date in its far future) is paused this long, then asked again.
pub const DEFAULT_MAX_PAUSE: Duration = Duration::from_secs(600);

/// A layer that limits the calls a client service sends (see the [module](self)).
pub struct EgressLayer<St = MemoryStore> {
    layer: RateLimitLayer<St>,
    learn: Option<Arc<Learn<St>>>,
}

impl<St> Clone for EgressLayer<St> {
    fn clone(&self) -> Self {
        EgressLayer {
            layer: self.layer.clone(),
            learn: self.learn.clone(),
        }
    }
}

impl<St: std::fmt::Debug> std::fmt::Debug for EgressLayer<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressLayer")
            .field("layer", &self.layer)
            .field("learns", &self.learn.is_some())
            .finish()
    }
}

impl EgressLayer<MemoryStore> {
    /// Starts configuring a layer, on a fresh [`MemoryStore`] unless given another store.
    pub fn builder() -> EgressLayerBuilder<MemoryStore> {
        EgressLayerBuilder {
            store: MemoryStore::new(),
            policies: Vec::new(),
            key: Arc::new(UpstreamHost),
            clock: None,
            failure: None,
            max_wait: DEFAULT_MAX_WAIT,
            learn: true,
            max_pause: DEFAULT_MAX_PAUSE,
            adaptive: None,
        }
    }
}

impl<St> EgressLayer<St> {
    /// The rate-limit layer that decides the calls: its store, its policies, and what it
    /// offers in code ([`check`](RateLimitLayer::check), [`block_for`](crate::RateLimitControl::block_for),
    /// [`reload`](crate::RateLimitControl::reload)...), keyed as the calls are.
    pub fn limits(&self) -> &RateLimitLayer<St> {
        &self.layer
    }
}

impl<S, St: Store> Layer<S> for EgressLayer<St> {
    type Service = Egress<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Egress {
            limit: self.layer.layer(Upstream::new(inner, self.learn.clone())),
        }
    }
}

/// The policy an upstream's pause is kept in: never charged (a look sees only a block).
const PAUSE_POLICY: &str = "egress_pause";

/// The layer of [`PAUSE_POLICY`] on `store`, deciding on `clock` (else the system's).
fn pause_layer<St: Store>(
    store: St,
    clock: Option<Arc<dyn Clock>>,
) -> Result<RateLimitLayer<St>, ConfigError> {
    let policy = Policy::fixed_window("1000000/s").name(PAUSE_POLICY);
    let mut builder = RateLimitLayer::builder().store(store).policy(policy);
    if let Some(clock) = clock {
        builder = builder.clock(clock);
    }
    builder.build()
}

/// The layer's key, shared with what learns from the upstream.
#[derive(Clone, Debug)]
struct SharedKey(Arc<dyn KeyExtractor>);

impl KeyExtractor for SharedKey {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        self.0.extract(request)
    }

    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        self.0.entry_keys(entry)
    }

    fn client_ip(&self) -> Option<&ClientIp> {
        self.0.client_ip()
    }

    fn reads_body(&self) -> bool {
        self.0.reads_body()
    }
}

/// Configures an [`EgressLayer`]; every mistake is reported by [`build`](Self::build).
#[must_use]
pub struct EgressLayerBuilder<St = MemoryStore> {
    store: St,
    policies: Vec<Policy>,
    key: Arc<dyn KeyExtractor>,
    clock: Option<Arc<dyn Clock>>,
    failure: Option<FailurePolicy>,
    max_wait: Duration,
    learn: bool,
    max_pause: Duration,
    adaptive: Option<AdaptiveRate>,
}

impl<St: std::fmt::Debug> std::fmt::Debug for EgressLayerBuilder<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressLayerBuilder")
            .field("store", &self.store)
            .field("policies", &self.policies)
            .field("key", &self.key)
            .field("max_wait", &self.max_wait)
            .field("learn", &self.learn)
            .field("max_pause", &self.max_pause)
            .field("adaptive", &self.adaptive)
            .finish_non_exhaustive()
    }
}

impl<St: Store> EgressLayerBuilder<St> {
    /// The store the policies live in: a [`RedisStore`](crate::RedisStore) shares them with
    /// every instance.
    pub fn store<T: Store>(self, store: T) -> EgressLayerBuilder<T> {
        EgressLayerBuilder {
            store,
            policies: self.policies,
            key: self.key,
            clock: self.clock,
            failure: self.failure,
            max_wait: self.max_wait,
            learn: self.learn,
            max_pause: self.max_pause,
            adaptive: self.adaptive,
        }
    }

    /// Adds a policy. One that neither waits nor takes leases waits up to
    /// [`max_wait`](Self::max_wait); give it its own
    /// [`wait_up_to`](Policy::wait_up_to) to wait otherwise. A policy that takes leases,
    /// keeps capacity for critical calls ([`Policy::reserve`]: a priority header's share) or
    /// settles its cost from the response ([`Policy::settle`]) cannot wait: a call it refuses
    /// gives up at once.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds policies (see [`policy`](Self::policy)).
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// What a call is keyed by (default [`UpstreamHost`]: its URI's host and port): an API
    /// key header, a model name, anything a [`KeyExtractor`] reads. An upstream's pause
    /// applies to this key: for an upstream that limits each credential, key by it
    /// ([`per_credential`](Self::per_credential)), or one tenant's exhausted credential
    /// pauses every tenant of the host.
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// Keys each call by the upstream and the credential it carries ([`ApiKey`]: the
    /// `Authorization` bearer token, or a header such as `x-api-key`), for an upstream that
    /// limits each credential on its own (an LLM provider's API keys, a partner's accounts):
    /// one tenant's credential refused or paused by the upstream pauses that credential's
    /// calls, not every tenant's calls to the host. The credential reaches neither the store
    /// nor the logs: the key holds its SHA-256 hash ([`ApiKey::key_for`]) after the host and
    /// port. A call without the credential is not sent: it gives up
    /// ([`Reason::KeyRejected`]).
    ///
    /// ```
    /// use tower_ratelimit::Policy;
    /// use tower_ratelimit::egress::EgressLayer;
    /// use tower_ratelimit::key::ApiKey;
    ///
    /// let per_tenant = EgressLayer::builder()
    ///     .per_credential(ApiKey::bearer())
    ///     .policy(Policy::gcra("60/min").name("llm"))
    ///     .build()?;
    /// # let _ = per_tenant;
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn per_credential(self, credential: ApiKey) -> Self {
        self.key(crate::key::all((UpstreamHost, credential)))
    }

    /// How long a call waits for its place at most (default [`DEFAULT_MAX_WAIT`], at most an
    /// hour); one that would wait longer gives up at once.
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.max_wait = max;
        self
    }

    /// Whether an upstream's answer pauses the key (default yes; see the [module](self)).
    pub fn learn_from_upstream(mut self, yes: bool) -> Self {
        self.learn = yes;
        self
    }

    /// The longest pause one answer of the upstream makes (default [`DEFAULT_MAX_PAUSE`]),
    /// and the longest one call's settled cost ([`Policy::settle`]) makes its key owe: a
    /// call reported to have cost more than its estimate is charged at most what the
    /// policy's rate pays back in `max_pause` past it (`1000/day` and 10 minutes: 6 units),
    /// and the clamp is counted in `ratelimit_costs_clamped_total`.
    pub fn max_pause(mut self, max: Duration) -> Self {
        self.max_pause = max;
        self
    }

    /// Finds the rate of an upstream that refuses calls without saying when: see
    /// [`AdaptiveRate`] (default none: such a refusal is counted, and changes nothing).
    /// Only while the layer learns from its upstream.
    pub fn adaptive(mut self, rate: AdaptiveRate) -> Self {
        self.adaptive = Some(rate);
        self
    }

    /// The clock the policies decide on (default the system's).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// What a call does when the store cannot decide (default: it is sent, as a server's
    /// request goes through; [`FailurePolicy::Closed`] gives it up).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.failure = Some(policy);
        self
    }

    /// Checks the configuration and builds the layer: the policies' mistakes as
    /// [`RateLimitLayerBuilder::build`](crate::RateLimitLayerBuilder::build) reports them, a
    /// longest wait of zero or over an hour, a longest pause of zero or over
    /// [`MAX_WINDOW`](crate::MAX_WINDOW).
    pub fn build(self) -> Result<EgressLayer<St>, ConfigError> {
        if self.max_wait.is_zero() || self.max_wait > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "max_wait must be between 1 microsecond and one hour",
            ));
        }
        if self.max_pause.is_zero() || self.max_pause > crate::MAX_WINDOW {
            return Err(ConfigError::new(
                "max_pause must be above zero and at most MAX_WINDOW",
            ));
        }
        if self.adaptive.is_some() && !self.learn {
            return Err(ConfigError::new(
                "an adaptive rate learns from the upstream: it needs learn_from_upstream(true)",
            ));
        }
        let (max_wait, max_pause) = (self.max_wait, self.max_pause);
        let policies = (self.policies.into_iter()).map(|p| {
            p.waiting_by_default(max_wait)
                .settle_owing_at_most(max_pause)
        });
        let mut builder = RateLimitLayer::builder()
            .store(self.store)
            .policies(policies)
            .key(SharedKey(self.key.clone()))
            .headers(HeaderStyle::None);
        let clock = self.clock;
        if let Some(clock) = &clock {
            builder = builder.clock(clock.clone());
        }
        if let Some(failure) = self.failure {
            builder = builder.on_store_error(failure);
        }
        let layer = builder.build()?;
        let adapt = match self.adaptive {
            Some(rate) => Some(Adapt::new(rate, layer.store().clone(), clock.clone())?),
            None => None,
        };
        let learn = match self.learn {
            true => Some(Arc::new(Learn {
                layer: layer.clone(),
                key: self.key,
                max_pause: self.max_pause,
                pause: pause_layer(layer.store().clone(), clock)?,
                adapt,
            })),
            false => None,
        };
        Ok(EgressLayer { layer, learn })
    }
}
