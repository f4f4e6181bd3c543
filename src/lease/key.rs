//! What this instance knows of each leased key: the lease being spent, the next one, and what
//! a check needs of them.

use std::sync::Arc;
use std::task::Waker;

use smallvec::SmallVec;

use crate::algorithm::Verdict;
use crate::decision::{Grant, PolicyOutcome};
use crate::policy::{LeaseSpec, Tier};
use crate::store::{Check, Checks, Op};

/// What one check needs, as the entries stand.
pub(super) enum Need {
    /// A lease here has room.
    Local,
    /// A lease to ask for: none here has room, or the one held runs low (asked for ahead of
    /// time, so the next is there before this one is spent).
    Ask,
    /// None here has room and another request is asking for one.
    Wait,
}

/// What this instance knows of one key of one leasing policy.
#[derive(Debug, Default)]
pub(super) struct KeyLeases {
    /// The lease being spent.
    pub(super) held: Option<Held>,
    /// A lease taken while `held` ran low, spent once `held` is spent or has ended.
    pub(super) next: Option<Held>,
    /// Whether a request of this instance is asking the store for a lease on this key.
    pub(super) asking: bool,
    /// The requests waiting for that answer.
    pub(super) waiters: Vec<Waker>,
    /// The units of the next lease: 0 for a key seen once (decided by the store as usual),
    /// then doubling as leases are taken, up to the policy's lease, and halving when a lease
    /// goes back mostly unspent. A key seen once costs what it costs without leases.
    pub(super) size: u64,
    /// Units of ended leases, with their ends, to give back with the next asking.
    pub(super) returns: SmallVec<[(u64, u64); 1]>,
    /// Until when (layer clock) the entry is worth keeping: a lease's life after the last
    /// lease ends, or two after the last asking.
    pub(super) keep_until: u64,
    /// What the store had left beyond the leases when it granted the latest, for the headers.
    pub(super) remaining: u64,
    /// When (layer clock) the key would be fully reset, as of the latest grant.
    pub(super) reset_at: u64,
}

/// A lease in hand.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    /// Units left to spend.
    pub(super) left: u64,
    /// Units granted.
    pub(super) size: u64,
    /// The last moment (layer clock) they may be spent.
    pub(super) until: u64,
    /// The lease's end on the store's clock, to give units back.
    pub(super) end: u64,
}

impl Held {
    pub(super) fn usable(&self, now: u64, cost: u64) -> bool {
        now <= self.until && self.left >= cost
    }

    /// Five sixths spent or more: time to ask for the next lease, so that it comes before
    /// this one is spent. (The next lease takes what this one has left off its size: asked for
    /// later, it comes too late more often; sooner, leases get smaller and store calls more
    /// frequent, one per five sixths of a lease at worst.)
    pub(super) fn low(&self) -> bool {
        self.left * 6 <= self.size
    }
}

impl KeyLeases {
    /// The lease a request of `cost` would spend now: the one held, else the next one.
    pub(super) fn usable(&self, now: u64, cost: u64) -> Option<&Held> {
        [&self.held, &self.next]
            .into_iter()
            .flatten()
            .find(|h| h.usable(now, cost))
    }

    /// Spends `cost` units, moving on to the next lease when the one held is spent or has
    /// ended (what it has left goes back with the next asking). Returns the lease's end and
    /// the request's verdict: what the store had left at the latest grant, plus the units
    /// in hand here.
    pub(super) fn spend(&mut self, now: u64, cost: u64) -> Option<(u64, Verdict)> {
        if !self.held.is_some_and(|h| h.usable(now, cost)) {
            let next = self.next.filter(|n| n.usable(now, cost))?;
            self.next = None;
            if let Some(old) = self.held.replace(next) {
                self.retire(old);
            }
        }
        let held = self.held.as_mut()?;
        held.left -= cost;
        let end = held.end;
        let in_hand = self.in_hand(now);
        let verdict = Verdict::allow(self.remaining + in_hand, self.reset_at.saturating_sub(now));
        Some((end, verdict))
    }

    /// Units in the leases here that may still be spent.
    pub(super) fn in_hand(&self, now: u64) -> u64 {
        [&self.held, &self.next]
            .into_iter()
            .flatten()
            .filter(|h| now <= h.until)
            .map(|h| h.left)
            .sum()
    }

    /// A lease this instance is done with: its units left go back with the next asking, and
    /// a lease that went back mostly unspent halves the next one.
    pub(super) fn retire(&mut self, old: Held) {
        if old.left > 0 {
            self.returns.push((old.left, old.end));
            if old.left * 2 > old.size {
                self.size = (self.size / 2).max(1);
            }
        }
    }

    /// What a request of `cost` needs.
    pub(super) fn need(&self, now: u64, cost: u64) -> Need {
        match self.usable(now, cost) {
            Some(h) if self.asking || self.next.is_some() || !h.low() => Need::Local,
            Some(_) => Need::Ask,
            None if self.asking => Need::Wait,
            None => Need::Ask,
        }
    }

    /// Makes a request of `check` ask for a lease: the units it asks for, or `None` when it
    /// is to be decided by the store as usual (another request is asking; or the key is new
    /// here, and the next request within a lease's life takes the first lease). Pushes what
    /// the ended leases left to give back to `give_backs`.
    pub(super) fn ask(
        &mut self,
        now: u64,
        lease: LeaseSpec,
        give_backs: &mut Checks,
        check: &Check,
    ) -> Option<u64> {
        self.keep_until = self.keep_until.max(now + 2 * lease.ttl_us());
        if self.asking {
            return None;
        }
        let ended = [
            self.held.take_if(|h| now > h.until),
            self.next.take_if(|h| now > h.until),
        ];
        for h in ended.into_iter().flatten() {
            self.retire(h);
        }
        if self.size == 0 {
            self.size = 1;
            return None;
        }
        for (units, end) in self.returns.drain(..) {
            give_backs.push(Check::new(
                check.tier().clone(),
                check.key().clone(),
                units,
                Op::GiveBack { end },
            ));
        }
        self.size = (self.size * 2).clamp(1, lease.units());
        // What the leases in hand keep counts toward the size: an instance never holds more
        // than one lease's units of a key.
        let kept = self.usable(now, 0).map_or(0, |h| h.left);
        self.asking = true;
        Some(self.size.saturating_sub(kept))
    }

    /// Whether the entry is of no more use: no request asking, and idle for a lease's life.
    /// A key used less often than that is decided as a key seen once again.
    /// What its ended leases left to give back stays counted by the store (until the window
    /// passes, for the window algorithms; a give-back to GCRA or a bucket after a lease's end
    /// would change nothing anyway).
    pub(super) fn idle(&self, now: u64) -> bool {
        !self.asking && now > self.keep_until
    }
}

/// The outcome of a check admitted from a lease here: its grant is the lease's end (where a
/// refunded unit goes back to) and the units spent, when `ends` asks for it.
pub(super) fn spent(
    tier: &Arc<Tier>,
    verdict: Verdict,
    end: u64,
    cost: u64,
    ends: bool,
) -> PolicyOutcome {
    let outcome = PolicyOutcome::new(tier, false, verdict);
    match ends {
        true => outcome.with_grant(Some(Grant {
            units: cost,
            end,
            lasts_us: 0,
        })),
        false => outcome,
    }
}
