//! One packed state without a count (a GCRA's) decided under the shard's shared lock by
//! compare-and-swap of its word: the common case, on which threads deciding one hot key never
//! wait for each other. A denial leaves the word as it was and writes nothing.

use std::sync::atomic::{AtomicU64, Ordering};

use super::claim::{CLAIMED, unclaimed};
use crate::algorithm::{Compiled, Packed, Verdict};
use crate::store::Op;
use crate::store::memory::rule::Rows;

/// The [`Rows`] of one enforced check whose state is `word`: loaded, judged, and written by
/// one compare-and-swap (another decision wrote it in between: judged again).
pub(super) struct Word<'a, C> {
    word: &'a AtomicU64,
    algorithm: &'a Compiled,
    cost: u64,
    clock: C,
    /// The word as loaded.
    current: u64,
    /// The word the decision leaves.
    next: u64,
    pub(super) verdict: Verdict,
}

impl<'a, C: Fn() -> u64> Word<'a, C> {
    pub(super) fn new(word: &'a AtomicU64, algorithm: &'a Compiled, cost: u64, clock: C) -> Self {
        Word {
            word,
            algorithm,
            cost,
            clock,
            current: 0,
            next: 0,
            verdict: Verdict::default(),
        }
    }
}

impl<C: Fn() -> u64> Rows for Word<'_, C> {
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
    /// `claim.rs`), then reads the time: decisions on the key see time in the order they land.
    #[inline(always)]
    fn open(&mut self) -> u64 {
        let mut current = self.word.load(Ordering::Acquire);
        if current == CLAIMED {
            current = unclaimed(self.word);
        }
        self.current = current;
        (self.clock)()
    }

    #[inline(always)]
    fn judge(&mut self, _: usize, now: u64) -> bool {
        let was = Packed::new(self.current, 0);
        let (verdict, next) = self.algorithm.decide_packed(was, now, self.cost);
        self.verdict = verdict;
        self.next = next.word();
        verdict.allowed
    }

    #[inline(always)]
    fn verdict(&mut self, _: usize) -> &mut Verdict {
        &mut self.verdict
    }

    /// The charge is written by [`close`](Rows::close).
    #[inline(always)]
    fn charge(&mut self, _: usize, _: u64) {}

    #[inline(always)]
    fn keep(&mut self, _: usize) {
        self.next = self.current;
    }

    fn look(&self, _: usize, now: u64) -> Verdict {
        let was = Packed::new(self.current, 0);
        self.algorithm.decide_packed(was, now, 0).0
    }

    #[inline(always)]
    fn close(&mut self) -> bool {
        self.next == self.current
            || self
                .word
                .compare_exchange_weak(self.current, self.next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}
