//! One enforced check on a packed state decided under the shard's shared lock: the common
//! case. A state without a count (a GCRA's) is decided by compare-and-swap of its word, so
//! threads deciding one hot key never wait for each other, and a denial writes nothing; a
//! state with a count beside its word (a fixed window's) with the word claimed while both
//! change (`claim.rs`).

use std::sync::atomic::Ordering;

use super::atomic::{AtomicU32, AtomicU64};

use super::claim::{CLAIMED, claim, give_back, unclaimed};
use crate::algorithm::{Compiled, Packed, Verdict};
use crate::store::Op;
use crate::store::memory::rule::Rows;

/// The [`Rows`] of one enforced check whose state is `word` (and `count`, when `COUNTED`):
/// loaded, judged, and written by one compare-and-swap (another decision wrote it in between:
/// judged again); or, with a count, claimed, judged and written back. `QUIET`: only whether
/// it is admitted is kept (`verdict.allowed`), so nothing else of the verdict is computed.
pub(super) struct Word<'a, C, const COUNTED: bool, const QUIET: bool> {
    word: &'a AtomicU64,
    count: &'a AtomicU32,
    algorithm: &'a Compiled,
    cost: u64,
    clock: C,
    /// The word and count as loaded (the count 0 unless `COUNTED`).
    current: u64,
    current_count: u32,
    /// The state the decision leaves.
    next: Packed,
    pub(super) verdict: Verdict,
    /// Denied: the rule asked for a strike, which a packed word cannot hold (the caller
    /// hands a policy that blocks on violation to the exclusive lock; nothing was written).
    pub(super) struck: bool,
}

impl<'a, C: Fn() -> u64, const COUNTED: bool, const QUIET: bool> Word<'a, C, COUNTED, QUIET> {
    #[inline(always)]
    pub(super) fn new(
        (word, count): (&'a AtomicU64, &'a AtomicU32),
        algorithm: &'a Compiled,
        cost: u64,
        clock: C,
    ) -> Self {
        Word {
            word,
            count,
            algorithm,
            cost,
            clock,
            current: 0,
            current_count: 0,
            next: Packed::default(),
            verdict: Verdict::default(),
            struck: false,
        }
    }
}

impl<C, const COUNTED: bool, const QUIET: bool> Word<'_, C, COUNTED, QUIET> {
    /// The state as loaded.
    #[inline(always)]
    fn was(&self) -> Packed {
        Packed::new(self.current, if COUNTED { self.current_count } else { 0 })
    }
}

impl<C: Fn() -> u64, const COUNTED: bool, const QUIET: bool> Rows for Word<'_, C, COUNTED, QUIET> {
    #[inline(always)]
    fn len(&self) -> usize {
        1
    }

    #[inline(always)]
    fn op(&self, _: usize) -> Op {
        Op::Enforce
    }

    #[inline(always)]
    fn cost(&self, _: usize) -> u64 {
        self.cost
    }

    /// Loads the word (waiting while a decision of several policies of the key holds it:
    /// `claim.rs`), or claims it when it has a count, then reads the time: decisions on the
    /// key see time in the order they land.
    #[inline(always)]
    fn open(&mut self) -> u64 {
        if COUNTED {
            self.current = claim(self.word);
            self.current_count = self.count.load(Ordering::Relaxed);
        } else {
            self.current = self.word.load(Ordering::Acquire);
            if self.current == CLAIMED {
                self.current = unclaimed(self.word);
            }
        }
        (self.clock)()
    }

    #[inline(always)]
    fn judge(&mut self, _: usize, now: u64) -> bool {
        let verdict;
        (verdict, self.next) = self.algorithm.judge_packed(self.was(), now, self.cost);
        if QUIET {
            self.verdict.allowed = verdict.allowed;
        } else {
            self.verdict = verdict;
        }
        verdict.allowed
    }

    #[inline(always)]
    fn allowed(&self, _: usize) -> bool {
        self.verdict.allowed
    }

    fn uncharged(&mut self, _: usize, stays: Verdict) {
        self.verdict.uncharged(stays);
    }

    /// The charge is written by [`close`](Rows::close).
    #[inline(always)]
    fn charge(&mut self, _: usize, _: u64) {}

    #[inline(always)]
    fn leave(&mut self, _: usize) {
        self.next = self.was();
    }

    fn look(&self, _: usize, now: u64) -> Verdict {
        self.algorithm.judge_packed(self.was(), now, 0).0
    }

    /// A packed word holds no strikes: noted, for the caller.
    #[cold]
    fn strike(&mut self, _: usize, _: u64) {
        self.struck = true;
    }

    #[inline(always)]
    fn close(&mut self) -> bool {
        let (current, next) = (self.current, self.next.word());
        if COUNTED {
            self.count.store(self.next.count(), Ordering::Relaxed);
            give_back(self.word, next);
            return true;
        }
        next == current
            || self
                .word
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}
