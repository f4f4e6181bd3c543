//! The in-memory store.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Check, Mode, Registry, Store, private};
use crate::algorithm::{Compiled, State};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, PolicyOutcome};
use crate::error::{ConfigError, StoreError};
use crate::key::Key;

/// The default [`MemoryStoreBuilder::max_keys`].
pub(crate) const DEFAULT_MAX_KEYS: usize = 100_000;

/// How many operations a shard serves between checks for a periodic sweep.
const SWEEP_CHECK_EVERY: u32 = 1024;
/// The least time between two periodic sweeps of one shard, in microseconds.
const SWEEP_INTERVAL_US: u64 = 10_000_000;
/// How many entries to sample when a full shard must evict a live key.
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
/// entry, it evicts the entry that expires soonest among a small random sample, which forgets
/// that key's usage: size `max_keys` above the number of keys active within one window.
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

#[derive(Default)]
struct Shard {
    map: HashMap<(u32, Key), Entry>,
    ops: u32,
    last_sweep: u64,
}

struct Entry {
    state: Option<State>,
    expires_at: u64,
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

    /// The number of shards (default: four per available core, rounded up to a power of two).
    /// Never more than `max_keys`.
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
        let shards = self
            .shards
            .unwrap_or_else(|| {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                (cores * 4).next_power_of_two()
            })
            .min(self.max_keys);
        let per_shard = self.max_keys / shards;
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
                per_shard,
                hasher: RandomState::new(),
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
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
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

    fn shard_of(&self, id: u32, key: &Key) -> usize {
        let h = self.inner.hasher.hash_one((id, key));
        // The high bits: the map uses the low ones.
        ((h >> 32) as usize) % self.inner.shards.len()
    }

    /// Decides synchronously; [`Store::check`] wraps this in a ready future.
    pub(crate) fn decide(&self, checks: &[Check]) -> Decision {
        let now = self.inner.clock.now_micros();
        let capacity = self.inner.per_shard;
        if let [check] = checks
            && check.mode == Mode::Enforce
        {
            // The common case: one enforced policy, one shard, no allocation but the outcome.
            let mut shard = lock(&self.inner.shards[self.shard_of(check.policy.id, &check.key)]);
            let outcome = shard.decide_one(check, now, capacity);
            return Decision::new(vec![outcome]);
        }
        // Lock every shard involved, in index order so that concurrent multi-policy checks
        // cannot deadlock; then evaluate all before committing any.
        let indexes: Vec<usize> = checks
            .iter()
            .map(|c| self.shard_of(c.policy.id, &c.key))
            .collect();
        let mut order = indexes.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> = order
            .iter()
            .map(|&i| (i, lock(&self.inner.shards[i])))
            .collect();
        let slots: Vec<usize> = indexes
            .iter()
            .map(|&i| {
                guards
                    .iter()
                    .position(|(j, _)| *j == i)
                    .expect("every shard index was locked")
            })
            .collect();
        for (c, &g) in checks.iter().zip(&slots) {
            match c.mode {
                Mode::Refund => guards[g].1.refund(c, now),
                Mode::Reset => {
                    guards[g].1.map.remove(&(c.policy.id, c.key.clone()));
                }
                Mode::Penalize => guards[g].1.commit(c, now, capacity),
                Mode::Enforce | Mode::Shadow | Mode::Dry => {}
            }
        }
        let verdicts: Vec<_> = checks
            .iter()
            .zip(&slots)
            .map(|(c, &g)| {
                let cost = if c.mode.is_admin() { 0 } else { c.cost };
                let state = guards[g].1.live_state(c, now);
                c.policy.algorithm.evaluate(state, now, cost)
            })
            .collect();
        let admitted = checks
            .iter()
            .zip(&verdicts)
            .all(|(c, v)| v.allowed || c.mode == Mode::Shadow || c.mode.is_admin());
        let mut verdicts = verdicts;
        for ((c, v), &g) in checks.iter().zip(&mut verdicts).zip(&slots) {
            let charge = admitted
                && match c.mode {
                    Mode::Enforce => true,
                    Mode::Shadow => v.allowed,
                    Mode::Dry | Mode::Refund | Mode::Reset | Mode::Penalize => false,
                };
            if charge {
                guards[g].1.commit(c, now, capacity);
            } else if v.allowed && c.cost > 0 && !c.mode.is_admin() {
                // Admitted by this policy but not charged: report the state as it stays.
                let state = guards[g].1.live_state(c, now);
                let stays = c.policy.algorithm.evaluate(state, now, 0);
                v.remaining = stays.remaining;
                v.reset_after_us = stays.reset_after_us;
            }
        }
        for (_, g) in &mut guards {
            g.tick(now);
        }
        Decision::new(
            checks
                .iter()
                .zip(verdicts)
                .map(|(c, v)| PolicyOutcome::new(&c.policy, c.mode == Mode::Shadow, v))
                .collect(),
        )
    }
}

impl Shard {
    fn live_state(&self, check: &Check, now: u64) -> Option<&State> {
        // The lookup key is a (policy, key) tuple, so the key is cloned: a copy for an IP
        // address, a reference-count increment for bytes.
        let entry = self.map.get(&(check.policy.id, check.key.clone()))?;
        if entry.expires_at <= now {
            None
        } else {
            entry.state.as_ref()
        }
    }

    fn decide_one(&mut self, check: &Check, now: u64, capacity: usize) -> PolicyOutcome {
        let verdict = check
            .policy
            .algorithm
            .evaluate(self.live_state(check, now), now, check.cost);
        if verdict.allowed {
            self.commit(check, now, capacity);
        }
        self.tick(now);
        PolicyOutcome::new(&check.policy, false, verdict)
    }

    fn refund(&mut self, check: &Check, now: u64) {
        // An expired state is handed to the algorithm as it is, not dropped: for time that
        // moves forward it is the same as a fresh key, and when the clock goes back the
        // algorithm sees what the Redis script would see.
        let algorithm = &check.policy.algorithm;
        if let Some(entry) = self.map.get_mut(&(check.policy.id, check.key.clone()))
            && let Some(expires_at) = algorithm.refund(&mut entry.state, now, check.cost)
        {
            entry.expires_at = expires_at;
        }
    }

    fn commit(&mut self, check: &Check, now: u64, capacity: usize) {
        if check.cost == 0 {
            return;
        }
        let map_key = (check.policy.id, check.key.clone());
        if let Some(entry) = self.map.get_mut(&map_key) {
            entry.expires_at = check
                .policy
                .algorithm
                .commit(&mut entry.state, now, check.cost);
            return;
        }
        if self.map.len() >= capacity {
            self.make_room(now);
        }
        let mut state = None;
        let expires_at = check.policy.algorithm.commit(&mut state, now, check.cost);
        self.map.insert(map_key, Entry { state, expires_at });
    }

    /// Frees at least one slot: expired entries first, else the soonest-expiring of a sample.
    fn make_room(&mut self, now: u64) {
        if self.sweep(now) > 0 {
            return;
        }
        let victim = self
            .map
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, e)| e.expires_at)
            .map(|(k, _)| k.clone());
        if let Some(k) = victim {
            self.map.remove(&k);
        }
    }

    fn sweep(&mut self, now: u64) -> usize {
        let before = self.map.len();
        self.map.retain(|_, e| e.expires_at > now);
        self.last_sweep = now;
        self.ops = 0;
        before - self.map.len()
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard cannot leave it inconsistent (every update is a single
    // assignment), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store for MemoryStore {
    type Future = std::future::Ready<Result<Decision, StoreError>>;

    fn check(&self, checks: Vec<Check>) -> Self::Future {
        std::future::ready(Ok(self.decide(&checks)))
    }
}

#[allow(private_interfaces)]
impl private::Sealed for MemoryStore {
    fn register(&self, name: Arc<str>, algorithm: Compiled) -> Result<u32, ConfigError> {
        self.inner.registry.register(name, algorithm)
    }
}
