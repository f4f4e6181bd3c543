//! Everything the Redis store does, in one scenario that tests run under other conditions
//! (a least-privilege ACL user, a capture of every reply).

use std::time::Duration;

use http::StatusCode;
use tower::ServiceExt;
use tower_ratelimit::key::{GlobalKey, Key};
use tower_ratelimit::{Algorithm, Policy, RateLimitLayer, RedisStore};

use super::http::{Seen, get, inner};

/// Everything the store does: each algorithm's fused decision and the admin operations,
/// several policies at once, a lease, a wait, a concurrency slot, a reload, and a decision
/// after the function or script was flushed.
pub async fn everything(store: &RedisStore, flush: impl Fn()) {
    for algorithm in Algorithm::ALL {
        let layer = RateLimitLayer::builder()
            .policy(Policy::new(algorithm, "3/h").name(algorithm.name()))
            .store(store.clone())
            .build()
            .unwrap();
        let key = Key::from("k");
        for _ in 0..3 {
            assert!(layer.check(&key, 1).await.unwrap().is_allowed());
        }
        assert!(!layer.check(&key, 1).await.unwrap().is_allowed());
        layer.control().peek(&key).await.unwrap();
        layer.refund(&key, 1).await.unwrap();
        layer.penalize(&key, 1).await.unwrap();
        layer
            .control()
            .block_for(&key, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(!layer.check(&key, 1).await.unwrap().is_allowed());
        layer.control().reset(&key).await.unwrap();
        assert!(layer.check(&key, 1).await.unwrap().is_allowed());
        layer
            .control()
            .reload([Policy::new(algorithm, "5/h").name(algorithm.name())])
            .unwrap();
        assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    }
    let service = |policies: Vec<Policy>| {
        let layer = RateLimitLayer::builder()
            .policies(policies)
            .key(GlobalKey)
            .store(store.clone())
            .build()
            .unwrap();
        tower::ServiceBuilder::new()
            .layer(layer)
            .service(inner(&Seen::default()))
    };
    let two = service(vec![
        Policy::gcra("5/h").name("two-a"),
        Policy::sliding_log("10/h").name("two-b"),
    ]);
    let leased = service(vec![Policy::fixed_window("10/h").name("leased").lease(2)]);
    let waits = service(vec![
        Policy::gcra("20/s")
            .name("waits")
            .wait_up_to(Duration::from_secs(1)),
    ]);
    let held = service(vec![Policy::concurrency(1).name("held")]);
    for svc in [&two, &leased, &waits, &held] {
        assert_eq!(get(svc).await.status, StatusCode::OK);
    }
    for svc in [&two, &leased, &waits] {
        assert_eq!(get(svc).await.status, StatusCode::OK);
    }
    // The held slot goes back to Redis in a call of its own once the response has ended.
    super::eventually("the concurrency slot given back", async || {
        get(&held).await.status == StatusCode::OK
    })
    .await;
    flush();
    assert_eq!(get(&two).await.status, StatusCode::OK);
    let _ = held.clone().oneshot(http::Request::new(())).await.unwrap();
}
