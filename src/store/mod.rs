//! Stores: where the per-key state lives and where each decision is made atomically.
//!
//! [`MemoryStore`] keeps state in this process; [`RedisStore`] (feature `redis`) in Redis.
//! Every store runs the same algorithms with the same arithmetic, so a configuration behaves
//! identically whichever store backs it.

mod check;
mod memory;
#[cfg(feature = "redis")]
mod redis;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder};
pub(crate) use check::{Check, Checks, Mode};
pub use memory::{MemoryStore, MemoryStoreBuilder};

use crate::algorithm::Compiled;
use crate::error::ConfigError;

/// Where rate-limit state lives: [`MemoryStore`], or [`RedisStore`] (feature `redis`).
///
/// The trait is sealed: it has no methods users can call or implement. Every store must
/// reproduce the algorithms' private arithmetic exactly (the differential tests hold the two
/// stores to it), which is not a contract a user-written store could be tested against. A
/// layer's type names its store, `RateLimitLayer<St: Store>`, and that is what the trait is
/// for.
pub trait Store: Clone + Send + Sync + std::fmt::Debug + 'static + private::Sealed {}

impl<T> Store for T where T: Clone + Send + Sync + std::fmt::Debug + 'static + private::Sealed {}

pub(crate) mod private {
    use std::future::Future;
    use std::sync::Arc;

    use crate::algorithm::Compiled;
    use crate::decision::Decision;
    use crate::error::{ConfigError, StoreError};
    use crate::store::Check;

    /// What a store does; out of reach of users (see [`Store`](super::Store)).
    #[allow(private_interfaces)]
    pub trait Sealed {
        /// The future of one decision.
        type Future: Future<Output = Result<Decision, StoreError>> + Send + Unpin + 'static;

        /// Decides a request against one or more policies atomically: nothing is charged
        /// unless every policy that decides admits it.
        fn check(&self, checks: crate::store::Checks) -> Self::Future;

        /// Registers a policy tier under its name, failing if the name is taken by a
        /// different definition; returns its id in this store.
        fn register(&self, name: Arc<str>, algorithm: Compiled) -> Result<u32, ConfigError>;

        /// The decision, when the store makes it synchronously and cannot fail (the memory
        /// store): the layer then settles the request without a future in between.
        fn decide_now(&self, checks: &[Check]) -> Option<Decision> {
            let _ = checks;
            None
        }

        /// Sends `checks` (units given back) without waiting for the answer: from a `Drop`,
        /// which cannot wait. By default decided at once; a store that decides later starts
        /// the decision on its own.
        fn check_detached(&self, checks: crate::store::Checks) {
            let _ = self.decide_now(&checks);
        }

        /// Lets a decision whose request went away finish without it, then hands it to
        /// `then`. By default polled once (a store that decides at once is done by then).
        fn finish_detached(
            &self,
            mut decision: Self::Future,
            then: Box<dyn FnOnce(Decision) + Send>,
        ) {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            if let std::task::Poll::Ready(Ok(decision)) =
                std::pin::Pin::new(&mut decision).poll(&mut cx)
            {
                then(decision);
            }
        }
    }
}

/// The policies a store knows, by name: one name, one definition, one id.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    policies: Mutex<HashMap<Arc<str>, (u32, Compiled)>>,
}

impl Registry {
    /// The id of `name`, registering it; fails if the name is taken by a different policy.
    pub(crate) fn register(&self, name: Arc<str>, algorithm: Compiled) -> Result<u32, ConfigError> {
        let mut policies = lock(&self.policies);
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

/// Locks `m`, poisoned or not: the crate's tables (the memory store's shards, the registry,
/// the deny cache, the leases) are updated by single assignments that a panic cannot leave
/// half done, so a lock poisoned by a panic elsewhere is still usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
