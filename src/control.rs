//! [`RateLimitControl`]: the administration of a layer, apart from its requests.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::{ConfigError, LimitError, StoreError};
use crate::key::Key;
use crate::limiter::Control;
use crate::policy::Policy;
use crate::reload::ReloadReport;
use crate::store::{MemoryStore, Op, Store};
use crate::top::{LimitedKey, TopLimitedService, TopReport};

mod lists;

/// The administration of a [`RateLimitLayer`](crate::RateLimitLayer): what an operator (or
/// an admin route) does to the layer while it serves, apart from the requests it decides.
/// Its lists' entries, a key's own limit, blocks, resets and peeks, a reload of the policies
/// or the lists, and the keys denied most. Taken from the layer with
/// [`RateLimitLayer::control`](crate::RateLimitLayer::control); cheap to clone, and every
/// clone acts on the same engine as the layer and every service it made.
///
/// ```
/// use tower_ratelimit::{Policy, RateLimitLayer, key::Key};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder().policy(Policy::fixed_window("2/min")).build()?;
/// let control = layer.control();
/// let client = Key::from("client-7");
/// layer.check(&client, 1).await?;
/// assert_eq!(control.peek(&client).await?.tightest().remaining(), 1);
/// control.reset(&client).await?;
/// assert_eq!(control.peek(&client).await?.tightest().remaining(), 2);
/// # Ok(()) }
/// ```
pub struct RateLimitControl<St = MemoryStore> {
    control: Arc<Control<St>>,
}

impl<St> Clone for RateLimitControl<St> {
    fn clone(&self) -> Self {
        RateLimitControl {
            control: self.control.clone(),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for RateLimitControl<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RateLimitControl")
            .field(self.control.engine())
            .finish()
    }
}

impl<St> RateLimitControl<St> {
    /// The handle of `control`.
    pub(crate) fn new(control: Arc<Control<St>>) -> Self {
        RateLimitControl { control }
    }
}

impl<St: Store> RateLimitControl<St> {
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
    /// let top = layer.control().top_limited("per-user", 10);
    /// let top: Vec<(&str, u64)> = top.iter().map(|k| (k.text(), k.count())).collect();
    /// assert_eq!(top, [("bob", 2), ("alice", 1)]);
    /// # Ok(()) }
    /// ```
    pub fn top_limited(&self, policy: &str, n: usize) -> Vec<LimitedKey> {
        self.control.top_limited(policy, n)
    }

    /// [`top_limited`](Self::top_limited) for every policy, with how many requests each
    /// denied in the period.
    pub fn top_limited_reports(&self, n: usize) -> Vec<TopReport> {
        self.control.top_limited_reports(n)
    }

    /// A service answering `GET` with the [`top_limited_reports`](Self::top_limited_reports)
    /// as JSON: an admin route for operators (see [`TopLimitedService`]).
    pub fn top_limited_service(&self) -> TopLimitedService {
        self.control.top_limited_service()
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
    /// let report = layer.control().reload([Policy::fixed_window("20/min").name("api")])?;
    /// assert_eq!(report.to_string(), r#"changed "api": fixed_window 10/min -> fixed_window 20/min; 0 unchanged"#);
    /// // The 5 used still count: 15 of the new 20 remain.
    /// assert_eq!(layer.control().peek(&client).await?.tightest().remaining(), 15);
    /// # Ok(()) }
    /// ```
    pub fn reload(
        &self,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Result<ReloadReport, ConfigError> {
        let policies: Vec<Policy> = policies.into_iter().collect();
        self.control.reload(&policies)
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
        self.control
            .engine()
            .key_decision(key, Some(block), |_| 0)
            .await
    }

    /// Looks at `key` in every policy without charging it: the decision a request of cost 0
    /// would get. The same as [`check`](crate::RateLimitLayer::check) with a cost of 0.
    pub async fn peek(&self, key: &Key) -> Result<Decision, StoreError> {
        self.control.engine().key_decision(key, None, |_| 0).await
    }

    /// Forgets everything about `key` in every policy, as if it had never been seen, and lifts
    /// any block (and a [block on violation](crate::Policy::block_on_violation)'s level). Returns
    /// the decision a request of cost 0 gets afterwards.
    pub async fn reset(&self, key: &Key) -> Result<Decision, StoreError> {
        self.control
            .engine()
            .key_decision(key, Some(Op::Reset), |_| 0)
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
    /// let decision = layer.control().set_limit("api", &customer, "500/min", Some(friday)).await?;
    /// assert_eq!(decision.outcomes()[0].limit(), 500);
    /// layer.control().clear_limit("api", &customer).await?;
    /// assert_eq!(layer.control().peek(&customer).await?.outcomes()[0].limit(), 100);
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
            Some(t) => self.control.until_us(t)?.0,
        };
        let answer = self.control.limit_key(policy, key, Some(quota), until_us)?;
        answer.await.map_err(LimitError::Store)
    }

    /// Ends `key`'s own limit in the policy (or tier) named `policy`, if it has one: it is
    /// back under the policy's quota, its usage kept. Returns the decision a request of cost 0
    /// gets afterwards.
    pub async fn clear_limit(&self, policy: &str, key: &Key) -> Result<Decision, LimitError> {
        let answer = self.control.limit_key(policy, key, None, 0)?;
        answer.await.map_err(LimitError::Store)
    }
}
