//! Redis behind Sentinel: a real primary, its replica and three `redis-sentinel` processes.
//! The primary is killed with `kill -9`: requests during the failover get the failure policy
//! within the deadline, decisions resume on the promoted replica, and the limit is exact
//! afterwards (what was replicated before the kill is kept). Time for the algorithms comes from
//! a `ManualClock`; the failover itself takes the real time Sentinel takes.

use std::time::{Duration, Instant};

use http::StatusCode;
use tower_ratelimit::key::GlobalKey;
use tower_ratelimit::{FailurePolicy, ManualClock, Policy, RateLimitLayer, RedisStore};

mod support;

use support::Sentinels;
use support::demo::DemoServer;
use support::http::{PROBLEM_JSON, Reply, Seen, get, inner};

/// The deadline of one decision in these tests.
const DEADLINE: Duration = Duration::from_millis(100);

async fn store(url: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::builder(url)
        .deadline(DEADLINE)
        .prefix("sentinel:")
        .clock(clock.clone())
        .build()
        .await
        .expect("connect through the sentinels")
}

/// Instances of one API, each with its own store (and connection) through the sentinels,
/// sharing a limit of 10 an hour. The store decides on the manual clock; the layer's circuit
/// breaker counts its open second on the real one.
async fn instances(
    n: usize,
    url: String,
    clock: ManualClock,
    seen: Seen,
) -> Vec<
    impl tower::Service<
        http::Request<()>,
        Response = http::Response<impl http_body::Body<Error: std::fmt::Debug>>,
        Error: std::fmt::Debug,
    > + Clone,
> {
    let mut instances = Vec::new();
    for _ in 0..n {
        let layer = RateLimitLayer::builder()
            .policy(Policy::fixed_window("10/h").name("hourly"))
            .key(GlobalKey)
            .store(store(&url, &clock).await)
            .on_store_error(FailurePolicy::Closed)
            .build()
            .unwrap();
        instances.push(
            tower::ServiceBuilder::new()
                .layer(layer)
                .service(inner(&seen)),
        );
    }
    instances
}

/// Sends requests to `instances` in turn until one is decided (not the failure policy's 503),
/// asserting that each is answered within the deadline (plus a margin for a loaded machine);
/// returns the decided reply and how many got the failure policy.
async fn until_decided<S, B>(instances: &[S], since: Instant, what: &str) -> (Reply, usize)
where
    S: tower::Service<http::Request<()>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut slowest = Duration::ZERO;
    let mut degraded = 0;
    loop {
        let started = Instant::now();
        let reply = get(&instances[degraded % instances.len()]).await;
        slowest = slowest.max(started.elapsed());
        assert!(
            slowest < DEADLINE + Duration::from_secs(1),
            "a request took {slowest:?} after {what}"
        );
        if reply.status != StatusCode::SERVICE_UNAVAILABLE {
            eprintln!(
                "decisions resumed {:?} after {what}; {degraded} requests got the failure policy, the slowest in {slowest:?}",
                since.elapsed()
            );
            return (reply, degraded);
        }
        assert_eq!(reply.header("content-type"), Some(PROBLEM_JSON));
        degraded += 1;
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "no decision a minute after {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many of `n` requests to `instances` in turn are admitted (the others limited).
async fn admitted<S, B>(instances: &[S], n: usize) -> usize
where
    S: tower::Service<http::Request<()>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut admitted = 0;
    for i in 0..n {
        match get(&instances[i % instances.len()]).await.status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("{other} after the failover"),
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_gets_the_failure_policy_then_decisions_resume_exactly() {
    let mut sentinels = Sentinels::start();
    let (clock, seen) = (ManualClock::new(), Seen::default());
    // Two instances sharing the limit.
    let instances = instances(2, sentinels.url(), clock, seen.clone()).await;
    assert_eq!(admitted(&instances, 6).await, 6);
    // Everything so far is on the replica before the primary dies.
    assert_eq!(sentinels.primary.cli(&["WAIT", "1", "5000"]), "1");
    let old_primary = sentinels.primary.port;
    let killed = Instant::now();
    sentinels.primary.kill();
    // Each instance finds the new primary on its own (one may still be failing over when the
    // other decides again): wait for both.
    let mut degraded = 0;
    for instance in &instances {
        let (first, d) = until_decided(std::slice::from_ref(instance), killed, "kill -9").await;
        assert_eq!(first.status, StatusCode::OK);
        degraded += d;
    }
    assert!(degraded > 0, "the failover was noticed");
    // The replica is the primary now, and the sentinels say so.
    assert_ne!(sentinels.primary_port(), old_primary);
    assert!(sentinels.replica.cli(&["ROLE"]).starts_with("master"));
    // Exact afterwards: 6 admitted before the kill, so 4 in all after it, on both instances.
    assert_eq!(2 + admitted(&instances, 10).await, 4);
    assert_eq!(seen.calls(), 10);
}

/// A primary that stops answering without closing its connections (`SIGSTOP`) is failed over
/// too: decisions miss their deadline, a `PING` after one misses its own, and the store asks
/// the sentinels again. The new primary's lost function is loaded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_primary_is_failed_over_too() {
    let sentinels = Sentinels::start();
    let (clock, seen) = (ManualClock::new(), Seen::default());
    let instances = instances(1, sentinels.url(), clock, seen).await;
    assert_eq!(admitted(&instances, 3).await, 3);
    assert_eq!(sentinels.primary.cli(&["WAIT", "1", "5000"]), "1");
    let paused = sentinels.primary.pid().to_string();
    signal("-STOP", &paused);
    let (first, degraded) =
        until_decided(&instances, Instant::now(), "SIGSTOP of the primary").await;
    signal("-CONT", &paused);
    assert!(degraded > 0);
    assert!(sentinels.replica.cli(&["ROLE"]).starts_with("master"));
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        1 + admitted(&instances, 10).await,
        7,
        "3 before the pause, 7 after"
    );
    // The promoted primary loses the decision function: the next decision still comes (sent
    // as EVAL), and the function is loaded again, through the sentinels' primary.
    sentinels.replica.cli(&["FUNCTION", "FLUSH"]);
    assert_eq!(admitted(&instances, 1).await, 0, "still limited");
    let function = RedisStore::function_name();
    support::eventually("the function is loaded again", async || {
        sentinels
            .replica
            .cli(&["FUNCTION", "LIST"])
            .contains(function)
    })
    .await;
}

fn signal(which: &str, pid: &str) {
    let status = std::process::Command::new("kill")
        .args([which, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid}");
}

#[tokio::test]
async fn the_demo_server_takes_a_sentinel_url() {
    let sentinels = Sentinels::start();
    let server = DemoServer::start(&[
        ("REDIS_URL", &sentinels.url()),
        ("RATE_LIMIT", "3/h"),
        ("KEY", "global"),
    ]);
    assert!(
        server.first_line.contains("store=redis"),
        "{}",
        server.first_line
    );
    let statuses: Vec<u16> = (0..5).map(|_| server.get("/", &[]).0).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    // The state is on the primary the sentinels name.
    let keys = sentinels.primary.cli(&["KEYS", "rl:*"]);
    assert!(!keys.is_empty(), "no key on the primary");
}

#[tokio::test]
async fn a_bad_sentinel_url_or_master_name_is_a_clear_error() {
    let sentinels = Sentinels::start();
    let error = RedisStore::builder("redis+sentinel://127.0.0.1:26379")
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("no master name"), "{error}");
    let url = sentinels.url().replace("/mymaster", "/nosuchmaster");
    let error = RedisStore::builder(&url)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("nosuchmaster"), "{error}");
    let error = RedisStore::builder(&sentinels.url())
        .pool(4)
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("pool is not available with Sentinel"),
        "{error}"
    );
}
