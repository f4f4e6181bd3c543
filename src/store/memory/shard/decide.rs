//! A decision's ways to its rows within one shard: one enforced check on a packed state under
//! the shared lock ([`Shard::alone_shared`], by `word.rs` or `claim.rs`), and the phases of
//! any check under the exclusive lock ([`Shard::judge_row`], [`Shard::charge_row`],
//! [`Shard::look_row`]), which `locked.rs` runs over the shards of a decision. The rule they
//! serve is `rule.rs`'s.

use super::atomic::{AtomicU32, AtomicU64};
use super::word::Word;
use super::{Cell, CheckRef, Row, Run, Shard, Unpacked};
use crate::algorithm::{Compiled, Verdict};
use crate::decision::Grant;
use crate::store::Op;
use crate::store::memory::rule;

impl Shard {
    /// One enforced check decided under the shared lock when its key's state is packed and
    /// written under its policy's definition: by compare-and-swap of its word, or with the
    /// word claimed when a count sits beside it ([`Word`]). The time is read from
    /// `clock` once the state is loaded. `None` when the key needs the exclusive lock: a new
    /// key, a state that is not packed, a state written under another definition, a denial
    /// that strikes (nothing written: the exclusive lock decides again).
    #[inline(always)]
    pub(crate) fn alone_shared(
        &self,
        check: &CheckRef<'_>,
        hash: u64,
        clock: impl Fn() -> u64,
    ) -> Option<Verdict> {
        let (word, algorithm, cost) = self.word_of(check, hash)?;
        let (verdict, struck) = if algorithm.packs_count() {
            let mut rows = Word::<_, true, false>::new(word, algorithm, cost, clock);
            rule::decide(&mut rows);
            (rows.verdict, rows.struck)
        } else {
            let mut rows = Word::<_, false, false>::new(word, algorithm, cost, clock);
            rule::decide(&mut rows);
            (rows.verdict, rows.struck)
        };
        // A strike is the exclusive lock's to make: it decides again.
        let strikes = struck && check.tier().escalation().is_some();
        (!strikes).then_some(verdict)
    }

    /// Whether [`alone_shared`](Self::alone_shared) admits and charges `check`, told without
    /// its verdict (nothing else of it is computed). `false` when it denies (nothing is
    /// written, a strike neither) or needs the exclusive lock.
    #[inline(always)]
    pub(crate) fn admits_shared(
        &self,
        check: &CheckRef<'_>,
        hash: u64,
        clock: impl Fn() -> u64,
    ) -> bool {
        let Some((word, algorithm, cost)) = self.word_of(check, hash) else {
            return false;
        };
        if algorithm.packs_count() {
            rule::decide(&mut Word::<_, true, true>::new(
                word, algorithm, cost, clock,
            ))
        } else {
            rule::decide(&mut Word::<_, false, true>::new(
                word, algorithm, cost, clock,
            ))
        }
    }

    /// The packed word (and count) of `check`'s row, with the algorithm and cost to decide
    /// it at; `None` when the word cannot decide (see [`alone_shared`](Self::alone_shared)).
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn word_of<'s, 'c>(
        &'s self,
        check: &'c CheckRef<'_>,
        hash: u64,
    ) -> Option<((&'s AtomicU64, &'s AtomicU32), &'c Compiled, u64)> {
        let row = self.find(check, hash)?;
        let Cell::Packed { count, word } = &row.cell else {
            return None;
        };
        if row.def != check.tier().def() {
            return None;
        }
        Some(((word, count), check.tier().algorithm(), check.cost()))
    }

    /// Phase one for `check` under the exclusive lock: finds its row once (phase two goes
    /// back to where it is) and leaves in `run` its verdict, at cost 0 for an operation that
    /// acted on its own; for a lease, on the state as strict as the lease could make it; for
    /// a wait denied now, the wait until the time that admits it.
    pub(crate) fn judge_row(&self, check: &CheckRef<'_>, run: &mut Run, now: u64) {
        let (tier, op) = (check.tier(), check.op());
        let bucket = self
            .table
            .find_bucket_index(run.hash, |r| r.is(tier.id(), check.key()));
        let row = bucket.and_then(|b| self.table.get_bucket(b));
        let cost = op.judged(check.cost());
        let algorithm = tier.algorithm();
        run.bucket = bucket;
        run.verdict = match row {
            // Decided on the word as the shared lock decides it: no state is unpacked.
            Some(Row {
                cell: Cell::Packed { count, word },
                def,
                ..
            }) if op == Op::Enforce && *def == tier.def() => {
                let was = Cell::load(count, word);
                let (verdict, next) = algorithm.judge_packed(was, now, cost);
                run.packed = Some((was, next));
                verdict
            }
            Some(row) => {
                run.own = row.limit().map(|l| l.tier.clone());
                row.read(algorithm, |e| Unpacked::verdict(Some(e), check, now, cost))
            }
            None => Unpacked::verdict(None, check, now, cost),
        };
        if let Op::Wait { max_wait_us } = op
            && !run.verdict.allowed
        {
            let read = |e: Option<&Unpacked>| booking(e, check, now, &run.verdict, max_wait_us);
            run.wait = match row {
                Some(row) => row.read(algorithm, |e| read(Some(e))),
                None => read(None),
            };
        }
    }

    /// Phase two for `check`, the request admitted: charged as its operation says (at its
    /// booked time, a lease, its cost), what it was granted left in `run`. A row phase one
    /// found is charged where it is; a new key is inserted (its caller makes these last).
    pub(crate) fn charge_row(
        &mut self,
        check: &CheckRef<'_>,
        run: &mut Run,
        now: u64,
        capacity: usize,
    ) {
        let (hash, cost, op) = (run.hash, check.cost(), check.op());
        let algorithm = check.tier().algorithm();
        if let Some(wait) = run.wait {
            let at = now + wait;
            self.charge(check, hash, now, capacity, |a, s| {
                a.book_commit(s, now, at, cost)
            });
            // Admitted, the state reported as it is seen now (a look may deny: the sliding log
            // still counts, now, entries that are gone at the booked time).
            let seen = self.look_row(check, run, now);
            run.verdict = Verdict::allow(seen.remaining, seen.reset_after_us);
            run.grant = Some(Grant::new(cost, at, wait));
        } else if let Op::Lease { want } = op {
            let lease = self.take_lease(check, hash, now, want, capacity);
            run.verdict = lease.verdict;
            run.grant = Some(Grant::new(lease.units, lease.end, lease.end - now));
        } else if cost > 0 {
            match run.bucket.and_then(|b| self.table.get_bucket_mut(b)) {
                Some(row) => match (&mut row.cell, run.packed) {
                    // Still as phase one found it: its charge as judged.
                    (Cell::Packed { count, word }, Some((was, next)))
                        if Cell::load(count, word) == was =>
                    {
                        Cell::set(count, word, next);
                    }
                    _ => row.write(algorithm, |e| {
                        e.change(algorithm, |a, s| (Some(a.commit(s, now, cost)), ()));
                    }),
                },
                None => self.commit(check, hash, now, capacity),
            }
            if op == Op::Concurrency {
                // The slots, charged now: given back as charged at `now`.
                run.grant = Some(Grant::new(cost, now, 0));
            }
        }
    }

    /// A look at `check`'s row (as phase one found it, or a new key's) as it is now: the
    /// verdict at cost 0.
    pub(crate) fn look_row(&self, check: &CheckRef<'_>, run: &Run, now: u64) -> Verdict {
        let algorithm = check.tier().algorithm();
        // A new key charged since phase one is found by its hash.
        let row = match run.bucket {
            Some(bucket) => self.table.get_bucket(bucket),
            None => self.find(check, run.hash),
        };
        match row {
            Some(row) => row.read(algorithm, |e| Unpacked::verdict(Some(e), check, now, 0)),
            None => Unpacked::verdict(None, check, now, 0),
        }
    }
}

/// For a check denied now with `verdict`: the wait until the time that admits it, if it is
/// within `max_wait` (a block's end included: the verdict's retry-after runs to it, so a
/// paused key's requests wait for it).
fn booking(
    entry: Option<&Unpacked>,
    check: &CheckRef<'_>,
    now: u64,
    verdict: &Verdict,
    max_wait: u64,
) -> Option<u64> {
    let tier = check.tier().algorithm();
    let state = entry.and_then(|e| e.live(now));
    let under = entry.map_or(tier, |e| e.algorithm(tier));
    under.booking(state, now, check.cost(), verdict, max_wait)
}
