//! The demo server: an axum app behind a `RateLimitLayer`, configured by environment variables.
//!
//! ```text
//! cargo run --example server
//! for i in $(seq 1 15); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/; done
//! ```
//!
//! Run `cargo run --example server -- --help` for the variables.
//!
//! `GET /metrics` (Prometheus) and `GET /admin/top` (the keys limited most) are never rate
//! limited, and are served on `ADMIN_BIND` instead of `BIND` when it is set.

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Router;
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower_ratelimit::axum::AxumBody;
use tower_ratelimit::config::Limits;
use tower_ratelimit::headers::HeaderStyle;
use tower_ratelimit::key::{Cidr, ClientIp, GlobalKey, HeaderKey, KeyExtractor, PeerIp};
use tower_ratelimit::top::TopLimited;
use tower_ratelimit::{
    Algorithm, Calendar, FailurePolicy, Policy, RateLimitLayer, RedisStore, Settle, Store,
};

const HELP: &str = "\
tower-ratelimit demo server

Environment variables:
  BIND        address to listen on                  (default 127.0.0.1:3000)
  ADMIN_BIND  address of /metrics and /admin/top, to keep them off the public address
                                                    (default unset: served on BIND)
  CONFIG      a TOML file of policies, e.g. examples/limits.toml, instead of ALGORITHM,
              RATE_LIMIT, KEY, TRUSTED_PROXIES, LEASE, WAIT_MS and CONCURRENCY (which it
              replaces; setting both is an error). Reloaded on SIGHUP, keeping every key's
              usage; a file with a mistake is rejected and the old limits stay.
                                                    (default unset)
  REDIS_URL   unset: in-memory store; set: Redis (the server starts while Redis is down;
              ON_STORE_ERROR answers until it is up), e.g. redis://127.0.0.1:6379,
              redis+cluster://127.0.0.1:7000,127.0.0.1:7001 for a Redis Cluster, or
              redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster for the primary
              Redis Sentinel names; rediss://, rediss+cluster:// and rediss+sentinel://
              are TLS, trusting the system's roots unless REDIS_CA is set
                                                    (default unset)
  REDIS_USERNAME, REDIS_PASSWORD
              with REDIS_URL: the Redis ACL user and its password (or REDIS_PASSWORD
              alone, for requirepass), kept out of the URL (default unset)
  REDIS_CA    with a TLS REDIS_URL: a PEM file of the CA that signed Redis's certificate
                                                    (default unset: the system's roots)
  REDIS_CLIENT_CERT, REDIS_CLIENT_KEY
              with a TLS REDIS_URL: PEM files of the certificate and key this server
              presents to a Redis that asks for one (mutual TLS)  (default unset)
  PREFIX      key prefix in Redis                   (default rl:)
  PER_THREAD_READS
              without REDIS_URL: true gives the memory store's shards a reader lock per
              thread group, for hot keys decided on many cores; false one lock each
              (default unset: the layer chooses, true for one GCRA policy)
  ON_STORE_ERROR
              what to do when Redis fails or is slow: open (let requests through),
              closed (503), local (decide in memory, each instance with the full limit)
                                                    (default open)
  STORE_TIMEOUT_MS
              the deadline of one decision in Redis, in milliseconds (default 50)
  ALGORITHM   gcra | token_bucket | leaky_bucket | fixed_window | sliding_window | sliding_log
              (default gcra; fixed_window with TIME_ZONE or a monthly RATE_LIMIT)
  RATE_LIMIT  a quota such as 10/s, 100/min, 20/10s, 2000/week, 10000/month, or several
              separated by commas, all enforced at once, e.g. 10/s,1000/h (default 10/s)
  TIME_ZONE   every RATE_LIMIT policy of a day, a week or a month counts the calendar
              periods of this IANA zone, e.g. Europe/Paris: a day from local midnight, a
              month from the 1st (default unset: windows from the Unix epoch; a month
              in UTC)
  WEEK_STARTS, MONTH_STARTS
              the day calendar weeks start on (e.g. sunday; default monday) and the
              day of the month months start on (1 to 31; default 1)
  LEASE       with REDIS_URL: units each instance takes of a key at once and admits
              from without asking Redis, until spent or a lease ends (default unset:
              every request asks Redis)
  WAIT_MS     a request over the limit that a slot within this many milliseconds
              admits waits for it instead of getting 429 (at most 3600000; default
              unset: never wait; not with LEASE)
  CONCURRENCY at most this many requests per key in flight at once, across every
              instance (default unset: no concurrency limit)
  CONCURRENCY_MAX_MS
              with CONCURRENCY: how long a slot is held at most, so that the slots of an
              instance that died are freed (default 60000)
  COST_HEADER every RATE_LIMIT policy admits a request on an estimate of 1 unit, then
              settles it at what the response header of this name says it cost (GET
              /spend sets it), past the limit if need be: a key in debt gets 429 until
              time pays it back              (default unset: a request costs 1)
  COST_BODY   bytes: the same, settled at the bytes the response body sent (GET
              /stream sends them), counted as it streams (default unset; not with
              COST_HEADER)
  HEADERS     legacy (X-RateLimit-*) | ietf (RateLimit-Policy, RateLimit) | both
                                                    (default legacy)
  KEY         ip | client_ip | global | header:<name> (default ip)
              ip: the socket peer; client_ip: the client behind TRUSTED_PROXIES
  TRUSTED_PROXIES
              with KEY=client_ip: comma-separated networks or addresses of the proxies
              in front of the server, e.g. 10.0.0.0/8,2001:db8::/32; X-Forwarded-For is
              read only from them, from the right   (default empty: trust no proxy)

Routes:
  GET /        rate limited, answers 200 with a short text
  POST /login  rate limited, answers 401 unless the header x-password is \"letmein\"
  GET /reports, GET /exports/{id}
               rate limited, answer 200 (routes of examples/limits.toml)
  GET /slow?ms=<n>
               rate limited, answers after n milliseconds (at most 10000), to see
               CONCURRENCY at work
  GET /spend?cost=<n>
               rate limited, answers 200 with the COST_HEADER header (x-cost when unset)
               set to n, the response's real cost for COST_HEADER
  GET /stream?bytes=<n>
               rate limited, streams n bytes (at most 10000000) in chunks of 1000, the
               response's real cost for COST_BODY=bytes
  GET /health  never limited
  GET /metrics every metric of the layer, in Prometheus text format; never limited
  GET /admin/top?policy=<name>&n=<count>
               the keys each policy denied most over the last minute, as JSON (policy
               and n are optional; n defaults to 10); never limited
  With ADMIN_BIND set, /metrics and /admin/top are answered there, and not on BIND.
";

struct Config {
    bind: SocketAddr,
    admin_bind: Option<SocketAddr>,
    /// The policy file, and its policies as read at start.
    file: Option<(String, Limits)>,
    redis_url: Option<String>,
    prefix: String,
    on_store_error: FailurePolicy,
    store_timeout: std::time::Duration,
    algorithm: Algorithm,
    rate_limit: String,
    lease: Option<u32>,
    wait: Option<std::time::Duration>,
    concurrency: Option<(u32, std::time::Duration)>,
    headers: HeaderStyle,
    key: String,
    trusted_proxies: Vec<Cidr>,
    /// Where every RATE_LIMIT policy reads a response's real cost (COST_HEADER, COST_BODY).
    settle: Option<Settle>,
    /// The header /spend sets.
    cost_header: String,
    /// The calendar every RATE_LIMIT policy counts periods in (TIME_ZONE, WEEK_STARTS,
    /// MONTH_STARTS).
    calendar: Option<Calendar>,
    per_thread_reads: Option<bool>,
    redis_access: RedisAccess,
}

/// Credentials and TLS settings for Redis, read (files included) at start.
#[derive(Default)]
struct RedisAccess {
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
        Ok(RedisAccess {
            username,
            password,
            tls,
        })
    }

    fn apply(
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

fn env_or(name: &str, default: &str) -> Result<String, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(default.to_owned()),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name}: not valid UTF-8")),
    }
}

fn key_extractor(spec: &str, trusted_proxies: &[Cidr]) -> Result<Box<dyn KeyExtractor>, String> {
    if spec != "client_ip" && !trusted_proxies.is_empty() {
        return Err(format!(
            "TRUSTED_PROXIES: only used with KEY=client_ip, but KEY is {spec:?}"
        ));
    }
    match spec {
        "ip" => Ok(Box::new(PeerIp::new())),
        "client_ip" => trusted_proxies
            .iter()
            .fold(ClientIp::builder(), |b, &net| b.trusted_network(net))
            .build()
            .map(|k| Box::new(k) as Box<dyn KeyExtractor>)
            .map_err(|e| format!("TRUSTED_PROXIES: {e}")),
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
fn read_limits(path: &str) -> Result<Limits, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("CONFIG {path}: cannot read it: {e}"))?;
    Limits::from_toml(&text).map_err(|e| format!("CONFIG {path}: {e}"))
}

/// Where the policies come from, to name it in an error.
fn source(config: &Config) -> String {
    match &config.file {
        Some((path, _)) => format!("CONFIG {path}"),
        None => "RATE_LIMIT".into(),
    }
}

/// The variables a policy file replaces.
const REPLACED_BY_CONFIG: [&str; 13] = [
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
];

fn config() -> Result<Config, String> {
    let file = match env_or("CONFIG", "")?.as_str() {
        "" => None,
        path => {
            let set: Vec<&str> = REPLACED_BY_CONFIG
                .into_iter()
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
    let calendar = calendar()?;
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
            "WAIT_MS: a request cannot wait for a slot of a lease; drop WAIT_MS or LEASE".into(),
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
        file,
        redis_url,
        redis_access,
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
        trusted_proxies: env_or("TRUSTED_PROXIES", "")?
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| {
                s.trim()
                    .parse()
                    .map_err(|e| format!("TRUSTED_PROXIES: {e}"))
            })
            .collect::<Result<_, _>>()?,
    })
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
        ("", other) => Err(format!(
            "COST_BODY: unknown value {other:?}; expected bytes"
        )),
        _ => Err("COST_HEADER and COST_BODY: a policy settles from one; drop one".into()),
    }
}

/// The file's policies, or one policy per quota in `RATE_LIMIT`, all with the chosen
/// algorithm.
fn policies<St: Store>(
    config: &Config,
    mut builder: tower_ratelimit::RateLimitLayerBuilder<St>,
) -> Result<tower_ratelimit::RateLimitLayerBuilder<St>, String> {
    if let Some((path, limits)) = &config.file {
        let policies = limits
            .policies()
            .map_err(|e| format!("CONFIG {path}: {e}"))?;
        return Ok(builder
            .policies(policies)
            .headers(config.headers)
            .on_store_error(config.on_store_error));
    }
    for quota in config.rate_limit.split(',') {
        let mut policy = Policy::new(config.algorithm, quota.trim());
        if let Some(units) = config.lease {
            policy = policy.lease(units);
        }
        if let Some(wait) = config.wait {
            policy = policy.wait_up_to(wait);
        }
        if let Some(settle) = &config.settle {
            policy = policy.cost(|_| 1).settle(settle.clone());
        }
        if let Some(calendar) = &config.calendar {
            policy = policy.calendar(calendar.clone());
        }
        builder = builder.policy(policy);
    }
    if let Some((n, max)) = config.concurrency {
        builder = builder.policy(Policy::concurrency(n).max_duration(max));
    }
    Ok(builder
        .headers(config.headers)
        .on_store_error(config.on_store_error))
}

/// The public app and the admin routes.
struct Apps {
    public: Router,
    admin: Router,
}

/// The apps, and the store's description that `describe` gives once the layer is built.
fn app<St: Store>(
    config: &Config,
    store: St,
    metrics: PrometheusHandle,
    describe: impl FnOnce(&St) -> String,
) -> Result<(Apps, String), String> {
    let mut builder = RateLimitLayer::builder()
        .store(store)
        .top_limited(TopLimited::new());
    if config.file.is_none() {
        builder = builder.key(key_extractor(&config.key, &config.trusted_proxies)?);
    }
    let layer = policies(config, builder)?
        .build()
        .map_err(|e| format!("{}: {e}", source(config)))?;
    let described = describe(layer.store());
    if let Some((path, _)) = &config.file {
        reload_on_sighup(layer.clone(), path.clone());
    }
    let admin = Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = metrics.render();
                async move { ([("content-type", "text/plain; version=0.0.4")], text) }
            }),
        )
        .route_service("/admin/top", layer.top_limited_service());
    let cost_header = config.cost_header.clone();
    let public = Router::new()
        .route("/", get(|| async { "hello from tower-ratelimit\n" }))
        .route("/slow", get(slow))
        .route("/login", post(login))
        .route("/reports", get(|| async { "reports\n" }))
        .route("/exports/{id}", get(|| async { "export\n" }))
        .route(
            "/spend",
            get(move |axum::extract::Query(q)| spend(cost_header.clone(), q)),
        )
        .route("/stream", get(stream))
        // Responses in axum's own body: axum does not box them again.
        .route_layer(layer.body::<AxumBody>())
        .route("/health", get(|| async { "ok\n" }));
    Ok((Apps { public, admin }, described))
}

/// The Prometheus recorder of every metric the layer emits, its histograms with buckets from
/// 0.1 ms to 10 s.
fn prometheus() -> Result<PrometheusHandle, String> {
    let buckets = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        10.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
        .and_then(|b| b.install_recorder())
        .map_err(|e| format!("metrics: {e}"))?;
    tower_ratelimit::telemetry::describe_metrics();
    // The recorder keeps histogram samples until upkeep folds them into the buckets.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Reads the policy file again on each `SIGHUP` and swaps the layer's policies, keeping
/// every key's usage; a file with a mistake is rejected, and the old limits stay.
fn reload_on_sighup<St: Store>(layer: RateLimitLayer<St>, path: String) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            eprintln!("CONFIG {path}: cannot listen for SIGHUP; the file will not be reloaded");
            return;
        };
        while hangups.recv().await.is_some() {
            let reloaded = read_limits(&path).and_then(|limits| {
                let policies = limits
                    .policies()
                    .map_err(|e| format!("CONFIG {path}: {e}"))?;
                layer
                    .reload(policies)
                    .map_err(|e| format!("CONFIG {path}: {e}"))
            });
            match reloaded {
                Ok(report) => println!("reloaded CONFIG {path}: {report}"),
                Err(e) => eprintln!("{e}; the file was not reloaded, the old limits stay"),
            }
        }
    });
    #[cfg(not(unix))]
    let _ = (layer, path);
}

/// `POST /login`: 401 unless the header `x-password` is `letmein` (for a policy that counts
/// failed logins, `charge_if_status = [401]`).
async fn login(headers: axum::http::HeaderMap) -> (axum::http::StatusCode, &'static str) {
    match headers.get("x-password").map(|v| v.as_bytes()) {
        Some(b"letmein") => (axum::http::StatusCode::OK, "welcome\n"),
        _ => (axum::http::StatusCode::UNAUTHORIZED, "wrong password\n"),
    }
}

/// Prints why the store is not connected to Redis yet, each time the reason changes, and
/// when it connects.
fn report_connection(store: RedisStore) {
    tokio::spawn(async move {
        let mut said = Some(String::new());
        loop {
            let now = store.connection_error();
            if now != said {
                match &now {
                    Some(error) => eprintln!("redis: not connected yet: {error}"),
                    None => eprintln!("redis: connected; decisions are exact"),
                }
            }
            if now.is_none() {
                return;
            }
            said = now;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
}

/// `GET /slow?ms=<n>`: answers after `n` milliseconds (at most 10,000).
async fn slow(
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<String, (axum::http::StatusCode, &'static str)> {
    let bad = (
        axum::http::StatusCode::BAD_REQUEST,
        "ms must be a number of milliseconds from 0 to 10000\n",
    );
    let ms: u64 = match q.get("ms") {
        None => 1000,
        Some(ms) => ms.parse().map_err(|_| bad)?,
    };
    if ms > 10_000 {
        return Err(bad);
    }
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    Ok(format!("answered after {ms} ms\n"))
}

/// `GET /spend?cost=<n>`: 200 with the header `name` set to n.
async fn spend(
    name: String,
    q: std::collections::HashMap<String, String>,
) -> Result<axum::response::Response, (axum::http::StatusCode, &'static str)> {
    let bad = (
        axum::http::StatusCode::BAD_REQUEST,
        "cost must be a whole number of units\n",
    );
    let cost: u64 = q.get("cost").ok_or(bad)?.parse().map_err(|_| bad)?;
    let mut response = axum::response::IntoResponse::into_response(format!("spent {cost}\n"));
    let name = axum::http::HeaderName::try_from(name).expect("checked at start");
    response
        .headers_mut()
        .insert(name, axum::http::HeaderValue::from(cost));
    Ok(response)
}

/// `GET /stream?bytes=<n>`: n bytes, in chunks of 1,000 sent one at a time.
async fn stream(
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<axum::body::Body, (axum::http::StatusCode, &'static str)> {
    let bad = (
        axum::http::StatusCode::BAD_REQUEST,
        "bytes must be a number from 0 to 10000000\n",
    );
    let bytes: u64 = q.get("bytes").ok_or(bad)?.parse().map_err(|_| bad)?;
    if bytes > 10_000_000 {
        return Err(bad);
    }
    Ok(axum::body::Body::new(Chunks { left: bytes }))
}

/// A body of `left` bytes, sent in chunks of at most 1,000.
struct Chunks {
    left: u64,
}

impl http_body::Body for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let chunk = self.left.min(1_000);
        self.left -= chunk;
        std::task::Poll::Ready((chunk > 0).then(|| {
            Ok(http_body::Frame::data(bytes::Bytes::from(vec![
                b'.';
                chunk
                    as usize
            ])))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}

/// The apps and a description of their store.
async fn build(config: &Config) -> Result<(Apps, String), String> {
    let metrics = prometheus()?;
    // Check the key before connecting, so a typo is reported as such.
    if config.file.is_none() {
        key_extractor(&config.key, &config.trusted_proxies)?;
    }
    match &config.redis_url {
        None => {
            let mut store = tower_ratelimit::MemoryStore::builder();
            if let Some(yes) = config.per_thread_reads {
                store = store.per_thread_reads(yes);
            }
            app(config, store.build(), metrics, |store| {
                format!("memory PER_THREAD_READS={}", store.per_thread_reads())
            })
        }
        Some(url) => {
            // Check the quota before connecting, so a typo is reported as such.
            policies(config, RateLimitLayer::builder())?
                .build()
                .map_err(|e| format!("{}: {e}", source(config)))?;
            // The server starts while Redis is down: ON_STORE_ERROR answers until it is up.
            let store = config
                .redis_access
                .apply(RedisStore::builder(url))
                .prefix(config.prefix.as_str())
                .deadline(config.store_timeout)
                .connect_lazily(true)
                .build()
                .await
                .map_err(|e| format!("REDIS_URL: {e}"))?;
            // A Redis that is up is connected within milliseconds: give it a second, so that
            // the first requests are decided by it, then start anyway.
            for _ in 0..100 {
                if store.is_connected() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            report_connection(store.clone());
            let described = format!(
                "redis prefix={} ON_STORE_ERROR={:?} STORE_TIMEOUT_MS={} LEASE={}",
                config.prefix,
                config.on_store_error,
                config.store_timeout.as_millis(),
                config.lease.map_or("off".into(), |u| u.to_string())
            );
            app(config, store, metrics, |_| described)
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let result = async {
        let config = config()?;
        let (apps, store) = build(&config).await?;
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(|e| format!("BIND: cannot listen on {}: {e}", config.bind))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (app, admin) = match config.admin_bind {
            None => (apps.public.merge(apps.admin), format!("http://{addr}")),
            Some(admin_bind) => {
                let admin = tokio::net::TcpListener::bind(admin_bind)
                    .await
                    .map_err(|e| format!("ADMIN_BIND: cannot listen on {admin_bind}: {e}"))?;
                let admin_addr = admin.local_addr().map_err(|e| e.to_string())?;
                let router = apps.admin;
                tokio::spawn(async move {
                    if let Err(e) = axum::serve(admin, router).await {
                        eprintln!("admin server error: {e}");
                    }
                });
                (apps.public, format!("http://{admin_addr}"))
            }
        };
        let limits = match &config.file {
            Some((path, limits)) => {
                let names: Vec<&str> = limits
                    .policy_configs()
                    .iter()
                    .map(|p| p.name().unwrap_or("unnamed"))
                    .collect();
                format!("CONFIG={path} ({}; SIGHUP reloads it)", names.join(", "))
            }
            None => format!(
                "algorithm={} RATE_LIMIT={} WAIT_MS={} CONCURRENCY={} KEY={}{}",
                config.algorithm,
                config.rate_limit,
                config.wait.map_or("off".into(), |w| w.as_millis().to_string()),
                config.concurrency.map_or("off".into(), |(n, max)| {
                    format!("{n} (max {} ms)", max.as_millis())
                }),
                config.key,
                if config.key == "client_ip" {
                    let list: Vec<String> =
                        config.trusted_proxies.iter().map(Cidr::to_string).collect();
                    format!(" TRUSTED_PROXIES={}", list.join(","))
                } else {
                    String::new()
                },
            ),
        };
        println!(
            "listening on http://{addr} | store={store} {limits} HEADERS={:?} | admin={admin} (/metrics, /admin/top) | --help lists the variables",
            config.headers,
        );
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| format!("server error: {e}"))
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}
