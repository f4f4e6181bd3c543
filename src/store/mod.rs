//! Stores: where the per-key state lives and where each decision is made atomically.
//!
//! [`MemoryStore`] keeps state in this process. Every store runs the same algorithms with the
//! same arithmetic, so a configuration behaves identically whichever store backs it.

mod memory;
#[cfg(feature = "redis")]
mod redis;

use std::future::Future;
use std::sync::Arc;

#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder};
pub use memory::{MemoryStore, MemoryStoreBuilder};

use crate::algorithm::Compiled;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::few::Few;
use crate::key::Key;

/// A policy as a store knows it: name, id in the store, algorithm; and what every response
/// for it reuses, built once: its limit as a header value and its metrics keys.
#[derive(Debug)]
pub(crate) struct PolicyHandle {
    pub(crate) name: Arc<str>,
    pub(crate) id: u32,
    pub(crate) algorithm: Compiled,
    /// The limit clients are told, as a header value.
    pub(crate) limit_header: http::HeaderValue,
    /// `ratelimit_decisions_total{policy, outcome}` for each [`Outcome`], so that counting a
    /// decision allocates no label list.
    decisions_metric: [metrics::Key; 3],
}

/// How one policy judged one request, as counted by `ratelimit_decisions_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed = 0,
    Limited = 1,
    ShadowLimited = 2,
}

impl Outcome {
    const ALL: [Outcome; 3] = [Outcome::Allowed, Outcome::Limited, Outcome::ShadowLimited];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
        }
    }
}

impl PolicyHandle {
    pub(crate) fn new(name: Arc<str>, id: u32, algorithm: Compiled) -> Self {
        let limit_header = crate::headers::number(algorithm.reported_limit());
        let decisions_metric = Outcome::ALL.map(|outcome| {
            metrics::Key::from_parts(
                "ratelimit_decisions_total",
                vec![
                    metrics::Label::new("policy", metrics::SharedString::from(name.clone())),
                    metrics::Label::from_static_parts("outcome", outcome.as_str()),
                ],
            )
        });
        PolicyHandle {
            name,
            id,
            algorithm,
            limit_header,
            decisions_metric,
        }
    }

    /// Counts one decision of this policy in `ratelimit_decisions_total`.
    pub(crate) fn count(&self, outcome: Outcome) {
        static METADATA: metrics::Metadata<'static> =
            metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        let key = &self.decisions_metric[outcome as usize];
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
    }
}

/// The policies a store knows, by name: one name, one definition, one id.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    policies: std::sync::Mutex<std::collections::HashMap<Arc<str>, (u32, Compiled)>>,
}

impl Registry {
    /// The id of `name`, registering it; fails if the name is taken by a different policy.
    pub(crate) fn register(&self, name: Arc<str>, algorithm: Compiled) -> Result<u32, ConfigError> {
        let mut policies = self.policies.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((id, existing)) = policies.get(&name) {
            return if *existing == algorithm {
                Ok(*id)
            } else {
                Err(ConfigError::new(format!(
                    "policy name {name:?} is already used in this store by a different policy; give each policy its own name"
                )))
            };
        }
        let id = policies.len() as u32;
        policies.insert(name, (id, algorithm));
        Ok(id)
    }
}

/// How a check takes part in a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Decides the request; charged only if every enforced and dry check admits it.
    Enforce = 0,
    /// Reported, never decides; charged if it admits and the request goes on.
    Shadow = 1,
    /// Decides the request but is never charged (the charge comes after the response).
    Dry = 2,
    /// Gives `cost` units back; then reports like a look at cost 0.
    Refund = 3,
    /// Forgets the key; then reports like a look at cost 0.
    Reset = 4,
    /// Charges `cost` units whatever the state; then reports like a look at cost 0.
    Penalize = 5,
    /// Denies the key for the next `cost` microseconds; then reports like a look at cost 0.
    Block = 6,
}

impl Mode {
    /// Whether a denial by this check denies the request.
    pub(crate) fn decides(self) -> bool {
        matches!(self, Mode::Enforce | Mode::Dry)
    }

    /// Whether this check is charged when the request is admitted, given its own verdict.
    pub(crate) fn charged(self, allowed: bool) -> bool {
        match self {
            Mode::Enforce => true,
            Mode::Shadow => allowed,
            Mode::Dry | Mode::Refund | Mode::Reset | Mode::Penalize | Mode::Block => false,
        }
    }

    /// An administrative change made before the look at cost 0.
    pub(crate) fn is_admin(self) -> bool {
        matches!(
            self,
            Mode::Refund | Mode::Reset | Mode::Penalize | Mode::Block
        )
    }
}

/// The checks of one decision, one per policy that applies (one is kept without allocating).
#[derive(Debug, Default)]
pub struct Checks(Few<Check>);

impl Checks {
    pub(crate) fn push(&mut self, check: Check) {
        self.0.push(check);
    }
}

impl std::ops::Deref for Checks {
    type Target = [Check];
    fn deref(&self) -> &[Check] {
        &self.0
    }
}

impl FromIterator<Check> for Checks {
    fn from_iter<I: IntoIterator<Item = Check>>(iter: I) -> Self {
        Checks(iter.into_iter().collect())
    }
}

/// One policy to decide for one key at some cost.
#[derive(Debug)]
pub struct Check {
    pub(crate) policy: Arc<PolicyHandle>,
    pub(crate) key: Key,
    pub(crate) cost: u64,
    pub(crate) mode: Mode,
}

impl Check {
    pub(crate) fn new(policy: Arc<PolicyHandle>, key: Key, cost: u64, mode: Mode) -> Self {
        Check {
            policy,
            key,
            cost,
            mode,
        }
    }
}

/// Where rate-limit state lives: [`MemoryStore`], or Redis.
///
/// The trait is sealed: the algorithms' arithmetic is private, and every store must reproduce
/// it exactly.
pub trait Store: Clone + Send + Sync + std::fmt::Debug + 'static + private::Sealed {
    /// The future of one decision.
    type Future: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Decides a request against one or more policies atomically: nothing is charged unless
    /// every policy admits it.
    fn check(&self, checks: Checks) -> Self::Future;
}

pub(crate) mod private {
    use super::*;

    #[allow(private_interfaces)]
    pub trait Sealed {
        /// Registers a policy under its name, failing if the name is taken by a different
        /// policy; returns its id in this store.
        fn register(&self, name: Arc<str>, algorithm: Compiled) -> Result<u32, ConfigError>;

        /// The decision, when the store makes it synchronously and cannot fail (the memory
        /// store): the layer then settles the request without a future in between.
        fn decide_now(&self, checks: &[Check]) -> Option<Decision> {
            let _ = checks;
            None
        }
    }
}
