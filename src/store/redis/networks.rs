//! The networks listed at runtime, kept in Redis (see `store/networks.rs`): one string under
//! the store's prefix, changed by one script (`networks.lua`) and read with `GET`, the
//! commands the decision already needs.

use std::sync::Arc;

use super::Inner;
use super::call::INJECTED_CLOCK_TTL_SLACK_MS;
use crate::error::StoreError;
use crate::store::networks::{MOST, READ_EVERY};
use crate::store::{Listed, Stored};

/// The script that changes the string.
const CHANGE: &str = include_str!("networks.lua");

impl Inner {
    /// The string's key.
    fn networks_key(&self) -> String {
        format!("{}!networks", self.prefix)
    }

    /// Puts `entry` in the string, or takes it out (`remove`), within the deadline: the
    /// string after it, or `Full`.
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
            Ok(result) => Ok(result?.map_or(Stored::Full, Stored::Text)),
            Err(_) => Err(self.missed_deadline()),
        }
    }

    /// Reads the string into the registry's networks, within [`READ_EVERY`]; what they held
    /// stays when the read fails.
    pub(super) async fn read_networks(self: Arc<Self>) {
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
        match tokio::time::timeout(READ_EVERY, read).await {
            Ok(Ok(text)) => self
                .registry
                .networks()
                .replace(text.as_deref().unwrap_or("")),
            Ok(Err(e)) => tracing::debug!(error = %e, "cannot read the networks listed at runtime"),
            Err(_) => tracing::debug!("reading the networks listed at runtime timed out"),
        }
        self.registry.networks().read();
    }
}
