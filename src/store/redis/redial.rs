//! One multiplexed connection the store holds itself, and makes again when it is lost: to the
//! primary the sentinels name (`sentinel.rs`), to a TLS node the store dials itself
//! (`dial.rs`, feature `tls`), or to a node on plain TCP.
//!
//! A decision that finds the connection broken (the node died: the socket closed or was
//! refused), the node demoted (`READONLY`), or no answer (a reply timeout, or a decision that
//! missed its deadline and a `PING` after it that missed its own), drops it, and one task
//! connects again (asking the sentinels first, for a primary behind Sentinel), every 100 ms
//! until a node answers. Meanwhile decisions fail at once (the layer's failure policy answers
//! them, well within the deadline), without waiting for a connection that is not there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, ErrorKind, ServerErrorKind};

#[cfg(feature = "tls")]
use super::dial::Dial;
use crate::error::StoreError;

/// How long to wait between two rounds of connecting.
const RETRY: Duration = Duration::from_millis(100);

/// The longest a `PING` after a missed deadline may take (less when the response timeout is
/// shorter): a connection that goes silent is replaced within a deadline, this, and a connect.
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the connection goes.
pub(super) enum DialSource {
    /// The primary the sentinels name for `master`.
    Sentinels {
        /// Boxed: the client is large, and the other source small.
        client: Box<tokio::sync::Mutex<SentinelClient>>,
        master: String,
        config: AsyncConnectionConfig,
        /// The store dials a TLS primary itself (with verification), within the duration.
        #[cfg(feature = "tls")]
        dial: Option<(tokio_rustls::TlsConnector, Duration)>,
    },
    /// One TLS node.
    #[cfg(feature = "tls")]
    Node(Dial),
    /// One node on plain TCP, connected by redis-rs (boxed: the client is large).
    Plain(Box<(redis::Client, AsyncConnectionConfig)>),
}

impl DialSource {
    /// One round: the node, connected.
    async fn connect(&self) -> redis::RedisResult<MultiplexedConnection> {
        match self {
            DialSource::Sentinels {
                client,
                config,
                #[cfg(feature = "tls")]
                dial,
                ..
            } => {
                let primary = client.lock().await.async_get_client().await?;
                #[cfg(feature = "tls")]
                if let Some((connector, timeout)) = dial
                    && let Some(dial) = Dial::new(
                        primary.get_connection_info(),
                        connector.clone(),
                        config.clone(),
                        *timeout,
                    )
                {
                    return dial.connect().await;
                }
                primary
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            #[cfg(feature = "tls")]
            DialSource::Node(dial) => dial.connect().await,
            DialSource::Plain(plain) => {
                let (client, config) = &**plain;
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
        }
    }

    /// What is sought, for messages.
    fn what(&self) -> String {
        match self {
            DialSource::Sentinels { master, .. } => format!("the Redis primary for {master:?}"),
            #[cfg(feature = "tls")]
            DialSource::Node(dial) => format!("Redis at {}", dial.addr()),
            DialSource::Plain(plain) => {
                format!("Redis at {}", plain.0.get_connection_info().addr())
            }
        }
    }

    /// Why a round may have timed out.
    fn timed_out(&self) -> &'static str {
        match self {
            DialSource::Sentinels { .. } => "timed out",
            #[cfg(feature = "tls")]
            DialSource::Node(_) => super::tls::TIMED_OUT,
            DialSource::Plain(_) => "timed out",
        }
    }

    /// How the store calls its connection.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "tls")]
            DialSource::Sentinels { dial: Some(_), .. } => "sentinel (TLS, coalesced writes)",
            DialSource::Sentinels { .. } => "sentinel",
            #[cfg(feature = "tls")]
            DialSource::Node(_) => "multiplexed (TLS, coalesced writes)",
            DialSource::Plain(_) => "multiplexed",
        }
    }
}

/// The connection, and the one task that makes it again.
pub(super) struct Redial {
    source: DialSource,
    /// The current connection; `None` while none is made. Read by every decision, without a
    /// lock.
    current: ArcSwapOption<MultiplexedConnection>,
    /// A task is connecting, or checking the current connection.
    seeking: AtomicBool,
    /// How long one round of connecting may take.
    timeout: Duration,
    /// How long a `PING` may take.
    ping_timeout: Duration,
}

impl Redial {
    /// Connects to `source` (a round within `timeout`, a `PING` within `ping_timeout`).
    pub(super) async fn connect(
        source: DialSource,
        timeout: Duration,
        ping_timeout: Duration,
    ) -> Result<Arc<Redial>, String> {
        let redial = Arc::new(Redial {
            source,
            current: ArcSwapOption::empty(),
            seeking: AtomicBool::new(false),
            timeout,
            ping_timeout,
        });
        let conn = redial.find().await?;
        redial.current.store(Some(Arc::new(conn)));
        Ok(redial)
    }

    pub(super) fn source(&self) -> &DialSource {
        &self.source
    }

    /// One round, within the timeout.
    async fn find(&self) -> Result<MultiplexedConnection, String> {
        match tokio::time::timeout(self.timeout, self.source.connect()).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(self.source.timed_out().into()),
        }
    }

    /// The current connection, or an error (and a new connection under way) when there is
    /// none.
    pub(super) fn get(self: &Arc<Self>) -> Result<Arc<MultiplexedConnection>, StoreError> {
        if let Some(current) = self.current.load_full() {
            return Ok(current);
        }
        self.seek();
        Err(StoreError::new(match &self.source {
            DialSource::Sentinels { master, .. } => format!(
                "no Redis primary for {master:?}: asking the sentinels (a failover may be under way)"
            ),
            #[cfg(feature = "tls")]
            DialSource::Node(_) => format!("no connection to {}: connecting", self.source.what()),
            DialSource::Plain(_) => format!("no connection to {}: connecting", self.source.what()),
        }))
    }

    /// A decision on `conn` failed with `error`: when it says the node is gone or is no
    /// longer a primary, the connection is dropped and made again.
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
    /// node from one that is gone without a word.
    pub(super) fn missed_deadline(self: &Arc<Self>) {
        let Some(current) = self.current.load_full() else {
            return;
        };
        if self.seeking.swap(true, Ordering::AcqRel) {
            return;
        }
        let redial = self.clone();
        tokio::spawn(async move {
            let (cmd, mut conn) = (redis::cmd("PING"), (*current).clone());
            let ping = cmd.query_async::<()>(&mut conn);
            let result = tokio::time::timeout(redial.ping_timeout, ping).await;
            redial.seeking.store(false, Ordering::Release);
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => redial.drop_connection(&current, &e),
                Err(_) => redial.drop_connection(&current, &"no answer to PING"),
            }
        });
    }

    /// Drops `conn`, unless another decision dropped it already (and a new one may have come
    /// since), and connects again.
    fn drop_connection(
        self: &Arc<Self>,
        conn: &Arc<MultiplexedConnection>,
        why: &dyn std::fmt::Display,
    ) {
        let previous = self.current.compare_and_swap(conn, None::<Arc<_>>);
        if !previous.as_ref().is_some_and(|p| Arc::ptr_eq(p, conn)) {
            return;
        }
        let what = self.source.what();
        tracing::warn!(error = %why, "lost the connection to {what}; connecting again");
        self.seek();
    }

    /// Connects on a task of its own (one at a time), until a node answers, or the store is
    /// dropped.
    fn seek(self: &Arc<Self>) {
        if self.seeking.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            while let Some(redial) = store.upgrade() {
                match redial.find().await {
                    Ok(conn) => {
                        redial.current.store(Some(Arc::new(conn)));
                        redial.seeking.store(false, Ordering::Release);
                        let what = redial.source.what();
                        tracing::info!(
                            after_ms = started.elapsed().as_millis() as u64,
                            "connected to {what}"
                        );
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "no connection to {} yet", redial.source.what());
                        drop(redial);
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        });
    }
}
