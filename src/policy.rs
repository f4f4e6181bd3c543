//! Policies: an algorithm, a quota and a name.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use std::collections::HashMap;

use http::{HeaderValue, Method, StatusCode};

use crate::algorithm::{Algorithm, Compiled, Options};
use crate::error::{ConfigError, KeyRejection};
use crate::headers::value::number;
use crate::key::{Key, KeyExtractor, RequestRef};
use crate::quota::Quota;
use crate::quota::QuotaUnit;
use crate::reload::TierSummary;

/// One rate limit: an [`Algorithm`] applied to a [`Quota`], under a name.
///
/// Mistakes (a quota string that does not parse, a burst on an algorithm without one, numbers
/// too large) are kept and reported by
/// [`RateLimitLayerBuilder::build`](crate::RateLimitLayerBuilder::build), so a whole
/// configuration can be written without a `?` on every line:
///
/// ```
/// use tower_ratelimit::{Algorithm, Policy, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::token_bucket("100/min").burst(20).name("api"))
///     .build();
/// assert!(layer.is_ok());
///
/// let err = RateLimitLayer::builder()
///     .policy(Policy::new(Algorithm::FixedWindow, "100/fortnight"))
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("unit"));
/// ```
///
/// The name appears in response bodies, in the [`Decision`](crate::Decision) and in store keys;
/// two policies with the same name in one store share their buckets. It defaults to
/// `ALGORITHM:QUOTA`, e.g. `gcra:10/s`, followed by the burst and the number of buckets when
/// they are set, e.g. `token_bucket:100/min:burst20`.
#[derive(Clone)]
pub struct Policy {
    algorithm: Algorithm,
    quota: Result<Quota, ConfigError>,
    name: Option<String>,
    burst: Option<u32>,
    options: Options,
    key: Option<Arc<dyn KeyExtractor>>,
    cost: Option<CostFn>,
    shadow: bool,
    charge_if: Option<StatusFn>,
    refund_if: Option<StatusFn>,
    routes: Vec<Route>,
    exempt: Option<RequestFn>,
    tiers: Vec<(String, Result<Quota, ConfigError>)>,
    tier_of: Option<TierFn>,
    tier_overrides: Vec<(Key, String)>,
    lease: Option<u32>,
    lease_ttl: Option<Duration>,
    unit: QuotaUnit,
    wait: Option<Duration>,
    /// For a concurrency policy, the requests in flight at once, and how long a slot is held
    /// at most (`None`: [`DEFAULT_MAX_DURATION`]).
    concurrency: Option<(u32, Option<Duration>)>,
}

/// How long a concurrency slot is held at most by default ([`Policy::max_duration`]).
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(60);

/// The longest a request may wait for its slot ([`Policy::wait_up_to`]).
const MAX_WAIT: Duration = Duration::from_secs(3600);

pub(crate) type CostFn = Arc<dyn Fn(&RequestRef<'_>) -> u32 + Send + Sync>;
pub(crate) type StatusFn = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;
pub(crate) type RequestFn = Arc<dyn Fn(&RequestRef<'_>) -> bool + Send + Sync>;
pub(crate) type TierFn = Arc<dyn Fn(&RequestRef<'_>) -> Option<String> + Send + Sync>;

/// A method and path pattern a policy applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Route {
    method: Option<Method>,
    path: String,
}

impl Route {
    /// Matches the request's route: axum's matched route template when there is one (so
    /// `/users/{id}` matches every user), else the URI path. A pattern ending in `*` matches by
    /// prefix.
    fn matches(&self, request: &RequestRef<'_>) -> bool {
        if let Some(m) = &self.method
            && m != request.method()
        {
            return false;
        }
        let path = matched_path(request).unwrap_or_else(|| request.uri().path());
        match self.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == self.path,
        }
    }
}

#[cfg(feature = "axum")]
fn matched_path<'a>(request: &RequestRef<'a>) -> Option<&'a str> {
    request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str())
}

#[cfg(not(feature = "axum"))]
fn matched_path<'a>(_: &RequestRef<'a>) -> Option<&'a str> {
    None
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("algorithm", &self.algorithm)
            .field("quota", &self.quota)
            .field("name", &self.name)
            .field("burst", &self.burst)
            .field("key", &self.key)
            .field("shadow", &self.shadow)
            .field("routes", &self.routes)
            .field("tiers", &self.tiers)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// A policy applying `algorithm` to `quota` (a [`Quota`] or a string such as `"10/s"`).
    pub fn new<Q>(algorithm: Algorithm, quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Policy {
            algorithm,
            quota: quota.try_into().map_err(Into::into),
            name: None,
            burst: None,
            options: Options::default(),
            key: None,
            cost: None,
            shadow: false,
            charge_if: None,
            refund_if: None,
            routes: Vec::new(),
            exempt: None,
            tiers: Vec::new(),
            tier_of: None,
            tier_overrides: Vec::new(),
            lease: None,
            lease_ttl: None,
            unit: QuotaUnit::Requests,
            wait: None,
            concurrency: None,
        }
    }

    /// At most `n` requests of a key in flight at once, across every instance sharing the store
    /// (Stripe's concurrent-requests limiter). A request takes a slot when it is admitted and
    /// holds it until its response body has sent its last frame or is dropped, not merely until
    /// the headers are sent: a streamed response holds its slot while it streams.
    ///
    /// In the store, a slot is a lease that ends after [`max_duration`](Self::max_duration)
    /// (default one minute): an instance that dies while holding slots (a `kill -9`, a lost
    /// network) does not keep them longer; the next request on the key clears them. Combined
    /// with rate policies, the decision is atomic as always: no slot is taken when a rate policy
    /// rejects the request, and no rate unit is charged when no slot is free.
    ///
    /// Headers: `X-RateLimit-Limit` is `n`, `-Remaining` the slots free; the IETF item says
    /// `qu="concurrent-requests"` and leaves out `w` and `t`, which have no meaning for it. A
    /// request rejected because no slot is free gets no `Retry-After`: a slot frees when a
    /// request in flight ends, which no one knows in advance (the slots' leases only bound it,
    /// by up to a minute). [`cost`](Self::cost) takes several slots at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::{Policy, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// // At most 5 reports in flight per client, and 100 requests a minute.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::concurrency(5).name("reports").max_duration(Duration::from_secs(30)))
    ///     .policy(Policy::gcra("100/min"))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn concurrency(n: u32) -> Self {
        let mut policy = Self::new(Algorithm::SlidingLog, Quota::per_minute(NonZeroU32::MIN));
        policy.quota = Quota::new(n, DEFAULT_MAX_DURATION)
            .map_err(|e| ConfigError::new(format!("a concurrency limit of {n}: {e}")));
        policy.concurrency = Some((n, None));
        policy.unit = QuotaUnit::ConcurrentRequests;
        policy
    }

    /// How long a slot of a [concurrency](Self::concurrency) policy is held at most (default
    /// one minute): a request still in flight after that no longer counts. Set it above the
    /// longest response you serve, streaming included; it is what bounds how long the slots
    /// of a crashed instance stay taken. At most [`MAX_WINDOW`](crate::MAX_WINDOW).
    #[must_use]
    pub fn max_duration(mut self, max: Duration) -> Self {
        match &mut self.concurrency {
            Some((n, max_duration)) => {
                *max_duration = Some(max);
                self.quota = Quota::new(*n, max).map_err(Into::into);
            }
            None => {
                self.quota = Err(ConfigError::new(
                    "max_duration is for concurrency policies; use Policy::concurrency(n)",
                ));
            }
        }
        self
    }

    /// A [fixed window](Algorithm::FixedWindow) policy.
    pub fn fixed_window<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::FixedWindow, quota)
    }

    /// A [sliding window counter](Algorithm::SlidingWindow) policy.
    pub fn sliding_window<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::SlidingWindow, quota)
    }

    /// A [sliding log](Algorithm::SlidingLog) policy.
    pub fn sliding_log<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::SlidingLog, quota)
    }

    /// A [token bucket](Algorithm::TokenBucket) policy.
    pub fn token_bucket<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::TokenBucket, quota)
    }

    /// A [leaky bucket](Algorithm::LeakyBucket) policy.
    pub fn leaky_bucket<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::LeakyBucket, quota)
    }

    /// A [GCRA](Algorithm::Gcra) policy.
    pub fn gcra<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::Gcra, quota)
    }

    /// Names the policy (1 to 64 characters: letters, digits and `-_.:/`).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the burst of a bucket algorithm (token bucket, leaky bucket, GCRA): how many units a
    /// rested key may spend at once. Defaults to the limit.
    #[must_use]
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Sets the number of sub-window buckets of a sliding window counter (default 10). More
    /// buckets approximate the exact sliding window more closely, at 4 bytes each per key.
    #[must_use]
    pub fn buckets(mut self, buckets: u32) -> Self {
        self.options.buckets = Some(buckets);
        self
    }

    /// Charges this policy to a different key than the layer's.
    #[must_use]
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// How many units a request costs (default 1; a cost of 0 only looks). The cost is
    /// computed from the request head, e.g. from a header or the route. A request costing more
    /// than the policy's capacity is denied and never admitted.
    #[must_use]
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> u32 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Runs the policy in shadow mode (dry run): it is decided and charged like any other,
    /// reported in the [`Decision`](crate::Decision), in the IETF headers and in logs, but it
    /// never rejects a request. Use it to roll out a new limit safely.
    #[must_use]
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// Charges the policy only for responses whose status matches, e.g. failed logins:
    /// the request is let through while the key has room for it (nothing is charged), and
    /// the charge is made after the response, with one more store call only for matching
    /// responses.
    ///
    /// The bound is loose under concurrency: requests that are in flight together are all let
    /// through while the key has room, and charges past the limit are dropped. Where the
    /// bound must be strict, charge up front and give back what should be free instead:
    /// `.refund_if(|status| status != StatusCode::UNAUTHORIZED)`.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_ratelimit::Policy;
    ///
    /// // Five failed logins per minute; successful ones are free.
    /// let logins = Policy::sliding_log("5/min")
    ///     .name("failed-logins")
    ///     .charge_if(|status| status == StatusCode::UNAUTHORIZED);
    /// # let _ = logins;
    /// ```
    #[must_use]
    pub fn charge_if<F>(mut self, predicate: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.charge_if = Some(Arc::new(predicate));
        self
    }

    /// Gives the cost back after responses whose status matches (e.g. `5xx`, so clients are
    /// not charged for the server's failures), with one more store call only for those.
    #[must_use]
    pub fn refund_if<F>(mut self, predicate: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.refund_if = Some(Arc::new(predicate));
        self
    }

    /// Applies the policy only to requests with this method (`None`: any method) and path
    /// pattern; may be called several times. The pattern is compared with axum's matched route
    /// (e.g. `/users/{id}`) when there is one, else with the URI path; a trailing `*` matches
    /// by prefix. Without any route, the policy applies to every request.
    #[must_use]
    pub fn route(mut self, method: Option<Method>, path: impl Into<String>) -> Self {
        self.routes.push(Route {
            method,
            path: path.into(),
        });
        self
    }

    /// Skips the policy for requests the predicate accepts (an allow-list): they consume
    /// nothing from it.
    #[must_use]
    pub fn exempt_if<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> bool + Send + Sync + 'static,
    {
        self.exempt = Some(Arc::new(predicate));
        self
    }

    /// Adds a tier: the same algorithm with another quota, chosen per request by
    /// [`select_tier`](Self::select_tier) or per key by [`tier_for_key`](Self::tier_for_key).
    /// Each tier keeps its own state, named `POLICY:TIER`.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, key::Key};
    ///
    /// #[derive(Clone)]
    /// enum Plan { Free, Pro }
    ///
    /// // Free users 100 per hour, pro users 10,000; the plan comes from an auth layer.
    /// let plans = Policy::gcra("100/h")
    ///     .name("plan")
    ///     .tier("pro", "10000/h")
    ///     .select_tier(|req| match req.extensions().get::<Plan>() {
    ///         Some(Plan::Pro) => Some("pro".to_owned()),
    ///         _ => None, // the policy's own quota
    ///     })
    ///     .tier_for_key(Key::from("partner-42"), "pro");
    /// # let _ = plans;
    /// ```
    #[must_use]
    pub fn tier<Q>(mut self, name: impl Into<String>, quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        self.tiers
            .push((name.into(), quota.try_into().map_err(Into::into)));
        self
    }

    /// Chooses a tier per request; `None`, or a name that is not a tier, means the policy's
    /// own quota.
    #[must_use]
    pub fn select_tier<F>(mut self, select: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> Option<String> + Send + Sync + 'static,
    {
        self.tier_of = Some(Arc::new(select));
        self
    }

    /// Puts one key in a tier, whatever [`select_tier`](Self::select_tier) says.
    #[must_use]
    pub fn tier_for_key(mut self, key: impl Into<Key>, tier: impl Into<String>) -> Self {
        self.tier_overrides.push((key.into(), tier.into()));
        self
    }

    /// Lets each instance take up to `units` units of a key's limit from the store at once,
    /// and admit the key's requests from them locally, without a store call, until they are
    /// spent or the lease ends ([`lease_ttl`](Self::lease_ttl)); units left are given back.
    ///
    /// A lease turns a hot key's store calls from one per request into about one per `units`
    /// requests, and a lease in hand keeps admitting while the store is down, until it ends.
    /// The limit still holds across every instance: the store counts a lease's units as
    /// spent at the worst moment the lease allows, so no interleaving of instances admits
    /// more than the algorithm would. What it trades is the other way: units in another
    /// instance's lease are not available here, so up to `instances × units` units may go
    /// unused until the leases end, and the headers of a request admitted from a lease
    /// describe the key as of the lease's grant. Sizes start small and grow while the key is
    /// busy: a key seen once is decided as without a lease. See the crate docs' section on
    /// leases.
    ///
    /// The units are capped by the policy's limit (burst for the bucket algorithms): a lease
    /// of 0 units, or of more than that, is a configuration error. A lease cannot be combined
    /// with [`shadow`](Self::shadow) or [`charge_if`](Self::charge_if), which never charge
    /// up front. On a [`MemoryStore`](crate::MemoryStore) a lease works the same but saves
    /// nothing: the store is already in the process.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::Policy;
    ///
    /// // A global budget of 10,000 requests a minute, taken 50 at a time per instance.
    /// let global = Policy::gcra("10000/min")
    ///     .name("global")
    ///     .lease(50)
    ///     .lease_ttl(Duration::from_millis(500));
    /// # let _ = global;
    /// ```
    #[must_use]
    pub fn lease(mut self, units: u32) -> Self {
        self.lease = Some(units);
        self
    }

    /// How long a lease lives at most: its units are spent within this time of being taken,
    /// or given back. Default: the smaller of one second and a tenth of the quota's window.
    /// A fixed-window lease also ends with its window, a sliding-window lease with its
    /// sub-window bucket. Shorter leases bring unused units back sooner; longer ones let a
    /// quiet key keep its lease.
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// What the policy's units are, for the IETF `RateLimit-Policy` field's `qu` parameter
    /// (default [`QuotaUnit::Requests`], which is not written). Say
    /// [`QuotaUnit::ContentBytes`] for a policy whose [`cost`](Self::cost) counts bytes:
    ///
    /// ```
    /// use tower_ratelimit::{Policy, QuotaUnit};
    ///
    /// // 10 MB of uploads a minute: `"uploads";q=10000000;qu="content-bytes";w=60`.
    /// let uploads = Policy::token_bucket("10000000/min")
    ///     .name("uploads")
    ///     .unit(QuotaUnit::ContentBytes)
    ///     .cost(|req| {
    ///         req.headers()
    ///             .get(http::header::CONTENT_LENGTH)
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1)
    ///     });
    /// # let _ = uploads;
    /// ```
    #[must_use]
    pub fn unit(mut self, unit: QuotaUnit) -> Self {
        self.unit = unit;
        self
    }

    /// Makes a request this policy would reject wait instead, when it can be admitted within
    /// `max`: its slot in the future is reserved (charged) in the store in the same atomic step
    /// that decides it, so instances sharing a store queue on one schedule, first come first
    /// served; the layer then waits until that slot before calling the inner service. A
    /// request whose slot is further away than `max` is rejected at once, as without a wait
    /// (NGINX's `limit_req ... delay`, governor's `until_ready`).
    ///
    /// Every algorithm can reserve: GCRA and the buckets book their next free moment, the
    /// windows the first window (or sub-window) with room, the sliding log stamps the entry at
    /// its slot. A request whose client goes away while it waits gives its slot back. How many
    /// requests wait at once is bounded by what the policy admits within `max`.
    ///
    /// `max` must be between 1 microsecond and one hour; a shadow policy, a policy that
    /// charges after the response ([`charge_if`](Self::charge_if)) and a policy that takes
    /// leases cannot wait: [`build`](crate::RateLimitLayerBuilder::build) says so.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::Policy;
    ///
    /// // 10 requests a second; a burst beyond that is smoothed out over up to half a second.
    /// let smooth = Policy::gcra("10/s").wait_up_to(Duration::from_millis(500));
    /// # let _ = smooth;
    /// ```
    #[must_use]
    pub fn wait_up_to(mut self, max: Duration) -> Self {
        self.wait = Some(max);
        self
    }

    /// The longest wait, checked: see [`wait_up_to`](Self::wait_up_to).
    fn wait_us(&self, described: &str) -> Result<Option<u64>, ConfigError> {
        let Some(wait) = self.wait else {
            return Ok(None);
        };
        let fail = |message: &str| Err(ConfigError::new(message).context(described));
        if wait.is_zero() || wait > MAX_WAIT {
            return fail("wait_up_to must be between 1 microsecond and one hour");
        }
        if self.shadow {
            return fail("a shadow policy never rejects, so it cannot make a request wait");
        }
        if self.charge_if.is_some() {
            return fail(
                "a policy that charges after the response (charge_if) cannot reserve a slot ahead",
            );
        }
        if self.lease.is_some() {
            return fail("a policy cannot both take leases and make requests wait; pick one");
        }
        Ok(Some(u64::try_from(wait.as_micros()).unwrap_or(u64::MAX)))
    }

    /// What a concurrency policy cannot be combined with.
    fn concurrency_checks(&self) -> Result<(), ConfigError> {
        let conflict = if self.shadow {
            Some("shadow()")
        } else if self.charge_if.is_some() {
            Some("charge_if")
        } else if self.refund_if.is_some() {
            Some("refund_if")
        } else if self.wait.is_some() {
            Some("wait_up_to")
        } else if self.lease.is_some() {
            Some("lease")
        } else if !self.tiers.is_empty() {
            Some("tiers")
        } else if self.burst.is_some() {
            Some("a burst")
        } else if self.unit != QuotaUnit::ConcurrentRequests {
            Some("another unit than concurrent requests")
        } else {
            None
        };
        match conflict {
            Some(what) => Err(ConfigError::new(format!(
                "a concurrency policy counts requests in flight; it takes no {what}"
            ))),
            None => Ok(()),
        }
    }

    /// Whether the policy limits requests in flight.
    pub(crate) fn holds(&self) -> bool {
        self.concurrency.is_some()
    }

    /// Whether requests may wait for a reserved slot.
    pub(crate) fn waits(&self) -> bool {
        self.wait.is_some()
    }

    /// Whether the policy takes leases.
    pub(crate) fn takes_leases(&self) -> bool {
        self.lease.is_some()
    }

    /// The lease of a tier with `quota` and `compiled`, checked.
    fn lease_for(
        &self,
        quota: &Quota,
        compiled: &Compiled,
        described: &str,
    ) -> Result<Option<LeaseSpec>, ConfigError> {
        let Some(units) = self.lease else {
            return match self.lease_ttl {
                Some(_) => Err(ConfigError::new(
                    "lease_ttl without a lease; add .lease(units) or drop .lease_ttl()",
                )
                .context(described)),
                None => Ok(None),
            };
        };
        let fail = |message: String| Err(ConfigError::new(message).context(described));
        if self.shadow {
            return fail("a shadow policy cannot take leases: it never charges up front".into());
        }
        if self.charge_if.is_some() {
            return fail(
                "a policy that charges after the response (charge_if) cannot take leases".into(),
            );
        }
        let capacity = compiled.reported_limit();
        if units == 0 || u64::from(units) > capacity {
            return fail(format!(
                "a lease must be between 1 unit and the policy's limit of {capacity} (got {units})"
            ));
        }
        let window = quota.window_us();
        let ttl_us = match self.lease_ttl {
            Some(ttl) => {
                let us = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX);
                if us == 0 || us > window {
                    return fail(format!(
                        "lease_ttl must be between 1 microsecond and the quota's window of {window}us (got {us}us)"
                    ));
                }
                us
            }
            None => (window / 10).clamp(1, 1_000_000),
        };
        Ok(Some(LeaseSpec {
            units: u64::from(units),
            ttl_us,
        }))
    }

    /// The same policy with every limit and burst divided by `divisor` (never below 1), for
    /// the local fallback of [`FailurePolicy::Local`](crate::FailurePolicy::Local), which
    /// takes no leases.
    fn divided(&self, divisor: u32) -> Policy {
        let d = divisor.max(1);
        let divide = |q: &Result<Quota, ConfigError>| q.clone().and_then(|q| Ok(q.divided(d)?));
        let mut p = self.clone();
        p.lease = None;
        p.lease_ttl = None;
        p.quota = divide(&self.quota);
        p.burst = self.burst.map(|b| (b / d).max(1));
        p.tiers = self
            .tiers
            .iter()
            .map(|(name, q)| (name.clone(), divide(q)))
            .collect();
        p
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Validates everything and precomputes the algorithm's constants, registering nothing:
    /// the policy's own quota first, then one entry per tier; and the same, divided by
    /// `fallback_divisor`, for the local fallback store.
    pub(crate) fn prepare(
        &self,
        fallback_divisor: Option<u32>,
    ) -> Result<Prepared<'_>, ConfigError> {
        let fallback = match fallback_divisor {
            Some(divisor) => Some(self.divided(divisor).tiers_compiled()?),
            None => None,
        };
        Ok(Prepared {
            policy: self,
            tiers: self.tiers_compiled()?,
            fallback,
        })
    }

    /// The policy's own quota and each tier, named and compiled.
    fn tiers_compiled(&self) -> Result<Vec<CompiledTier>, ConfigError> {
        let described = match &self.name {
            Some(n) => format!("policy {n:?}"),
            None => format!("{} policy", self.algorithm),
        };
        if self.shadow && self.charge_if.is_some() {
            return Err(ConfigError::new(
                "a shadow policy cannot charge after the response; use one or the other",
            )
            .context(&described));
        }
        if self.concurrency.is_some() {
            self.concurrency_checks()
                .map_err(|e| e.context(&described))?;
        } else if self.unit == QuotaUnit::ConcurrentRequests {
            return Err(ConfigError::new(
                "a rate policy counts requests over time, not requests in flight; \
                 use QuotaUnit::Requests or QuotaUnit::ContentBytes",
            )
            .context(&described));
        }
        self.wait_us(&described)?;
        if !self.tiers.is_empty() && self.name.is_none() {
            return Err(ConfigError::new("a policy with tiers needs a name").context(&described));
        }
        let quota = self.quota.clone().map_err(|e| e.context(&described))?;
        let base = match &self.name {
            Some(n) => {
                validate_name(n).map_err(|e| e.context(&described))?;
                n.clone()
            }
            None if self.concurrency.is_some() => format!("concurrency:{}", quota.limit()),
            None => {
                // Parameters that change the policy are part of its default name, so two
                // different policies never share one by accident.
                let mut name = format!("{}:{quota}", self.algorithm);
                if let Some(burst) = self.burst {
                    name.push_str(&format!(":burst{burst}"));
                }
                if let Some(buckets) = self.options.buckets {
                    name.push_str(&format!(":buckets{buckets}"));
                }
                name
            }
        };
        let compiled = self.compile_quota(quota, &described)?;
        let lease = self.lease_for(&quota, &compiled, &described)?;
        let mut out = vec![(
            Arc::from(base.as_str()),
            compiled,
            lease,
            self.about(&quota),
        )];
        for (tier, quota) in &self.tiers {
            let described = format!("{described}, tier {tier:?}");
            let name = format!("{base}:{tier}");
            validate_name(&name).map_err(|e| e.context(&described))?;
            if out.iter().any(|(n, _, _, _)| **n == *name) {
                return Err(ConfigError::new("two tiers share a name").context(&described));
            }
            let quota = quota.clone().map_err(|e| e.context(&described))?;
            let compiled = self.compile_quota(quota, &described)?;
            let lease = self.lease_for(&quota, &compiled, &described)?;
            out.push((Arc::from(name), compiled, lease, self.about(&quota)));
        }
        for (_, tier) in &self.tier_overrides {
            if !self.tiers.iter().any(|(t, _)| t == tier) {
                return Err(ConfigError::new(format!(
                    "tier_for_key names the tier {tier:?}, which was not added with .tier()"
                ))
                .context(&described));
            }
        }
        Ok(out)
    }

    /// What a tier of the policy with `quota` is, in a few words (e.g. `gcra 10/s burst 20`),
    /// for the report of a reload.
    fn about(&self, quota: &Quota) -> String {
        let mut about = match self.concurrency {
            Some((n, _)) => format!(
                "concurrency {n}, held at most {:?}",
                Duration::from_micros(quota.window_us())
            ),
            None => format!("{} {quota}", self.algorithm),
        };
        if let Some(burst) = self.burst {
            about.push_str(&format!(" burst {burst}"));
        }
        if let Some(buckets) = self.options.buckets {
            about.push_str(&format!(" buckets {buckets}"));
        }
        about
    }

    fn compile_quota(&self, mut quota: Quota, described: &str) -> Result<Compiled, ConfigError> {
        if let Some(burst) = self.burst {
            if !self.algorithm.has_burst() {
                return Err(ConfigError::new(format!(
                    "{} has no burst; use token_bucket, leaky_bucket or gcra for a burst different from the limit",
                    self.algorithm
                ))
                .context(described));
            }
            quota = quota
                .try_with_burst(burst)
                .map_err(|e| ConfigError::from(e).context(described))?;
        }
        Compiled::new(self.algorithm, quota, self.options).map_err(|e| e.context(described))
    }
}

fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:/".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok_char) {
        return Err(ConfigError::new(
            "a policy name must be 1 to 64 characters of letters, digits and -_.:/",
        ));
    }
    Ok(())
}

/// Where a policy tier is registered in a store: its id, the same for every definition its
/// name has had (so a reloaded policy finds its keys again), and the number of its present
/// definition (a state written under another is converted before it is used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Registered {
    pub(crate) id: u32,
    pub(crate) def: u32,
}

/// `n` in base 36, lowercase (Lua reads it back with `tonumber(text, 36)`).
fn base36(mut n: u64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).expect("ASCII digits")
}

/// A tier's name, compiled algorithm and lease.
type CompiledTier = (Arc<str>, Compiled, Option<LeaseSpec>, String);

/// A policy validated and precomputed, not yet registered in a store.
pub(crate) struct Prepared<'p> {
    policy: &'p Policy,
    tiers: Vec<CompiledTier>,
    fallback: Option<Vec<CompiledTier>>,
}

impl Prepared<'_> {
    /// The names of the policy's tiers, its own quota first.
    pub(crate) fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.tiers.iter().map(|(name, _, _, _)| name)
    }

    /// The tiers to register in the store, by name.
    pub(crate) fn tiers(&self) -> impl Iterator<Item = (Arc<str>, Compiled)> + '_ {
        self.tiers.iter().map(|(n, a, _, _)| (n.clone(), a.clone()))
    }

    /// What each tier is, by name, for the report of a reload.
    pub(crate) fn summary(&self) -> impl Iterator<Item = TierSummary> + '_ {
        self.tiers
            .iter()
            .map(|(n, a, _, about)| TierSummary::new(n.clone(), a.clone(), about.clone()))
    }

    /// The tiers to register in the local fallback store, by name (none without one).
    pub(crate) fn fallback_tiers(&self) -> impl Iterator<Item = (Arc<str>, Compiled)> + '_ {
        self.fallback
            .iter()
            .flatten()
            .map(|(n, a, _, _)| (n.clone(), a.clone()))
    }

    /// Compiles the policy into its runtime form, its tiers registered as `store` (and
    /// `fallback`) say, in the order of [`tiers`](Self::tiers) (and of
    /// [`fallback_tiers`](Self::fallback_tiers)); `key` and `cost` are the layer's, for a
    /// policy without its own.
    pub(crate) fn build(
        self,
        key: &Arc<dyn KeyExtractor>,
        cost: &Option<CostFn>,
        store: &mut dyn Iterator<Item = Registered>,
        fallback: &mut dyn Iterator<Item = Registered>,
    ) -> CompiledPolicy {
        let p = self.policy;
        // Checked by `prepare`.
        let wait = p.wait_us("").ok().flatten();
        let build = |at: &mut dyn Iterator<Item = Registered>, tiers: Vec<CompiledTier>| {
            tiers
                .into_iter()
                .map(|(name, algorithm, lease, _)| {
                    let at = at.next().expect("one registration per tier");
                    Striped::new(|| {
                        Tier::new(name.clone(), at, algorithm.clone())
                            .with_lease(lease)
                            .with_unit(p.unit)
                            .with_wait(wait)
                            .with_holds(p.holds())
                    })
                })
                .collect::<Box<[_]>>()
        };
        let tiers = build(store, self.tiers);
        let fallback = self.fallback.map(|tiers| build(fallback, tiers));
        let tier_names: HashMap<String, usize> = p
            .tiers
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (t.clone(), i + 1))
            .collect();
        let tier_overrides = p
            .tier_overrides
            .iter()
            .map(|(k, t)| (k.clone(), tier_names[t]))
            .collect();
        CompiledPolicy {
            tiers,
            fallback,
            tier_names,
            tier_of: p.tier_of.clone(),
            tier_overrides,
            key: p.key.clone().unwrap_or_else(|| key.clone()),
            cost: p.cost.clone().or_else(|| cost.clone()),
            shadow: p.shadow,
            waits: wait.is_some(),
            holds: p.holds(),
            charge_if: p.charge_if.clone(),
            refund_if: p.refund_if.clone(),
            routes: p.routes.clone(),
            exempt: p.exempt.clone(),
        }
    }
}

/// A policy ready to run: its tiers (the policy's own quota first), the same tiers divided in
/// the local fallback store, and its options.
pub(crate) struct CompiledPolicy {
    tiers: Box<[Striped]>,
    fallback: Option<Box<[Striped]>>,
    tier_names: HashMap<String, usize>,
    tier_of: Option<TierFn>,
    tier_overrides: HashMap<Key, usize>,
    key: Arc<dyn KeyExtractor>,
    cost: Option<CostFn>,
    shadow: bool,
    /// Whether a request may wait for a reserved slot ([`Policy::wait_up_to`]).
    waits: bool,
    /// Whether the policy limits requests in flight ([`Policy::concurrency`]).
    holds: bool,
    charge_if: Option<StatusFn>,
    refund_if: Option<StatusFn>,
    routes: Vec<Route>,
    exempt: Option<RequestFn>,
}

impl fmt::Debug for CompiledPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("key", &self.key)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}

impl CompiledPolicy {
    /// The policy's name (its own quota's tier).
    pub(crate) fn name(&self) -> &str {
        self.tiers[0].get().name()
    }

    /// Whether the policy applies to `request` (its routes match and it is not exempt).
    pub(crate) fn applies(&self, request: &RequestRef<'_>) -> bool {
        (self.routes.is_empty() || self.routes.iter().any(|r| r.matches(request)))
            && !self.exempt.as_ref().is_some_and(|f| f(request))
    }

    /// The key `request` is charged to.
    pub(crate) fn key(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        self.key.extract(request)
    }

    /// The index of the tier for this request and key.
    pub(crate) fn tier_index(&self, request: &RequestRef<'_>, key: &Key) -> usize {
        if self.tiers.len() == 1 {
            return 0;
        }
        self.tier_overrides
            .get(key)
            .copied()
            .or_else(|| {
                let tier = self.tier_of.as_ref()?(request)?;
                self.tier_names.get(&tier).copied()
            })
            .unwrap_or(0)
    }

    /// The tier `key` is in without a request: the one [`Policy::tier_for_key`] puts it in,
    /// else the policy's own quota.
    pub(crate) fn tier_of_key(&self, key: &Key) -> &Arc<Tier> {
        self.tiers[self.tier_overrides.get(key).copied().unwrap_or(0)].get()
    }

    /// The policy's tiers, its own quota first.
    pub(crate) fn tiers(&self) -> impl Iterator<Item = &Arc<Tier>> {
        self.tiers.iter().map(Striped::get)
    }

    /// The tier at `index`.
    pub(crate) fn tier(&self, index: usize) -> &Arc<Tier> {
        self.tiers[index].get()
    }

    /// The tier at `index` in the local fallback store, if there is one.
    pub(crate) fn fallback_tier(&self, index: usize) -> Option<&Arc<Tier>> {
        self.fallback.as_ref().map(|tiers| tiers[index].get())
    }

    /// The units `request` costs.
    pub(crate) fn cost(&self, request: &RequestRef<'_>) -> u64 {
        self.cost.as_ref().map_or(1, |f| u64::from(f(request)))
    }

    /// Whether the policy runs in shadow mode: decided and reported, never enforced.
    pub(crate) fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// Whether a request may wait for a reserved slot.
    pub(crate) fn waits(&self) -> bool {
        self.waits
    }

    /// Whether the policy limits requests in flight.
    pub(crate) fn holds(&self) -> bool {
        self.holds
    }

    /// Charge after responses whose status matches.
    pub(crate) fn charge_if(&self) -> Option<&StatusFn> {
        self.charge_if.as_ref()
    }

    /// Give the cost back after responses whose status matches.
    pub(crate) fn refund_if(&self) -> Option<&StatusFn> {
        self.refund_if.as_ref()
    }
}

/// How many copies of each tier a policy keeps (see [`Striped`]).
const STRIPES: usize = 8;

/// A tier as [`STRIPES`] equal copies, each behind its own `Arc`: every decision clones a
/// tier's `Arc` (its checks and its outcomes hold one), and threads that cloned the same one
/// would fight over its reference count's cache line (measured: the largest cost of two
/// threads deciding at once). Each thread takes the copy of its own stripe.
pub(crate) struct Striped(Box<[Arc<Tier>]>);

impl Striped {
    fn new(make: impl Fn() -> Tier) -> Self {
        Striped((0..STRIPES).map(|_| Arc::new(make())).collect())
    }

    /// This thread's copy.
    pub(crate) fn get(&self) -> &Arc<Tier> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
        }
        &self.0[STRIPE.with(|s| *s)]
    }
}

impl fmt::Debug for Striped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0[0].fmt(f)
    }
}

/// One quota of a compiled policy, as stores and decisions know it (the policy's own quota is
/// its first tier): name, id in the store, algorithm; and what every response for it reuses,
/// built once: its limit as a header value and its metrics keys.
#[derive(Debug)]
pub(crate) struct Tier {
    name: Arc<str>,
    id: u32,
    /// The number of the tier's definition in its store: a state written under another is
    /// converted before it is used.
    def: u32,
    algorithm: Compiled,
    /// The tag of the tier's definition in the Redis script: a tilde, the algorithm's id and
    /// its parameters in base 36, written after every state (see `store` in `helpers.lua`).
    tag: Box<str>,
    /// The limit clients are told, as a header value.
    limit_header: HeaderValue,
    /// `ratelimit_decisions_total{policy, outcome}` for allowed, limited and shadow-limited,
    /// so that counting a decision allocates no label list.
    decisions_metric: [metrics::Key; 3],
    /// The lease each instance takes of a key, if the policy takes leases.
    lease: Option<LeaseSpec>,
    /// What the tier's units are (the IETF `qu`).
    unit: QuotaUnit,
    /// The longest wait for a reserved slot, in microseconds, if requests may wait.
    wait_us: Option<u64>,
    /// Whether the tier limits requests in flight, each holding a slot until its response ends.
    holds: bool,
}

/// A policy tier's lease: how many units an instance takes at once, and for how long at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseSpec {
    units: u64,
    ttl_us: u64,
}

impl LeaseSpec {
    /// Units taken at once.
    pub(crate) fn units(&self) -> u64 {
        self.units
    }

    /// The longest life of a lease, in microseconds.
    pub(crate) fn ttl_us(&self) -> u64 {
        self.ttl_us
    }
}

impl Tier {
    pub(crate) fn new(name: Arc<str>, at: Registered, algorithm: Compiled) -> Self {
        let (lua_id, params) = algorithm.lua_args();
        // In base 36, to keep a state and its tag within the 44 bytes Redis stores in one
        // allocation (an "embstr").
        let params: Vec<String> = params.iter().map(|&n| base36(n)).collect();
        let tag = format!("~{lua_id}:{}", params.join(",")).into_boxed_str();
        let limit_header = number(algorithm.reported_limit());
        let decisions_metric = ["allowed", "limited", "shadow_limited"].map(|outcome| {
            metrics::Key::from_parts(
                "ratelimit_decisions_total",
                vec![
                    metrics::Label::new("policy", metrics::SharedString::from(name.clone())),
                    metrics::Label::from_static_parts("outcome", outcome),
                ],
            )
        });
        Tier {
            name,
            id: at.id,
            def: at.def,
            algorithm,
            tag,
            limit_header,
            decisions_metric,
            lease: None,
            unit: QuotaUnit::Requests,
            wait_us: None,
            holds: false,
        }
    }

    /// The same tier limiting requests in flight, when `holds`.
    pub(crate) fn with_holds(mut self, holds: bool) -> Self {
        self.holds = holds;
        self
    }

    /// Whether the tier limits requests in flight.
    pub(crate) fn holds(&self) -> bool {
        self.holds
    }

    /// The same tier letting requests wait up to `wait_us` for a reserved slot.
    pub(crate) fn with_wait(mut self, wait_us: Option<u64>) -> Self {
        self.wait_us = wait_us;
        self
    }

    /// The longest wait for a reserved slot, in microseconds (0: requests never wait).
    pub(crate) fn wait_us(&self) -> u64 {
        self.wait_us.unwrap_or(0)
    }

    /// The same tier counting `unit`s.
    pub(crate) fn with_unit(mut self, unit: QuotaUnit) -> Self {
        self.unit = unit;
        self
    }

    /// What the tier's units are.
    pub(crate) fn unit(&self) -> QuotaUnit {
        self.unit
    }

    /// The same tier taking `lease`.
    pub(crate) fn with_lease(mut self, lease: Option<LeaseSpec>) -> Self {
        self.lease = lease;
        self
    }

    /// The tier's lease, if it takes leases.
    pub(crate) fn lease(&self) -> Option<LeaseSpec> {
        self.lease
    }

    /// The tier's name: the policy's, then `:TIER` for a named tier.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The tier's name as a metric label value, shared, not copied.
    pub(crate) fn label(&self) -> metrics::SharedString {
        metrics::SharedString::from(self.name.clone())
    }

    /// The tier's id in its store.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// The number of the tier's definition in its store.
    pub(crate) fn def(&self) -> u32 {
        self.def
    }

    /// The tag of the tier's definition in the Redis script.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    pub(crate) fn algorithm(&self) -> &Compiled {
        &self.algorithm
    }

    /// `X-RateLimit-Limit`.
    pub(crate) fn limit_header(&self) -> &HeaderValue {
        &self.limit_header
    }

    /// Counts one decision of this tier in `ratelimit_decisions_total`.
    pub(crate) fn count(&self, allowed: bool, shadow: bool) {
        static METADATA: metrics::Metadata<'static> =
            metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        let key = &self.decisions_metric[match (allowed, shadow) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        }];
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
    }
}
