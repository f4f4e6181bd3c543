//! Redis behind Sentinel: what a `redis+sentinel://` URL names, and the sentinels to ask for
//! the primary. The store holds one multiplexed connection to the primary the sentinels name
//! (redis-rs checks with `ROLE` that the node it reaches is a primary), found again when it
//! fails (`redial.rs`).

use std::time::Duration;

use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo};

use super::endpoint::Endpoints;
use super::redial::DialSource;
use crate::error::ConfigError;

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
        let (sentinels, addrs) = sentinel_addrs(hosts, secure, &fail)?;
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

/// The sentinels of a Sentinel URL's `hosts` (`host[:port]`, comma-separated; the sentinel
/// port by default), as written and as addresses.
fn sentinel_addrs(
    hosts: &str,
    secure: bool,
    fail: &dyn Fn(&str) -> ConfigError,
) -> Result<(Vec<String>, Vec<redis::ConnectionAddr>), ConfigError> {
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
    Ok((sentinels, addrs))
}

/// The source of the connection to the primary `target` names: the sentinels asked (with
/// the store's TLS settings), and each new connection's settings.
pub(super) fn source(
    target: &Target,
    endpoints: &Endpoints,
    config: AsyncConnectionConfig,
    #[cfg_attr(not(feature = "tls"), allow(unused_variables))] connect_timeout: Duration,
) -> Result<DialSource, String> {
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
    Ok(DialSource::Sentinels {
        client: Box::new(tokio::sync::Mutex::new(client)),
        master: target.master.clone(),
        config: endpoints.connection_config(config),
        #[cfg(feature = "tls")]
        dial: endpoints.connector().map(|c| (c, connect_timeout)),
    })
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
