//! The deny cache.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;

use crate::decision::{Decision, PolicyOutcome};
use crate::key::Key;
use crate::store::{Check, Mode};

const SHARDS: usize = 16;
const SAMPLE: usize = 8;

/// Keys the store said are limited until some time, remembered in this process so that a flood
/// on a limited key costs no round trip. Bounded: when full, expired entries go first, then
/// the soonest to expire of a small sample.
#[derive(Debug)]
pub(crate) struct DenyCache {
    shards: Box<[Shard]>,
    per_shard: usize,
    hasher: RandomState,
}

type Shard = Mutex<HashMap<(u32, Key), Entry>>;

#[derive(Debug)]
struct Entry {
    until: u64,
    outcome: PolicyOutcome,
}

impl DenyCache {
    pub(crate) fn new(max_entries: usize) -> Self {
        let shards = SHARDS.min(max_entries.max(1));
        DenyCache {
            shards: (0..shards).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: (max_entries / shards).max(1),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, id: u32, key: &Key) -> &Shard {
        let h = self.hasher.hash_one((id, key));
        &self.shards[(h >> 40) as usize % self.shards.len()]
    }

    /// A denial for `checks` if one of their enforced policies is known to be limited at `now`.
    pub(crate) fn lookup(&self, checks: &[Check], now: u64) -> Option<Decision> {
        for c in checks
            .iter()
            .filter(|c| c.mode == Mode::Enforce && c.cost > 0)
        {
            let map_key = (c.policy.id, c.key.clone());
            let mut shard = self
                .shard(c.policy.id, &c.key)
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match shard.get(&map_key) {
                Some(e) if e.until > now => {
                    let outcome = e.outcome.waiting(e.until - now);
                    return Some(Decision::new(vec![outcome]));
                }
                Some(_) => {
                    shard.remove(&map_key);
                }
                None => {}
            }
        }
        None
    }

    /// Remembers the violated enforced policies of a denied decision.
    pub(crate) fn remember(&self, checks: &[(u32, Key)], decision: &Decision, now: u64) {
        for ((id, key), outcome) in checks.iter().zip(decision.outcomes()) {
            let Some(retry) = outcome.retry_after() else {
                continue;
            };
            if outcome.is_allowed() || outcome.is_shadow() {
                continue;
            }
            let until = now + retry.as_micros() as u64;
            let mut shard = self
                .shard(*id, key)
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if shard.len() >= self.per_shard && !shard.contains_key(&(*id, key.clone())) {
                shard.retain(|_, e| e.until > now);
                if shard.len() >= self.per_shard {
                    let victim = shard
                        .iter()
                        .take(SAMPLE)
                        .min_by_key(|(_, e)| e.until)
                        .map(|(k, _)| k.clone());
                    if let Some(v) = victim {
                        shard.remove(&v);
                    }
                }
            }
            shard.insert(
                (*id, key.clone()),
                Entry {
                    until,
                    outcome: outcome.clone(),
                },
            );
        }
    }

    /// Entries held, expired or not.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}
