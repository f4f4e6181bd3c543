//! Capacity kept for priority (`Policy::reserve`): on one policy's state, requests of a lower
//! priority may use only a share of the capacity. Exact on both stores, across two instances
//! sharing one Redis and on the cluster; decided alike by both stores (random sequences of
//! priorities, costs and times); reported as the limit the request saw; refused by `build()`
//! where it has no meaning.

mod support;

use std::time::Duration;

use http::{Request, StatusCode};
use support::http::{Seen, inner, send};
use support::{RedisCluster, RedisServer, Rng};
use tower::Layer;
use tower::util::BoxCloneSyncService;
use tower_ratelimit::key::HeaderKey;
use tower_ratelimit::{
    Algorithm, Decision, ManualClock, MemoryStore, Policy, Quota, RateLimitLayer, Store,
    policy::Reserve,
};

/// `critical` may use all the capacity, `batch` half of it, the others 80%.
fn reserve() -> Reserve {
    Reserve::header("x-priority")
        .share("critical", 100)
        .share("batch", 50)
        .others(80)
}

/// `policy` keeping capacity for priority per `x-key`, each request costing its `x-cost`
/// (1 without one), on `store`.
fn layer<St: Store>(policy: Policy, store: St) -> RateLimitLayer<St> {
    let cost = |req: &tower_ratelimit::key::RequestRef<'_>| {
        let cost = req.headers().get("x-cost").and_then(|v| v.to_str().ok());
        cost.map_or(1, |c| c.parse().unwrap())
    };
    RateLimitLayer::builder()
        .policy(policy.reserve(reserve()).cost(cost))
        .key(HeaderKey::try_new("x-key").unwrap())
        .store(store)
        .build()
        .unwrap()
}

type App = BoxCloneSyncService<
    Request<()>,
    http::Response<tower_ratelimit::body::ResponseBody<http_body_util::Full<bytes::Bytes>>>,
    std::convert::Infallible,
>;

/// The layer around an inner service that records the decisions it sees.
fn app<St: Store>(layer: &RateLimitLayer<St>) -> (App, Seen) {
    let seen = Seen::default();
    (BoxCloneSyncService::new(layer.layer(inner(&seen))), seen)
}

/// One request of `priority` (none when empty) for `key` costing `cost`: its status and its
/// decision (the inner service's, or the one a `429` carries).
async fn ask(app: &(App, Seen), key: &str, priority: &str, cost: u32) -> (StatusCode, Decision) {
    let mut request = Request::builder()
        .header("x-key", key)
        .header("x-cost", cost.to_string());
    if !priority.is_empty() {
        request = request.header("x-priority", priority);
    }
    let reply = send(&app.0, request.body(()).unwrap()).await;
    let decision = match reply.status {
        StatusCode::OK => app.1.last_decision(),
        _ => reply
            .decision
            .expect("a limited response carries its decision"),
    };
    (reply.status, decision)
}

/// On `store`, for every algorithm at 10 per hour: the others are admitted up to 8 and told
/// a limit of 8; `batch`, at 5 of 10 used or more, gets nothing; `critical` the last 2.
async fn the_reserve_is_kept_for_critical<St: Store>(store: impl Fn(&str) -> St) {
    for algorithm in Algorithm::ALL {
        let quota = Quota::new(10, Duration::from_secs(3600)).unwrap();
        let name = format!("kept-{}", algorithm.name());
        let app = app(&layer(
            Policy::new(algorithm, quota).name(&name),
            store(&name),
        ));
        for n in 0..8 {
            let (status, d) = ask(&app, "k", "", 1).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{algorithm}: the others' request {n}"
            );
            let o = &d.outcomes()[0];
            assert_eq!((o.limit(), o.remaining()), (8, 7 - n), "{algorithm}");
        }
        let (status, d) = ask(&app, "k", "normal", 1).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}: 8 of 8");
        assert_eq!(d.outcomes()[0].limit(), 8);
        assert!(d.outcomes()[0].retry_after().is_some(), "{algorithm}");
        let (status, d) = ask(&app, "k", "batch", 1).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}: batch");
        assert_eq!(d.outcomes()[0].limit(), 5);
        for n in 0..2 {
            let (status, d) = ask(&app, "k", "critical", 1).await;
            assert_eq!(status, StatusCode::OK, "{algorithm}: critical {n}");
            let o = &d.outcomes()[0];
            assert_eq!((o.limit(), o.remaining()), (10, 1 - n), "{algorithm}");
        }
        let (status, _) = ask(&app, "k", "critical", 1).await;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm}: 10 of 10"
        );
    }
}

#[tokio::test]
async fn the_memory_store_keeps_the_reserve() {
    let clock = ManualClock::new();
    the_reserve_is_kept_for_critical(|_| MemoryStore::with_clock(clock.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_reserve() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = server.store("reserve:", &clock).await;
    the_reserve_is_kept_for_critical(|_| store.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_keeps_the_reserve() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let store = cluster.store("reserve:", &clock).await;
    the_reserve_is_kept_for_critical(|_| store.clone()).await;
}

/// Two instances on one Redis, 40 requests of the others sent at once on each, then
/// critical ones: together they admit exactly 80% of the capacity to the others, and the
/// rest to critical requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_keep_the_reserve_exactly() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let mut apps = Vec::new();
    for _ in 0..2 {
        let store = server.store("two:", &clock).await;
        apps.push(app(&layer(Policy::gcra("50/h").name("two"), store)));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..80 {
        let app = apps[i % 2].clone();
        tasks.spawn(async move { ask(&app, "shared", "", 1).await.0 });
    }
    let statuses = tasks.join_all().await;
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(admitted, 40, "80% of 50 to the others");
    let mut critical = 0;
    for i in 0..20 {
        if ask(&apps[i % 2], "shared", "critical", 1).await.0 == StatusCode::OK {
            critical += 1;
        }
    }
    assert_eq!(critical, 10, "the reserve, to critical requests");
}

/// A random policy of `algorithm` (limits of 5 to 40, windows of 1 to 5 ms, a burst now and
/// then).
fn random_policy(rng: &mut Rng, algorithm: Algorithm, name: String) -> Policy {
    let limit = rng.range(5, 40) as u32;
    let (window, buckets) = match algorithm {
        Algorithm::SlidingWindow => {
            let buckets = rng.range(1, 6);
            (rng.range(1, 400) * buckets * 7, Some(buckets as u32))
        }
        _ => (rng.range(1_000, 5_000), None),
    };
    let quota = Quota::new(limit, Duration::from_micros(window)).unwrap();
    let mut policy = Policy::new(algorithm, quota).name(name);
    if algorithm.has_burst() && rng.range(0, 1) == 1 {
        policy = policy.burst(rng.range(5, 40) as u32);
    }
    if let Some(b) = buckets {
        policy = policy.buckets(b);
    }
    policy
}

/// What a decision says, to compare the stores': verdict, limit, remaining, reset and retry.
fn summary(d: &Decision) -> Vec<(bool, u64, u64, Duration, Option<Duration>)> {
    (d.outcomes().iter())
        .map(|o| {
            let (limit, remaining) = (o.limit(), o.remaining());
            (
                o.is_allowed(),
                limit,
                remaining,
                o.reset_after(),
                o.retry_after(),
            )
        })
        .collect()
}

/// Random sequences of requests of random priorities and costs at random times, for every
/// algorithm, through a layer on each store: the same decisions, limits seen included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_are_decided_alike_in_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store("diff-reserve:", &clock).await;
    let (mut decisions, mut kept) = (0, 0);
    for algorithm in Algorithm::ALL {
        for seq in 0..30 {
            let seed = 11 << 40 | (algorithm as u64) << 32 | seq;
            let mut rng = Rng::new(seed);
            let policy =
                random_policy(&mut rng, algorithm, format!("r-{}-{seq}", algorithm.name()));
            let memory = MemoryStore::with_clock(clock.clone());
            let on_memory = app(&layer(policy.clone(), memory));
            let on_redis = app(&layer(policy, redis.clone()));
            for step in 0..40 {
                clock.advance_micros(match rng.range(0, 3) {
                    0 => 0,
                    1 => rng.range(1, 100),
                    _ => rng.range(1, 1_500),
                });
                let priority = ["", "batch", "critical", "other"][rng.range(0, 3) as usize];
                let cost = match rng.range(0, 7) {
                    0 => rng.range(2, 6) as u32,
                    _ => 1,
                };
                let (ms, m) = ask(&on_memory, "k", priority, cost).await;
                let (rs, r) = ask(&on_redis, "k", priority, cost).await;
                let what = format!("{algorithm} seed {seed} step {step} {priority:?} cost {cost}");
                assert_eq!(
                    (ms, summary(&m)),
                    (rs, summary(&r)),
                    "{what}: memory vs redis"
                );
                if ms == StatusCode::TOO_MANY_REQUESTS && priority != "critical" {
                    kept += 1;
                }
                decisions += 1;
            }
        }
    }
    assert_eq!(decisions, 6 * 30 * 40);
    assert!(kept > 300, "the sequences reach the shares: {kept} refused");
}

/// With the deny cache on, a denial of the others is not remembered against a critical
/// request, which may use more.
#[tokio::test]
async fn the_deny_cache_does_not_deny_critical_requests_for_the_others() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("10/h").name("cached").reserve(reserve()))
        .key(HeaderKey::try_new("x-key").unwrap())
        .deny_cache(100)
        .clock(clock.clone())
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let app = app(&layer);
    for _ in 0..8 {
        assert_eq!(ask(&app, "k", "", 1).await.0, StatusCode::OK);
    }
    for _ in 0..3 {
        assert_eq!(ask(&app, "k", "", 1).await.0, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(ask(&app, "k", "critical", 1).await.0, StatusCode::OK);
}

#[test]
fn build_says_where_a_reserve_has_no_meaning() {
    let cases = [
        (Policy::concurrency(10).reserve(reserve()), "enforced"),
        (Policy::gcra("10/s").lease(2).reserve(reserve()), "enforced"),
        (Policy::gcra("10/s").shadow().reserve(reserve()), "enforced"),
        (
            Policy::gcra("10/s")
                .wait_up_to(Duration::from_secs(1))
                .reserve(reserve()),
            "enforced",
        ),
        (
            Policy::gcra("10/s").reserve(Reserve::header("x").share("a", 0)),
            "1 to 100",
        ),
        (
            Policy::gcra("10/s").reserve(Reserve::header("x").others(101)),
            "1 to 100",
        ),
        (
            Policy::gcra("10/s").reserve(Reserve::header("x").share("a", 100)),
            "nothing is kept",
        ),
        (
            Policy::gcra("10/s").reserve(Reserve::header("x").share("a", 50).share("a", 60)),
            "two shares",
        ),
        (
            Policy::gcra("10/s").reserve(Reserve::header("bad header").others(50)),
            "not a header name",
        ),
        (
            Policy::gcra("1/s").reserve(Reserve::header("x").others(50)),
            "is not one unit",
        ),
    ];
    for (policy, expected) in cases {
        let err = support::build_error(policy);
        assert!(err.contains(expected), "{expected:?} in {err}");
    }
}

#[cfg(feature = "toml")]
#[tokio::test]
async fn a_configuration_file_keeps_capacity_for_priority() {
    use tower_ratelimit::config::Limits;
    let limits = Limits::from_toml(
        r#"
        key = "header:x-key"

        [[policy]]
        name = "api"
        quota = "10/h"
        reserve_header = "x-priority"
        reserve_shares = { critical = 100 }
        reserve_others = 70
        "#,
    )
    .unwrap();
    let clock = ManualClock::new();
    let mut builder = RateLimitLayer::builder().store(MemoryStore::with_clock(clock));
    for policy in limits.policies().unwrap() {
        builder = builder.policy(policy);
    }
    let app = app(&builder.build().unwrap());
    let mut admitted = 0;
    while ask(&app, "k", "", 1).await.0 == StatusCode::OK {
        admitted += 1;
    }
    assert_eq!(admitted, 7);
    assert_eq!(ask(&app, "k", "critical", 1).await.0, StatusCode::OK);
    let err = Limits::from_toml(
        r#"
        [[policy]]
        quota = "10/h"
        reserve_others = 70
        "#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("reserve_header"), "{err}");
}
