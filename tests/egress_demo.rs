//! The egress demo's contract (`examples/egress.rs`, run as child processes): two processes on
//! one Redis share one budget against an upstream whose own limit is that budget, and an
//! upstream's pause, in each form it may be asked in, holds both.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use support::RedisServer;
use support::demo::egress_binary;
use support::upstream::upstream;

/// The demo's summary: its last line, parsed.
fn summary(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let last = stdout.lines().last().expect("a last line");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{last:?}: {e}"))
}

/// Runs two demo processes at once with `env` (and each `REDIS_URL`): their summaries.
async fn two_processes(env: Vec<(&'static str, String)>) -> [serde_json::Value; 2] {
    let run = |env: Vec<(&'static str, String)>| {
        tokio::task::spawn_blocking(move || {
            Command::new(egress_binary())
                .env_clear()
                .envs(env)
                .stdin(Stdio::null())
                .output()
                .expect("the egress demo runs")
        })
    };
    let (a, b) = (run(env.clone()), run(env));
    [summary(&a.await.unwrap()), summary(&b.await.unwrap())]
}

fn sum(summaries: &[serde_json::Value; 2], field: &str) -> u64 {
    summaries
        .iter()
        .map(|s| s[field].as_u64().expect(field))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_redis_send_within_the_budget() {
    let redis = RedisServer::start();
    let (url, seen) = upstream(Some("20/s"), 0, HeaderMap::new()).await;
    egress_binary();
    let env = vec![
        ("UPSTREAM", url),
        ("EGRESS_LIMIT", "20/s".to_owned()),
        ("REQUESTS", "40".to_owned()),
        ("REDIS_URL", redis.url()),
        ("PREFIX", "demo:".to_owned()),
    ];
    let started = Instant::now();
    let summaries = two_processes(env).await;
    assert_eq!(sum(&summaries, "sent"), 80, "{summaries:?}");
    assert_eq!(sum(&summaries, "ok"), 80, "{summaries:?}");
    assert_eq!(sum(&summaries, "upstream_429"), 0, "{summaries:?}");
    assert_eq!(sum(&summaries, "gave_up"), 0, "{summaries:?}");
    // 20 at once, then one every 50 ms: the 80th no sooner than 3 s after the first.
    let arrivals = seen.arrivals.lock().unwrap().clone();
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // In any second, at most the burst and a second's worth (and one for the edges).
    for (i, &from) in arrivals.iter().enumerate() {
        let within = arrivals[i..]
            .iter()
            .take_while(|&&t| t - from < Duration::from_secs(1))
            .count();
        assert!(within <= 41, "{within} calls within a second of call {i}");
    }
    support::assert_no_key_without_ttl(&redis, "demo:");
}

/// Two processes, the upstream's 10th call answered with `pause` (2 s): no call of either
/// reaches it for those 2 s, but those already on their way when it answered.
async fn a_pause_holds_both_processes(pause: HeaderMap) {
    let redis = RedisServer::start();
    let what = format!("{pause:?}");
    let (url, seen) = upstream(None, 10, pause).await;
    egress_binary();
    let env = vec![
        ("UPSTREAM", url),
        ("EGRESS_LIMIT", "20/s".to_owned()),
        ("REQUESTS", "15".to_owned()),
        ("CLIENTS", "2".to_owned()),
        ("MAX_WAIT_MS", "10000".to_owned()),
        ("REDIS_URL", redis.url()),
    ];
    let summaries = two_processes(env).await;
    assert_eq!(sum(&summaries, "sent"), 30, "{what}: {summaries:?}");
    assert_eq!(sum(&summaries, "upstream_429"), 1, "{what}: {summaries:?}");
    assert_eq!(sum(&summaries, "gave_up"), 0, "{what}: {summaries:?}");
    let refused = seen
        .refused_at
        .lock()
        .unwrap()
        .expect("the 10th call refused");
    let arrivals = seen.arrivals.lock().unwrap().clone();
    let during: Vec<_> = arrivals
        .iter()
        .filter(|&&t| t > refused)
        .map(|&t| t - refused)
        .filter(|&d| d > Duration::from_millis(20) && d < Duration::from_secs(2))
        .collect();
    assert!(
        during.is_empty(),
        "{what}: calls during the pause: {during:?}"
    );
    let after = arrivals.iter().filter(|&&t| t > refused).count();
    assert!(after >= 20 - 10, "{what}: {after} calls after the pause");
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(*name, value.parse().unwrap());
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_pauses_both_processes() {
    a_pause_holds_both_processes(headers(&[("retry-after", "2")])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ietf_ratelimit_field_pauses_both_processes() {
    a_pause_holds_both_processes(headers(&[("ratelimit", "\"default\";r=0;t=2")])).await;
}

/// With `EGRESS_ADAPTIVE=on`, two processes on one Redis halve their shared limit when the
/// upstream refuses a call with a bare `429`: 60 calls at 20 a second (20 at once) take about
/// 2 s without it, and at least 3 s with it (10 a second after the refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_refusal_slows_both_processes_with_an_adaptive_rate() {
    let redis = RedisServer::start();
    egress_binary();
    let mut took = Vec::new();
    for adaptive in ["off", "on"] {
        let (url, _) = upstream(None, 25, HeaderMap::new()).await;
        let env = vec![
            ("UPSTREAM", url),
            ("EGRESS_LIMIT", "20/s".to_owned()),
            ("REQUESTS", "30".to_owned()),
            ("EGRESS_ADAPTIVE", adaptive.to_owned()),
            ("REDIS_URL", redis.url()),
            ("PREFIX", format!("adaptive-{adaptive}:")),
        ];
        let started = Instant::now();
        let summaries = two_processes(env).await;
        assert_eq!(sum(&summaries, "upstream_429"), 1, "{summaries:?}");
        assert_eq!(sum(&summaries, "gave_up"), 0, "{summaries:?}");
        took.push(started.elapsed());
    }
    // Off: 20 at once, 40 more at 20 a second: 2 s. On: after the refusal (the 25th call), 10 a
    // second: the 35 calls left take at least 3 s.
    assert!(took[1] >= Duration::from_millis(3000), "{took:?}");
    assert!(took[1] > took[0] + Duration::from_millis(500), "{took:?}");
}

#[test]
fn bad_values_stop_the_demo_naming_the_variable() {
    let cases = [
        (vec![], "UPSTREAM"),
        (vec![("UPSTREAM", "not a url")], "UPSTREAM"),
        (vec![("UPSTREAM", "ftp://example.com/")], "UPSTREAM"),
        (vec![("EGRESS_LIMIT", "10/parsec")], "EGRESS_LIMIT"),
        (vec![("EGRESS_LIMIT", "0/s")], "EGRESS_LIMIT"),
        (vec![("ALGORITHM", "magic")], "ALGORITHM"),
        (vec![("REQUESTS", "0")], "REQUESTS"),
        (vec![("CLIENTS", "many")], "CLIENTS"),
        (vec![("MAX_WAIT_MS", "0")], "MAX_WAIT_MS"),
        (vec![("EGRESS_ADAPTIVE", "maybe")], "EGRESS_ADAPTIVE"),
        (vec![("REDIS_URL", "redis://127.0.0.1:1")], "REDIS_URL"),
    ];
    for (env, variable) in cases {
        let mut full = vec![("UPSTREAM", "http://127.0.0.1:1/")];
        full.retain(|(k, _)| !env.iter().any(|(e, _)| e == k));
        full.extend(env.iter().copied());
        if variable == "UPSTREAM" && env.is_empty() {
            full.clear();
        }
        let out = Command::new(egress_binary())
            .env_clear()
            .envs(full.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{full:?}: {err}");
        assert!(err.contains(variable), "{full:?}: {err}");
    }
}
