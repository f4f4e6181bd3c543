//! A gRPC server behind a `RateLimitLayer`: tonic serving the standard health service
//! (`grpc.health.v1.Health`), so any stock gRPC client can call it, configured by environment
//! variables like the demo server.
//!
//! ```text
//! cargo run --example grpc
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check   # again and again
//! ```
//!
//! A limited call fails with `RESOURCE_EXHAUSTED`, the retry delay in its status details
//! (`google.rpc.RetryInfo`) and the rate-limit headers as metadata. Run
//! `cargo run --example grpc -- --help` for the variables.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use tonic::transport::server::TcpConnectInfo;
use tonic_health::ServingStatus;
use tower_ratelimit::config::KeySpec;
use tower_ratelimit::key::{self, Key, KeyExtractor};
use tower_ratelimit::{
    Algorithm, FailurePolicy, Policy, RateLimitLayer, RateLimitLayerBuilder, RedisStore, Store,
};

const HELP: &str = "\
tower-ratelimit gRPC demo server (grpc.health.v1.Health)

Environment variables:
  BIND          address to listen on                (default 127.0.0.1:50051)
  REDIS_URL     unset: in-memory store; set: Redis, e.g. redis://127.0.0.1:6379,
                redis+cluster://127.0.0.1:7000,127.0.0.1:7001 or
                redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster
                                                    (default unset)
  PREFIX        key prefix in Redis                 (default rl:)
  ON_STORE_ERROR
                open (let calls through) | closed (UNAVAILABLE) (default open)
  STORE_TIMEOUT_MS
                the deadline of one decision in Redis (default 50)
  ALGORITHM     gcra | token_bucket | leaky_bucket | fixed_window | sliding_window |
                sliding_log                         (default gcra)
  RATE_LIMIT    a quota such as 10/s, or several separated by commas (default 10/s)
  KEY           grpc_method | ip | global | bearer | header:<metadata name>
                                                    (default grpc_method)
  METHOD_LIMIT  per-method policies on top of RATE_LIMIT, e.g.
                /grpc.health.v1.Health/Check=2/s,/grpc.health.v1.Health/Watch=1/min
                (each keyed like KEY)               (default unset)
";

struct Config {
    bind: SocketAddr,
    redis_url: Option<String>,
    prefix: String,
    on_store_error: FailurePolicy,
    store_timeout: Duration,
    algorithm: Algorithm,
    rate_limit: String,
    key: String,
    method_limits: Vec<(String, String)>,
}

fn env_or(name: &str, default: &str) -> Result<String, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(default.to_owned()),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name}: not valid UTF-8")),
    }
}

fn config() -> Result<Config, String> {
    let bind = env_or("BIND", "127.0.0.1:50051")?;
    Ok(Config {
        bind: bind
            .parse()
            .map_err(|_| format!("BIND: {bind:?} is not an address such as 127.0.0.1:50051"))?,
        redis_url: Some(env_or("REDIS_URL", "")?).filter(|u| !u.is_empty()),
        prefix: env_or("PREFIX", "rl:")?,
        on_store_error: match env_or("ON_STORE_ERROR", "open")?.as_str() {
            "open" => FailurePolicy::Open,
            "closed" => FailurePolicy::Closed,
            other => return Err(format!("ON_STORE_ERROR: {other:?}; expected open or closed")),
        },
        store_timeout: match env_or("STORE_TIMEOUT_MS", "50")?.parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => return Err("STORE_TIMEOUT_MS: not a positive number of milliseconds".into()),
        },
        algorithm: env_or("ALGORITHM", "gcra")?
            .parse()
            .map_err(|e| format!("ALGORITHM: {e}"))?,
        rate_limit: env_or("RATE_LIMIT", "10/s")?,
        key: env_or("KEY", "grpc_method")?,
        method_limits: env_or("METHOD_LIMIT", "")?
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|item| match item.trim().split_once('=') {
                Some((method, quota)) => Ok((method.trim().to_owned(), quota.trim().to_owned())),
                None => Err(format!(
                    "METHOD_LIMIT: {item:?} is not <method>=<quota>, e.g. /grpc.health.v1.Health/Check=2/s"
                )),
            })
            .collect::<Result<_, _>>()?,
    })
}

/// The key of every policy. tonic records the peer as a `TcpConnectInfo`, so `ip` reads it.
fn key_extractor(spec: &str) -> Result<std::sync::Arc<dyn KeyExtractor>, String> {
    if spec == "ip" {
        return Ok(std::sync::Arc::new(key::extension_with(
            |info: &TcpConnectInfo| info.remote_addr().map_or(Key::global(), |a| a.ip().into()),
        )));
    }
    let spec: KeySpec = spec.parse().map_err(|e| format!("KEY: {e}"))?;
    spec.extractor(&[]).map_err(|e| format!("KEY: {e}"))
}

/// The layer's policies: one per quota of `RATE_LIMIT`, and one per `METHOD_LIMIT`, on that
/// method only.
fn policies<St: Store>(
    config: &Config,
    mut builder: RateLimitLayerBuilder<St>,
) -> Result<RateLimitLayerBuilder<St>, String> {
    let key = key_extractor(&config.key)?;
    for quota in config.rate_limit.split(',') {
        builder = builder.policy(Policy::new(config.algorithm, quota.trim()));
    }
    for (method, quota) in &config.method_limits {
        let name = method.rsplit('/').next().unwrap_or(method).to_lowercase();
        builder = builder.policy(
            Policy::new(config.algorithm, quota.as_str())
                .name(format!("method:{name}"))
                .path(method.as_str()),
        );
    }
    Ok(builder.key(key).on_store_error(config.on_store_error))
}

/// Serves until Ctrl-C, first saying where.
async fn serve<St: Store + Clone>(
    config: &Config,
    store: (St, String),
    listener: tokio::net::TcpListener,
) -> Result<(), String> {
    let (store, described) = store;
    let layer = policies(config, RateLimitLayer::builder().store(store))?
        .build()
        .map_err(|e| format!("RATE_LIMIT/METHOD_LIMIT: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let methods: Vec<String> = config
        .method_limits
        .iter()
        .map(|(m, q)| format!("{m}={q}"))
        .collect();
    println!(
        "listening on grpc://{addr} | store={described} algorithm={} RATE_LIMIT={} KEY={} METHOD_LIMIT={} | --help lists the variables",
        config.algorithm,
        config.rate_limit,
        config.key,
        if methods.is_empty() {
            "off".into()
        } else {
            methods.join(",")
        },
    );
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("tower_ratelimit.Demo", ServingStatus::Serving)
        .await;
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(health)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await
        .map_err(|e| format!("server error: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let result = async {
        let config = config()?;
        // Check the policies before connecting, so a typo is reported as such.
        policies(&config, RateLimitLayer::builder())?
            .build()
            .map_err(|e| format!("RATE_LIMIT/METHOD_LIMIT: {e}"))?;
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(|e| format!("BIND: cannot listen on {}: {e}", config.bind))?;
        match &config.redis_url {
            None => {
                let store = (tower_ratelimit::MemoryStore::new(), "memory".into());
                serve(&config, store, listener).await
            }
            Some(url) => {
                let store = RedisStore::builder(url)
                    .prefix(config.prefix.as_str())
                    .deadline(config.store_timeout)
                    .build()
                    .await
                    .map_err(|e| format!("REDIS_URL: {e}"))?;
                let described = format!(
                    "redis prefix={} ON_STORE_ERROR={:?} STORE_TIMEOUT_MS={}",
                    config.prefix,
                    config.on_store_error,
                    config.store_timeout.as_millis()
                );
                serve(&config, (store, described), listener).await
            }
        }
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
