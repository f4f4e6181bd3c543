//! Leases on the instance's side: the units each key's leases have left here, spent without a
//! store call until they run out or the leases end.
//!
//! A request whose every policy takes leases ([`Policy::lease`](crate::Policy::lease)) is
//! admitted here when each policy's key has a lease with room for its cost. Otherwise it asks
//! the store for a lease ([`Op::Lease`](crate::store::Op)) where it needs one, unless another request of this
//! instance is asking for that key already: then it waits for that answer ([`Plan::Wait`]) and
//! plans again. The store answers with the units leased and the lease's end; the units left
//! after the asking request's cost are spent here by the next requests until then.
//!
//! * **Sizes.** A key seen for the first time is decided by the store as without leases; from
//!   its next request (within a lease's life) leases double, up to the policy's size, and
//!   halve when one goes back mostly unspent.
//! * **Ahead of time.** When the lease in hand is five sixths spent, the next request asks for
//!   the next lease, of the size less what is in hand, so that it comes before this one is
//!   spent: an instance never holds more than one lease's units of a key.
//! * **Given back.** What an ended lease left goes back to the store with the key's next
//!   asking ([`Op::GiveBack`](crate::store::Op), in the same call, before the new lease is decided). A key
//!   idle for a lease's life after its last lease ended is forgotten here, and what its leases
//!   left goes back with the store call of the request whose asking swept its shard. A refund
//!   after the response goes back to the lease its unit came from.
//!
//! A lease's end is measured on the layer's clock from when the store was asked, so it ends
//! here no later than the store counted it: the store's end minus the round trip.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use hashbrown::HashTable;
use smallvec::{SmallVec, smallvec};

use crate::decision::{Decision, Grant, Outcomes, PolicyOutcome};
use crate::key::Key;
use crate::policy::Tier;
use crate::store::{Check, Checks, Op, lock};

mod key;

use key::{Held, KeyLeases, Need, spent};

/// Shards of the lease table: requests for different keys rarely wait for each other.
const SHARDS: usize = 16;
/// Operations on a shard between two sweeps of its idle keys, at most.
const SWEEP_EVERY: u32 = 1024;
/// Microseconds between two sweeps of a shard, at most (on a request that asks for a lease).
const SWEEP_INTERVAL_US: u64 = 1_000_000;
/// Idle keys whose unspent units one store call gives back, at most (the others' stay
/// counted until the store forgets them).
const IDLE_GIVE_BACKS: usize = 16;

/// The leases this instance holds, by policy tier and key.
#[derive(Debug)]
pub(crate) struct Leases {
    shards: Box<[Mutex<LeaseShard>]>,
    hasher: RandomState,
}

/// One shard of the table: the entries hashed with the table's seeded hasher and looked up
/// by reference (a key is cloned only when its entry is made).
#[derive(Debug, Default)]
struct LeaseShard {
    entries: HashTable<LeaseRow>,
    ops: u32,
    last_sweep: u64,
}

#[derive(Debug)]
struct LeaseRow {
    /// The policy tier (also to give units back with once the key is idle).
    policy: Arc<Tier>,
    key: Key,
    /// The row's hash, kept for the table to move it when it grows.
    hash: u64,
    entry: KeyLeases,
}

/// Where a check's entry lives: its hash, and its shard.
#[derive(Clone, Copy)]
struct Place {
    hash: u64,
    shard: usize,
}

/// What a request's checks do about leases.
pub(crate) enum Plan {
    /// Every check was admitted from a lease here: the decision, each outcome's grant the
    /// lease it spent.
    Local(Decision),
    /// The store decides; these checks ask it for a lease. `None` when none does.
    Store(Option<Asking>),
    /// Another request of this instance is asking for the lease a check needs: wait for its
    /// answer (granted or not, or the asking request gone), then plan again.
    Wait(Pin<Box<dyn Future<Output = ()> + Send>>),
}

/// A check that asks for a lease: where it is among the store call's checks, its tier, key
/// and cost.
struct Asked(usize, Arc<Tier>, Key, u64);

/// The checks of a store call that ask for a lease: where they are among its checks and their
/// keys. Dropping it (the answer came, or the request went away) lets the next request ask.
pub(crate) struct Asking {
    leases: Arc<Leases>,
    checks: SmallVec<[Asked; 1]>,
    /// Give-back checks put before the request's own.
    give_backs: usize,
    /// The request's own checks.
    of: usize,
    /// When (layer clock) the store was asked: a lease ends here no later than it does there.
    sent: u64,
}

impl Leases {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Leases {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        })
    }

    fn place(&self, tier: u32, key: &Key) -> Place {
        let hash = key.hash_with(tier, &self.hasher);
        // The high bits pick the shard: the table uses the low ones.
        let shard = ((hash >> 32) as usize) % SHARDS;
        Place { hash, shard }
    }

    fn lock(&self, place: Place) -> MutexGuard<'_, LeaseShard> {
        lock(&self.shards[place.shard])
    }

    /// The entry of `tier` and `key`, if any.
    fn with<T>(&self, tier: u32, key: &Key, f: impl FnOnce(Option<&mut KeyLeases>) -> T) -> T {
        let place = self.place(tier, key);
        let mut shard = self.lock(place);
        f(shard.get_mut(place.hash, tier, key))
    }

    /// Spends each `(tier, key, cost)` from the leases here if every one has a lease with room
    /// for its cost (all or nothing); `None` otherwise, with nothing spent.
    fn spend_each<'a>(
        &self,
        items: impl Iterator<Item = (&'a Arc<Tier>, &'a Key, u64)> + Clone,
        now: u64,
        ends: bool,
    ) -> Option<Decision> {
        let mut outcomes: Outcomes = SmallVec::new();
        let mut taken: SmallVec<[u64; 2]> = SmallVec::new();
        for (i, (tier, key, cost)) in items.clone().enumerate() {
            let spent_here = self.with(tier.id(), key, |e| e?.spend(now, cost));
            let Some((end, verdict)) = spent_here else {
                // Put back what the earlier ones took.
                for ((tier, key, cost), end) in items.take(i).zip(taken) {
                    self.put_back(tier.id(), key, end, cost, now);
                }
                return None;
            };
            outcomes.push(spent(tier, verdict, end, cost, ends));
            taken.push(end);
        }
        Some(Decision::new(outcomes))
    }

    /// Plans `checks`. Unless every one's tier takes leases, the store decides them one by one
    /// as usual: the request needs a store call anyway. Otherwise they are admitted here when
    /// every one has a lease with room (and none runs low); else those that need a lease and
    /// have none on its way ask the store for one (their checks become [`Op::Lease`]), with
    /// what their ended leases left to give back (checks put in front of the request's own);
    /// else the request waits for a lease another request is asking for. A decision made here
    /// tells each outcome's lease when `ends` (the request gives units back after the
    /// response, to the lease they came from).
    pub(crate) fn plan(self: &Arc<Self>, checks: &mut Checks, now: u64, ends: bool) -> Plan {
        if !checks.iter().all(|c| c.tier().lease().is_some()) {
            // Another policy needs the store anyway: a lease would save nothing here.
            return Plan::Store(None);
        }
        let mut ask: SmallVec<[usize; 1]> = SmallVec::new();
        if let [c] = &checks[..] {
            // One policy, the usual case: one look at the table decides, and asks.
            let (tier, cost) = (c.tier().id(), c.cost());
            let place = self.place(tier, c.key());
            let mut shard = self.lock(place);
            if let Some(entry) = shard.get_mut(place.hash, tier, c.key()) {
                match entry.need(now, cost) {
                    Need::Local => {
                        if let Some((end, verdict)) = entry.spend(now, cost) {
                            let outcome = spent(c.tier(), verdict, end, cost, ends);
                            return Plan::Local(Decision::new(smallvec![outcome]));
                        }
                    }
                    Need::Wait => return Plan::Wait(self.wait(c)),
                    Need::Ask => {}
                }
            }
            return self.ask(checks, &[0], now, Some((place, shard)));
        } else {
            let mut wait = None;
            for (i, c) in checks.iter().enumerate() {
                let need = self.with(c.tier().id(), c.key(), |e| {
                    e.map_or(Need::Ask, |e| e.need(now, c.cost()))
                });
                match need {
                    Need::Local => {}
                    Need::Ask => ask.push(i),
                    Need::Wait => wait = wait.or(Some(i)),
                }
            }
            if ask.is_empty() {
                if let Some(i) = wait {
                    return Plan::Wait(self.wait(&checks[i]));
                }
                let items = checks.iter().map(|c| (c.tier(), c.key(), c.cost()));
                if let Some(spent) = self.spend_each(items, now, ends) {
                    return Plan::Local(spent);
                }
                // Another request spent the units in between: ask for every check.
                ask.extend(0..checks.len());
            }
        }
        self.ask(checks, &ask, now, None)
    }

    /// The wait for the answer to another request's asking for `check`'s lease.
    fn wait(self: &Arc<Self>, check: &Check) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let (leases, tier, key) = (self.clone(), check.tier().id(), check.key().clone());
        Box::pin(std::future::poll_fn(move |cx| {
            leases.with(tier, &key, |entry| match entry {
                Some(entry) if entry.asking => {
                    if !entry.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                        entry.waiters.push(cx.waker().clone());
                    }
                    Poll::Pending
                }
                _ => Poll::Ready(()),
            })
        }))
    }

    /// The store call of `checks`, those at `ask` asking for a lease where they can (no other
    /// request asking, the key seen before), each with what its ended leases left to give
    /// back.
    /// `locked` is the shard of a one-policy request's key, already locked.
    fn ask(
        self: &Arc<Self>,
        checks: &mut Checks,
        ask: &[usize],
        now: u64,
        mut locked: Option<(Place, MutexGuard<'_, LeaseShard>)>,
    ) -> Plan {
        let mut asking: SmallVec<[Asked; 1]> = SmallVec::new();
        let mut give_backs = Checks::new();
        for &i in ask {
            let c = &checks[i];
            let Some(lease) = c.tier().lease() else {
                continue;
            };
            let tier = c.tier().id();
            let (place, mut shard) = locked.take().unwrap_or_else(|| {
                let place = self.place(tier, c.key());
                (place, self.lock(place))
            });
            shard.tick(now, &mut give_backs);
            let entry = shard.entry(place.hash, c.tier(), c.key());
            let Some(want) = entry.ask(now, lease, &mut give_backs, c) else {
                continue;
            };
            drop(shard);
            checks[i] = checks[i].leasing(want);
            let c = &checks[i];
            asking.push(Asked(i, c.tier().clone(), c.key().clone(), c.cost()));
        }
        if asking.is_empty() && give_backs.is_empty() {
            return Plan::Store(None);
        }
        for g in &give_backs {
            metrics::counter!("ratelimit_lease_units_returned_total", "policy" => g.tier().label())
                .increment(g.cost());
        }
        // The give-backs go first: a store call makes each check's changes in order, and the
        // lease on the same key must be decided on what they leave.
        let give_backs_len = give_backs.len();
        let of = checks.len();
        for a in &mut asking {
            a.0 += give_backs_len;
        }
        checks.insert_many(0, give_backs);
        Plan::Store(Some(Asking {
            leases: self.clone(),
            checks: asking,
            give_backs: give_backs_len,
            of,
            sent: now,
        }))
    }

    /// Gives `units` back to the lease that ended (store clock) at `end`, if it is still one
    /// held here and has not ended; false when it is gone.
    pub(crate) fn put_back(&self, tier: u32, key: &Key, end: u64, units: u64, now: u64) -> bool {
        self.with(tier, key, |entry| {
            let Some(entry) = entry else {
                return false;
            };
            match [&mut entry.held, &mut entry.next]
                .into_iter()
                .flatten()
                .find(|h| h.end == end && now <= h.until)
            {
                Some(h) => {
                    h.left += units;
                    true
                }
                None => false,
            }
        })
    }

    /// Forgets the leases on `key` of the tier `tier` (an administrator reset or blocked it):
    /// their units are not given back, the store has forgotten them.
    pub(crate) fn forget(&self, tier: u32, key: &Key) {
        self.with(tier, key, |entry| {
            if let Some(entry) = entry {
                entry.held = None;
                entry.next = None;
                entry.returns.clear();
            }
        });
    }
}

impl Leases {
    /// Forgets every lease of the tiers `ids` (a reload changed or removed them): their units
    /// are not given back, and stay counted in the store as spent until the leases end.
    pub(crate) fn forget_tiers(&self, ids: &[u32]) {
        if ids.is_empty() {
            return;
        }
        for shard in self.shards.iter() {
            lock(shard)
                .entries
                .retain(|s| !ids.contains(&s.policy.id()));
        }
    }
}

impl LeaseShard {
    fn get_mut(&mut self, hash: u64, tier: u32, key: &Key) -> Option<&mut KeyLeases> {
        self.entries
            .find_mut(hash, |s| s.policy.id() == tier && s.key == *key)
            .map(|s| &mut s.entry)
    }

    /// The entry of `policy`'s tier and `key`, made if there is none.
    fn entry(&mut self, hash: u64, policy: &Arc<Tier>, key: &Key) -> &mut KeyLeases {
        let tier = policy.id();
        let found = self
            .entries
            .entry(hash, |s| s.policy.id() == tier && s.key == *key, |s| s.hash)
            .or_insert_with(|| LeaseRow {
                policy: policy.clone(),
                key: key.clone(),
                hash,
                entry: KeyLeases::default(),
            });
        &mut found.into_mut().entry
    }

    /// Counts an operation and, every [`SWEEP_EVERY`] operations or [`SWEEP_INTERVAL_US`],
    /// drops the idle entries, so that the table holds the keys in use, not every key ever
    /// seen; what their leases left unspent goes to `give_backs` (for the store call being
    /// made, up to [`IDLE_GIVE_BACKS`] keys).
    fn tick(&mut self, now: u64, give_backs: &mut Checks) {
        self.ops += 1;
        if self.ops < SWEEP_EVERY && now < self.last_sweep + SWEEP_INTERVAL_US {
            return;
        }
        self.ops = 0;
        self.last_sweep = now;
        self.entries.retain(|s| {
            if !s.entry.idle(now) {
                return true;
            }
            let e = &s.entry;
            let ended = [e.held, e.next]
                .into_iter()
                .flatten()
                .map(|h| (h.left, h.end));
            for (units, end) in e.returns.iter().copied().chain(ended) {
                if units > 0 && give_backs.len() < IDLE_GIVE_BACKS {
                    give_backs.push(Check::new(
                        s.policy.clone(),
                        s.key.clone(),
                        units,
                        Op::GiveBack { end },
                    ));
                }
            }
            false
        });
    }
}

impl Asking {
    /// The request's own checks among `sent`, the checks of the store call (after the
    /// give-backs put in front of them).
    pub(crate) fn own<'c>(&self, sent: &'c [Check]) -> &'c [Check] {
        &sent[self.give_backs..]
    }

    /// The request's decision from the store's answer to the call (the give-backs' outcomes
    /// left out), taking the leases it granted when the request is admitted (`now`: the layer's
    /// clock). The asking request's own outcome reports the lease's units left here as
    /// remaining.
    pub(crate) fn answered(self, decision: Decision, now: u64) -> Decision {
        let mut decision = decision.without_first(self.give_backs);
        if decision.is_allowed() {
            self.granted(decision.outcomes_mut(), now);
        }
        decision
    }

    /// Takes the leases the store granted with `outcomes` (the request's own, in the order of
    /// its checks).
    fn granted(&self, outcomes: &mut [PolicyOutcome], now: u64) {
        let sent = self.sent;
        for Asked(i, policy, key, cost) in &self.checks {
            let tier = &policy.id();
            let Some(outcome) = outcomes.get_mut(i - self.give_backs) else {
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
            metrics::counter!("ratelimit_leases_total", "policy" => outcome.tier().label())
                .increment(1);
            let held = Held {
                left,
                size: units,
                until: sent + lasts_us,
                end,
            };
            let place = self.leases.place(*tier, key);
            let mut shard = self.leases.lock(place);
            let entry = shard.entry(place.hash, policy, key);
            entry.remaining = outcome.remaining();
            entry.reset_at = now + outcome.reset_after().as_micros() as u64;
            // The units this instance holds of the key count as its own in the headers.
            outcome.add_remaining(left + entry.in_hand(now));
            // Kept a lease's life after this one ends: a key still in use asks again by then.
            let ttl = policy.lease().map_or(0, |l| l.ttl_us());
            entry.keep_until = entry.keep_until.max(held.until + ttl);
            if entry.held.is_some_and(|h| h.usable(now, 1)) {
                // Asked for ahead of time: spent once the one held is.
                if let Some(old) = entry.next.replace(held) {
                    entry.retire(old);
                }
            } else {
                if let Some(old) = entry.held.replace(held) {
                    entry.retire(old);
                }
            }
        }
    }
}

impl Asking {
    /// When the store failed: the request admitted from the leases in hand instead, if every
    /// one of its checks asked for a lease and each still has one with room (a lease keeps
    /// admitting while the store is down, until it ends).
    pub(crate) fn spend_instead(&self, now: u64) -> Option<Decision> {
        if self.checks.len() != self.of {
            return None;
        }
        let items = self
            .checks
            .iter()
            .map(|Asked(_, tier, key, cost)| (tier, key, *cost));
        self.leases.spend_each(items, now, true)
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        for Asked(_, tier, key, _) in &self.checks {
            self.leases.with(tier.id(), key, |entry| {
                if let Some(entry) = entry {
                    entry.asking = false;
                    for waker in entry.waiters.drain(..) {
                        waker.wake();
                    }
                }
            });
        }
    }
}
