//! One key's own limit (`RateLimitLayer::set_limit`, `clear_limit`), on both stores: raised
//! and lowered with its usage kept, ended at its time or cleared, kept across a reload, seen
//! by a second instance on its next request, on every algorithm, on the cluster; bad input.
//!
//! Time moves only through a `ManualClock`.

mod support;

use std::time::{Duration, UNIX_EPOCH};

use support::{RedisCluster, RedisServer, global_layer};
use tower_ratelimit::key::{GlobalKey, Key};
use tower_ratelimit::{
    Algorithm, LimitError, ManualClock, MemoryStore, Policy, RateLimitLayer, Store,
    calendar::Calendar,
};

const S: u64 = 1_000_000;
/// 2026-11-26 00:00 UTC.
const T0: u64 = 1_795_651_200 * S;

/// (allowed, remaining, limit) of one check of `key` at `cost`.
async fn check<St: Store>(layer: &RateLimitLayer<St>, key: &str, cost: u32) -> (bool, u64, u64) {
    let decision = layer.check(&Key::from(key), cost).await.unwrap();
    let o = &decision.outcomes()[0];
    (o.is_allowed(), o.remaining(), o.limit())
}

/// `until`, microseconds on the clock, as a time.
fn at(us: u64) -> Option<std::time::SystemTime> {
    Some(UNIX_EPOCH + Duration::from_micros(us))
}

/// A fixed window of 10 a minute: a key raised to 50, lowered to 5, back at the end of its
/// limit and when cleared, its usage kept throughout; another key untouched.
async fn a_keys_limit_changes_and_ends<St: Store>(store: St, clock: &ManualClock, name: &str) {
    clock.set_micros(T0);
    let layer = global_layer(store, Policy::fixed_window("10/min").name(name), clock);
    for _ in 0..10 {
        assert!(check(&layer, "acme", 1).await.0);
    }
    assert!(!check(&layer, "acme", 1).await.0);
    let decision = layer
        .control()
        .set_limit(name, &Key::from("acme"), "50/min", at(T0 + 30 * S))
        .await
        .unwrap();
    let o = &decision.outcomes()[0];
    assert_eq!(
        (o.limit(), o.remaining()),
        (50, 40),
        "the ten used are kept"
    );
    assert_eq!(check(&layer, "acme", 5).await, (true, 35, 50));
    assert_eq!(
        check(&layer, "other", 1).await,
        (true, 9, 10),
        "other keys keep 10"
    );
    // Lowered: 15 used of 5.
    layer
        .control()
        .set_limit(name, &Key::from("acme"), "5/min", at(T0 + 30 * S))
        .await
        .unwrap();
    assert_eq!(check(&layer, "acme", 1).await, (false, 0, 5));
    // Its end: back under 10 a minute, 15 used.
    clock.set_micros(T0 + 30 * S);
    assert_eq!(
        check(&layer, "acme", 0).await,
        (false, 0, 10),
        "15 used of 10"
    );
    // The next window, raised again, then cleared.
    clock.set_micros(T0 + 60 * S);
    layer
        .control()
        .set_limit(name, &Key::from("acme"), "20/min", None)
        .await
        .unwrap();
    assert_eq!(check(&layer, "acme", 12).await, (true, 8, 20));
    let cleared = layer
        .control()
        .clear_limit(name, &Key::from("acme"))
        .await
        .unwrap();
    assert_eq!(cleared.outcomes()[0].limit(), 10);
    assert!(!check(&layer, "acme", 1).await.0, "12 used of 10");
}

#[tokio::test]
async fn a_keys_limit_changes_and_ends_in_memory() {
    let clock = ManualClock::new();
    a_keys_limit_changes_and_ends(MemoryStore::with_clock(clock.clone()), &clock, "m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_limit_changes_and_ends_in_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    a_keys_limit_changes_and_ends(server.store("own:", &clock).await, &clock, "r").await;
}

/// A key's own limit stays through a reload of its policy; other keys take the new quota.
async fn a_keys_limit_survives_a_reload<St: Store>(store: St, clock: &ManualClock) {
    clock.set_micros(T0);
    let layer = global_layer(store, Policy::gcra("10/min").name("api"), clock);
    layer
        .control()
        .set_limit("api", &Key::from("acme"), "100/min", at(T0 + 60 * S))
        .await
        .unwrap();
    layer
        .control()
        .reload([Policy::gcra("20/min").name("api")])
        .unwrap();
    assert_eq!(check(&layer, "acme", 1).await, (true, 99, 100));
    assert_eq!(check(&layer, "other", 1).await.2, 20);
    clock.set_micros(T0 + 60 * S);
    assert_eq!(check(&layer, "acme", 1).await.2, 20, "ended: the new quota");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_limit_survives_a_reload_on_both_stores() {
    let clock = ManualClock::new();
    a_keys_limit_survives_a_reload(MemoryStore::with_clock(clock.clone()), &clock).await;
    let server = RedisServer::start();
    a_keys_limit_survives_a_reload(server.store("reload:", &clock).await, &clock).await;
}

/// Every algorithm: a key raised from 4 to 8 a minute admits 8 where others admit 4, and is
/// back at 4 (its usage kept) once cleared.
async fn every_algorithm_takes_a_keys_limit<St: Store + Clone>(store: St, clock: &ManualClock) {
    for algorithm in Algorithm::ALL {
        clock.set_micros(T0);
        let name = format!("every-{}", algorithm.name());
        let layer = global_layer(
            store.clone(),
            Policy::new(algorithm, "4/min").name(name.as_str()),
            clock,
        );
        layer
            .control()
            .set_limit(&name, &Key::from("acme"), "8/min", at(T0 + 60 * S))
            .await
            .unwrap();
        let admitted = |key: &'static str| {
            let layer = layer.clone();
            async move {
                let mut n = 0;
                while check(&layer, key, 1).await.0 {
                    n += 1;
                    assert!(n <= 100, "{key} never denied");
                }
                n
            }
        };
        assert_eq!(admitted("acme").await, 8, "{algorithm}: its own limit");
        assert_eq!(admitted("other").await, 4, "{algorithm}: the policy's");
        layer
            .control()
            .clear_limit(&name, &Key::from("acme"))
            .await
            .unwrap();
        let (allowed, _, limit) = check(&layer, "acme", 1).await;
        assert_eq!((allowed, limit), (false, 4), "{algorithm}: 8 used of 4");
    }
}

#[tokio::test]
async fn every_algorithm_takes_a_keys_limit_in_memory() {
    let clock = ManualClock::new();
    every_algorithm_takes_a_keys_limit(MemoryStore::with_clock(clock.clone()), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_takes_a_keys_limit_in_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    every_algorithm_takes_a_keys_limit(server.store("every:", &clock).await, &clock).await;
}

/// Two instances on one store: a limit set through one is obeyed by the other on its next
/// request, and cleared the same way.
async fn the_other_instance_obeys_at_once<St: Store>(a: St, b: St, clock: &ManualClock) {
    clock.set_micros(T0);
    let policy = || Policy::sliding_log("3/min").name("shared");
    let (a, b) = (
        global_layer(a, policy(), clock),
        global_layer(b, policy(), clock),
    );
    for _ in 0..3 {
        assert!(check(&b, "acme", 1).await.0);
    }
    assert!(!check(&b, "acme", 1).await.0);
    a.control()
        .set_limit("shared", &Key::from("acme"), "5/min", None)
        .await
        .unwrap();
    assert_eq!(check(&b, "acme", 1).await, (true, 1, 5));
    assert_eq!(check(&b, "acme", 1).await, (true, 0, 5));
    assert!(!check(&a, "acme", 1).await.0);
    a.control()
        .clear_limit("shared", &Key::from("acme"))
        .await
        .unwrap();
    assert_eq!(check(&b, "acme", 0).await.2, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_instance_on_one_redis_obeys_at_once() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let (a, b) = (
        server.store("two:", &clock).await,
        server.store("two:", &clock).await,
    );
    the_other_instance_obeys_at_once(a, b, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_instance_on_the_cluster_obeys_at_once() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let store = async || cluster.store("two:", &clock).await;
    the_other_instance_obeys_at_once(store().await, store().await, &clock).await;
    every_algorithm_takes_a_keys_limit(store().await, &clock).await;
}

#[tokio::test]
async fn bad_limits_are_errors() {
    let layer = RateLimitLayer::builder()
        .key(GlobalKey)
        .policy(Policy::fixed_window("10/min").name("api"))
        .policy(
            Policy::new(Algorithm::FixedWindow, "1000/month")
                .name("plan")
                .calendar(Calendar::utc()),
        )
        .build()
        .unwrap();
    let key = Key::from("acme");
    let error = layer.control().set_limit("nope", &key, "5/min", None).await;
    assert!(
        matches!(error, Err(LimitError::UnknownPolicy(_))),
        "{error:?}"
    );
    let error = layer
        .control()
        .set_limit("api", &key, "0/min", None)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("zero"), "{error}");
    let error = layer
        .control()
        .set_limit("plan", &key, "50/day", None)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("calendar period"), "{error}");
    assert!(
        layer
            .control()
            .set_limit("plan", &key, "5000/month", None)
            .await
            .is_ok()
    );
}
