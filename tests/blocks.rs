//! Blocks on violation that escalate (`Policy::block_on_violation`): levels and their ends on
//! an injected clock, the level forgotten after its time, blocks after N denials within a
//! span, a block seen by another instance sharing the store, the deny cache, `reset`; on both
//! stores, two instances of one Redis, and the cluster.

mod support;

use std::time::Duration;

use http::{Request, StatusCode};
use support::http::{App, Seen, app, send};
use support::{RedisCluster, RedisServer};
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::{
    Algorithm, ManualClock, MemoryStore, Policy, RateLimitLayer, Store, policy::Escalation,
};

/// 2 a second per `x-key` of `algorithm`, blocking as `escalation` says, on `store`.
fn layer<St: Store>(
    store: St,
    algorithm: Algorithm,
    escalation: Escalation,
    clock: &ManualClock,
    deny_cache: bool,
) -> (App, RateLimitLayer<St>) {
    let mut builder = RateLimitLayer::builder()
        .policy(
            Policy::new(algorithm, "2/s")
                .name(format!("blocks-{}", algorithm.name()))
                .block_on_violation(escalation),
        )
        .key(HeaderKey::try_new("x-key").unwrap())
        .clock(clock.clone());
    if deny_cache {
        builder = builder.deny_cache(1000);
    }
    let layer = builder.store(store).build().unwrap();
    let app = app(&layer, &Seen::default());
    (app, layer)
}

/// A request of `key`: `None` when admitted, else the retry-after it was told, in ms.
async fn ask(app: &App, key: &str) -> Option<u128> {
    let request = Request::builder().header("x-key", key).body(()).unwrap();
    let reply = send(app, request).await;
    match reply.status {
        StatusCode::OK => None,
        StatusCode::TOO_MANY_REQUESTS => {
            let header = u128::from(reply.retry_after());
            let decision = reply.decision.expect("a 429 carries its decision");
            let retry = decision.outcomes()[0].retry_after().expect("a retry time");
            assert_eq!(header, retry.as_millis().div_ceil(1000));
            Some(retry.as_millis())
        }
        other => panic!("unexpected {other}"),
    }
}

/// Uses `key`'s two units: the next request is denied.
async fn spend(app: &App, key: &str) {
    assert_eq!(ask(app, key).await, None);
    assert_eq!(ask(app, key).await, None);
}

/// Every level from its first denial: 10 s, 20 s, 40 s, then 40 s again (the longest);
/// within a block, another instance is denied to its end and no new strike counts; a day
/// without a block forgets the level.
async fn levels<St: Store>(one: St, two: St, clock: ManualClock) {
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
    ] {
        let escalation = Escalation::new(Duration::from_secs(10))
            .at_most(Duration::from_secs(40))
            .forget_after(Duration::from_secs(86_400));
        let (app, _) = layer(one.clone(), algorithm, escalation, &clock, false);
        let (other, _) = layer(two.clone(), algorithm, escalation, &clock, false);
        for (level, seconds) in [(1, 10), (2, 20), (3, 40), (4, 40)] {
            spend(&app, "k").await;
            let block = u128::from(seconds) * 1000;
            assert_eq!(
                ask(&app, "k").await,
                Some(block),
                "{algorithm}: level {level}"
            );
            clock.advance(Duration::from_secs(seconds / 2));
            assert_eq!(
                ask(&other, "k").await,
                Some(block / 2),
                "{algorithm}: seen by the other"
            );
            clock.advance(Duration::from_secs(seconds / 2) - Duration::from_millis(1));
            assert_eq!(
                ask(&other, "k").await,
                Some(1),
                "{algorithm}: to the block's end"
            );
            clock.advance(Duration::from_millis(1));
        }
        // Other keys are not touched.
        assert_eq!(ask(&app, "other").await, None);
        clock.advance(Duration::from_secs(86_400));
        spend(&app, "k").await;
        assert_eq!(ask(&app, "k").await, Some(10_000), "{algorithm}: forgotten");
        clock.advance(Duration::from_secs(10));
        clock.advance(Duration::from_secs(86_400));
    }
}

/// Blocked at the third denial within 10 s, not at three spread wider; `reset` lifts a
/// block and forgets its level; the deny cache answers to the block's end.
async fn counted_denials<St: Store>(store: St, clock: ManualClock) {
    let escalation = Escalation::new(Duration::from_secs(30)).after(3, Duration::from_secs(10));
    let (app, limiter) = layer(store.clone(), Algorithm::Gcra, escalation, &clock, false);
    spend(&app, "c").await;
    let first = ask(&app, "c").await.expect("denied");
    assert!(first <= 500, "a plain denial: {first} ms");
    assert!(
        ask(&app, "c").await.unwrap() <= 500,
        "the second: no block yet"
    );
    clock.advance(Duration::from_secs(11));
    // The span is over: counted from one again.
    spend(&app, "c").await;
    assert!(ask(&app, "c").await.unwrap() <= 500);
    assert!(ask(&app, "c").await.unwrap() <= 500);
    assert_eq!(ask(&app, "c").await, Some(30_000), "the third within 10 s");
    limiter.control().reset(&Key::from("c")).await.unwrap();
    spend(&app, "c").await;
    // The level was forgotten with the rest: the same first block again.
    for _ in 0..2 {
        assert!(ask(&app, "c").await.unwrap() <= 500);
    }
    assert_eq!(ask(&app, "c").await, Some(30_000), "the first level again");
    // With a deny cache, the block is remembered to its end.
    let escalation = Escalation::new(Duration::from_secs(20));
    let (cached, _) = layer(store, Algorithm::Gcra, escalation, &clock, true);
    spend(&cached, "d").await;
    assert_eq!(ask(&cached, "d").await, Some(20_000));
    clock.advance(Duration::from_secs(5));
    assert_eq!(ask(&cached, "d").await, Some(15_000), "from the deny cache");
    clock.advance(Duration::from_secs(15));
    assert_eq!(ask(&cached, "d").await, None, "the block is over");
}

/// The level stops at the first whose block is the longest (10 s doubling to 40 s: 3), and a
/// factor of 1 keeps every block at level 1: the `level` a block is counted under is bounded
/// however long a key keeps being blocked.
async fn capped_levels<St: Store>(store: St, clock: ManualClock) {
    let recorder = support::trace::Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    for (factor, expect) in [(2, ["1", "2", "3", "3", "3", "3"]), (1, ["1"; 6])] {
        let escalation = Escalation::new(Duration::from_secs(10))
            .at_most(Duration::from_secs(40))
            .factor(factor);
        let (app, _) = layer(store.clone(), Algorithm::Gcra, escalation, &clock, false);
        let key = format!("capped-{factor}");
        for _ in 0..expect.len() {
            spend(&app, &key).await;
            let block = ask(&app, &key).await.expect("blocked");
            assert!(block <= 40_000, "{block}");
            clock.advance(Duration::from_secs(41));
        }
        let blocks = recorder.events("rate-limit key blocked on violation");
        let levels: Vec<&str> = blocks.iter().map(|e| e["level"].as_str()).collect();
        assert_eq!(levels, expect, "factor {factor}");
        recorder.clear();
    }
}

/// A policy that blocks on violation beside another of the key, decided together (on the
/// memory store, with the words of both claimed under the shared lock): its third request
/// in the second is blocked for 10 s, the other policy is not charged by the denials, and a
/// second key is not touched.
async fn beside_another<St: Store>(one: St, two: St, clock: ManualClock) {
    let build = |store: St| {
        RateLimitLayer::builder()
            .policy(Policy::gcra("2/s").name("strikes").block_on_violation(
                Escalation::new(Duration::from_secs(10)).after(2, Duration::from_secs(5)),
            ))
            .policy(Policy::fixed_window("100/min").name("beside"))
            .key(HeaderKey::try_new("x-key").unwrap())
            .clock(clock.clone())
            .store(store)
            .build()
            .unwrap()
    };
    let layer = build(one);
    let (a, b) = (
        app(&layer, &Seen::default()),
        app(&build(two), &Seen::default()),
    );
    spend(&a, "t").await;
    assert!(ask(&b, "t").await.unwrap() <= 500, "the first denial");
    assert_eq!(ask(&a, "t").await, Some(10_000), "the second blocks");
    clock.advance(Duration::from_secs(4));
    assert_eq!(
        ask(&b, "t").await,
        Some(6_000),
        "the other instance sees the block"
    );
    clock.advance(Duration::from_secs(6));
    assert_eq!(ask(&a, "t").await, None, "the block is over");
    let look = layer.check(&Key::from("t"), 0).await.unwrap();
    let beside = &look.outcomes()[1];
    assert_eq!(
        (beside.policy(), beside.remaining()),
        ("beside", 97),
        "charged thrice"
    );
    assert_eq!(ask(&a, "u").await, None, "another key");
}

#[tokio::test]
async fn blocks_beside_another_policy() {
    let clock = ManualClock::new();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    beside_another(memory.clone(), memory, clock.clone()).await;
    let server = RedisServer::start();
    let store = || server.store("beside:", &clock);
    beside_another(store().await, store().await, clock.clone()).await;
    support::assert_no_key_without_ttl(&server, "beside:");
    let cluster = RedisCluster::start();
    let store = || cluster.store("beside:", &clock);
    beside_another(store().await, store().await, clock.clone()).await;
}

#[tokio::test]
async fn blocks_in_memory() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    levels(store.clone(), store.clone(), clock.clone()).await;
    counted_denials(store.clone(), clock.clone()).await;
    capped_levels(store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = || server.store("blocks:", &clock);
    levels(store().await, store().await, clock.clone()).await;
    counted_denials(store().await, clock.clone()).await;
    capped_levels(store().await, clock.clone()).await;
    support::assert_no_key_without_ttl(&server, "blocks:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_on_the_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let one = cluster.store("blocks:", &clock).await;
    let two = cluster.store("blocks:", &clock).await;
    levels(one.clone(), two, clock.clone()).await;
    counted_denials(one.clone(), clock.clone()).await;
    capped_levels(one, clock).await;
}

#[test]
fn mistakes_are_errors() {
    let e = || Escalation::new(Duration::from_secs(10));
    for (policy, says) in [
        (
            Policy::gcra("10/s").block_on_violation(e().factor(0)),
            "factor",
        ),
        (
            Policy::gcra("10/s").block_on_violation(e().after(0, Duration::from_secs(1))),
            "at least 1 denial",
        ),
        (
            Policy::gcra("10/s").block_on_violation(e().at_most(Duration::from_secs(1))),
            "shorter than the first",
        ),
        (
            Policy::gcra("10/s").block_on_violation(Escalation::new(Duration::ZERO)),
            "from 1 ms",
        ),
        (
            Policy::gcra("10/s").shadow().block_on_violation(e()),
            "enforced",
        ),
        (
            Policy::gcra("10/s").lease(2).block_on_violation(e()),
            "leases",
        ),
    ] {
        let error = support::build_error(policy);
        assert!(error.contains(says), "{error}");
    }
}

#[cfg(feature = "toml")]
#[test]
fn blocks_from_the_configuration_file() {
    use tower_ratelimit::config::Limits;
    let file =
        "[[policy]]\nquota = \"2/s\"\nblock_for = \"10s\"\nblock_after = 3\nblock_max = \"1h\"\n";
    assert_eq!(
        Limits::from_toml(file).unwrap().policies().unwrap().len(),
        1
    );
    let error = Limits::from_toml("[[policy]]\nquota = \"2/s\"\nblock_after = 3\n").unwrap_err();
    assert!(error.to_string().contains("need block_for"), "{error}");
    let error =
        Limits::from_toml("[[policy]]\nquota = \"2/s\"\nblock_for = \"10s\"\nblock_factor = 99\n")
            .unwrap_err();
    assert!(error.to_string().contains("factor"), "{error}");
}

/// An administrator's block of a key is no violation of its own: it starts no escalation.
async fn no_strike_under_an_administrators_block<St: Store>(store: St, clock: ManualClock) {
    let escalation = Escalation::new(Duration::from_secs(100));
    let (app, limiter) = layer(store, Algorithm::Gcra, escalation, &clock, false);
    limiter
        .control()
        .block_for(&Key::from("e"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ask(&app, "e").await, Some(5_000), "the block alone");
    clock.advance(Duration::from_secs(5));
    assert_eq!(ask(&app, "e").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrators_block_is_no_strike() {
    let clock = ManualClock::new();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    no_strike_under_an_administrators_block(memory, clock.clone()).await;
    let server = RedisServer::start();
    let redis = server.store("admin-block:", &clock).await;
    no_strike_under_an_administrators_block(redis, clock).await;
}
