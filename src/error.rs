//! Errors: configuration mistakes, store failures, requests without a key, and what to do when
//! the store fails.

use std::fmt;

use http::StatusCode;

use crate::quota::QuotaError;

/// A configuration mistake, reported when the layer is built, never on a request.
///
/// The message names what is wrong and, where it can, how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: message.into(),
        }
    }

    /// Prefixes the message with where the mistake is, e.g. a policy's name.
    pub(crate) fn context(self, what: &str) -> Self {
        ConfigError::new(format!("{what}: {}", self.message))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Why an administrator's entry names no key that a key extractor makes
/// ([`KeyExtractor::entry_keys`](crate::key::KeyExtractor::entry_keys)): `"alice"` where keys
/// are IP addresses, an empty header value, a key of several parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryError {
    message: String,
}

impl EntryError {
    /// An error saying `message` (for the extractors of your own).
    pub fn new(message: impl Into<String>) -> Self {
        EntryError {
            message: message.into(),
        }
    }
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EntryError {}

impl From<EntryError> for ConfigError {
    fn from(e: EntryError) -> Self {
        ConfigError::new(e.message)
    }
}

/// Why a key's own limit was not set or cleared
/// ([`RateLimitControl::set_limit`](crate::RateLimitControl::set_limit)).
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitError {
    /// The layer has no policy, or policy tier, of that name.
    UnknownPolicy(String),
    /// The quota does not fit the policy: a zero limit or window, a burst a window algorithm
    /// has no use for, another period than a calendar policy's.
    Quota(ConfigError),
    /// The store failed; nothing may have changed.
    Store(StoreError),
    /// The layer keeps no list entries in its store: it was built without
    /// [`lists`](crate::RateLimitLayerBuilder::lists), or with
    /// [`kept_in_store(false)`](crate::lists::Lists::kept_in_store).
    NoLists,
    /// The end given (`until`) is not after the layer's present, or lies beyond 2255
    /// (2^53 microseconds since 1970, what the stores count exactly). A change with an end
    /// already past is refused rather than made a removal.
    Until(String),
    /// The key given is none the key extractor makes: it would never match a request
    /// ([`KeyExtractor::entry_keys`](crate::key::KeyExtractor::entry_keys)).
    Entry(EntryError),
    /// The network cannot be listed: as many networks as the layer matches are listed at
    /// runtime already ([`deny_network`](crate::RateLimitControl::deny_network)).
    Network(String),
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::UnknownPolicy(name) => {
                write!(f, "the layer has no policy or tier named {name:?}")
            }
            LimitError::Quota(e) => write!(f, "quota: {e}"),
            LimitError::Store(e) => write!(f, "store: {e}"),
            LimitError::NoLists => f.write_str(
                "the layer keeps no list entries in its store (build it with .lists(Lists::new()))",
            ),
            LimitError::Until(why) => write!(f, "until: {why}"),
            LimitError::Entry(e) => write!(f, "key: {e}"),
            LimitError::Network(why) => write!(f, "network: {why}"),
        }
    }
}

impl std::error::Error for LimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LimitError::UnknownPolicy(_)
            | LimitError::NoLists
            | LimitError::Until(_)
            | LimitError::Network(_) => None,
            LimitError::Quota(e) => Some(e),
            LimitError::Store(e) => Some(e),
            LimitError::Entry(e) => Some(e),
        }
    }
}

impl From<QuotaError> for ConfigError {
    fn from(e: QuotaError) -> Self {
        ConfigError::new(e.to_string())
    }
}

impl From<std::convert::Infallible> for ConfigError {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

/// A store could not decide: Redis unreachable, a timeout, a script error.
///
/// Opaque on purpose, so that the backing client's error types are not part of this crate's
/// API. What the layer does with it is chosen by [`FailurePolicy`].
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// What kind of failure a [`StoreError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store answered with an error, or could not be reached.
    Failed,
    /// The decision missed its deadline.
    Timeout,
    /// The circuit breaker is open: the store was not asked.
    CircuitOpen,
}

impl StoreErrorKind {
    /// A short name for logs and metrics: `failed`, `timeout` or `circuit_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Failed => "failed",
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::CircuitOpen => "circuit_open",
        }
    }
}

impl StoreError {
    /// Wraps any error as a store error.
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        StoreError {
            kind: StoreErrorKind::Failed,
            source: source.into(),
        }
    }

    pub(crate) fn with_kind(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            source: message.into().into(),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate-limit store failed: {}", self.source)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// What the layer does with a request when the store fails to decide (an error, a missed
/// deadline, or an open circuit breaker).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through (and log a warning): the API stays up while its limiter is down,
    /// and nothing is limited meanwhile. The default.
    #[default]
    Open,
    /// Answer `503 Service Unavailable` with `Retry-After: 1`: nothing gets through unchecked,
    /// and nothing gets through at all while the store is down.
    Closed,
    /// Decide in this process instead, with every policy's limit divided by `divisor` (the
    /// number of instances sharing the store, so that together they stay near the global
    /// limit). Each instance counts on its own while the store is down, and charges made after
    /// the response ([`Policy::charge_if`](crate::Policy::charge_if)) are not counted then.
    Local {
        /// What each policy's limit and burst are divided by (at least 1; results below 1
        /// become 1).
        divisor: u32,
    },
}

impl FailurePolicy {
    /// The divisor of the local fallback, if the policy is [`FailurePolicy::Local`].
    pub(crate) fn divisor(self) -> Option<u32> {
        match self {
            FailurePolicy::Local { divisor } => Some(divisor),
            _ => None,
        }
    }
}

/// A request the layer could not find a rate-limit key for.
///
/// Extractors return it instead of falling back to a shared bucket. By default the layer answers
/// with [`status`](KeyRejection::status) and a small JSON body carrying
/// [`code`](KeyRejection::code) and [`message`](KeyRejection::message); see
/// [`RateLimitLayerBuilder::on_key_rejected`](crate::RateLimitLayerBuilder::on_key_rejected) to
/// answer differently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRejection {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl KeyRejection {
    /// A rejection with a status, a machine-readable code and a human-readable message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        KeyRejection {
            status,
            code,
            message: message.into(),
        }
    }

    /// The client sent a request without what the key is made of: `400 Bad Request`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// The server is set up wrong (e.g. no peer address available): `500 Internal Server Error`.
    pub fn misconfigured(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, code, message)
    }

    /// The status the default response uses.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// A short machine-readable code, e.g. `missing_header`.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// What is missing or wrong, for people.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for KeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for KeyRejection {}
