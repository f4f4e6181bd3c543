//! Rate limiting for HTTP APIs, as a [tower](https://docs.rs/tower) middleware.
//!
//! A [`RateLimitLayer`] wraps any tower service that takes an [`http::Request`]: an axum
//! `Router` or a single route, a hyper or tonic service. For each request it extracts a
//! [key] (client IP, API key, user, or anything else), asks an [algorithm](Algorithm)
//! whether that key may go on, and either forwards the request or answers
//! `429 Too Many Requests` with `Retry-After` and rate-limit [headers].
//!
//! ```
//! use axum::{Router, routing::get};
//! use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp, quota};
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     // 10 requests per second per client IP, bursts of up to 10.
//!     .layer(RateLimitLayer::new(Policy::gcra(quota!("10/s")), PeerIp::new()));
//! ```
//!
//! [`RateLimitLayer::new`] is the common case: one policy and a key, in memory (a quota written
//! with [`quota!`] is checked at compile time). [`RateLimitLayer::with_store`] is the same on a
//! [`RedisStore`] shared by every instance, and [`RateLimitLayer::builder`] configures the rest,
//! returning every mistake in configuration read at run time as a [`ConfigError`] from
//! [`build`](RateLimitLayerBuilder::build).
//!
//! The same policies limit the calls a service makes: an [`egress::EgressLayer`] around a
//! client has each call wait for its place in a budget every instance shares, and pauses them
//! all when the upstream answers `429` with `Retry-After`.
//!
//! This page teaches the concepts; the [`guide`] goes through each task (several limits, keys,
//! waits, concurrency limits, messages inside WebSockets and streams, outbound calls, reload,
//! Redis, gRPC, production, performance) with examples that run.
//!
//! # Concepts
//!
//! * A [`Quota`] is a rate: `limit` units per `window` (`"10/s"`, `"100/min"`, `"20/10s"`),
//!   with a burst for the bucket algorithms. Zero limits and windows cannot be expressed.
//! * A [`Policy`] applies an [`Algorithm`] to a quota under a name. A layer may hold several;
//!   a request goes on only when all admit it, and then all are charged.
//! * A [key extractor](key::KeyExtractor) says whom a request is charged to. A request
//!   without a key is rejected (400 by default), never counted in a shared bucket.
//! * A [`Store`] keeps the per-key state and makes each decision atomically.
//!   [`MemoryStore`] is the in-process store: sharded, bounded, exact under concurrency.
//! * The [`Decision`] names each policy's outcome; the layer puts it in the request extensions
//!   for handlers, and builds the response headers from it.
//! * A [`Clock`] gives the time; tests inject a [`ManualClock`] and never sleep.
//!
//! # Several limits, per route, per plan
//!
//! One layer can hold a whole API's limits. Each [`Policy`] may have its own key, apply only to
//! some routes ([`Policy::route`]), cost more than one unit ([`Policy::cost`]), charge only
//! failed requests ([`Policy::charge_if`]) or give server errors back ([`Policy::refund_if`]),
//! choose its quota per request ([`Policy::tier`]), or run in shadow mode
//! ([`Policy::shadow`]) to roll a new limit out safely. Every applicable policy is decided in
//! one atomic step (one Lua script on Redis): nothing is charged unless all admit the request,
//! and the 429 names every violated policy.
//!
//! ```
//! use http::{Method, StatusCode};
//! use tower_ratelimit::{headers::HeaderStyle, Policy, RateLimitLayer, key::{ApiKey, PeerIp}};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! let limits = RateLimitLayer::builder()
//!     .key(PeerIp::new())
//!     .policy(Policy::gcra("20/s").burst(40).name("per-ip"))
//!     .policy(Policy::fixed_window("10000/d").name("per-key").key(ApiKey::bearer()))
//!     .policy(
//!         Policy::sliding_log("5/15min")
//!             .name("failed-logins")
//!             .route(Some(Method::POST), "/login")
//!             .charge_if(|status| status == StatusCode::UNAUTHORIZED),
//!     )
//!     .headers(HeaderStyle::Both) // X-RateLimit-* and the IETF RateLimit fields
//!     .build()?;
//! # let _ = limits;
//! # Ok(()) }
//! ```
//!
//! ## Per-key limits from your own data
//!
//! A limit that depends on who the caller is (a plan in a database, a header an auth layer
//! sets) is a tier: name each plan's quota with [`Policy::tier`], and let
//! [`Policy::select_tier`] pick the plan per request, from a request extension or from a table
//! you keep up to date. The lookup is synchronous, so keep the table in memory (refreshed by
//! your own task) rather than querying per request; [`Policy::tier_for_key`] pins single keys,
//! and [`RateLimitControl::reload`] changes the plans' quotas while keeping every key's usage.
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, RwLock};
//! use tower_ratelimit::{Policy, RateLimitLayer, key::ApiKey};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! // API key -> plan, refreshed from the database by a task of yours.
//! let plans: Arc<RwLock<HashMap<String, String>>> = Arc::default();
//! plans.write().unwrap().insert("key-of-acme".into(), "pro".into());
//!
//! let lookup = plans.clone();
//! let layer = RateLimitLayer::builder()
//!     .key(ApiKey::bearer())
//!     .policy(
//!         Policy::gcra("100/h")
//!             .name("plan")
//!             .tier("pro", "10000/h")
//!             .tier("enterprise", "100000/h")
//!             .select_tier(move |req| {
//!                 let token = req.headers().get("authorization")?.to_str().ok()?;
//!                 let key = token.strip_prefix("Bearer ")?;
//!                 lookup.read().ok()?.get(key).cloned() // None: the free quota
//!             }),
//!     )
//!     .build()?;
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! # When the store fails
//!
//! A decision in Redis has a deadline ([`RedisStoreBuilder::deadline`], 50 ms by default).
//! A failed or late decision goes to the [`FailurePolicy`]: let the request through, answer
//! `503`, or decide in memory with the limits divided among the instances. A
//! [`CircuitBreaker`] stops asking a failing store for a while, and an optional deny cache
//! ([`RateLimitLayerBuilder::deny_cache`]) answers a flood on a limited key without a round
//! trip. [`RateLimitLayer`] also has administrative operations: `peek`, `penalize`,
//! `refund`, `block_for` and `reset`.
//!
//! # Leases: a hot key at memory speed, still within the limit
//!
//! On Redis every decision is a round trip, and one hot key (a global limit, a big tenant's
//! quota) puts all of them on one Redis shard. With [`Policy::lease`] an instance takes
//! several units of a key at once and admits the key's next requests from them, without a
//! store call, until they are spent or the lease ends ([`Policy::lease_ttl`], by default the
//! smaller of one second and a tenth of the window). The next lease is asked for a little
//! before the one in hand is spent; what a lease leaves unspent goes back to the store with
//! the next asking, or, once the key is idle, with another request's store call. Lease sizes start small and grow while a key stays busy, so a key seen
//! once costs what it costs without leases.
//!
//! Leases never admit more than the limit, whatever the number of instances: the store counts
//! a lease's units as spent at the latest moment the lease allows (GCRA moves its TAT to the
//! lease's end, the sliding log logs the units there, a fixed-window lease ends with its
//! window). What they trade is the other way round:
//!
//! * units in another instance's lease are not available here: up to `instances × units`
//!   units may sit unused, until the leases are spent or end (for GCRA and the buckets, one
//!   lease's life of refill as well);
//! * a request admitted from a lease reports the key as of the lease's grant in its headers;
//! * an administrator's reset or block of a key is seen by other instances when their leases
//!   end;
//! * a lease keeps admitting while the store is down, until it ends.
//!
//! A lease saves store calls for requests whose every policy takes leases: a request that also
//! needs a policy without one is decided by the store, all its policies together.
//!
//! ```
//! use tower_ratelimit::{Policy, RateLimitLayer};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! // 10,000 requests a minute across every instance, taken 50 at a time.
//! let global = RateLimitLayer::builder()
//!     .policy(Policy::gcra("10000/min").name("global").lease(50))
//!     .key(tower_ratelimit::key::GlobalKey)
//!     .build()?;
//! # let _ = global;
//! # Ok(()) }
//! ```
//!
//! # Waiting instead of rejecting
//!
//! With [`Policy::wait_up_to`], a request the policy would reject now but admits within the
//! wait is admitted for that later time instead: the store charges it there, in the same
//! atomic step that decides it, and the layer holds the request until its booked time comes
//! before calling the inner service. Instances sharing a store queue on one schedule; a request
//! whose turn is further away than the wait gets its `429` at once; a waiting request that is
//! dropped gives its units back. The handler reads the wait from [`Decision::wait`].
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::{Policy, RateLimitLayer};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! // Bursts above 5 a second are smoothed out over up to a second instead of rejected.
//! let smooth = RateLimitLayer::builder()
//!     .policy(Policy::token_bucket("5/s").wait_up_to(Duration::from_secs(1)))
//!     .build()?;
//! # let _ = smooth;
//! # Ok(()) }
//! ```
//!
//! # Concurrency limits
//!
//! [`Policy::concurrency`] bounds the requests of a key in flight at once, across instances:
//! a request holds its slot until its response body ends or is dropped, and each slot is a
//! lease of [`Policy::max_duration`] in the store, so the slots of an instance that crashed
//! free by themselves. It combines atomically with rate policies.
//!
//! ```
//! use tower_ratelimit::{Policy, RateLimitLayer};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! let exports = RateLimitLayer::builder()
//!     .policy(Policy::concurrency(2).name("exports"))
//!     .policy(Policy::gcra("30/min").name("per-minute"))
//!     .build()?;
//! # let _ = exports;
//! # Ok(()) }
//! ```
//!
//! # Changing limits while running
//!
//! [`RateLimitControl::reload`] swaps a layer's policies for every clone at once, and keeps what
//! each key has used: a policy (or tier) that keeps its name keeps its keys' state, re-counted
//! under its new quota when the key is next used, in either store. 5 used of `10/min` are 5
//! used of `20/min` (15 remain) or of `3/min` (2 past the limit, waited off at the new rate).
//! Instances sharing a Redis store that are reloaded one after the other agree meanwhile: each
//! converts the key to the quota it runs, and back, without losing what was used. A name keeps
//! its algorithm; a policy that is gone is no longer checked, and its keys expire by their TTL.
//!
//! When the window changes too, "the same usage" is, per algorithm:
//!
//! | algorithm | what carries over to a new window (or rate) |
//! |---|---|
//! | GCRA, token bucket, leaky bucket | the units used and not yet refilled (drained) at the present, which then come back at the new rate |
//! | fixed window | the count of the window running at the present, counted in the new window that holds the present; a longer window does not see the old windows before it |
//! | sliding window | each sub-window bucket's count, moved to the new bucket that holds its end; it leaves the window no sooner than it would have. A shorter window forgets what it no longer counts |
//! | sliding log | every entry the store still holds (the old window's at least); the new window counts those inside it |
//!
//! ```
//! use tower_ratelimit::{Policy, RateLimitLayer, key::Key};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::gcra("10/min").name("api"))
//!     .build()?;
//! let client = Key::from("client-7");
//! for _ in 0..5 {
//!     layer.check(&client, 1).await?;
//! }
//! let report = layer.control().reload([Policy::gcra("20/min").name("api")])?;
//! println!("{report}"); // changed "api": gcra 10/min -> gcra 20/min; 0 unchanged
//! assert_eq!(layer.control().peek(&client).await?.tightest().remaining(), 15);
//! # Ok(()) }
//! ```
//!
//! # Seeing who is limited
//!
//! The layer counts every decision through the [`metrics`](https://docs.rs/metrics) facade
//! ([`telemetry::METRICS`] lists them; a Grafana dashboard of them is in the repository), and
//! traces each one as a `debug` span (see [`telemetry`]). Metrics carry no keys; to answer
//! "who is being limited right now?", keep a bounded summary of the keys each policy denied
//! with [`RateLimitLayerBuilder::top_limited`], and read it with
//! [`RateLimitControl::top_limited`] or serve it as JSON with
//! [`RateLimitControl::top_limited_service`] (see [`top`]).
//!
//! # Choosing an algorithm
//!
//! | algorithm | pick it when | memory per key |
//! |---|---|---|
//! | [GCRA](Algorithm::Gcra) | the default: a steady rate with bounded bursts, smallest state | 1 integer |
//! | [token bucket](Algorithm::TokenBucket) | clients may save up a burst and spend it at once | 2 integers |
//! | [leaky bucket](Algorithm::LeakyBucket) | you think in "capacity that drains" (same admissions as the token bucket) | 2 integers |
//! | [fixed window](Algorithm::FixedWindow) | simple quotas reset on the clock ("1000 per hour, resets on the hour"); allows 2× across a boundary | 2 integers |
//! | [sliding window](Algorithm::SlidingWindow) | window semantics without the boundary burst, at bounded memory | 1 counter per sub-window |
//! | [sliding log](Algorithm::SlidingLog) | exactness in every window matters more than memory (small limits, e.g. logins) | 1 entry per request |
//!
//! # Choosing a key
//!
//! [`PeerIp`](key::PeerIp) is right only when clients connect directly. Behind a load balancer
//! or reverse proxy every request comes from the proxy's address, and the whole world shares
//! one bucket; do not key on the leftmost `X-Forwarded-For` entry either, since the client
//! writes it (a new fake address per request is never limited; a victim's address drains the
//! victim's bucket). [`ClientIp`](key::ClientIp) takes the networks of your proxies and reads
//! only what they appended, from the right. Both group IPv6 clients by `/64`.
//!
//! [`ApiKey`](key::ApiKey) keys on the hash of an API key or bearer token;
//! [`key::extension`] on a user id an authentication layer put in the extensions;
//! [`key::matched_route`] on the route pattern and method. [`key::first_of`] (or
//! [`.or`](key::KeyExtractor::or)) takes the first key found, such as the user id, else the
//! client IP; [`key::all`] combines several, such as route and client. [`key::from_fn`] keys on
//! anything else.
//!
//! Keys and costs can come from the request body too ([`key::jsonrpc`] per MCP tool or
//! JSON-RPC method, [`key::json`] at a JSON pointer, [`Policy::cost_json`],
//! [`Policy::cost_graphql`]) on a layer that reads bodies
//! ([`read_bodies`](RateLimitLayerBuilder::read_bodies)): see [`guide::body`] and
//! [`request_body`].
//!
//! # Where to put the layer
//!
//! * `Router::layer`: every route, and also unmatched paths (a 404 still costs a unit).
//! * `Router::route_layer` or `MethodRouter::route_layer`: only matched routes, so unmatched
//!   paths stay `404` and consume nothing. Use it for per-route limits.
//! * `tower::ServiceBuilder::layer` around any `Service<http::Request<B>>`.
//! * `tonic::transport::Server::builder().layer(..)`: a gRPC server. Limited calls are answered
//!   the gRPC way (`RESOURCE_EXHAUSTED`, the retry delay in the status details): see [`grpc`],
//!   and [`key::GrpcMethod`] to key by method.
//!
//! # Testing with a manual clock
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_ratelimit::{ManualClock, MemoryStore, Policy, RateLimitLayer, key::GlobalKey};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::fixed_window("2/s"))
//!     .key(GlobalKey)
//!     .store(MemoryStore::with_clock(clock.clone()))
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
//! }));
//!
//! for expected in [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
//!     let response = svc.clone().oneshot(Request::new(())).await?;
//!     assert_eq!(response.status(), expected);
//! }
//! clock.advance(Duration::from_secs(1));
//! assert_eq!(svc.clone().oneshot(Request::new(())).await?.status(), StatusCode::OK);
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `axum` | yes | `ConnectInfo`/`MockConnectInfo` peer addresses; [`Decision`] as an axum extractor |
//! | `redis` | yes | the Redis store: standalone Redis and Redis Cluster |
//! | `serde` | with `toml` | `config::Limits`: policies from any serde format |
//! | `toml` | yes | `config::Limits::from_toml`: a TOML file whose mistakes are reported at their line |
//!
//! # Supported servers and Rust
//!
//! The Redis store runs on Redis 7.0 and later and on Valkey, deciding with `FCALL` of a
//! library it loads, and on Redis 6.2 (or under an ACL that denies `FUNCTION`, or when
//! [`RedisStoreBuilder::functions`](crate::RedisStoreBuilder::functions) says so) with
//! `EVALSHA` of the same code; on Redis Cluster and behind Redis Sentinel. Versions of Redis
//! before 6.2 are not tested.
//!
//! The minimum supported Rust version is 1.88.
//!
//! # Other crates' types in this API
//!
//! These crates' types appear in public signatures, so a major version of one of them is a
//! major version of this crate:
//!
//! | crate | version | where |
//! |---|---|---|
//! | `http` | 1 | requests and responses of [`RateLimit`]; [`RequestRef`](key::RequestRef)'s `Method`, `Uri` and `HeaderMap`; `HeaderName` of the header keys; `StatusCode` of [`KeyRejection`] and the 429's |
//! | `http-body` | 1 | [`ResponseBody`](body::ResponseBody) is an `http_body::Body` |
//! | `bytes` | 1 | `Bytes` of [`Key`](key::Key) and [`MakeBody::full`](body::MakeBody::full) |
//! | `tower-service`, `tower-layer` | 0.3 | [`RateLimit`] is a `Service`, [`RateLimitLayer`] a `Layer` |
//! | `axum` | 0.8 (feature `axum`) | [`AxumBody`](crate::axum::AxumBody); [`Decision`] as an extractor |
//!
//! The Redis client (`redis`, `deadpool-redis`), `metrics`, `tracing` and `serde` are used
//! inside only: the Redis store takes URLs, metrics and spans are named by strings, and
//! configuration is read from text. Enums and structs that will grow (error kinds, header
//! styles, key specifications, reports) are `#[non_exhaustive]`.

#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's Rust examples are compiled (not run) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// In reading order: the layer users build, the engine that decides each request, policies and
// their algorithms, the stores that keep state, the keys requests are charged to; then the
// tower glue (service, future, body), and the values around them.
mod adaptive;
mod layer;
mod control;
mod lease;
mod limiter;
pub mod policy;
mod quota;
mod refusal;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod config;
mod reload;
mod algorithm;
mod store;
pub mod key;
mod decision;
pub mod headers;
pub mod response;
pub mod grpc;
pub mod telemetry;
pub mod admin;
pub mod top;
pub mod lists;
mod near;
pub mod guide;
mod resilience;
mod service;
pub mod settle;
mod future;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod waiting;
pub mod body;
pub mod request_body;
#[cfg(feature = "graphql")]
#[cfg_attr(docsrs, doc(cfg(feature = "graphql")))]
pub mod graphql;
pub mod streams;
pub mod egress;
mod clock;
pub mod calendar;
mod error;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;

pub use algorithm::Algorithm;
pub use clock::{Clock, ManualClock, SystemClock};
pub use control::RateLimitControl;
pub use decision::{Decision, PolicyOutcome};
pub use error::{
    ConfigError, EntryError, FailurePolicy, KeyRejection, LimitError, StoreError, StoreErrorKind,
};
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use layer::builder::RateLimitLayerBuilder;
pub use policy::Policy;
pub use quota::{MAX_WINDOW, Quota, QuotaError, QuotaUnit};
pub use reload::ReloadReport;
pub use resilience::CircuitBreaker;
pub use service::RateLimit;
pub use store::{MemoryStore, MemoryStoreBuilder, Store};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub use store::{RedisTls, RedisTlsError, TlsSetting};
