//! Any decision under the exclusive locks of its keys' shards ([`Locked`]): a new key, a
//! state that does not pack, several keys, and every operation but an enforced check (leases,
//! waits, concurrency slots, what acts on its own). Each shard is locked once, in index
//! order, so that decisions of several shards cannot deadlock; each check's row is found once
//! (phase two goes back to where phase one found it).

use smallvec::SmallVec;

use super::lock::Write;
use super::rule::{self, Rows};
use super::shard::{CheckRef, Run, Shard};
use super::{MemoryInner, MemoryStore};
use crate::algorithm::Verdict;
use crate::key::Key;
use crate::store::Op;

/// The shards one decision locked, in index order.
type Guards<'a> = SmallVec<[Write<'a, Shard>; 2]>;

/// The checks' runs (two kept without allocating).
pub(super) type Runs = SmallVec<[Run; 2]>;

/// The [`Rows`] of a decision under the exclusive locks of its shards.
pub(super) struct Locked<'s, 'c> {
    inner: &'s MemoryInner,
    guards: Guards<'s>,
    checks: &'c [CheckRef<'c>],
    runs: Runs,
    now: u64,
}

impl MemoryStore {
    /// Decides `checks` under the exclusive locks of their shards: each check's run, with its
    /// verdict and what it was granted, and whether the request is admitted.
    pub(super) fn decide_locked(&self, checks: &[CheckRef<'_>]) -> (Runs, bool) {
        let mut runs = Runs::new();
        let mut order: SmallVec<[usize; 4]> = SmallVec::new();
        // A key is hashed once for the checks in a row that share it (all, for `check`).
        let mut last: Option<(&Key, u64)> = None;
        for c in checks {
            let key_hash = match last {
                Some((key, hash)) if std::ptr::eq(key, c.key()) || key == c.key() => hash,
                _ => c.key().hash_in(&self.inner.hasher),
            };
            last = Some((c.key(), key_hash));
            let shard = self.shard_of(key_hash);
            runs.push(Run::new(Key::with_id(key_hash, c.tier().id()), shard));
            order.push(shard);
        }
        let guards = self.lock_shards(&mut order, &mut runs);
        let mut locked = Locked {
            inner: &self.inner,
            guards,
            checks,
            runs,
            now: 0,
        };
        let admitted = rule::decide(&mut locked);
        (locked.runs, admitted)
    }

    /// Locks the shards of the indexes `order` (sorted here, each locked once), in index
    /// order; each run's shard index becomes its place among the guards.
    fn lock_shards(&self, order: &mut [usize], runs: &mut [Run]) -> Guards<'_> {
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
        for run in runs {
            run.set_guard(order[..locked].partition_point(|&s| s < run.guard()));
        }
        guards
    }
}

impl Rows for Locked<'_, '_> {
    #[inline]
    fn len(&self) -> usize {
        self.checks.len()
    }

    #[inline]
    fn op(&self, i: usize) -> Op {
        self.checks[i].op()
    }

    #[inline]
    fn cost(&self, i: usize) -> u64 {
        self.checks[i].cost()
    }

    /// Reads the time once the shards are locked, converts each state written under another
    /// definition (only in a store where a policy was ever redefined, or a key given a limit of
    /// its own), and makes the operations that act on their own, in order.
    fn open(&mut self) -> u64 {
        let now = self.inner.clock.now_micros();
        self.now = now;
        let registry = &self.inner.registry;
        let redefined = registry.redefined();
        let capacity = self.inner.per_shard;
        for (c, run) in self.checks.iter().zip(&self.runs) {
            let shard = &mut self.guards[run.guard()];
            // An operation that changes what the key is decided under converts from what the
            // state was written under itself (as the script does).
            if redefined && !c.op().relimits() {
                shard.adopt(c, run.hash(), now, registry);
            }
            if c.op().acts() {
                shard.act(c, run.hash(), now, capacity, registry);
            }
        }
        now
    }

    #[inline]
    fn judge(&mut self, i: usize, now: u64) -> bool {
        let (c, run) = (&self.checks[i], &mut self.runs[i]);
        self.guards[run.guard()].judge_row(c, run, now);
        run.verdict().allowed || run.is_waiting() || !c.op().decides()
    }

    #[inline]
    fn allowed(&self, i: usize) -> bool {
        self.runs[i].verdict().allowed
    }

    fn uncharged(&mut self, i: usize, stays: Verdict) {
        self.runs[i].verdict_mut().uncharged(stays);
    }

    /// A row phase one found is charged now; a new key once every found row is (an insert
    /// may move rows).
    #[inline]
    fn charge(&mut self, i: usize, now: u64) {
        let (c, run) = (&self.checks[i], &mut self.runs[i]);
        if run.found() {
            self.guards[run.guard()].charge_row(c, run, now, self.inner.per_shard);
        } else {
            run.defer();
        }
    }

    #[inline]
    fn leave(&mut self, _: usize) {}

    fn look(&self, i: usize, now: u64) -> Verdict {
        let run = &self.runs[i];
        self.guards[run.guard()].look_row(&self.checks[i], run, now)
    }

    /// After every look of phase two (a strike may insert a row, which may move the others).
    fn strike(&mut self, i: usize, now: u64) {
        let (c, run) = (&self.checks[i], &mut self.runs[i]);
        if let Some(escalation) = c.tier().escalation()
            && let Some(level) =
                self.guards[run.guard()].strike(c, run, now, self.inner.per_shard, escalation)
        {
            crate::telemetry::count_block(c.tier(), level);
        }
    }

    fn close(&mut self) -> bool {
        let (now, capacity) = (self.now, self.inner.per_shard);
        for (c, run) in self.checks.iter().zip(&mut self.runs) {
            if run.is_deferred() {
                self.guards[run.guard()].charge_row(c, run, now, capacity);
            }
        }
        for guard in &mut self.guards {
            guard.tick(now);
        }
        true
    }
}
