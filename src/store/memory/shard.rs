//! One shard of the memory store: its table of rows, the shared-lock path that decides a
//! packed state (by compare-and-swap, or with its word claimed), and the exclusive path for
//! everything else.

use std::collections::hash_map::RandomState;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hashbrown::HashTable;

use crate::algorithm::{Compiled, Lease, State, Verdict, apply_block};
use crate::key::Key;
use crate::policy::Tier;
use crate::store::{Check, Op, Registry};

mod atomic;
mod claim;
mod decide;
mod entry;
mod limit;
mod run;
mod strike;
mod word;

pub(crate) use claim::TOGETHER;
pub(super) use run::Run;

use entry::{Cell, Limit, Marks, Unpacked};

/// How many operations a shard serves under its exclusive lock between checks for a periodic
/// sweep.
const SWEEP_CHECK_EVERY: u32 = 1024;
/// The least time between two periodic sweeps of one shard, in microseconds.
const SWEEP_INTERVAL_US: u64 = 10_000_000;
/// How many entries a full shard looks at (the first in its table's order) to choose one to
/// evict.
const EVICTION_SAMPLE: usize = 8;

/// One shard: a hash table keyed by (policy id, key), hashed once per decision with the
/// store's seeded hasher, and looked up by reference (no key is cloned but on insert).
///
/// Behind a read-write lock: under the shared lock, a key's enforced policies whose states are
/// packed are decided on their words (by compare-and-swap, or claimed: `claim.rs`), so threads
/// deciding one hot key never wait for each other's lock; everything else (a new key, leases,
/// booked times, holds, a block, the sweep) takes the exclusive lock.
pub(super) struct Shard {
    table: HashTable<Row>,
    /// The store's hasher, to hash a row again when the table grows or evicts (a row does
    /// not keep its hash: 8 bytes per key).
    hasher: RandomState,
    ops: u32,
    last_sweep: u64,
    /// A lower bound of the entries' expiry times (exact after a sweep; a charge under the
    /// shared lock only moves an expiry later).
    min_expiry: u64,
}

/// A key's entry in one policy: 64 bytes (checked by a test), so that a table of them stays
/// within 96 bytes a key.
struct Row {
    key: Key,
    id: u32,
    /// The definition the state was written under (see [`Registry`]).
    def: u32,
    cell: Cell,
}

/// What a shard needs of a check: its tier and key, borrowed (no reference count changes
/// hands), its cost and its operation.
#[derive(Clone, Copy)]
pub(super) struct CheckRef<'a> {
    tier: &'a Arc<Tier>,
    key: &'a Key,
    cost: u64,
    op: Op,
}

impl<'a> CheckRef<'a> {
    /// One enforced policy.
    pub(super) fn enforce(tier: &'a Arc<Tier>, key: &'a Key, cost: u64) -> Self {
        CheckRef {
            tier,
            key,
            cost,
            op: Op::Enforce,
        }
    }

    pub(super) fn tier(&self) -> &'a Arc<Tier> {
        self.tier
    }

    pub(super) fn key(&self) -> &'a Key {
        self.key
    }

    pub(super) fn cost(&self) -> u64 {
        self.cost
    }

    pub(super) fn op(&self) -> Op {
        self.op
    }
}

impl<'a> From<&'a Check> for CheckRef<'a> {
    fn from(check: &'a Check) -> Self {
        CheckRef {
            tier: check.tier(),
            key: check.key(),
            cost: check.cost(),
            op: check.op(),
        }
    }
}

impl Unpacked {
    /// The verdict on this entry of `check`'s algorithm at `cost` (0: a look), its block
    /// included; for a lease, on the state as strict as the lease could make it.
    #[inline]
    pub(super) fn verdict(
        entry: Option<&Unpacked>,
        check: &CheckRef<'_>,
        now: u64,
        cost: u64,
    ) -> Verdict {
        let tier = check.tier().algorithm();
        let algorithm = entry.map_or(tier, |e| e.algorithm(tier));
        let state = entry.and_then(|e| e.live(now));
        let mut verdict = match check.op() {
            Op::Lease { .. } => {
                algorithm
                    .lease_verdict(state, now, lease_ttl(check), cost)
                    .0
            }
            _ => algorithm.evaluate(state, now, cost),
        };
        apply_block(&mut verdict, entry.map_or(0, Unpacked::blocked_until), now);
        verdict
    }
}

impl Row {
    fn new(check: &CheckRef<'_>, entry: Unpacked) -> Self {
        let tier = check.tier();
        Row {
            id: tier.id(),
            def: tier.def(),
            key: check.key().clone(),
            cell: Cell::new(tier.algorithm(), entry),
        }
    }

    #[inline]
    fn is(&self, id: u32, key: &Key) -> bool {
        self.id == id && self.key == *key
    }

    fn expires_at(&self) -> u64 {
        match &self.cell {
            Cell::Packed { word, .. } => word.load(Ordering::Relaxed),
            Cell::Full(entry) => entry.expires_at,
        }
    }

    /// Reads the entry (the state written under `algorithm`).
    #[inline]
    fn read<R>(&self, algorithm: &Compiled, f: impl FnOnce(&Unpacked) -> R) -> R {
        match &self.cell {
            Cell::Full(entry) => f(entry),
            Cell::Packed { count, word } => {
                f(&Unpacked::packed(algorithm, Cell::load(count, word)))
            }
        }
    }

    /// Changes the entry (the state written under `algorithm`), and packs it again when it
    /// can be.
    #[inline]
    fn write<R>(&mut self, algorithm: &Compiled, f: impl FnOnce(&mut Unpacked) -> R) -> R {
        match &mut self.cell {
            Cell::Full(entry) => {
                let out = f(entry);
                if let Some(packed) = Cell::packing(algorithm, entry) {
                    self.cell = Cell::packed(packed);
                }
                out
            }
            Cell::Packed { count, word } => {
                let was = Cell::load(count, word);
                let mut entry = Unpacked::packed(algorithm, was);
                let out = f(&mut entry);
                match Cell::packing(algorithm, &entry) {
                    Some(packed) => Cell::set(count, word, packed),
                    None => self.cell = Cell::Full(Box::new(entry)),
                }
                out
            }
        }
    }

    /// The key's own limit, if one is set.
    fn limit(&self) -> Option<&Arc<Limit>> {
        match &self.cell {
            Cell::Full(entry) => entry.limit(),
            Cell::Packed { .. } => None,
        }
    }

    /// Converts a state written under another definition of the policy (before a reload), or
    /// under the key's own limit that has ended, to the check's (twin of `adopt` in
    /// `act.lua`). A key's own limit that has not ended stays, whatever the definition.
    fn adopt(&mut self, check: &CheckRef<'_>, now: u64, registry: &Registry) {
        let tier = check.tier();
        let limit = self.limit().cloned();
        let keeps = |l: &Limit| l.until > now && tier.algorithm().still_applies(l.tier.algorithm());
        if limit.as_deref().is_some_and(keeps) {
            self.def = tier.def();
            return;
        }
        // Read with the definition it was written under (the algorithm is the same: a
        // definition may not change it).
        let from = match &limit {
            Some(limit) => limit.tier.algorithm().clone(),
            None => registry.definition(self.def),
        };
        self.put_under(tier, &from, None, now);
    }
}

impl Shard {
    pub(super) fn new(hasher: RandomState) -> Self {
        Shard {
            hasher,
            table: HashTable::new(),
            ops: 0,
            last_sweep: 0,
            min_expiry: u64::MAX,
        }
    }

    /// How many rows keep their state packed.
    #[cfg(test)]
    pub(super) fn packed(&self) -> usize {
        self.table
            .iter()
            .filter(|r| matches!(r.cell, Cell::Packed { .. }))
            .count()
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    #[inline(always)]
    fn find(&self, check: &CheckRef<'_>, hash: u64) -> Option<&Row> {
        self.table
            .find(hash, |s| s.is(check.tier().id(), check.key()))
    }

    fn find_mut(&mut self, check: &CheckRef<'_>, hash: u64) -> Option<&mut Row> {
        self.table
            .find_mut(hash, |s| s.is(check.tier().id(), check.key()))
    }

    /// Adopts the state of `check`'s key under the check's definition, if it was written
    /// under another one.
    pub(super) fn adopt(&mut self, check: &CheckRef<'_>, hash: u64, now: u64, registry: &Registry) {
        if let Some(row) = self.find_mut(check, hash)
            && (row.def != check.tier().def() || row.limit().is_some())
        {
            row.adopt(check, now, registry);
        }
    }

    /// What an operation that acts on its own does, before any verdict (nothing for the
    /// others).
    pub(super) fn act(
        &mut self,
        check: &CheckRef<'_>,
        hash: u64,
        now: u64,
        capacity: usize,
        registry: &Registry,
    ) {
        let units = check.cost();
        match check.op() {
            Op::Refund => self.update(check, hash, |a, s| a.refund(s, now, units)),
            Op::Reset => self.remove(check, hash),
            Op::Penalize => self.commit(check, hash, now, capacity),
            Op::Block { us } => self.block(check, hash, now, now + us, capacity),
            Op::GiveBack { end } => {
                self.update(check, hash, |a, s| a.give_back(s, now, end, units))
            }
            Op::Release { at } => self.update(check, hash, |a, s| a.release(s, now, at, units)),
            Op::Settle { estimate } if units < estimate => {
                let back = estimate - units;
                self.update(check, hash, |a, s| a.refund(s, now, back));
            }
            Op::Limit { until } => {
                self.limit(check, hash, now, until, capacity, registry);
            }
            Op::Unlimit => {
                if let Some(row) = self.find_mut(check, hash) {
                    let from = match row.limit() {
                        Some(limit) => Some(limit.tier.algorithm().clone()),
                        None if row.def != check.tier().def() => Some(registry.definition(row.def)),
                        None => None,
                    };
                    if let Some(from) = from {
                        row.put_under(check.tier(), &from, None, now);
                    }
                }
            }
            Op::Settle { estimate } if units > estimate => {
                let owed = units - estimate;
                self.charge(check, hash, now, capacity, |a, s| a.debit(s, now, owed));
            }
            Op::Settle { .. }
            | Op::Enforce
            | Op::Shadow
            | Op::ChargeIf
            | Op::Concurrency
            | Op::Wait { .. }
            | Op::Lease { .. }
            | Op::Reserve { .. } => {}
        }
    }

    /// Charges `check`'s key with `charge` (which returns the state's new expiry), inserting
    /// the key when it is new. An expired state is handed to the algorithm as it is: for time
    /// that moves forward it is the same as a fresh key, and when the clock goes back the
    /// algorithm sees what the Redis script would see.
    fn charge(
        &mut self,
        check: &CheckRef<'_>,
        hash: u64,
        now: u64,
        capacity: usize,
        charge: impl FnOnce(&Compiled, &mut Option<State>) -> u64,
    ) {
        let algorithm = check.tier().algorithm();
        match self.find_mut(check, hash) {
            Some(row) => row.write(algorithm, |e| {
                e.change(algorithm, |a, s| (Some(charge(a, s)), ()));
            }),
            None => {
                let mut state = None;
                let expires_at = charge(algorithm, &mut state);
                let entry = Unpacked::unblocked(state, expires_at);
                self.insert_row(Row::new(check, entry), hash, now, capacity);
            }
        }
    }

    /// Blocks the key from `now` until `until`.
    fn block(&mut self, check: &CheckRef<'_>, hash: u64, now: u64, until: u64, capacity: usize) {
        let algorithm = check.tier().algorithm();
        match self.find_mut(check, hash) {
            Some(row) => row.write(algorithm, |e| {
                e.marks_mut().blocked_until = until;
                e.expires_at = e.expires_at.max(until);
            }),
            None => {
                let entry = Unpacked {
                    state: None,
                    expires_at: until,
                    marks: Some(Box::new(Marks {
                        blocked_until: until,
                        limit: None,
                        strikes: Default::default(),
                    })),
                };
                self.insert_row(Row::new(check, entry), hash, now, capacity);
            }
        }
    }

    /// Changes the state of `check`'s key with `change` (a refund, units given back), if
    /// there is one; `change` returns the new expiry, or `None` when nothing changed.
    fn update(
        &mut self,
        check: &CheckRef<'_>,
        hash: u64,
        change: impl FnOnce(&Compiled, &mut Option<State>) -> Option<u64>,
    ) {
        let algorithm = check.tier().algorithm();
        if let Some(row) = self.find_mut(check, hash)
            && let Some(expires_at) = row.write(algorithm, |e| {
                e.change(algorithm, |a, s| {
                    let expires_at = change(a, s);
                    (expires_at, expires_at)
                })
            })
        {
            self.min_expiry = self.min_expiry.min(expires_at);
        }
    }

    /// Charges the lease `check` refs for (its request admitted): what is left, at least the
    /// cost and at most the tier's lease size.
    fn take_lease(
        &mut self,
        check: &CheckRef<'_>,
        hash: u64,
        now: u64,
        want: u64,
        cap: usize,
    ) -> Lease {
        let algorithm = check.tier().algorithm();
        let ttl = lease_ttl(check);
        let cost = check.cost();
        match self.find_mut(check, hash) {
            // As a charge does, on the state as it is (see `charge`).
            Some(row) => row.write(algorithm, |e| {
                e.change(algorithm, |a, s| {
                    let lease = a.take_lease(s, now, ttl, cost, want);
                    (lease.expires_at, lease)
                })
            }),
            None => {
                let mut state = None;
                let lease = algorithm.take_lease(&mut state, now, ttl, cost, want);
                if let Some(expires_at) = lease.expires_at {
                    let entry = Unpacked::unblocked(state, expires_at);
                    self.insert_row(Row::new(check, entry), hash, now, cap);
                }
                lease
            }
        }
    }

    fn remove(&mut self, check: &CheckRef<'_>, hash: u64) {
        if let Ok(entry) = self
            .table
            .find_entry(hash, |s| s.is(check.tier().id(), check.key()))
        {
            entry.remove();
        }
    }

    /// Charges `check.cost()` (nothing for a look).
    fn commit(&mut self, check: &CheckRef<'_>, hash: u64, now: u64, capacity: usize) {
        let cost = check.cost();
        if cost > 0 {
            self.charge(check, hash, now, capacity, |a, s| a.commit(s, now, cost));
        }
    }

    /// Adds a row for a key not in the table, making room first when the shard is full.
    fn insert_row(&mut self, row: Row, hash: u64, now: u64, capacity: usize) {
        if self.table.len() >= capacity {
            self.make_room(now);
        }
        self.min_expiry = self.min_expiry.min(row.expires_at());
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, row, |s| s.key.hash_with(s.id, hasher));
    }

    /// Frees one row, looking at the first [`EVICTION_SAMPLE`] entries of the table (constant
    /// time, whatever the shard's size): an expired one if there is one; else, when an entry
    /// may have expired, a sweep of the whole shard; else the soonest to expire of those, a
    /// live key.
    fn make_room(&mut self, now: u64) {
        let sample = self
            .table
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|s| s.expires_at())
            .map(|s| {
                (
                    s.key.hash_with(s.id, &self.hasher),
                    s.id,
                    s.key.clone(),
                    s.expires_at(),
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

    pub(super) fn sweep(&mut self, now: u64) -> usize {
        let before = self.table.len();
        let mut min_expiry = u64::MAX;
        self.table.retain(|s| {
            let expires_at = s.expires_at();
            let keep = expires_at > now;
            if keep {
                min_expiry = min_expiry.min(expires_at);
            }
            keep
        });
        self.min_expiry = min_expiry;
        self.last_sweep = now;
        self.ops = 0;
        before - self.table.len()
    }

    /// Counts an operation and sweeps when it is time.
    pub(super) fn tick(&mut self, now: u64) {
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
fn lease_ttl(check: &CheckRef<'_>) -> u64 {
    check.tier().lease().map_or(0, |l| l.ttl_us())
}

#[cfg(test)]
mod tests {
    #[cfg_attr(loom, allow(unused_imports))]
    use super::*;

    #[test]
    #[cfg(not(loom))]
    fn a_row_fits_in_64_bytes() {
        // 64 bytes and a control byte, in a table at most 7/8 full: at most 96 bytes a key.
        assert!(size_of::<Row>() <= 64, "{} bytes", size_of::<Row>());
    }

    #[test]
    #[cfg(not(loom))]
    fn a_full_entry_takes_a_48_byte_allocation() {
        // glibc's malloc serves up to 40 bytes from a 48-byte chunk, 41 to 56 from a 64-byte
        // one: every algorithm's state is at most 16 bytes wide so that the entry fits.
        assert!(
            size_of::<Unpacked>() <= 40,
            "{} bytes",
            size_of::<Unpacked>()
        );
    }
}
