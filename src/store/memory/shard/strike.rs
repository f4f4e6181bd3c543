//! A key that keeps being denied, blocked for longer each time
//! ([`Policy::block_on_violation`](crate::Policy::block_on_violation)): the memory store's
//! twin of `strike` in `grant.lua`. The key's strikes are kept in its marks, beside its state.

use super::entry::Unpacked;
use super::{CheckRef, Row, Run, Shard};
use crate::algorithm::apply_block;
use crate::policy::Escalation;

impl Shard {
    /// After a decision, `check`'s denial (its run's verdict) by a policy that blocks on
    /// violation as `escalation` says: counted, and when it is the one that blocks, the key
    /// blocked and the verdict made the block's. A denial no wait would end (a cost above the
    /// capacity) is no violation. Returns the level of the block it started, if it did.
    pub(in crate::store::memory) fn strike(
        &mut self,
        check: &CheckRef<'_>,
        run: &mut Run,
        now: u64,
        capacity: usize,
        escalation: &Escalation,
    ) -> Option<u32> {
        let verdict = run.verdict();
        if verdict.allowed || verdict.retry_after_us.is_none() {
            return None;
        }
        let hash = run.hash();
        let algorithm = check.tier().algorithm();
        let started = match self.find_mut(check, hash) {
            Some(row) => row.write(algorithm, |entry| strike(entry, now, escalation)),
            None => {
                let mut entry = Unpacked::unblocked(None, now);
                let started = strike(&mut entry, now, escalation);
                self.insert_row(Row::new(check, entry), hash, now, capacity);
                started
            }
        };
        let (level, ends) = started?;
        apply_block(run.verdict_mut(), ends, now);
        Some(level)
    }
}

/// The strike on `entry` at `now`: none within a block (a denial under a block is none);
/// else one more
/// denial in the span (counted from its first), and at the escalation's count, a block of
/// the next level (the first again once `forget_after` has passed since the last). Returns
/// the level and end of the block it starts, if it does.
fn strike(entry: &mut Unpacked, now: u64, escalation: &Escalation) -> Option<(u32, u64)> {
    let (denials, within) = escalation.denials();
    let forget = escalation.forget_us();
    if entry.blocked_until() > now {
        return None;
    }
    let marks = entry.marks_mut();
    let s = &mut marks.strikes;
    if s.first.saturating_add(within) <= now {
        (s.denials, s.first) = (0, now);
    }
    s.denials += 1;
    let mut started = None;
    if s.denials >= denials {
        let again = s.last > 0 && s.last.saturating_add(forget) > now;
        s.level = if again {
            (s.level + 1).min(escalation.top_level())
        } else {
            1
        };
        let ends = now.saturating_add(escalation.block_us(s.level));
        (s.denials, s.first, s.last, s.until) = (0, now, now, ends);
        marks.blocked_until = marks.blocked_until.max(ends);
        started = Some((s.level, ends));
    }
    let s = marks.strikes;
    let keep = (s.first.saturating_add(within))
        .max(s.last.saturating_add(forget))
        .max(s.until);
    entry.expires_at = entry.expires_at.max(keep);
    started
}
