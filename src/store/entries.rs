//! The keys put on the allow or deny list at runtime: one record per key holding the end of
//! each of its two entries. A store that decides in this process (memory) keeps the records
//! here, in the `Registry`; Redis keeps each as a string beside the key's states
//! (`store/redis/lists.lua` writes it, the decision reads it in the same call).

use std::collections::HashMap;
use std::sync::RwLock;

use crate::key::Key;

/// What a key's runtime entries say of it now: the answer of the lists' step, typed (a
/// denial never stands for an allowance).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Listing {
    /// On neither list: the policies decide.
    #[default]
    Neither,
    /// On the allow list: neither limited nor counted.
    Allowed,
    /// On the deny list (which wins over the allow list), for `left_us` more.
    Denied { left_us: u64 },
}

impl Listing {
    /// `self` in four bytes, as a decision keeps it (in the padding after its verdict): 0 on
    /// neither list, `u32::MAX` allowed, else denied for that many seconds, rounded up (at
    /// most 136 years, more than the longest entry).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn pack(self) -> u32 {
        match self {
            Listing::Neither => 0,
            Listing::Allowed => u32::MAX,
            Listing::Denied { left_us } => u32::try_from(left_us.div_ceil(1_000_000).max(1))
                .map_or(u32::MAX - 1, |s| s.min(u32::MAX - 1)),
        }
    }

    /// What [`pack`](Self::pack) packed (a denial's time to the second).
    pub(crate) fn unpack(packed: u32) -> Self {
        match packed {
            0 => Listing::Neither,
            u32::MAX => Listing::Allowed,
            s => Listing::Denied {
                left_us: u64::from(s) * 1_000_000,
            },
        }
    }
}

/// The ends of a key's two entries, in microseconds of the store's clock (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ends {
    deny: u64,
    allow: u64,
}

impl Ends {
    /// What these ends say at `now`.
    pub(crate) fn listing(self, now: u64) -> Listing {
        if self.deny > now {
            Listing::Denied {
                left_us: self.deny - now,
            }
        } else if self.allow > now {
            Listing::Allowed
        } else {
            Listing::Neither
        }
    }
}

/// The records of a store that keeps them in this process.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    records: RwLock<HashMap<Key, Ends>>,
}

impl Entries {
    /// What `key`'s entries say at `now`.
    pub(crate) fn listing(&self, key: &Key, now: u64) -> Listing {
        let records = self.records.read().unwrap_or_else(|e| e.into_inner());
        records
            .get(key)
            .map_or(Listing::Neither, |e| e.listing(now))
    }

    /// Sets the end of `key`'s deny entry (`deny`) or allow entry to `ends` (at or before
    /// `now`: takes it off); records whose entries have all ended are dropped on the way.
    pub(crate) fn keep(&self, key: Key, deny: bool, ends: u64, now: u64) {
        let mut records = self.records.write().unwrap_or_else(|e| e.into_inner());
        let record = records.entry(key).or_default();
        *(if deny {
            &mut record.deny
        } else {
            &mut record.allow
        }) = ends;
        records.retain(|_, e| e.deny.max(e.allow) > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deny_entry_wins_and_ended_entries_go() {
        let entries = Entries::default();
        let key = Key::from("a");
        entries.keep(key.clone(), false, 100, 0);
        assert_eq!(entries.listing(&key, 10), Listing::Allowed);
        entries.keep(key.clone(), true, 50, 10);
        assert_eq!(entries.listing(&key, 10), Listing::Denied { left_us: 40 });
        assert_eq!(entries.listing(&key, 50), Listing::Allowed);
        entries.keep(key.clone(), false, 0, 60);
        assert_eq!(entries.listing(&key, 60), Listing::Neither);
        assert!(entries.records.read().unwrap().is_empty());
    }

    #[test]
    fn a_listing_packs_in_four_bytes() {
        for (listing, back) in [
            (Listing::Neither, Listing::Neither),
            (Listing::Allowed, Listing::Allowed),
            (
                Listing::Denied { left_us: 1 },
                Listing::Denied { left_us: 1_000_000 },
            ),
            (
                Listing::Denied { left_us: 3_000_000 },
                Listing::Denied { left_us: 3_000_000 },
            ),
            (
                Listing::Denied { left_us: u64::MAX },
                Listing::Denied {
                    left_us: u64::from(u32::MAX - 1) * 1_000_000,
                },
            ),
        ] {
            assert_eq!(Listing::unpack(listing.pack()), back);
        }
    }
}
