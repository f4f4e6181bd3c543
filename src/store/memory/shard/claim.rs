//! Packed states decided under the shard's shared lock by claiming their words (swapping them
//! for [`CLAIMED`]): several policies of one key (every policy judged, then every word written
//! back, charged only if every policy admits), and one policy whose packed state has a count
//! beside its word (a fixed window's), so that the two change together.
//!
//! A claim is held for a few dozen instructions and never across a lock, an allocation or a
//! call that can block: the claimer already holds its shared lock, and takes nothing else
//! until it has written every word back. Two claimers take their words (all of one key) in
//! the order of their policies' ids, so neither holds a word the other waits for while waiting for one it holds. A
//! decision by compare-and-swap (`word.rs`) that finds a word claimed waits for
//! it, as it would for the exclusive lock. A count is read and written only by the holder of
//! its word's claim (or under the exclusive lock): written before the word is given back, it
//! is seen by whoever claims the word next. The exclusive lock waits for every
//! shared holder, so nothing under it ever sees a claimed word.

use std::sync::atomic::Ordering;

use super::atomic::{AtomicU32, AtomicU64};

#[cfg(not(loom))]
use crossbeam_utils::Backoff;

use super::{Cell, Shard};
use crate::algorithm::{Packed, Verdict};
use crate::decision::{Decision, Outcomes, PolicyOutcome};
use crate::key::Key;
use crate::store::memory::rule::{self, Rows};
use crate::store::{Enforced, Op};

/// The most enforced policies decided together with their words claimed (the usual request
/// of several); more take the exclusive locks.
pub(crate) const TOGETHER: usize = 4;

/// A packed word while a decision holds it. No packed state is this value:
/// it would be a state that expires at the end of time.
pub(super) const CLAIMED: u64 = u64::MAX;

/// Waits until `word` is no longer claimed; its value then. Cold: a claim lasts a few dozen
/// instructions, and only decisions of several packed policies of one key, or of a packed
/// state with a count, make one.
#[cold]
#[inline(never)]
pub(super) fn unclaimed(word: &AtomicU64) -> u64 {
    #[cfg(not(loom))]
    let backoff = Backoff::new();
    loop {
        // Under the model checker, a wait it can see.
        #[cfg(loom)]
        loom::thread::yield_now();
        #[cfg(not(loom))]
        backoff.snooze();
        let current = word.load(Ordering::Acquire);
        if current != CLAIMED {
            return current;
        }
    }
}

/// Claims `word`: its value, the word left [`CLAIMED`] until the caller writes it back.
pub(super) fn claim(word: &AtomicU64) -> u64 {
    let mut current = word.load(Ordering::Acquire);
    loop {
        if current == CLAIMED {
            current = unclaimed(word);
        }
        match word.compare_exchange_weak(current, CLAIMED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return current,
            Err(seen) => current = seen,
        }
    }
}

/// Gives a claimed `word` back, holding `value`: whoever claims or loads it next sees what
/// was written before (the count among it).
#[inline(always)]
pub(super) fn give_back(word: &AtomicU64, value: u64) {
    // The model checker's own bookkeeping fails on a plain store after another thread's
    // read-modify-write of the same word (tokio-rs/loom#252); a swap orders the same.
    #[cfg(loom)]
    word.swap(value, Ordering::Release);
    #[cfg(not(loom))]
    word.store(value, Ordering::Release);
}

/// The [`Rows`] of packed states decided with their words claimed (see the module's comment):
/// at most `N` checks of one key, each one's word and count, claimed in the order of their
/// policies' ids.
pub(super) struct Claimed<'a, C, const N: usize> {
    checks: &'a [Enforced<'a>],
    cells: [Option<(&'a AtomicU64, &'a AtomicU32)>; N],
    order: [usize; N],
    clock: C,
    /// Each state as claimed, and as its charge leaves it.
    was: [Packed; N],
    next: [Packed; N],
    /// Each check's outcome, pushed as it is judged.
    pub(super) outcomes: Outcomes,
    /// Denied by a policy that blocks on violation: the strike needs the exclusive locks,
    /// which decide again (every word was given back as it was).
    pub(super) to_strike: bool,
}

impl<'a, C: Fn() -> u64, const N: usize> Claimed<'a, C, N> {
    /// The checks (at most `N`, of one key) and each one's cell, to be claimed in the order of
    /// their policies' ids ([`ordered`](Self::ordered)).
    #[inline(always)]
    pub(super) fn new(
        checks: &'a [Enforced<'a>],
        cells: [Option<(&'a AtomicU64, &'a AtomicU32)>; N],
        clock: C,
    ) -> Self {
        Claimed {
            checks,
            cells,
            order: std::array::from_fn(|i| i),
            clock,
            was: [Packed::default(); N],
            next: [Packed::default(); N],
            outcomes: Outcomes::new(),
            to_strike: false,
        }
    }

    /// Puts the checks in the order of their policies' ids; whether no two are of one word
    /// (claimed twice, it would wait for itself). The words claimed together are all of one
    /// key, so two claimers order their common words alike (and, unlike their addresses, the
    /// order is the same from run to run, which the model checker needs).
    #[inline(always)]
    pub(super) fn ordered(&mut self) -> bool {
        let checks = self.checks;
        let id = |i: usize| checks[i].0.id();
        let order = &mut self.order[..self.checks.len()];
        match &mut *order {
            [] | [_] => return true,
            // Two, the usual number: a sort's loop costs them about 30 instructions.
            [a, b] if id(*a) > id(*b) => std::mem::swap(a, b),
            [_, _] => {}
            more => more.sort_unstable_by_key(|&i| id(i)),
        }
        !order.windows(2).any(|w| id(w[0]) == id(w[1]))
    }
}

impl<C: Fn() -> u64, const N: usize> Rows for Claimed<'_, C, N> {
    #[inline(always)]
    fn len(&self) -> usize {
        // At most `N`, as the caller made it: said so that indexing needs no bounds check.
        self.checks.len().min(N)
    }

    #[inline(always)]
    fn op(&self, _: usize) -> Op {
        Op::Enforce
    }

    #[inline(always)]
    fn cost(&self, i: usize) -> u64 {
        self.checks[i].2
    }

    /// Claims every word, then reads the time: decisions on these words see time in the
    /// order they land.
    #[inline(always)]
    fn open(&mut self) -> u64 {
        for &i in &self.order[..self.checks.len()] {
            if let Some((word, count)) = self.cells[i] {
                self.was[i] = Packed::new(claim(word), count.load(Ordering::Relaxed));
            }
        }
        (self.clock)()
    }

    #[inline(always)]
    fn judge(&mut self, i: usize, now: u64) -> bool {
        let (tier, _, cost) = self.checks[i];
        let verdict;
        (verdict, self.next[i]) = tier.algorithm().judge_packed(self.was[i], now, cost);
        self.outcomes.push(PolicyOutcome::new(tier, false, verdict));
        verdict.allowed
    }

    #[inline(always)]
    fn allowed(&self, i: usize) -> bool {
        self.outcomes[i].is_allowed()
    }

    fn uncharged(&mut self, i: usize, stays: Verdict) {
        self.outcomes[i].uncharged(stays);
    }

    #[inline(always)]
    fn charge(&mut self, i: usize, _: u64) {
        if let Some((word, count)) = self.cells[i] {
            count.store(self.next[i].count(), Ordering::Relaxed);
            give_back(word, self.next[i].word());
        }
    }

    /// The word given back as it was; the count was not changed.
    #[inline(always)]
    fn leave(&mut self, i: usize) {
        if let Some((word, _)) = self.cells[i] {
            give_back(word, self.was[i].word());
        }
    }

    fn look(&self, i: usize, now: u64) -> Verdict {
        let tier = self.checks[i].0;
        tier.algorithm().judge_packed(self.was[i], now, 0).0
    }

    /// A packed word holds no strikes: the strike is left to the exclusive locks.
    #[cold]
    fn strike(&mut self, i: usize, _: u64) {
        self.to_strike |= self.checks[i].0.escalation().is_some();
    }

    #[inline(always)]
    fn close(&mut self) -> bool {
        true
    }
}

impl Shard {
    /// Several enforced policies of one key (whose hash, [`Key::hash_in`], is `key_hash`) in
    /// this shard, every state packed and written under its policy's definition, decided under
    /// the shared lock with their words claimed (see the module's comment): the decision.
    /// `None`, having claimed nothing, when a state is not packed (a new key, another
    /// algorithm, a block, a key's own limit), was written under another definition, or two
    /// checks are of one row; or, every word given back as it was, when a denial strikes: the
    /// exclusive locks serve those.
    ///
    /// [`Key::hash_in`]: crate::key::Key::hash_in
    pub(crate) fn together_shared(
        &self,
        checks: &[Enforced<'_>],
        key_hash: u64,
        clock: impl Fn() -> u64,
    ) -> Option<Decision> {
        if checks.len() > TOGETHER {
            return None;
        }
        // Each check's cell (its word and count), in the checks' order; in arrays, which cost
        // fewer instructions than vectors for the two to four checks there are.
        let mut cells: [Option<(&AtomicU64, &AtomicU32)>; TOGETHER] = [None; TOGETHER];
        for (&(tier, key, _), cell) in checks.iter().zip(&mut cells) {
            let hash = Key::with_id(key_hash, tier.id());
            // Its own search (not `Shard::find`'s), which the compiler keeps inline here.
            let row = self.table.find(hash, |r| r.is(tier.id(), key))?;
            match &row.cell {
                Cell::Packed { count, word } if row.def == tier.def() => {
                    *cell = Some((word, count));
                }
                _ => return None,
            }
        }
        let mut rows = Claimed::new(checks, cells, clock);
        if !rows.ordered() {
            return None;
        }
        let admitted = rule::decide(&mut rows);
        (!rows.to_strike).then(|| Decision::enforced(rows.outcomes, admitted))
    }
}
