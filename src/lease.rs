//! Leases on the instance's side: the units each key's lease has left here, spent without a
//! store call until they run out or the lease ends.
//!
//! A policy with [`Policy::lease`](crate::Policy::lease) asks the store for a lease
//! ([`Mode::Lease`]) when a request finds none here with room for its cost, and no other
//! request of this instance is asking for one already (those are decided by the store one by
//! one meanwhile, so one instance holds at most one lease per key). The store answers with the
//! units leased and when the lease ends; the units left after the asking request are spent
//! here by the next requests until then. What a lease has left when the next one is asked for
//! goes back to the store in the same call ([`Mode::GiveBack`]).
//!
//! A lease's end is measured on the layer's clock from when the store was asked, so it ends
//! here no later than the store counted it: the store's end minus the round trip.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use smallvec::SmallVec;

use crate::algorithm::Verdict;
use crate::decision::{Grant, PolicyOutcome};
use crate::key::Key;
use crate::store::{Check, Checks, Mode};

/// Shards of the lease table: requests for different keys rarely wait for each other.
const SHARDS: usize = 16;
/// Operations on a shard between two sweeps of its ended leases.
const SWEEP_EVERY: u32 = 1024;

/// The leases this instance holds, by policy tier and key.
#[derive(Debug)]
pub(crate) struct Leases {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<(u32, Key), Entry>,
    ops: u32,
}

#[derive(Debug, Default)]
struct Entry {
    held: Option<Held>,
    /// Whether a request of this instance is asking the store for a lease on this key.
    asking: bool,
    /// The requests waiting for that answer.
    waiters: Vec<Waker>,
}

/// A lease in hand.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// Units left to spend.
    left: u64,
    /// The last moment (layer clock) they may be spent.
    until: u64,
    /// The lease's end on the store's clock, to give units back.
    end: u64,
    /// What the store had left beyond the lease when it granted it, for the headers.
    remaining: u64,
    /// When (layer clock) the key would be fully reset, as of the grant.
    reset_at: u64,
}

impl Held {
    fn usable(&self, now: u64, cost: u64) -> bool {
        now <= self.until && self.left >= cost
    }
}

/// The outcomes of checks admitted from leases, and each one's lease end.
type Spent = (SmallVec<[PolicyOutcome; 1]>, SmallVec<[u64; 1]>);

/// What a request's checks do about leases.
pub(crate) enum Plan {
    /// Every check was admitted from a lease here: the outcomes, and each check's lease end
    /// (to give a refunded unit back to the lease it came from).
    Local(SmallVec<[PolicyOutcome; 1]>, SmallVec<[u64; 1]>),
    /// The store decides; these checks ask it for a lease. `None` when none does.
    Store(Option<Asking>),
    /// Another request of this instance is asking for the lease a check needs: wait for it.
    Wait(LeaseWait),
}

/// The checks of a store call that ask for a lease: where they are among its checks and their
/// keys. Dropping it (the answer came, or the request went away) lets the next request ask.
pub(crate) struct Asking {
    leases: Arc<Leases>,
    /// `(index among the checks, tier id, key, cost)`.
    checks: SmallVec<[(usize, u32, Key, u64); 1]>,
    /// Give-back checks put before the request's own.
    pub(crate) give_backs: usize,
}

impl Leases {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Leases {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        })
    }

    fn shard(&self, tier: u32, key: &Key) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one((tier, key)) as usize % SHARDS;
        self.shards[index].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits `checks` from the leases held here if every one of them has a lease with room
    /// for its cost (all or nothing); `None` otherwise, with nothing spent.
    fn spend(&self, checks: &[Check], now: u64) -> Option<Spent> {
        let mut outcomes = SmallVec::new();
        let mut ends = SmallVec::new();
        for (i, c) in checks.iter().enumerate() {
            let spent = {
                let mut shard = self.shard(c.tier().id(), c.key());
                shard
                    .entries
                    .get_mut(&(c.tier().id(), c.key().clone()))
                    .and_then(|e| e.held.as_mut())
                    .filter(|h| h.usable(now, c.cost()))
                    .map(|h| {
                        h.left -= c.cost();
                        *h
                    })
            };
            let Some(h) = spent else {
                // Put back what the earlier checks took.
                for (c, end) in checks[..i].iter().zip(&ends) {
                    self.put_back(c, *end, c.cost(), now);
                }
                return None;
            };
            let verdict = Verdict::allow(h.remaining + h.left, h.reset_at.saturating_sub(now));
            outcomes.push(PolicyOutcome::new(c.tier(), false, verdict));
            ends.push(h.end);
        }
        Some((outcomes, ends))
    }

    /// Plans `checks`. Unless every one's tier takes leases (`all_leased`), the store decides
    /// them one by one as usual: the request needs a store call anyway. Otherwise they are
    /// admitted here when every one has a lease with room; else the request waits for a
    /// lease another request is asking for; else those with none ask the store for one, each
    /// with a give-back of what its old lease has left.
    pub(crate) fn plan(self: &Arc<Self>, checks: &mut Checks, all_leased: bool, now: u64) -> Plan {
        if !all_leased {
            // Another policy needs the store anyway: a lease would save nothing here.
            return Plan::Store(None);
        }
        {
            if let Some((outcomes, ends)) = self.spend(checks, now) {
                return Plan::Local(outcomes, ends);
            }
            // A request that only needs leases waits for one that is on its way.
            for c in checks.iter() {
                let (tier, key) = (c.tier().id(), c.key());
                let shard = self.shard(tier, key);
                if let Some(entry) = shard.entries.get(&(tier, key.clone()))
                    && entry.asking
                    && !entry.held.is_some_and(|h| h.usable(now, c.cost()))
                {
                    return Plan::Wait(LeaseWait {
                        leases: self.clone(),
                        tier,
                        key: key.clone(),
                    });
                }
            }
        }
        let mut asking: SmallVec<[(usize, u32, Key, u64); 1]> = SmallVec::new();
        let mut give_backs = Checks::new();
        for (i, c) in checks.iter_mut().enumerate() {
            if c.mode() != Mode::Enforce || c.tier().lease().is_none() {
                continue;
            }
            let (tier, key) = (c.tier().id(), c.key().clone());
            let mut shard = self.shard(tier, &key);
            shard.tick(now);
            let entry = shard.entries.entry((tier, key.clone())).or_default();
            if entry.asking || entry.held.is_some_and(|h| h.usable(now, c.cost())) {
                // Decided by the store one by one: a lease is on its way, or the one here has
                // room (another check of the request has none).
                continue;
            }
            entry.asking = true;
            if let Some(old) = entry.held.take()
                && old.left > 0
            {
                metrics::counter!("ratelimit_lease_units_returned_total", "policy" => c.tier().name().to_owned())
                    .increment(old.left);
                give_backs.push(Check::give_back(
                    c.tier().clone(),
                    key.clone(),
                    old.left,
                    old.end,
                ));
            }
            *c = c.with_mode(Mode::Lease);
            asking.push((i, tier, key, c.cost()));
        }
        if asking.is_empty() {
            return Plan::Store(None);
        }
        // The give-backs go first: a store call makes each check's changes in order, and the
        // lease on the same key must be decided on what they leave.
        let give_backs_len = give_backs.len();
        for a in &mut asking {
            a.0 += give_backs_len;
        }
        checks.insert_many(0, give_backs);
        Plan::Store(Some(Asking {
            leases: self.clone(),
            checks: asking,
            give_backs: give_backs_len,
        }))
    }

    /// Gives `units` back to the lease that ended (store clock) at `end`, if it is still the
    /// one held here and has not ended; false when it is gone.
    pub(crate) fn put_back(&self, check: &Check, end: u64, units: u64, now: u64) -> bool {
        let mut shard = self.shard(check.tier().id(), check.key());
        match shard
            .entries
            .get_mut(&(check.tier().id(), check.key().clone()))
            .and_then(|e| e.held.as_mut())
        {
            Some(h) if h.end == end && now <= h.until => {
                h.left += units;
                true
            }
            _ => false,
        }
    }

    /// Forgets the lease on `key` of the tier `tier` (an administrator reset or blocked it).
    pub(crate) fn forget(&self, tier: u32, key: &Key) {
        let mut shard = self.shard(tier, key);
        if let Some(entry) = shard.entries.get_mut(&(tier, key.clone())) {
            entry.held = None;
            if !entry.asking {
                shard.entries.remove(&(tier, key.clone()));
            }
        }
    }
}

impl Shard {
    /// Counts an operation and, every [`SWEEP_EVERY`], drops the entries whose lease has
    /// ended and that no request is asking for: the table holds the keys in use, not every
    /// key ever seen.
    fn tick(&mut self, now: u64) {
        self.ops += 1;
        if self.ops >= SWEEP_EVERY {
            self.ops = 0;
            self.entries
                .retain(|_, e| e.asking || e.held.is_some_and(|h| now <= h.until));
        }
    }
}

impl Asking {
    /// Takes the leases the store granted with `outcomes` (the call's, in the order of its
    /// checks): `sent` is when the store was asked, `now` the present (layer clock). The
    /// asking request's own outcome reports the lease's units left here as remaining.
    pub(crate) fn granted(&self, outcomes: &mut [PolicyOutcome], sent: u64, now: u64) {
        for (i, tier, key, cost) in &self.checks {
            let Some(outcome) = outcomes.get_mut(*i) else {
                continue;
            };
            let Some(&Grant {
                units,
                end,
                lasts_us,
            }) = outcome.grant()
            else {
                continue;
            };
            let left = units.saturating_sub(*cost);
            metrics::counter!("ratelimit_leases_total", "policy" => outcome.policy().to_owned())
                .increment(1);
            let held = Held {
                left,
                until: sent + lasts_us,
                end,
                remaining: outcome.remaining(),
                reset_at: now + outcome.reset_after().as_micros() as u64,
            };
            outcome.add_remaining(left);
            let mut shard = self.leases.shard(*tier, key);
            shard.entries.entry((*tier, key.clone())).or_default().held = Some(held);
        }
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        for (_, tier, key, _) in &self.checks {
            let mut shard = self.leases.shard(*tier, key);
            if let Some(entry) = shard.entries.get_mut(&(*tier, key.clone())) {
                entry.asking = false;
                for waker in entry.waiters.drain(..) {
                    waker.wake();
                }
                if entry.held.is_none() {
                    shard.entries.remove(&(*tier, key.clone()));
                }
            }
        }
    }
}

/// Waits for the answer to another request's asking for a lease on a key (granted or not,
/// or the asking request gone).
pub(crate) struct LeaseWait {
    leases: Arc<Leases>,
    tier: u32,
    key: Key,
}

impl Future for LeaseWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut shard = self.leases.shard(self.tier, &self.key);
        match shard.entries.get_mut(&(self.tier, self.key.clone())) {
            Some(entry) if entry.asking => {
                if !entry.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    entry.waiters.push(cx.waker().clone());
                }
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }
}
