//! Calls to an upstream within its limits, shared by every process on one Redis: the demo of
//! `tower_ratelimit::egress`. It sends `REQUESTS` calls to `UPSTREAM` from `CLIENTS` tasks
//! through hyper-util's client wrapped in an `EgressLayer`, and prints, as its last line, one
//! JSON object: `{"sent":S,"ok":O,"upstream_429":U,"gave_up":G,"seconds":T}`.
//!
//! ```text
//! cargo run --example server                      # an upstream limited to 10/s (its default)
//! UPSTREAM=http://127.0.0.1:3000/ EGRESS_LIMIT=10/s REQUESTS=50 cargo run --example egress
//! ```
//!
//! Run it twice at once with one `REDIS_URL`: together they send at most the budget.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceExt};
use tower_ratelimit::egress::{AdaptiveRate, EgressError, EgressLayer};
use tower_ratelimit::{Algorithm, Policy, RedisStore, Store};

const HELP: &str = "\
cargo run --example egress: calls to UPSTREAM within EGRESS_LIMIT, shared through REDIS_URL

  UPSTREAM     the URL each call gets (http), e.g. http://127.0.0.1:3000/   (required)
  EGRESS_LIMIT the calls' quota, e.g. 10/s or 1000/h                       (default 10/s)
  ALGORITHM    gcra | token_bucket | leaky_bucket | fixed_window | sliding_window | sliding_log
                                                                           (default gcra)
  REQUESTS     how many calls to send                                      (default 100)
  CLIENTS      tasks sending at once                                       (default 4)
  MAX_WAIT_MS  how long a call waits for its place at most                 (default 30000)
  EGRESS_ADAPTIVE  on: a bare 429 (no time named) halves the limit, answers raise it back
                                                                           (default off)
  REDIS_URL    share the budget with every process on this Redis           (default: in memory)
  PREFIX       key prefix in Redis                                         (default rl:)

The last line is {\"sent\":S,\"ok\":O,\"upstream_429\":U,\"gave_up\":G,\"seconds\":T}: calls that
reached the upstream, answered 2xx, answered 429, not sent (past the longest wait), and the
time all took. An upstream's 429 with Retry-After (or RateLimit, X-RateLimit-*) pauses every
process until the time it names.
";

/// What the environment asks for.
struct Config {
    upstream: http::Uri,
    limit: String,
    algorithm: Algorithm,
    requests: u64,
    clients: u64,
    max_wait: Duration,
    adaptive: bool,
    redis_url: Option<String>,
    prefix: String,
}

/// `name`'s value, `default` when it is unset or empty.
fn env_or(name: &str, default: &str) -> Result<String, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(default.to_owned()),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name}: not valid UTF-8")),
    }
}

/// A whole number of at least `min` and at most `max` read from `name`.
fn number(name: &str, default: u64, min: u64, max: u64) -> Result<u64, String> {
    let text = env_or(name, &default.to_string())?;
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{name}: {text:?} is not a number from {min} to {max}"
        )),
    }
}

fn config() -> Result<Config, String> {
    let upstream = env_or("UPSTREAM", "")?;
    if upstream.is_empty() {
        return Err(
            "UPSTREAM: set it to the URL each call gets, e.g. http://127.0.0.1:3000/".into(),
        );
    }
    let upstream: http::Uri = upstream
        .parse()
        .map_err(|e| format!("UPSTREAM: {upstream:?} is not a URL: {e}"))?;
    if upstream.scheme_str() != Some("http") || upstream.host().is_none() {
        return Err(format!(
            "UPSTREAM: {upstream} is not an http:// URL with a host"
        ));
    }
    let limit = env_or("EGRESS_LIMIT", "10/s")?;
    limit
        .parse::<tower_ratelimit::Quota>()
        .map_err(|e| format!("EGRESS_LIMIT: {limit:?}: {e}"))?;
    let algorithm = env_or("ALGORITHM", "gcra")?
        .parse()
        .map_err(|e| format!("ALGORITHM: {e}"))?;
    let redis_url = Some(env_or("REDIS_URL", "")?).filter(|u| !u.is_empty());
    let adaptive = match env_or("EGRESS_ADAPTIVE", "off")?.as_str() {
        "on" | "true" | "1" => true,
        "off" | "false" | "0" => false,
        other => return Err(format!("EGRESS_ADAPTIVE: {other:?} is not on or off")),
    };
    Ok(Config {
        upstream,
        limit,
        algorithm,
        requests: number("REQUESTS", 100, 1, 10_000_000)?,
        clients: number("CLIENTS", 4, 1, 10_000)?,
        max_wait: Duration::from_millis(number("MAX_WAIT_MS", 30_000, 1, 3_600_000)?),
        adaptive,
        redis_url,
        prefix: env_or("PREFIX", "rl:")?,
    })
}

/// What the calls came to.
#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    ok: AtomicU64,
    upstream_429: AtomicU64,
    gave_up: AtomicU64,
}

/// Sends the calls through `layer`, `clients` at a time.
async fn send<St: Store>(config: &Config, layer: EgressLayer<St>) -> Counts {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let service = layer.layer(client);
    let (counts, left) = (
        Arc::new(Counts::default()),
        Arc::new(AtomicU64::new(config.requests)),
    );
    let tasks: Vec<_> = (0..config.clients)
        .map(|_| {
            let (service, counts, left) = (service.clone(), counts.clone(), left.clone());
            let uri = config.upstream.clone();
            tokio::spawn(async move {
                while left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let call = http::Request::get(uri.clone())
                        .body(Empty::new())
                        .expect("a call");
                    match service.clone().oneshot(call).await {
                        Ok(response) => {
                            counts.sent.fetch_add(1, Ordering::SeqCst);
                            let status = response.status();
                            if status.is_success() {
                                counts.ok.fetch_add(1, Ordering::SeqCst);
                            } else if status == http::StatusCode::TOO_MANY_REQUESTS {
                                counts.upstream_429.fetch_add(1, Ordering::SeqCst);
                            }
                            // Read to its end, so that the connection serves the next call.
                            let _ = response.into_body().collect().await;
                        }
                        Err(EgressError::GaveUp(gave_up)) => {
                            counts.gave_up.fetch_add(1, Ordering::SeqCst);
                            eprintln!("{gave_up}");
                        }
                        Err(EgressError::Upstream(error)) => {
                            counts.sent.fetch_add(1, Ordering::SeqCst);
                            eprintln!("the call failed: {error}");
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a client task");
    }
    Arc::into_inner(counts).expect("every task ended")
}

/// The layer on `store`, its policy checked.
fn layer<St: Store>(config: &Config, store: St) -> Result<EgressLayer<St>, String> {
    let policy = Policy::new(config.algorithm, config.limit.as_str()).name("egress");
    let mut builder = EgressLayer::builder()
        .store(store)
        .policy(policy)
        .max_wait(config.max_wait);
    if config.adaptive {
        builder = builder.adaptive(AdaptiveRate::new());
    }
    builder
        .build()
        .map_err(|e| format!("EGRESS_LIMIT/ALGORITHM: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let result = async {
        let config = config()?;
        let started = Instant::now();
        let counts = match &config.redis_url {
            None => {
                send(
                    &config,
                    layer(&config, tower_ratelimit::MemoryStore::new())?,
                )
                .await
            }
            Some(url) => {
                let store = RedisStore::builder(url)
                    .prefix(config.prefix.as_str())
                    .build()
                    .await
                    .map_err(|e| format!("REDIS_URL: {e}"))?;
                send(&config, layer(&config, store)?).await
            }
        };
        Ok::<_, String>((counts, started.elapsed()))
    }
    .await;
    match result {
        Ok((counts, took)) => {
            let n = |c: &AtomicU64| c.load(Ordering::SeqCst);
            println!(
                "{{\"sent\":{},\"ok\":{},\"upstream_429\":{},\"gave_up\":{},\"seconds\":{:.3}}}",
                n(&counts.sent),
                n(&counts.ok),
                n(&counts.upstream_429),
                n(&counts.gave_up),
                took.as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("egress: {error}");
            ExitCode::from(2)
        }
    }
}
