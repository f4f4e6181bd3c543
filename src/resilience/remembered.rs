//! What an instance saw denied, remembered to answer while the store fails: the denials and blocks
//! of policies, and the key entries of the deny list, each until its end. Looked at only when
//! the store errs or misses its deadline, whatever the failure policy: a client the instance
//! knows to be denied stays denied through an outage; one it never saw denied gets the failure
//! policy's answer.

use std::collections::HashMap;
use std::sync::Mutex;

use super::DenyCache;
use crate::decision::Decision;
use crate::key::Key;
use crate::store::{Check, lock};

/// The policies' denials remembered, at most (the deny cache's eviction past it).
pub(crate) const REMEMBERED_DENIALS: usize = 10_000;
/// The deny list's entries remembered, at most (the soonest to end dropped past it).
pub(crate) const REMEMBERED_ENTRIES: usize = 10_000;

#[derive(Debug)]
pub(crate) struct Remembered {
    denials: DenyCache,
    /// Keys on the deny list (as the lists' key makes them) to their end, on the layer's clock.
    entries: Mutex<HashMap<Key, u64>>,
}

impl Remembered {
    pub(crate) fn new() -> Self {
        Remembered {
            denials: DenyCache::new(REMEMBERED_DENIALS),
            entries: Mutex::default(),
        }
    }

    /// Holds the violated policies of a denied `decision` (`keys`: its checks) to their ends.
    pub(crate) fn denied(&self, keys: &[Check], decision: &Decision, now: u64) {
        self.denials.remember(keys, decision, now);
    }

    /// The denial a request of `keys` gets at `now` from what is remembered, if any.
    pub(crate) fn denial(&self, keys: &[Check], now: u64) -> Option<Decision> {
        self.denials.lookup(keys, now)
    }

    /// Forgets the denials remembered of `key` in the tier `id` (a reset, an allow entry).
    pub(crate) fn forget(&self, id: u32, key: &Key) {
        self.denials.forget(id, key);
    }

    /// Holds `key` as on the deny list until `until`.
    pub(crate) fn listed(&self, key: Key, until: u64, now: u64) {
        let mut entries = lock(&self.entries);
        if entries.len() >= REMEMBERED_ENTRIES && !entries.contains_key(&key) {
            entries.retain(|_, end| *end > now);
            if entries.len() >= REMEMBERED_ENTRIES
                && let Some(soonest) = entries.iter().min_by_key(|(_, end)| **end)
            {
                let soonest = soonest.0.clone();
                entries.remove(&soonest);
            }
        }
        entries.insert(key, until);
    }

    /// Forgets `key`'s deny entry (taken off the list).
    pub(crate) fn unlisted(&self, key: &Key) {
        lock(&self.entries).remove(key);
    }

    /// Whether `key` is remembered as on the deny list at `now`.
    pub(crate) fn is_listed(&self, key: &Key, now: u64) -> bool {
        let mut entries = lock(&self.entries);
        match entries.get(key) {
            Some(end) if *end > now => true,
            Some(_) => {
                entries.remove(key);
                false
            }
            None => false,
        }
    }
}
