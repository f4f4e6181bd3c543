//! The in-memory store.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::HashTable;

use super::{Check, Checks, Op, Registry, lock, private};
use crate::algorithm::{Lease, State, Verdict, apply_block};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Grant, PolicyOutcome};
use crate::error::StoreError;
use crate::key::Key;
use smallvec::{SmallVec, smallvec};

/// The default [`MemoryStoreBuilder::max_keys`].
pub(crate) const DEFAULT_MAX_KEYS: usize = 100_000;

/// How many operations a shard serves between checks for a periodic sweep.
const SWEEP_CHECK_EVERY: u32 = 1024;
/// The least time between two periodic sweeps of one shard, in microseconds.
const SWEEP_INTERVAL_US: u64 = 10_000_000;
/// How many entries a full shard looks at (the first in its table's order) to choose one to
/// evict.
const EVICTION_SAMPLE: usize = 8;

/// Rate-limit state in this process: sharded, bounded, exact under concurrency.
///
/// Keys are spread over shards, each a hash map behind its own mutex, so tasks checking
/// different keys rarely wait for each other, and checks of one key are serialized, so exactly
/// `limit` of any number of concurrent requests are admitted. The hash is SipHash with a random
/// seed, so clients cannot choose keys that collide.
///
/// The store holds at most [`max_keys`](MemoryStoreBuilder::max_keys) keys. An entry is dropped
/// once its state is back to that of a fresh key: lazily when it is next used, and by a sweep of
/// each shard at most every ten seconds of activity. When a shard is full and holds no expired
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
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    registry: Registry,
}

/// One shard: a hash table keyed by (policy id, key), hashed once per decision with the
/// store's seeded hasher, and looked up by reference (no key is cloned but on insert).
struct Shard {
    table: HashTable<Slot>,
    /// The store's hasher, to hash a slot again when the table grows or evicts (a slot does
    /// not keep its hash: 8 bytes per key).
    hasher: RandomState,
    ops: u32,
    last_sweep: u64,
    /// A lower bound of the entries' expiry times (exact after a sweep).
    min_expiry: u64,
}

struct Slot {
    id: u32,
    /// The definition the state was written under (see [`Registry`]).
    def: u32,
    key: Key,
    state: Option<State>,
    expires_at: u64,
    /// Denied whatever the state until then (0: not blocked).
    blocked_until: u64,
}

impl Shard {
    fn new(hasher: RandomState) -> Self {
        Shard {
            hasher,
            table: HashTable::new(),
            ops: 0,
            last_sweep: 0,
            min_expiry: u64::MAX,
        }
    }
}

impl Slot {
    fn new(check: &Check, state: Option<State>, expires_at: u64) -> Self {
        Slot {
            id: check.tier().id(),
            def: check.tier().def(),
            key: check.key().clone(),
            state,
            expires_at,
            blocked_until: 0,
        }
    }

    fn is(&self, id: u32, key: &Key) -> bool {
        self.id == id && self.key == *key
    }

    /// Converts a state written under another definition of the policy (before a reload) to
    /// the check's (twin of `adopt` in `decide.lua`).
    fn adopt(&mut self, check: &Check, now: u64, registry: &Registry) {
        let tier = check.tier();
        let from = registry.definition(self.def);
        let expires_at = tier
            .algorithm()
            .convert(&from, &mut self.state, now, self.expires_at);
        self.expires_at = expires_at.max(self.blocked_until);
        self.def = tier.def();
    }

    /// The state, unless it has expired (then the key is as good as fresh).
    fn live(&self, now: u64) -> Option<&State> {
        if self.expires_at <= now {
            None
        } else {
            self.state.as_ref()
        }
    }
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
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| Mutex::new(Shard::new(hasher.clone())))
                    .collect(),
                per_shard,
                hasher,
                clock: self.clock,
                registry: Registry::default(),
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
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// The number of entries held, including expired ones not yet swept.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).table.len()).sum()
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
        self.inner.shards.iter().map(|s| lock(s).sweep(now)).sum()
    }

    /// The hash of a check's (policy, key) and its shard.
    fn locate(&self, check: &Check) -> (u64, usize) {
        let h = check.key().hash_with(check.tier().id(), &self.inner.hasher);
        // The high bits pick the shard: the table uses the low ones.
        (h, ((h >> 32) as usize) & (self.inner.shards.len() - 1))
    }

    /// Decides synchronously; [`Store::check`] wraps this in a ready future.
    ///
    /// The time is read once the shards are locked: decisions on one key then see times in the
    /// order they are made, so each reports exactly what it left (read before the lock, a
    /// decision could be made after a later one and see time go back).
    pub(crate) fn decide(&self, checks: &[Check]) -> Decision {
        let capacity = self.inner.per_shard;
        if let [check] = checks
            && check.op() == Op::Enforce
        {
            // The common case: one enforced policy, one shard, no allocation but the outcome.
            let (hash, index) = self.locate(check);
            let mut shard = lock(&self.inner.shards[index]);
            let now = self.inner.clock.now_micros();
            let outcome = shard.decide_one(check, hash, now, capacity, &self.inner.registry);
            return Decision::new(smallvec![outcome]);
        }
        let (mut guards, mut steps) = self.lock_all(checks);
        let now = self.inner.clock.now_micros();
        let registry = &self.inner.registry;
        let redefined = registry.redefined();
        // Phase one: the operations that act on their own, in order; then every verdict.
        for (c, s) in checks.iter().zip(&steps) {
            let shard = &mut guards[s.guard];
            // One more lookup per check, only in a store where a policy was ever redefined.
            if redefined
                && let Some(slot) = shard.find_mut(c, s.hash)
                && slot.def != c.tier().def()
            {
                slot.adopt(c, now, registry);
            }
            shard.act(c, s.hash, now, capacity);
        }
        for (c, s) in checks.iter().zip(&mut steps) {
            let shard = &guards[s.guard];
            // An operation that acted on its own reports like a look.
            let cost = if c.op().acts() { 0 } else { c.cost() };
            s.verdict = shard.evaluate(c, s.hash, now, cost);
            if let Op::Reserve { max_wait_us } = c.op()
                && !s.verdict.allowed
            {
                // Denied now, it may be admitted at a later slot.
                s.wait = shard.reservation(c, s.hash, now, &s.verdict, max_wait_us);
            }
        }
        let admitted = checks
            .iter()
            .zip(&steps)
            .all(|(c, s)| s.verdict.allowed || s.wait.is_some() || !c.op().decides());
        // Phase two: charged only if every check that decides admits the request.
        for (c, s) in checks.iter().zip(&mut steps) {
            guards[s.guard].settle(c, s, now, admitted, capacity);
        }
        for g in &mut guards {
            g.tick(now);
        }
        let outcomes = checks.iter().zip(steps).map(|(c, s)| {
            PolicyOutcome::new(c.tier(), c.op() == Op::Shadow, s.verdict).with_grant(s.grant)
        });
        Decision::new(outcomes.collect())
    }

    /// Locks every shard `checks` involve, in index order so that concurrent multi-policy
    /// decisions cannot deadlock; each check's step names its shard by its place among the
    /// guards.
    fn lock_all(&self, checks: &[Check]) -> (Vec<MutexGuard<'_, Shard>>, Steps) {
        let mut steps: Steps = checks
            .iter()
            .map(|c| {
                let (hash, shard) = self.locate(c);
                Step::new(hash, shard)
            })
            .collect();
        let mut order: SmallVec<[usize; 4]> = steps.iter().map(|s| s.guard).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| lock(&self.inner.shards[i])).collect();
        for s in &mut steps {
            s.guard = order
                .binary_search(&s.guard)
                .expect("every shard involved is locked");
        }
        (guards, steps)
    }
}

/// One check's way through a decision: where its entry is, its verdict, the wait until the
/// slot it reserved (if it waits) and what it was granted.
struct Step {
    hash: u64,
    /// The check's shard: its index, then its place among the locked guards.
    guard: usize,
    verdict: Verdict,
    wait: Option<u64>,
    grant: Option<Grant>,
}

type Steps = SmallVec<[Step; 2]>;

impl Step {
    fn new(hash: u64, shard: usize) -> Self {
        Step {
            hash,
            guard: shard,
            verdict: Verdict::allow(0, 0),
            wait: None,
            grant: None,
        }
    }
}

impl Shard {
    fn find(&self, check: &Check, hash: u64) -> Option<&Slot> {
        self.table
            .find(hash, |s| s.is(check.tier().id(), check.key()))
    }

    fn find_mut(&mut self, check: &Check, hash: u64) -> Option<&mut Slot> {
        self.table
            .find_mut(hash, |s| s.is(check.tier().id(), check.key()))
    }

    /// The verdict on `check` at `cost` (0: a look), its block included, with one lookup; for
    /// a lease, on the state as strict as the lease could make it.
    fn evaluate(&self, check: &Check, hash: u64, now: u64, cost: u64) -> Verdict {
        let slot = self.find(check, hash);
        let state = slot.and_then(|s| s.live(now));
        let algorithm = check.tier().algorithm();
        let mut verdict = match check.op() {
            Op::Lease { .. } => {
                algorithm
                    .lease_verdict(state, now, lease_ttl(check), cost)
                    .0
            }
            _ => algorithm.evaluate(state, now, cost),
        };
        apply_block(&mut verdict, slot.map_or(0, |s| s.blocked_until), now);
        verdict
    }

    /// For a check denied now with `verdict`: the wait until the slot that admits it, if it
    /// is within `max_wait` and the key is not blocked.
    fn reservation(
        &self,
        check: &Check,
        hash: u64,
        now: u64,
        verdict: &Verdict,
        max_wait: u64,
    ) -> Option<u64> {
        let slot = self.find(check, hash);
        if slot.is_some_and(|s| s.blocked_until > now) {
            return None;
        }
        let state = slot.and_then(|s| s.live(now));
        let algorithm = check.tier().algorithm();
        algorithm.reservation(state, now, check.cost(), verdict, max_wait)
    }

    /// What an operation that acts on its own does, before any verdict (nothing for the
    /// others).
    fn act(&mut self, check: &Check, hash: u64, now: u64, capacity: usize) {
        let algorithm = check.tier().algorithm();
        let units = check.cost();
        match check.op() {
            Op::Refund => self.update(check, hash, |s| algorithm.refund(s, now, units)),
            Op::Reset => self.remove(check, hash),
            Op::Penalize => self.commit(check, hash, now, capacity),
            Op::Block { us } => self.block(check, hash, now, now + us, capacity),
            Op::GiveBack { end } => {
                self.update(check, hash, |s| algorithm.give_back(s, now, end, units))
            }
            Op::Release { slot } => {
                self.update(check, hash, |s| algorithm.release(s, now, slot, units))
            }
            Op::Enforce
            | Op::Shadow
            | Op::ChargeLater
            | Op::Hold
            | Op::Reserve { .. }
            | Op::Lease { .. } => {}
        }
    }

    /// Phase two for one check, the request `admitted` or not: charges it as its operation
    /// says (at its reserved slot, a lease, its cost), or reports the state as it stays.
    fn settle(&mut self, check: &Check, step: &mut Step, now: u64, admitted: bool, cap: usize) {
        let (hash, cost) = (step.hash, check.cost());
        let op = check.op();
        if let (true, Some(wait)) = (admitted, step.wait) {
            let slot = now + wait;
            self.reserve_commit(check, hash, now, slot, cap);
            // Admitted, the state reported as it is seen now (a look may deny: the sliding log
            // still counts, now, entries that are gone at the slot).
            let seen = self.evaluate(check, hash, now, 0);
            step.verdict = Verdict::allow(seen.remaining, seen.reset_after_us);
            step.grant = Some(Grant {
                units: cost,
                end: slot,
                lasts_us: wait,
            });
        } else if let (true, Op::Lease { want }) = (admitted, op) {
            let lease = self.take_lease(check, hash, now, want, cap);
            step.verdict = lease.verdict;
            step.grant = Some(Grant {
                units: lease.units,
                end: lease.end,
                lasts_us: lease.end - now,
            });
        } else if admitted && op.charged(step.verdict.allowed) {
            self.commit(check, hash, now, cap);
            if op == Op::Hold && cost > 0 {
                // The slots, charged now: given back as charged at `now`.
                step.grant = Some(Grant {
                    units: cost,
                    end: now,
                    lasts_us: 0,
                });
            }
        } else if step.verdict.allowed && cost > 0 && !op.acts() {
            // Admitted by this policy but not charged: report the state as it stays.
            let stays = self.evaluate(check, hash, now, 0);
            step.verdict.remaining = stays.remaining;
            step.verdict.reset_after_us = stays.reset_after_us;
        }
    }

    /// Charges a request that reserved the slot `at`.
    fn reserve_commit(&mut self, check: &Check, hash: u64, now: u64, at: u64, capacity: usize) {
        let algorithm = check.tier().algorithm();
        match self.find_mut(check, hash) {
            Some(slot) => {
                slot.expires_at = algorithm.reserve_commit(&mut slot.state, now, at, check.cost());
            }
            None => {
                let mut state = None;
                let expires_at = algorithm.reserve_commit(&mut state, now, at, check.cost());
                let slot = Slot::new(check, state, expires_at);
                self.insert_slot(slot, hash, now, capacity);
            }
        }
    }

    /// Blocks the key from `now` until `until`.
    fn block(&mut self, check: &Check, hash: u64, now: u64, until: u64, capacity: usize) {
        match self.find_mut(check, hash) {
            Some(slot) => {
                slot.blocked_until = until;
                slot.expires_at = slot.expires_at.max(until);
            }
            None => {
                let slot = Slot {
                    blocked_until: until,
                    ..Slot::new(check, None, until)
                };
                self.insert_slot(slot, hash, now, capacity);
            }
        }
    }

    /// One enforced policy: evaluate and commit with a single lookup.
    fn decide_one(
        &mut self,
        check: &Check,
        hash: u64,
        now: u64,
        capacity: usize,
        registry: &Registry,
    ) -> PolicyOutcome {
        let algorithm = &check.tier().algorithm();
        let verdict = match self.find_mut(check, hash) {
            Some(slot) => {
                if slot.def != check.tier().def() {
                    slot.adopt(check, now, registry);
                }
                let mut verdict = algorithm.evaluate(slot.live(now), now, check.cost());
                apply_block(&mut verdict, slot.blocked_until, now);
                if verdict.allowed && check.cost() > 0 {
                    // An expired state is handed to the algorithm as it is: for time that moves
                    // forward it is the same as a fresh key, and when the clock goes back the
                    // algorithm sees what the Redis script would see.
                    slot.expires_at = algorithm.commit(&mut slot.state, now, check.cost());
                }
                verdict
            }
            None => {
                let verdict = algorithm.evaluate(None, now, check.cost());
                if verdict.allowed && check.cost() > 0 {
                    self.insert(check, hash, now, capacity);
                }
                verdict
            }
        };
        self.tick(now);
        PolicyOutcome::new(check.tier(), false, verdict)
    }

    /// Changes the state of `check`'s key with `change` (a refund, units given back), if
    /// there is one; `change` returns the new expiry, or `None` when nothing changed.
    fn update(
        &mut self,
        check: &Check,
        hash: u64,
        change: impl FnOnce(&mut Option<State>) -> Option<u64>,
    ) {
        if let Some(slot) = self.find_mut(check, hash)
            && let Some(expires_at) = change(&mut slot.state)
        {
            slot.expires_at = expires_at;
            self.min_expiry = self.min_expiry.min(expires_at);
        }
    }

    /// Charges the lease `check` asks for (its request admitted): what is left, at least the
    /// cost and at most the tier's lease size.
    fn take_lease(&mut self, check: &Check, hash: u64, now: u64, want: u64, cap: usize) -> Lease {
        let algorithm = check.tier().algorithm();
        let ttl = lease_ttl(check);
        match self.find_mut(check, hash) {
            Some(slot) => {
                // As a charge does, on the state as it is (see `decide_one`).
                let lease = algorithm.take_lease(&mut slot.state, now, ttl, check.cost(), want);
                if let Some(expires_at) = lease.expires_at {
                    slot.expires_at = expires_at;
                }
                lease
            }
            None => {
                let mut state = None;
                let lease = algorithm.take_lease(&mut state, now, ttl, check.cost(), want);
                if let Some(expires_at) = lease.expires_at {
                    let slot = Slot::new(check, state, expires_at);
                    self.insert_slot(slot, hash, now, cap);
                }
                lease
            }
        }
    }

    fn remove(&mut self, check: &Check, hash: u64) {
        if let Ok(entry) = self
            .table
            .find_entry(hash, |s| s.is(check.tier().id(), check.key()))
        {
            entry.remove();
        }
    }

    fn commit(&mut self, check: &Check, hash: u64, now: u64, capacity: usize) {
        if check.cost() == 0 {
            return;
        }
        match self.find_mut(check, hash) {
            Some(slot) => {
                slot.expires_at =
                    check
                        .tier()
                        .algorithm()
                        .commit(&mut slot.state, now, check.cost());
            }
            None => self.insert(check, hash, now, capacity),
        }
    }

    /// A new entry for a key not in the table, charged `check.cost()`.
    fn insert(&mut self, check: &Check, hash: u64, now: u64, capacity: usize) {
        let mut state = None;
        let expires_at = check
            .tier()
            .algorithm()
            .commit(&mut state, now, check.cost());
        let slot = Slot::new(check, state, expires_at);
        self.insert_slot(slot, hash, now, capacity);
    }

    /// Adds a slot for a key not in the table, making room first when the shard is full.
    fn insert_slot(&mut self, slot: Slot, hash: u64, now: u64, capacity: usize) {
        if self.table.len() >= capacity {
            self.make_room(now);
        }
        self.min_expiry = self.min_expiry.min(slot.expires_at);
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, slot, |s| s.key.hash_with(s.id, hasher));
    }

    /// Frees one slot, looking at the first [`EVICTION_SAMPLE`] entries of the table (constant
    /// time, whatever the shard's size): an expired one if there is one; else, when an entry
    /// may have expired, a sweep of the whole shard; else the soonest to expire of those, a
    /// live key.
    fn make_room(&mut self, now: u64) {
        let sample = self
            .table
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|s| s.expires_at)
            .map(|s| {
                (
                    s.key.hash_with(s.id, &self.hasher),
                    s.id,
                    s.key.clone(),
                    s.expires_at,
                )
            });
        let Some((hash, id, key, expires_at)) = sample else {
            return;
        };
        if expires_at > now {
            // Sweep only when some entry may have expired (the lower bound says so), so a flood
            // of live keys never scans the shard; a sweep recomputes the bound exactly.
            if now >= self.min_expiry && self.sweep(now) > 0 {
                return;
            }
            tracing::debug!("memory store shard full; evicting a live key");
        }
        if let Ok(entry) = self.table.find_entry(hash, |s| s.is(id, &key)) {
            entry.remove();
        }
    }

    fn sweep(&mut self, now: u64) -> usize {
        let before = self.table.len();
        let mut min_expiry = u64::MAX;
        self.table.retain(|s| {
            let keep = s.expires_at > now;
            if keep {
                min_expiry = min_expiry.min(s.expires_at);
            }
            keep
        });
        self.min_expiry = min_expiry;
        self.last_sweep = now;
        self.ops = 0;
        before - self.table.len()
    }

    /// Counts an operation and sweeps when it is time.
    fn tick(&mut self, now: u64) {
        self.ops += 1;
        if self.ops >= SWEEP_CHECK_EVERY {
            self.ops = 0;
            if now.saturating_sub(self.last_sweep) >= SWEEP_INTERVAL_US {
                self.sweep(now);
            }
        }
    }
}

/// The longest life of a lease on `check`'s tier (0 for a tier without leases).
fn lease_ttl(check: &Check) -> u64 {
    check.tier().lease().map_or(0, |l| l.ttl_us())
}

#[allow(private_interfaces)]
impl private::Sealed for MemoryStore {
    type Future = std::future::Ready<Result<Decision, StoreError>>;

    fn check(&self, checks: Checks) -> Self::Future {
        std::future::ready(Ok(self.decide(&checks)))
    }

    fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    fn decide_now(&self, checks: &[Check]) -> Option<Decision> {
        Some(self.decide(checks))
    }
}
