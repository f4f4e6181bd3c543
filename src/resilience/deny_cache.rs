//! The deny cache.

use std::collections::hash_map::RandomState;
use std::sync::{Mutex, MutexGuard};

use hashbrown::HashTable;

use crate::decision::{Decision, PolicyOutcome};
use crate::key::Key;
use crate::store::{Check, Op, lock};
use smallvec::smallvec;

const SHARDS: usize = 16;
const SAMPLE: usize = 8;

/// Keys the store said are limited until some time, remembered in this process so that a flood
/// on a limited key costs no round trip. A denial is remembered with the cost of the request it
/// refused, and answers only requests that cost at least as much (a cheaper one may fit).
/// Bounded: a full shard drops the soonest to expire (an expired one first) of the first eight
/// entries of its table (in the table's order, arbitrary under the random hash seed, not a
/// uniform sample).
///
/// Like the memory store, each (policy, key) is hashed once per lookup: the high bits pick the
/// shard, the table uses the hash itself, and lookups go by reference.
#[derive(Debug)]
pub(crate) struct DenyCache {
    shards: Box<[Mutex<HashTable<Denial>>]>,
    per_shard: usize,
    hasher: RandomState,
}

#[derive(Debug)]
struct Denial {
    hash: u64,
    id: u32,
    key: Key,
    until: u64,
    /// The cost of the denied request.
    cost: u64,
    outcome: PolicyOutcome,
}

impl Denial {
    fn is(&self, id: u32, key: &Key) -> bool {
        self.id == id && self.key == *key
    }
}

impl DenyCache {
    pub(crate) fn new(max_entries: usize) -> Self {
        let shards = SHARDS.min(max_entries.max(1));
        DenyCache {
            shards: (0..shards).map(|_| Mutex::new(HashTable::new())).collect(),
            per_shard: (max_entries / shards).max(1),
            hasher: RandomState::new(),
        }
    }

    /// The hash of (`id`, `key`) and its shard, locked.
    fn locate(&self, id: u32, key: &Key) -> (u64, MutexGuard<'_, HashTable<Denial>>) {
        let hash = key.hash_with(id, &self.hasher);
        let shard = &self.shards[(hash >> 40) as usize % self.shards.len()];
        (hash, lock(shard))
    }

    /// A denial for `checks` if one of their enforced policies is known to be limited at `now`.
    pub(crate) fn lookup(&self, checks: &[Check], now: u64) -> Option<Decision> {
        for c in checks
            .iter()
            .filter(|c| c.op() == Op::Enforce && c.cost() > 0)
        {
            let (hash, mut shard) = self.locate(c.tier().id(), c.key());
            if let Ok(entry) = shard.find_entry(hash, |e| e.is(c.tier().id(), c.key())) {
                let e = entry.get();
                // A denial under another definition of the policy (before a reload) is
                // forgotten: a raised limit admits at once.
                if e.until <= now || e.outcome.tier().def() != c.tier().def() {
                    entry.remove();
                } else if c.cost() >= e.cost {
                    return Some(Decision::new(smallvec![e.outcome.waiting(e.until - now)]));
                }
                // Else a cheaper request than the one denied may fit: the store decides.
            }
        }
        None
    }

    /// Forgets what is remembered of `key` in the tier `id`: an administrator's reset, allow
    /// or new limit is obeyed here at once.
    pub(crate) fn forget(&self, id: u32, key: &Key) {
        let (hash, mut shard) = self.locate(id, key);
        if let Ok(entry) = shard.find_entry(hash, |e| e.is(id, key)) {
            entry.remove();
        }
    }

    /// Remembers the violated enforced policies of a denied decision: `checks` are the checks
    /// of its outcomes.
    pub(crate) fn remember(&self, checks: &[Check], decision: &Decision, now: u64) {
        for (kept, outcome) in checks.iter().zip(decision.outcomes()) {
            let (id, key, cost) = (kept.tier().id(), kept.key(), kept.cost());
            let Some(retry) = outcome.retry_after() else {
                continue;
            };
            // Only what `lookup` reads: an enforced check's denial (a share's denial says
            // nothing of a request that may use more).
            if outcome.is_allowed() || kept.op() != Op::Enforce {
                continue;
            }
            let (hash, mut shard) = self.locate(id, key);
            let entry = Denial {
                hash,
                id,
                key: key.clone(),
                until: now + retry.as_micros() as u64,
                cost,
                outcome: outcome.clone(),
            };
            if let Some(known) = shard.find_mut(hash, |e| e.is(id, key)) {
                *known = entry;
                continue;
            }
            if shard.len() >= self.per_shard {
                // Evict from the table's first few entries, not a scan of the shard, so a flood
                // of distinct limited keys costs constant time per entry: their soonest to
                // expire (an expired one, if they hold any).
                let victim = shard
                    .iter()
                    .take(SAMPLE)
                    .min_by_key(|e| e.until)
                    .map(|e| (e.hash, e.id, e.key.clone()));
                if let Some((h, id, key)) = victim
                    && let Ok(victim) = shard.find_entry(h, |e| e.is(id, &key))
                {
                    victim.remove();
                }
            }
            shard.insert_unique(hash, entry, |e| e.hash);
        }
    }

    /// Entries held, expired or not.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Algorithm;
    use crate::algorithm::Verdict;
    use crate::policy::Tier;
    use crate::quota::Quota;

    fn handle(id: u32) -> Arc<Tier> {
        let quota: Quota = "10/s".parse().unwrap();
        Tier::alone("gcra:10/s", id, Algorithm::Gcra, quota, Op::Enforce).unwrap()
    }

    /// A denial of `key` by `policy`, for `retry_us`.
    fn denied(policy: &Arc<Tier>, retry_us: u64) -> Decision {
        let verdict = Verdict {
            allowed: false,
            remaining: 0,
            reset_after_us: retry_us,
            retry_after_us: Some(retry_us),
        };
        Decision::new(smallvec![PolicyOutcome::new(policy, false, verdict)])
    }

    fn check(policy: &Arc<Tier>, key: &Key, cost: u64) -> Vec<Check> {
        vec![Check::new(policy.clone(), key.clone(), cost, Op::Enforce)]
    }

    #[test]
    fn stays_bounded_under_a_flood_of_distinct_limited_keys() {
        for max in [1, 5, 17, 100, 1_000] {
            let cache = DenyCache::new(max);
            let policy = handle(0);
            let decision = denied(&policy, 60_000_000);
            for i in 0..20_000u64 {
                cache.remember(&check(&policy, &Key::from(i), 1), &decision, i);
                assert!(cache.len() <= max, "{} entries, at most {max}", cache.len());
            }
            assert!(cache.len() >= max / 2, "{max}: most of the room is used");
            // The newest key is answered from the cache.
            let newest = Key::from(19_999u64);
            assert!(cache.lookup(&check(&policy, &newest, 1), 20_000).is_some());
        }
    }

    #[test]
    fn nothing_is_answered_at_or_after_its_time() {
        let cache = DenyCache::new(16);
        let policy = handle(0);
        // 16 shards of one entry: fill them with short denials.
        for i in 0..1_000u64 {
            cache.remember(&check(&policy, &Key::from(i), 1), &denied(&policy, 10), 0);
        }
        let held = cache.len();
        assert!(held <= 16);
        assert!(
            (0..1_000u64).all(|i| cache
                .lookup(&check(&policy, &Key::from(i), 1), 10)
                .is_none()),
            "nothing is answered at or after its time"
        );
        assert_eq!(cache.len(), 0, "lookups drop what expired");
    }

    #[test]
    fn answers_the_policy_and_cost_it_was_told_about() {
        let cache = DenyCache::new(100);
        let (a, b) = (handle(0), handle(1));
        let key = Key::from("k");
        cache.remember(&check(&a, &key, 5), &denied(&a, 1_000), 0);
        let hit = cache.lookup(&check(&a, &key, 5), 400).expect("a hit");
        assert_eq!(
            hit.tightest().retry_after(),
            Some(std::time::Duration::from_micros(600))
        );
        assert!(cache.lookup(&check(&a, &key, 9), 400).is_some(), "costlier");
        assert!(
            cache.lookup(&check(&a, &key, 1), 400).is_none(),
            "a cheaper request may fit: ask the store"
        );
        assert!(
            cache.lookup(&check(&b, &key, 5), 400).is_none(),
            "another policy"
        );
        assert!(
            cache
                .lookup(&check(&a, &Key::from("other"), 5), 400)
                .is_none(),
            "another key"
        );
        assert!(
            cache.lookup(&check(&a, &key, 5), 1_000).is_none(),
            "expired"
        );
    }
}
