//! Several packed policies of one key decided under the shard's shared lock: each word is
//! claimed (swapped for [`CLAIMED`]), every policy judged, then every word written back,
//! charged only if every policy admits.
//!
//! A claim is held for a few dozen instructions and never across a lock, an allocation or a
//! call that can block: the claimer already holds its shared lock, and takes nothing else
//! until it has written every word back. Two claimers take their words in the order of their
//! addresses, so neither holds a word the other waits for while waiting for one it holds. A
//! decision of one of these policies on its own (`Shard::decide_packed`) that finds a word
//! claimed waits for it, as it would for the exclusive lock. The exclusive lock waits for every
//! shared holder, so nothing under it ever sees a claimed word.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::Backoff;
use smallvec::SmallVec;

use super::{Cell, CheckRef, Shard, Together};
use crate::store::Enforced;

/// A packed word while a decision of several policies holds it. No packed state is this value:
/// it would be a state that expires at the end of time.
pub(super) const CLAIMED: u64 = u64::MAX;

/// Waits until `word` is no longer claimed; its value then. Cold: a claim lasts a few dozen
/// instructions, and only decisions of several packed policies of one key make one.
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

impl Shard {
    /// Several enforced policies of one key in this shard, every state packed and written
    /// under its policy's definition, decided under the shared lock (see the module's
    /// comment). Each run gets its verdict; the answer is whether the request is admitted.
    /// The time is read once every word is claimed, so that decisions on these words see
    /// time in the order they land. `None`, having claimed nothing, when a state is not
    /// packed (a new key, another algorithm, a block, a key's own limit), was written under
    /// another definition, or two checks are of one row: the exclusive path decides those.
    pub(in crate::store::memory) fn decide_claimed(
        &self,
        checks: &[Enforced<'_>],
        runs: &mut [Together],
        clock: impl Fn() -> u64,
    ) -> Option<bool> {
        // Each check's word, its place among the checks, and (once claimed) its value and the
        // value the request's charge leaves.
        let mut words: SmallVec<[(&AtomicU64, usize, u64, u64); 4]> = SmallVec::new();
        for (i, (&(tier, key, cost), run)) in checks.iter().zip(runs.iter()).enumerate() {
            let row = self.find(&CheckRef::enforce(tier, key, cost), run.hash)?;
            match &row.cell {
                Cell::Packed(word) if row.def == tier.def() => words.push((word, i, 0, 0)),
                _ => return None,
            }
        }
        words.sort_unstable_by_key(|&(word, ..)| std::ptr::from_ref(word).addr());
        if words.windows(2).any(|w| std::ptr::eq(w[0].0, w[1].0)) {
            return None;
        }
        for (word, _, was, _) in &mut words {
            *was = claim(word);
        }
        let now = clock();
        let mut admitted = true;
        for (_, i, was, next) in &mut words {
            let (tier, _, cost) = checks[*i];
            let verdict;
            (verdict, *next) = tier.algorithm().decide_packed(*was, now, cost);
            admitted &= verdict.allowed;
            runs[*i].judged.verdict = verdict;
        }
        for &(word, i, was, next) in &words {
            if admitted {
                word.store(next, Ordering::Release);
                continue;
            }
            word.store(was, Ordering::Release);
            let (tier, _, cost) = checks[i];
            let verdict = &mut runs[i].judged.verdict;
            if verdict.allowed && cost > 0 {
                // Admitted by this policy but not charged (as `apply`).
                verdict.uncharged(tier.algorithm().decide_packed(was, now, 0).0);
            }
        }
        Some(admitted)
    }
}
