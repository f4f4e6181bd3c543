//! TLS connections to one node made by the store itself (feature `tls`), so that their
//! writes are coalesced ([`Coalesce`]): TCP with `TCP_NODELAY` (the batches are made here, not
//! by the kernel), the rustls handshake with the store's [`connector`](super::tls::Tls::connector),
//! then redis-rs's multiplexed connection over the stream, which authenticates and selects
//! the database as it does on its own connections.

use std::fmt;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError};
use tokio_rustls::TlsConnector;

use super::coalesce::Coalesce;

/// How to reach one TLS node.
#[derive(Clone)]
pub(super) struct Dial {
    info: ConnectionInfo,
    connector: TlsConnector,
    config: AsyncConnectionConfig,
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
    ) -> Option<Dial> {
        matches!(info.addr(), ConnectionAddr::TcpTls { .. }).then(|| Dial {
            info: info.clone(),
            connector,
            config,
        })
    }

    /// `host:port`, for messages.
    pub(super) fn addr(&self) -> String {
        match self.info.addr() {
            ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
            other => other.to_string(),
        }
    }

    /// Connects (the caller bounds how long it may take).
    pub(super) async fn connect(&self) -> redis::RedisResult<MultiplexedConnection> {
        let ConnectionAddr::TcpTls { host, port, .. } = self.info.addr() else {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "not a TLS address",
            )));
        };
        let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
        tcp.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| {
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "not a host name TLS can check",
                e.to_string(),
            ))
        })?;
        let stream = self.connector.connect(name, tcp).await?;
        let (conn, driver) = MultiplexedConnection::new_with_config(
            self.info.redis_settings(),
            Coalesce::new(stream),
            self.config.clone(),
        )
        .await?;
        // It ends when the last clone of the connection is dropped.
        tokio::spawn(driver);
        Ok(conn)
    }
}
