//! The Redis store on a real, standalone redis-server: exactness under contention from two
//! application instances, TTLs on every key, NOSCRIPT recovery, key repair, memory per key,
//! hostile keys, a clear error for an unreachable server, and the usual decision on the
//! fused path.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{RedisServer, assert_no_key_without_ttl, free_port, keys_with_ttl};
use tower_ratelimit::key::Key;
use tower_ratelimit::{Algorithm, ManualClock, Policy, RateLimitLayer, RedisStore};

async fn store(server: &RedisServer, prefix: &str, clock: Option<&ManualClock>) -> RedisStore {
    let mut builder = RedisStore::builder(&server.url())
        .deadline(std::time::Duration::from_secs(10))
        .prefix(prefix);
    if let Some(clock) = clock {
        builder = builder.clock(clock.clone());
    }
    builder
        .build()
        .await
        .expect("connect to the test redis-server")
}

/// A layer of one policy on `store`.
fn layer_on(store: RedisStore, policy: Policy) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder()
        .policy(policy)
        .store(store)
        .build()
        .unwrap()
}

fn policy(algorithm: Algorithm, limit: u32) -> Policy {
    Policy::new(algorithm, format!("{limit}/h").as_str()).name(format!("{algorithm}-{limit}"))
}

/// Two application instances (two stores, two connections) race 1,000 checks at one key.
async fn contention(a: RedisStore, b: RedisStore, algorithm: Algorithm, limit: u32) -> usize {
    let la = layer_on(a, policy(algorithm, limit));
    let lb = layer_on(b, policy(algorithm, limit));
    support::lease::race(&la, &lb, 1_000, 1).await
}

/// Two instances race on one key under two and three policies: every key is admitted the
/// smallest limit, and every policy is charged exactly what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_charge_several_policies_all_or_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    for (i, set) in support::lease::several_policy_sets().iter().enumerate() {
        let a = store(&server, "srace:", Some(&clock)).await;
        let b = store(&server, "srace:", Some(&clock)).await;
        support::lease::race_several(a, b, &format!("s{i}"), set, 400, 1).await;
    }
    assert_no_key_without_ttl(&server, "srace:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    for algorithm in Algorithm::ALL {
        let a = store(&server, "race:", Some(&clock)).await;
        let b = store(&server, "race:", Some(&clock)).await;
        assert_eq!(contention(a, b, algorithm, 100).await, 100, "{algorithm}");
    }
    // With Redis TIME, and a pool on one side: quotas per hour do not refill measurably
    // during the test.
    for algorithm in Algorithm::ALL {
        let a = RedisStore::builder(&server.url())
            .deadline(std::time::Duration::from_secs(10))
            .prefix("race-time:")
            .build()
            .await
            .unwrap();
        let b = RedisStore::builder(&server.url())
            .deadline(std::time::Duration::from_secs(10))
            .prefix("race-time:")
            .pool(8)
            .build()
            .await
            .unwrap();
        let admitted = contention(a, b, algorithm, 37).await;
        if algorithm == Algorithm::FixedWindow {
            // An hour boundary may fall inside the test: at most twice the limit.
            assert!((37..=74).contains(&admitted), "{algorithm}: {admitted}");
        } else {
            assert_eq!(admitted, 37, "{algorithm}");
        }
    }
    assert_no_key_without_ttl(&server, "race");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_gets_a_ttl_no_longer_than_needed() {
    let server = RedisServer::start();
    let s = store(&server, "ttl:", None).await;
    // The fixed window's keys end with the minute (windows start at the Unix epoch): when a
    // minute ends during the test, they may be gone by the time they are read.
    let minute = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 60
    };
    let started = minute();
    for algorithm in Algorithm::ALL {
        let layer = layer_on(
            s.clone(),
            Policy::new(algorithm, "10/min").name(algorithm.name()),
        );
        for i in 0..12 {
            layer.check(&Key::from(format!("u{i}")), 1).await.unwrap();
        }
        layer.check(&Key::from("u0"), 1).await.unwrap();
    }
    let keys = keys_with_ttl(&server, "ttl:");
    let ended = minute() != started;
    let window_keys = keys
        .iter()
        .filter(|(k, _)| k.starts_with("ttl:fixed_window:"));
    match ended {
        false => assert_eq!(keys.len(), 6 * 12, "{keys:?}"),
        true => assert_eq!(keys.len() - window_keys.count(), 5 * 12, "{keys:?}"),
    }
    for (key, ttl) in keys {
        if ended && ttl == -2 && key.starts_with("ttl:fixed_window:") {
            continue;
        }
        // One unit of 10/min drains in 6 s (two units in 12 s); a window lasts at most 60 s,
        // plus one sub-window of 6 s for the sliding window counter.
        let bucket = ["gcra", "token_bucket", "leaky_bucket"]
            .iter()
            .any(|a| key.starts_with(&format!("ttl:{a}:")));
        let max = if bucket { 12_000 } else { 66_000 };
        assert!(ttl > 0 && ttl <= max, "{key}: PTTL {ttl}");
    }
}

/// A decision of one policy goes one way, whatever the key holds: it reads Redis's clock
/// once, a blocked key included (before, a blocked key was given to a second path, which read
/// the clock again). (The decisions themselves are held to the Rust algorithms by
/// `redis_differential.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_reads_the_clock_once_whatever_the_key_holds() {
    let server = RedisServer::start();
    let s = store(&server, "fused:", None).await;
    for algorithm in Algorithm::ALL {
        let layer = layer_on(s.clone(), policy(algorithm, 1_000));
        let before = server.calls("time");
        for i in 0..20 {
            let d = layer.check(&Key::from(format!("k{i}")), 1).await.unwrap();
            assert!(d.is_allowed(), "{algorithm}");
        }
        assert_eq!(
            server.calls("time") - before,
            20,
            "{algorithm}: one TIME each"
        );
        let key = Key::from("blocked");
        layer
            .control()
            .block_for(&key, Duration::from_secs(60))
            .await
            .unwrap();
        let before = server.calls("time");
        assert!(!layer.check(&key, 1).await.unwrap().is_allowed());
        assert_eq!(
            server.calls("time") - before,
            1,
            "{algorithm}: a blocked key is decided on the same path"
        );
    }
}

/// A decision of several policies goes one way too: one read of Redis's clock, one key blocked
/// included. The sets of the several-policy races: each algorithm with the next, and three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_of_several_policies_reads_the_clock_once() {
    let server = RedisServer::start();
    let s = store(&server, "fused2:", None).await;
    for (n, set) in support::lease::several_policy_sets().iter().enumerate() {
        let policies = set
            .iter()
            .enumerate()
            .map(|(i, &a)| policy(a, 1_000).name(format!("p{n}-{i}")));
        let layer = RateLimitLayer::builder()
            .policies(policies)
            .store(s.clone())
            .build()
            .unwrap();
        let before = server.calls("time");
        for i in 0..20 {
            let d = layer.check(&Key::from(format!("k{i}")), 1).await.unwrap();
            assert!(d.is_allowed(), "{set:?}");
        }
        assert_eq!(server.calls("time") - before, 20, "{set:?}: one TIME each");
        // One policy's key blocked, by a layer of that policy alone (the layer's own
        // block_for would block every policy's).
        let key = Key::from("blocked");
        let last = set.len() - 1;
        layer_on(
            s.clone(),
            policy(set[last], 1_000).name(format!("p{n}-{last}")),
        )
        .control()
        .block_for(&key, Duration::from_secs(60))
        .await
        .unwrap();
        let before = server.calls("time");
        let d = layer.check(&key, 1).await.unwrap();
        assert!(!d.is_allowed(), "{set:?}: blocked");
        assert_eq!(
            server.calls("time") - before,
            1,
            "{set:?}: a blocked key is decided on the same path"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_ttl_is_repaired() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let s = store(&server, "fix:", Some(&clock)).await;
    let layer = layer_on(s.clone(), Policy::gcra("1/min").name("g"));
    let key = Key::from("victim");
    let redis_key = String::from_utf8(s.key_for("g", &key)).unwrap();
    // Something else wrote a TAT one hour ahead without a TTL: the key is limited.
    let tat = 1_000_000_000_000u64 + 3_600_000_000;
    server.cli(&["SET", &redis_key, &tat.to_string()]);
    assert_eq!(server.cli(&["PTTL", &redis_key]), "-1");
    let d = layer.check(&key, 1).await.unwrap();
    assert!(!d.is_allowed());
    let ttl: i64 = server.cli(&["PTTL", &redis_key]).parse().unwrap();
    assert!(ttl > 3_500_000, "repaired TTL {ttl}");
    // A garbage value is treated as a fresh key and replaced.
    server.cli(&["SET", &redis_key, "not a number"]);
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    assert!(server.cli(&["PTTL", &redis_key]).parse::<i64>().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_loses_no_decision() {
    flush_loses_no_decision(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_loses_no_decision() {
    flush_loses_no_decision(true).await;
}

/// `SCRIPT FLUSH` (deciding with `EVALSHA`) or `FUNCTION FLUSH` (with `FCALL`) between and
/// during decisions: none fails, none is counted twice.
async fn flush_loses_no_decision(functions: bool) {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    // A generous deadline and response timeout: during the flushes most of the 600
    // decisions, pipelined on one connection, send the script's source, which Redis compiles
    // again after each `SCRIPT FLUSH`; on a loaded 2-core machine a reply came after the
    // connection's default second. What this test holds is that none fails for the missing
    // script, and none is counted twice.
    let s = server
        .store_calling_within("flush:", Some(&clock), functions, Duration::from_secs(60))
        .await;
    let flush = if functions { "FUNCTION" } else { "SCRIPT" };
    let layer = layer_on(s.clone(), Policy::fixed_window("1000/h").name("f"));
    // Between checks.
    for _ in 0..20 {
        // The store loads its library again in a task of its own after a decision found it
        // missing; that task may run after a flush, so flush until the library is gone.
        let loaded = || {
            server
                .cli(&["FUNCTION", "LIST"])
                .contains(RedisStore::function_name())
        };
        let gone = (0..100).any(|_| {
            server.cli(&[flush, "FLUSH"]);
            !loaded()
        });
        assert!(gone, "the library is still loaded after 100 flushes");
        if !functions {
            assert_eq!(server.cli(&["SCRIPT", "EXISTS", s.script_sha()]), "0");
        }
        layer
            .check(&Key::from("a"), 1)
            .await
            .expect("decision after a flush");
    }
    // During checks: a thread flushes in a loop while 600 checks run.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = server.port;
    let flusher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut flushes = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), flush, "FLUSH"])
                    .output();
                flushes += 1;
            }
            flushes
        })
    };
    let mut tasks = Vec::new();
    for i in 0..600 {
        let layer = layer.clone();
        tasks.push(tokio::spawn(async move {
            layer.check(&Key::from(format!("k{}", i % 7)), 1).await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        t.await.unwrap().expect("no decision fails during a flush");
        ok += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(flusher.join().unwrap() > 0);
    assert_eq!(ok, 600);
    // Every decision was counted exactly once: 20 + 600 units over the 8 keys.
    let mut total = 0;
    for k in ["a", "k0", "k1", "k2", "k3", "k4", "k5", "k6"] {
        let d = layer.check(&Key::from(k), 0).await.unwrap();
        total += 1000 - d.outcomes()[0].remaining();
    }
    assert_eq!(total, 620);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_stay_in_their_own_bucket() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let s = store(&server, "hostile:", Some(&clock)).await;
    let layer = layer_on(s.clone(), Policy::fixed_window("1/h").name("p"));
    let hostile: Vec<Key> = vec![
        Key::from("{victim}"),
        Key::from("victim}"),
        Key::from("{"),
        Key::from("}{"),
        Key::from("a:b:c"),
        Key::from("line\nbreak"),
        Key::from(&b"\xff\xfe invalid utf-8"[..]),
        Key::from(vec![b'x'; 64 * 1024]),
        Key::from(vec![b'x'; 64 * 1024 + 1]),
        Key::from("victim"),
        Key::from("g"),
        Key::global(),
    ];
    for key in &hostile {
        let rk = s.key_for("p", key);
        assert!(rk.len() <= 3 * 64 + 16, "bounded key length: {}", rk.len());
        let text = String::from_utf8(rk).expect("keys are ASCII");
        assert_eq!(text.matches('{').count(), 1, "{text}");
        assert_eq!(text.matches('}').count(), 1, "{text}");
        assert!(
            layer.check(key, 1).await.unwrap().is_allowed(),
            "{key:?} starts fresh"
        );
    }
    // Every one of them got its own bucket: each is now limited, and there is one key each.
    for key in &hostile {
        assert!(!layer.check(key, 1).await.unwrap().is_allowed(), "{key:?}");
    }
    assert_eq!(keys_with_ttl(&server, "hostile:").len(), hostile.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_usage_per_key() {
    let server = RedisServer::start();
    let s = store(&server, "mem:", None).await;
    let mut report = Vec::new();
    for algorithm in Algorithm::ALL {
        let layer = layer_on(
            s.clone(),
            Policy::new(algorithm, "1000/h").name(algorithm.name()),
        );
        let key = Key::from("203.0.113.9");
        layer.check(&key, 1).await.unwrap();
        let rk = String::from_utf8(s.key_for(algorithm.name(), &key)).unwrap();
        let one: u64 = server.cli(&["MEMORY", "USAGE", &rk]).parse().unwrap();
        for _ in 0..99 {
            layer.check(&key, 1).await.unwrap();
        }
        let hundred: u64 = server.cli(&["MEMORY", "USAGE", &rk]).parse().unwrap();
        report.push(format!(
            "{algorithm}: {one} bytes after 1 request, {hundred} after 100"
        ));
        if algorithm == Algorithm::SlidingLog {
            assert!(hundred > one, "the log grows with requests");
            assert!(hundred < 100 * 100, "{hundred}");
        } else {
            assert!(
                one <= 200 && hundred <= 200,
                "{algorithm}: {one} / {hundred}"
            );
        }
    }
    println!("{}", report.join("\n"));
}

#[tokio::test]
async fn unreachable_redis_is_a_clear_error() {
    let port = free_port();
    let started = std::time::Instant::now();
    let err = RedisStore::builder(&format!("redis://user:secret@127.0.0.1:{port}"))
        .deadline(std::time::Duration::from_secs(10))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(5), "no hang");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("secret"), "no password in messages: {err}");
    let err = RedisStore::builder("http://nope")
        .deadline(std::time::Duration::from_secs(10))
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Redis"), "{err}");
    let err = RedisStore::builder("redis://127.0.0.1:1")
        .deadline(std::time::Duration::from_secs(10))
        .prefix("bad{prefix")
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("prefix"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_resume_after_a_restart() {
    resume_after_a_restart(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_through_evalsha_resume_after_a_restart() {
    resume_after_a_restart(false).await;
}

/// redis-server restarts (without persistence: the function or script is gone with it).
async fn resume_after_a_restart(functions: bool) {
    let mut server = RedisServer::start();
    let s = server.store_calling("restart:", None, functions).await;
    let layer = layer_on(s, Policy::gcra("100/s").name("g"));
    assert!(layer.check(&Key::from("a"), 1).await.is_ok());
    server.restart();
    // The connection reconnects and the function or script is loaded again ("Function not
    // found" or NOSCRIPT) on its own.
    let mut ok = false;
    for _ in 0..50 {
        if layer.check(&Key::from("a"), 1).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "decisions resume after redis-server restarts");
    assert_no_key_without_ttl(&server, "restart:");
    // The restarted server saw only calls of the kind asked for.
    server.assert_calls(functions);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_applies_when_redis_is_killed() {
    use http::{Request, Response, StatusCode};
    use tower::{ServiceExt, service_fn};
    use tower_layer::Layer;
    use tower_ratelimit::FailurePolicy;

    let mut server = RedisServer::start();
    let s = store(&server, "fail:", None).await;
    let inner = service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(
            http_body_util::Empty::<bytes::Bytes>::new(),
        ))
    });
    let make = |policy: FailurePolicy| {
        RateLimitLayer::builder()
            .policy(Policy::gcra("100/s").name("g"))
            .key(tower_ratelimit::key::GlobalKey)
            .store(s.clone())
            .on_store_error(policy)
            .build()
            .unwrap()
            .layer(inner)
    };
    let open = make(FailurePolicy::Open);
    let closed = make(FailurePolicy::Closed);
    let status = |svc: &tower_ratelimit::RateLimit<_, RedisStore>| {
        let svc = svc.clone();
        async move { svc.oneshot(Request::new(())).await.unwrap() }
    };
    let ok = status(&open).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(ok.headers().contains_key("x-ratelimit-remaining"));

    server.kill();
    let started = std::time::Instant::now();
    let through = status(&open).await;
    assert_eq!(
        through.status(),
        StatusCode::OK,
        "fail open lets the request through"
    );
    assert!(
        !through.headers().contains_key("x-ratelimit-remaining"),
        "no decision, no headers"
    );
    let refused = status(&closed).await;
    assert_eq!(
        refused.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "fail closed answers 503"
    );
    assert_eq!(refused.headers()["retry-after"], "1");
    let body = http_body_util::BodyExt::collect(refused.into_body())
        .await
        .unwrap()
        .to_bytes();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        doc["type"], "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
        "the IETF draft's problem type for a service that cannot serve fully: {doc}"
    );
    assert_eq!(doc["status"], 503, "{doc}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no hang: {:?}",
        started.elapsed()
    );
}

/// A Redis that refuses functions (here an ACL without `FUNCTION`; before 7.0, the command
/// does not exist) gets `EVALSHA`s of the script, with the same decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_functions_the_store_decides_with_evalsha() {
    let server = RedisServer::start();
    server.cli(&[
        "ACL",
        "SETUSER",
        "nofn",
        "on",
        ">secret",
        "~*",
        "+@all",
        "-function",
    ]);
    let url = format!("redis://nofn:secret@127.0.0.1:{}", server.port);
    let s = RedisStore::builder(&url)
        .deadline(std::time::Duration::from_secs(10))
        .build()
        .await
        .expect("a store without functions");
    assert!(!s.uses_functions());
    let layer = layer_on(s, Policy::gcra("2/h").name("g"));
    let key = Key::from("a");
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    assert!(!layer.check(&key, 1).await.unwrap().is_allowed());
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=3"), "{stats}");
    assert!(!stats.contains("cmdstat_fcall"), "{stats}");

    // With the default user, the same Redis gets the function.
    let s = store(&server, "fn:", None).await;
    assert!(s.uses_functions());
    assert!(
        server
            .cli(&["FUNCTION", "LIST"])
            .contains(RedisStore::function_name())
    );
}

/// The sliding window counter keeps its ring sparse in Redis ("head cell:count ..."), and
/// still reads the dense form earlier versions wrote ("head c0 c1 ... c10").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_state_is_sparse_and_reads_the_dense_form() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    // 10/h in 10 buckets of 360 s: at bucket index 1000 exactly, cell 1000 mod 11 = 10.
    clock.set_micros(360_000_000 * 1000);
    let s = store(&server, "sw:", Some(&clock)).await;
    let layer = layer_on(s.clone(), Policy::sliding_window("10/h").name("sw"));
    let key = Key::from("a");
    let redis_key = String::from_utf8(s.key_for("sw", &key)).unwrap();
    server.cli(&[
        "SET",
        &redis_key,
        "1000 0 0 0 0 0 0 0 0 0 0 4",
        "PX",
        "600000",
    ]);
    let peek = layer.check(&key, 0).await.unwrap();
    assert_eq!(
        peek.outcomes()[0].remaining(),
        6,
        "4 of 10 used, read from the dense form"
    );
    let charged = layer.check(&key, 1).await.unwrap();
    assert_eq!(charged.outcomes()[0].remaining(), 5);
    // Then the tag of the parameters it was written under: sliding_window (C, its id 2), 10
    // per window, 10 buckets of 360 s (in base 36, and 36E7 µs).
    assert_eq!(server.cli(&["GET", &redis_key]), "1000 10:5Ca,a,36E7");
}
