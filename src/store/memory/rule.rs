//! The rule every decision of the memory store follows, whichever way it reaches its rows.
//!
//! Phase one judges each check on its key's state as it is: its verdict at its cost (an
//! operation that acts on its own, a refund or a block, has acted before, and is judged as a
//! look). The request is admitted when every check that decides admits it, or, waiting, admits
//! it at a later time. Phase two charges each check as its operation says when the request is
//! admitted; otherwise nothing is charged, and a check whose policy admitted the request
//! reports its state as it stays (a look at cost 0), not as its charge would have left it.
//! A request denied, each enforced check that denied it strikes its key when its policy
//! blocks on violation ([`Policy::block_on_violation`](crate::Policy::block_on_violation)):
//! the strike is part of the rule, so every way to the rows makes it or hands the decision to
//! one that can.
//!
//! How a decision reaches its rows is a [`Rows`]: one packed word by compare-and-swap
//! (`shard/word.rs`), packed words claimed under the shard's shared lock (`shard/claim.rs`),
//! or any rows under the exclusive locks of their shards (`locked.rs`). [`decide`] is
//! generic over it, so each way is compiled with the rule inlined into it and pays nothing
//! for the indirection; none of them decides anything on its own.

use crate::algorithm::Verdict;
use crate::store::Op;

/// How one decision reaches the rows of its checks, and what it keeps of each between the
/// phases (see the module's comment).
pub(super) trait Rows {
    /// How many checks the decision has.
    fn len(&self) -> usize;

    /// Check `i`'s operation.
    fn op(&self, i: usize) -> Op;

    /// Check `i`'s cost.
    fn cost(&self, i: usize) -> u64;

    /// Takes hold of the rows (loads or claims their words; makes the operations that act on
    /// their own) and reads the time the decision is made at.
    fn open(&mut self) -> u64;

    /// Phase one for check `i`: judges it, keeping its verdict; whether it lets the request
    /// go on (its verdict admits it, it waits, or it does not decide).
    fn judge(&mut self, i: usize, now: u64) -> bool;

    /// Whether check `i`'s verdict admits the request.
    fn allowed(&self, i: usize) -> bool;

    /// Check `i` admitted the request but was not charged: its verdict reports the state as
    /// it `stays` (see [`Verdict::uncharged`]).
    fn uncharged(&mut self, i: usize, stays: Verdict);

    /// Phase two, the request admitted: charges check `i` as its operation says.
    fn charge(&mut self, i: usize, now: u64);

    /// Phase two, check `i` not charged: its row is left as it was.
    fn leave(&mut self, i: usize);

    /// A look at check `i`'s row as it stays, not charged: the verdict at cost 0.
    fn look(&self, i: usize, now: u64) -> Verdict;

    /// Check `i`, enforced, denied the request: its key's strike, when its policy blocks on
    /// violation (counted, and at the count a block, which becomes its verdict). A way that
    /// cannot write a strike (packed words) notes it, and its caller hands the decision to
    /// the exclusive locks, which make it again.
    fn strike(&mut self, i: usize, now: u64);

    /// Ends the decision; whether it stands (`false`: another decision changed a row since
    /// [`open`](Self::open), and this one is made again).
    fn close(&mut self) -> bool;
}

/// The rule: judge every check, admit when each one that decides admits, then charge every
/// check or none, an admitting check left uncharged reporting its state as it stays; denied,
/// each enforced check that denied strikes. Whether the request is admitted; each check's
/// verdict is left in `rows`.
#[inline(always)]
pub(super) fn decide(rows: &mut impl Rows) -> bool {
    loop {
        let now = rows.open();
        let mut admitted = true;
        for i in 0..rows.len() {
            // `&=`, not `&&`: every check is judged (its verdict is reported).
            admitted &= rows.judge(i, now);
        }
        for i in 0..rows.len() {
            let op = rows.op(i);
            let allowed = rows.allowed(i);
            if admitted && op.charged(allowed) {
                rows.charge(i, now);
            } else {
                rows.leave(i);
                if allowed && rows.cost(i) > 0 && !op.acts() {
                    let stays = rows.look(i, now);
                    rows.uncharged(i, stays);
                }
            }
        }
        if !admitted {
            for i in 0..rows.len() {
                if !rows.allowed(i) && rows.op(i) == Op::Enforce {
                    rows.strike(i, now);
                }
            }
        }
        if rows.close() {
            return admitted;
        }
    }
}
