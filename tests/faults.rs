//! A bad network between the store and Redis: a proxy the test drives (`support::proxy`) adds
//! latency and jitter, caps the bandwidth, holds connections in a blackhole, resets one after
//! some bytes of a reply, or cuts a command in its middle, on plain TCP and with TLS passing
//! through. Each fault is answered within the deadline by the failure policy; decisions are
//! exact again once it clears; no command is sent twice for one decision (counted by Redis);
//! two instances never admit past the limit while replies are lost; the breaker opens and
//! closes; and what a lost reply costs is measured: its charge stays, a lease's units until the
//! policy refills, a concurrency slot until its lease ends. Each test runs on one server (plain
//! TCP and TLS) and on a cluster (plain TCP and TLS), each behind the proxies
//! (`support::proxy::Behind`); connections that go silent also with pools and through Sentinel.

mod support;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use support::eventually;
use support::proxy::{Behind, Faults};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::{
    CircuitBreaker, FailurePolicy, ManualClock, Policy, RateLimitLayer, RedisStore,
    body::ResponseBody,
};

/// The deadline of one decision.
const DEADLINE: Duration = Duration::from_millis(300);

/// What a request may take beyond the deadline on a loaded 2-core machine in a debug build.
const MARGIN: Duration = Duration::from_secs(1);

/// The limit of the policy, per hour: nothing refills during a test.
const LIMIT: u32 = 10;

type App = BoxCloneSyncService<Request<()>, Response<ResponseBody<Empty<Bytes>>>, Infallible>;

/// Runs each named `async fn(Behind)` as four tests: on one server on plain TCP and through
/// TLS, and on a cluster on plain TCP and through TLS.
macro_rules! behind_each {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            use super::support::proxy::Behind;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn plain_tcp() {
                super::$test(Behind::plain()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tls() {
                super::$test(Behind::tls()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cluster() {
                super::$test(Behind::cluster()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tls_cluster() {
                super::$test(Behind::tls_cluster()).await;
            }
        }
    )*};
}

behind_each!(
    each_fault_is_answered_within_the_deadline,
    a_lost_reply_was_decided_once_and_its_charge_stays,
    two_instances_never_admit_past_the_limit_while_replies_are_lost,
    the_breaker_opens_under_a_blackhole_and_closes_after_it,
    a_concurrency_slot_whose_reply_is_lost_comes_back_when_its_lease_ends,
    a_lease_whose_reply_is_lost_is_spent_until_the_policy_refills,
    a_silent_connection_is_replaced_within_three_seconds,
);

/// The same with a pool of connections, on one server and on a cluster.
mod pooled {
    use super::support::proxy::Behind;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_pooled_connection_is_replaced_within_three_seconds() {
        super::replaced(&Behind::plain(), Some(4)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_pooled_cluster_connection_is_replaced_within_three_seconds() {
        super::replaced(&Behind::cluster(), Some(2)).await;
    }
}

/// The same through Sentinel: the primary's connection, found through the sentinels, is
/// replaced by asking them again.
mod sentinel {
    use super::support::proxy::Behind;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_primary_connection_is_replaced_within_three_seconds() {
        super::replaced(&Behind::sentinel(), None).await;
    }
}

/// A store through the proxies, deciding on `clock` if given, with a pool of `pool`
/// connections if given.
async fn store(behind: &Behind, clock: Option<&ManualClock>, pool: Option<usize>) -> RedisStore {
    let mut builder = (behind.store())
        .deadline(DEADLINE)
        .response_timeout(Duration::from_secs(30));
    if let Some(clock) = clock {
        builder = builder.clock(clock.clone());
    }
    if let Some(size) = pool {
        builder = builder.pool(size);
    }
    builder.build().await.expect("connect through the proxies")
}

/// `LIMIT` per hour per `x-key`, GCRA, answered by `failure` when the store fails, without a
/// circuit breaker unless `breaker`.
fn layer(store: RedisStore, breaker: Option<CircuitBreaker>) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder()
        .policy(Policy::gcra(format!("{LIMIT}/h").as_str()).name("api"))
        .key(HeaderKey::try_new("x-key").unwrap())
        .on_store_error(FailurePolicy::Closed)
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

/// A reset after 3 bytes of the next reply.
fn lose_a_reply() -> Faults {
    Faults {
        reset_reply_after: Some(3),
        ..Faults::default()
    }
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

/// Each fault on every proxy in turn: each of 12 requests sent together is answered within the
/// deadline, by Redis or by the failure policy (`503`, closed), at least one by the failure
/// policy; once the fault clears, a fresh key is decided exactly: `LIMIT` admitted, then `429`.
async fn each_fault_is_answered_within_the_deadline(behind: Behind) {
    let layer = layer(store(&behind, None, None).await, None);
    let app = app(&layer);
    for (round, (what, fault)) in faults().into_iter().enumerate() {
        behind.set(fault);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..12 {
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
        behind.clear();
        // Exact again (a connection the fault broke is dialled again by itself), once a look
        // at cost 0 gets through: the key's node is through with what the fault held.
        let key = format!("exact-{round}");
        let cleared = Instant::now();
        eventually(&format!("{what}: decisions come back"), async || {
            layer.control().peek(&Key::from(key.as_str())).await.is_ok()
        })
        .await;
        eprintln!(
            "{what}: {failed} of 12 answered by the failure policy, the slowest in \
             {slowest:?}; decisions again {:?} after it cleared",
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

/// A decision whose reply is lost was made: Redis ran it once (no retry sends it again), it
/// charged the key, and the request got the failure policy's answer. A command cut before
/// Redis read it whole was never run. On the multiplexed connection, and with a pool.
async fn a_lost_reply_was_decided_once_and_its_charge_stays(behind: Behind) {
    for pool in [None, Some(4)] {
        let store = store(&behind, None, pool).await;
        let key = Key::from(format!("lost-{pool:?}").as_str());
        let (server, proxy) = behind.holder(&store.key_for("api", &key));
        let layer = layer(store, None);
        assert!(layer.check(&key, 1).await.unwrap().is_allowed());
        let before = server.calls("fcall");
        let fired = proxy.fired();
        proxy.set(lose_a_reply());
        assert!(layer.check(&key, 1).await.is_err(), "the reply was lost");
        assert_eq!(proxy.fired().0, fired.0 + 1);
        assert_eq!(
            server.calls("fcall") - before,
            1,
            "run once, never sent again"
        );
        // The connection the reset closed made again before the cut is armed: the cut then
        // falls on the decision's command, not on the reconnection's own (a TLS handshake, a
        // cluster's topology query), which raced it before and let the decision through.
        eventually("decisions come back after the reset", async || {
            layer.control().peek(&key).await.is_ok()
        })
        .await;
        // The peek that found the connection back ran once.
        let peeked = server.calls("fcall") - before - 1;
        proxy.set(Faults {
            close_mid_command: true,
            ..Faults::default()
        });
        assert!(layer.check(&key, 1).await.is_err(), "the command was cut");
        assert_eq!(proxy.fired().1, fired.1 + 1);
        proxy.clear();
        eventually("decisions come back", async || {
            layer.control().peek(&key).await.is_ok()
        })
        .await;
        // Two run since `before`, beside the peek: the one whose reply was lost, and the
        // peek after the cut; not the one cut short.
        assert_eq!(
            server.calls("fcall") - before - peeked,
            2,
            "the cut command never ran"
        );
        let seen = layer.control().peek(&key).await.unwrap();
        assert_eq!(
            seen.tightest().remaining(),
            u64::from(LIMIT) - 2,
            "{seen:?}"
        );
    }
}

/// Two instances on one Redis, while replies are lost on one or the other: a lost reply is
/// answered by the failure policy (closed), and together they never admit past the limit.
async fn two_instances_never_admit_past_the_limit_while_replies_are_lost(behind: Behind) {
    let mut apps = Vec::new();
    for _ in 0..2 {
        apps.push(app(&layer(store(&behind, None, None).await, None)));
    }
    let (mut admitted, mut lost) = (0, 0);
    for i in 0..60 {
        if i % 3 == 0 {
            behind.set(Faults {
                reset_reply_after: Some(5),
                ..Faults::default()
            });
        }
        let (status, _, _) = send(&apps[i % 2], "shared").await;
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::SERVICE_UNAVAILABLE => lost += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("{other}"),
        }
        behind.clear();
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
async fn the_breaker_opens_under_a_blackhole_and_closes_after_it(behind: Behind) {
    let breaker = CircuitBreaker::new(3, Duration::from_millis(500));
    let app = app(&layer(store(&behind, None, None).await, Some(breaker)));
    assert!(send(&app, "b").await.1);
    behind.set(Faults {
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
    behind.clear();
    eventually("the breaker closes", async || send(&app, "b").await.1).await;
}

/// A layer of `policy` per `x-key` on the proxies' store deciding on `clock` (set to a
/// fixed time), answering `503` when the store fails, without a breaker.
async fn clocked(
    behind: &Behind,
    policy: Policy,
    clock: &ManualClock,
) -> RateLimitLayer<RedisStore> {
    clock.set_micros(1_700_000_000_000_000);
    RateLimitLayer::builder()
        .policy(policy)
        .key(HeaderKey::try_new("x-key").unwrap())
        .on_store_error(FailurePolicy::Closed)
        .circuit_breaker(None)
        .clock(clock.clone())
        .store(store(behind, Some(clock), None).await)
        .build()
        .unwrap()
}

/// A concurrency limit's slot whose reply is lost was taken in Redis, and nobody gives it
/// back: it comes back when its lease ends (`max_duration`).
async fn a_concurrency_slot_whose_reply_is_lost_comes_back_when_its_lease_ends(behind: Behind) {
    let clock = ManualClock::new();
    let policy = Policy::concurrency(1)
        .max_duration(Duration::from_secs(30))
        .name("busy");
    let layer = clocked(&behind, policy, &clock).await;
    let app = app(&layer);
    behind.set(lose_a_reply());
    assert_eq!(send(&app, "c").await.0, StatusCode::SERVICE_UNAVAILABLE);
    behind.clear();
    // The slot is taken: the next request is turned away, and so until the lease ends.
    let busy = async || send(&app, "c").await.0;
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
async fn a_lease_whose_reply_is_lost_is_spent_until_the_policy_refills(behind: Behind) {
    let clock = ManualClock::new();
    let policy = Policy::gcra(format!("{LIMIT}/h").as_str())
        .lease(5)
        .name("leased");
    let layer = clocked(&behind, policy, &clock).await;
    let (app, key) = (app(&layer), Key::from("l"));
    // The key's first request is decided as usual; the next asks for a lease (of 2: leases
    // grow from there).
    assert_eq!(send(&app, "l").await.0, StatusCode::OK);
    behind.set(lose_a_reply());
    let (status, _, _) = send(&app, "l").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the lease's reply was lost"
    );
    behind.clear();
    eventually("decisions come back", async || {
        layer.control().peek(&key).await.is_ok()
    })
    .await;
    let left = layer
        .control()
        .peek(&key)
        .await
        .unwrap()
        .tightest()
        .remaining();
    assert_eq!(
        left,
        u64::from(LIMIT) - 1 - 2,
        "the lost lease's 2 units are spent"
    );
    clock.advance(Duration::from_secs(36 * 60));
    let left = layer
        .control()
        .peek(&key)
        .await
        .unwrap()
        .tightest()
        .remaining();
    assert_eq!(left, u64::from(LIMIT), "refilled in 36 minutes");
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
    let layer = layer(store.clone(), None);
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
    let seen = layer.control().peek(&key).await.unwrap();
    assert_eq!(
        seen.tightest().remaining(),
        u64::from(LIMIT) - 1,
        "{seen:?}"
    );
}

/// Connections that go silent (the proxies stop forwarding what they hold, without closing it,
/// as a NAT or a load balancer that forgot the flow, while new connections pass) are checked
/// after a missed deadline and replaced: decisions reach Redis again within 3 s, each request
/// meanwhile answered within the deadline.
async fn a_silent_connection_is_replaced_within_three_seconds(behind: Behind) {
    replaced(&behind, None).await;
}

async fn replaced(behind: &Behind, pool: Option<usize>) {
    let layer = layer(store(behind, None, pool).await, None);
    let app = app(&layer);
    for i in 0..4 {
        let (_, decided, _) = send(&app, &format!("warm-{i}")).await;
        assert!(decided, "Redis decides before the freeze");
    }
    let freeze = Faults {
        freeze_held: true,
        ..Faults::default()
    };
    for proxy in &behind.proxies {
        proxy.set(freeze.clone());
    }
    let frozen = Instant::now();
    let mut failed = 0;
    for i in 0.. {
        let (status, decided, took) = send(&app, &format!("k{i}")).await;
        if decided {
            assert_eq!(status, StatusCode::OK);
            break;
        }
        failed += 1;
        assert!(
            took < DEADLINE + MARGIN,
            "answered within the deadline: {took:?}"
        );
        assert!(
            frozen.elapsed() < Duration::from_secs(30),
            "decisions never reached Redis again"
        );
    }
    let back = frozen.elapsed();
    eprintln!("frozen connections: decisions again after {back:?} ({failed} failed meanwhile)");
    assert!(failed > 0, "the freeze was met");
    assert!(back < Duration::from_secs(3), "back within 3 s: {back:?}");
    for proxy in &behind.proxies {
        proxy.clear();
    }
}
