//! [`Policy`], the public builder of one rate limit.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::route::Route;
use crate::adaptive::Adaptive;
use crate::algorithm::{Algorithm, Options};
use crate::calendar::Calendar;
use crate::error::ConfigError;
use crate::key::{Key, KeyExtractor, RequestRef};
use crate::quota::Quota;
use crate::quota::QuotaUnit;
use crate::settle::Settle;
use crate::store::Op;

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
    pub(super) algorithm: Algorithm,
    pub(super) quota: Result<Quota, ConfigError>,
    pub(super) name: Option<String>,
    pub(super) burst: Option<u32>,
    pub(super) options: Options,
    pub(super) key: Option<Arc<dyn KeyExtractor>>,
    pub(super) cost: Option<CostFn>,
    /// Where the body states the cost ([`Policy::cost_json`], [`Policy::cost_graphql`]), or
    /// why it cannot.
    pub(super) body_cost: Option<Result<super::body_cost::BodyCost, ConfigError>>,
    /// The least a cost read from the body counts ([`Policy::min_body_cost`]): 1 by default.
    pub(super) body_floor: u32,
    /// How the policy takes part in a decision: the operation its checks make, chosen by one
    /// builder method ([`Policy::shadow`], [`Policy::charge_if`], [`Policy::wait_up_to`],
    /// [`Policy::concurrency`]; enforced unless one is called), or why it cannot (two ways
    /// were asked for, which [`build`](crate::RateLimitLayerBuilder::build) reports).
    pub(super) takes: Result<Op, ConfigError>,
    /// The statuses a policy charged after the response ([`Policy::charge_if`]) is charged for.
    pub(super) charge_if: Option<StatusFn>,
    /// The units and longest life of the leases an enforced policy takes ([`Policy::lease`]).
    pub(super) lease: Option<(u32, Option<Duration>)>,
    pub(super) refund_if: Option<StatusFn>,
    pub(super) settle: Option<Settle>,
    pub(super) routes: Vec<Route>,
    pub(super) exempt: Option<RequestFn>,
    pub(super) tiers: Vec<(String, Result<Quota, ConfigError>)>,
    pub(super) tier_of: Option<TierFn>,
    pub(super) tier_overrides: Vec<(Key, String)>,
    pub(super) unit: QuotaUnit,
    pub(super) calendar: Option<Calendar>,
    /// The capacity kept for priority ([`Policy::reserve`]).
    pub(super) reserve: Option<super::Reserve>,
    /// The adaptive limit of requests in flight ([`Policy::adaptive_concurrency`]).
    pub(super) adaptive: Option<Adaptive>,
    /// The percentage of the limit past which a key is warned of ([`Policy::near_limit`]).
    pub(super) near_limit: Option<u8>,
    /// How a key that keeps being denied is blocked ([`Policy::block_on_violation`]).
    pub(super) escalation: Option<super::Escalation>,
}

/// How long a concurrency slot is held at most by default ([`Policy::max_duration`]).
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(60);

/// The longest a request may wait for its turn ([`Policy::wait_up_to`]).
const MAX_WAIT: Duration = Duration::from_secs(3600);

pub(crate) type CostFn = Arc<dyn Fn(&RequestRef<'_>) -> u32 + Send + Sync>;
pub(crate) type StatusFn = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;
pub(crate) type RequestFn = Arc<dyn Fn(&RequestRef<'_>) -> bool + Send + Sync>;
pub(crate) type TierFn = Arc<dyn Fn(&RequestRef<'_>) -> Option<String> + Send + Sync>;

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("algorithm", &self.algorithm)
            .field("quota", &self.quota)
            .field("name", &self.name)
            .field("burst", &self.burst)
            .field("key", &self.key)
            .field("takes", &self.takes.as_ref().map(|op| self.what(*op)))
            .field("routes", &self.routes)
            .field("tiers", &self.tiers)
            .field("calendar", &self.calendar)
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
            body_cost: None,
            body_floor: 1,
            takes: Ok(Op::Enforce),
            charge_if: None,
            lease: None,
            refund_if: None,
            settle: None,
            routes: Vec::new(),
            exempt: None,
            tiers: Vec::new(),
            tier_of: None,
            tier_overrides: Vec::new(),
            unit: QuotaUnit::Requests,
            calendar: None,
            reserve: None,
            adaptive: None,
            near_limit: None,
            escalation: None,
        }
    }

    /// Makes the policy take part in decisions by making `op`: the same way again replaces it,
    /// another way is an error.
    fn take_part(mut self, op: Op) -> Self {
        self.takes = match self.takes {
            Ok(old)
                if self.lease.is_none()
                    && (old == Op::Enforce
                        || std::mem::discriminant(&old) == std::mem::discriminant(&op)) =>
            {
                Ok(op)
            }
            Ok(old) => Err(self.two_ways(old, op.what())),
            Err(e) => Err(e),
        };
        self
    }

    /// What the policy does in a decision, making `op`, for messages.
    pub(super) fn what(&self, op: Op) -> &'static str {
        match self.lease {
            Some(_) => Op::Lease { want: 0 }.what(),
            None => op.what(),
        }
    }

    /// The error of a policy making `old` asked to take part a second way, `what`.
    pub(super) fn two_ways(&self, old: Op, what: &str) -> ConfigError {
        ConfigError::new(format!(
            "a policy takes part in a decision one way, and this one both {} and {what}; pick one",
            self.what(old)
        ))
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
        policy.unit = QuotaUnit::ConcurrentRequests;
        policy.take_part(Op::Concurrency)
    }

    /// How long a slot of a [concurrency](Self::concurrency) policy is held at most (default
    /// one minute): a request still in flight after that no longer counts. Set it above the
    /// longest response you serve, streaming included; it is what bounds how long the slots
    /// of a crashed instance stay taken. At most [`MAX_WINDOW`](crate::MAX_WINDOW).
    #[must_use]
    pub fn max_duration(mut self, max: Duration) -> Self {
        match (&self.takes, &self.quota) {
            (Ok(Op::Concurrency), Ok(slots)) => {
                self.quota = Quota::new(slots.limit(), max).map_err(Into::into);
            }
            // The number of slots was refused: that is the error to report.
            (Ok(Op::Concurrency), Err(_)) => {}
            _ => {
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

    /// Counts the quota over the periods of `calendar`: a day, a week or a month that starts at
    /// midnight in its time zone (on its week day, on its day of the month), exact across
    /// daylight-saving changes and months of any length, rather than over windows aligned to
    /// the Unix epoch. For a [fixed window](Algorithm::FixedWindow) of one day, one week or one
    /// month; anything else is an error of [`build`](crate::RateLimitLayerBuilder::build). A
    /// monthly quota (`"10000/month"`) without a calendar counts months in UTC from the 1st.
    /// `Retry-After`, `X-RateLimit-Reset` and the IETF `t` count to the period's real end.
    ///
    /// ```
    /// use tower_ratelimit::{Algorithm, calendar::Calendar, Policy, RateLimitLayer, key::PeerIp};
    ///
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// let plan = Policy::new(Algorithm::FixedWindow, "500/day")
    ///     .calendar(Calendar::in_zone("America/New_York")?);
    /// let layer = RateLimitLayer::builder().policy(plan).key(PeerIp::new()).build()?;
    /// # let _ = layer;
    /// let hourly = Policy::new(Algorithm::FixedWindow, "10/h").calendar(Calendar::utc());
    /// let err = RateLimitLayer::builder().policy(hourly).build().unwrap_err();
    /// assert!(err.to_string().contains("one day, one week or one month"));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn calendar(mut self, calendar: Calendar) -> Self {
        self.calendar = Some(calendar);
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
        self.body_cost = None;
        self
    }

    /// Runs the policy in shadow mode (dry run): it is decided and charged like any other,
    /// reported in the [`Decision`](crate::Decision), in the IETF headers and in logs, but it
    /// never rejects a request. Use it to roll out a new limit safely.
    #[must_use]
    pub fn shadow(self) -> Self {
        self.take_part(Op::Shadow)
    }

    /// Charges the policy only for responses whose status matches, e.g. failed logins:
    /// the request is let through while the key has room for it (nothing is charged), and
    /// the charge is made after the response, with one more store call only for matching
    /// responses. A charged response waits for that call, and its rate-limit headers tell
    /// what is left after its charge (when that is less than what the other policies leave);
    /// a response that is not charged tells what the key had before it.
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
        self.take_part(Op::ChargeIf)
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

    /// Settles each request at what its response really cost, read where `settle` says (a
    /// response extension or header, or the body as it streams): the request is admitted and
    /// charged up front on its estimate (the policy's [`cost`](Self::cost)); once the real
    /// cost is known, the difference is given back or charged, past the limit if need be, in
    /// one atomic store operation. A key that owes units is denied until time has paid them
    /// back, `Retry-After` saying when; a window algorithm's debt lasts until its window
    /// moves past it.
    ///
    /// The headers of a response whose cost is read from its head tell what is left after
    /// the settled cost; a cost counted from the body is known after the headers were sent,
    /// which tell the estimate (the next response tells the settled cost). Only an enforced policy settles: not with
    /// [`shadow`](Self::shadow), [`charge_if`](Self::charge_if), [`lease`](Self::lease),
    /// [`wait_up_to`](Self::wait_up_to), [`concurrency`](Self::concurrency) or
    /// [`refund_if`](Self::refund_if).
    ///
    /// ```
    /// use tower_ratelimit::{Policy, QuotaUnit, settle::Settle};
    ///
    /// // Bytes sent per hour, admitted on an estimate of 64 KiB, settled on what was sent.
    /// let downloads = Policy::gcra("1000000000/h")
    ///     .name("download-bytes")
    ///     .unit(QuotaUnit::ContentBytes)
    ///     .cost(|_| 65_536)
    ///     .settle(Settle::body_bytes());
    /// # let _ = downloads;
    /// ```
    #[must_use]
    pub fn settle(mut self, settle: Settle) -> Self {
        self.settle = Some(settle);
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
    /// `max`: its time in the future is booked (charged) in the store in the same atomic step
    /// that decides it, so instances sharing a store queue on one schedule, first come first
    /// served; the layer then waits until that time before calling the inner service. A
    /// request whose time is further away than `max` is rejected at once, as without a wait
    /// (NGINX's `limit_req ... delay`, governor's `until_ready`).
    ///
    /// Every algorithm can book: GCRA and the buckets book their next free moment, the
    /// windows the first window (or sub-window) with room, the sliding log stamps the entry at
    /// its booked time. A request whose client goes away while it waits gives its units
    /// back. How many requests wait at once is bounded by what the policy admits within `max`.
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
        if max.is_zero() || max > MAX_WAIT {
            self.takes = Err(ConfigError::new(
                "wait_up_to must be between 1 microsecond and one hour",
            ));
            return self;
        }
        let max_wait_us = max.as_micros() as u64;
        self.take_part(Op::Wait { max_wait_us })
    }

    /// This policy waiting up to `max` when it would otherwise refuse at once and can wait
    /// (it enforces, takes no lease, keeps no reserve, settles nothing and has no wait of its
    /// own), else as it is: an outbound call's policy.
    pub(crate) fn waiting_by_default(self, max: Duration) -> Self {
        let waits = self.lease.is_none() && self.reserve.is_none() && self.settle.is_none();
        match self.takes {
            Ok(Op::Enforce) if waits => self.wait_up_to(max),
            _ => self,
        }
    }

    /// The same, a cost it settles leaving its key owing what its rate pays back in `pause`
    /// at most (an egress layer's `max_pause`).
    pub(crate) fn settle_owing_at_most(mut self, pause: Duration) -> Self {
        self.settle = self.settle.map(|s| s.owing_at_most(pause));
        self
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}
