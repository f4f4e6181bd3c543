//! The lists' runtime entries kept in Redis. The networks (see `store/networks.rs`): one
//! string under the store's prefix, changed by one script (`networks.lua`) and read with
//! `GET`. A key's entries (see `store/entries.rs`): its record, beside its states, written
//! by `lists.lua` and read by the decision. Both use only the commands the decision needs.

use std::sync::Arc;

use super::call::INJECTED_CLOCK_TTL_SLACK_MS;
use super::{Inner, redis_key};
use crate::error::StoreError;
use crate::key::Key;
use crate::lists::RECORDS;
use crate::store::networks::{MOST, READ_EVERY};
use crate::store::{Listed, Stored};

/// The script that changes the string.
const CHANGE: &str = include_str!("networks.lua");
/// The script that changes a key's record.
const KEEP: &str = include_str!("lists.lua");

impl Inner {
    /// The string's key.
    fn networks_key(&self) -> String {
        format!("{}!networks", self.prefix)
    }

    /// Puts `entry` in the string, or takes it out (`remove`), within the deadline: `Kept`,
    /// or `Full`.
    pub(super) async fn store_network(
        &self,
        entry: Listed,
        remove: bool,
        now_us: u64,
    ) -> Result<Stored, StoreError> {
        let link = self.linking.get(&self.target)?;
        let key = self.networks_key();
        let line = if remove { String::new() } else { entry.line() };
        let slack = if self.clock.is_some() {
            INJECTED_CLOCK_TTL_SLACK_MS
        } else {
            0
        };
        let change = link.conn.with(|mut c| async move {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(CHANGE).arg(1).arg(&key).arg(entry.name()).arg(line);
            cmd.arg(now_us).arg(MOST).arg(slack);
            cmd.query_async::<Option<String>>(&mut c).await
        });
        match tokio::time::timeout(self.deadline, change).await {
            Ok(result) => Ok(result?.map_or(Stored::Full, |_| Stored::Kept)),
            Err(_) => Err(self.missed_deadline()),
        }
    }

    /// Sets the end of `key`'s deny entry (`deny`) or allow entry to `us` from now (0: takes
    /// it off), within the deadline; now is Redis's time, as the decision's (the injected
    /// clock's `now_us` when there is one).
    pub(super) async fn keep_entry(
        &self,
        key: Key,
        deny: bool,
        us: u64,
        now_us: u64,
    ) -> Result<(), StoreError> {
        let link = self.linking.get(&self.target)?;
        let record = redis_key(&self.prefix, RECORDS, &key);
        let (now, slack) = match self.clock {
            Some(_) => (now_us.to_string(), INJECTED_CLOCK_TTL_SLACK_MS),
            None => (String::new(), 0),
        };
        let list = if deny { "deny" } else { "allow" };
        let keep = link.conn.with(|mut c| async move {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(KEEP)
                .arg(1)
                .arg(&record)
                .arg(list)
                .arg(us)
                .arg(now)
                .arg(slack);
            cmd.query_async::<i64>(&mut c).await
        });
        match tokio::time::timeout(self.deadline, keep).await {
            Ok(result) => {
                result?;
                Ok(())
            }
            Err(_) => Err(self.missed_deadline()),
        }
    }

    /// Reads the string into the registry's networks, for a request at `began_us` on the
    /// layer's clock, within the store's deadline (at most [`READ_EVERY`]): what they held
    /// stays when the read fails.
    pub(super) async fn read_networks(self: Arc<Self>, began_us: u64) {
        let networks = self.registry.networks();
        // Dropped before it ends (its runtime shut down), the read is ended uncounted: else
        // the claim would stay taken, and requests on another runtime wait for it forever.
        let mut unended = Unended(Some((networks, began_us)));
        let seen = networks.changes();
        let read = async {
            let link = self.linking.get(&self.target)?;
            let key = self.networks_key();
            (link.conn)
                .with(|mut c| async move {
                    redis::cmd("GET")
                        .arg(&key)
                        .query_async::<Option<String>>(&mut c)
                        .await
                })
                .await
        };
        let counts = match tokio::time::timeout(self.deadline.min(READ_EVERY), read).await {
            Ok(Ok(text)) => networks.replace(text.as_deref().unwrap_or(""), seen),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read the networks listed at runtime");
                true
            }
            Err(_) => {
                tracing::debug!("reading the networks listed at runtime timed out");
                true
            }
        };
        unended.0 = None;
        networks.read(began_us, counts);
    }
}

/// A read of the networks under way, ended uncounted if dropped before it ends.
struct Unended<'a>(Option<(&'a crate::store::Networks, u64)>);

impl Drop for Unended<'_> {
    fn drop(&mut self) {
        if let Some((networks, began_us)) = self.0.take() {
            networks.read(began_us, false);
        }
    }
}
