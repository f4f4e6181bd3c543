//! The in-memory store.

mod lock;
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
use lock::{ShardLock, Write};
use shard::{CheckRef, CheckRun, CheckRuns, Judged, Shard, Together};
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
    inner: Arc<Inner>,
}

struct Inner {
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
            inner: Arc::new(Inner {
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

    /// The hash of a check's (policy, key) and its shard.
    #[inline]
    fn locate(&self, check: &CheckRef<'_>) -> (u64, usize) {
        let key_hash = check.key().hash_in(&self.inner.hasher);
        (
            Key::with_id(key_hash, check.tier().id()),
            self.shard_of(key_hash),
        )
    }

    /// The shard of the key whose hash ([`Key::hash_in`]) is `key_hash`: its high bits pick
    /// it, the table uses the low ones of the (policy, key) hash. Every policy of a key is
    /// in one shard, so a decision of several policies on one key takes one lock.
    #[inline]
    fn shard_of(&self, key_hash: u64) -> usize {
        ((key_hash >> 32) as usize) & (self.inner.shards.len() - 1)
    }

    /// One enforced policy on `key` at `cost`: the common case, decided under the shard's
    /// shared lock when the key's state is packed, else under its exclusive lock. The checked
    /// tier and the key are borrowed: nothing is cloned, no reference count changes.
    ///
    /// The time is read once the shard is locked (on the shared path, after the state is
    /// loaded): decisions on one key then see times in the order they are made, so each
    /// reports exactly what it left (read before, a decision could be made after a later one
    /// and see time go back).
    #[inline]
    /// `None` for a key under a limit of its own: the general path decides it.
    pub(crate) fn decide_enforced(&self, tier: &Tier, key: &Key, cost: u64) -> Option<Verdict> {
        let ask = CheckRef::enforce(tier, key, cost);
        let (hash, index) = self.locate(&ask);
        let clock = || self.inner.clock.now_micros();
        let shard = &self.inner.shards[index];
        // The shared guard is dropped at the end of this statement, before the other lock.
        let packed = shard.read().decide_packed(&ask, hash, clock);
        packed.or_else(|| {
            let registry = &self.inner.registry;
            let capacity = self.inner.per_shard;
            shard
                .write()
                .decide_one(&ask, hash, clock(), capacity, registry)
        })
    }

    /// Decides synchronously; [`Store::check`] wraps this in a ready future.
    pub(crate) fn decide(&self, checks: &[Check]) -> Decision {
        if let [check] = checks
            && check.op() == Op::Enforce
            && let Some(verdict) = self.decide_enforced(check.tier(), check.key(), check.cost())
        {
            return Decision::one(PolicyOutcome::new(check.tier(), false, verdict));
        }
        if (2..=TOGETHER).contains(&checks.len()) && checks.iter().all(|c| c.op() == Op::Enforce) {
            let mut together: SmallVec<[Enforced<'_>; TOGETHER]> = SmallVec::new();
            for c in checks {
                together.push((c.tier(), c.key(), c.cost()));
            }
            if let Some(decision) = self.decide_together(&together) {
                return decision;
            }
        }
        let capacity = self.inner.per_shard;
        // Pushed one by one here and below: `collect` into a SmallVec goes through its generic
        // `extend`, about 70 instructions a collection more.
        let mut refs: SmallVec<[CheckRef<'_>; 2]> = SmallVec::new();
        for c in checks {
            refs.push(CheckRef::from(c));
        }
        let (mut guards, mut runs) = self.lock_all(&refs);
        let now = self.inner.clock.now_micros();
        let registry = &self.inner.registry;
        let redefined = registry.redefined();
        // Phase one: the operations that act on their own, in order; then every verdict.
        for ((c, s), check) in refs.iter().zip(&runs).zip(checks) {
            let shard = &mut guards[s.guard];
            // One more lookup per check, only in a store where a policy was ever redefined
            // or a key given a limit of its own.
            // An operation that changes what the key is decided under converts from what
            // the state was written under itself (as the script does).
            if redefined && !c.op().relimits() {
                shard.adopt(c, s.hash, now, registry);
            }
            shard.act(c, s.hash, now, capacity, (registry, check.tier()));
        }
        for (c, s) in refs.iter().zip(&mut runs) {
            let shard = &guards[s.guard];
            if redefined {
                s.own = shard.own_tier(c, s.hash);
            }
            // An operation that acted on its own reports like a look.
            let cost = if c.op().acts() { 0 } else { c.cost() };
            s.verdict = shard.evaluate(c, s.hash, now, cost);
            if let Op::Wait { max_wait_us } = c.op()
                && !s.verdict.allowed
            {
                // Denied now, it may be admitted at a later slot.
                s.wait = shard.reservation(c, s.hash, now, &s.verdict, max_wait_us);
            }
        }
        let admitted = refs
            .iter()
            .zip(&runs)
            .all(|(c, s)| s.verdict.allowed || s.wait.is_some() || !c.op().decides());
        // Phase two: charged only if every check that decides admits the request.
        for (c, s) in refs.iter().zip(&mut runs) {
            guards[s.guard].apply(c, s, now, admitted, capacity);
        }
        for g in &mut guards {
            g.tick(now);
        }
        let mut outcomes = SmallVec::with_capacity(checks.len());
        for (c, s) in checks.iter().zip(runs) {
            let tier = s.own.as_ref().unwrap_or(c.tier());
            let outcome = PolicyOutcome::new(tier, c.op() == Op::Shadow, s.verdict);
            outcomes.push(outcome.with_grant(s.grant));
        }
        Decision::new(outcomes)
    }

    /// Several enforced policies, at most [`TOGETHER`] (the usual request of several). The
    /// policies of one key are in one shard: when every state is packed, they are decided
    /// under its shared lock (`Shard::decide_claimed`), the key hashed once and nothing built
    /// but the outcomes; else under the exclusive lock ([`decide_locked`](Self::decide_locked)).
    /// `None`, having charged nothing, when a key is under a limit of its own.
    fn decide_together(&self, checks: &[Enforced<'_>]) -> Option<Decision> {
        let (&(_, key, _), rest) = checks.split_first()?;
        let key_hash = key.hash_in(&self.inner.hasher);
        let one_key = rest
            .iter()
            .all(|&(_, k, _)| std::ptr::eq(k, key) || k == key);
        if one_key && checks.iter().all(|&(tier, _, _)| tier.algorithm().packs()) {
            let shard = &self.inner.shards[self.shard_of(key_hash)];
            let clock = || self.inner.clock.now_micros();
            // The shared guard is dropped at the end of this statement, before another lock.
            let claimed = shard.read().decide_claimed(checks, key_hash, clock);
            if claimed.is_some() {
                return claimed;
            }
        }
        self.decide_locked(checks, (key, key_hash))
    }

    /// [`decide_together`](Self::decide_together) under the exclusive lock of each shard the
    /// checks' keys are in (`hashed`: the first key and its hash): the phases of the general
    /// path without what they do not need. Each key's row is found once (phase two goes to the
    /// place phase one found it), no operation acts on its own, nothing waits or is granted.
    fn decide_locked(&self, checks: &[Enforced<'_>], hashed: (&Key, u64)) -> Option<Decision> {
        // Pushed: a `SmallVec` leaves its unused places unwritten, where an array of
        // `TOGETHER` defaults costs a `check` of two policies 40 instructions.
        let mut runs: SmallVec<[Together; TOGETHER]> = SmallVec::new();
        // A key is hashed once for the policies in a row that share it (all, for `check`).
        let mut last = hashed;
        let (mut first, mut one_shard) = (None, true);
        for &(tier, key, _) in checks {
            if !(std::ptr::eq(last.0, key) || last.0 == key) {
                last = (key, key.hash_in(&self.inner.hasher));
            }
            let shard = self.shard_of(last.1);
            one_shard &= *first.get_or_insert(shard) == shard;
            runs.push(Together {
                hash: Key::with_id(last.1, tier.id()),
                guard: shard,
                judged: Judged::default(),
            });
        }
        let admitted = match (first, one_shard) {
            (Some(shard), true) => {
                let shard = &self.inner.shards[shard];
                self.together(checks, &mut runs, &mut [&mut *shard.write()], |_| 0)?
            }
            _ => self.together_in_shards(checks, &mut runs)?,
        };
        let mut outcomes = Outcomes::new();
        for (&(tier, _, _), run) in checks.iter().zip(runs.iter()) {
            outcomes.push(PolicyOutcome::new(tier, false, run.judged.verdict));
        }
        Some(Decision::enforced(outcomes, admitted))
    }

    /// [`decide_together`](Self::decide_together) of keys in several shards: each locked
    /// exclusively, in index order.
    fn together_in_shards(&self, checks: &[Enforced<'_>], runs: &mut [Together]) -> Option<bool> {
        let mut order = [0; TOGETHER];
        for (o, r) in order.iter_mut().zip(runs.iter()) {
            *o = r.guard;
        }
        let (mut guards, order) = self.lock_shards(&mut order[..checks.len()]);
        for r in runs.iter_mut() {
            r.guard = order.binary_search(&r.guard).unwrap_or_default();
        }
        let mut shards: SmallVec<[&mut Shard; TOGETHER]> = SmallVec::new();
        for g in &mut guards {
            shards.push(g);
        }
        self.together(checks, runs, &mut shards, |place| place)
    }

    /// [`decide_together`](Self::decide_together) once its shards are locked: `shards`, a
    /// run's shard at `place(run.guard)` among them (0 for all when there is one). Leaves each
    /// run's verdict; whether the request is admitted.
    #[inline]
    fn together(
        &self,
        checks: &[Enforced<'_>],
        runs: &mut [Together],
        shards: &mut [&mut Shard],
        place: impl Fn(usize) -> usize,
    ) -> Option<bool> {
        let refs = checks
            .iter()
            .map(|&(tier, key, cost)| CheckRef::enforce(tier, key, cost));
        let now = self.inner.clock.now_micros();
        let registry = &self.inner.registry;
        let redefined = registry.redefined();
        let (mut admitted, mut new_keys) = (true, false);
        for (c, run) in refs.clone().zip(runs.iter_mut()) {
            let shard = &mut shards[place(run.guard)];
            if redefined {
                shard.adopt(&c, run.hash, now, registry);
            }
            run.judged = shard.judge(&c, run.hash, now)?;
            admitted &= run.judged.verdict.allowed;
            new_keys |= run.judged.bucket.is_none();
        }
        // Phase two: the rows found first, then the new keys (an insert may move rows).
        for (c, run) in refs.clone().zip(runs.iter_mut()) {
            if let Some(bucket) = run.judged.bucket {
                shards[place(run.guard)].settle_at(&c, bucket, now, admitted, &mut run.judged);
            }
        }
        let capacity = self.inner.per_shard;
        for (c, run) in refs.zip(runs.iter_mut()).filter(|_| new_keys) {
            if run.judged.bucket.is_none() {
                let shard = &mut shards[place(run.guard)];
                let verdict = &mut run.judged.verdict;
                shard.settle_new(&c, run.hash, now, admitted, verdict, capacity);
            }
        }
        for shard in shards {
            shard.tick(now);
        }
        Some(admitted)
    }

    /// Locks every shard `checks` involve (two kept without allocating), in index order so that concurrent multi-policy
    /// decisions cannot deadlock; each check's run names its shard by its place among the
    /// guards.
    fn lock_all(&self, checks: &[CheckRef<'_>]) -> (Guards<'_>, CheckRuns) {
        let mut runs = CheckRuns::new();
        let mut order: SmallVec<[usize; 4]> = SmallVec::new();
        for c in checks {
            let (hash, shard) = self.locate(c);
            runs.push(CheckRun::new(hash, shard));
            order.push(shard);
        }
        let (guards, order) = self.lock_shards(&mut order);
        for s in &mut runs {
            s.guard = order
                .binary_search(&s.guard)
                .expect("every shard involved is locked");
        }
        (guards, runs)
    }

    /// Locks the shards of the indexes `order` (sorted here, each locked once), in index
    /// order; returns the guards and the indexes locked, the guards' order.
    fn lock_shards<'s>(&self, order: &'s mut [usize]) -> (Guards<'_>, &'s [usize]) {
        order.sort_unstable();
        let mut guards = Guards::new();
        let mut locked = 0;
        for i in 0..order.len() {
            if i == 0 || order[i] != order[i - 1] {
                guards.push(self.inner.shards[order[i]].write());
                order[locked] = order[i];
                locked += 1;
            }
        }
        (guards, &order[..locked])
    }
}

/// The most policies [`MemoryStore::decide_together`] decides; more take the general path.
pub(crate) const TOGETHER: usize = 4;

/// The shards one decision locked, in index order.
type Guards<'a> = SmallVec<[Write<'a, Shard>; 2]>;

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
        std::future::ready(Ok(self.decide(&checks)))
    }

    fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    fn decide_now(&self, checks: &[Check]) -> Option<Decision> {
        Some(self.decide(checks))
    }

    #[inline]
    fn decide_enforced(&self, tier: &Tier, key: &Key, cost: u64) -> Option<Verdict> {
        MemoryStore::decide_enforced(self, tier, key, cost)
    }

    fn decide_together(&self, checks: &[Enforced<'_>]) -> Option<Decision> {
        if checks.len() > TOGETHER {
            return None;
        }
        MemoryStore::decide_together(self, checks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Calendar, Policy, RateLimitLayer};

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
