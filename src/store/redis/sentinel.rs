//! Redis behind Sentinel: the primary found through the sentinels, and found again when it
//! fails.
//!
//! The store holds one multiplexed connection to the primary the sentinels name (redis-rs
//! checks with `ROLE` that the node it reaches is a primary). A decision that finds the
//! connection broken (the primary died: the socket closed or was refused), the node demoted
//! (`READONLY`), or no answer (a reply timeout, or a decision that missed its deadline and a
//! `PING` after it that missed its own), drops it, and one task asks the sentinels again,
//! every 100 ms until they name a primary that answers. Meanwhile decisions fail at once
//! (the layer's failure policy answers them, well within the deadline), without waiting for a
//! connection that is not there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwapOption;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, ServerErrorKind,
};

use super::endpoint::Endpoints;
use crate::error::{ConfigError, StoreError};

/// How long to wait between two rounds of asking the sentinels.
const RETRY: Duration = Duration::from_millis(100);

/// The default port of a sentinel.
const SENTINEL_PORT: u16 = 26379;

/// What a `redis+sentinel://` URL names.
#[derive(Clone)]
pub(super) struct Target {
    /// `host:port` of each sentinel, for messages.
    pub(super) sentinels: Vec<String>,
    addrs: Vec<ConnectionAddr>,
    pub(super) master: String,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    db: i64,
}

impl Target {
    /// Reads `redis+sentinel://[user:password@]host[:port],host[:port],…/<master name>[/<db>]`
    /// (without the scheme; `secure` for `rediss+sentinel://`, TLS to the sentinels and the
    /// primary). The credentials and database are the primary's (and the replicas'); the
    /// sentinels are asked without credentials.
    pub(super) fn parse(rest: &str, secure: bool) -> Result<Target, ConfigError> {
        let fail = |what: &str| {
            ConfigError::new(format!(
                "a Sentinel URL is redis+sentinel://[user:password@]host:port,host:port/<master name>[/<db>]: {what}"
            ))
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (hosts, path) = rest.split_once('/').ok_or_else(|| fail("no master name"))?;
        let (master, db) = match path.split_once('/') {
            Some((master, db)) => (master, db),
            None => (path, ""),
        };
        if master.is_empty() {
            return Err(fail("no master name"));
        }
        // The credentials and database, decoded as redis-rs decodes a `redis://` URL.
        let settings = format!(
            "redis://{}localhost/{}",
            auth.map(|a| format!("{a}@")).unwrap_or_default(),
            if db.is_empty() { "0" } else { db }
        );
        let settings = settings
            .as_str()
            .into_connection_info()
            .map_err(|e| fail(&format!("bad credentials or database ({e})")))?;
        let settings = settings.redis_settings();
        let mut sentinels = Vec::new();
        let mut addrs = Vec::new();
        for host in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            let has_port = match host.rfind(']') {
                Some(end) => host[end..].contains(':'),
                None => host.contains(':'),
            };
            let host = if has_port {
                host.to_owned()
            } else {
                format!("{host}:{SENTINEL_PORT}")
            };
            let scheme = if secure { "rediss" } else { "redis" };
            let info = format!("{scheme}://{host}")
                .as_str()
                .into_connection_info()
                .map_err(|e| fail(&format!("bad sentinel address {host:?} ({e})")))?;
            addrs.push(info.addr().clone());
            sentinels.push(host);
        }
        if addrs.is_empty() {
            return Err(fail("no sentinel address"));
        }
        Ok(Target {
            sentinels,
            addrs,
            master: master.to_owned(),
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
        })
    }
}

/// The connection to the primary of a Sentinel-watched Redis.
pub(super) struct Primary {
    client: tokio::sync::Mutex<SentinelClient>,
    /// The current connection; `None` while the primary is sought. Read by every decision,
    /// without a lock.
    current: ArcSwapOption<MultiplexedConnection>,
    /// A task is seeking the primary, or checking the current one.
    seeking: AtomicBool,
    config: AsyncConnectionConfig,
    /// How long one round of asking the sentinels and connecting may take.
    timeout: Duration,
    /// How long a `PING` may take.
    ping_timeout: Duration,
    master: String,
}

impl Primary {
    /// Asks the sentinels for the primary and connects to it, within `timeout`.
    pub(super) async fn connect(
        target: &Target,
        endpoints: &Endpoints,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Arc<Primary>, String> {
        let mut builder = SentinelClientBuilder::new(
            target.addrs.clone(),
            &target.master,
            SentinelServerType::Master,
        )
        .map_err(|e| e.to_string())?
        .set_client_to_redis_db(target.db);
        if let Some(user) = &target.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &target.password {
            builder = builder.set_client_to_redis_password(password);
        }
        let client = endpoints
            .sentinel(builder)
            .build()
            .map_err(|e| e.to_string())?;
        let primary = Arc::new(Primary {
            client: tokio::sync::Mutex::new(client),
            current: ArcSwapOption::empty(),
            seeking: AtomicBool::new(false),
            config: endpoints.connection_config(
                AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(response_timeout)),
            ),
            timeout: connect_timeout + response_timeout,
            ping_timeout: response_timeout,
            master: target.master.clone(),
        });
        let conn = primary.find().await?;
        primary.current.store(Some(Arc::new(conn)));
        Ok(primary)
    }

    /// One round: the sentinels' primary, connected.
    async fn find(&self) -> Result<MultiplexedConnection, String> {
        let finding = async {
            let mut client = self.client.lock().await;
            client.get_async_connection_with_config(&self.config).await
        };
        match tokio::time::timeout(self.timeout, finding).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// The current connection, or an error (and a search for the primary under way) when
    /// there is none.
    pub(super) fn get(self: &Arc<Self>) -> Result<Arc<MultiplexedConnection>, StoreError> {
        if let Some(current) = self.current.load_full() {
            return Ok(current);
        }
        self.seek();
        Err(StoreError::new(format!(
            "no Redis primary for {:?}: asking the sentinels (a failover may be under way)",
            self.master
        )))
    }

    /// A decision on `conn` failed with `error`: when it says the primary is gone or is one
    /// no longer, the connection is dropped and the primary sought.
    pub(super) fn failed(
        self: &Arc<Self>,
        conn: &Arc<MultiplexedConnection>,
        error: &redis::RedisError,
    ) {
        let gone = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.is_unrecoverable_error()
            || matches!(
                error.kind(),
                ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
            );
        if gone {
            self.drop_connection(conn, error);
        }
    }

    /// A decision missed its deadline: one `PING` (within the response timeout) tells a slow
    /// primary from one that is gone without a word.
    pub(super) fn missed_deadline(self: &Arc<Self>) {
        let Some(current) = self.current.load_full() else {
            return;
        };
        if self.seeking.swap(true, Ordering::AcqRel) {
            return;
        }
        let primary = self.clone();
        tokio::spawn(async move {
            let (cmd, mut conn) = (redis::cmd("PING"), (*current).clone());
            let ping = cmd.query_async::<()>(&mut conn);
            let result = tokio::time::timeout(primary.ping_timeout, ping).await;
            primary.seeking.store(false, Ordering::Release);
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => primary.drop_connection(&current, &e),
                Err(_) => primary.drop_connection(&current, &"no answer to PING"),
            }
        });
    }

    /// Drops `conn`, unless another decision dropped it already (and a new one may have come
    /// since), and seeks the primary.
    fn drop_connection(
        self: &Arc<Self>,
        conn: &Arc<MultiplexedConnection>,
        why: &dyn std::fmt::Display,
    ) {
        let previous = self.current.compare_and_swap(conn, None::<Arc<_>>);
        if !previous.as_ref().is_some_and(|p| Arc::ptr_eq(p, conn)) {
            return;
        }
        tracing::warn!(error = %why, master = %self.master, "lost the Redis primary; asking the sentinels");
        self.seek();
    }

    /// Seeks the primary on a task of its own (one at a time), until the sentinels name one
    /// that answers, or the store is dropped.
    fn seek(self: &Arc<Self>) {
        if self.seeking.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            while let Some(primary) = store.upgrade() {
                match primary.find().await {
                    Ok(conn) => {
                        primary.current.store(Some(Arc::new(conn)));
                        primary.seeking.store(false, Ordering::Release);
                        tracing::info!(
                            master = %primary.master,
                            after_ms = started.elapsed().as_millis() as u64,
                            "connected to the Redis primary the sentinels name"
                        );
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "no Redis primary from the sentinels yet");
                        drop(primary);
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sentinel_urls() {
        let t = Target::parse(
            "u:p%40ss@10.0.0.1:26380,10.0.0.2,[::1]:5000/mymaster/3",
            false,
        )
        .unwrap();
        assert_eq!(
            t.sentinels,
            ["10.0.0.1:26380", "10.0.0.2:26379", "[::1]:5000"]
        );
        assert_eq!(t.master, "mymaster");
        assert_eq!(t.db, 3);
        assert_eq!(t.username.as_deref(), Some("u"));
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        let t = Target::parse("127.0.0.1:26379/m", false).unwrap();
        assert_eq!((t.db, t.username, t.password), (0, None, None));
        for bad in ["127.0.0.1:26379", "127.0.0.1:26379/", "/m", "h:notaport/m"] {
            assert!(Target::parse(bad, false).is_err(), "{bad}");
        }
    }
}
