//! The Redis store (feature `redis`).

mod call;
mod cluster;
#[cfg(feature = "tls")]
mod coalesce;
mod conn;
#[cfg(feature = "tls")]
mod dial;
mod endpoint;
mod key;
mod link;
mod networks;
mod probe;
mod redial;
mod script;
mod sentinel;
mod tcp;
#[cfg(feature = "tls")]
mod tls;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use self::conn::Connect;
use self::endpoint::{Credentials, Endpoints, Refreshed, TlsSettings, redact};
use self::script::SCRIPT;
use super::Registry;
use crate::clock::Clock;
use crate::error::{ConfigError, StoreError};

#[cfg(fuzzing)]
pub(crate) use call::read_decision as redis_decision;
pub(crate) use key::redis_key;
#[cfg(feature = "tls")]
pub use tls::{RedisTls, RedisTlsError, TlsSetting};

/// The default key prefix.
pub(crate) const DEFAULT_PREFIX: &str = "rl:";

/// How long a reload of the decision library may take.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The default deadline of one decision.
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);

/// Rate-limit state in Redis, shared by every instance of an API.
///
/// Each decision is one call of one Lua function that holds the Lua twin of every algorithm:
/// it reads the state of every policy's key, evaluates them all, and charges them only if all
/// admit the request, in one atomic step and one round trip. Every key it writes gets a TTL in
/// the same step (no longer than the algorithm needs), and a key found without one is given one.
/// The function is loaded as a library when the store is built (`FUNCTION LOAD`, on every
/// primary of a cluster) and called with `FCALL`; Redis keeps it across restarts and copies it
/// to replicas. On a Redis that refuses functions (before 7.0, or an ACL without `FUNCTION`)
/// the same code is a script called with `EVALSHA` ([`RedisStoreBuilder::functions`]). When
/// Redis has lost it (`FUNCTION FLUSH`, `SCRIPT FLUSH`, a restart without persistence, a new
/// cluster node) the same call is sent once as `EVAL` with the source, which decides in the
/// same step; a lost function is then loaded again.
///
/// Time comes from Redis `TIME`, so application servers with skewed clocks agree; a
/// [`Clock`] can be injected for tests.
///
/// ```no_run
/// use tower_ratelimit::{Policy, RateLimitLayer, RedisStore, key::PeerIp};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379").prefix("myapi:").build().await?;
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::gcra("10/s"))
///     .key(PeerIp::new())
///     .store(store)
///     .build()?;
/// # Ok(()) }
/// ```
///
/// # Connections
///
/// By default the store shares one multiplexed connection, which it makes again when it is
/// lost: concurrent decisions are pipelined on one socket. A connection that goes silent
/// without closing (a NAT or load balancer that forgot the flow) is found after a decision
/// misses its deadline, by a `PING` that must answer within a second (the response timeout
/// if shorter), and replaced: decisions reach Redis again within the deadline, that second and
/// a connect (1.5 s in the tests with a 300 ms deadline). A cluster's connection is checked
/// the same way (a `PING` to every primary) and made again whole; a pool's connection whose
/// decision missed its deadline is taken out of the pool. Every connection has TCP keepalive
/// (10 s idle, 3 probes 2 s apart) and, on Linux, a 10 s `TCP_USER_TIMEOUT`. A decision that
/// took a concurrency slot, a lease's units or booked time and comes back after its
/// deadline gives them back when it comes (awaited up to a minute).
/// [`RedisStoreBuilder::pool`] uses a pool (deadpool) instead, one connection per
/// in-flight decision. A URL of the form `redis+cluster://host:port,host:port` (or
/// [`RedisStore::cluster_builder`]) connects to a Redis Cluster.
///
/// # Sentinel
///
/// `redis+sentinel://host:port,host:port/<master name>` asks the sentinels for the primary
/// (and checks with `ROLE` that it is one), and keeps one multiplexed connection to it. When a
/// decision finds the primary gone (the connection closed or refused, `READONLY` from a
/// demoted node, no reply) the store asks the sentinels again on a task of its own, every
/// 100 ms until they name a primary that answers; meanwhile decisions fail at once and the
/// layer's [`FailurePolicy`](crate::FailurePolicy) answers them. The decision function was
/// copied to the replicas with the data, so the promoted one decides at once.
///
/// Replication is asynchronous: what the old primary admitted in its last moments before it
/// died, and had not yet sent to the replica, is lost with it, so the promoted replica may
/// admit up to that many requests again within their window (at most the requests of one
/// replication round trip, typically under a millisecond's worth). Everything replicated before
/// the failover is kept, and limits stay exact afterwards.
///
/// # Keys
///
/// A key is `<prefix><policy name>:{<caller key>}`: the caller's key, escaped (or hashed when
/// longer than 64 bytes), is the cluster hash tag, so every policy of one caller key lives in
/// one hash slot, and nothing a client sends can choose the hash slot or reach another key. A block
/// ([`RateLimitControl::block_for`](crate::RateLimitControl::block_for)) is kept in that key
/// itself (after a `|` in a string state; as a member `block:<end>` scored `+inf` in the
/// sliding log's sorted set), whose TTL then lasts at least to the block's end: a decision
/// finds a block with the read it makes anyway, and a key never blocked pays nothing for it.
///
/// # Memory per key
///
/// `MEMORY USAGE` on Redis 7.0 (jemalloc, 64-bit) of one key such as
/// `rl:gcra:{b:203.0.113.9}` (the test `memory_usage_per_key` measures it):
///
/// | algorithm | bytes |
/// |---|---|
/// | GCRA | 72 |
/// | fixed window, token bucket, leaky bucket | 120 |
/// | sliding window (10 buckets) | 104 after one request, 120 after a hundred (only live buckets are kept) |
/// | sliding log | 136, plus about 41 per admitted unit in the window (4,184 at 100) |
///
/// The sliding log's limit is capped at 10,000 units per window (about 410 KB per key at the
/// cap); use the sliding window counter for larger limits.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The connection, and whether decisions are `FCALL`s of the loaded library (else
    /// `EVALSHA`s); made by `build()`, or in the background.
    linking: Arc<link::Linking>,
    deadline: Duration,
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
    /// A decision found the function missing: load the library again.
    reload: AtomicBool,
    /// A reload is under way.
    reloading: AtomicBool,
    target: String,
    registry: Registry,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.inner.target)
            .field(
                "connection",
                &self
                    .inner
                    .linking
                    .link()
                    .map_or("connecting", |l| l.conn.kind()),
            )
            .field("prefix", &self.inner.prefix)
            .field("clock", &self.inner.clock)
            .finish()
    }
}

/// Configures a [`RedisStore`].
#[must_use]
pub struct RedisStoreBuilder {
    nodes: Vec<String>,
    cluster: bool,
    /// A `redis+sentinel://` URL, read.
    sentinel: Option<Result<sentinel::Target, ConfigError>>,
    pool: Option<usize>,
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
    connect_timeout: Duration,
    response_timeout: Duration,
    deadline: Duration,
    functions: bool,
    credentials: Option<Credentials>,
    refreshed: Option<Refreshed>,
    tls: TlsSettings,
    lazily: bool,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field(
                "nodes",
                &self.nodes.iter().map(|n| redact(n)).collect::<Vec<_>>(),
            )
            .field("cluster", &self.cluster)
            .field(
                "sentinel",
                &self.sentinel.as_ref().map(|t| {
                    t.as_ref()
                        .map(|t| format!("{} via {}", t.master, t.sentinels.join(",")))
                }),
            )
            .field("pool", &self.pool)
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("deadline", &self.deadline)
            .field("credentials", &self.credentials)
            .field("credentials_provider", &self.refreshed)
            .field("tls", &self.tls)
            .field("lazily", &self.lazily)
            .finish()
    }
}

impl RedisStore {
    /// Configures a store for `url`: `redis://[user:password@]host[:port][/db]`, `rediss://…`
    /// (TLS, feature `tls`: see [`RedisStoreBuilder::tls`]), `redis+unix:///path`, or
    /// `redis+cluster://[user:password@]host:port,host:port,…` (`rediss+cluster://`) for a
    /// Redis Cluster, or
    /// `redis+sentinel://[user:password@]host:port,host:port,…/<master name>[/<db>]`
    /// (`rediss+sentinel://`: TLS to the sentinels and the primary) for the primary that Redis
    /// Sentinel names (the sentinels' addresses, port 26379 by default; the credentials and
    /// database are the primary's). Credentials can also be given beside the URL
    /// ([`RedisStoreBuilder::credentials`]). A malformed URL is reported by
    /// [`build`](RedisStoreBuilder::build).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        let url = url.trim();
        for (scheme, secure) in [("redis+sentinel://", false), ("rediss+sentinel://", true)] {
            let Some(rest) = url.strip_prefix(scheme) else {
                continue;
            };
            let target = sentinel::Target::parse(rest, secure);
            let node_scheme = if secure { "rediss" } else { "redis" };
            let nodes = match &target {
                Ok(t) => t
                    .sentinels
                    .iter()
                    .map(|h| format!("{node_scheme}://{h}"))
                    .collect(),
                Err(_) => vec![],
            };
            let mut builder = Self::new_builder(nodes, false);
            builder.sentinel = Some(target);
            return builder;
        }
        for (scheme, node_scheme) in [
            ("redis+cluster://", "redis://"),
            ("rediss+cluster://", "rediss://"),
        ] {
            if let Some(rest) = url.strip_prefix(scheme) {
                let (auth, hosts) = match rest.rsplit_once('@') {
                    Some((auth, hosts)) => (format!("{auth}@"), hosts),
                    None => (String::new(), rest),
                };
                let nodes = hosts
                    .split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(|h| format!("{node_scheme}{auth}{h}"))
                    .collect();
                return Self::new_builder(nodes, true);
            }
        }
        Self::new_builder(vec![url.to_owned()], false)
    }

    /// Configures a store for a Redis Cluster reached through any of `nodes` (`redis://` URLs).
    pub fn cluster_builder<I, S>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new_builder(nodes.into_iter().map(Into::into).collect(), true)
    }

    fn new_builder(nodes: Vec<String>, cluster: bool) -> RedisStoreBuilder {
        RedisStoreBuilder {
            nodes,
            cluster,
            sentinel: None,
            pool: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            clock: None,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            deadline: DEFAULT_DEADLINE,
            functions: true,
            credentials: None,
            refreshed: None,
            tls: TlsSettings::default(),
            lazily: false,
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The SHA-1 of the decision script, as `SCRIPT EXISTS` and `EVALSHA` know it.
    pub fn script_sha(&self) -> &str {
        SCRIPT.sha()
    }

    /// The name of the decision function (and of its library), as `FCALL` and
    /// `FUNCTION LIST` know it: `tower_ratelimit_` and 16 hex digits of the script's SHA-1, so
    /// each version of the crate has its own.
    pub fn function_name() -> &'static str {
        SCRIPT.function()
    }

    /// Whether decisions are `FCALL`s of the decision function (Redis 7 and later, when
    /// allowed) rather than `EVALSHA`s of the script. See [`RedisStoreBuilder::functions`].
    /// `false` while a store built with [`connect_lazily`](RedisStoreBuilder::connect_lazily)
    /// is not connected yet.
    pub fn uses_functions(&self) -> bool {
        self.inner.linking.link().is_some_and(|l| l.functions)
    }

    /// Whether the store is connected to Redis and has its decision loaded: always, for a
    /// store [`build`](RedisStoreBuilder::build) returned, unless it was built with
    /// [`connect_lazily`](RedisStoreBuilder::connect_lazily) and Redis has not answered yet
    /// (a readiness probe can report it).
    pub fn is_connected(&self) -> bool {
        self.inner.linking.link().is_some()
    }

    /// Why a store built with [`connect_lazily`](RedisStoreBuilder::connect_lazily) is not
    /// connected yet: the last attempt's error; `None` once it is.
    pub fn connection_error(&self) -> Option<String> {
        self.inner.linking.error()
    }

    /// The decision script's source: the Lua twin of every algorithm.
    pub fn script_source() -> &'static str {
        SCRIPT.source()
    }

    /// The Redis key holding the state of `key` under the policy named `policy`.
    pub fn key_for(&self, policy: &str, key: &crate::key::Key) -> Vec<u8> {
        redis_key(&self.inner.prefix, policy, key)
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key the store writes (default `rl:`): at most 64 printable ASCII
    /// characters without braces or spaces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Uses a pool (deadpool) of up to `max_size` connections instead of one shared
    /// multiplexed connection (not behind Sentinel, where the store keeps one connection to
    /// the primary and replaces it after a failover: `build` says so).
    pub fn pool(mut self, max_size: usize) -> Self {
        self.pool = Some(max_size.max(1));
        self
    }

    /// Decides on `clock`'s time instead of Redis `TIME` (for deterministic tests; every
    /// instance sharing the Redis must then share the clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// How long to wait for a connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for a reply on the connection (default 1 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The deadline of one decision (default 50 ms): a decision that misses it fails with
    /// [`StoreErrorKind::Timeout`](crate::StoreErrorKind::Timeout) and the layer applies its
    /// [`FailurePolicy`](crate::FailurePolicy). The script may still run after the deadline;
    /// it is never sent again, so nothing is counted twice.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Whether to decide with a Redis function (default `true`): the store loads the decision
    /// as a library (`FUNCTION LOAD`, on every primary of a cluster) and each decision is an
    /// `FCALL`. Redis keeps functions across restarts (in the RDB and AOF files) and copies them
    /// to replicas, so a failover finds them in place, and a call skips the setup a script
    /// repeats on every `EVALSHA`. When Redis refuses (before 7.0, or an ACL without
    /// `FUNCTION`), the store says so in the log and uses `EVALSHA`, as it does when this is
    /// `false`. A function flushed away (`FUNCTION FLUSH`) costs one decision an `EVAL` of the
    /// script's source, and the library is loaded again.
    pub fn functions(mut self, enabled: bool) -> Self {
        self.functions = enabled;
        self
    }

    /// Authenticates as `username` with `password` (an ACL user, Redis 6 and later), in place
    /// of credentials in the URL. Given here, the password stays out of the URL, which
    /// configuration tools and logs tend to print; the store never prints it (its `Debug`,
    /// its errors and its log lines show the username only). With Sentinel these are the
    /// primary's credentials.
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            username: Some(username.into()),
            password: password.into(),
        });
        self
    }

    /// Authenticates with `password` alone (the `default` user, or `requirepass`), in place
    /// of a password in the URL; see [`credentials`](Self::credentials).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            username: None,
            password: password.into(),
        });
        self
    }

    /// Credentials that expire (AWS IAM authentication tokens for ElastiCache live 15
    /// minutes, Azure Entra ID tokens an hour): `provider` is asked for a username and password
    /// before each new connection, and every `refresh` on each connection, which then
    /// authenticates again (`AUTH`) with them, without dropping a decision. Choose `refresh`
    /// well inside the credentials' lifetime (5 minutes for a 15-minute token). An error of
    /// the provider fails a new connection (the failure policy answers meanwhile) and leaves a
    /// live one on its present credentials. In place of [`credentials`](Self::credentials).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_ratelimit::RedisStore;
    ///
    /// # async fn token() -> Result<String, std::io::Error> { Ok(String::new()) }
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::builder("rediss://my-cache.example.com:6379")
    ///     .credentials_provider(Duration::from_secs(300), || async {
    ///         // e.g. a freshly signed IAM authentication token
    ///         Ok(("ratelimiter".to_owned(), token().await?))
    ///     })
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn credentials_provider<F, Fut>(mut self, refresh: Duration, provider: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(String, String), Box<dyn std::error::Error + Send + Sync>>>
            + Send
            + 'static,
    {
        self.refreshed = Some(Refreshed::new(refresh, provider));
        self
    }

    /// TLS settings: a CA to trust, a client certificate, or (for development) no
    /// verification. Whether connections are TLS is the URL's: `rediss://`,
    /// `rediss+cluster://` or `rediss+sentinel://` (with these settings, a plain-text URL is
    /// an error of [`build`](Self::build)). Without this, a TLS URL trusts the system's roots.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: RedisTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Starts without Redis (default `false`): [`build`](Self::build) checks the
    /// configuration (URLs, TLS files, prefix) and returns at once, and the store connects,
    /// loads its decision and checks its permissions on a task of its own, trying again with
    /// backoff (100 ms, doubling up to 5 s) until Redis answers, logging each failure. Until
    /// then every decision fails at once and the layer's
    /// [`FailurePolicy`](crate::FailurePolicy) answers it (let through, `503`, or decided in
    /// memory), counted as a store failure; then decisions are exact, with no restart.
    /// [`RedisStore::is_connected`] tells which. Needs a Tokio runtime at `build()`.
    pub fn connect_lazily(mut self, lazily: bool) -> Self {
        self.lazily = lazily;
        self
    }

    /// The settings checked before anything connects; the Sentinel URL read, if one was
    /// given.
    fn validate(&mut self) -> Result<Option<sentinel::Target>, StoreError> {
        key::validate_prefix(&self.prefix).map_err(StoreError::new)?;
        let sentinel = self.sentinel.take().transpose().map_err(StoreError::new)?;
        let fail = |message| Err(StoreError::new(ConfigError::new(message)));
        if let (Some(_), Some(_)) = (&sentinel, self.pool) {
            return fail(
                "a pool is not available with Sentinel: the store keeps one multiplexed connection to the primary, which it finds again after a failover",
            );
        }
        if self.nodes.is_empty() {
            return fail("no Redis node given");
        }
        if self.refreshed.as_ref().is_some_and(|r| r.every.is_zero()) {
            return fail("a credentials provider's refresh period must be longer than zero");
        }
        Ok(sentinel)
    }

    /// Redis's address, for messages (no credentials): the nodes, or the primary the
    /// sentinels name.
    fn target(&self, sentinel: Option<&sentinel::Target>) -> String {
        let nodes = self.nodes.iter().map(|n| redact(n));
        let nodes = nodes.collect::<Vec<_>>().join(",");
        match sentinel {
            Some(t) => format!("the primary {:?} of the sentinels {nodes}", t.master),
            None => nodes,
        }
    }

    fn pool_config(&self, max_size: usize) -> deadpool_redis::PoolConfig {
        deadpool_redis::PoolConfig {
            max_size,
            timeouts: deadpool_redis::Timeouts {
                wait: Some(self.connect_timeout),
                create: Some(self.connect_timeout),
                recycle: Some(self.response_timeout),
            },
            ..Default::default()
        }
    }

    /// Connects, loads the script, checks that the Redis user may run every command the
    /// decision runs (once, on a key under the prefix, left deleted), and returns the store.
    /// Fails with a one-line message naming the cause when the URL or a TLS setting is
    /// invalid, Redis cannot be reached within the connect timeout, the TLS handshake or the
    /// credentials are refused, or the user lacks a permission (the Redis guide gives the ACL
    /// line).
    pub async fn build(mut self) -> Result<RedisStore, StoreError> {
        let sentinel = self.validate()?;
        let (target, mut sentinel) = (self.target(sentinel.as_ref()), sentinel);
        let credentials = match (&mut sentinel, self.credentials.take()) {
            (Some(t), Some(c)) => {
                (t.username, t.password) = (c.username, Some(c.password));
                None
            }
            (_, c) => c,
        };
        let endpoints = Endpoints::read(
            &self.nodes,
            credentials.as_ref(),
            self.refreshed.take(),
            &self.tls,
        )
        .map_err(StoreError::new)?;
        let plan = link::LinkPlan {
            connect: Connect {
                endpoints,
                cluster: self.cluster,
                pool: self.pool.map(|size| self.pool_config(size)),
                sentinel,
                connect_timeout: self.connect_timeout,
                response_timeout: self.response_timeout,
            },
            target: target.clone(),
            functions: self.functions,
            prefix: self.prefix.clone(),
            redis_time: self.clock.is_none(),
        };
        let linking = match self.lazily {
            true => link::Linking::in_background(plan),
            false => link::Linking::made(plan.link().await?),
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                linking,
                deadline: self.deadline,
                prefix: self.prefix,
                clock: self.clock,
                reload: AtomicBool::new(false),
                reloading: AtomicBool::new(false),
                target,
                registry: Registry::default(),
            }),
        })
    }
}
