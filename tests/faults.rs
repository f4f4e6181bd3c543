//! A bad network between the store and Redis: a proxy the test drives (`support::proxy`) adds
//! latency and jitter, caps the bandwidth, holds connections in a blackhole, resets one after
//! some bytes of a reply, or cuts a command in its middle, on plain TCP and with TLS passing
//! through. Each fault is answered within the deadline by the failure policy; decisions are
//! exact again once it clears; no command is sent twice for one decision (counted by Redis);
//! two instances never admit past the limit while replies are lost; and what a lost reply
//! costs is measured: its charge stays, a concurrency slot until its lease ends.

mod support;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use support::proxy::{FaultProxy, Faults};
use support::{RedisServer, eventually};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::{
    CircuitBreaker, FailurePolicy, ManualClock, Policy, RateLimitLayer, RedisStore, RedisTls,
    ResponseBody,
};

/// The deadline of one decision.
const DEADLINE: Duration = Duration::from_millis(300);

/// What a request may take beyond the deadline on a loaded 2-core machine in a debug build.
const MARGIN: Duration = Duration::from_secs(1);

/// The limit of the policy, per hour: nothing refills during a test.
const LIMIT: u32 = 10;

type App = BoxCloneSyncService<Request<()>, Response<ResponseBody<Empty<Bytes>>>, Infallible>;

/// A store through `proxy` (TLS with `tls`), deciding on `clock` if given.
async fn store(
    proxy: &FaultProxy,
    tls: Option<RedisTls>,
    clock: Option<&ManualClock>,
) -> RedisStore {
    let mut builder = RedisStore::builder(&proxy.url(tls.is_some()))
        .deadline(DEADLINE)
        .response_timeout(Duration::from_secs(30));
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    if let Some(clock) = clock {
        builder = builder.clock(clock.clone());
    }
    builder.build().await.expect("connect through the proxy")
}

/// `LIMIT` per hour per `x-key`, GCRA, answered by `failure` when the store fails, without a
/// circuit breaker unless `breaker`.
fn layer(
    store: RedisStore,
    failure: FailurePolicy,
    breaker: Option<CircuitBreaker>,
) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder()
        .policy(Policy::gcra(format!("{LIMIT}/h").as_str()).name("api"))
        .key(HeaderKey::try_new("x-key").unwrap())
        .on_store_error(failure)
        .circuit_breaker(breaker)
        .store(store)
        .build()
        .unwrap()
}

fn app(layer: &RateLimitLayer<RedisStore>) -> App {
    BoxCloneSyncService::new(layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    })))
}

/// One request for `key`: its status, whether Redis decided it (its headers say the limit),
/// and how long it took.
async fn send(app: &App, key: &str) -> (StatusCode, bool, Duration) {
    let request = Request::builder().header("x-key", key).body(()).unwrap();
    let started = Instant::now();
    let response = app.clone().oneshot(request).await.unwrap();
    let decided = response
        .headers()
        .get("x-ratelimit-limit")
        .is_some_and(|v| v == LIMIT.to_string().as_str());
    (response.status(), decided, started.elapsed())
}

/// The faults a request meets, each named.
fn faults() -> Vec<(&'static str, Faults)> {
    vec![
        (
            "latency and jitter past the deadline",
            Faults {
                latency: Duration::from_secs(2),
                jitter: Duration::from_millis(500),
                ..Faults::default()
            },
        ),
        (
            "a trickle of 20 bytes a second",
            Faults {
                bytes_per_second: Some(20),
                ..Faults::default()
            },
        ),
        (
            "a blackhole",
            Faults {
                blackhole: true,
                ..Faults::default()
            },
        ),
        (
            "a reset after 3 bytes of a reply",
            Faults {
                reset_reply_after: Some(3),
                ..Faults::default()
            },
        ),
        (
            "a command cut in its middle",
            Faults {
                close_mid_command: true,
                ..Faults::default()
            },
        ),
    ]
}

/// Each fault on every proxy in turn: each of `requests` requests sent together is answered
/// within the deadline, by Redis or by the failure policy (`503`, closed), at least one by
/// the failure policy; once the fault clears, a fresh key is decided exactly: `LIMIT`
/// admitted, then `429`. `label` begins each line printed.
async fn each_fault(
    layer: &RateLimitLayer<RedisStore>,
    proxies: &[FaultProxy],
    requests: usize,
    label: &str,
) {
    let app = app(layer);
    for (round, (what, fault)) in faults().into_iter().enumerate() {
        proxies.iter().for_each(|p| p.set(fault.clone()));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..requests {
            let app = app.clone();
            tasks.spawn(async move { send(&app, &format!("r{round}-{}", i % 6)).await });
        }
        let answers = tasks.join_all().await;
        let slowest = answers.iter().map(|a| a.2).max().unwrap();
        assert!(
            slowest < DEADLINE + MARGIN,
            "{what}: the slowest took {slowest:?}"
        );
        let failed = (answers.iter())
            .filter(|a| a.0 == StatusCode::SERVICE_UNAVAILABLE)
            .count();
        assert!(
            failed >= 1,
            "{what}: the failure policy answered none: {answers:?}"
        );
        assert!(
            answers
                .iter()
                .all(|a| a.0 == StatusCode::SERVICE_UNAVAILABLE || a.1),
            "{what}: every answer is Redis's or the failure policy's: {answers:?}"
        );
        proxies.iter().for_each(FaultProxy::clear);
        // Exact again (a connection the fault broke is dialled again by itself), once a look
        // at cost 0 gets through: the key's node is through with what the fault held.
        let key = format!("exact-{round}");
        let cleared = Instant::now();
        eventually(&format!("{what}: decisions come back"), async || {
            layer.peek(&Key::from(key.as_str())).await.is_ok()
        })
        .await;
        eprintln!(
            "{label}{what}: {failed} of {requests} answered by the failure policy, the slowest \
             in {slowest:?}; decisions again {:?} after it cleared",
            cleared.elapsed()
        );
        for n in 0..LIMIT {
            let (status, decided, _) = send(&app, &key).await;
            assert!(
                decided && status == StatusCode::OK,
                "{what}: request {n} of the limit"
            );
        }
        let (status, decided, _) = send(&app, &key).await;
        assert!(
            decided && status == StatusCode::TOO_MANY_REQUESTS,
            "{what}: past the limit"
        );
    }
}

/// [`each_fault`] through one proxy to `server`, 20 requests at once.
async fn each_fault_is_answered_within_the_deadline(tls: Option<RedisTls>, server: &RedisServer) {
    let proxy = FaultProxy::start(server.port);
    let layer = layer(store(&proxy, tls, None).await, FailurePolicy::Closed, None);
    each_fault(&layer, std::slice::from_ref(&proxy), 20, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_is_answered_within_the_deadline_on_plain_tcp() {
    let server = RedisServer::start();
    each_fault_is_answered_within_the_deadline(None, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_is_answered_within_the_deadline_through_tls() {
    let pki = support::tls::Pki::new();
    let server = pki.server("server", true, &[]);
    each_fault_is_answered_within_the_deadline(Some(pki.client_tls()), &server).await;
}

/// A decision whose reply is lost was made: Redis ran it once (no retry sends it again), it
/// charged the key, and the request got the failure policy's answer. A command cut before
/// Redis read it whole was never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_was_decided_once_and_its_charge_stays() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let layer = layer(store(&proxy, None, None).await, FailurePolicy::Closed, None);
    let key = Key::from("lost");
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    let before = server.calls("fcall");
    proxy.set(Faults {
        reset_reply_after: Some(3),
        ..Faults::default()
    });
    assert!(layer.check(&key, 1).await.is_err(), "the reply was lost");
    assert_eq!(proxy.fired().0, 1);
    assert_eq!(
        server.calls("fcall") - before,
        1,
        "run once, never sent again"
    );
    proxy.set(Faults {
        close_mid_command: true,
        ..Faults::default()
    });
    assert!(layer.check(&key, 1).await.is_err(), "the command was cut");
    assert_eq!(proxy.fired().1, 1);
    proxy.clear();
    eventually("decisions come back", async || {
        layer.peek(&key).await.is_ok()
    })
    .await;
    // Two charged: the first, and the one whose reply was lost; not the one cut short.
    assert_eq!(
        server.calls("fcall") - before,
        2,
        "the cut command never ran"
    );
    let seen = layer.peek(&key).await.unwrap();
    assert_eq!(seen.binding().remaining(), u64::from(LIMIT) - 2, "{seen:?}");
}

/// Two instances on one Redis, each through its own proxy, while replies are lost on one or
/// the other: a lost reply is answered by the failure policy (closed), and together they never
/// admit past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_admit_past_the_limit_while_replies_are_lost() {
    let server = RedisServer::start();
    let proxies = [
        FaultProxy::start(server.port),
        FaultProxy::start(server.port),
    ];
    let mut apps = Vec::new();
    for proxy in &proxies {
        apps.push(app(&layer(
            store(proxy, None, None).await,
            FailurePolicy::Closed,
            None,
        )));
    }
    let (mut admitted, mut lost) = (0, 0);
    for i in 0..60 {
        let which = i % 2;
        if i % 3 == 0 {
            proxies[which].set(Faults {
                reset_reply_after: Some(5),
                ..Faults::default()
            });
        }
        let (status, _, _) = send(&apps[which], "shared").await;
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::SERVICE_UNAVAILABLE => lost += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("{other}"),
        }
        proxies[which].clear();
    }
    assert!(lost > 0, "some replies were lost");
    assert!(
        admitted <= LIMIT,
        "{admitted} admitted, {lost} lost, past the limit of {LIMIT}"
    );
    eprintln!("two instances: {admitted} admitted, {lost} replies lost");
}

/// Under a blackhole, the circuit breaker opens after its failures: requests are then answered
/// at once, without waiting for the deadline; once the blackhole clears, its probe finds Redis
/// and decisions come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_under_a_blackhole_and_closes_after_it() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let breaker = CircuitBreaker::new(3, Duration::from_millis(500));
    let app = app(&layer(
        store(&proxy, None, None).await,
        FailurePolicy::Closed,
        Some(breaker),
    ));
    assert!(send(&app, "b").await.1);
    proxy.set(Faults {
        blackhole: true,
        ..Faults::default()
    });
    for _ in 0..3 {
        let (status, _, took) = send(&app, "b").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            took >= DEADLINE,
            "a failure waits for the deadline: {took:?}"
        );
    }
    // Open: answered without asking Redis.
    let (status, _, took) = send(&app, "b").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        took < DEADLINE,
        "the open breaker answers at once: {took:?}"
    );
    proxy.clear();
    eventually("the breaker closes", async || send(&app, "b").await.1).await;
}

/// A concurrency limit's slot whose reply is lost was taken in Redis, and nobody gives it
/// back: it comes back when its lease ends (`max_duration`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_slot_whose_reply_is_lost_comes_back_when_its_lease_ends() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let clock = ManualClock::new();
    clock.set_micros(1_700_000_000_000_000);
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::concurrency(1)
                .max_duration(Duration::from_secs(30))
                .name("busy"),
        )
        .key(HeaderKey::try_new("x-key").unwrap())
        .on_store_error(FailurePolicy::Closed)
        .circuit_breaker(None)
        .store(store(&proxy, None, Some(&clock)).await)
        .build()
        .unwrap();
    let app = app(&layer);
    proxy.set(Faults {
        reset_reply_after: Some(3),
        ..Faults::default()
    });
    assert_eq!(send(&app, "c").await.0, StatusCode::SERVICE_UNAVAILABLE);
    proxy.clear();
    // The slot is taken: the next request is turned away, and so until the lease ends.
    let busy = async || {
        let request = Request::builder().header("x-key", "c").body(()).unwrap();
        app.clone().oneshot(request).await.unwrap().status()
    };
    eventually("decisions come back", async || {
        busy().await != StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert_eq!(
        busy().await,
        StatusCode::TOO_MANY_REQUESTS,
        "the lost reply's slot is held"
    );
    clock.advance(Duration::from_secs(29));
    assert_eq!(
        busy().await,
        StatusCode::TOO_MANY_REQUESTS,
        "held until its lease ends"
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        busy().await,
        StatusCode::OK,
        "given back by the lease's end"
    );
}

/// A lease whose reply is lost was charged in Redis, and no instance holds it: its units are
/// spent, and come back as the policy refills (GCRA at 10/h: one every 6 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_reply_is_lost_is_spent_until_the_policy_refills() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let clock = ManualClock::new();
    clock.set_micros(1_700_000_000_000_000);
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::gcra(format!("{LIMIT}/h").as_str())
                .lease(5)
                .name("leased"),
        )
        .key(HeaderKey::try_new("x-key").unwrap())
        .on_store_error(FailurePolicy::Closed)
        .circuit_breaker(None)
        .clock(clock.clone())
        .store(store(&proxy, None, Some(&clock)).await)
        .build()
        .unwrap();
    let (app, key) = (app(&layer), Key::from("l"));
    // The key's first request is decided as usual; the next asks for a lease (of 2: leases
    // grow from there).
    assert_eq!(send(&app, "l").await.0, StatusCode::OK);
    proxy.set(Faults {
        reset_reply_after: Some(3),
        ..Faults::default()
    });
    let (status, _, _) = send(&app, "l").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the lease's reply was lost"
    );
    proxy.clear();
    eventually("decisions come back", async || {
        layer.peek(&key).await.is_ok()
    })
    .await;
    let left = layer.peek(&key).await.unwrap().binding().remaining();
    assert_eq!(
        left,
        u64::from(LIMIT) - 1 - 2,
        "the lost lease's 2 units are spent"
    );
    clock.advance(Duration::from_secs(36 * 60));
    let left = layer.peek(&key).await.unwrap().binding().remaining();
    assert_eq!(left, u64::from(LIMIT), "refilled in 36 minutes");
}

/// A store on a cluster reached through the proxies in front of its nodes, on its
/// multiplexed connection or with a pool of `pool` connections.
async fn cluster_store(proxies: &[FaultProxy], pool: Option<usize>) -> RedisStore {
    let mut builder = RedisStore::builder(&support::proxy::cluster_url(proxies))
        .deadline(DEADLINE)
        .response_timeout(Duration::from_secs(30));
    if let Some(size) = pool {
        builder = builder.pool(size);
    }
    builder
        .build()
        .await
        .expect("connect to the cluster through the proxies")
}

/// On the cluster, every fault on every node: each request is answered within the deadline
/// by the failure policy; once the fault clears, a fresh key is decided exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_cluster_each_fault_is_answered_within_the_deadline() {
    let (_cluster, proxies) = support::proxy::cluster_behind_proxies();
    let layer = layer(
        cluster_store(&proxies, None).await,
        FailurePolicy::Closed,
        None,
    );
    each_fault(&layer, &proxies, 12, "cluster, ").await;
}

/// On the cluster, a decision whose reply is lost ran once on its key's node, and its charge
/// stays: on the multiplexed connection, and with a pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_cluster_a_lost_reply_was_decided_once() {
    lost_on_the_cluster(None).await;
    lost_on_the_cluster(Some(4)).await;
}

async fn lost_on_the_cluster(pool: Option<usize>) {
    let (cluster, proxies) = support::proxy::cluster_behind_proxies();
    let store = cluster_store(&proxies, pool).await;
    let node = |key: &Key| {
        let redis_key = store.key_for("api", key);
        let node = cluster.node_for(&redis_key);
        let i = cluster
            .nodes
            .iter()
            .position(|n| n.port == node.port)
            .unwrap();
        (node, &proxies[i])
    };
    let layer = layer(store.clone(), FailurePolicy::Closed, None);
    let key = Key::from("lost");
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    let (server, proxy) = node(&key);
    let before = server.calls("fcall");
    proxy.set(Faults {
        reset_reply_after: Some(3),
        ..Faults::default()
    });
    // The cluster client sends nothing again: the decision ran once, and failed here.
    assert!(layer.check(&key, 1).await.is_err(), "the reply was lost");
    assert_eq!(server.calls("fcall") - before, 1, "never sent again");
    proxy.clear();
    eventually("decisions come back", async || {
        layer.peek(&key).await.is_ok()
    })
    .await;
    assert_eq!(
        server.calls("fcall") - before,
        2,
        "the lost one once, and the look"
    );
    let seen = layer.peek(&key).await.unwrap();
    assert_eq!(seen.binding().remaining(), u64::from(LIMIT) - 2, "{seen:?}");
}

/// A slot moved to another node while the store's map still names the old one: the old node
/// answers `MOVED` without running the decision, and the store sends it once to the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_cluster_a_moved_slot_is_followed_and_decided_once() {
    let cluster = support::RedisCluster::start();
    let store = RedisStore::builder(&cluster.url())
        .deadline(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let layer = layer(store.clone(), FailurePolicy::Closed, None);
    let key = Key::from("moving");
    let redis_key = store.key_for("api", &key);
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    let from = cluster.node_for(&redis_key);
    let to = cluster.nodes.iter().find(|n| n.port != from.port).unwrap();
    let slot = from.cli(&[
        "CLUSTER",
        "KEYSLOT",
        std::str::from_utf8(&redis_key).unwrap(),
    ]);
    // The key goes with its slot, then every node is told where the slot is now.
    from.cli(&["DEL", std::str::from_utf8(&redis_key).unwrap()]);
    let to_id = to.cli(&["CLUSTER", "MYID"]);
    for node in &cluster.nodes {
        assert_eq!(
            node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]),
            "OK"
        );
    }
    let (before_from, before_to) = (from.calls("fcall"), to.calls("fcall"));
    let moved = layer
        .check(&key, 1)
        .await
        .expect("the redirection followed");
    assert!(moved.is_allowed());
    assert_eq!(
        from.calls("fcall") - before_from,
        0,
        "the old node ran nothing"
    );
    assert_eq!(to.calls("fcall") - before_to, 1, "the new node ran it once");
    let seen = layer.peek(&key).await.unwrap();
    assert_eq!(seen.binding().remaining(), u64::from(LIMIT) - 1, "{seen:?}");
}
