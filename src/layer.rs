//! [`RateLimitLayer`] and its builder.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_layer::Layer;

use crate::decision::Decision;
use crate::error::{ConfigError, FailurePolicy, KeyRejection, StoreError};
use crate::key::{Key, KeyExtractor, PeerIp};
use crate::policy::Policy;
use crate::response::Responses;
use crate::service::RateLimit;
use crate::store::{Check, MemoryStore, PolicyHandle, Store};

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
}

pub(crate) struct PolicyRuntime {
    pub(crate) handle: Arc<PolicyHandle>,
    pub(crate) key: Arc<dyn KeyExtractor>,
}

impl<St: fmt::Debug> fmt::Debug for Shared<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policies: Vec<_> = self
            .policies
            .iter()
            .map(|p| (&*p.handle.name, &p.key))
            .collect();
        f.debug_struct("RateLimitLayer")
            .field("store", &self.store)
            .field("policies", &policies)
            .field("responses", &self.responses)
            .field("failure", &self.failure)
            .finish()
    }
}

impl RateLimitLayer<MemoryStore> {
    /// Starts configuring a layer; it uses a fresh [`MemoryStore`] unless given another store.
    pub fn builder() -> RateLimitLayerBuilder<MemoryStore> {
        RateLimitLayerBuilder {
            store: MemoryStore::new(),
            policies: Vec::new(),
            key: Arc::new(PeerIp::new()),
            responses: Responses::default(),
            failure: FailurePolicy::default(),
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
        self.shared.policies.iter().map(|p| &*p.handle.name)
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// Decides for `key` at `cost` against every policy of the layer, without a request: the
    /// same atomic decision the middleware makes, for rate-limiting work that is not an HTTP
    /// request (jobs, messages) or for tests. A cost of 0 only looks: nothing is charged.
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
        let checks = self
            .shared
            .policies
            .iter()
            .map(|p| Check {
                policy: p.handle.clone(),
                key: key.clone(),
                cost: u64::from(cost),
            })
            .collect();
        self.shared.store.check(checks).await
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
    policies: Vec<Policy>,
    key: Arc<dyn KeyExtractor>,
    responses: Responses,
    failure: FailurePolicy,
}

impl<St: fmt::Debug> fmt::Debug for RateLimitLayerBuilder<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("store", &self.store)
            .field("policies", &self.policies)
            .field("key", &self.key)
            .field("responses", &self.responses)
            .field("failure", &self.failure)
            .finish()
    }
}

impl<St: Store> RateLimitLayerBuilder<St> {
    /// Adds a policy. A request goes on only when every policy admits it, and then every policy
    /// is charged; when one denies it, none is.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// The key requests are charged to, for every policy without its own
    /// ([`Policy::key`]). Defaults to [`PeerIp`].
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// Decides in `store` instead of a fresh [`MemoryStore`]. Layers given clones of one store
    /// share its state.
    pub fn store<T: Store>(self, store: T) -> RateLimitLayerBuilder<T> {
        RateLimitLayerBuilder {
            store,
            policies: self.policies,
            key: self.key,
            responses: self.responses,
            failure: self.failure,
        }
    }

    /// The status of a limited response (default `429 Too Many Requests`).
    pub fn limited_status(mut self, status: StatusCode) -> Self {
        self.responses.status = status;
        self
    }

    /// Writes the whole response to a limited request. The rate-limit headers and
    /// `Retry-After` are added to it unless it sets them itself.
    pub fn on_limited<F>(mut self, f: F) -> Self
    where
        F: Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.responses.on_limited = Some(Arc::new(f));
        self
    }

    /// Writes the response to a request whose key could not be extracted (default: the
    /// rejection's status with a problem+json body).
    pub fn on_key_rejected<F>(mut self, f: F) -> Self
    where
        F: Fn(&KeyRejection) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.responses.on_rejected = Some(Arc::new(f));
        self
    }

    /// What to do when the store cannot decide (default [`FailurePolicy::Open`]).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// Checks the whole configuration and builds the layer.
    ///
    /// Fails when no policy was given, when a policy is invalid (see [`Policy`]), or when two
    /// different policies share a name in one store.
    pub fn build(self) -> Result<RateLimitLayer<St>, ConfigError> {
        if self.policies.is_empty() {
            return Err(ConfigError::new(
                "no policy: add one with .policy(Policy::gcra(\"10/s\")) or similar",
            ));
        }
        // Check everything before registering anything in the (maybe shared) store.
        let mut compiled: Vec<(Arc<str>, _, _)> = Vec::with_capacity(self.policies.len());
        for policy in &self.policies {
            let (name, algorithm) = policy.compile()?;
            if compiled.iter().any(|(n, _, _)| *n == name) {
                return Err(ConfigError::new(format!(
                    "two policies are named {name:?}; give each its own name"
                )));
            }
            compiled.push((name, algorithm, policy.key.clone()));
        }
        let mut policies = Vec::with_capacity(compiled.len());
        for (name, algorithm, key) in compiled {
            let id = self.store.register(name.clone(), algorithm.clone())?;
            policies.push(PolicyRuntime {
                handle: Arc::new(PolicyHandle {
                    name,
                    id,
                    algorithm,
                }),
                key: key.unwrap_or_else(|| self.key.clone()),
            });
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                store: self.store,
                policies: policies.into_boxed_slice(),
                responses: self.responses,
                failure: self.failure,
            }),
        })
    }
}
