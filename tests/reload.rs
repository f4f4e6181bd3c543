//! Reloading a running layer's policies (`RateLimitLayer::reload`): usage survives a changed
//! quota on every algorithm and in both stores, a reload under load fails no request, a bad
//! reload changes nothing, and two instances reloaded one after the other share one usage.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, StatusCode};
use support::http::{Seen, inner, send};
use support::{RedisServer, global_layer as layer};
use tower::Layer;
use tower_ratelimit::key::Key;
use tower_ratelimit::{Algorithm, ManualClock, MemoryStore, Policy, Quota, RateLimitLayer, Store};

/// `algorithm` at `limit` per `window`, named "api".
fn api_per(algorithm: Algorithm, limit: u32, window: Duration) -> Policy {
    Policy::new(algorithm, Quota::new(limit, window).unwrap()).name("api")
}

/// `algorithm` at `limit` a minute, named "api".
fn api(algorithm: Algorithm, limit: u32) -> Policy {
    api_per(algorithm, limit, Duration::from_secs(60))
}

/// A store per algorithm (a name keeps its algorithm in a store) on `clock`.
trait Stores {
    type Store: Store;
    async fn store(&self, algorithm: Algorithm, clock: &ManualClock) -> Self::Store;
}

struct InMemory;

impl Stores for InMemory {
    type Store = MemoryStore;
    async fn store(&self, _: Algorithm, clock: &ManualClock) -> MemoryStore {
        MemoryStore::with_clock(clock.clone())
    }
}

struct InRedis(RedisServer);

impl Stores for InRedis {
    type Store = tower_ratelimit::RedisStore;
    async fn store(&self, algorithm: Algorithm, clock: &ManualClock) -> Self::Store {
        self.0.store(&format!("{algorithm}:"), clock).await
    }
}

fn clock() -> ManualClock {
    let clock = ManualClock::new();
    // Inside a minute-long window, two seconds after it starts.
    clock.set_micros(1_000_002_000_000 - 1_000_002_000_000 % 60_000_000 + 2_000_000);
    clock
}

/// A layer of `algorithm` at 10 a minute on a fresh store of `stores`, and a key that has
/// used `n` of it.
async fn used<S: Stores>(
    stores: &S,
    algorithm: Algorithm,
    clock: &ManualClock,
    n: usize,
) -> (RateLimitLayer<S::Store>, Key) {
    let layer = layer(
        stores.store(algorithm, clock).await,
        api(algorithm, 10),
        clock,
    );
    let key = Key::from("client");
    for _ in 0..n {
        assert!(
            layer.check(&key, 1).await.unwrap().is_allowed(),
            "{algorithm}"
        );
    }
    (layer, key)
}

/// The issue's example on every algorithm: 5 used of 10 a minute, the limit raised to 20:
/// 15 remain, and exactly 15 more are admitted; back to 10, the key has used them all.
async fn raised_limit_keeps_usage(stores: impl Stores) {
    for algorithm in Algorithm::ALL {
        let clock = clock();
        let (layer, key) = used(&stores, algorithm, &clock, 5).await;
        clock.advance(Duration::from_millis(10));
        let report = layer.control().reload([api(algorithm, 20)]).unwrap();
        assert_eq!(report.changed.len(), 1, "{algorithm}: {report}");
        assert_eq!(
            remaining(&layer, &key).await,
            15,
            "{algorithm}: 5 used of 20"
        );
        for i in 0..15 {
            let d = layer.check(&key, 1).await.unwrap();
            assert!(d.is_allowed(), "{algorithm}: request {i} of the 15 left");
        }
        assert!(
            !layer.check(&key, 1).await.unwrap().is_allowed(),
            "{algorithm}"
        );
        layer.control().reload([api(algorithm, 10)]).unwrap();
        assert_eq!(
            remaining(&layer, &key).await,
            0,
            "{algorithm}: 20 used of 10"
        );
        assert!(
            !layer.check(&key, 1).await.unwrap().is_allowed(),
            "{algorithm}"
        );
    }
}

/// A lowered limit keeps the whole usage: 5 used of 10, lowered to 3, is a key 2 units past
/// its capacity; the buckets and GCRA admit it again once 3 units have come back at the new
/// rate (one every 20 s), and converted back they find all 5 used.
async fn lowered_limit_keeps_usage(stores: impl Stores) {
    for algorithm in Algorithm::ALL {
        let clock = clock();
        let (layer, key) = used(&stores, algorithm, &clock, 5).await;
        layer.control().reload([api(algorithm, 3)]).unwrap();
        let d = layer.check(&key, 1).await.unwrap();
        assert!(!d.is_allowed(), "{algorithm}: 5 used of 3");
        assert_eq!(d.tightest().remaining(), 0, "{algorithm}");
        if matches!(
            algorithm,
            Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket
        ) {
            assert_eq!(
                d.retry_after(),
                Some(Duration::from_secs(60)),
                "{algorithm}"
            );
        }
        layer.control().reload([api(algorithm, 10)]).unwrap();
        assert_eq!(
            remaining(&layer, &key).await,
            5,
            "{algorithm}: 5 used of 10"
        );
    }
}

/// What "the same usage" is when the window changes, per algorithm (the crate docs' table):
/// 6 used of 10 a minute, then 10 an hour.
async fn longer_window(stores: impl Stores) {
    for algorithm in Algorithm::ALL {
        let clock = clock();
        let (layer, key) = used(&stores, algorithm, &clock, 6).await;
        clock.advance(Duration::from_secs(1));
        let hour = Duration::from_secs(3600);
        layer
            .control()
            .reload([api_per(algorithm, 10, hour)])
            .unwrap();
        let d = layer.control().peek(&key).await.unwrap();
        // Every algorithm keeps the 6 units (the buckets and GCRA less what refilled in the
        // second, less than one unit at either rate), so 4 remain.
        assert_eq!(d.tightest().remaining(), 4, "{algorithm}");
        match algorithm {
            // Counted in the hour that holds the present.
            Algorithm::FixedWindow => {
                let window_end = 3_600_000_000 - (clock_now(&clock) % 3_600_000_000);
                assert_eq!(
                    d.tightest().reset_after(),
                    Duration::from_micros(window_end)
                );
            }
            // The units leave at the new rate: the 6 units less the sixth of one that came back
            // in the second, at 6 minutes each: 2,100 s.
            Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let after = d.tightest().reset_after().as_secs_f64();
                assert!((2099.9..=2100.1).contains(&after), "{algorithm}: {after}");
            }
            // The entries (or buckets) leave an hour after they were made.
            Algorithm::SlidingLog | Algorithm::SlidingWindow => {
                let after = d.tightest().reset_after().as_secs_f64();
                // (Up to one bucket of 6 minutes more for the sliding window.)
                assert!((3540.0..=3960.0).contains(&after), "{algorithm}: {after}");
            }
            _ => {}
        }
    }
}

/// What a look at `key` finds remaining.
async fn remaining<St: Store>(layer: &RateLimitLayer<St>, key: &Key) -> u64 {
    layer
        .control()
        .peek(key)
        .await
        .unwrap()
        .tightest()
        .remaining()
}

fn clock_now(clock: &ManualClock) -> u64 {
    tower_ratelimit::Clock::now_micros(clock)
}

/// Runs each scenario as `in_memory::<test>` and `on_redis::<test>` (on a redis-server of its
/// own).
macro_rules! on_each_store {
    ($($test:ident => $scenario:ident,)*) => {
        mod in_memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $test() {
                    $scenario(InMemory).await;
                }
            )*
        }

        mod on_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    $scenario(InRedis(RedisServer::start())).await;
                }
            )*
        }
    };
}

on_each_store! {
    usage_survives_a_raised_limit_on_every_algorithm => raised_limit_keeps_usage,
    a_lowered_limit_keeps_the_whole_usage => lowered_limit_keeps_usage,
    a_longer_window_keeps_the_usage_each_algorithm_says => longer_window,
}

/// Eight clients hammer a service through clones of one layer; once 50 requests went through,
/// one of them raises the limit from 100 to 200 a minute (the clock stands still). No request
/// fails, and exactly 200 go through: the 50 before the reload count against the new limit.
async fn reload_under_load<St: Store>(store: St, algorithm: Algorithm) {
    let clock = clock();
    let layer = layer(store, api(algorithm, 100), &clock);
    let seen = Seen::default();
    let service = layer.clone().layer(inner(&seen));
    let admitted = Arc::new(AtomicUsize::new(0));
    let reloaded = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (service, layer, admitted, reloaded) = (
            service.clone(),
            layer.clone(),
            admitted.clone(),
            reloaded.clone(),
        );
        clients.push(tokio::spawn(async move {
            loop {
                let after_reload = reloaded.load(Ordering::SeqCst);
                let reply = send(&service, Request::new(())).await;
                match reply.status {
                    StatusCode::OK => {
                        if admitted.fetch_add(1, Ordering::SeqCst) + 1 == 50 {
                            layer.control().reload([api(algorithm, 200)]).unwrap();
                            reloaded.store(true, Ordering::SeqCst);
                        }
                    }
                    StatusCode::TOO_MANY_REQUESTS if after_reload => return,
                    StatusCode::TOO_MANY_REQUESTS => {}
                    other => panic!("{algorithm}: a request failed with {other}"),
                }
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::SeqCst), 200, "{algorithm}");
    assert_eq!(seen.calls(), 200, "{algorithm}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_keeps_usage_and_fails_no_request_in_memory() {
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        reload_under_load(MemoryStore::with_clock(clock()), algorithm).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_keeps_usage_and_fails_no_request_in_redis() {
    let server = RedisServer::start();
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let store = server.store(&format!("load-{algorithm}:"), &clock()).await;
        reload_under_load(store, algorithm).await;
    }
}

/// Two instances on one Redis, reloaded one after the other: while one runs 10 a minute and
/// the other 20, each converts the key's state to its own quota when it uses it, so the usage
/// is one: together they admit 20, not 30.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_reloaded_one_after_the_other_share_one_usage() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        let clock = clock();
        let prefix = format!("rolling-{algorithm}:");
        let a = layer(
            server.store(&prefix, &clock).await,
            api(algorithm, 10),
            &clock,
        );
        let b = layer(
            server.store(&prefix, &clock).await,
            api(algorithm, 10),
            &clock,
        );
        let key = Key::from("client");
        for _ in 0..4 {
            assert!(a.check(&key, 1).await.unwrap().is_allowed());
        }
        b.control().reload([api(algorithm, 20)]).unwrap();
        let mut admitted = 4;
        for i in 0..40 {
            let instance = if i % 2 == 0 { &a } else { &b };
            if instance.check(&key, 1).await.unwrap().is_allowed() {
                admitted += 1;
            }
        }
        // A admits while the key has used fewer than 10, B while fewer than 20.
        assert_eq!(admitted, 20, "{algorithm}");
        assert_eq!(remaining(&a, &key).await, 0, "{algorithm}");
        assert_eq!(remaining(&b, &key).await, 0, "{algorithm}");
        a.control().reload([api(algorithm, 20)]).unwrap();
        assert_eq!(remaining(&a, &key).await, 0, "{algorithm}");
    }
}

/// A reload that fails changes nothing: the old limits stay in force.
#[tokio::test]
async fn a_bad_reload_is_rejected_and_the_old_limits_stay() {
    let clock = clock();
    let layer = layer(
        MemoryStore::with_clock(clock.clone()),
        api(Algorithm::Gcra, 2),
        &clock,
    );
    let key = Key::from("client");
    let bad: [Vec<Policy>; 4] = [
        vec![],
        vec![Policy::gcra("0/s").name("api")],
        vec![
            api(Algorithm::Gcra, 10),
            Policy::fixed_window("100/fortnight").name("other"),
        ],
        vec![api(Algorithm::Gcra, 10), api(Algorithm::Gcra, 20)],
    ];
    for policies in bad {
        let err = layer.control().reload(policies.clone()).unwrap_err();
        assert!(!err.to_string().is_empty(), "{policies:?}");
    }
    let err = layer
        .control()
        .reload([api(Algorithm::TokenBucket, 2)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("change its algorithm") && err.contains("new name"),
        "{err}"
    );
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    assert!(!layer.check(&key, 1).await.unwrap().is_allowed(), "still 2");
    assert_eq!(layer.policy_names(), ["api"]);
}

/// The report says what changed, tier by tier; a removed policy is no longer checked, and an
/// added one is.
#[tokio::test]
async fn the_report_names_what_changed() {
    let clock = clock();
    let layer = RateLimitLayer::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .key(tower_ratelimit::key::GlobalKey)
        .policy(Policy::gcra("10/s").name("api").tier("pro", "100/s"))
        .policy(Policy::sliding_log("5/min").name("logins"))
        .build()
        .unwrap();
    let report = layer
        .control()
        .reload([
            Policy::gcra("10/s").name("api").tier("pro", "200/s"),
            Policy::fixed_window("1/h").name("exports"),
        ])
        .unwrap();
    assert_eq!(
        report.to_string(),
        r#"changed "api:pro": gcra 100/s -> gcra 200/s; added "exports" (fixed_window 1/h); removed "logins" (sliding_log 5/min); 1 unchanged"#
    );
    assert_eq!(layer.policy_names(), ["api", "exports"]);
    let key = Key::from("k");
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    let d = layer.check(&key, 1).await.unwrap();
    assert_eq!(d.tightest().policy(), "exports");
    assert!(!d.is_allowed());
    assert!(
        layer
            .control()
            .reload([
                Policy::gcra("10/s").name("api").tier("pro", "200/s"),
                Policy::fixed_window("1/h").name("exports")
            ])
            .unwrap()
            .is_empty()
    );
}

/// A denial the deny cache remembers under the old limit is dropped by a reload that raises
/// it: the next request is admitted at once, without waiting for the denial's end.
#[tokio::test]
async fn the_deny_cache_forgets_denials_of_a_changed_policy() {
    let clock = clock();
    let layer = RateLimitLayer::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .key(tower_ratelimit::key::GlobalKey)
        .clock(clock.clone())
        .deny_cache(100)
        .policy(api(Algorithm::FixedWindow, 2))
        .build()
        .unwrap();
    let seen = Seen::default();
    let service = layer.clone().layer(inner(&seen));
    for _ in 0..2 {
        assert_eq!(
            send(&service, Request::new(())).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        send(&service, Request::new(())).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    layer
        .control()
        .reload([api(Algorithm::FixedWindow, 3)])
        .unwrap();
    assert_eq!(
        send(&service, Request::new(())).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&service, Request::new(())).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(seen.calls(), 3);
}
