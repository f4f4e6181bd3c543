//! Packed states decided under the shard's shared lock by claiming their words (swapping them
//! for [`CLAIMED`]): several policies of one key (every policy judged, then every word written
//! back, charged only if every policy admits), and one policy whose packed state has a count
//! beside its word (a fixed window's), so that the two change together.
//!
//! A claim is held for a few dozen instructions and never across a lock, an allocation or a
//! call that can block: the claimer already holds its shared lock, and takes nothing else
//! until it has written every word back. Two claimers take their words in the order of their
//! addresses, so neither holds a word the other waits for while waiting for one it holds. A
//! decision by compare-and-swap (`Shard::decide_packed`) that finds a word claimed waits for
//! it, as it would for the exclusive lock. A count is read and written only by the holder of
//! its word's claim (or under the exclusive lock): written before the word is given back, it
//! is seen by whoever claims the word next. The exclusive lock waits for every
//! shared holder, so nothing under it ever sees a claimed word.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::Backoff;

use super::{Cell, CheckRef, Shard};
use crate::algorithm::{Packed, Verdict};
use crate::decision::{Decision, Outcomes, PolicyOutcome};
use crate::key::Key;
use crate::store::Enforced;
use crate::store::memory::TOGETHER;

/// A packed word while a decision holds it. No packed state is this value:
/// it would be a state that expires at the end of time.
pub(super) const CLAIMED: u64 = u64::MAX;

/// Waits until `word` is no longer claimed; its value then. Cold: a claim lasts a few dozen
/// instructions, and only decisions of several packed policies of one key, or of a packed
/// state with a count, make one.
#[cold]
#[inline(never)]
pub(super) fn unclaimed(word: &AtomicU64) -> u64 {
    let backoff = Backoff::new();
    loop {
        backoff.snooze();
        let current = word.load(Ordering::Acquire);
        if current != CLAIMED {
            return current;
        }
    }
}

/// Claims `word`: its value, the word left [`CLAIMED`] until the caller writes it back.
fn claim(word: &AtomicU64) -> u64 {
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

/// One policy's packed state (`count` beside `word`) decided by `decide` with the word claimed:
/// the verdict, the state `decide` leaves written back.
#[inline]
pub(super) fn decide(
    count: &AtomicU32,
    word: &AtomicU64,
    decide: impl FnOnce(Packed) -> (Verdict, Packed),
) -> Verdict {
    let was = Packed::new(claim(word), count.load(Ordering::Relaxed));
    let (verdict, next) = decide(was);
    count.store(next.count(), Ordering::Relaxed);
    word.store(next.word(), Ordering::Release);
    verdict
}

impl Shard {
    /// Several enforced policies of one key (whose hash, [`Key::hash_in`], is `key_hash`) in
    /// this shard, every state packed and written under its policy's definition, decided under
    /// the shared lock (see the module's comment): the decision, each outcome built as its
    /// policy is decided. The time is read once every word is claimed, so that decisions on
    /// these words see time in the order they land. `None`, having claimed nothing, when a
    /// state is not packed (a new key, another algorithm, a block, a key's own limit), was
    /// written under another definition, or two checks are of one row: the exclusive path
    /// decides those.
    ///
    /// [`Key::hash_in`]: crate::key::Key::hash_in
    pub(in crate::store::memory) fn decide_claimed(
        &self,
        checks: &[Enforced<'_>],
        key_hash: u64,
        clock: impl Fn() -> u64,
    ) -> Option<Decision> {
        // Each check's cell (its word and count), in the checks' order; in arrays, which cost
        // fewer instructions than vectors for the two to four checks there are.
        let mut cells: [Option<(&AtomicU64, &AtomicU32)>; TOGETHER] = [None; TOGETHER];
        if checks.len() > TOGETHER {
            return None;
        }
        for (&(tier, key, cost), cell) in checks.iter().zip(&mut cells) {
            let hash = Key::with_id(key_hash, tier.id());
            let row = self.find(&CheckRef::enforce(tier, key, cost), hash)?;
            match &row.cell {
                Cell::Packed { count, word } if row.def == tier.def() => {
                    *cell = Some((word, count));
                }
                _ => return None,
            }
        }
        let cells = &cells[..checks.len()];
        let address = |i: usize| cells[i].map_or(0, |(word, _)| std::ptr::from_ref(word).addr());
        let mut order = [0, 1, 2, 3];
        let order = &mut order[..checks.len()];
        match &mut *order {
            // Two, the usual number: a sort's loop costs them about 30 instructions.
            [a, b] if address(*a) > address(*b) => std::mem::swap(a, b),
            [_, _] => {}
            more => more.sort_unstable_by_key(|&i| address(i)),
        }
        if order.windows(2).any(|w| address(w[0]) == address(w[1])) {
            return None;
        }
        // Each check's state as claimed, and the state its charge leaves.
        let mut was = [Packed::default(); TOGETHER];
        for &i in order.iter() {
            if let Some((word, count)) = cells[i] {
                was[i] = Packed::new(claim(word), count.load(Ordering::Relaxed));
            }
        }
        let now = clock();
        let mut admitted = true;
        let mut next = [Packed::default(); TOGETHER];
        let mut outcomes = Outcomes::new();
        for (i, &(tier, _, cost)) in checks.iter().enumerate() {
            let verdict;
            (verdict, next[i]) = tier.algorithm().decide_packed(was[i], now, cost);
            admitted &= verdict.allowed;
            outcomes.push(PolicyOutcome::new(tier, false, verdict));
        }
        for (i, ((&(tier, _, cost), cell), outcome)) in
            checks.iter().zip(cells).zip(&mut outcomes).enumerate()
        {
            let Some((word, count)) = cell else {
                continue;
            };
            if admitted {
                count.store(next[i].count(), Ordering::Relaxed);
                word.store(next[i].word(), Ordering::Release);
                continue;
            }
            // The count is as it was.
            word.store(was[i].word(), Ordering::Release);
            if outcome.is_allowed() && cost > 0 {
                // Admitted by this policy but not charged (as `apply`).
                outcome.uncharged(tier.algorithm().decide_packed(was[i], now, 0).0);
            }
        }
        Some(Decision::enforced(outcomes, admitted))
    }
}
