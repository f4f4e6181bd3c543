//! [`RateLimitLayer`] and its builder.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use crate::body::Wrapped;
use crate::decision::Decision;
use crate::error::{ConfigError, LimitError, StoreError};
use crate::key::{Key, KeyExtractor};
use crate::limiter::Limiter;
use crate::policy::Policy;
use crate::reload::ReloadReport;
use crate::request_body::{Read, ReadBodies, Unread};
use crate::service::RateLimit;
use crate::store::{MemoryStore, Op, Store};
use crate::top::{LimitedKey, TopLimitedService, TopReport};

pub(crate) mod builder;
mod lists;

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
    limiter: Arc<Limiter<St>>,
    body: PhantomData<fn() -> M>,
    reads: PhantomData<fn() -> R>,
}

impl<St, M, R> Clone for RateLimitLayer<St, M, R> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            body: PhantomData,
            reads: PhantomData,
        }
    }
}

impl<St: fmt::Debug, M, R> fmt::Debug for RateLimitLayer<St, M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.limiter.fmt(f)
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
    /// one, numbers too large), with the message of the [`ConfigError`] that
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
            limiter: self.limiter,
            body: PhantomData,
            reads: PhantomData,
        }
    }

    /// Its limiter: for the crate's unit tests, and what holds a call in code (egress).
    pub(crate) fn limiter(&self) -> &Limiter<St> {
        &self.limiter
    }

    /// The store the layer decides in.
    pub fn store(&self) -> &St {
        self.limiter.store()
    }

    /// The names of the layer's policies, in order.
    pub fn policy_names(&self) -> Vec<String> {
        self.limiter.policy_names()
    }

    /// The shortest time a slot of its concurrency policies is held in the store.
    pub(crate) fn slots_held_at_most(&self) -> Option<std::time::Duration> {
        self.limiter.slots_held_at_most()
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
    /// The `n` keys `policy` denied most over the period of the layer's
    /// [`top_limited`](crate::RateLimitLayerBuilder::top_limited) summary, the heaviest first; empty
    /// when the layer keeps none, or when the policy denied nothing.
    ///
    /// ```
    /// use tower::{Service, ServiceExt, service_fn};
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::HeaderKey, top::TopLimited};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .key(HeaderKey::try_new("x-user")?)
    ///     .policy(Policy::fixed_window("1/min").name("per-user"))
    ///     .top_limited(TopLimited::new())
    ///     .build()?;
    /// let mut service = tower::ServiceBuilder::new()
    ///     .layer(layer.clone())
    ///     .service(service_fn(|_: http::Request<String>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     }));
    /// for user in ["alice", "bob", "bob", "bob", "alice"] {
    ///     let request = http::Request::builder().header("x-user", user).body(String::new())?;
    ///     service.ready().await?.call(request).await?;
    /// }
    /// let top = layer.top_limited("per-user", 10);
    /// let top: Vec<(&str, u64)> = top.iter().map(|k| (k.text(), k.count())).collect();
    /// assert_eq!(top, [("bob", 2), ("alice", 1)]);
    /// # Ok(()) }
    /// ```
    pub fn top_limited(&self, policy: &str, n: usize) -> Vec<LimitedKey> {
        self.limiter.top_limited(policy, n)
    }

    /// [`top_limited`](Self::top_limited) for every policy, with how many requests each
    /// denied in the period.
    pub fn top_limited_reports(&self, n: usize) -> Vec<TopReport> {
        self.limiter.top_limited_reports(n)
    }

    /// A service answering `GET` with the [`top_limited_reports`](Self::top_limited_reports)
    /// as JSON: an admin route for operators (see [`TopLimitedService`]).
    pub fn top_limited_service(&self) -> TopLimitedService {
        self.limiter.top_limited_service()
    }

    /// Replaces the layer's policies with `policies`, for every clone of the layer and every
    /// service it made, without a restart: each request is planned with the old policies or
    /// with the new ones, never a mix, and requests in flight finish with the policies they
    /// started with.
    ///
    /// **Usage carries over.** A policy (or tier) that keeps its name keeps its keys' state,
    /// re-counted under its new quota: a key that used 5 of `10/min` has used 5 of `20/min`,
    /// and 15 remain, on every algorithm and in every store. The state is converted when the
    /// key is next used, by whichever instance uses it, so instances sharing a Redis store
    /// that are reloaded one after the other agree on every key meanwhile: each converts it
    /// to the quota it runs. Where a window's length changes, each algorithm's docs (the
    /// crate docs' section on reloading) say what "the same usage" is. A policy whose name
    /// is gone stops being checked; its keys expire in the store by their TTL. A name may not
    /// change its algorithm (a state of one means nothing to another): give the policy a
    /// new name.
    ///
    /// What this instance remembers of a tier that changed or is gone is dropped: the deny
    /// cache's entries (a raised limit admits at once) and its leases (their unspent units
    /// stay counted as spent until the leases end).
    ///
    /// Fails, and changes nothing, on any error [`build`](crate::RateLimitLayerBuilder::build) would
    /// report for these policies: the old ones stay in force. The layer's key, cost, headers,
    /// responses and failure policy stay as built. Returns what changed.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::Key};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("10/min").name("api"))
    ///     .build()?;
    /// let client = Key::from("client-7");
    /// for _ in 0..5 {
    ///     layer.check(&client, 1).await?;
    /// }
    ///
    /// let report = layer.reload([Policy::fixed_window("20/min").name("api")])?;
    /// assert_eq!(report.to_string(), r#"changed "api": fixed_window 10/min -> fixed_window 20/min; 0 unchanged"#);
    /// // The 5 used still count: 15 of the new 20 remain.
    /// assert_eq!(layer.peek(&client).await?.tightest().remaining(), 15);
    /// # Ok(()) }
    /// ```
    pub fn reload(
        &self,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Result<ReloadReport, ConfigError> {
        let policies: Vec<Policy> = policies.into_iter().collect();
        self.limiter.reload(&policies)
    }

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
        self.limiter.key_decision(key, None, |_| u64::from(cost))
    }

    /// Gives `units` back to `key` in every policy of the layer (in the same tier as
    /// [`check`](Self::check)), as if that many units had never been charged: the inverse of a charge, never past a fresh state
    /// (a token bucket never above its capacity, a window never below zero). Returns the
    /// decision a request of cost 0 would get afterwards.
    pub async fn refund(&self, key: &Key, units: u32) -> Result<Decision, StoreError> {
        self.limiter
            .key_decision(key, Some(Op::Refund), |_| u64::from(units))
            .await
    }

    /// Denies `key` in every policy for `duration` (at most [`MAX_WINDOW`](crate::MAX_WINDOW)),
    /// whatever its state: every request is answered `429` with a `Retry-After` that runs to
    /// the end of the block, but one whose policy waits ([`Policy::wait_up_to`](crate::Policy::wait_up_to))
    /// as long as that is held until the block ends, and books its time after it.
    /// [`reset`](Self::reset) lifts it. Returns the decision a request of cost 0 gets
    /// afterwards.
    pub async fn block_for(&self, key: &Key, duration: Duration) -> Result<Decision, StoreError> {
        let micros = duration.min(crate::MAX_WINDOW).as_micros() as u64;
        let block = Op::Block { us: micros };
        self.limiter.key_decision(key, Some(block), |_| 0).await
    }

    /// Looks at `key` in every policy without charging it: the decision a request of cost 0
    /// would get. The same as [`check`](Self::check) with a cost of 0.
    pub async fn peek(&self, key: &Key) -> Result<Decision, StoreError> {
        self.limiter.key_decision(key, None, |_| 0).await
    }

    /// Forgets everything about `key` in every policy, as if it had never been seen, and lifts
    /// any block (and a [block on violation](crate::Policy::block_on_violation)'s level). Returns
    /// the decision a request of cost 0 gets afterwards.
    pub async fn reset(&self, key: &Key) -> Result<Decision, StoreError> {
        self.limiter.key_decision(key, Some(Op::Reset), |_| 0).await
    }

    /// Charges `key` `units` in every policy whatever its state (a penalty, e.g. for abuse),
    /// at most each policy's capacity (its limit, or the burst of a bucket algorithm): a
    /// window counts them, a bucket empties (a token bucket never below zero tokens), GCRA
    /// moves its theoretical arrival time on. Returns the decision a request of cost 0 gets
    /// afterwards. [`refund`](Self::refund) is the reward.
    pub async fn penalize(&self, key: &Key, units: u32) -> Result<Decision, StoreError> {
        self.limiter
            .key_decision(key, Some(Op::Penalize), |tier| {
                u64::from(units).min(tier.algorithm().reported_limit())
            })
            .await
    }

    /// Gives `key` a limit of its own in the policy (or policy tier, `policy:TIER`) named
    /// `policy`: `quota` (a [`Quota`](crate::Quota) or a string such as `"20/min"`) instead of
    /// the policy's, with the policy's algorithm, until `until` (for a year when `None`).
    /// `key` names requests as for [`deny_key`](Self::deny_key), in the keys the policy's
    /// key makes.
    ///
    /// The limit is kept in the store beside the key's state, so every instance sharing the
    /// store applies it from its next decision of the key, a reload of the policy keeps it,
    /// and it ends on its own at `until`. What the key has used is kept, converted as a
    /// reload converts it: 30 used of 100 a minute are 30 used of 1,000 a minute. Setting it
    /// again replaces it; [`clear_limit`](Self::clear_limit) ends it now. A calendar policy's
    /// key keeps the policy's period. Returns the decision a request of cost 0 gets
    /// afterwards, which tells the key's new limit.
    ///
    /// A key that never had a limit of its own costs nothing more to decide. Leases of the
    /// key held by other instances, and their deny caches, answer as before until they end.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::{HeaderKey, Key}};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .key(HeaderKey::try_new("x-api-key")?)
    ///     .policy(Policy::gcra("100/min").name("api"))
    ///     .build()?;
    /// let customer = Key::from("acme");
    /// // Five times the limit until Friday.
    /// let friday = SystemTime::now() + Duration::from_secs(3 * 86_400);
    /// let decision = layer.set_limit("api", &customer, "500/min", Some(friday)).await?;
    /// assert_eq!(decision.outcomes()[0].limit(), 500);
    /// layer.clear_limit("api", &customer).await?;
    /// assert_eq!(layer.peek(&customer).await?.outcomes()[0].limit(), 100);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_limit<Q>(
        &self,
        policy: &str,
        key: &Key,
        quota: Q,
        until: Option<std::time::SystemTime>,
    ) -> Result<Decision, LimitError>
    where
        Q: TryInto<crate::Quota>,
        Q::Error: Into<ConfigError>,
    {
        let quota = quota.try_into().map_err(|e| LimitError::Quota(e.into()))?;
        let until_us = match until {
            None => 0,
            Some(t) => self.limiter.until_us(t)?.0,
        };
        let answer = self.limiter.limit_key(policy, key, Some(quota), until_us)?;
        answer.await.map_err(LimitError::Store)
    }

    /// Ends `key`'s own limit in the policy (or tier) named `policy`, if it has one: it is
    /// back under the policy's quota, its usage kept. Returns the decision a request of cost 0
    /// gets afterwards.
    pub async fn clear_limit(&self, policy: &str, key: &Key) -> Result<Decision, LimitError> {
        let answer = self.limiter.limit_key(policy, key, None, 0)?;
        answer.await.map_err(LimitError::Store)
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
        self.limiter
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
        RateLimit::new(inner, self.limiter.clone())
    }
}

impl<S, St, M> Layer<S> for RateLimitLayer<St, M, Read> {
    type Service = ReadBodies<S, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        ReadBodies::new(inner, self.limiter.clone())
    }
}
