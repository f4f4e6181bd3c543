//! [`RateLimitLayer`] and its builder.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use tower_layer::Layer;

use crate::body::Wrapped;
use crate::control::RateLimitControl;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::{Key, KeyExtractor};
use crate::limiter::{Control, Limiter};
use crate::policy::Policy;
use crate::request_body::{Read, ReadBodies, Unread};
use crate::service::RateLimit;
use crate::store::{MemoryStore, Op, Store};

pub(crate) mod builder;

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
///
/// `M` says how responses carry their bodies (see [`MakeBody`](crate::body::MakeBody)): a [`ResponseBody`] around the
/// inner service's by default, or axum's own with [`body`](Self::body).
///
/// [`ResponseBody`]: crate::body::ResponseBody
///
/// `R` says whether it reads request bodies: [`Unread`] (the default), or [`Read`] when built
/// with [`read_bodies`](crate::RateLimitLayerBuilder::read_bodies) (its service is then a
/// [`ReadBodies`]).
pub struct RateLimitLayer<St = MemoryStore, M = Wrapped, R = Unread> {
    control: Arc<Control<St>>,
    body: PhantomData<fn() -> M>,
    reads: PhantomData<fn() -> R>,
}

impl<St, M, R> Clone for RateLimitLayer<St, M, R> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            control: self.control.clone(),
            body: PhantomData,
            reads: PhantomData,
        }
    }
}

impl<St: fmt::Debug, M, R> fmt::Debug for RateLimitLayer<St, M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.control.engine().fmt(f)
    }
}

impl RateLimitLayer<MemoryStore> {
    /// A layer with one policy, charged to `key`, in a fresh [`MemoryStore`]: the common case
    /// in one line. [`RateLimitLayer::builder`] configures everything else (several policies,
    /// headers, responses, failure policy), and [`with_store`](Self::with_store) takes a
    /// store, such as Redis.
    ///
    /// ```
    /// use axum::{Router, routing::get};
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp, quota};
    ///
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(RateLimitLayer::new(Policy::gcra(quota!("10/s")), PeerIp::new()));
    /// ```
    ///
    /// # Panics
    ///
    /// When the policy is invalid (a quota that does not parse, a burst on an algorithm without
    /// one, numbers too large), with the message of the [`ConfigError`](crate::ConfigError) that
    /// [`build`](crate::RateLimitLayerBuilder::build) would return, which names the policy and what is
    /// wrong. A quota written with [`quota!`](crate::quota!) is checked at compile time
    /// instead. Use the builder for configuration read at run time: it returns the error.
    #[track_caller]
    pub fn new(policy: Policy, key: impl KeyExtractor) -> Self {
        Self::with_store(MemoryStore::new(), policy, key)
    }
}

impl<St, M, R> RateLimitLayer<St, M, R> {
    /// The same layer, its responses carrying their bodies as `M2` says: behind axum,
    /// [`AxumBody`](crate::axum::AxumBody) saves the allocation of axum boxing each response's
    /// body into its own type.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, RateLimitLayer, axum::AxumBody};
    ///
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::gcra("10/s"))
    ///     .build()?
    ///     .body::<AxumBody>();
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn body<M2>(self) -> RateLimitLayer<St, M2, R> {
        RateLimitLayer {
            control: self.control,
            body: PhantomData,
            reads: PhantomData,
        }
    }

    /// Its limiter: for the crate's unit tests, and what holds a call in code (egress).
    pub(crate) fn limiter(&self) -> &Limiter<St> {
        self.control.engine()
    }

    /// Its administration, for what holds a call in code (egress).
    pub(crate) fn controls(&self) -> &Control<St> {
        &self.control
    }

    /// The store the layer decides in.
    pub fn store(&self) -> &St {
        self.control.engine().store()
    }

    /// Its administration: lists, a key's own limit, blocks, peeks, reloads, the keys denied
    /// most (see [`RateLimitControl`]).
    pub fn control(&self) -> RateLimitControl<St> {
        RateLimitControl::new(self.control.clone())
    }

    /// The names of the layer's policies, in order.
    pub fn policy_names(&self) -> Vec<String> {
        self.control.policy_names()
    }

    /// The shortest time a slot of its concurrency policies is held in the store.
    pub(crate) fn slots_held_at_most(&self) -> Option<std::time::Duration> {
        self.control.slots_held_at_most()
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// A layer with one policy, charged to `key`, deciding in `store`: with a
    /// [`RedisStore`](crate::RedisStore), one line for a limit shared by every instance.
    ///
    /// ```no_run
    /// use tower_ratelimit::{Policy, RateLimitLayer, RedisStore, key::PeerIp, quota};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisStore::builder("redis://127.0.0.1:6379").build().await?;
    /// let layer = RateLimitLayer::with_store(redis, Policy::gcra(quota!("10/s")), PeerIp::new());
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    ///
    /// # Panics
    ///
    /// As [`RateLimitLayer::new`]; also when the store already holds a different policy
    /// under the same name.
    #[track_caller]
    pub fn with_store(store: St, policy: Policy, key: impl KeyExtractor) -> Self {
        match RateLimitLayer::builder()
            .store(store)
            .policy(policy)
            .key(key)
            .build()
        {
            Ok(layer) => layer,
            Err(e) => panic!("RateLimitLayer: {e}"),
        }
    }
}

impl<St: Store, M, R> RateLimitLayer<St, M, R> {
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
    ///
    /// The future borrows neither the layer nor the key; on the memory store it is ready at
    /// once.
    pub fn check(
        &self,
        key: &Key,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'static + use<St, M, R> {
        self.limiter().key_decision(key, None, |_| u64::from(cost))
    }

    /// Gives `units` back to `key` in every policy of the layer (in the same tier as
    /// [`check`](Self::check)), as if that many units had never been charged: the inverse of a charge, never past a fresh state
    /// (a token bucket never above its capacity, a window never below zero). Returns the
    /// decision a request of cost 0 would get afterwards.
    pub async fn refund(&self, key: &Key, units: u32) -> Result<Decision, StoreError> {
        self.limiter()
            .key_decision(key, Some(Op::Refund), |_| u64::from(units))
            .await
    }

    /// Charges `key` `units` in every policy whatever its state (a penalty, e.g. for abuse),
    /// at most each policy's capacity (its limit, or the burst of a bucket algorithm): a
    /// window counts them, a bucket empties (a token bucket never below zero tokens), GCRA
    /// moves its theoretical arrival time on. Returns the decision a request of cost 0 gets
    /// afterwards. [`refund`](Self::refund) is the reward.
    pub async fn penalize(&self, key: &Key, units: u32) -> Result<Decision, StoreError> {
        self.limiter()
            .key_decision(key, Some(Op::Penalize), |tier| {
                u64::from(units).min(tier.algorithm().reported_limit())
            })
            .await
    }

    /// Settles a request of `key` charged `estimate` units up front at what it really cost,
    /// `actual`, in every policy, as [`Policy::settle`](crate::Policy::settle) does after a
    /// response: the difference is given back when `actual` is lower, charged when it is
    /// higher, past the limit if need be (the key then owes it until time pays it back).
    /// `actual` is taken as at most [`MAX_AT_MOST`](crate::settle::MAX_AT_MOST) times each policy's
    /// limit. For costs counted outside the layer, e.g. by a task that reads the stream.
    /// Returns the decision a request of cost 0 gets afterwards.
    pub async fn settle(
        &self,
        key: &Key,
        estimate: u32,
        actual: u64,
    ) -> Result<Decision, StoreError> {
        let op = Op::Settle {
            estimate: u64::from(estimate),
        };
        self.limiter()
            .key_decision(key, Some(op), |tier| {
                let limit = tier.algorithm().reported_limit();
                actual.min(limit.saturating_mul(u64::from(crate::settle::MAX_AT_MOST)))
            })
            .await
    }
}

impl<S, St, M> Layer<S> for RateLimitLayer<St, M, Unread> {
    type Service = RateLimit<S, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.control.engine().clone())
    }
}

impl<S, St, M> Layer<S> for RateLimitLayer<St, M, Read> {
    type Service = ReadBodies<S, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        ReadBodies::new(inner, self.control.engine().clone())
    }
}
