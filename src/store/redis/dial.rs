//! TLS connections to one node made by the store itself (feature `tls`), so that their
//! writes are coalesced ([`Coalesce`]): TCP with `TCP_NODELAY` (the batches are made here, not
//! by the kernel), the rustls handshake with the store's [`connector`](super::tls::Tls::connector),
//! then redis-rs's multiplexed connection over the stream, which authenticates and selects
//! the database as it does on its own connections.
//!
//! A cluster's nodes are connected by redis-rs's cluster, through the `Connect` of the
//! store's node type (`cluster::Node`), which is given nothing but each node's connection
//! information: the connector is found by the TLS parameters in it ([`for_node`]), which are
//! a function of the certificates the store gave (so two stores with the same parameters
//! share a connector built from the same certificates).

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, RedisConnectionInfo,
    RedisError,
};
use tokio_rustls::TlsConnector;

use super::coalesce::Coalesce;

/// How to reach one TLS node.
#[derive(Clone)]
pub(super) struct Dial {
    host: String,
    port: u16,
    settings: RedisConnectionInfo,
    connector: TlsConnector,
    config: AsyncConnectionConfig,
    /// How long connecting (TCP, TLS, `HELLO`/`AUTH`) may take.
    timeout: Duration,
}

impl fmt::Debug for Dial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dial")
            .field("addr", &self.addr())
            .finish_non_exhaustive()
    }
}

impl Dial {
    /// `info` must name a TLS node (`rediss://`); `None` otherwise.
    pub(super) fn new(
        info: &ConnectionInfo,
        connector: TlsConnector,
        config: AsyncConnectionConfig,
        timeout: Duration,
    ) -> Option<Dial> {
        let ConnectionAddr::TcpTls { host, port, .. } = info.addr() else {
            return None;
        };
        Some(Dial {
            host: host.clone(),
            port: *port,
            settings: info.redis_settings().clone(),
            connector,
            config,
            timeout,
        })
    }

    /// `host:port`, for messages.
    pub(super) fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Connects, within the timeout.
    pub(super) async fn connect(&self) -> redis::RedisResult<MultiplexedConnection> {
        match tokio::time::timeout(self.timeout, self.connect_now()).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from((
                ErrorKind::Io,
                "cannot connect",
                super::tls::TIMED_OUT.to_owned(),
            ))),
        }
    }

    async fn connect_now(&self) -> redis::RedisResult<MultiplexedConnection> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
        tcp.set_nodelay(true)?;
        super::tcp::keepalive(&tcp)?;
        let name = rustls::pki_types::ServerName::try_from(self.host.clone()).map_err(|e| {
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "not a host name TLS can check",
                e.to_string(),
            ))
        })?;
        let stream = self.connector.connect(name, tcp).await?;
        let (conn, driver) = MultiplexedConnection::new_with_config(
            &self.settings,
            Coalesce::new(stream),
            self.config.clone(),
        )
        .await?;
        // It ends when the last clone of the connection is dropped.
        tokio::spawn(driver);
        Ok(conn)
    }
}

/// The connectors of the clusters whose nodes the store dials, by their TLS parameters (one
/// entry per distinct set of certificates in the process).
static CLUSTERS: Mutex<Vec<(String, TlsConnector, Duration)>> = Mutex::new(Vec::new());

/// The key of `info`'s TLS parameters: `None` when it is not TLS, or TLS without verification
/// (redis-rs connects those).
fn key(info: &ConnectionInfo) -> Option<String> {
    match info.addr() {
        ConnectionAddr::TcpTls {
            insecure: false,
            tls_params,
            ..
        } => Some(format!("{tls_params:?}")),
        _ => None,
    }
}

/// Registers `connector` (and the connect timeout) for the cluster nodes whose TLS parameters
/// are `info`'s; whether `info` is such a node.
pub(super) fn register(info: &ConnectionInfo, connector: TlsConnector, timeout: Duration) -> bool {
    let Some(key) = key(info) else {
        return false;
    };
    let mut clusters = CLUSTERS.lock().unwrap_or_else(PoisonError::into_inner);
    clusters.retain(|(k, _, _)| *k != key);
    clusters.push((key, connector, timeout));
    true
}

/// How the store dials the cluster node `info`, with `config`: `None` when no store registered
/// its TLS parameters (plain text, or TLS without verification).
pub(super) fn for_node(info: &ConnectionInfo, config: &AsyncConnectionConfig) -> Option<Dial> {
    let key = key(info)?;
    let clusters = CLUSTERS.lock().unwrap_or_else(PoisonError::into_inner);
    let (_, connector, timeout) = clusters.iter().find(|(k, _, _)| *k == key)?;
    Dial::new(info, connector.clone(), config.clone(), *timeout)
}
