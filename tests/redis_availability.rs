//! A Redis that is down when the API starts, and one that is full: a store built with
//! `connect_lazily` returns at once, the failure policy answers until Redis is up, then
//! decisions are exact with no restart (the demo server always starts this way); at
//! `maxmemory` with `noeviction`, writes fail with `OOM`, the failure policy answers, the log
//! says `OOM`, and nothing is admitted past the limit.

use std::time::{Duration, Instant};

use http::StatusCode;
use tower_ratelimit::key::GlobalKey;
use tower_ratelimit::{FailurePolicy, ManualClock, Policy, RateLimitLayer, RedisStore};

mod support;

use support::demo::DemoServer;
use support::http::{Seen, get, inner};
use support::trace::Recorder;
use support::{RedisServer, free_port};

fn service(
    store: &RedisStore,
    on_error: FailurePolicy,
) -> impl tower::Service<
    http::Request<()>,
    Response = http::Response<impl http_body::Body<Error: std::fmt::Debug>>,
    Error: std::fmt::Debug,
> + Clone {
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("3/h").name("hourly"))
        .key(GlobalKey)
        .store(store.clone())
        .on_store_error(on_error)
        .build()
        .unwrap();
    tower::ServiceBuilder::new()
        .layer(layer)
        .service(inner(&Seen::default()))
}

/// The status of the first request the store decides (not the failure policy's 503), asked
/// again every 20 ms while the circuit breaker is open (it probes after a second).
async fn decided_async<S, B>(svc: &S) -> StatusCode
where
    S: tower::Service<http::Request<()>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let started = Instant::now();
    loop {
        let status = get(svc).await.status;
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no decision in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`decided_async`] of a demo server.
fn decided(mut get: impl FnMut() -> u16) -> u16 {
    let started = Instant::now();
    loop {
        let status = get();
        if status != 503 {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no decision in 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_built_before_redis_starts_decides_exactly_once_it_is_up() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let started = Instant::now();
    let store = RedisStore::builder(&url)
        .connect_lazily(true)
        .prefix("lazy:")
        .clock(ManualClock::new())
        .build()
        .await
        .expect("build() needs no Redis");
    assert!(started.elapsed() < Duration::from_secs(1), "at once");
    assert!(!store.is_connected());
    let (closed, open) = (
        service(&store, FailurePolicy::Closed),
        service(&store, FailurePolicy::Open),
    );
    let local = service(&store, FailurePolicy::Local { divisor: 1 });
    for _ in 0..5 {
        assert_eq!(get(&closed).await.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(get(&open).await.status, StatusCode::OK);
    }
    // In memory meanwhile: the limit of 3, on this instance alone.
    let statuses: Vec<StatusCode> = [(); 4].iter().map(|_| StatusCode::OK).collect();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(get(&local).await.status);
    }
    assert_eq!(seen[..3], statuses[..3]);
    assert_eq!(seen[3], StatusCode::TOO_MANY_REQUESTS);
    support::eventually("the store says why it is not connected", async || {
        store
            .connection_error()
            .is_some_and(|e| e.contains(&format!("cannot connect to Redis at {url}")))
    })
    .await;
    let server = RedisServer::start_on(port, &[], &[], false);
    support::eventually("the store connects", async || store.is_connected()).await;
    assert!(store.uses_functions());
    assert_eq!(store.connection_error(), None);
    // Exact from now on (once the circuit breaker, opened by the failures, lets decisions
    // through): nothing was charged in Redis while it was down.
    let mut statuses = vec![decided_async(&closed).await];
    for _ in 0..3 {
        statuses.push(get(&closed).await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert!(!server.cli(&["KEYS", "lazy:*"]).is_empty());
}

#[test]
fn the_demo_server_starts_while_redis_is_down() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let closed = DemoServer::start(&[
        ("REDIS_URL", &url),
        ("RATE_LIMIT", "2/h"),
        ("KEY", "global"),
        ("ON_STORE_ERROR", "closed"),
    ]);
    let local = DemoServer::start(&[
        ("REDIS_URL", &url),
        ("RATE_LIMIT", "2/h"),
        ("KEY", "global"),
        ("ON_STORE_ERROR", "local"),
    ]);
    closed.line_with("redis: not connected yet: rate-limit store failed: cannot connect to Redis");
    assert_eq!(closed.get("/", &[]).0, 503);
    assert_eq!(local.get("/", &[]).0, 200, "decided in memory");
    let _server = RedisServer::start_on(port, &[], &[], false);
    closed.line_with("redis: connected");
    local.line_with("redis: connected");
    // Both instances share Redis's limit now, 2 in all, once their circuit breakers (opened
    // by the failures) let decisions through again.
    let first = decided(|| closed.get("/", &[]).0);
    let statuses: Vec<u16> = [&local, &closed]
        .iter()
        .map(|s| s.get("/", &[]).0)
        .collect();
    assert_eq!((first, statuses), (200, vec![200, 429]));
}

/// At `maxmemory` with `noeviction`, every decision's write is refused with `OOM`: the failure
/// policy answers (and logs it, naming `OOM`), nothing is charged, and once Redis has room the
/// limit is exact.
#[tokio::test(flavor = "current_thread")]
async fn a_full_redis_gets_the_failure_policy_and_admits_nothing_past_the_limit() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let store = RedisStore::builder(&server.url())
        .prefix("full:")
        .deadline(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let (closed, open) = (
        service(&store, FailurePolicy::Closed),
        service(&store, FailurePolicy::Open),
    );
    assert_eq!(get(&closed).await.status, StatusCode::OK);
    // Full: a maximum below what Redis already uses.
    assert_eq!(server.cli(&["CONFIG", "SET", "maxmemory", "1"]), "OK");
    for _ in 0..5 {
        assert_eq!(get(&closed).await.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(get(&open).await.status, StatusCode::OK);
    }
    let warned = recorder.loud();
    assert!(
        warned
            .iter()
            .any(|e| e.level == "WARN" && format!("{:?}", e.fields).contains("OOM")),
        "{warned:?}"
    );
    // Room again: 1 admitted before, so 2 more.
    assert_eq!(server.cli(&["CONFIG", "SET", "maxmemory", "0"]), "OK");
    let mut statuses = vec![decided_async(&closed).await];
    for _ in 0..2 {
        statuses.push(get(&closed).await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // A store built while it is full starts, and says so in the log.
    assert_eq!(server.cli(&["CONFIG", "SET", "maxmemory", "1"]), "OK");
    RedisStore::builder(&server.url())
        .prefix("full:")
        .build()
        .await
        .expect("a full Redis does not stop the store from starting");
    let events = recorder.everything();
    assert!(events.contains("Redis is out of memory (OOM"), "{events}");
}
