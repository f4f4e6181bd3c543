//! TLS to Redis (feature `tls`): the settings users give, checked, applied to each node's
//! connection information, and a failed handshake told by its cause.
//!
//! Which connections are TLS is the URL's scheme (`rediss://`, `rediss+cluster://`,
//! `rediss+sentinel://`); [`RedisTls`] says what to trust and how to be known. Everything here
//! is checked by `build()`, before anything connects.

use std::fmt;

use redis::{ConnectionAddr, ConnectionInfo};

use crate::error::ConfigError;

/// TLS settings of a [`RedisStore`](super::RedisStore) (feature `tls`), given to
/// [`RedisStoreBuilder::tls`](super::RedisStoreBuilder::tls).
///
/// A `rediss://` URL alone is TLS against the system's trusted roots (the platform's
/// certificate store, read by `rustls-native-certs`), which is what managed services
/// (ElastiCache, Upstash, Azure Cache, Memorystore, Redis Cloud) need. A `RedisTls` adds what a
/// self-hosted Redis needs: the CA that signed its certificate, and a client certificate for
/// mutual TLS (`tls-auth-clients yes`). The server's certificate is always checked against the
/// host name of the URL.
///
/// ```no_run
/// use tower_ratelimit::{RedisStore, RedisTls};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let tls = RedisTls::new()
///     .ca_pem(std::fs::read("ca.crt")?)
///     .client_certificate(std::fs::read("client.crt")?, std::fs::read("client.key")?);
/// let store = RedisStore::builder("rediss://redis.internal:6380")
///     .tls(tls)
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
///
/// A certificate or key that is not PEM, a CA file without a certificate, or TLS settings
/// with a plain-text `redis://` URL are errors of `build()`; so is a handshake that fails (an
/// unknown CA, a name mismatch, an expired certificate, a port that does not speak TLS), with
/// its cause named.
#[derive(Clone, Default)]
pub struct RedisTls {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
    insecure: bool,
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.as_ref().map(|_| "custom"))
            .field("client_certificate", &self.client.is_some())
            .field("insecure", &self.insecure)
            .finish()
    }
}

impl RedisTls {
    /// TLS verified against the system's trusted roots, without a client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificates in `pem` (one or more `BEGIN CERTIFICATE` blocks) instead of
    /// the system's roots.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// Presents this certificate (its chain, PEM) and private key (PEM: PKCS#8, PKCS#1 or
    /// SEC1) to servers that ask for one (mutual TLS, `tls-auth-clients yes`).
    pub fn client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// **For development only**: accepts any certificate from the server, unverified: anyone
    /// on the path can read and change the traffic, credentials included. The store logs a
    /// warning at `build()`. A custom CA and a client certificate still apply.
    pub fn danger_accept_invalid_certificates(mut self, accept: bool) -> Self {
        self.insecure = accept;
        self
    }

    /// Checks every PEM given, as `build()` does, so that a program can report a bad file
    /// before it connects: the error says which setting is at fault
    /// ([`RedisTlsError::setting`]) and what is wrong with it.
    ///
    /// ```
    /// use tower_ratelimit::{RedisTls, TlsSetting};
    ///
    /// let tls = RedisTls::new().ca_pem("not a certificate");
    /// let error = tls.check().unwrap_err();
    /// assert_eq!(error.setting(), TlsSetting::Ca);
    /// assert!(error.to_string().starts_with("RedisTls::ca_pem: "), "{error}");
    /// ```
    pub fn check(&self) -> Result<(), RedisTlsError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certificates = |pem: &[u8], setting: TlsSetting| {
            let count = CertificateDer::pem_slice_iter(pem)
                .try_fold(0, |n, c| c.map(|_| n + 1))
                .map_err(|e| RedisTlsError::new(setting, format!("not valid PEM ({e})")))?;
            match count {
                0 => Err(RedisTlsError::new(
                    setting,
                    "holds no certificate (no BEGIN CERTIFICATE block)",
                )),
                _ => Ok(()),
            }
        };
        if let Some(ca) = &self.ca {
            certificates(ca, TlsSetting::Ca)?;
        }
        if let Some((cert, key)) = &self.client {
            certificates(cert, TlsSetting::ClientCertificate)?;
            PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                RedisTlsError::new(
                    TlsSetting::ClientKey,
                    format!("not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
                )
            })?;
        }
        Ok(())
    }

    /// The settings as redis-rs takes them, each PEM checked.
    pub(super) fn read(&self) -> Result<Tls, ConfigError> {
        self.check()
            .map_err(|e| ConfigError::new(format!("TLS: {e}")))?;
        let certs = (self.ca.is_some() || self.client.is_some()).then(|| redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        });
        Ok(Tls {
            certs,
            insecure: self.insecure,
        })
    }
}

/// Which setting of a [`RedisTls`] an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsSetting {
    /// The CA certificates ([`RedisTls::ca_pem`]).
    Ca,
    /// The client certificate's chain ([`RedisTls::client_certificate`]'s first argument).
    ClientCertificate,
    /// The client certificate's private key ([`RedisTls::client_certificate`]'s second
    /// argument).
    ClientKey,
}

impl TlsSetting {
    /// How the setting is named in messages.
    fn name(self) -> &'static str {
        match self {
            TlsSetting::Ca => "RedisTls::ca_pem",
            TlsSetting::ClientCertificate => "RedisTls::client_certificate (the certificate)",
            TlsSetting::ClientKey => "RedisTls::client_certificate (the key)",
        }
    }
}

/// A [`RedisTls`] setting that cannot be used ([`RedisTls::check`]): which one, and why.
///
/// Displayed as the setting's name, then the problem: `RedisTls::ca_pem: holds no
/// certificate (no BEGIN CERTIFICATE block)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisTlsError {
    setting: TlsSetting,
    problem: String,
}

impl RedisTlsError {
    fn new(setting: TlsSetting, problem: impl Into<String>) -> Self {
        RedisTlsError {
            setting,
            problem: problem.into(),
        }
    }

    /// The setting at fault.
    pub fn setting(&self) -> TlsSetting {
        self.setting
    }

    /// What is wrong with it, without the setting's name.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for RedisTlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting.name(), self.problem)
    }
}

impl std::error::Error for RedisTlsError {}

/// The TLS settings, read.
#[derive(Clone, Default)]
pub(super) struct Tls {
    certs: Option<redis::TlsCertificates>,
    insecure: bool,
}

impl Tls {
    /// `info` with the TLS settings applied; `info` must be a `rediss://` one.
    pub(super) fn apply(&self, info: ConnectionInfo) -> Result<ConnectionInfo, ConfigError> {
        let ConnectionAddr::TcpTls { host, port, .. } = info.addr().clone() else {
            return Err(ConfigError::new(
                "TLS settings were given but the URL is plain text: use rediss:// (rediss+cluster://, rediss+sentinel://)",
            ));
        };
        let mut info = info;
        if self.insecure {
            tracing::warn!(
                %host, port,
                "TLS to Redis accepts any certificate (danger_accept_invalid_certificates): for development only"
            );
            info = info.set_addr(ConnectionAddr::TcpTls {
                host,
                port,
                insecure: true,
                tls_params: None,
            });
        }
        match &self.certs {
            Some(certs) => redis::Client::build_with_tls(info, certs.clone())
                .map(|client| client.get_connection_info().clone())
                .map_err(|e| ConfigError::new(format!("TLS: {e}"))),
            None => Ok(info),
        }
    }

    /// The TLS connector of the connections the store makes itself (`dial.rs`): trusting the
    /// CA given, else the system's roots, and presenting the client certificate if one is
    /// given. `None` when verification is off: redis-rs connects those (for development only,
    /// they need no speed).
    pub(super) fn connector(&self) -> Result<Option<tokio_rustls::TlsConnector>, ConfigError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        if self.insecure {
            return Ok(None);
        }
        let fail = |what: &str, e: &dyn fmt::Display| ConfigError::new(format!("TLS: {what}: {e}"));
        let mut roots = rustls::RootCertStore::empty();
        match self.certs.as_ref().and_then(|c| c.root_cert.as_deref()) {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| fail(TlsSetting::Ca.name(), &e))?;
                    roots
                        .add(cert)
                        .map_err(|e| fail(TlsSetting::Ca.name(), &e))?;
                }
            }
            None => {
                // An unreadable file among the system's certificates is not fatal; no root at
                // all is.
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    let why = found
                        .errors
                        .first()
                        .map_or_else(|| "none found".to_owned(), std::string::ToString::to_string);
                    return Err(fail("the system's trusted roots", &why));
                }
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let client = self.certs.as_ref().and_then(|c| c.client_tls.as_ref());
        let config = match client {
            Some(client) => {
                let chain = CertificateDer::pem_slice_iter(&client.client_cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| fail(TlsSetting::ClientCertificate.name(), &e))?;
                let key = PrivateKeyDer::from_pem_slice(&client.client_key)
                    .map_err(|e| fail(TlsSetting::ClientKey.name(), &e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| fail(TlsSetting::ClientKey.name(), &e))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Some(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
            config,
        ))))
    }

    /// `builder` with the certificates.
    pub(super) fn cluster(
        &self,
        builder: redis::cluster::ClusterClientBuilder,
    ) -> redis::cluster::ClusterClientBuilder {
        match &self.certs {
            Some(certs) => builder.certs(certs.clone()),
            None => builder,
        }
    }

    /// `builder` with TLS to the sentinels and to the primary.
    pub(super) fn sentinel(
        &self,
        builder: redis::sentinel::SentinelClientBuilder,
    ) -> redis::sentinel::SentinelClientBuilder {
        let mode = match self.insecure {
            true => redis::TlsMode::Insecure,
            false => redis::TlsMode::Secure,
        };
        let builder = builder
            .set_client_to_sentinel_tls_mode(mode)
            .set_client_to_redis_tls_mode(mode);
        match &self.certs {
            Some(certs) => builder
                .set_client_to_sentinel_certificates(certs.clone())
                .set_client_to_redis_certificates(certs.clone()),
            None => builder,
        }
    }
}

/// Why a TLS connection may have timed out.
pub(super) const TIMED_OUT: &str =
    "timed out: no answer to the TLS handshake (a plain-text port? it needs redis://)";

/// rustls asks for the process's crypto provider: ring's is installed unless the application
/// installed one (with two providers built in, rustls cannot choose one by itself).
pub(super) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one meanwhile; either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The causes of a failed TLS connection: a needle of the (lowercased) error, and its cause
/// in words.
pub(super) const CAUSES: &[(&str, &str)] = &[
    (
        "unknownissuer",
        "the server's certificate is not signed by a trusted CA (give its CA with RedisTls::ca_pem)",
    ),
    (
        "not valid for name",
        "the server's certificate is not valid for the host name in the URL",
    ),
    (
        "certificate expired",
        "the server's certificate has expired",
    ),
    (
        "certificaterequired",
        "the server requires a client certificate (RedisTls::client_certificate)",
    ),
    (
        "unknownca",
        "the server does not trust the client certificate's CA",
    ),
    (
        "badcertificate",
        "the server refused the client certificate",
    ),
    (
        "invalid peer certificate",
        "the server's certificate is not valid",
    ),
    (
        "invalidcontenttype",
        "the server does not speak TLS on this port (use redis://, or the TLS port)",
    ),
    (
        "corrupt message",
        "the server does not speak TLS on this port (use redis://, or the TLS port)",
    ),
];
