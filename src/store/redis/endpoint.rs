//! Where and as whom the store connects: the builder's node URLs read into redis-rs's
//! connection information once, with the credentials given beside the URL and the TLS
//! settings (feature `tls`) applied, all checked by `build()` before anything connects.

use std::fmt;

use redis::{ConnectionInfo, IntoConnectionInfo};

#[cfg(feature = "tls")]
use super::tls::{RedisTls, Tls};
use crate::error::ConfigError;

/// `scheme://host:port` of a URL, without credentials or path, for messages.
pub(super) fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let host = rest.split('/').next().unwrap_or(rest);
    format!("{scheme}://{host}")
}

/// Credentials given beside the URL; the password is never printed.
#[derive(Clone)]
pub(super) struct Credentials {
    pub(super) username: Option<String>,
    pub(super) password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The nodes to connect to, read and checked.
#[derive(Clone)]
pub(super) struct Endpoints {
    /// Each node's connection information, credentials and TLS applied.
    pub(super) nodes: Vec<ConnectionInfo>,
    /// Whether the connections are TLS (the URL's scheme).
    #[cfg(feature = "tls")]
    secure: bool,
    #[cfg(feature = "tls")]
    tls: Tls,
}

/// The builder's TLS settings: nothing without the feature.
#[cfg(feature = "tls")]
pub(super) type TlsSettings = Option<RedisTls>;
#[cfg(not(feature = "tls"))]
pub(super) type TlsSettings = ();

impl Endpoints {
    /// Reads `urls` (a node each), applying `credentials` and `tls`.
    pub(super) fn read(
        urls: &[String],
        credentials: Option<&Credentials>,
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))] tls: &TlsSettings,
    ) -> Result<Endpoints, ConfigError> {
        #[cfg(feature = "tls")]
        let tls = tls.as_ref().map(RedisTls::read).transpose()?;
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            let mut info = url.as_str().into_connection_info().map_err(|e| {
                ConfigError::new(format!("cannot read the Redis URL {}: {e}", redact(url)))
            })?;
            if let Some(c) = credentials {
                let mut settings = info.redis_settings().clone().set_password(&c.password);
                if let Some(user) = &c.username {
                    settings = settings.set_username(user);
                }
                info = info.set_redis_settings(settings);
            }
            #[cfg(feature = "tls")]
            if let Some(tls) = &tls {
                info = tls.apply(info)?;
            }
            nodes.push(info);
        }
        #[cfg(feature = "tls")]
        let secure = nodes
            .first()
            .is_some_and(|n| matches!(n.addr(), redis::ConnectionAddr::TcpTls { .. }));
        #[cfg(feature = "tls")]
        if secure {
            super::tls::install_crypto_provider();
        }
        Ok(Endpoints {
            nodes,
            #[cfg(feature = "tls")]
            secure,
            #[cfg(feature = "tls")]
            tls: tls.unwrap_or_default(),
        })
    }

    /// Whether certificates were given that a cluster pool could not use (deadpool builds its
    /// cluster client from the URLs alone).
    pub(super) fn has_certificates(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.has_certificates();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// A cluster client builder over the nodes, with the TLS settings.
    pub(super) fn cluster(&self) -> redis::cluster::ClusterClientBuilder {
        let builder = redis::cluster::ClusterClientBuilder::new(self.nodes.clone());
        #[cfg(feature = "tls")]
        let builder = self.tls.cluster(builder);
        builder
    }

    /// A Sentinel client builder with the TLS settings, to the sentinels and to the primary.
    pub(super) fn sentinel(
        &self,
        builder: redis::sentinel::SentinelClientBuilder,
    ) -> redis::sentinel::SentinelClientBuilder {
        #[cfg(feature = "tls")]
        if self.secure {
            return self.tls.sentinel(builder);
        }
        builder
    }
}

impl Endpoints {
    /// Why a connection may have timed out.
    pub(super) fn timed_out(&self) -> &'static str {
        #[cfg(feature = "tls")]
        if self.secure {
            return "timed out: no answer to the TLS handshake (a plain-text port? it needs redis://)";
        }
        "timed out"
    }
}

/// A failed connection's cause in words, when the error tells it.
pub(super) fn explain(error: &str) -> Option<&'static str> {
    let error = error.to_ascii_lowercase();
    #[cfg(feature = "tls")]
    if let Some(cause) = super::tls::explain(&error) {
        return Some(cause);
    }
    const CAUSES: &[(&str, &str)] = &[
        (
            "connection reset by peer",
            "the server closed the connection at once (a TLS-only port? it needs rediss://)",
        ),
        (
            "authentication failed",
            "Redis refused the credentials (the username or password is wrong, or the user is disabled)",
        ),
        (
            "wrongpass",
            "Redis refused the credentials (the username or password is wrong, or the user is disabled)",
        ),
        (
            "noauth",
            "Redis requires a password (give it in the URL or with RedisStoreBuilder::credentials)",
        ),
        (
            "noperm",
            "the Redis user lacks a permission the store needs (see the Redis guide's ACL line)",
        ),
    ];
    CAUSES
        .iter()
        .find(|(needle, _)| error.contains(needle))
        .map(|(_, cause)| *cause)
}
