//! The HTTP servers of `scripts/bench.sh`: one axum hello-world, with or without a limiter,
//! listening on a free port of 127.0.0.1 that it prints as `port=N`. Not an example of how to
//! use the crate.
//!
//! ```text
//! driver_http MODE [REDIS_URL] [--threads 1]
//! ```
//!
//! | mode | what |
//! |---|---|
//! | `bare` | the handler alone |
//! | `memory` | our layer, memory store, GCRA 1,000,000/s per peer IP (never limits) |
//! | `memory-no-headers` | the same without rate-limit headers (`HeaderStyle::None`) |
//! | `governor` | `tower_governor`, in-memory GCRA, one cell per nanosecond, per peer IP |
//! | `governor-headers` | the same with its `x-ratelimit-*` headers (`use_headers`) |
//! | `redis` | our layer, Redis store (multiplexed), the same policy |
//! | `evalsha` | no layer: the handler sends the same call (`FCALL`) on one multiplexed connection |
//! | `deny-memory` | our layer, memory store, fixed window 1/hour: every request but one is 429 |
//! | `deny-redis` | the same on the Redis store with the deny cache on |
//! | `redis-lease` | `redis` with leases of 20 units (`Policy::lease(20)`) |
//! | `redis-cold` | `redis`, keyed by the `x-key` header (a new key per request, see `scripts/cold_keys.lua`) |
//! | `redis-cold-lease` | `redis-cold` with leases of 20 units |

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderName;
use axum::http::StatusCode;
use axum::routing::get;
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::{Policy, RateLimitLayer, RedisStore, headers::HeaderStyle};

async fn hello() -> &'static str {
    "hello"
}

/// The units of a lease in the `*-lease` modes.
const LEASE: u32 = 20;

fn open_policy() -> Policy {
    Policy::gcra("1000000/s").name("g")
}

fn deny_policy() -> Policy {
    Policy::fixed_window("1/h").name("d")
}

async fn redis_store(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix("bench:")
        .deadline(Duration::from_secs(10))
        .build()
        .await
        .expect("connect to Redis")
}

/// The call our layer sends for the peer 127.0.0.1 (`FCALL`, or `EVALSHA` on a Redis without
/// functions), sent by the handler itself.
struct Evalsha {
    conn: redis::aio::ConnectionManager,
    command: String,
    args: Vec<Vec<u8>>,
}

async fn evalsha(State(e): State<Arc<Evalsha>>) -> Result<&'static str, StatusCode> {
    let mut cmd = redis::cmd(&e.command);
    for a in &e.args {
        cmd.arg(&a[..]);
    }
    let mut conn = e.conn.clone();
    let reply: Vec<i64> = cmd
        .query_async(&mut conn)
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    if reply.first() == Some(&-2) {
        Ok("hello")
    } else {
        Err(StatusCode::TOO_MANY_REQUESTS)
    }
}

async fn app(mode: &str, url: &str) -> Router {
    let base = Router::new().route("/", get(hello));
    match mode {
        "bare" => base,
        "memory" => base.layer(
            RateLimitLayer::builder()
                .policy(open_policy())
                .build()
                .unwrap(),
        ),
        "memory-no-headers" => base.layer(
            RateLimitLayer::builder()
                .policy(open_policy())
                .headers(HeaderStyle::None)
                .build()
                .unwrap(),
        ),
        "deny-memory" => base.layer(
            RateLimitLayer::builder()
                .policy(deny_policy())
                .build()
                .unwrap(),
        ),
        "redis" => base.layer(
            RateLimitLayer::builder()
                .policy(open_policy())
                .store(redis_store(url).await)
                .build()
                .unwrap(),
        ),
        "redis-lease" => base.layer(
            RateLimitLayer::builder()
                .policy(open_policy().lease(LEASE))
                .store(redis_store(url).await)
                .build()
                .unwrap(),
        ),
        "redis-cold" | "redis-cold-lease" => {
            let mut policy = open_policy();
            if mode == "redis-cold-lease" {
                policy = policy.lease(LEASE);
            }
            base.layer(
                RateLimitLayer::builder()
                    .policy(policy)
                    .key(HeaderKey::new(HeaderName::from_static("x-key")))
                    .store(redis_store(url).await)
                    .build()
                    .unwrap(),
            )
        }
        "deny-redis" => base.layer(
            RateLimitLayer::builder()
                .policy(deny_policy())
                .store(redis_store(url).await)
                .deny_cache(10_000)
                .build()
                .unwrap(),
        ),
        "governor" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000)
                .finish()
                .expect("a valid governor config");
            base.layer(tower_governor::GovernorLayer::new(config))
        }
        "governor-headers" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000)
                .use_headers()
                .finish()
                .expect("a valid governor config");
            base.layer(tower_governor::GovernorLayer::new(config))
        }
        "evalsha" => {
            let layer = RateLimitLayer::builder()
                .policy(open_policy())
                .store(redis_store(url).await)
                .build()
                .unwrap();
            let peer = Key::from(std::net::IpAddr::from([127, 0, 0, 1]));
            let mut args = common::captured_call(url, &layer, &peer).await;
            let command = args.remove(0);
            let client = redis::Client::open(url).expect("URL");
            let conn = redis::aio::ConnectionManager::new(client)
                .await
                .expect("connect to Redis");
            let args = args.into_iter().map(String::into_bytes).collect();
            let state = Arc::new(Evalsha {
                conn,
                command,
                args,
            });
            Router::new().route("/", get(evalsha)).with_state(state)
        }
        other => {
            eprintln!("unknown mode {other:?}; see benches/driver_http.rs");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if common::started_by_cargo_bench(&args) {
        return;
    }
    let mode = args.first().cloned().unwrap_or_default();
    let url = args
        .get(1)
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_default();
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .map_or(1, |t| t.parse().expect("a number"));
    let rt = common::runtime(threads);
    rt.block_on(async {
        let app = app(&mode, &url).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("port={}", listener.local_addr().unwrap().port());
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
}
