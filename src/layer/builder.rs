//! [`RateLimitLayerBuilder`]: everything a layer is configured with, checked when it is built.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

use super::RateLimitLayer;
use crate::body::Wrapped;
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::error::{ConfigError, FailurePolicy, KeyRejection};
use crate::grpc::ResponseStyle;
use crate::headers::{HeaderConfig, HeaderStyle, ResetFormat};
use crate::key::{DefaultKey, KeyExtractor, RequestRef};
use crate::limiter::{Config, Limiter};
use crate::lists::Lists;
use crate::near::{NearHook, NearLimit};
use crate::policy::Policy;
use crate::request_body::{BodyLimits, Read, Unread};
use crate::resilience::CircuitBreaker;
use crate::response::Responses;
use crate::store::{MemoryStore, Store};
use crate::top::TopLimited;

impl RateLimitLayer<MemoryStore> {
    /// Starts configuring a layer; it uses a fresh [`MemoryStore`] unless given another store.
    pub fn builder() -> RateLimitLayerBuilder<MemoryStore> {
        RateLimitLayerBuilder {
            store: MemoryStore::new(),
            o: Config {
                policies: Vec::new(),
                key: Arc::new(DefaultKey),
                responses: Responses::default(),
                failure: FailurePolicy::default(),
                headers: HeaderConfig::default(),
                partition_secret: None,
                exempt: None,
                cost: None,
                clock: Arc::new(SystemClock::new()),
                breaker: Some(CircuitBreaker::default()),
                deny_cache: None,
                decision_extension: true,
                top: None,
            },
            lists: None,
            on_near_limit: None,
            bodies: None,
            reads: PhantomData,
        }
    }
}

/// Configures a [`RateLimitLayer`]; every mistake is reported by [`build`](Self::build).
#[must_use]
///
/// `R` says whether the layer reads request bodies: [`Unread`] (the default), or [`Read`]
/// after [`read_bodies`](Self::read_bodies).
pub struct RateLimitLayerBuilder<St = MemoryStore, R = Unread> {
    store: St,
    o: Config,
    lists: Option<Lists>,
    on_near_limit: Option<NearHook>,
    bodies: Option<BodyLimits>,
    reads: PhantomData<fn() -> R>,
}

impl<St: fmt::Debug, R> fmt::Debug for RateLimitLayerBuilder<St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("store", &self.store)
            .field("config", &self.o)
            .finish_non_exhaustive()
    }
}

impl<St: Store, R> RateLimitLayerBuilder<St, R> {
    /// Hands each warning of a key near its limit
    /// ([`Policy::near_limit`](crate::Policy::near_limit)) to `hook`, whose
    /// future runs on a task of its own, never on the request's path: a webhook, an e-mail.
    /// Once per key and window on each instance. At most 256 of its tasks run at once; a
    /// warning that comes while they do is counted in
    /// `ratelimit_near_limit_hook_dropped_total{policy}` and not handed (not queued).
    ///
    /// ```
    /// use tower_ratelimit::{policy::NearLimit, Policy, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::fixed_window("1000/day").name("daily").near_limit(80))
    ///     .on_near_limit(|warning: NearLimit| async move {
    ///         // e.g. POST it to the customer's webhook.
    ///         println!("{:?} has {} of {} left", warning.key, warning.remaining, warning.limit);
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn on_near_limit<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(NearLimit) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.on_near_limit = Some(Arc::new(move |w| Box::pin(hook(w))));
        self
    }

    /// Gives the layer allow and deny lists of networks and keys (see [`Lists`]): a request
    /// on the deny list is answered `403`, one on the allow list is neither limited nor
    /// counted. Entries can then also be added at runtime, kept in the store
    /// ([`RateLimitControl::deny_key`](crate::RateLimitControl::deny_key)). A layer without
    /// lists pays nothing for them. In memory, a request pays the match of the lists given,
    /// and a look at its key's runtime entries once one was ever added to the store; with
    /// Redis, the entries are read in the decision's one call.
    pub fn lists(mut self, lists: Lists) -> Self {
        self.lists = Some(lists);
        self
    }

    /// Adds a policy. A request goes on only when every policy admits it, and then every policy
    /// is charged; when one denies it, none is.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.o.policies.push(policy);
        self
    }

    /// Adds every policy of `policies`, in order (e.g. from a configuration file:
    /// [`config::Limits::policies`](crate::config::Limits::policies) with the `serde` feature).
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.o.policies.extend(policies);
        self
    }

    /// The key requests are charged to, for every policy without its own
    /// ([`Policy::key`]). Defaults to [`PeerIp`](crate::key::PeerIp)'s key, except that an administrator's entry
    /// that is no address is kept as it is (for keys given in code to
    /// [`check`](crate::RateLimitLayer::check)); give `PeerIp` itself to have it refused.
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.o.key = Arc::new(key);
        self
    }

    /// Decides in `store` instead of a fresh [`MemoryStore`]. Layers given clones of one store
    /// share its state.
    pub fn store<T: Store>(self, store: T) -> RateLimitLayerBuilder<T, R> {
        RateLimitLayerBuilder {
            store,
            o: self.o,
            lists: self.lists,
            on_near_limit: self.on_near_limit,
            bodies: self.bodies,
            reads: PhantomData,
        }
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

    /// Adds the IETF `pk` parameter to `RateLimit-Policy` and `RateLimit` (with
    /// [`HeaderStyle::Ietf`] or [`HeaderStyle::Both`]): a byte sequence that tells a client
    /// which partition (key) each policy counted it against, without revealing the key. It is
    /// the first 16 bytes of an HMAC-SHA-256 of the key under `secret`; give every instance the
    /// same secret, at least 16 random bytes (shorter fails [`build`](Self::build)).
    ///
    /// ```
    /// use tower_ratelimit::{headers::HeaderStyle, Policy, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::gcra("10/s").name("per-ip"))
    ///     .headers(HeaderStyle::Ietf)
    ///     .partition_keys(b"0123456789abcdef-keep-me-secret")
    ///     .build();
    /// assert!(layer.is_ok());
    /// // RateLimit: "per-ip";r=9;t=1;pk=:x3cA1PfqtxDkXJ4BH6VIxA==:
    /// ```
    pub fn partition_keys(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.o.partition_secret = Some(secret.as_ref().to_vec());
        self
    }

    /// Delays every time a response tells (`t`, `Retry-After`, `X-RateLimit-Reset`) by one
    /// random duration up to `max`, drawn afresh for each response, so that clients limited at
    /// the same moment spread their retries (draft-ietf-httpapi-ratelimit-headers, section on
    /// resource exhaustion). The times are never earlier than the truth: a client that obeys
    /// them is admitted. Default: none.
    pub fn jitter(mut self, max: Duration) -> Self {
        self.o.headers.jitter = max;
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

    /// How requests the layer does not forward are answered (default [`ResponseStyle::Auto`]:
    /// gRPC requests the gRPC way, see [`grpc`](crate::grpc), the others with HTTP statuses).
    /// Under the gRPC form, the hooks' responses ([`on_limited`](Self::on_limited),
    /// [`on_key_rejected`](Self::on_key_rejected)) are turned into gRPC answers too, unless
    /// they set a `grpc-status` themselves.
    pub fn response_style(mut self, style: ResponseStyle) -> Self {
        self.o.responses.style = style;
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

    /// Whether an admitted request carries its [`Decision`](crate::Decision) in its extensions,
    /// for the handler (default: yes; with the `axum` feature, `Decision` is an extractor).
    ///
    /// Off, a request costs one allocation less (the extension's box): worth it for a service
    /// whose handlers never look at the decision. A handler extracting `Decision` then gets
    /// `500` (or `None` as `Option<Decision>`); rejected requests keep theirs in the `429`
    /// response's extensions either way.
    pub fn decision_extension(mut self, enabled: bool) -> Self {
        self.o.decision_extension = enabled;
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

    /// Keeps, per policy, a summary of the keys it denied over a sliding period, in fixed
    /// memory, to answer "who is being limited right now?" (default: off): see the
    /// [`top`](crate::top) module, [`RateLimitControl::top_limited`](crate::RateLimitControl::top_limited) and
    /// [`RateLimitControl::top_limited_service`](crate::RateLimitControl::top_limited_service).
    ///
    /// Only denied requests pay for it (a lock and a hash lookup); admitted ones carry their
    /// keys along, as they do with the deny cache.
    pub fn top_limited(mut self, top: TopLimited) -> Self {
        self.o.top = Some(top);
        self
    }

    /// The clock of the circuit breaker, the deny cache and the summary of limited keys, and
    /// the present an administrator's `until` must be after (default [`SystemClock`]). The
    /// store keeps its own clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.o.clock = Arc::new(clock);
        self
    }

    /// Checks the whole configuration and builds the layer.
    ///
    /// Fails when no policy was given, when a policy is invalid (see [`Policy`]), when two
    /// different policies share a name in one store, or when another setting is out of its
    /// range (such as [`top_limited`](Self::top_limited)'s).
    pub fn build(self) -> Result<RateLimitLayer<St, Wrapped, R>, ConfigError> {
        Ok(RateLimitLayer {
            control: Arc::new(Limiter::build(
                self.store,
                self.o,
                self.lists,
                self.on_near_limit,
                self.bodies,
            )?),
            body: PhantomData,
            reads: PhantomData,
        })
    }

    /// Has the layer read the request bodies its policies need (a policy keyed on the body,
    /// [`key::json`](crate::key::json), [`key::jsonrpc`](crate::key::jsonrpc), or costing
    /// what the body says, [`Policy::cost_json`]), within `limits`: see
    /// [`request_body`](crate::request_body). The layer's service is then a
    /// [`ReadBodies`](crate::request_body::ReadBodies), and the inner service's request body a
    /// [`ReadBody`](crate::request_body::ReadBody). A request no such policy applies to is
    /// not buffered. Without it, `build` refuses a policy that reads the body.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::{self, PeerIp}, request_body::BodyLimits};
    ///
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// // An MCP server: 10 calls a second per client and tool.
    /// let limit = RateLimitLayer::builder()
    ///     .policy(Policy::gcra("10/s").key(key::all((PeerIp::new(), key::jsonrpc()))))
    ///     .read_bodies(BodyLimits::new())
    ///     .build()?;
    /// let app: Router = Router::new()
    ///     .route("/mcp", post(|body: String| async move { body }))
    ///     .layer(limit);
    /// # Ok(()) }
    /// ```
    pub fn read_bodies(self, limits: BodyLimits) -> RateLimitLayerBuilder<St, Read> {
        RateLimitLayerBuilder {
            store: self.store,
            o: self.o,
            lists: self.lists,
            on_near_limit: self.on_near_limit,
            bodies: Some(limits),
            reads: PhantomData,
        }
    }
}
