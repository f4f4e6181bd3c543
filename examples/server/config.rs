//! The demo server's configuration, read from environment variables.

use std::net::SocketAddr;

use tower_ratelimit::admin::AdminToken;
use tower_ratelimit::config::Limits;
use tower_ratelimit::headers::HeaderStyle;
use tower_ratelimit::key::{Cidr, ClientIp, GlobalKey, HeaderKey, KeyExtractor, PeerIp};
use tower_ratelimit::{Algorithm, FailurePolicy, calendar::Calendar, settle::Settle};

pub(crate) struct Config {
    pub(crate) bind: SocketAddr,
    pub(crate) admin_bind: Option<SocketAddr>,
    /// `ADMIN_TOKEN`: the bearer token of `/admin/*`; without it they answer loopback only.
    pub(crate) admin_token: Option<AdminToken>,
    /// The policy file, and its policies as read at start.
    pub(crate) file: Option<(String, Limits)>,
    pub(crate) redis_url: Option<String>,
    pub(crate) prefix: String,
    pub(crate) on_store_error: FailurePolicy,
    pub(crate) store_timeout: std::time::Duration,
    pub(crate) algorithm: Algorithm,
    pub(crate) rate_limit: String,
    pub(crate) lease: Option<u32>,
    pub(crate) wait: Option<std::time::Duration>,
    pub(crate) concurrency: Option<(u32, std::time::Duration)>,
    pub(crate) headers: HeaderStyle,
    pub(crate) key: String,
    pub(crate) trusted_proxies: Vec<Cidr>,
    /// Where every RATE_LIMIT policy reads a response's real cost (COST_HEADER, COST_BODY).
    pub(crate) settle: Option<Settle>,
    /// The header /spend sets.
    pub(crate) cost_header: String,
    /// The calendar every RATE_LIMIT policy counts periods in (TIME_ZONE, WEEK_STARTS,
    /// MONTH_STARTS).
    pub(crate) calendar: Option<Calendar>,
    /// The name of the one RATE_LIMIT policy (POLICY_NAME), if given.
    pub(crate) policy_name: Option<String>,
    pub(crate) per_thread_reads: Option<bool>,
    /// The header naming a request's priority and the percent of `RATE_LIMIT` kept for
    /// `critical` ones (`PRIORITY_HEADER`, `RESERVE`).
    pub(crate) reserve: Option<(String, u8)>,
    /// `GET /work` and its adaptive limit (`WORK_CAPACITY`, `ADAPTIVE`...).
    pub(crate) overload: Option<crate::overload::Overload>,
    /// The memory store's bound on keys (`MAX_KEYS`).
    pub(crate) max_keys: Option<usize>,
    /// The lists and the warning before the limit (`DENY`, `ALLOW`, `NEAR_LIMIT`).
    pub(crate) abuse: crate::abuse::Abuse,
    /// What the policies read of request bodies (`BODY_KEY`, `BODY_COST`, `JSONRPC`,
    /// `BODY_LIMIT`).
    pub(crate) bodies: crate::bodies::Bodies,
    /// The limits on the messages of `/ws` (`MESSAGE_LIMIT`, `ON_MESSAGE_LIMIT`).
    pub(crate) sockets: crate::sockets::Sockets,
    pub(crate) redis_access: RedisAccess,
    /// `HEADER_TIMEOUT_MS`: how long a connection may go without a request head.
    pub(crate) header_timeout: std::time::Duration,
}

/// Credentials and TLS settings for Redis, read (files included) at start.
#[derive(Default)]
pub(crate) struct RedisAccess {
    username: Option<String>,
    password: Option<String>,
    tls: Option<tower_ratelimit::RedisTls>,
}

impl RedisAccess {
    /// REDIS_USERNAME, REDIS_PASSWORD, REDIS_CA, REDIS_CLIENT_CERT and REDIS_CLIENT_KEY; an
    /// unreadable file stops the server, naming its variable.
    fn read() -> Result<RedisAccess, String> {
        let file = |name: &str| -> Result<Option<Vec<u8>>, String> {
            match env_or(name, "")?.as_str() {
                "" => Ok(None),
                path => std::fs::read(path)
                    .map(Some)
                    .map_err(|e| format!("{name}: cannot read {path:?}: {e}")),
            }
        };
        let optional = |name: &str| env_or(name, "").map(|v| Some(v).filter(|v| !v.is_empty()));
        let (username, password) = (optional("REDIS_USERNAME")?, optional("REDIS_PASSWORD")?);
        if username.is_some() && password.is_none() {
            return Err("REDIS_USERNAME: set REDIS_PASSWORD too".into());
        }
        let ca = file("REDIS_CA")?;
        let client = match (file("REDIS_CLIENT_CERT")?, file("REDIS_CLIENT_KEY")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => return Err("REDIS_CLIENT_CERT: set REDIS_CLIENT_KEY too".into()),
            (None, Some(_)) => return Err("REDIS_CLIENT_KEY: set REDIS_CLIENT_CERT too".into()),
        };
        let tls = (ca.is_some() || client.is_some()).then(|| {
            let mut tls = tower_ratelimit::RedisTls::new();
            if let Some(ca) = ca {
                tls = tls.ca_pem(ca);
            }
            if let Some((cert, key)) = client {
                tls = tls.client_certificate(cert, key);
            }
            tls
        });
        // A file that is not what its variable says stops the server, naming the variable.
        if let Some(Err(e)) = tls.as_ref().map(tower_ratelimit::RedisTls::check) {
            let variable = match e.setting() {
                tower_ratelimit::TlsSetting::Ca => "REDIS_CA",
                tower_ratelimit::TlsSetting::ClientCertificate => "REDIS_CLIENT_CERT",
                _ => "REDIS_CLIENT_KEY",
            };
            return Err(format!("{variable}: {}", e.problem()));
        }
        Ok(RedisAccess {
            username,
            password,
            tls,
        })
    }

    pub(crate) fn apply(
        &self,
        mut builder: tower_ratelimit::RedisStoreBuilder,
    ) -> tower_ratelimit::RedisStoreBuilder {
        match (&self.username, &self.password) {
            (Some(user), Some(password)) => builder = builder.credentials(user, password),
            (None, Some(password)) => builder = builder.password(password),
            _ => {}
        }
        if let Some(tls) = &self.tls {
            builder = builder.tls(tls.clone());
        }
        builder
    }
}

/// A positive number read from `name`, if set.
pub(crate) fn positive(name: &str) -> Result<Option<u32>, String> {
    match env_or(name, "")?.as_str() {
        "" => Ok(None),
        n => match n.parse::<u32>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("{name}: {n:?} is not a positive number")),
        },
    }
}

pub(crate) fn env_or(name: &str, default: &str) -> Result<String, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(default.to_owned()),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name}: not valid UTF-8")),
    }
}

/// `ADMIN_TOKEN`, required when the admin routes are served on an address other machines
/// reach (`ADMIN_BIND`, or `BIND` without it).
fn admin_token(
    bind: SocketAddr,
    admin_bind: Option<SocketAddr>,
) -> Result<Option<AdminToken>, String> {
    let token = match env_or("ADMIN_TOKEN", "")?.as_str() {
        "" => None,
        t => Some(AdminToken::new(t).map_err(|e| format!("ADMIN_TOKEN: {e}"))?),
    };
    let (served, on) = match admin_bind {
        Some(addr) => (addr, "ADMIN_BIND"),
        None => (bind, "BIND, as ADMIN_BIND is unset"),
    };
    if token.is_none() && !served.ip().is_loopback() {
        return Err(format!(
            "ADMIN_TOKEN: the admin routes would answer anyone on {served} ({on}); set ADMIN_TOKEN, or ADMIN_BIND to a loopback address such as 127.0.0.1:9090"
        ));
    }
    Ok(token)
}

/// Whether `net` holds a loopback address (of `127.0.0.0/8`, or `::1`).
fn covers_loopback(net: &Cidr) -> bool {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    net.addr().is_loopback()
        || net.contains(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)))
        || net.contains(IpAddr::V6(Ipv6Addr::LOCALHOST))
}

/// The client address behind `trusted_proxies` (`TRUSTED_PROXIES`).
pub(crate) fn client_ip(trusted_proxies: &[Cidr]) -> Result<ClientIp, String> {
    (trusted_proxies.iter())
        .fold(ClientIp::builder(), |b, &net| b.trusted_network(net))
        .build()
        .map_err(|e| format!("TRUSTED_PROXIES: {e}"))
}

/// The layer's key of `KEY=spec`; `listed`: whether `DENY` or `ALLOW`, which read
/// `trusted_proxies` too, is set.
pub(crate) fn key_extractor(
    spec: &str,
    trusted_proxies: &[Cidr],
    listed: bool,
) -> Result<Box<dyn KeyExtractor>, String> {
    if spec != "client_ip" && !trusted_proxies.is_empty() && !listed {
        return Err(format!(
            "TRUSTED_PROXIES: only used with KEY=client_ip and by DENY and ALLOW, but KEY is {spec:?} and neither is set"
        ));
    }
    match spec {
        "ip" => Ok(Box::new(PeerIp::new())),
        "client_ip" => client_ip(trusted_proxies).map(|k| Box::new(k) as Box<dyn KeyExtractor>),
        "global" => Ok(Box::new(GlobalKey)),
        _ => match spec.strip_prefix("header:") {
            Some(name) => HeaderKey::try_new(name)
                .map(|k| Box::new(k) as Box<dyn KeyExtractor>)
                .map_err(|e| format!("KEY: {e}")),
            None => Err(format!(
                "KEY: unknown key {spec:?}; expected ip, client_ip, global or header:<name>"
            )),
        },
    }
}

/// The policies of the file at `path`; a mistake names the file and its line.
pub(crate) fn read_limits(path: &str) -> Result<Limits, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("CONFIG {path}: cannot read it: {e}"))?;
    Limits::from_toml(&text).map_err(|e| format!("CONFIG {path}: {e}"))
}

/// Where the policies come from, to name it in an error.
pub(crate) fn source(config: &Config) -> String {
    match &config.file {
        Some((path, _)) => format!("CONFIG {path}"),
        None => "RATE_LIMIT".into(),
    }
}

/// The variables a policy file replaces.
const REPLACED_BY_CONFIG: [&str; 16] = [
    "ALGORITHM",
    "RATE_LIMIT",
    "KEY",
    "TRUSTED_PROXIES",
    "LEASE",
    "WAIT_MS",
    "CONCURRENCY",
    "CONCURRENCY_MAX_MS",
    "COST_HEADER",
    "COST_BODY",
    "TIME_ZONE",
    "WEEK_STARTS",
    "MONTH_STARTS",
    "POLICY_NAME",
    "PRIORITY_HEADER",
    "RESERVE",
];

pub(crate) fn config() -> Result<Config, String> {
    let file = match env_or("CONFIG", "")?.as_str() {
        "" => None,
        path => {
            let set: Vec<&str> = REPLACED_BY_CONFIG
                .into_iter()
                .chain(crate::abuse::REPLACED_BY_CONFIG)
                .chain(crate::bodies::REPLACED_BY_CONFIG)
                .filter(|name| env_or(name, "").is_ok_and(|v| !v.is_empty()))
                .collect();
            if !set.is_empty() {
                return Err(format!(
                    "CONFIG: the file {path} describes the policies whole, so {} cannot be set with it; drop {} (or drop CONFIG)",
                    set.join(", "),
                    set.join(" and ")
                ));
            }
            Some((path.to_owned(), read_limits(path)?))
        }
    };
    let bind = env_or("BIND", "127.0.0.1:3000")?;
    let bind = bind
        .parse()
        .map_err(|_| format!("BIND: {bind:?} is not an address such as 127.0.0.1:3000"))?;
    let admin_bind = match env_or("ADMIN_BIND", "")?.as_str() {
        "" => None,
        addr => Some(addr.parse().map_err(|_| {
            format!("ADMIN_BIND: {addr:?} is not an address such as 127.0.0.1:9090")
        })?),
    };
    let admin_token = admin_token(bind, admin_bind)?;
    let calendar = calendar()?;
    let trusted_proxies: Vec<Cidr> = env_or("TRUSTED_PROXIES", "")?
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|e| format!("TRUSTED_PROXIES: {e}"))
        })
        .collect::<Result<_, _>>()?;
    if admin_token.is_none()
        && let Some(net) = trusted_proxies.iter().find(|net| covers_loopback(net))
    {
        return Err(format!(
            "ADMIN_TOKEN: TRUSTED_PROXIES trusts a proxy on this machine ({net}), whose clients would all reach the admin routes as loopback clients; set ADMIN_TOKEN"
        ));
    }
    let rate_limit = env_or("RATE_LIMIT", "10/s")?;
    // Calendar periods are counted by the fixed window.
    let monthly = rate_limit.split(',').any(|q| {
        q.parse::<tower_ratelimit::Quota>()
            .is_ok_and(|q| q.is_monthly())
    });
    let default_algorithm = match calendar.is_some() || monthly {
        true => "fixed_window",
        false => "gcra",
    };
    let algorithm = env_or("ALGORITHM", default_algorithm)?
        .parse()
        .map_err(|e| format!("ALGORITHM: {e}"))?;
    let redis_url = match env_or("REDIS_URL", "")? {
        url if url.is_empty() => None,
        url => Some(url),
    };
    let lease = match env_or("LEASE", "")?.as_str() {
        "" => None,
        units => match (units.parse::<u32>(), &redis_url) {
            (Ok(units), Some(_)) if units > 0 => Some(units),
            (Ok(_), None) => {
                return Err(format!(
                    "LEASE: leases share a limit kept in Redis between instances; set REDIS_URL too, or drop LEASE={units}"
                ));
            }
            _ => {
                return Err(format!(
                    "LEASE: {units:?} is not a positive number of units"
                ));
            }
        },
    };
    let wait = match env_or("WAIT_MS", "")?.as_str() {
        "" => None,
        ms => match ms.parse::<u64>() {
            Ok(ms) if (1..=3_600_000).contains(&ms) => Some(std::time::Duration::from_millis(ms)),
            _ => {
                return Err(format!(
                    "WAIT_MS: {ms:?} is not a number of milliseconds from 1 to 3600000"
                ));
            }
        },
    };
    let concurrency = match env_or("CONCURRENCY", "")?.as_str() {
        "" => None,
        n => {
            let n = match n.parse::<u32>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(format!(
                        "CONCURRENCY: {n:?} is not a positive number of requests"
                    ));
                }
            };
            let ms = env_or("CONCURRENCY_MAX_MS", "60000")?;
            let max = match ms.parse::<u64>() {
                Ok(ms) if ms > 0 => std::time::Duration::from_millis(ms),
                _ => {
                    return Err(format!(
                        "CONCURRENCY_MAX_MS: {ms:?} is not a positive number of milliseconds"
                    ));
                }
            };
            Some((n, max))
        }
    };
    if let (Some(_), Some(_)) = (wait, lease) {
        return Err(
            "WAIT_MS: a request cannot wait for a lease's units; drop WAIT_MS or LEASE".into(),
        );
    }
    let per_thread_reads = match (env_or("PER_THREAD_READS", "")?.as_str(), &redis_url) {
        ("", _) => None,
        ("false" | "0", _) => Some(false),
        ("true" | "1", None) => Some(true),
        ("true" | "1", Some(_)) => {
            let why = "a choice of the memory store; unset REDIS_URL or PER_THREAD_READS";
            return Err(format!("PER_THREAD_READS: {why}"));
        }
        (other, _) => {
            return Err(format!(
                "PER_THREAD_READS: {other:?} is neither true nor false"
            ));
        }
    };
    let max_keys = match (positive("MAX_KEYS")?, &redis_url) {
        (Some(_), Some(_)) => {
            return Err(
                "MAX_KEYS: a bound of the memory store; unset REDIS_URL or MAX_KEYS".into(),
            );
        }
        (n, _) => n.map(|n| n as usize),
    };
    let reserve = match (env_or("PRIORITY_HEADER", "")?, env_or("RESERVE", "")?) {
        (header, percent) if header.is_empty() && percent.is_empty() => None,
        (header, _) if header.is_empty() => {
            return Err(
                "RESERVE: keeps capacity for the requests PRIORITY_HEADER names; set it too".into(),
            );
        }
        (header, percent) => match percent.parse::<u8>() {
            Ok(p) if (1..=99).contains(&p) => Some((header, p)),
            _ => {
                return Err(format!(
                    "RESERVE: {percent:?} is not a percent of RATE_LIMIT from 1 to 99"
                ));
            }
        },
    };
    let header_timeout = {
        let default = crate::serve::HEADER_TIMEOUT.as_millis().to_string();
        let ms = env_or("HEADER_TIMEOUT_MS", &default)?;
        match ms.parse::<u64>() {
            Ok(ms) if (100..=3_600_000).contains(&ms) => std::time::Duration::from_millis(ms),
            _ => {
                return Err(format!(
                    "HEADER_TIMEOUT_MS: {ms:?} is not a number of milliseconds from 100 to 3600000"
                ));
            }
        }
    };
    let abuse = crate::abuse::read(&trusted_proxies)?;
    // What a block on violation cannot go with, named here rather than as RATE_LIMIT's error.
    if abuse.escalation.is_some() {
        let with = [
            (
                wait.is_some(),
                "WAIT_MS (a request over the limit waits, it is not denied)",
            ),
            (lease.is_some(), "LEASE (units spent without asking Redis)"),
            (reserve.is_some(), "RESERVE (capacity kept for priority)"),
        ];
        if let Some((_, name)) = with.into_iter().find(|(set, _)| *set) {
            return Err(format!(
                "BLOCK_FOR: a block on violation cannot go with {name}; drop one of them"
            ));
        }
    }
    let redis_access = RedisAccess::read()?;
    if redis_url.is_none() {
        for name in [
            "REDIS_USERNAME",
            "REDIS_PASSWORD",
            "REDIS_CA",
            "REDIS_CLIENT_CERT",
        ] {
            if !env_or(name, "")?.is_empty() {
                return Err(format!("{name}: a setting of Redis; set REDIS_URL too"));
            }
        }
    }
    Ok(Config {
        bind,
        admin_bind,
        admin_token,
        file,
        redis_url,
        redis_access,
        header_timeout,
        prefix: env_or("PREFIX", "rl:")?,
        on_store_error: match env_or("ON_STORE_ERROR", "open")?.as_str() {
            "open" => FailurePolicy::Open,
            "closed" => FailurePolicy::Closed,
            "local" => FailurePolicy::Local { divisor: 1 },
            other => {
                return Err(format!(
                    "ON_STORE_ERROR: unknown value {other:?}; expected open, closed or local"
                ));
            }
        },
        store_timeout: {
            let ms = env_or("STORE_TIMEOUT_MS", "50")?;
            match ms.parse::<u64>() {
                Ok(ms) if ms > 0 => std::time::Duration::from_millis(ms),
                _ => {
                    return Err(format!(
                        "STORE_TIMEOUT_MS: {ms:?} is not a positive number of milliseconds"
                    ));
                }
            }
        },
        algorithm,
        rate_limit,
        calendar,
        policy_name: policy_name()?,
        lease,
        wait,
        concurrency,
        headers: env_or("HEADERS", "legacy")?
            .parse()
            .map_err(|e| format!("HEADERS: {e}"))?,
        key: env_or("KEY", "ip")?,
        settle: settle()?,
        cost_header: env_or("COST_HEADER", "x-cost")?,
        per_thread_reads,
        max_keys,
        reserve,
        overload: crate::overload::read()?,
        abuse,
        bodies: crate::bodies::Bodies::from_env()?,
        sockets: crate::sockets::Sockets::from_env()?,
        trusted_proxies,
    })
}

/// POLICY_NAME, checked as a policy's name is.
fn policy_name() -> Result<Option<String>, String> {
    let name = env_or("POLICY_NAME", "")?;
    if name.is_empty() {
        return Ok(None);
    }
    tower_ratelimit::RateLimitLayer::builder()
        .policy(tower_ratelimit::Policy::gcra("1/s").name(name.as_str()))
        .build()
        .map_err(|e| format!("POLICY_NAME: {e}"))?;
    Ok(Some(name))
}

/// The calendar of TIME_ZONE, WEEK_STARTS and MONTH_STARTS, if any is set (UTC without
/// TIME_ZONE).
fn calendar() -> Result<Option<Calendar>, String> {
    let zone = env_or("TIME_ZONE", "")?;
    let week = env_or("WEEK_STARTS", "")?;
    let month = env_or("MONTH_STARTS", "")?;
    if zone.is_empty() && week.is_empty() && month.is_empty() {
        return Ok(None);
    }
    let mut calendar = match zone.as_str() {
        "" => Calendar::utc(),
        zone => Calendar::in_zone(zone).map_err(|e| format!("TIME_ZONE: {e}"))?,
    };
    if !week.is_empty() {
        let day = week.parse().map_err(|e| format!("WEEK_STARTS: {e}"))?;
        calendar = calendar.week_starts_on(day);
    }
    if !month.is_empty() {
        let day = month
            .parse()
            .ok()
            .filter(|d| (1..=31).contains(d))
            .ok_or_else(|| format!("MONTH_STARTS: {month:?} is not a day of the month, 1 to 31"))?;
        calendar = calendar.month_starts_on(day);
    }
    Ok(Some(calendar))
}

/// Where a response's real cost is read, from COST_HEADER or COST_BODY.
fn settle() -> Result<Option<Settle>, String> {
    match (
        env_or("COST_HEADER", "")?.as_str(),
        env_or("COST_BODY", "")?.as_str(),
    ) {
        ("", "") => Ok(None),
        (name, "") => {
            // Checked here, so that a typo is reported as COST_HEADER's.
            HeaderKey::try_new(name).map_err(|e| format!("COST_HEADER: {e}"))?;
            Ok(Some(Settle::header(name)))
        }
        ("", "bytes") => Ok(Some(Settle::body_bytes())),
        ("", json) if json.starts_with("json:") => {
            let pointer = &json["json:".len()..];
            tower_ratelimit::key::json(pointer).map_err(|e| format!("COST_BODY: {e}"))?;
            Ok(Some(Settle::json(pointer)))
        }
        ("", other) => Err(format!(
            "COST_BODY: unknown value {other:?}; expected bytes or json:<pointer>"
        )),
        _ => Err("COST_HEADER and COST_BODY: a policy settles from one; drop one".into()),
    }
}
