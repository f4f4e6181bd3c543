//! A warning before the limit (`Policy::near_limit`): the first request admitted at or past
//! the share in a window is handed to the hook and listed beside the top limited keys, once
//! per key and window on each instance, on both stores, two instances sharing one Redis, and
//! the cluster (an injected clock moves the window on).

mod support;

use std::time::Duration;

use http::{Request, StatusCode};
use support::http::{App, Seen, app, send};
use support::{RedisCluster, RedisServer};
use tokio::sync::mpsc;
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::top::TopLimited;
use tower_ratelimit::{
    Algorithm, ManualClock, MemoryStore, Policy, RateLimitLayer, Store, policy::NearLimit,
};

/// 10 a minute per `x-key` of `algorithm`, warning at 80%, on `store`, its warnings sent to
/// the channel returned.
fn layer<St: Store>(
    store: St,
    algorithm: Algorithm,
    clock: &ManualClock,
) -> (App, RateLimitLayer<St>, mpsc::UnboundedReceiver<NearLimit>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::new(algorithm, "10/min")
                .name(format!("near-{}", algorithm.name()))
                .near_limit(80),
        )
        .key(HeaderKey::try_new("x-key").unwrap())
        .top_limited(TopLimited::new())
        .on_near_limit(move |warning| {
            let tx = tx.clone();
            async move {
                tx.send(warning).unwrap();
            }
        })
        .clock(clock.clone())
        .store(store)
        .build()
        .unwrap();
    let app = app(&layer, &Seen::default());
    (app, layer, rx)
}

async fn ask(app: &App, key: &str) -> StatusCode {
    let request = Request::builder().header("x-key", key).body(()).unwrap();
    send(app, request).await.status
}

/// The warnings handed to the hook so far (each hook runs on a task of its own: the
/// channel is read until it has been quiet while the tasks ran).
async fn warnings(rx: &mut mpsc::UnboundedReceiver<NearLimit>) -> Vec<NearLimit> {
    let mut out = Vec::new();
    for _ in 0..50 {
        tokio::task::yield_now().await;
        while let Ok(w) = rx.try_recv() {
            out.push(w);
        }
    }
    out
}

/// Waits for the next warning (the hook's task runs off the request's path).
async fn next(rx: &mut mpsc::UnboundedReceiver<NearLimit>) -> NearLimit {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a warning within 10 s")
        .unwrap()
}

/// On `one` and `two` (two instances on one store, or the same twice): the 8th request of
/// a key is warned of, once in its window on the instance that made it; the other instance
/// warns once too when it sees the key past the share; a new window warns again.
async fn warned_once_per_window<St: Store>(one: St, two: St, clock: ManualClock) {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::Gcra,
        Algorithm::SlidingLog,
    ] {
        let (app, limiter, mut rx) = layer(one.clone(), algorithm, &clock);
        let (other, _, mut other_rx) = layer(two.clone(), algorithm, &clock);
        for _ in 0..7 {
            assert_eq!(ask(&app, "k").await, StatusCode::OK);
        }
        assert!(
            warnings(&mut rx).await.is_empty(),
            "{algorithm}: none before 80%"
        );
        assert_eq!(ask(&app, "k").await, StatusCode::OK);
        let warning = next(&mut rx).await;
        assert_eq!(warning.key, Key::from("k"));
        assert_eq!((warning.limit, warning.remaining), (10, 2), "{algorithm}");
        assert_eq!(warning.policy, format!("near-{}", algorithm.name()));
        assert!(warning.reset_after > Duration::ZERO);
        assert_eq!(ask(&app, "k").await, StatusCode::OK);
        assert!(
            warnings(&mut rx).await.is_empty(),
            "{algorithm}: once a window"
        );
        // The other instance sees the key past the share: it warns once of its own.
        assert_eq!(ask(&other, "k").await, StatusCode::OK);
        assert_eq!(next(&mut other_rx).await.remaining, 0, "{algorithm}");
        assert_eq!(ask(&other, "k").await, StatusCode::TOO_MANY_REQUESTS);
        assert!(warnings(&mut other_rx).await.is_empty());
        // Listed beside the top limited keys.
        let report = &limiter.control().top_limited_reports(10)[0];
        assert_eq!(report.near_limit(), 1);
        assert_eq!(report.near_keys()[0].text(), "k");
        // A new window: warned again.
        clock.advance(Duration::from_secs(60));
        for _ in 0..8 {
            assert_eq!(ask(&app, "k").await, StatusCode::OK);
        }
        assert_eq!(next(&mut rx).await.remaining, 2, "{algorithm}: next window");
        assert!(warnings(&mut rx).await.is_empty());
        clock.advance(Duration::from_secs(60));
    }
}

#[tokio::test]
async fn warned_once_per_window_in_memory() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    warned_once_per_window(store.clone(), store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warned_once_per_window_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = || server.store("near:", &clock);
    warned_once_per_window(store().await, store().await, clock.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warned_once_per_window_on_the_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let one = cluster.store("near:", &clock).await;
    let two = cluster.store("near:", &clock).await;
    warned_once_per_window(one, two, clock).await;
}

#[test]
fn mistakes_are_errors() {
    for (policy, says) in [
        (Policy::gcra("10/s").near_limit(0), "from 1 to 99"),
        (Policy::gcra("10/s").near_limit(100), "from 1 to 99"),
        (
            Policy::concurrency(5).near_limit(80),
            "enforced or a shadow",
        ),
    ] {
        let error = support::build_error(policy);
        assert!(error.contains(says), "{error}");
    }
}

#[cfg(feature = "toml")]
#[test]
fn near_limit_from_the_configuration_file() {
    use tower_ratelimit::config::Limits;
    let limits = Limits::from_toml("[[policy]]\nquota = \"10/min\"\nnear_limit = 80\n").unwrap();
    assert_eq!(limits.policies().unwrap().len(), 1);
    let error = Limits::from_toml("[[policy]]\nquota = \"10/min\"\nnear_limit = 0\n").unwrap_err();
    assert!(error.to_string().contains("from 1 to 99"), "{error}");
}

/// A hook slower than the warnings come is not queued without bound: 256 of its tasks run at
/// once, the warnings past them are dropped (and counted), and once tasks end the hook is
/// handed warnings again.
#[tokio::test(flavor = "current_thread")]
async fn the_hooks_running_at_once_are_bounded() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (started, gate) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let (hook_started, hook_gate) = (started.clone(), gate.clone());
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("10/min").name("bounded").near_limit(5))
        .key(HeaderKey::try_new("x-key").unwrap())
        .on_near_limit(move |_| {
            let (started, gate) = (hook_started.clone(), hook_gate.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = gate.acquire().await;
            }
        })
        .clock(clock.clone())
        .store(MemoryStore::builder().clock(clock).build())
        .build()
        .unwrap();
    let app = app(&layer, &Seen::default());
    let settle = || async {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    };
    for i in 0..300 {
        assert_eq!(ask(&app, &format!("k{i}")).await, StatusCode::OK);
    }
    settle().await;
    assert_eq!(started.load(Ordering::SeqCst), 256, "the rest were dropped");
    gate.close();
    settle().await;
    assert_eq!(ask(&app, "one-more").await, StatusCode::OK);
    settle().await;
    assert_eq!(
        started.load(Ordering::SeqCst),
        257,
        "handed again once tasks ended"
    );
}
