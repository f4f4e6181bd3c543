//! Request bodies read before the decision, for policies whose key or cost is in the body.
//!
//! Most keys come from the request head. An MCP server, a JSON-RPC endpoint or an LLM API puts
//! what matters in the body: the tool called, the method, the tokens asked for. A policy whose
//! key or cost reads the body ([`key::json`](crate::key::json),
//! [`key::jsonrpc`](crate::key::jsonrpc), [`Policy::cost_json`](crate::Policy::cost_json))
//! needs a layer built with
//! [`read_bodies`](crate::RateLimitLayerBuilder::read_bodies): the layer then reads the body
//! of each request such a policy applies to, up to a bound ([`BodyLimits`]), parses it once
//! for every policy, decides, and hands the inner service a [`ReadBody`] holding the same
//! bytes (and trailers). Requests that no such policy applies to are not buffered: their body
//! streams through as it came.
//!
//! | the body | the answer |
//! |---|---|
//! | over the bound (by its `Content-Length`, or as it arrives) | `413`, code `body_too_large` |
//! | not all there within the deadline | `408`, code `body_timeout` |
//! | broken off, or failing | `400`, code `body_unreadable` |
//! | not JSON where a policy needs JSON | `400`, code `body_not_json` |
//! | a batch (a JSON array) of no call | `400`, code `batch_empty` |
//! | a batch of more calls than [`BodyLimits::batch_calls`] (32) | `413`, code `batch_too_large` |
//! | a batch a policy makes more keys of than [`BodyLimits::batch_keys`] (8) | `413`, code `batch_too_many_keys` |
//! | one more than [`BodyLimits::reading_per_key`] (16) being read for its key | `429`, code `bodies_in_flight`, not charged |
//!
//! Each is a `problem+json` (or the layer's
//! [`on_key_rejected`](crate::RateLimitLayerBuilder::on_key_rejected) response), counted in
//! `ratelimit_body_rejected_total{code}`, and charged to the keys of the request's head at the
//! policy's floor (`429` instead when one is out of budget; see
//! [`BodyLimits::charge_rejected`]). What the head alone decides (an exemption, the lists, a
//! key out of budget) is answered before the body is read.
//!
//! The inner service sees the body as a [`ReadBody`] (any framework that takes any body
//! accepts it: axum's `Router`, tonic) and the parsed body as a [`RequestBody`] in the
//! request's extensions. A layer built without `read_bodies` never changes the body type, and
//! refuses at `build` (and at a reload) a policy that reads the body.

mod readers;
mod replay;
mod service;

pub(crate) use readers::{Reader, Readers};

#[cfg(feature = "json")]
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use replay::ReadBody;
pub use service::{ReadBodies, ReadFuture};

/// How much of a body the layer reads, and for how long (see the [module](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    limit: usize,
    deadline: Duration,
    batch_calls: usize,
    batch_keys: usize,
    reading_per_key: usize,
    charge_rejected: bool,
}

impl BodyLimits {
    /// The default bound on a body read: 64 KiB.
    pub const DEFAULT_LIMIT: usize = 64 * 1024;

    /// The default time a body has to arrive: 10 seconds.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

    /// The default most calls of a JSON-RPC batch: 32.
    pub const DEFAULT_BATCH_CALLS: usize = 32;

    /// The default most distinct keys one policy makes of a batch's calls: 8.
    pub const DEFAULT_BATCH_KEYS: usize = 8;

    /// The default most bodies read at once for one key: 16.
    pub const DEFAULT_READING_PER_KEY: usize = 16;

    /// 64 KiB within 10 seconds, 16 bodies read at once per key; batches of at most 32 calls
    /// and 8 keys a policy.
    pub fn new() -> Self {
        BodyLimits {
            limit: Self::DEFAULT_LIMIT,
            deadline: Self::DEFAULT_DEADLINE,
            batch_calls: Self::DEFAULT_BATCH_CALLS,
            batch_keys: Self::DEFAULT_BATCH_KEYS,
            reading_per_key: Self::DEFAULT_READING_PER_KEY,
            charge_rejected: true,
        }
    }

    /// At most `bytes` of a body (more: `413`). Checked when the layer is built: at least 1.
    #[must_use]
    pub fn limit(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
    }

    /// The whole body within `deadline` of the request's call (later: `408`). Checked when
    /// the layer is built: more than zero.
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// At most `calls` calls in a JSON-RPC batch (a JSON array body); more: `413`, code
    /// `batch_too_large`. Each call is keyed and costed on its own, so the calls of a batch
    /// are bounded on their own, not by the body's size alone: MCP clients send a handful.
    /// Checked when the layer is built: at least 1.
    #[must_use]
    pub fn batch_calls(mut self, calls: usize) -> Self {
        self.batch_calls = calls;
        self
    }

    /// At most `keys` distinct keys (and tiers) one policy makes of a batch's calls; more:
    /// `413`, code `batch_too_many_keys`. A policy checks each distinct key of a batch once,
    /// all of them in one atomic decision: this bounds what one request holds in memory (the
    /// rows it locks) and the store calls it makes on a cluster (one per hash slot).
    /// Checked when the layer is built: at least 1.
    #[must_use]
    pub fn batch_keys(mut self, keys: usize) -> Self {
        self.batch_keys = keys;
        self
    }

    /// At most `bodies` bodies read at once for one key (the layer's
    /// [`key`](crate::RateLimitLayerBuilder::key), a client's address by default; the peer's
    /// address when that key reads the body or the head has none); more:
    /// `429`, code `bodies_in_flight`, at once, the body unread and nothing charged. What one
    /// client can make the server hold while its bodies come is `bodies` times the
    /// [limit](Self::limit) (1 MiB by default), for the [deadline](Self::deadline) at most.
    /// Counted on each instance. Behind a proxy, give the layer a key that finds the client
    /// ([`ClientIp`](crate::key::ClientIp)): every client counts as the proxy's address
    /// otherwise. Checked when the layer is built: at least 1.
    #[must_use]
    pub fn reading_per_key(mut self, bodies: usize) -> Self {
        self.reading_per_key = bodies;
        self
    }

    /// The most bodies read at once for one key.
    pub fn get_reading_per_key(&self) -> usize {
        self.reading_per_key
    }

    /// Whether a body the layer refuses (`400`, `408`, `413`) is charged to the keys of the
    /// request's head (yes, by default). Each policy that applies is charged its cost from the
    /// head (a cost read from the body, its floor), a key read from the body keyed
    /// [`UNREAD`](crate::key::UNREAD) (`all((ip, jsonrpc()))`: the client's address and
    /// `(unread)`): a key out of budget gets `429` instead of the refusal, so a client that
    /// floods bad bodies is limited as one that floods good ones. A key on a list at runtime
    /// is answered as the list says (`403`, or the refusal charged nothing). `false` answers
    /// every refused body with its refusal, charged nothing.
    #[must_use]
    pub fn charge_rejected(mut self, charge: bool) -> Self {
        self.charge_rejected = charge;
        self
    }

    /// Whether refused bodies are charged.
    pub fn get_charge_rejected(&self) -> bool {
        self.charge_rejected
    }

    /// The most calls of a batch.
    pub fn get_batch_calls(&self) -> usize {
        self.batch_calls
    }

    /// The most distinct keys a policy makes of a batch.
    pub fn get_batch_keys(&self) -> usize {
        self.batch_keys
    }

    /// The bound, in bytes.
    pub fn get_limit(&self) -> usize {
        self.limit
    }

    /// The deadline.
    pub fn get_deadline(&self) -> Duration {
        self.deadline
    }

    /// Why these limits cannot be used, if they cannot.
    pub(crate) fn check(&self) -> Result<(), crate::ConfigError> {
        if self.limit == 0 {
            return Err(crate::ConfigError::new(
                "read_bodies: a body limit of 0 bytes reads no body; give at least 1",
            ));
        }
        if self.deadline.is_zero() {
            return Err(crate::ConfigError::new(
                "read_bodies: a deadline of 0 gives no body the time to arrive",
            ));
        }
        if self.reading_per_key == 0 {
            return Err(crate::ConfigError::new(
                "read_bodies: reading_per_key(0) reads no body; give at least 1",
            ));
        }
        if self.batch_calls == 0 || self.batch_keys == 0 {
            return Err(crate::ConfigError::new(
                "read_bodies: a batch of at most 0 calls or 0 keys admits no batch; give at \
                 least 1 (a batch of 1 call is a single request)",
            ));
        }
        Ok(())
    }
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self::new()
    }
}

/// A layer's type when it leaves request bodies as they come (the default): its policies
/// read the request head only.
#[derive(Clone, Copy, Debug)]
pub enum Unread {}

/// A layer's type when it reads the bodies its policies need
/// ([`read_bodies`](crate::RateLimitLayerBuilder::read_bodies)): its service is a
/// [`ReadBodies`].
#[derive(Clone, Copy, Debug)]
pub enum Read {}

/// A request body as the layer read it, in the request's extensions for the key extractors,
/// the cost and the inner service: its bytes, and what they parse to.
#[derive(Clone, Debug)]
pub struct RequestBody {
    bytes: Bytes,
    #[cfg(feature = "json")]
    json: Option<Arc<serde_json::Value>>,
    /// The calculated cost of its GraphQL query, once a policy asked for it.
    #[cfg(feature = "graphql")]
    graphql: std::sync::OnceLock<Result<crate::graphql::QueryCost, crate::graphql::GraphqlError>>,
}

impl RequestBody {
    /// The body's bytes, as they came.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The body parsed as JSON, when a policy of the request needed it.
    #[cfg(feature = "json")]
    pub fn json(&self) -> Option<&serde_json::Value> {
        self.json.as_deref()
    }

    /// The calculated cost of the GraphQL query of its JSON body, computed once.
    #[cfg(feature = "graphql")]
    pub(crate) fn graphql_cost(
        &self,
    ) -> Result<crate::graphql::QueryCost, crate::graphql::GraphqlError> {
        let measure = || match &self.json {
            Some(json) => crate::graphql::request_cost(json),
            None => crate::graphql::request_cost(&serde_json::Value::Null),
        };
        self.graphql.get_or_init(measure).clone()
    }

    /// `bytes` parsed as JSON (every policy that reads the body reads JSON), or why they do
    /// not parse or are a batch `limits` refuse.
    pub(crate) fn parse(bytes: Bytes, limits: &BodyLimits) -> Result<Self, crate::KeyRejection> {
        #[cfg(not(feature = "json"))]
        let _ = limits;
        #[cfg(feature = "json")]
        let json = {
            let value = serde_json::from_slice(&bytes).map_err(|e| {
                crate::KeyRejection::bad_request(
                    "body_not_json",
                    format!("the request body is not JSON: {e}"),
                )
            })?;
            if let serde_json::Value::Array(calls) = &value {
                batch_bounded(calls.len(), limits)?;
            }
            Some(Arc::new(value))
        };
        Ok(RequestBody {
            bytes,
            #[cfg(feature = "json")]
            json,
            #[cfg(feature = "graphql")]
            graphql: std::sync::OnceLock::new(),
        })
    }
}

/// Why a batch of `calls` calls is refused, if it is: none (an empty batch asks for nothing and
/// would be charged nothing), or more than `limits` allow.
#[cfg(feature = "json")]
fn batch_bounded(calls: usize, limits: &BodyLimits) -> Result<(), crate::KeyRejection> {
    if calls == 0 {
        return Err(crate::KeyRejection::bad_request(
            "batch_empty",
            "the request body is an empty batch: a batch has at least one call",
        ));
    }
    if calls > limits.batch_calls {
        return Err(crate::KeyRejection::new(
            http::StatusCode::PAYLOAD_TOO_LARGE,
            "batch_too_large",
            format!(
                "the batch has {calls} calls, over the {} a rate-limited batch may have",
                limits.batch_calls
            ),
        ));
    }
    Ok(())
}
