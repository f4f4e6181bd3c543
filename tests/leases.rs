//! Leases: an instance takes several units of a key at once and admits from them locally.
//! On the memory store with an injected clock (what is charged, given back, and when a lease
//! ends), and on a real redis-server (two instances hammering one key stay within the limit
//! and close to it; a lease keeps admitting while Redis is down, until it ends).

mod support;

use std::time::Duration;

use http::{Request, StatusCode};
use support::http::{Seen, get, inner, send};
use support::lease::{fewest_admitted, hammer};
use support::{RedisServer, assert_no_key_without_ttl, global_layer as layer};
use tower::Layer;
use tower_ratelimit::key::{GlobalKey, Key};
use tower_ratelimit::{
    Algorithm, FailurePolicy, ManualClock, MemoryStore, Policy, RateLimitLayer, RedisStore, Store,
};

/// What the store has left for the global key, looked at by a layer without a lease.
async fn left_in_store<St: Store>(store: &St, policy: Policy, clock: &ManualClock) -> u64 {
    let plain = layer(store.clone(), policy, clock);
    plain.check(&Key::global(), 0).await.unwrap().outcomes()[0].remaining()
}

fn gcra(limit: &str) -> Policy {
    Policy::gcra(limit).name("g")
}

fn window(limit: &str) -> Policy {
    Policy::fixed_window(limit).name("w")
}

#[tokio::test]
async fn a_key_seen_once_costs_what_it_costs_without_leases() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let svc =
        layer(store.clone(), window("1000/h").lease(20), &clock).layer(inner(&Seen::default()));
    let first = get(&svc).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.remaining(), Some(999));
    assert_eq!(left_in_store(&store, window("1000/h"), &clock).await, 999);
}

#[tokio::test]
async fn a_hot_key_asks_the_store_about_once_per_lease_and_holds_at_most_one_lease() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let svc =
        layer(store.clone(), window("10000/h").lease(20), &clock).layer(inner(&Seen::default()));
    let mut left = 10_000;
    let mut store_changes = 0;
    for k in 1..=400 {
        let r = get(&svc).await;
        assert_eq!(r.status, StatusCode::OK);
        // Exact in the headers: one instance, whose lease's units count as its own.
        assert_eq!(r.remaining(), Some(10_000 - k));
        let now = left_in_store(&store, window("10000/h"), &clock).await;
        // Never more than one lease's units held here, unspent.
        assert!(
            (10_000 - k - 20..=10_000 - k).contains(&now),
            "after {k} requests the store has {now} left"
        );
        store_changes += u64::from(now != left);
        left = now;
    }
    // Leases grow from the second request (2, 4, 8, 16, then 20), and each is asked for when
    // the one in hand is five sixths spent: at most one store call per 20 - 3 requests once
    // grown.
    assert!(
        store_changes <= 6 + 400 / 17,
        "{store_changes} store calls for 400 requests"
    );
}

#[tokio::test]
async fn units_left_go_back_with_the_next_lease_and_an_ended_lease_is_not_spent() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    // A fixed window gives units back whenever its window is the lease's.
    let policy = || Policy::fixed_window("1000/h").name("w");
    let svc = layer(
        store.clone(),
        policy().lease(10).lease_ttl(Duration::from_secs(1)),
        &clock,
    )
    .layer(inner(&Seen::default()));
    // The first request is decided by the store; the second takes a lease of 2.
    get(&svc).await;
    get(&svc).await;
    assert_eq!(left_in_store(&store, policy(), &clock).await, 997);
    // The lease ends after a second: the next request asks for a new one (of 4), giving back
    // the unit the last one did not spend.
    clock.advance(Duration::from_millis(1_001));
    get(&svc).await;
    assert_eq!(left_in_store(&store, policy(), &clock).await, 1000 - 2 - 4);
}

#[tokio::test]
async fn a_gcra_lease_counts_its_units_as_spent_at_its_end() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let policy = gcra("100/h").lease(10).lease_ttl(Duration::from_secs(60));
    let svc = layer(store.clone(), policy, &clock).layer(inner(&Seen::default()));
    // 100/h is one unit per 36 s. The first request is decided by the store: its TAT is 36 s
    // away. 35.5 s later the second takes a lease of 2 that may be spent for 60 s: the store
    // counts both units as spent then, 96 s after the first request, so 96 units are left
    // to spend right now (97 if they were counted as spent now).
    get(&svc).await;
    clock.advance(Duration::from_millis(35_500));
    get(&svc).await;
    assert_eq!(left_in_store(&store, gcra("100/h"), &clock).await, 96);
    // Once the lease has ended, the two units weigh what two units weigh: 98 left.
    clock.advance(Duration::from_secs(60));
    assert_eq!(left_in_store(&store, gcra("100/h"), &clock).await, 98);
}

#[tokio::test]
async fn refunds_go_back_to_the_lease() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let policy = window("100/h")
        .lease(5)
        .refund_if(|status| status.is_server_error());
    let failing = tower::service_fn(|_req: Request<()>| async {
        Ok::<_, std::convert::Infallible>(
            http::Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(String::new())
                .unwrap(),
        )
    });
    let svc = layer(store.clone(), policy, &clock).layer(failing);
    for _ in 0..20 {
        let r = send(&svc, Request::new(())).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    // The first request's unit was refunded by the store; every later one went back to the
    // lease the second took (of 2 units), which is all the store counts.
    assert_eq!(left_in_store(&store, window("100/h"), &clock).await, 98);
}

#[tokio::test]
async fn a_reset_forgets_the_lease_held_here() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let l = layer(store.clone(), window("1000/h").lease(10), &clock);
    let svc = l.clone().layer(inner(&Seen::default()));
    get(&svc).await;
    get(&svc).await;
    assert_eq!(left_in_store(&store, window("1000/h"), &clock).await, 997);
    l.control().reset(&Key::global()).await.unwrap();
    assert_eq!(left_in_store(&store, window("1000/h"), &clock).await, 1000);
    // The unit left in the forgotten lease is not spent: the next request asks the store.
    get(&svc).await;
    assert!(left_in_store(&store, window("1000/h"), &clock).await < 1000);
}

#[test]
fn absurd_leases_are_refused_when_the_layer_is_built() {
    let build = support::build_error;
    assert!(build(gcra("10/s").lease(0)).contains("between 1 unit"));
    assert!(build(gcra("10/s").lease(11)).contains("limit of 10"));
    assert!(build(gcra("10/s").shadow().lease(2)).contains("shadow"));
    assert!(build(gcra("10/s").lease(2).lease_ttl(Duration::ZERO)).contains("lease_ttl"));
    assert!(build(gcra("10/s").lease(2).lease_ttl(Duration::from_secs(2))).contains("lease_ttl"));
    assert!(build(gcra("10/s").lease_ttl(Duration::from_millis(10))).contains("without a lease"));
    assert!(
        build(
            gcra("10/s")
                .lease(2)
                .charge_if(|s| s == StatusCode::UNAUTHORIZED)
        )
        .contains("charge_if")
    );
}

async fn redis_store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder(&server.url())
        .deadline(Duration::from_secs(10))
        .prefix(prefix)
        .build()
        .await
        .expect("connect to the test redis-server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_admit_between_the_limit_less_two_leases_and_the_limit() {
    let server = RedisServer::start();
    let (limit, lease) = (100, 10);
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, format!("{limit}/h").as_str())
            .name(format!("lease-{algorithm}"))
            .lease(lease as u32);
        let a = redis_store(&server, "lease:").await;
        let b = redis_store(&server, "lease:").await;
        let admitted = hammer(a, b, policy, 240).await;
        let fewest = fewest_admitted(algorithm, limit, lease);
        assert!(
            (fewest..=limit).contains(&admitted),
            "{algorithm}: {admitted} admitted, not within {fewest}..={limit}"
        );
    }
    assert_no_key_without_ttl(&server, "lease:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_in_hand_keeps_admitting_while_redis_is_down_until_it_ends() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new();
    let store = RedisStore::builder(&server.url())
        .deadline(Duration::from_millis(500))
        .prefix("down:")
        .build()
        .await
        .unwrap();
    let svc = RateLimitLayer::builder()
        .policy(gcra("1000/min").lease(50))
        .key(GlobalKey)
        .store(store)
        .clock(clock.clone())
        .on_store_error(FailurePolicy::Closed)
        .build()
        .unwrap()
        .layer(inner(&Seen::default()));
    // Leases grow to 50 units.
    for _ in 0..60 {
        assert_eq!(get(&svc).await.status, StatusCode::OK);
    }
    server.kill();
    // What the lease in hand has left is still admitted, even by the requests that find it
    // running low and ask Redis for the next one in vain.
    let mut admitted = 0;
    while get(&svc).await.status == StatusCode::OK {
        admitted += 1;
        assert!(admitted <= 50, "more admitted than a lease holds");
    }
    assert!(
        admitted > 0,
        "the lease in hand admitted nothing once Redis was down"
    );
    // Once spent (or ended), the store is asked, and is down: the failure policy answers.
    clock.advance(Duration::from_millis(1_001));
    assert_eq!(get(&svc).await.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_block_through_another_instance_is_seen_when_the_lease_here_ends() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let policy = || window("1000/h").lease(10).lease_ttl(Duration::from_secs(1));
    let here = layer(store.clone(), policy(), &clock).layer(inner(&Seen::default()));
    let elsewhere = layer(store.clone(), policy(), &clock);
    // Two requests: the second takes a lease of 2, of which one unit is left here.
    get(&here).await;
    get(&here).await;
    elsewhere
        .control()
        .block_for(&Key::global(), Duration::from_secs(60))
        .await
        .unwrap();
    // The lease in hand still admits: the block is not seen here yet.
    assert_eq!(get(&here).await.status, StatusCode::OK);
    // Once the lease is spent (or has ended), the store is asked and the block holds.
    assert_eq!(get(&here).await.status, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_secs(2));
    assert_eq!(get(&here).await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn an_idle_keys_unspent_units_go_back_with_another_keys_store_call() {
    use tower_ratelimit::key::HeaderKey;

    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let policy = || Policy::fixed_window("1000/h").name("w");
    let svc = RateLimitLayer::builder()
        .policy(policy().lease(10).lease_ttl(Duration::from_secs(1)))
        .key(HeaderKey::new(http::HeaderName::from_static("x-key")))
        .store(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap()
        .layer(inner(&Seen::default()));
    let look = layer(store.clone(), policy(), &clock);
    let request = |key: String| {
        let mut r = Request::new(());
        r.headers_mut().insert("x-key", key.parse().unwrap());
        r
    };
    let left = || async { look.check(&Key::from("a"), 0).await.unwrap().outcomes()[0].remaining() };
    // Key a: decided by the store, then a lease of 2 of which one unit is left unspent.
    send(&svc, request("a".into())).await;
    send(&svc, request("a".into())).await;
    assert_eq!(left().await, 997);
    // Key a goes idle: its lease ends, and a lease's life later it is forgotten here.
    // Requests for other keys sweep the table, and the sweep of a's shard gives a's unit back
    // with the store call of the request that made it.
    clock.advance(Duration::from_secs(3));
    let mut given_back_after = None;
    for i in 0..1_000 {
        send(&svc, request(format!("b{i}"))).await;
        if left().await == 998 {
            given_back_after = Some(i);
            break;
        }
    }
    assert!(
        given_back_after.is_some(),
        "the idle key's unit never came back"
    );
}
