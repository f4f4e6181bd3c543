//! The demo server: an axum app behind a `RateLimitLayer`, configured by environment variables.
//!
//! ```text
//! cargo run --example server
//! for i in $(seq 1 15); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/; done
//! ```
//!
//! Run `cargo run --example server -- --help` for the variables.

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::{Router, routing::get};
use tower_ratelimit::axum::AxumBody;
use tower_ratelimit::headers::HeaderStyle;
use tower_ratelimit::key::{Cidr, ClientIp, GlobalKey, HeaderKey, KeyExtractor, PeerIp};
use tower_ratelimit::{Algorithm, FailurePolicy, Policy, RateLimitLayer, RedisStore, Store};

const HELP: &str = "\
tower-ratelimit demo server

Environment variables:
  BIND        address to listen on                  (default 127.0.0.1:3000)
  REDIS_URL   unset: in-memory store; set: Redis, e.g. redis://127.0.0.1:6379 or
              redis+cluster://127.0.0.1:7000,127.0.0.1:7001 for a Redis Cluster
                                                    (default unset)
  PREFIX      key prefix in Redis                   (default rl:)
  ON_STORE_ERROR
              what to do when Redis fails or is slow: open (let requests through),
              closed (503), local (decide in memory, each instance with the full limit)
                                                    (default open)
  STORE_TIMEOUT_MS
              the deadline of one decision in Redis, in milliseconds (default 50)
  ALGORITHM   gcra | token_bucket | leaky_bucket | fixed_window | sliding_window | sliding_log
                                                    (default gcra)
  RATE_LIMIT  a quota such as 10/s, 100/min, 20/10s, or several separated by commas,
              all enforced at once, e.g. 10/s,1000/h (default 10/s)
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
  GET /slow?ms=<n>
               rate limited, answers after n milliseconds (at most 10000), to see
               CONCURRENCY at work
  GET /health  never limited
";

struct Config {
    bind: SocketAddr,
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

fn config() -> Result<Config, String> {
    let bind = env_or("BIND", "127.0.0.1:3000")?;
    let bind = bind
        .parse()
        .map_err(|_| format!("BIND: {bind:?} is not an address such as 127.0.0.1:3000"))?;
    let algorithm = env_or("ALGORITHM", "gcra")?
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
    Ok(Config {
        bind,
        redis_url,
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
        rate_limit: env_or("RATE_LIMIT", "10/s")?,
        lease,
        wait,
        concurrency,
        headers: env_or("HEADERS", "legacy")?
            .parse()
            .map_err(|e| format!("HEADERS: {e}"))?,
        key: env_or("KEY", "ip")?,
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

/// One policy per quota in `RATE_LIMIT`, all with the chosen algorithm.
fn policies<St: Store>(
    config: &Config,
    mut builder: tower_ratelimit::RateLimitLayerBuilder<St>,
) -> tower_ratelimit::RateLimitLayerBuilder<St> {
    for quota in config.rate_limit.split(',') {
        let mut policy = Policy::new(config.algorithm, quota.trim());
        if let Some(units) = config.lease {
            policy = policy.lease(units);
        }
        if let Some(wait) = config.wait {
            policy = policy.wait_up_to(wait);
        }
        builder = builder.policy(policy);
    }
    if let Some((n, max)) = config.concurrency {
        builder = builder.policy(Policy::concurrency(n).max_duration(max));
    }
    builder
        .headers(config.headers)
        .on_store_error(config.on_store_error)
}

fn app<St: Store>(config: &Config, store: St) -> Result<Router, String> {
    let builder = RateLimitLayer::builder()
        .key(key_extractor(&config.key, &config.trusted_proxies)?)
        .store(store);
    let layer = policies(config, builder)
        .build()
        .map_err(|e| format!("RATE_LIMIT: {e}"))?;
    Ok(Router::new()
        .route("/", get(|| async { "hello from tower-ratelimit\n" }))
        .route("/slow", get(slow))
        // Responses in axum's own body: axum does not box them again.
        .route_layer(layer.body::<AxumBody>())
        .route("/health", get(|| async { "ok\n" })))
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

/// The app and a description of its store.
async fn build(config: &Config) -> Result<(Router, String), String> {
    // Check the key before connecting, so a typo is reported as such.
    key_extractor(&config.key, &config.trusted_proxies)?;
    match &config.redis_url {
        None => Ok((
            app(config, tower_ratelimit::MemoryStore::new())?,
            "memory".into(),
        )),
        Some(url) => {
            // Check the quota before connecting, so a typo is reported as such.
            policies(config, RateLimitLayer::builder())
                .build()
                .map_err(|e| format!("RATE_LIMIT: {e}"))?;
            let store = RedisStore::builder(url)
                .prefix(config.prefix.as_str())
                .deadline(config.store_timeout)
                .build()
                .await
                .map_err(|e| format!("REDIS_URL: {e}"))?;
            let described = format!(
                "redis prefix={} ON_STORE_ERROR={:?} STORE_TIMEOUT_MS={} LEASE={}",
                config.prefix,
                config.on_store_error,
                config.store_timeout.as_millis(),
                config.lease.map_or("off".into(), |u| u.to_string())
            );
            Ok((app(config, store)?, described))
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
        let (app, store) = build(&config).await?;
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(|e| format!("BIND: cannot listen on {}: {e}", config.bind))?;
        println!(
            "listening on http://{} | store={store} algorithm={} RATE_LIMIT={} WAIT_MS={} CONCURRENCY={} HEADERS={:?} KEY={}{} | --help lists the variables",
            listener.local_addr().map_err(|e| e.to_string())?,
            config.algorithm,
            config.rate_limit,
            config.wait.map_or("off".into(), |w| w.as_millis().to_string()),
            config.concurrency.map_or("off".into(), |(n, max)| format!("{n} (max {} ms)", max.as_millis())),
            config.headers,
            config.key,
            if config.key == "client_ip" {
                let list: Vec<String> = config.trusted_proxies.iter().map(Cidr::to_string).collect();
                format!(" TRUSTED_PROXIES={}", list.join(","))
            } else {
                String::new()
            },
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
