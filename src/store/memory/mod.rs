//! The in-memory store.

mod lock;
mod locked;
#[cfg(all(test, loom))]
mod loom_model;
mod rule;
mod shard;

use std::collections::hash_map::RandomState;
use std::fmt;
use std::sync::Arc;

use super::{Check, Checks, Enforced, Op, Registry, private};
use crate::algorithm::Verdict;
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Outcomes, PolicyOutcome};
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Tier;
use lock::ShardLock;
pub(crate) use shard::TOGETHER;
use shard::{CheckRef, Shard};
use smallvec::SmallVec;

/// The default [`MemoryStoreBuilder::max_keys`].
pub(crate) const DEFAULT_MAX_KEYS: usize = 100_000;

/// Rate-limit state in this process: sharded, bounded, exact under concurrency.
///
/// Keys are spread over shards, each a hash map behind its own read-write lock, so tasks
/// checking different keys rarely wait for each other; every policy of a key is in the key's
/// shard. A GCRA key's state is one atomic word, a fixed window's (of windows of one length) a
/// word and a count beside it, both in the key's row: one policy on a key already seen is
/// decided under the shard's shared lock, a GCRA by compare-and-swap, a window with its word
/// held for the few instructions the decision takes, so threads deciding one hot key never
/// wait for a lock another holds; several such policies of one key (up to four) are decided
/// there too, each word held as briefly. Every other decision takes the shard's exclusive
/// lock. The shared lock is one word each reader writes;
/// for hot keys decided on many cores, [`per_thread_reads`](MemoryStoreBuilder::per_thread_reads)
/// gives each thread group its own. Either way each change of a key's state is
/// atomic, so exactly `limit` of any number of concurrent requests are admitted. The hash is
/// SipHash with a random seed, so clients cannot choose keys that collide.
///
/// The store holds at most [`max_keys`](MemoryStoreBuilder::max_keys) keys. An entry is dropped
/// once its state is back to that of a fresh key, by a sweep of its shard at most every ten
/// seconds of the shard's exclusive activity (new keys, among others: a shard that takes no new
/// key does not grow). When a shard is full and holds no expired
/// entry, it evicts the entry that expires soonest among the first eight of its table (in the
/// table's own order, which the random hash seed makes arbitrary but which is not a uniform
/// sample), which forgets that key's usage: size `max_keys` above the number of keys active
/// within one window.
///
/// Clones share the same state.
///
/// ```
/// use tower_ratelimit::{ManualClock, MemoryStore};
///
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder().max_keys(10_000).clock(clock.clone()).build();
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<MemoryInner>,
}

struct MemoryInner {
    shards: Box<[ShardLock<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    registry: Registry,
    /// Whether the builder was told [`per_thread_reads`](MemoryStoreBuilder::per_thread_reads)
    /// (else the layer chooses, see [`MemoryStore::suited`]).
    chosen: bool,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field(
                "max_keys",
                &(self.inner.per_shard * self.inner.shards.len()),
            )
            .field("clock", &self.inner.clock)
            .finish()
    }
}

/// Configures a [`MemoryStore`].
#[derive(Debug)]
#[must_use]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    shards: Option<usize>,
    per_thread_reads: Option<bool>,
    clock: Arc<dyn Clock>,
}

impl MemoryStoreBuilder {
    /// The most keys the store holds (default 100,000); at least 1.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// The number of shards (default: four per available core), rounded up to a power of two
    /// (a key's shard is then picked by a mask, not a division); never more than `max_keys`
    /// (then the largest power of two below it).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards.max(1));
        self
    }

    /// Whether each shard has eight reader locks, each on its own cache line, instead of one
    /// lock. A thread takes the reader lock of its group, so threads deciding on the same
    /// shard at once (one hot key: a global or per-tenant limit) write no common cache line
    /// but the key's state, and for a GCRA not even that when they are denied; with one lock,
    /// each decision passes the lock's line from core to core, and the cost of a hot key grows
    /// with the cores deciding on it.
    ///
    /// The price is on the exclusive path, which takes all eight: a key seen for the first
    /// time, and every decision that is not on packed states (the algorithms other than GCRA
    /// and the fixed window, several policies of different keys decided at once, leases,
    /// waits, concurrency limits); there `true` costs more than it saves. `BENCHMARKS.md` shows
    /// both sides.
    ///
    /// Unset, the layer the store is given to chooses when it is built, if the store is
    /// its alone and was never used (no clone of it kept elsewhere, no state, no policy
    /// registered): eight reader locks when every request of the layer is decided on packed
    /// states, one lock otherwise. That is when the layer has no deny cache or fallback, and
    /// its only policy is a GCRA, or it has two to four policies, each a GCRA or a fixed
    /// window of one length (no calendar) on the layer's key; each enforced up front (no
    /// lease, wait, concurrency limit, shadow or charge after the response). A store shared
    /// by several layers keeps one lock unless told. A reload does not change the choice.
    ///
    /// ```
    /// use tower_ratelimit::{MemoryStore, Policy, RateLimitLayer};
    ///
    /// // A global limit that every core decides on: eight reader locks.
    /// let store = MemoryStore::builder().per_thread_reads(true).build();
    /// let layer = RateLimitLayer::builder()
    ///     .store(store)
    ///     .policy(Policy::gcra("1000/s"))
    ///     .key(tower_ratelimit::key::GlobalKey)
    ///     .build()?;
    /// assert!(layer.store().per_thread_reads());
    ///
    /// // A burst limit and an hourly quota, both packed: the layer chooses reader locks.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::gcra("10/s"))
    ///     .policy(Policy::fixed_window("1000/h"))
    ///     .build()?;
    /// assert!(layer.store().per_thread_reads());
    ///
    /// // A sliding log takes the exclusive path: the layer chooses one lock.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::sliding_log("10/s"))
    ///     .build()?;
    /// assert!(!layer.store().per_thread_reads());
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn per_thread_reads(mut self, yes: bool) -> Self {
        self.per_thread_reads = Some(yes);
        self
    }

    /// The clock decisions are made on (default [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let wanted = self
            .shards
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()) * 4);
        // Powers of two: the largest at most `max_keys` caps the smallest at least `wanted`.
        let most = 1 << self.max_keys.ilog2();
        let shards = wanted.next_power_of_two().min(most);
        let per_shard = self.max_keys / shards;
        let hasher = RandomState::new();
        let per_thread = self.per_thread_reads.unwrap_or(false);
        MemoryStore {
            inner: Arc::new(MemoryInner {
                shards: (0..shards)
                    .map(|_| ShardLock::new(Shard::new(hasher.clone()), per_thread))
                    .collect(),
                per_shard,
                hasher,
                clock: self.clock,
                registry: Registry::default(),
                chosen: self.per_thread_reads.is_some(),
            }),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with the default size and the system clock.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A store with the default size and `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::builder().clock(clock).build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
            per_thread_reads: None,
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// Whether each shard has a reader lock per thread group
    /// ([`MemoryStoreBuilder::per_thread_reads`]).
    pub fn per_thread_reads(&self) -> bool {
        matches!(self.inner.shards[0], ShardLock::PerThread(_))
    }

    /// The number of entries held, including expired ones not yet swept.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most entries the store will hold.
    pub fn capacity(&self) -> usize {
        self.inner.per_shard * self.inner.shards.len()
    }

    /// Drops every expired entry now, and returns how many were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.inner.clock.now_micros();
        self.inner.shards.iter().map(|s| s.write().sweep(now)).sum()
    }

    /// The shard of the key whose hash ([`Key::hash_in`]) is `key_hash`: its high bits pick
    /// it, the table uses the low ones of the (policy, key) hash. Every policy of a key is
    /// in one shard, so a decision of several policies on one key takes one lock.
    #[inline]
    fn shard_of(&self, key_hash: u64) -> usize {
        ((key_hash >> 32) as usize) & (self.inner.shards.len() - 1)
    }

    /// One enforced policy on `key` (whose hash is `key_hash`) at `cost`: the common case, decided under the shard's
    /// shared lock when the key's state is packed, else under its exclusive lock. The checked
    /// tier and the key are borrowed: nothing is cloned, no reference count changes. The
    /// verdict, and the tier of the key's own limit when it has one (its outcome reports it).
    ///
    /// The time is read once the shard is locked (on the shared path, after the state is
    /// loaded): decisions on one key then see times in the order they are made, so each
    /// reports exactly what it left (read before, a decision could be made after a later one
    /// and see time go back).
    #[inline(always)]
    pub(crate) fn alone(
        &self,
        tier: &Arc<Tier>,
        key: &Key,
        key_hash: u64,
        cost: u64,
    ) -> (Verdict, Option<Arc<Tier>>) {
        let check = CheckRef::enforce(tier, key, cost);
        let hash = Key::with_id(key_hash, tier.id());
        let clock = || self.inner.clock.now_micros();
        let shard = &self.inner.shards[self.shard_of(key_hash)];
        // The shared guard is dropped at the end of this statement, before the other lock.
        let shared = shard.read().alone_shared(&check, hash, clock);
        match shared {
            Some(verdict) => (verdict, None),
            None => self.enforced_locked(&check),
        }
    }

    /// Whether `key` is admitted and charged in `tier` at `cost` on the shared path (see
    /// [`Shard::admits_shared`](shard::Shard::admits_shared)): told without a verdict.
    #[inline(always)]
    pub(crate) fn admits(&self, tier: &Arc<Tier>, key: &Key, key_hash: u64, cost: u64) -> bool {
        let check = CheckRef::enforce(tier, key, cost);
        let hash = Key::with_id(key_hash, tier.id());
        let clock = || self.inner.clock.now_micros();
        let shard = &self.inner.shards[self.shard_of(key_hash)];
        shard.read().admits_shared(&check, hash, clock)
    }

    /// [`alone`](Self::alone) under the exclusive lock.
    #[inline(never)]
    fn enforced_locked(&self, check: &CheckRef<'_>) -> (Verdict, Option<Arc<Tier>>) {
        let (mut runs, _) = self.decide_locked(std::slice::from_ref(check));
        let run = &mut runs[0];
        (run.verdict(), run.take_own())
    }

    /// Decides `checks` under the exclusive locks, whatever they are: the engine sends here
    /// only what its lane does not decide on borrowed values (`Sealed::check` wraps this in
    /// a ready future).
    pub(crate) fn check_locked(&self, checks: &[Check]) -> Decision {
        // Pushed one by one here and below: `collect` into a SmallVec goes through its generic
        // `extend`, about 70 instructions a collection more.
        let mut refs: SmallVec<[CheckRef<'_>; 2]> = SmallVec::new();
        for c in checks {
            refs.push(CheckRef::from(c));
        }
        let (runs, _) = self.decide_locked(&refs);
        let mut outcomes = SmallVec::with_capacity(checks.len());
        for (c, mut run) in checks.iter().zip(runs) {
            let own = run.take_own();
            let tier = own.as_ref().unwrap_or(c.tier());
            let outcome = PolicyOutcome::new(tier, c.op() == Op::Shadow, run.verdict());
            outcomes.push(outcome.with_grant(run.grant()));
        }
        Decision::new(outcomes)
    }

    /// Several enforced policies, at most [`TOGETHER`] (the usual request of several). The
    /// policies of one key are in one shard: when every state is packed, they are decided
    /// under its shared lock with their words claimed (`Shard::together_shared`), the key
    /// hashed once and nothing built but the outcomes; else under the exclusive locks.
    fn together(&self, checks: &[Enforced<'_>], packed: bool) -> Decision {
        if packed && let Some(&(_, key, _)) = checks.first() {
            let key_hash = key.hash_in(&self.inner.hasher);
            let shard = &self.inner.shards[self.shard_of(key_hash)];
            let clock = || self.inner.clock.now_micros();
            // The shared guard is dropped at the end of this statement, before another lock.
            let claimed = shard.read().together_shared(checks, key_hash, clock);
            if let Some(decision) = claimed {
                return decision;
            }
        }
        self.together_locked(checks)
    }

    /// [`together`](Self::together) under the exclusive locks.
    #[inline(never)]
    fn together_locked(&self, checks: &[Enforced<'_>]) -> Decision {
        let mut refs: SmallVec<[CheckRef<'_>; TOGETHER]> = SmallVec::new();
        for &(tier, key, cost) in checks {
            refs.push(CheckRef::enforce(tier, key, cost));
        }
        let (runs, admitted) = self.decide_locked(&refs);
        let mut outcomes = Outcomes::new();
        for (&(tier, _, _), mut run) in checks.iter().zip(runs) {
            let own = run.take_own();
            outcomes.push(PolicyOutcome::new(
                own.as_ref().unwrap_or(tier),
                false,
                run.verdict(),
            ));
        }
        Decision::enforced(outcomes, admitted)
    }
}

#[allow(private_interfaces)]
impl private::Sealed for MemoryStore {
    type Future = std::future::Ready<Result<Decision, StoreError>>;

    const DECIDES_ALONE: bool = true;

    /// Rebuilt with the locks that suit the layer, when the builder left the choice open and
    /// the store is the layer's alone: no clone of it anywhere else, never used (no state, no
    /// policy registered), so that nothing can tell the new store from the old.
    fn suited(self, shared: bool) -> Self {
        let inner = &self.inner;
        if inner.chosen
            || self.per_thread_reads() == shared
            || Arc::strong_count(inner) > 1
            || !inner.registry.is_empty()
            || !self.is_empty()
        {
            return self;
        }
        MemoryStoreBuilder {
            max_keys: inner.per_shard * inner.shards.len(),
            shards: Some(inner.shards.len()),
            per_thread_reads: Some(shared),
            clock: inner.clock.clone(),
        }
        .build()
    }

    fn check(&self, checks: Checks) -> Self::Future {
        std::future::ready(Ok(self.check_locked(&checks)))
    }

    fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    fn check_now(&self, checks: &[Check]) -> Option<Decision> {
        Some(self.check_locked(checks))
    }

    #[inline(always)]
    fn check_alone(
        &self,
        tier: &Arc<Tier>,
        key: &Key,
        hash: Option<u64>,
        cost: u64,
    ) -> Option<(Verdict, Option<Arc<Tier>>)> {
        let hash = match hash {
            Some(hash) => hash,
            None => key.hash_in(&self.inner.hasher),
        };
        Some(MemoryStore::alone(self, tier, key, hash, cost))
    }

    #[inline(always)]
    fn admits_alone(&self, tier: &Arc<Tier>, key: &Key, hash: u64, cost: u64) -> bool {
        MemoryStore::admits(self, tier, key, hash, cost)
    }

    fn key_hash(&self, key: &Key) -> Option<u64> {
        Some(key.hash_in(&self.inner.hasher))
    }

    fn check_together(&self, checks: &[Enforced<'_>], packed: bool) -> Option<Decision> {
        (checks.len() <= TOGETHER).then(|| MemoryStore::together(self, checks, packed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::{Policy, RateLimitLayer, calendar::Calendar};

    #[test]
    fn a_quiet_admission_is_the_verdicts_admission() {
        // GCRA (a word alone) and a fixed window (a word and its count): told without a
        // verdict, each admission charges as the verdict's would, and a denial is `false` with
        // nothing written: the verdicts after it are those of a store that never saw it.
        use crate::algorithm::Algorithm;
        for algorithm in [Algorithm::Gcra, Algorithm::FixedWindow] {
            let clock = ManualClock::new();
            let quota: crate::Quota = "3/s".parse().expect("a quota");
            let tier = Tier::alone("q", 0, algorithm, quota, Op::Enforce).expect("a tier");
            let store = || MemoryStore::builder().clock(clock.clone()).build();
            let (quiet, told) = (store(), store());
            let key = Key::from(7u64);
            let (hash, told_hash) = (
                key.hash_in(&quiet.inner.hasher),
                key.hash_in(&told.inner.hasher),
            );
            // A new key is not decided quietly: its row is inserted under the exclusive lock.
            assert!(!quiet.admits(&tier, &key, hash, 1), "{algorithm:?}");
            assert!(quiet.alone(&tier, &key, hash, 1).0.allowed);
            assert!(told.alone(&tier, &key, told_hash, 1).0.allowed);
            for _ in 0..2 {
                assert!(quiet.admits(&tier, &key, hash, 1), "{algorithm:?}");
                assert!(told.alone(&tier, &key, told_hash, 1).0.allowed);
            }
            assert!(
                !quiet.admits(&tier, &key, hash, 1),
                "{algorithm:?}: past the limit"
            );
            let looked = |store: &MemoryStore, hash| {
                let verdict = store.alone(&tier, &key, hash, 0).0;
                (verdict.remaining, verdict.reset_after_us)
            };
            assert_eq!(
                looked(&quiet, hash),
                looked(&told, told_hash),
                "{algorithm:?}"
            );
            clock.advance(std::time::Duration::from_secs(1));
            assert!(
                quiet.admits(&tier, &key, hash, 1),
                "{algorithm:?}: a second on"
            );
        }
    }

    #[tokio::test]
    async fn every_policy_of_a_key_is_in_its_shard() {
        // Three policies of each of 100 keys: each key's three rows are in one shard (so a
        // decision of the three takes one lock), and every shard holds a multiple of three.
        let store = MemoryStore::builder().shards(64).build();
        let layer = RateLimitLayer::builder()
            .store(store.clone())
            .policy(Policy::gcra("10/s"))
            .policy(Policy::fixed_window("100/min"))
            .policy(Policy::sliding_window("1000/h"))
            .build()
            .expect("a valid layer");
        for i in 0..100u64 {
            assert!(
                layer
                    .check(&Key::from(i), 1)
                    .await
                    .expect("decided")
                    .is_allowed()
            );
        }
        let lens: Vec<usize> = store.inner.shards.iter().map(|s| s.read().len()).collect();
        assert_eq!(lens.iter().sum::<usize>(), 300);
        assert!(lens.iter().filter(|&&n| n > 0).count() > 10, "{lens:?}");
        assert!(lens.iter().all(|n| n % 3 == 0), "{lens:?}");
    }

    #[tokio::test]
    async fn the_states_that_pack_are_packed() {
        // GCRA's state and a fixed window's (its end and its count) are kept packed, in the
        // row, from the key's first charge on; a calendar's window and the other algorithms'
        // states are not.
        let cases = [
            (Policy::gcra("10/s"), 1),
            (Policy::fixed_window("100/min"), 1),
            (Policy::fixed_window("100/d").calendar(Calendar::utc()), 0),
            (Policy::sliding_window("100/min"), 0),
            (Policy::token_bucket("100/min"), 0),
        ];
        for (policy, packed) in cases {
            let what = format!("{policy:?}");
            let store = MemoryStore::builder().shards(1).build();
            let layer = RateLimitLayer::builder()
                .store(store.clone())
                .policy(policy)
                .build()
                .expect("a valid layer");
            for _ in 0..3 {
                let decision = layer.check(&Key::from("k"), 1).await.expect("decided");
                assert!(decision.is_allowed(), "{what}");
            }
            let look = layer.check(&Key::from("k"), 0).await.expect("decided");
            let outcome = &look.outcomes()[0];
            assert_eq!(outcome.remaining(), outcome.limit() - 3, "{what}");
            assert_eq!(store.inner.shards[0].read().packed(), packed, "{what}");
        }
    }
}
