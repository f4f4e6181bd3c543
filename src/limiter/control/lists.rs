//! The lists' runtime entries (keys and networks put on them, kept in the store) and the
//! lists given to the layer reloaded.

use std::time::SystemTime;

use super::Control;
use crate::error::{ConfigError, LimitError};
use crate::key::{Cidr, Key};
use crate::lists::Lists;
use crate::store::{Listed, Store, Stored};

impl<St: Store> Control<St> {
    /// Puts `key` on the deny list (`deny`) or the allow list until `until` (`None`: until it
    /// is removed), kept in the store; or takes it off (`remove`). An end already past is an
    /// error, never a removal.
    pub(crate) fn list_key(
        &self,
        deny: bool,
        key: &Key,
        until: Option<SystemTime>,
        remove: bool,
    ) -> Result<impl Future<Output = Result<(), LimitError>> + use<St>, LimitError> {
        let lists = (self.engine.lists)
            .as_ref()
            .filter(|l| l.present().in_store())
            .ok_or(LimitError::NoLists)?;
        let keys = (lists.present().entry_keys(key)).map_err(LimitError::Entry)?;
        let now = self.engine.clock.now_micros();
        let us = match (remove, until) {
            (true, _) => 0,
            (false, None) => LISTED_FOR_GOOD_US,
            (false, Some(until)) => {
                let (until, now) = self.until_us(until)?;
                (until - now).min(LISTED_FOR_GOOD_US)
            }
        };
        self.engine.store.registry().mark_listed();
        let mut kept = Vec::with_capacity(keys.len());
        for key in keys {
            if !deny && !remove {
                self.engine.forget_denials(&key);
            }
            // This instance holds its own word through an outage of the store.
            if deny && let Some(remembered) = &self.engine.remembered {
                match us {
                    0 => remembered.unlisted(&key),
                    us => remembered.listed(key.clone(), now.saturating_add(us), now),
                }
            }
            kept.push(self.engine.store.keep_entry(key, deny, us, now));
        }
        Ok(async move {
            for entry in kept {
                entry.await.map_err(LimitError::Store)?;
            }
            Ok(())
        })
    }

    /// Puts `network` on the deny list (`deny`) or the allow list until `until` (`None`:
    /// until it is removed), or takes it off (`remove`): in the registry's networks at once
    /// in memory; with Redis in the string every instance reads, and this instance's then.
    pub(crate) fn list_network(
        &self,
        deny: bool,
        network: Cidr,
        until: Option<SystemTime>,
        remove: bool,
    ) -> Result<impl Future<Output = Result<(), LimitError>> + use<St>, LimitError> {
        self.engine
            .lists
            .as_ref()
            .filter(|l| l.present().in_store())
            .ok_or(LimitError::NoLists)?;
        let now = self.engine.clock.now_micros();
        let until_us = match (remove, until) {
            (true, _) => now,
            (false, None) => now.saturating_add(LISTED_FOR_GOOD_US),
            (false, Some(until)) => self.until_us(until)?.0,
        };
        let entry = Listed::new(network, deny, until_us);
        let stored = self.engine.store.store_network(entry, remove, now);
        let store = self.engine.store.clone();
        Ok(async move {
            let networks = store.registry().networks();
            match stored.await.map_err(LimitError::Store)? {
                Stored::Here => networks
                    .change(entry, remove, now)
                    .map_err(LimitError::Network)?,
                // The store kept it within its bound; what is held here past it holds
                // entries the store dropped, which the next read corrects.
                Stored::Kept => drop(networks.change(entry, remove, now)),
                Stored::Full => return Err(LimitError::Network(crate::store::full_networks())),
            }
            Ok(())
        })
    }

    /// Replaces the lists given to the layer (its runtime entries stay).
    pub(crate) fn reload_lists(&self, lists: &Lists) -> Result<(), ConfigError> {
        let Some(present) = &self.engine.lists else {
            return Err(ConfigError::new(
                "the layer was built without lists; build it with .lists(Lists::new()) to reload them",
            ));
        };
        let compiled = lists.compile(&self.engine.key)?;
        crate::lists::leases_with_lists::<St>(self.engine.leases().is_some(), compiled.in_store())?;
        present.replace(compiled);
        Ok(())
    }
}

/// How long an entry without an end lasts: a hundred years.
const LISTED_FOR_GOOD_US: u64 = 100 * 365 * 86_400 * 1_000_000;
