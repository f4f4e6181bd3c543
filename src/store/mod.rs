//! Stores: where the per-key state lives and where each decision is made atomically.
//!
//! [`MemoryStore`] keeps state in this process; [`RedisStore`] (feature `redis`) in Redis.
//! Every store runs the same algorithms with the same arithmetic, so a configuration behaves
//! identically whichever store backs it.

mod memory;
mod check;
mod entries;
mod networks;
mod op;
#[cfg(feature = "redis")]
mod redis;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(all(fuzzing, feature = "redis"))]
pub(crate) use self::redis::redis_decision;
#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "tls")]
pub use self::redis::{RedisTls, RedisTlsError, TlsSetting};
pub(crate) use check::{Check, Checks, Enforced};
pub(crate) use entries::{Entries, Listing};
pub(crate) use memory::TOGETHER;
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub(crate) use networks::{Listed, Networks, Stored, full as full_networks};
pub(crate) use op::Op;

use crate::algorithm::Compiled;
use crate::error::ConfigError;
pub(crate) use crate::policy::Registered;

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

    use crate::algorithm::{Compiled, Verdict};
    use crate::decision::Decision;
    use crate::error::{ConfigError, StoreError};
    use crate::key::Key;
    use crate::policy::Tier;
    use crate::store::{Check, Listed, Registered, Registry, Stored};

    /// The future of [`Sealed::keep_entry`].
    pub(crate) type KeptEntry =
        std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'static>>;

    /// The future of [`Sealed::store_network`].
    pub(crate) type StoredNetworks =
        std::pin::Pin<Box<dyn Future<Output = Result<Stored, StoreError>> + Send + 'static>>;

    /// The wait of [`Sealed::read_networks`]: a read of the networks kept in the store.
    pub(crate) type ReadingNetworks = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

    /// What a store does; out of reach of users (see [`Store`](super::Store)).
    #[allow(private_interfaces)]
    pub trait Sealed {
        /// The future of one decision.
        type Future: Future<Output = Result<Decision, StoreError>> + Send + Unpin + 'static;

        /// Decides a request against one or more policies atomically: nothing is charged
        /// unless every policy that decides admits it.
        fn check(&self, checks: crate::store::Checks) -> Self::Future;

        /// The policies the store knows.
        fn registry(&self) -> &Registry;

        /// Registers policy tiers under their names, all or none (see [`Registry::register`]).
        fn register(
            &self,
            tiers: &[(Arc<str>, Compiled)],
            replacing: &dyn Fn(&str) -> bool,
        ) -> Result<Vec<Registered>, ConfigError> {
            self.registry().register(tiers, replacing)
        }

        /// The decision, when the store makes it synchronously and cannot fail (the memory
        /// store): the layer then settles the request without a future in between.
        fn check_now(&self, checks: &[Check]) -> Option<Decision> {
            let _ = checks;
            None
        }

        /// The same store, suited to a layer whose requests are all decided on packed states
        /// under the shared lock (`shared`: one GCRA, or two to four GCRAs and fixed windows
        /// of the layer's key, enforced up front) or not, where the store may still choose how
        /// it works (the memory store's locks, see `MemoryStoreBuilder::per_thread_reads`).
        fn suited(self, shared: bool) -> Self
        where
            Self: Sized,
        {
            let _ = shared;
            self
        }

        /// Whether [`check_alone`](Self::check_alone) decides (the memory store): the
        /// engine then plans a request of one policy that nothing else has a say in for it
        /// alone.
        const DECIDES_ALONE: bool = false;

        /// Decides one enforced policy on `key` at once, on borrowed values, if the store can
        /// (the memory store): the verdict, from which the caller builds an outcome only when
        /// something reads it, and the tier of the key's own limit when it has one (which the
        /// outcome reports). `hash` is the key's [`key_hash`](Self::key_hash) when the caller
        /// kept it (a connection's key, decided for each of its messages).
        fn check_alone(
            &self,
            tier: &Arc<Tier>,
            key: &Key,
            hash: Option<u64>,
            cost: u64,
        ) -> Option<(Verdict, Option<Arc<Tier>>)> {
            let _ = (tier, key, hash, cost);
            None
        }

        /// Whether one enforced policy admits `key` (whose [`key_hash`](Self::key_hash) is
        /// `hash`) at once and charges it, told without a verdict, for a caller that reads
        /// nothing of an admission (a connection's message). `false`: denied, with nothing
        /// written, or not decided this way; [`check_alone`](Self::check_alone) decides then.
        fn admits_alone(&self, tier: &Arc<Tier>, key: &Key, hash: u64, cost: u64) -> bool {
            let _ = (tier, key, hash, cost);
            false
        }

        /// The hash [`check_alone`](Self::check_alone) makes of `key`, for a caller that
        /// decides one key many times (`None`: the store hashes nothing).
        fn key_hash(&self, key: &Key) -> Option<u64> {
            let _ = key;
            None
        }

        /// Decides several enforced policies at once, on borrowed values, if the store can
        /// (the memory store, for at most four): the decision, as [`check`](Self::check)
        /// would make it. `packed`: every state packs and the key is one (the lane says so,
        /// once for the policy set).
        fn check_together(
            &self,
            checks: &[crate::store::Enforced<'_>],
            packed: bool,
        ) -> Option<Decision> {
            let _ = (checks, packed);
            None
        }

        /// Sets the end of `key`'s runtime entry on the deny list (`deny`) or the allow list
        /// to `us` after `now_us` (0: takes it off), where every decision of the store reads
        /// it; by default in the registry's records (memory).
        fn keep_entry(&self, key: Key, deny: bool, us: u64, now_us: u64) -> KeptEntry {
            let ends = if us == 0 {
                0
            } else {
                now_us.saturating_add(us)
            };
            self.registry().entries().keep(key, deny, ends, now_us);
            Box::pin(std::future::ready(Ok(())))
        }

        /// Keeps the change of a network entry listed at runtime (`entry`, taken off when
        /// `remove`; entries ended by `now_us` dropped) where every instance reads it (Redis:
        /// the entries kept after it); by default the registry's networks are the store's own
        /// (memory), changed by the caller.
        fn store_network(&self, entry: Listed, remove: bool, now_us: u64) -> StoredNetworks {
            let _ = (entry, remove, now_us);
            Box::pin(std::future::ready(Ok(Stored::Here)))
        }

        /// Reads the networks kept in the store into the registry's again, for a request at
        /// `now_us` on the layer's clock, when they are old (see `Networks::age`), on a task
        /// of its own: the wait for it when the request must not be decided before it ends
        /// (nothing in memory).
        fn read_networks(&self, now_us: u64) -> Option<ReadingNetworks> {
            let _ = now_us;
            None
        }

        /// Sends `checks` (units given back) without waiting for the answer: from a `Drop`,
        /// which cannot wait. By default decided at once; a store that decides later starts
        /// the decision on its own.
        fn check_detached(&self, checks: crate::store::Checks) {
            let _ = self.check_now(&checks);
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

/// The policies a store knows, by name: one name, one id, one present definition, and every
/// definition it has had, by number.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    book: Mutex<Book>,
    /// Whether a name has ever taken a new definition, or a key a limit of its own: until
    /// then every state is written under its tier's definition, and no decision needs to look.
    redefined: AtomicBool,
    /// Whether an entry was ever added to the allow or deny list (see `mark_listed`).
    listed: AtomicBool,
    /// The networks listed at runtime.
    networks: Networks,
    /// The keys listed at runtime, when the store keeps them in this process.
    entries: Entries,
}

#[derive(Debug, Default)]
struct Book {
    /// Each name's id and present definition.
    names: HashMap<Arc<str>, Registered>,
    /// Every definition registered, by number.
    defs: Vec<Compiled>,
}

impl Registry {
    /// Whether no policy was ever registered.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.book).defs.is_empty()
    }

    /// Registers `tiers` under their names, all or none. A name already registered keeps its
    /// id; with another definition it fails, unless `replacing` accepts the name (a reload of
    /// the layer that owns it): then the new definition is the name's present one, and states
    /// written under the old one are converted when they are next used. A definition may not
    /// change the algorithm: a state of one algorithm means nothing to another.
    pub(crate) fn register(
        &self,
        tiers: &[(Arc<str>, Compiled)],
        replacing: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Registered>, ConfigError> {
        let mut book = lock(&self.book);
        for (name, algorithm) in tiers {
            let Some(at) = book.names.get(name) else {
                continue;
            };
            let existing = &book.defs[at.def as usize];
            if existing == algorithm {
                continue;
            }
            if !replacing(name) {
                return Err(ConfigError::new(format!(
                    "policy name {name:?} is already used in this store by a different policy; give each policy its own name"
                )));
            }
            if existing.algorithm() != algorithm.algorithm() {
                return Err(ConfigError::new(format!(
                    "policy {name:?} would change its algorithm from {} to {}; the state of one algorithm means nothing to another, so give the policy a new name (its old keys expire on their own)",
                    existing.algorithm(),
                    algorithm.algorithm()
                )));
            }
        }
        let book = &mut *book;
        Ok(tiers
            .iter()
            .map(|(name, algorithm)| {
                let at = book.names.get(name).copied();
                if let Some(at) = at
                    && book.defs[at.def as usize] == *algorithm
                {
                    return at;
                }
                let def = book.defs.len() as u32;
                book.defs.push(algorithm.clone());
                if at.is_some() {
                    self.redefined.store(true, Ordering::Relaxed);
                }
                let id = at.map_or(book.names.len() as u32, |at| at.id);
                let registered = Registered { id, def };
                book.names.insert(name.clone(), registered);
                registered
            })
            .collect())
    }

    /// Whether a name has ever taken a new definition, or a key a limit of its own (a state
    /// may then need converting).
    pub(crate) fn redefined(&self) -> bool {
        self.redefined.load(Ordering::Relaxed)
    }

    /// A key was put under a limit of its own: decisions look at each state's definition
    /// from now on. Set under the key's shard lock, which every later decision of the key
    /// takes before it reads this.
    pub(crate) fn own_limit_set(&self) {
        self.redefined.store(true, Ordering::Relaxed);
    }

    /// An entry was added to a store's allow or deny list (`lists.rs`): decisions in memory
    /// look at the lists' entries from now on.
    pub(crate) fn mark_listed(&self) {
        self.listed.store(true, Ordering::Relaxed);
    }

    /// Whether an entry was ever added to the store's allow or deny list.
    pub(crate) fn listed(&self) -> bool {
        self.listed.load(Ordering::Relaxed)
    }

    /// The keys listed at runtime, when the store keeps them in this process (memory).
    pub(crate) fn entries(&self) -> &Entries {
        &self.entries
    }

    /// The networks listed at runtime, as this instance knows them.
    pub(crate) fn networks(&self) -> &Networks {
        &self.networks
    }

    /// The definition numbered `def`.
    pub(crate) fn definition(&self, def: u32) -> Compiled {
        lock(&self.book).defs[def as usize].clone()
    }
}

/// Locks `m`, poisoned or not: the crate's tables (the memory store's shards, the registry,
/// the deny cache, the leases) are updated by single assignments that a panic cannot leave
/// half done, so a lock poisoned by a panic elsewhere is still usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
