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
use support::http::{PROBLEM_JSON, Seen, get, inner};

/// The deadline of one decision in these tests.
const DEADLINE: Duration = Duration::from_millis(100);

async fn store(sentinels: &Sentinels, clock: &ManualClock) -> RedisStore {
    RedisStore::builder(&sentinels.url())
        .deadline(DEADLINE)
        .prefix("sentinel:")
        .clock(clock.clone())
        .build()
        .await
        .expect("connect through the sentinels")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_gets_the_failure_policy_then_decisions_resume_exactly() {
    let mut sentinels = Sentinels::start();
    let clock = ManualClock::new();
    // Two instances, each with its own store and connection, sharing the limit.
    let seen = Seen::default();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let layer = RateLimitLayer::builder()
            .policy(Policy::fixed_window("10/h").name("hourly"))
            .key(GlobalKey)
            // The store decides on the manual clock; the layer's circuit breaker counts its
            // open second on the real one.
            .store(store(&sentinels, &clock).await)
            .on_store_error(FailurePolicy::Closed)
            .build()
            .unwrap();
        instances.push(
            tower::ServiceBuilder::new()
                .layer(layer)
                .service(inner(&seen)),
        );
    }
    for i in 0..6 {
        assert_eq!(get(&instances[i % 2]).await.status, StatusCode::OK);
    }
    // Everything so far is on the replica before the primary dies.
    assert_eq!(sentinels.primary.cli(&["WAIT", "1", "5000"]), "1");
    let old_primary = sentinels.primary.port;
    let killed = Instant::now();
    sentinels.primary.kill();

    // Until a decision comes back, every request gets the failure policy (503), each within
    // the deadline (plus a margin for a loaded machine).
    let mut slowest = Duration::ZERO;
    let mut degraded = 0;
    let first = loop {
        let started = Instant::now();
        let reply = get(&instances[degraded % 2]).await;
        slowest = slowest.max(started.elapsed());
        assert!(
            started.elapsed() < DEADLINE + Duration::from_secs(1),
            "a request took {:?} during the failover",
            started.elapsed()
        );
        if reply.status != StatusCode::SERVICE_UNAVAILABLE {
            break reply;
        }
        assert_eq!(reply.header("content-type"), Some(PROBLEM_JSON));
        degraded += 1;
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no decision a minute after the primary died"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let resumed = killed.elapsed();
    eprintln!(
        "decisions resumed {resumed:?} after kill -9 of the primary; {degraded} requests got the failure policy, the slowest in {slowest:?}"
    );
    assert!(degraded > 0, "the failover was noticed");
    // The replica is the primary now, and the sentinels say so.
    assert_ne!(sentinels.primary_port(), old_primary);
    assert!(sentinels.replica.cli(&["ROLE"]).starts_with("master"));

    // Exact afterwards: 6 admitted before the kill, so 4 in all after it, on both instances.
    assert_eq!(first.status, StatusCode::OK);
    let mut admitted = 1;
    for i in 0..10 {
        match get(&instances[i % 2]).await.status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("{other} after the failover"),
        }
    }
    assert_eq!(admitted, 4);
    assert_eq!(seen.calls(), 10);
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

/// A primary that stops answering without closing its connections (`SIGSTOP`) is failed over
/// too: decisions miss their deadline, a `PING` after one misses its own, and the store asks
/// the sentinels again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_primary_is_failed_over_too() {
    let sentinels = Sentinels::start();
    let clock = ManualClock::new();
    let seen = Seen::default();
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("10/h").name("hourly"))
        .key(GlobalKey)
        .store(store(&sentinels, &clock).await)
        .on_store_error(FailurePolicy::Closed)
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(inner(&seen));
    for _ in 0..3 {
        assert_eq!(get(&svc).await.status, StatusCode::OK);
    }
    assert_eq!(sentinels.primary.cli(&["WAIT", "1", "5000"]), "1");
    let paused = sentinels.primary.pid().to_string();
    signal("-STOP", &paused);
    let stopped = Instant::now();
    let mut degraded = 0;
    let first = loop {
        let started = Instant::now();
        let reply = get(&svc).await;
        assert!(
            started.elapsed() < DEADLINE + Duration::from_secs(1),
            "a request took {:?} while the primary was paused",
            started.elapsed()
        );
        if reply.status != StatusCode::SERVICE_UNAVAILABLE {
            break reply;
        }
        degraded += 1;
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "no decision a minute after the primary stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "decisions resumed {:?} after SIGSTOP of the primary; {degraded} requests got the failure policy",
        stopped.elapsed()
    );
    signal("-CONT", &paused);
    assert!(degraded > 0);
    assert!(sentinels.replica.cli(&["ROLE"]).starts_with("master"));
    assert_eq!(first.status, StatusCode::OK);
    let mut admitted = 1;
    for _ in 0..10 {
        if get(&svc).await.status == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 7, "3 before the pause, 7 after");
}

fn signal(which: &str, pid: &str) {
    let status = std::process::Command::new("kill")
        .args([which, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid}");
}
