//! Where and as whom the store connects: the builder's node URLs read into redis-rs's
//! connection information once, with the credentials given beside the URL and the TLS
//! settings (feature `tls`) applied, all checked by `build()` before anything connects.

use std::fmt;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use redis::auth::{BasicAuth, StreamingCredentialsProvider};
use redis::{ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, RedisResult};

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
    /// Credentials that expire, asked for by every connection.
    pub(super) refreshed: Option<Refreshed>,
    /// Whether the connections are TLS (the URL's scheme).
    #[cfg(feature = "tls")]
    secure: bool,
    #[cfg(feature = "tls")]
    tls: Tls,
    /// The TLS connector of the connections the store makes itself (`dial.rs`): set for TLS
    /// with verification.
    #[cfg(feature = "tls")]
    connector: Option<tokio_rustls::TlsConnector>,
}

/// The builder's TLS settings: nothing without the feature.
#[cfg(feature = "tls")]
pub(super) type TlsSettings = Option<RedisTls>;
#[cfg(not(feature = "tls"))]
pub(super) type TlsSettings = ();

/// What a credentials provider answers: a username and a password, or why not.
pub(super) type Fetched = Result<(String, String), Box<dyn std::error::Error + Send + Sync>>;

/// Credentials that expire: asked for before each new connection and every `every` on each
/// connection, which then authenticates again (`AUTH`) with what it got.
#[derive(Clone)]
pub(super) struct Refreshed {
    fetch: Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Fetched> + Send>> + Send + Sync>,
    pub(super) every: Duration,
}

impl fmt::Debug for Refreshed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialsProvider")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

impl Refreshed {
    pub(super) fn new<F, Fut>(every: Duration, fetch: F) -> Refreshed
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Fetched> + Send + 'static,
    {
        Refreshed {
            fetch: Arc::new(move || Box::pin(fetch())),
            every,
        }
    }
}

impl StreamingCredentialsProvider for Refreshed {
    fn subscribe(&self) -> Pin<Box<dyn Stream<Item = RedisResult<BasicAuth>> + Send + 'static>> {
        let (fetch, every) = (self.fetch.clone(), self.every);
        Box::pin(futures_util::stream::unfold(true, move |first| {
            let fetch = fetch.clone();
            async move {
                if !first {
                    tokio::time::sleep(every).await;
                }
                let credentials = match fetch().await {
                    Ok((user, password)) => Ok(BasicAuth::new(user, password)),
                    Err(e) => Err(RedisError::from((
                        ErrorKind::AuthenticationFailed,
                        "the credentials provider failed",
                        e.to_string(),
                    ))),
                };
                Some((credentials, false))
            }
        }))
    }
}

impl Endpoints {
    /// Reads `urls` (a node each), applying `credentials` and `tls`.
    pub(super) fn read(
        urls: &[String],
        credentials: Option<&Credentials>,
        refreshed: Option<Refreshed>,
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
            nodes.push(info.set_tcp_settings(super::tcp::settings()));
        }
        #[cfg(feature = "tls")]
        let secure = nodes
            .first()
            .is_some_and(|n| matches!(n.addr(), redis::ConnectionAddr::TcpTls { .. }));
        #[cfg(feature = "tls")]
        let tls = tls.unwrap_or_default();
        #[cfg(feature = "tls")]
        let connector = match secure {
            true => {
                super::tls::install_crypto_provider();
                tls.connector()?
            }
            false => None,
        };
        Ok(Endpoints {
            nodes,
            refreshed,
            #[cfg(feature = "tls")]
            secure,
            #[cfg(feature = "tls")]
            tls,
            #[cfg(feature = "tls")]
            connector,
        })
    }

    /// How the store connects itself to the first node, with `config`: a TLS node with
    /// verification (feature `tls`); `None` for the others, which redis-rs connects.
    #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
    pub(super) fn redial(
        &self,
        config: redis::AsyncConnectionConfig,
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))] timeout: Duration,
    ) -> Result<super::redial::DialSource, String> {
        let config = self.connection_config(config);
        #[cfg(feature = "tls")]
        if let Some(connector) = &self.connector
            && let Some(dial) =
                super::dial::Dial::new(&self.nodes[0], connector.clone(), config.clone(), timeout)
        {
            return Ok(super::redial::DialSource::Node(dial));
        }
        let client = redis::Client::open(self.nodes[0].clone()).map_err(|e| e.to_string())?;
        Ok(super::redial::DialSource::Plain(Box::new((client, config))))
    }

    /// The TLS connector of the connections the store makes itself: TLS with verification.
    #[cfg(feature = "tls")]
    pub(super) fn connector(&self) -> Option<tokio_rustls::TlsConnector> {
        self.connector.clone()
    }

    /// Has the store dial the cluster's nodes itself when they are TLS with verification
    /// (feature `tls`), each connection within `timeout`; whether it does.
    #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
    pub(super) fn dial_cluster_nodes(&self, timeout: Duration) -> bool {
        #[cfg(feature = "tls")]
        if let (Some(connector), Some(first)) = (&self.connector, self.nodes.first()) {
            return super::dial::register(first, connector.clone(), timeout);
        }
        false
    }

    /// A connection's settings, with the credentials provider.
    pub(super) fn connection_config(
        &self,
        config: redis::AsyncConnectionConfig,
    ) -> redis::AsyncConnectionConfig {
        match &self.refreshed {
            Some(refreshed) => config.set_credentials_provider(refreshed.clone()),
            None => config,
        }
    }

    /// A cluster client builder over the nodes, with the TLS settings and the credentials
    /// provider. It sends no command again (the client's own retries would send a decision
    /// again after a connection dropped with its reply, charging it twice): a redirection is
    /// followed by the store (`AnyConn::redirected`), a decision that may have run never is.
    pub(super) fn cluster(&self) -> redis::cluster::ClusterClientBuilder {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.nodes.clone()).retries(0);
        if let Some(refreshed) = &self.refreshed {
            builder = builder.set_credentials_provider(refreshed.clone());
        }
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
            return super::tls::TIMED_OUT;
        }
        "timed out"
    }
}

/// A failed connection's cause in words, when the error tells it.
pub(super) fn explain(error: &str) -> Option<&'static str> {
    let error = error.to_ascii_lowercase();
    #[cfg(feature = "tls")]
    let tls = super::tls::CAUSES;
    #[cfg(not(feature = "tls"))]
    let tls: &[(&str, &str)] = &[];
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
    tls.iter()
        .chain(CAUSES)
        .find(|(needle, _)| error.contains(needle))
        .map(|(_, cause)| *cause)
}
