//! What an instance keeps doing through an outage of Redis (really paused with `SIGSTOP`):
//! the denials it saw (a policy's, a block on violation, a key on the deny list) keep
//! answering until their ends, whatever the failure policy; a key it never saw denied gets the
//! failure policy's answer.

mod support;

use std::process::Command;
use std::time::Duration;

use http::{Request, StatusCode};
use support::RedisServer;
use support::http::{App, Reply, Seen, app, send};
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::lists::Lists;
use tower_ratelimit::{FailurePolicy, Policy, RateLimitLayer, RedisStore, policy::Escalation};

/// A layer of 2 an hour per `x-key` (blocking a key denied twice within a minute for ten
/// minutes), with lists kept in the store, failing `failure` after a 50 ms deadline.
async fn layer(server: &RedisServer, failure: FailurePolicy) -> RateLimitLayer<RedisStore> {
    let store = RedisStore::builder(&server.url())
        .deadline(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let escalation = Escalation::new(Duration::from_secs(600)).after(2, Duration::from_secs(60));
    RateLimitLayer::builder()
        .policy(
            Policy::gcra("2/h")
                .name("held")
                .block_on_violation(escalation),
        )
        .key(HeaderKey::try_new("x-key").unwrap())
        .lists(Lists::new())
        .on_store_error(failure)
        .circuit_breaker(None)
        .store(store)
        .build()
        .unwrap()
}

async fn ask(app: &App, key: &str) -> Reply {
    send(
        app,
        Request::builder().header("x-key", key).body(()).unwrap(),
    )
    .await
}

fn signal(server: &RedisServer, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &server.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal}");
}

/// Redis paused: what each instance saw denied stays denied on it, to its end; what it did not
/// see gets the failure policy; once Redis is back, Redis decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_seen_hold_while_redis_is_paused() {
    let server = RedisServer::start();
    for failure in [FailurePolicy::Open, FailurePolicy::Closed] {
        let (one, two) = (layer(&server, failure).await, layer(&server, failure).await);
        let (a, b) = (app(&one, &Seen::default()), app(&two, &Seen::default()));
        let prefix = format!("{failure:?}");
        let k = |name: &str| format!("{prefix}-{name}");
        // Denied by the policy, then blocked (seen by `a`); denied at runtime on `one`, and
        // its request seen refused by `b`.
        for _ in 0..2 {
            assert_eq!(ask(&a, &k("spent")).await.status, StatusCode::OK);
        }
        assert_eq!(
            ask(&a, &k("spent")).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        for _ in 0..4 {
            ask(&a, &k("blocked")).await;
        }
        let blocked = ask(&a, &k("blocked")).await;
        assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            blocked.retry_after() > 500,
            "a ten-minute block: {}",
            blocked.retry_after()
        );
        one.control()
            .deny_key(&Key::from(k("denied")), None)
            .await
            .unwrap();
        two.control()
            .deny_key(&Key::from(k("seen")), None)
            .await
            .unwrap();
        assert_eq!(ask(&a, &k("seen")).await.status, StatusCode::FORBIDDEN);

        signal(&server, "-STOP");
        let outage = async {
            // Held by `a` and `one`: the denial, the block, the entries.
            let spent = ask(&a, &k("spent")).await;
            assert_eq!(
                spent.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{failure:?}: spent"
            );
            assert!(spent.retry_after() > 0);
            let blocked = ask(&a, &k("blocked")).await;
            assert_eq!(
                blocked.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{failure:?}: blocked"
            );
            assert!(blocked.retry_after() > 500, "to the block's end");
            assert_eq!(
                ask(&a, &k("denied")).await.status,
                StatusCode::FORBIDDEN,
                "{failure:?}"
            );
            assert_eq!(
                ask(&a, &k("seen")).await.status,
                StatusCode::FORBIDDEN,
                "{failure:?}"
            );
            // Not seen: the failure policy answers.
            let unseen = match failure {
                FailurePolicy::Closed => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::OK,
            };
            assert_eq!(
                ask(&a, &k("fresh")).await.status,
                unseen,
                "{failure:?}: unseen"
            );
            assert_eq!(
                ask(&b, &k("spent")).await.status,
                unseen,
                "{failure:?}: b never saw it"
            );
        };
        let result = tokio::time::timeout(Duration::from_secs(20), outage).await;
        signal(&server, "-CONT");
        result.expect("answers within the deadline while Redis is paused");
        // Back: Redis decides (a fresh key's first request is admitted with its headers).
        let fresh = ask(&b, &k("after")).await;
        assert_eq!(fresh.status, StatusCode::OK);
        assert_eq!(fresh.remaining(), Some(1), "{failure:?}: decided by Redis");
        // Taken off on one: no longer held there.
        one.control()
            .remove_denied(&Key::from(k("denied")))
            .await
            .unwrap();
        assert_eq!(ask(&a, &k("denied")).await.status, StatusCode::OK);
    }
}

/// The demo server behind a proxy that freezes the connections it holds (new ones pass):
/// `ON_STORE_ERROR=closed` answers 503 meanwhile, and within 3 s the decisions are Redis's
/// again.
#[test]
fn the_demo_server_comes_back_after_its_connection_goes_silent() {
    use support::demo::DemoServer;
    use support::proxy::{FaultProxy, Faults};
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port);
    let url = proxy.url(false);
    let server = DemoServer::start(&[
        ("REDIS_URL", url.as_str()),
        ("ON_STORE_ERROR", "closed"),
        ("STORE_TIMEOUT_MS", "50"),
        ("RATE_LIMIT", "1000/h"),
    ]);
    assert_eq!(server.get("/", &[]).0, 200);
    proxy.set(Faults {
        freeze_held: true,
        ..Faults::default()
    });
    let frozen = std::time::Instant::now();
    let mut unavailable = 0;
    loop {
        match server.get("/", &[]).0 {
            200 => break,
            503 => unavailable += 1,
            other => panic!("unexpected {other}"),
        }
        assert!(
            frozen.elapsed() < Duration::from_secs(30),
            "never came back"
        );
    }
    let back = frozen.elapsed();
    eprintln!("demo: 200 again {back:?} after the freeze ({unavailable} answered 503)");
    assert!(unavailable > 0, "the freeze was met");
    assert!(back < Duration::from_secs(3), "back within 3 s: {back:?}");
}

/// A decision that took a concurrency slot and came back after its deadline (Redis paused
/// 0.8 s) gives the slot back when it comes: the request got 503 and never held it, and the
/// key is admitted again at once, not when the slot's lease ends a minute later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reply_gives_back_the_slot_it_took() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .deadline(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(Policy::concurrency(1).max_duration(Duration::from_secs(60)))
        .key(HeaderKey::try_new("x-key").unwrap())
        .on_store_error(FailurePolicy::Closed)
        .circuit_breaker(None)
        .store(store)
        .build()
        .unwrap();
    let app = app(&layer, &Seen::default());
    assert_eq!(ask(&app, "k").await.status, StatusCode::OK);
    signal(&server, "-STOP");
    let late = ask(&app, "k").await;
    // Resumed after 0.8 s: the decision runs then, and takes the slot.
    std::thread::sleep(Duration::from_millis(800));
    signal(&server, "-CONT");
    assert_eq!(
        late.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "past the deadline"
    );
    let given_back = std::time::Instant::now();
    support::eventually("the slot is free again", async || {
        ask(&app, "k").await.status == StatusCode::OK
    })
    .await;
    let took = given_back.elapsed();
    eprintln!("the late reply's slot was free {took:?} after Redis resumed");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// The demo server with Redis paused and `ON_STORE_ERROR=open`: a key denied at runtime stays
/// 403 and a blocked key 429 on the instance that saw them; a key it never saw gets through.
#[test]
fn the_demo_server_holds_its_denials_while_redis_is_paused() {
    use support::demo::{DemoServer, request};
    let redis = RedisServer::start();
    let url = redis.url();
    let server = DemoServer::start(&[
        ("REDIS_URL", url.as_str()),
        ("ON_STORE_ERROR", "open"),
        ("STORE_TIMEOUT_MS", "50"),
        ("KEY", "header:x-api-key"),
        ("RATE_LIMIT", "2/h"),
        ("BLOCK_FOR", "10min"),
    ]);
    let key = |k: &'static str| [("x-api-key", k)];
    assert_eq!(request(server.addr, "PUT", "/admin/deny/acme").0, 204);
    assert_eq!(server.get("/", &key("acme")).0, 403);
    for _ in 0..2 {
        assert_eq!(server.get("/", &key("dave")).0, 200);
    }
    assert_eq!(server.get("/", &key("dave")).0, 429, "blocked");
    signal(&redis, "-STOP");
    let statuses = [
        server.get("/", &key("acme")).0,
        server.get("/", &key("dave")).0,
        server.get("/", &key("fresh")).0,
    ];
    signal(&redis, "-CONT");
    assert_eq!(
        statuses,
        [403, 429, 200],
        "denied, blocked, and unseen (fails open)"
    );
}

/// The demo server with `CONCURRENCY=1`: a request whose decision came back after its deadline
/// (Redis paused 0.8 s) got 503, and its slot is free once the reply came, not a minute later
/// (`CONCURRENCY_MAX_MS`).
#[test]
fn the_demo_servers_late_reply_frees_its_slot() {
    use support::demo::DemoServer;
    let redis = RedisServer::start();
    let url = redis.url();
    let server = DemoServer::start(&[
        ("REDIS_URL", url.as_str()),
        ("ON_STORE_ERROR", "closed"),
        ("STORE_TIMEOUT_MS", "50"),
        ("CONCURRENCY", "1"),
        ("CONCURRENCY_MAX_MS", "60000"),
        ("RATE_LIMIT", "1000/s"),
    ]);
    assert_eq!(server.get("/", &[]).0, 200);
    signal(&redis, "-STOP");
    let (status, response) = server.get("/", &[]);
    std::thread::sleep(Duration::from_millis(800));
    signal(&redis, "-CONT");
    assert_eq!(status, 503, "past the deadline: {response}");
    let resumed = std::time::Instant::now();
    support::wait_until(Duration::from_secs(10), "the slot to be free", || {
        server.get("/", &[]).0 == 200
    });
    eprintln!(
        "the demo's late slot was free {:?} after Redis resumed",
        resumed.elapsed()
    );
}
