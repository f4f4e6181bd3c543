//! Administrative operations (peek, penalize, refund, reset) with exact values, on every
//! algorithm and on both stores (Redis: a real redis-server started by the test).

mod support;

use std::time::Duration;

use support::RedisServer;
use tower_ratelimit::key::Key;
use tower_ratelimit::{
    Algorithm, Decision, ManualClock, MemoryStore, Policy, RateLimitLayer, RedisStore, Store,
};

fn remaining(d: &Decision) -> u64 {
    d.outcomes()[0].remaining()
}

async fn scenario<St: Store>(store: St, clock: ManualClock, algorithm: Algorithm, label: &str) {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(algorithm, "10/h").name(format!("admin-{algorithm}")))
        .store(store)
        .build()
        .unwrap();
    let key = Key::from("customer-7");
    let other = Key::from("customer-8");
    let ctx = format!("{label}, {algorithm}");
    for _ in 0..3 {
        assert!(layer.check(&key, 1).await.unwrap().is_allowed(), "{ctx}");
    }
    // Peek: looks without charging.
    assert_eq!(
        remaining(&layer.control().peek(&key).await.unwrap()),
        7,
        "{ctx}: peek"
    );
    assert_eq!(
        remaining(&layer.control().peek(&key).await.unwrap()),
        7,
        "{ctx}: peek again"
    );
    // Penalize by 4, then reward (refund) by 2.
    assert_eq!(
        remaining(&layer.penalize(&key, 4).await.unwrap()),
        3,
        "{ctx}: penalize"
    );
    assert_eq!(
        remaining(&layer.refund(&key, 2).await.unwrap()),
        5,
        "{ctx}: refund"
    );
    // A refund never goes past a fresh key.
    assert_eq!(
        remaining(&layer.refund(&key, 50).await.unwrap()),
        10,
        "{ctx}: big refund"
    );
    // A penalty is capped at the capacity: the key is then fully used up.
    let d = layer.penalize(&key, 1_000).await.unwrap();
    assert_eq!(remaining(&d), 0, "{ctx}: big penalty");
    let denied = layer.check(&key, 1).await.unwrap();
    assert!(!denied.is_allowed(), "{ctx}: limited after the penalty");
    assert!(denied.retry_after().is_some(), "{ctx}");
    // Another key is untouched.
    assert_eq!(
        remaining(&layer.control().peek(&other).await.unwrap()),
        10,
        "{ctx}: other key"
    );
    // Reset: as if never seen.
    let d = layer.control().reset(&key).await.unwrap();
    assert_eq!(remaining(&d), 10, "{ctx}: reset");
    assert_eq!(
        d.outcomes()[0].reset_after(),
        Duration::ZERO,
        "{ctx}: fresh"
    );
    assert!(layer.check(&key, 1).await.unwrap().is_allowed(), "{ctx}");
    assert_eq!(
        remaining(&layer.control().peek(&key).await.unwrap()),
        9,
        "{ctx}"
    );
    // Block: denied whatever the state until the block ends, then back to its state.
    let d = layer
        .control()
        .block_for(&key, Duration::from_secs(7_200))
        .await
        .unwrap();
    assert!(!d.is_allowed(), "{ctx}: blocked");
    assert_eq!(d.retry_after(), Some(Duration::from_secs(7_200)), "{ctx}");
    let denied = layer.check(&key, 1).await.unwrap();
    assert!(!denied.is_allowed(), "{ctx}: a blocked key is denied");
    assert_eq!(remaining(&denied), 0, "{ctx}");
    assert_eq!(
        denied.retry_after(),
        Some(Duration::from_secs(7_200)),
        "{ctx}"
    );
    clock.advance(Duration::from_secs(7_200));
    assert!(
        layer.check(&key, 1).await.unwrap().is_allowed(),
        "{ctx}: block over"
    );
    // Reset lifts a block.
    layer
        .control()
        .block_for(&other, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!layer.check(&other, 1).await.unwrap().is_allowed(), "{ctx}");
    assert_eq!(
        remaining(&layer.control().reset(&other).await.unwrap()),
        10,
        "{ctx}"
    );
    assert!(
        layer.check(&other, 1).await.unwrap().is_allowed(),
        "{ctx}: unblocked"
    );
    // Operations on a key never seen are harmless.
    let fresh = Key::from("never-seen");
    assert_eq!(
        remaining(&layer.refund(&fresh, 3).await.unwrap()),
        10,
        "{ctx}"
    );
    assert_eq!(
        remaining(&layer.control().reset(&fresh).await.unwrap()),
        10,
        "{ctx}"
    );
}

#[tokio::test]
async fn admin_operations_on_the_memory_store() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new();
        scenario(
            MemoryStore::with_clock(clock.clone()),
            clock,
            algorithm,
            "memory",
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_operations_on_redis() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new();
        let store = RedisStore::builder(&server.url())
            .deadline(Duration::from_secs(10))
            .prefix("admin:")
            .clock(clock.clone())
            .build()
            .await
            .unwrap();
        scenario(store, clock, algorithm, "redis").await;
    }
    support::assert_no_key_without_ttl(&server, "admin:");
}
