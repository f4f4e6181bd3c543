//! The decisions of enforced policies that take a shortcut: one decided under the shared lock
//! (by compare-and-swap, or with its word claimed), one under the exclusive lock with a single
//! lookup, and several decided beside each other under the exclusive lock
//! (`MemoryStore::decide_locked`), each row found once.

use super::claim::{self, CLAIMED, unclaimed};
use super::{Cell, CheckRef, Judged, Row, Shard, Unpacked};
use crate::algorithm::{Packed, Verdict};
use crate::store::Registry;

use std::sync::atomic::Ordering;

impl Shard {
    /// One enforced policy decided under the shared lock by compare-and-swap of its packed
    /// state's word, or, when the state has a count too, with the word claimed while both
    /// change (see `claim.rs`). The time is read from `clock` after each load of the state, so
    /// decisions on a key see time in the order they land (a decision that loads a state
    /// another one wrote reads the time after it). `None` when the key needs the exclusive
    /// path: a new key, a state that is not packed, a state written under another definition.
    #[inline]
    pub(in crate::store::memory) fn decide_packed(
        &self,
        check: &CheckRef<'_>,
        hash: u64,
        clock: impl Fn() -> u64,
    ) -> Option<Verdict> {
        let slot = self.find(check, hash)?;
        let Cell::Packed { count, word } = &slot.cell else {
            return None;
        };
        if slot.def != check.tier().def() {
            return None;
        }
        let algorithm = check.tier().algorithm();
        let cost = check.cost();
        if algorithm.packs_count() {
            return Some(claim::decide(count, word, |packed| {
                algorithm.decide_packed(packed, clock(), cost)
            }));
        }
        let mut current = word.load(Ordering::Acquire);
        loop {
            if current == CLAIMED {
                // A decision of several policies of the key holds it for a moment
                // (`claim.rs`).
                current = unclaimed(word);
            }
            let packed = Packed::new(current, 0);
            let (verdict, next) = algorithm.decide_packed(packed, clock(), cost);
            if next.word() == current {
                return Some(verdict);
            }
            let next = next.word();
            match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(verdict),
                Err(seen) => current = seen,
            }
        }
    }

    /// One enforced policy under the exclusive lock: evaluate and commit with a single lookup.
    pub(in crate::store::memory) fn decide_one(
        &mut self,
        check: &CheckRef<'_>,
        hash: u64,
        now: u64,
        capacity: usize,
        registry: &Registry,
    ) -> Option<Verdict> {
        let algorithm = check.tier().algorithm();
        let cost = check.cost();
        let verdict = match self.find_mut(check, hash) {
            Some(slot) => {
                if slot.def != check.tier().def() || slot.limit().is_some() {
                    slot.adopt(check, now, registry);
                    if slot.limit().is_some() {
                        // Its own limit, which the outcome reports: the general way.
                        return None;
                    }
                }
                slot.write(algorithm, |e| {
                    let verdict = Unpacked::verdict(Some(e), check, now, cost);
                    if verdict.allowed && cost > 0 {
                        // As `charge` does, on the state as it is.
                        e.change(algorithm, |a, s| (Some(a.commit(s, now, cost)), ()));
                    }
                    verdict
                })
            }
            None => {
                let verdict = algorithm.evaluate(None, now, cost);
                if verdict.allowed && cost > 0 {
                    self.commit(check, hash, now, capacity);
                }
                verdict
            }
        };
        self.tick(now);
        Some(verdict)
    }

    /// Phase one of an enforced check decided beside others (`MemoryStore::decide_together`):
    /// where its row is in the table (none for a new key), for phase two to find it without
    /// hashing again, its verdict, and for a packed state the word its charge would leave;
    /// `None` for a key under a limit of its own, which the general path decides (its outcome
    /// reports that limit).
    #[inline]
    pub(in crate::store::memory) fn judge(
        &self,
        check: &CheckRef<'_>,
        hash: u64,
        now: u64,
    ) -> Option<Judged> {
        let bucket = self
            .table
            .find_bucket_index(hash, |s| s.is(check.tier().id(), check.key()));
        let algorithm = check.tier().algorithm();
        let cost = check.cost();
        let (verdict, charged) = match bucket.and_then(|b| self.table.get_bucket(b)) {
            Some(row) if row.limit().is_some() => return None,
            // Decided on the word as the shared path decides it: no state is unpacked.
            Some(Row {
                cell: Cell::Packed { count, word },
                def,
                ..
            }) if *def == check.tier().def() => {
                let (verdict, next) = algorithm.decide_packed(Cell::load(count, word), now, cost);
                (verdict, Some(next))
            }
            Some(row) => (
                row.read(algorithm, |e| Unpacked::verdict(Some(e), check, now, cost)),
                None,
            ),
            None => (Unpacked::verdict(None, check, now, cost), None),
        };
        Some(Judged {
            bucket,
            verdict,
            charged,
        })
    }

    /// Phase two of the same for a key that has a row, at its place `judged.bucket` (no row
    /// was inserted or removed since phase one): charged when the request is `admitted`,
    /// else, when this policy admitted it, the verdict reports the state as it stays (as
    /// `apply`).
    #[inline]
    pub(in crate::store::memory) fn settle_at(
        &mut self,
        check: &CheckRef<'_>,
        bucket: usize,
        now: u64,
        admitted: bool,
        judged: &mut Judged,
    ) {
        let algorithm = check.tier().algorithm();
        let cost = check.cost();
        let row = self
            .table
            .get_bucket_mut(bucket)
            .expect("the row found in phase one is where it was");
        let verdict = &mut judged.verdict;
        if admitted && cost > 0 {
            match (&mut row.cell, judged.charged) {
                // Nothing changed the word since: the exclusive lock is held.
                (Cell::Packed { count, word }, Some(next)) => Cell::set(count, word, next),
                _ => row.write(algorithm, |e| {
                    e.change(algorithm, |a, s| (Some(a.commit(s, now, cost)), ()));
                }),
            }
        } else if verdict.allowed && cost > 0 {
            verdict.uncharged(row.read(algorithm, |e| Unpacked::verdict(Some(e), check, now, 0)));
        }
    }

    /// Phase two of the same for a new key: inserted with its charge when the request is
    /// `admitted`, else reported as a fresh key (as `apply`).
    pub(in crate::store::memory) fn settle_new(
        &mut self,
        check: &CheckRef<'_>,
        hash: u64,
        now: u64,
        admitted: bool,
        verdict: &mut Verdict,
        capacity: usize,
    ) {
        if admitted {
            self.commit(check, hash, now, capacity);
        } else if verdict.allowed && check.cost() > 0 {
            verdict.uncharged(check.tier().algorithm().evaluate(None, now, 0));
        }
    }
}
