//! Faults on real redis-server processes that really fail, under concurrent load: killed
//! (SIGKILL), paused (SIGSTOP, `CLIENT PAUSE`), out of memory (`maxmemory` with `noeviction`),
//! restarted, and `SCRIPT FLUSH` in a loop; the circuit breaker in front of a paused Redis; the
//! deny cache, counted with `INFO commandstats`; and the metrics the layer records. Nothing is
//! mocked.
//!
//! Every fault test measures each request's latency and checks the failure policy on every
//! response, then checks that decisions are exact again once Redis is back.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Empty;
use support::{RedisServer, wait_until};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::{
    CircuitBreaker, FailurePolicy, ManualClock, MemoryStore, Policy, RateLimitLayer, RedisStore,
    Store, body::ResponseBody,
};

/// The deadline of one decision in the fault tests.
const DEADLINE: Duration = Duration::from_millis(100);

/// What a request may take beyond the deadline. Generous because 200 requests start at once on
/// a 2-core machine, in a debug build, while the other tests of this file run next to them:
/// a request whose deadline fired may wait a few hundred milliseconds for a worker thread.
/// Without the deadline a request would wait for Redis itself: until `SIGCONT`, the end of a
/// 2 s `CLIENT PAUSE`, or the store's 30 s response timeout, all beyond this bound.
const MARGIN: Duration = Duration::from_secs(1);

/// The limit of the fault tests' policy, per hour: nothing refills measurably during a test.
const LIMIT: usize = 10;

/// Keys and requests per key of a burst: 200 requests in flight at once.
const KEYS: usize = 20;
const PER_KEY: usize = 10;

type App = BoxCloneSyncService<Request<()>, Response<ResponseBody<Empty<Bytes>>>, Infallible>;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A store on `server` whose decisions have `deadline`. The response timeout is longer than any
/// bound in this file, so that only the deadline can cut a hung decision short.
async fn store(server: &RedisServer, deadline: Duration) -> RedisStore {
    store_with(server, deadline, None).await
}

async fn store_with(
    server: &RedisServer,
    deadline: Duration,
    clock: Option<&ManualClock>,
) -> RedisStore {
    let mut builder = RedisStore::builder(&server.url())
        .deadline(deadline)
        .response_timeout(Duration::from_secs(30));
    if let Some(clock) = clock {
        builder = builder.clock(clock.clone());
    }
    builder
        .build()
        .await
        .expect("connect to the test redis-server")
}

/// `LIMIT` per hour per `x-key` header, GCRA (no window boundary to cross during a test).
fn builder(store: RedisStore) -> tower_ratelimit::RateLimitLayerBuilder<RedisStore> {
    RateLimitLayer::builder()
        .policy(Policy::gcra(format!("{LIMIT}/h").as_str()).name("api"))
        .key(HeaderKey::try_new("x-key").unwrap())
        .store(store)
}

/// A layer without a circuit breaker: every decision goes to Redis and meets the fault (the
/// breaker has tests of its own).
fn layer(store: RedisStore, failure: FailurePolicy) -> RateLimitLayer<RedisStore> {
    builder(store)
        .on_store_error(failure)
        .circuit_breaker(None)
        .build()
        .unwrap()
}

fn app<St: Store>(layer: &RateLimitLayer<St>) -> App {
    BoxCloneSyncService::new(layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    })))
}

/// One response, and how long it took.
#[derive(Debug)]
struct Seen {
    key: String,
    status: StatusCode,
    headers: HeaderMap,
    started: Instant,
    latency: Duration,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn has_rate_headers(&self) -> bool {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .iter()
        .any(|h| self.headers.contains_key(*h))
    }

    /// Redis decided: the full limit in the headers.
    fn decided_by_redis(&self) -> bool {
        matches!(self.status, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS)
            && self.header("x-ratelimit-limit") == Some(&LIMIT.to_string())
    }
}

async fn send(app: &App, key: &str) -> Seen {
    send_request(app, key, Request::builder().header("x-key", key)).await
}

async fn send_request(app: &App, key: &str, request: http::request::Builder) -> Seen {
    let request = request.body(()).unwrap();
    let started = Instant::now();
    let response = app.clone().oneshot(request).await.unwrap();
    Seen {
        key: key.to_owned(),
        status: response.status(),
        headers: response.headers().clone(),
        started,
        latency: started.elapsed(),
    }
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Sends `per_key` requests for each key, all at once, each from its own task, and waits for
/// every one of them (bounded: a request that hangs fails the test instead of hanging it).
async fn burst(app: &App, keys: &[String], per_key: usize) -> Vec<Seen> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..per_key {
        for key in keys {
            let (app, key) = (app.clone(), key.clone());
            tasks.spawn(async move { send(&app, &key).await });
        }
    }
    let sent = tasks.len();
    let mut seen = Vec::with_capacity(sent);
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(result) = tasks.join_next().await {
            seen.push(result.expect("no request panics"));
        }
    })
    .await
    .expect("every request of the burst completes");
    assert_eq!(seen.len(), sent, "every request sent completed");
    assert!(tasks.is_empty(), "no task is left running");
    seen
}

/// Every request completed within the deadline plus the margin; returns the slowest.
fn assert_within_deadline(seen: &[Seen], what: &str) -> Duration {
    let mut latencies: Vec<Duration> = seen.iter().map(|s| s.latency).collect();
    latencies.sort();
    let max = *latencies.last().unwrap();
    eprintln!(
        "{what}: {} requests, latency min {:?}, median {:?}, max {:?}",
        latencies.len(),
        latencies[0],
        latencies[latencies.len() / 2],
        max
    );
    assert!(
        max < DEADLINE + MARGIN,
        "{what}: the slowest request took {max:?}, more than the {DEADLINE:?} deadline plus {MARGIN:?}"
    );
    max
}

fn assert_failed_open(s: &Seen) {
    assert_eq!(s.status, StatusCode::OK, "fail open admits: {s:?}");
    assert!(!s.has_rate_headers(), "no decision, no headers: {s:?}");
}

fn assert_failed_closed(s: &Seen) {
    assert_eq!(
        s.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "fail closed: {s:?}"
    );
    assert_eq!(s.header("retry-after"), Some("1"), "{s:?}");
    assert!(!s.has_rate_headers(), "no decision, no headers: {s:?}");
}

/// Every response came from the local limiter, whose limit is `LIMIT / divisor`: exactly that
/// many admitted per key, with the remaining counts of a fresh key, and the rest limited.
fn assert_decided_locally(seen: &[Seen], divisor: usize) {
    let local = LIMIT / divisor;
    let mut by_key: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
    for s in seen {
        assert_eq!(
            s.header("x-ratelimit-limit"),
            Some(local.to_string().as_str()),
            "decided by the local limiter, with the divided limit: {s:?}"
        );
        by_key.entry(&s.key).or_default().push(s);
    }
    for (key, seen) in by_key {
        let admitted: BTreeSet<u64> = seen
            .iter()
            .filter(|s| s.status == StatusCode::OK)
            .map(|s| s.header("x-ratelimit-remaining").unwrap().parse().unwrap())
            .collect();
        assert_eq!(
            admitted,
            (0..local as u64).collect(),
            "{key}: exactly {local} admitted, each leaving one less"
        );
        let limited = seen
            .iter()
            .filter(|s| s.status == StatusCode::TOO_MANY_REQUESTS)
            .inspect(|s| assert!(s.header("retry-after").is_some(), "{s:?}"))
            .count();
        assert_eq!(
            limited,
            seen.len() - local,
            "{key}: every other request limited"
        );
    }
}

/// Polls with real decisions (cost 1, on a key of their own) until Redis decides again;
/// returns how long that took.
async fn until_redis_decides(layer: &RateLimitLayer<RedisStore>, within: Duration) -> Duration {
    let started = Instant::now();
    let probe = Key::from("recovery-probe");
    loop {
        if layer.check(&probe, 1).await.is_ok() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "Redis did not decide again within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Decisions on a fresh key are exact: `LIMIT` admitted, each with one less remaining, then 429.
async fn assert_exact(app: &App, key: &str) {
    for i in 1..=LIMIT {
        let s = send(app, key).await;
        assert_eq!(s.status, StatusCode::OK, "request {i} on {key}: {s:?}");
        assert_eq!(
            s.header("x-ratelimit-limit"),
            Some(LIMIT.to_string().as_str())
        );
        assert_eq!(
            s.header("x-ratelimit-remaining"),
            Some((LIMIT - i).to_string().as_str()),
            "request {i} on {key}"
        );
    }
    let s = send(app, key).await;
    assert_eq!(s.status, StatusCode::TOO_MANY_REQUESTS, "{s:?}");
    assert_eq!(s.header("x-ratelimit-remaining"), Some("0"));
    assert!(s.header("retry-after").is_some());
}

/// Runs blocking work (processes, signals, polling) without stalling a runtime worker.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn signal(server: &RedisServer, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &server.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}

/// The decisions Redis ran: `FCALL`s of the decision function, or `EVALSHA`s of the script.
fn decisions(server: &RedisServer) -> u64 {
    server.calls("fcall") + server.calls("evalsha")
}

fn wait_for_ping(server: &RedisServer) {
    blocking(|| {
        wait_until(
            Duration::from_secs(10),
            "redis-server to answer PING",
            || server.cli(&["PING"]) == "PONG",
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Faults under concurrent load
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_closed_within_the_deadline_and_is_exact_after_a_restart() {
    let mut server = RedisServer::start();
    let layer = layer(store(&server, DEADLINE).await, FailurePolicy::Closed);
    let app = app(&layer);
    assert!(send(&app, "warm-up").await.decided_by_redis());

    blocking(|| server.kill());
    let seen = burst(&app, &keys("killed", KEYS), PER_KEY).await;
    assert_within_deadline(&seen, "killed (SIGKILL), fail closed");
    seen.iter().for_each(assert_failed_closed);

    blocking(|| server.restart());
    let back = until_redis_decides(&layer, Duration::from_secs(1)).await;
    eprintln!("killed: decisions again {back:?} after redis-server was up again");
    assert_exact(&app, "after-restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_sigstop_fails_open_at_the_deadline_and_is_exact_after_sigcont() {
    let server = RedisServer::start();
    let layer = layer(store(&server, DEADLINE).await, FailurePolicy::Open);
    let app = app(&layer);
    assert!(send(&app, "warm-up").await.decided_by_redis());

    signal(&server, "-STOP");
    let seen = burst(&app, &keys("stopped", KEYS), PER_KEY).await;
    let min = seen.iter().map(|s| s.latency).min().unwrap();
    assert!(
        min >= DEADLINE,
        "every decision waited for the hung Redis until the deadline: {min:?}"
    );
    assert_within_deadline(&seen, "paused (SIGSTOP), fail open");
    seen.iter().for_each(assert_failed_open);
    // While Redis still hangs, a second burst is cut at the deadline too: nothing piles up.
    let again = burst(&app, &keys("stopped-again", KEYS), PER_KEY).await;
    assert_within_deadline(&again, "paused (SIGSTOP), second burst");
    again.iter().for_each(assert_failed_open);

    signal(&server, "-CONT");
    let back = until_redis_decides(&layer, Duration::from_secs(1)).await;
    eprintln!("SIGSTOP: decisions again {back:?} after SIGCONT");
    assert_exact(&app, "after-sigcont").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_decides_locally_with_the_divided_limit() {
    let server = RedisServer::start();
    let divisor = 2;
    let layer = layer(
        store(&server, DEADLINE).await,
        FailurePolicy::Local {
            divisor: divisor as u32,
        },
    );
    let app = app(&layer);
    assert!(send(&app, "warm-up").await.decided_by_redis());

    let paused_at = Instant::now();
    assert_eq!(
        blocking(|| server.cli(&["CLIENT", "PAUSE", "2000", "ALL"])),
        "OK"
    );
    let seen = burst(&app, &keys("paused", KEYS), PER_KEY).await;
    assert_within_deadline(&seen, "CLIENT PAUSE 2000 ALL, local fallback");
    assert_decided_locally(&seen, divisor);

    // The pause ends by itself 2 s after it began; decisions resume within a second of that.
    let pause = Duration::from_secs(2);
    let within =
        (paused_at + pause + Duration::from_secs(1)).saturating_duration_since(Instant::now());
    until_redis_decides(&layer, within).await;
    let back = paused_at.elapsed();
    eprintln!("CLIENT PAUSE: decisions again {back:?} after the 2 s pause began");
    assert!(back >= pause, "Redis really was paused: {back:?}");
    assert_exact(&app, "after-pause").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_redis_decides_locally_and_is_exact_once_memory_is_freed() {
    let server = RedisServer::start();
    let divisor = 2;
    let layer = layer(
        store(&server, DEADLINE).await,
        FailurePolicy::Local {
            divisor: divisor as u32,
        },
    );
    let app = app(&layer);
    assert!(send(&app, "warm-up").await.decided_by_redis());

    blocking(|| {
        assert_eq!(
            server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]),
            "OK"
        );
        // A 4 MB value, then a 1 MB limit: every write is refused.
        server.cli(&["SETRANGE", "filler", "4000000", "x"]);
        assert_eq!(server.cli(&["CONFIG", "SET", "maxmemory", "1mb"]), "OK");
        let refused = server.cli(&["SET", "some-key", "1"]);
        assert!(refused.contains("OOM"), "writes fail: {refused}");
    });
    let seen = burst(&app, &keys("oom", KEYS), PER_KEY).await;
    assert_within_deadline(&seen, "out of memory, local fallback");
    assert_decided_locally(&seen, divisor);

    blocking(|| {
        assert_eq!(server.cli(&["DEL", "filler"]), "1");
        assert_eq!(server.cli(&["CONFIG", "SET", "maxmemory", "0"]), "OK");
    });
    let back = until_redis_decides(&layer, Duration::from_secs(1)).await;
    eprintln!("OOM: decisions again {back:?} after the memory was freed");
    assert_exact(&app, "after-oom").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_redis_under_load_fails_closed_only_while_it_is_down() {
    let mut server = RedisServer::start();
    let layer = layer(store(&server, DEADLINE).await, FailurePolicy::Closed);
    let app = app(&layer);

    // 50 workers send requests one after another, each on a key of its own, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let decided = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..50 {
        let (app, stop, decided) = (app.clone(), stop.clone(), decided.clone());
        workers.spawn(async move {
            let mut seen = Vec::new();
            for i in 0..5_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let s = send(&app, &format!("w{w}-{i}")).await;
                if s.decided_by_redis() {
                    decided.fetch_add(1, Ordering::Relaxed);
                }
                seen.push(s);
                // Pacing, so that a worker does not spin while Redis refuses connections.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            seen
        });
    }
    let count = || decided.load(Ordering::Relaxed);
    blocking(|| {
        wait_until(Duration::from_secs(10), "load before the restart", || {
            count() >= 200
        })
    });

    blocking(|| server.restart());
    let back = until_redis_decides(&layer, Duration::from_secs(1)).await;
    let recovered = Instant::now();
    let before = count();
    blocking(|| {
        wait_until(Duration::from_secs(10), "load after the restart", || {
            count() >= before + 200
        })
    });
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(result) = workers.join_next().await {
            seen.extend(result.expect("no worker panics"));
        }
    })
    .await
    .expect("every worker stops");

    assert_within_deadline(&seen, "restart under load, fail closed");
    let mut failed = 0;
    for s in &seen {
        if s.decided_by_redis() {
            assert_eq!(s.status, StatusCode::OK, "a fresh key: {s:?}");
            assert_eq!(s.header("x-ratelimit-remaining"), Some("9"), "{s:?}");
        } else {
            assert_failed_closed(s);
            assert!(
                s.started < recovered,
                "no failure once Redis decided again: {s:?}"
            );
            failed += 1;
        }
    }
    eprintln!(
        "restart: {} requests, {failed} answered 503 while Redis was down; decisions again {back:?} after it was up",
        seen.len()
    );
    assert!(failed > 0, "the restart was felt");
    assert!(
        blocking(|| server.calls("eval")) >= 1,
        "the restarted Redis had lost the script, which was sent again with EVAL"
    );
    assert_exact(&app, "after-restart").await;
}

// ---------------------------------------------------------------------------------------------
// The circuit breaker
// ---------------------------------------------------------------------------------------------

/// A layer in front of `server` with a breaker that opens after 3 failures for 200 ms of
/// `clock` (a manual clock, so the breaker's periods are exact and nothing sleeps).
async fn breaker_layer(server: &RedisServer, clock: &ManualClock) -> RateLimitLayer<RedisStore> {
    builder(store(server, DEADLINE).await)
        .on_store_error(FailurePolicy::Open)
        .circuit_breaker(Some(CircuitBreaker::new(3, OPEN_FOR)))
        .clock(clock.clone())
        .build()
        .unwrap()
}

const OPEN_FOR: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuit_breaker_stops_calling_a_paused_redis_probes_and_closes() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let layer = breaker_layer(&server, &clock).await;
    let app = app(&layer);
    let key = "b";
    assert_eq!(
        send(&app, key).await.header("x-ratelimit-remaining"),
        Some("9")
    );
    let evalsha_before = blocking(|| decisions(&server));

    signal(&server, "-STOP");
    // Three decisions wait for the deadline, fail, and open the breaker.
    for _ in 0..3 {
        let s = send(&app, key).await;
        assert!(s.latency >= DEADLINE, "{s:?}");
        assert_failed_open(&s);
    }
    // Open: a hundred decisions in a row go straight to the failure policy.
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for _ in 0..100 {
        let s = send(&app, key).await;
        assert_failed_open(&s);
        slowest = slowest.max(s.latency);
    }
    let open = started.elapsed();
    eprintln!("breaker open: 100 decisions in {open:?}, slowest {slowest:?}");
    assert!(
        open < Duration::from_secs(1),
        "an open breaker costs no latency (100 deadlines would be 10 s): {open:?}"
    );

    // After open_for, one probe goes to Redis (which still hangs), fails, and opens it again.
    clock.advance(OPEN_FOR);
    let probe = send(&app, key).await;
    assert!(
        probe.latency >= DEADLINE,
        "the probe went to Redis: {probe:?}"
    );
    assert_failed_open(&probe);
    let s = send(&app, key).await;
    assert!(s.latency < DEADLINE, "open again: {s:?}");
    assert_failed_open(&s);

    signal(&server, "-CONT");
    wait_for_ping(&server);
    // The decisions that timed out had been sent, and ran once Redis went on: each charged one
    // unit, none was sent twice, and none of the 100 + 1 made while the breaker was open was
    // sent at all.
    let ran = blocking(|| decisions(&server)) - evalsha_before;
    eprintln!("breaker: {ran} EVALSHA ran after SIGCONT (3 failed decisions and 1 failed probe)");
    assert!(ran <= 3 + 1, "{ran} EVALSHA");
    let remaining = LIMIT as u64 - 1 - ran;

    // Redis is back, but the breaker does not know until its next probe.
    assert_failed_open(&send(&app, key).await);
    clock.advance(OPEN_FOR);
    let probe = send(&app, key).await;
    assert_eq!(probe.status, StatusCode::OK, "{probe:?}");
    assert_eq!(
        probe.header("x-ratelimit-remaining"),
        Some((remaining - 1).to_string().as_str()),
        "closed, and exact: {probe:?}"
    );
    for remaining in (0..remaining - 1).rev() {
        let s = send(&app, key).await;
        assert_eq!(
            s.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str()),
            "{s:?}"
        );
    }
    assert_eq!(send(&app, key).await.status, StatusCode::TOO_MANY_REQUESTS);
    let evalsha = blocking(|| decisions(&server)) - evalsha_before;
    assert_eq!(
        evalsha,
        ran + remaining + 1,
        "one EVALSHA per decision made with the breaker closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_probe_does_not_keep_the_breaker_open() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let layer = breaker_layer(&server, &clock).await;
    let app = app(&layer);
    assert!(send(&app, "c").await.decided_by_redis());

    signal(&server, "-STOP");
    for _ in 0..3 {
        assert_failed_open(&send(&app, "c").await);
    }
    clock.advance(OPEN_FOR);
    // The probe's request is dropped before its decision (a client that hung up).
    let probe = app
        .clone()
        .oneshot(Request::builder().header("x-key", "c").body(()).unwrap());
    assert!(
        tokio::time::timeout(DEADLINE / 4, probe).await.is_err(),
        "the probe was still waiting for Redis"
    );
    signal(&server, "-CONT");
    wait_for_ping(&server);

    // A later period brings another probe, which finds Redis back and closes the breaker.
    let mut closed = false;
    for _ in 0..3 {
        clock.advance(OPEN_FOR);
        if send(&app, "c").await.decided_by_redis() {
            closed = true;
            break;
        }
    }
    assert!(
        closed,
        "the breaker stayed open after its probe was cancelled"
    );
    assert!(send(&app, "c").await.decided_by_redis());
}

// ---------------------------------------------------------------------------------------------
// SCRIPT FLUSH
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_in_a_loop_fails_no_decision() {
    flush_in_a_loop_fails_no_decision(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_in_a_loop_fails_no_decision() {
    flush_in_a_loop_fails_no_decision(true).await;
}

/// Redis loses the decision script (`SCRIPT FLUSH`) or function (`FUNCTION FLUSH`) again and
/// again while decisions run: each is made once, none fails, none is counted twice.
async fn flush_in_a_loop_fails_no_decision(functions: bool) {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .deadline(Duration::from_secs(10))
        .functions(functions)
        .build()
        .await
        .expect("connect to the test redis-server");
    assert_eq!(store.uses_functions(), functions);
    let flush = if functions { "FUNCTION" } else { "SCRIPT" };
    let layer = builder(store)
        .on_store_error(FailurePolicy::Closed)
        .build()
        .unwrap();
    let app = app(&layer);

    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let (stop, port) = (stop.clone(), server.port.to_string());
        std::thread::spawn(move || {
            let mut flushes = 0;
            while !stop.load(Ordering::Relaxed) && flushes < 10_000 {
                let out = Command::new("redis-cli")
                    .args(["-h", "127.0.0.1", "-p", &port, flush, "FLUSH"])
                    .output()
                    .expect("run redis-cli");
                assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
                flushes += 1;
            }
            flushes
        })
    };
    // 10 rounds of 200 requests at once: 20 per key, over 10 keys of 10 per hour.
    let keys = keys("flushed", 10);
    let mut seen = Vec::new();
    for _ in 0..10 {
        seen.extend(burst(&app, &keys, 20).await);
    }
    stop.store(true, Ordering::Relaxed);
    let flushes = blocking(|| flusher.join().expect("the flusher does not panic"));

    let unavailable = seen
        .iter()
        .filter(|s| s.status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!(unavailable, 0, "no decision failed");
    assert!(seen.iter().all(Seen::decided_by_redis));
    for key in &keys {
        let admitted = seen
            .iter()
            .filter(|s| &s.key == key && s.status == StatusCode::OK)
            .count();
        assert_eq!(
            admitted, LIMIT,
            "{key}: exactly the limit, nothing counted twice"
        );
    }
    let (called, eval) = blocking(|| (decisions(&server), server.calls("eval")));
    eprintln!(
        "{flush} FLUSH: {flushes} flushes during {} decisions; {called} calls, {eval} EVAL (after a miss)",
        seen.len()
    );
    assert!(flushes > 0);
    assert!(eval > 0, "the flushes really made Redis lose the script");
    if functions {
        // The library is loaded again once the flushes stop (by the first decision that
        // finds it missing).
        send(&app, "after").await;
        let name = RedisStore::function_name().to_owned();
        blocking(|| {
            wait_until(
                Duration::from_secs(10),
                "the function to be loaded again",
                || server.cli(&["FUNCTION", "LIST"]).contains(&name),
            )
        });
    }
}

// ---------------------------------------------------------------------------------------------
// The deny cache
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_answers_a_flood_on_a_limited_key_without_calling_redis() {
    let server = RedisServer::start();
    // One clock for the layer and the store: the limited period ends only when it is advanced.
    let clock = ManualClock::new();
    let store = store_with(&server, Duration::from_secs(10), Some(&clock)).await;
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("3/h").name("api"))
        .key(HeaderKey::try_new("x-key").unwrap())
        .store(store)
        .deny_cache(1_000)
        .clock(clock.clone())
        .build()
        .unwrap();
    let app = app(&layer);
    for _ in 0..3 {
        assert_eq!(send(&app, "hot").await.status, StatusCode::OK);
    }
    let denied = send(&app, "hot").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, 1_200, "one unit every 20 minutes");
    let before = blocking(|| decisions(&server));
    assert_eq!(before, 4);

    let flood = burst(&app, &["hot".to_owned()], 500).await;
    for s in &flood {
        assert_eq!(s.status, StatusCode::TOO_MANY_REQUESTS, "{s:?}");
        assert_eq!(s.header("retry-after"), Some("1200"), "{s:?}");
        assert_eq!(s.header("x-ratelimit-remaining"), Some("0"), "{s:?}");
    }
    assert_eq!(
        blocking(|| decisions(&server)),
        before,
        "500 limited requests, no Redis call"
    );
    // Another key still goes to Redis.
    assert_eq!(send(&app, "cold").await.status, StatusCode::OK);
    assert_eq!(blocking(|| decisions(&server)), before + 1);

    clock.advance(Duration::from_secs(retry_after));
    let after = send(&app, "hot").await;
    assert_eq!(after.status, StatusCode::OK, "admitted again: {after:?}");
    assert_eq!(after.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        blocking(|| decisions(&server)),
        before + 2,
        "the request after the retry time reached Redis"
    );
}

/// A denial of a costly request says nothing about a cheaper one: the deny cache must not
/// refuse a request the store would admit.
#[tokio::test]
async fn deny_cache_does_not_refuse_a_cheaper_request_than_the_one_denied() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("10/min").name("api"))
        .key(HeaderKey::try_new("x-key").unwrap())
        .cost(|r| {
            r.headers()
                .get("x-cost")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        })
        .store(MemoryStore::with_clock(clock.clone()))
        .deny_cache(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    let app = app(&layer);
    let costing = |cost: u32| {
        Request::builder()
            .header("x-key", "k")
            .header("x-cost", cost)
    };
    let big = send_request(&app, "k", costing(8)).await;
    assert_eq!(big.status, StatusCode::OK);
    assert_eq!(big.header("x-ratelimit-remaining"), Some("2"));
    let too_big = send_request(&app, "k", costing(5)).await;
    assert_eq!(too_big.status, StatusCode::TOO_MANY_REQUESTS);
    // Two units are left: a request for one is admitted, and another for five still is not.
    let small = send_request(&app, "k", costing(1)).await;
    assert_eq!(small.status, StatusCode::OK, "{small:?}");
    assert_eq!(small.header("x-ratelimit-remaining"), Some("1"));
    let denied = send_request(&app, "k", costing(5)).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
}

// ---------------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------------

/// A recorder that keeps the last value of every counter and gauge, and the number of values
/// of every histogram, by name and labels.
#[derive(Clone, Debug, Default)]
struct Recorded(Arc<Mutex<BTreeMap<String, f64>>>);

struct Handle {
    name: String,
    values: Recorded,
}

impl Recorded {
    fn get(&self, name: &str) -> f64 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0.0)
    }

    fn handle(&self, key: &metrics::Key) -> Arc<Handle> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = if labels.is_empty() {
            key.name().to_owned()
        } else {
            format!("{}{{{}}}", key.name(), labels.join(","))
        };
        Arc::new(Handle {
            name,
            values: self.clone(),
        })
    }
}

impl Handle {
    fn update(&self, f: impl FnOnce(f64) -> f64) {
        let mut values = self.values.0.lock().unwrap();
        let value = values.entry(self.name.clone()).or_default();
        *value = f(*value);
    }
}

impl metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.update(|v| v + value as f64);
    }
    fn absolute(&self, value: u64) {
        self.update(|_| value as f64);
    }
}

impl metrics::GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }
    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

impl metrics::HistogramFn for Handle {
    fn record(&self, _value: f64) {
        self.update(|n| n + 1.0);
    }
}

impl metrics::Recorder for Recorded {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.handle(key))
    }
}

/// The recorder is local to this thread, so everything runs on a current-thread runtime here:
/// the store's connection task included.
#[test]
fn metrics_count_decisions_degraded_decisions_breaker_and_deny_cache_hits() {
    let mut server = RedisServer::start();
    let recorded = Recorded::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorded, || {
        runtime.block_on(async {
            let clock = ManualClock::new();
            let layer = RateLimitLayer::builder()
                .policy(Policy::gcra("2/h").name("api"))
                .key(HeaderKey::try_new("x-key").unwrap())
                .store(store(&server, Duration::from_secs(10)).await)
                .on_store_error(FailurePolicy::Open)
                .circuit_breaker(Some(CircuitBreaker::new(3, Duration::from_secs(60))))
                .deny_cache(100)
                .clock(clock)
                .build()
                .unwrap();
            let app = app(&layer);
            let statuses =
                |seen: Vec<Seen>| seen.iter().map(|s| s.status.as_u16()).collect::<Vec<_>>();
            let mut seen = Vec::new();
            for _ in 0..8 {
                seen.push(send(&app, "a").await);
            }
            // Two admitted, one limited by Redis, five by the deny cache.
            assert_eq!(statuses(seen), [200, 200, 429, 429, 429, 429, 429, 429]);

            server.kill();
            let mut seen = Vec::new();
            for _ in 0..10 {
                seen.push(send(&app, "b").await);
            }
            seen.iter().for_each(assert_failed_open);
        });
    });
    let expected = [
        ("ratelimit_decisions_total{outcome=allowed,policy=api}", 2.0),
        ("ratelimit_decisions_total{outcome=limited,policy=api}", 1.0),
        ("ratelimit_deny_cache_hits_total", 5.0),
        (
            "ratelimit_degraded_total{failure_policy=open,reason=failed}",
            3.0,
        ),
        (
            "ratelimit_degraded_total{failure_policy=open,reason=circuit_open}",
            7.0,
        ),
        ("ratelimit_circuit_open", 1.0),
    ];
    for (name, value) in expected {
        assert_eq!(
            recorded.get(name),
            value,
            "{name} in {:?}",
            recorded.0.lock().unwrap()
        );
    }
    // One store latency per call to Redis: neither the deny cache's answers nor the requests
    // refused by the open breaker asked it.
    assert_eq!(recorded.get("ratelimit_store_duration_seconds"), 6.0);
}
