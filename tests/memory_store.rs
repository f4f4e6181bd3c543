//! The in-memory store behind the layer: exactness under concurrency, the bound on its size,
//! expiry and sweeping, and what eviction may and may not forget.
//!
//! The store is driven through the layer (a `Check` cannot be built outside the crate), with a
//! `ManualClock` that only moves when told.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::Barrier;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_ratelimit::headers::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
use tower_ratelimit::key::{self, GlobalKey, Key, KeyExtractor, KeyRejection, RequestRef};
use tower_ratelimit::{
    Algorithm, Decision, ManualClock, MemoryStore, Policy, RateLimitLayer, RateLimitLayerBuilder,
    body::ResponseBody, calendar::Calendar,
};

type Reply = Response<ResponseBody<Full<Bytes>>>;

/// A minute boundary, so that minute-long fixed windows start with the test.
const MINUTE_ALIGNED: u64 = 16_666_667 * 60_000_000;

/// The key in the `x-id` header, as a number.
fn id_key() -> impl KeyExtractor {
    key::from_fn(|req: &RequestRef<'_>| {
        req.headers()
            .get("x-id")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map(Key::from)
            .ok_or_else(|| KeyRejection::bad_request("missing_id", "send an x-id header"))
    })
}

fn with_id(id: u64) -> Request<()> {
    Request::builder().header("x-id", id).body(()).unwrap()
}

/// Wraps an inner service that answers 200 and records the decisions it sees.
fn wrap(
    layer: RateLimitLayer,
    decisions: Arc<Mutex<Vec<Decision>>>,
) -> impl Service<Request<()>, Response = Reply, Error = Infallible, Future: Send> + Clone + Send + 'static
{
    ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |req: Request<()>| {
            if let Some(d) = req.extensions().get::<Decision>() {
                decisions.lock().unwrap().push(d.clone());
            }
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }))
}

fn num(r: &Reply, name: impl http::header::AsHeaderName) -> Option<u64> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().parse().unwrap())
}

// ---------------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_requests_on_one_key_admit_exactly_the_limit() {
    const TASKS: usize = 1_000;
    const LIMIT: u64 = 100;
    for alg in Algorithm::ALL {
        let clock = ManualClock::new();
        let layer = RateLimitLayer::builder()
            .policy(Policy::new(alg, "100/s"))
            .key(GlobalKey)
            .store(MemoryStore::with_clock(clock.clone()))
            .build()
            .unwrap();
        let svc = wrap(layer, Arc::default());
        let barrier = Arc::new(Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let svc = svc.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let r = svc.oneshot(Request::new(())).await.unwrap();
                    (r.status(), num(&r, X_RATELIMIT_REMAINING).unwrap())
                })
            })
            .collect();
        let mut admitted_remaining = Vec::new();
        let mut denied = 0;
        for task in tasks {
            match task.await.unwrap() {
                (StatusCode::OK, remaining) => admitted_remaining.push(remaining),
                (StatusCode::TOO_MANY_REQUESTS, remaining) => {
                    assert_eq!(remaining, 0, "{alg}");
                    denied += 1;
                }
                (status, _) => panic!("{alg}: unexpected {status}"),
            }
        }
        assert_eq!(admitted_remaining.len() as u64, LIMIT, "{alg}: admitted");
        assert_eq!(denied, TASKS - LIMIT as usize, "{alg}: denied");
        // Every admitted request saw its own count: no two were decided on the same state.
        admitted_remaining.sort_unstable();
        assert_eq!(
            admitted_remaining,
            (0..LIMIT).collect::<Vec<_>>(),
            "{alg}: remaining values"
        );
    }
}

/// Polls a future that is ready at once (the memory store's `check`).
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(f).poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("the memory store decides at once"),
    }
}

/// The threads of the stress tests, the requests each makes, and the limit they race for.
const THREADS: usize = 8;
const EACH: usize = 10_000;
const LIMIT: u64 = 5_000;

/// [`THREADS`] threads released together each make [`EACH`] requests with `request` (which
/// gives the remaining count of an admitted request, `None` for a denied one); asserts that
/// exactly [`LIMIT`] were admitted, each with its own remaining count.
fn race_admits_exactly_the_limit<F: Fn() -> Option<u64> + Sync>(request: F, what: &str) {
    let start = std::sync::Barrier::new(THREADS);
    let mut remaining: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    (0..EACH).filter_map(|_| request()).collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert_eq!(remaining.len() as u64, LIMIT, "{what}: admitted");
    remaining.sort_unstable();
    let each_once = (0..LIMIT).collect::<Vec<_>>();
    assert_eq!(remaining, each_once, "{what}: remaining values");
}

#[test]
fn eight_threads_on_one_hot_key_admit_exactly_the_limit_every_round() {
    // GCRA's and the fixed window's states are packed and decided under the shard's shared
    // lock (GCRA's by compare-and-swap, the window's with its word claimed); the others take
    // the exclusive lock. 8 threads x 10,000 requests race on one key, the
    // clock still: exactly the limit is admitted, each admitted request saw its own count, and
    // a new key each round starts with the threads racing to insert it. With one lock per
    // shard and with a reader lock per thread group (`per_thread_reads`), whose writers take
    // every reader lock.
    for per_thread in [false, true] {
        for alg in Algorithm::ALL {
            let packed = matches!(alg, Algorithm::Gcra | Algorithm::FixedWindow);
            let rounds = if packed { 10 } else { 2 };
            let store = MemoryStore::builder()
                .per_thread_reads(per_thread)
                .clock(ManualClock::new())
                .build();
            let layer = RateLimitLayer::builder()
                .policy(Policy::new(alg, "5000/h"))
                .store(store)
                .build()
                .unwrap();
            for round in 0..rounds {
                let key = Key::from(round);
                let check = || {
                    let decision = ready(layer.check(&key, 1)).unwrap();
                    decision
                        .is_allowed()
                        .then(|| decision.tightest().remaining())
                };
                let what = format!("{alg} round {round}, per-thread reads {per_thread}");
                race_admits_exactly_the_limit(check, &what);
            }
        }
    }
}

#[test]
fn eight_threads_through_the_layer_on_one_hot_key_admit_exactly_the_limit() {
    // The layer's own fast path: one policy, nothing reading a `Decision` (no extension, legacy
    // headers only), so each request is decided alone on the borrowed tier and key and its
    // headers are made from the verdict. 8 threads x 10,000 requests race on one key through
    // the service, the clock still: exactly the limit is admitted, each admitted response
    // shows its own remaining count, and every denied one shows 0.
    for alg in Algorithm::ALL {
        let rounds = if alg == Algorithm::Gcra { 3 } else { 1 };
        for round in 0..rounds {
            let layer = RateLimitLayer::builder()
                .policy(Policy::new(alg, "5000/h"))
                .key(GlobalKey)
                .decision_extension(false)
                .store(MemoryStore::with_clock(ManualClock::new()))
                .build()
                .unwrap();
            let svc = wrap(layer, Arc::default());
            let request = || {
                let r = ready(svc.clone().call(Request::new(()))).unwrap();
                let left = num(&r, X_RATELIMIT_REMAINING).unwrap();
                match r.status() {
                    StatusCode::OK => Some(left),
                    StatusCode::TOO_MANY_REQUESTS => {
                        assert_eq!(left, 0, "a denied request shows none left");
                        None
                    }
                    status => panic!("unexpected {status}"),
                }
            };
            race_admits_exactly_the_limit(request, &format!("{alg} round {round}"));
        }
    }
}

#[test]
fn the_layer_chooses_per_thread_reads_for_packed_policies_in_a_store_of_its_own() {
    // Unset, the store's locks are chosen by the layer it is given to alone: a reader lock per
    // thread group for one GCRA enforced up front (one compare-and-swap a request), or two to
    // four GCRAs and fixed windows of the layer's key (their words claimed), one lock for
    // everything that takes the exclusive path.
    let reads =
        |builder: RateLimitLayerBuilder| builder.build().unwrap().store().per_thread_reads();
    let one = |policy: Policy| RateLimitLayer::builder().policy(policy);
    let hourly = || Policy::fixed_window("1000/h");
    assert!(reads(one(Policy::gcra("10/s"))));
    assert!(reads(one(Policy::gcra("10/s").name("a")).key(GlobalKey)));
    assert!(reads(
        one(Policy::gcra("10/s")).policy(Policy::gcra("1000/h"))
    ));
    assert!(reads(one(Policy::gcra("10/s")).policy(hourly())));
    let four = (0..3).fold(one(Policy::gcra("10/s")), |b, i| {
        b.policy(hourly().name(format!("h{i}")))
    });
    assert!(reads(four));
    let five = (0..4).fold(one(Policy::gcra("10/s")), |b, i| {
        b.policy(hourly().name(format!("h{i}")))
    });
    assert!(!reads(five));
    let daily = Policy::fixed_window("1000/d").calendar(Calendar::utc());
    assert!(!reads(one(Policy::gcra("10/s")).policy(daily)));
    assert!(!reads(
        one(Policy::gcra("10/s")).policy(Policy::sliding_window("1000/h"))
    ));
    assert!(!reads(
        one(Policy::gcra("10/s")).policy(hourly().key(GlobalKey))
    ));
    assert!(!reads(one(Policy::gcra("10/s")).policy(hourly().shadow())));
    // A fixed window alone keeps one lock: no measure yet says reader locks pay for it.
    assert!(!reads(one(hourly())));
    assert!(!reads(one(Policy::sliding_log("10/s"))));
    assert!(!reads(one(Policy::token_bucket("10/s"))));
    assert!(!reads(one(Policy::gcra("10/s").shadow())));
    assert!(!reads(one(
        Policy::gcra("10/s").wait_up_to(Duration::from_secs(1))
    )));
    assert!(!reads(one(Policy::concurrency(5))));
    assert!(!reads(one(Policy::gcra("10/s")).deny_cache(100)));
    // Told, the store keeps what it was told.
    let told = |yes| MemoryStore::builder().per_thread_reads(yes).build();
    assert!(!reads(one(Policy::gcra("10/s")).store(told(false))));
    assert!(reads(one(Policy::sliding_log("10/s")).store(told(true))));
    // A store of its own but never used: chosen; shared with a clone, or used before: kept.
    assert!(reads(one(Policy::gcra("10/s")).store(MemoryStore::new())));
    let shared = MemoryStore::new();
    assert!(!reads(one(Policy::gcra("10/s")).store(shared.clone())));
    let used = {
        let store = MemoryStore::new();
        let layer = one(Policy::sliding_log("10/s"))
            .store(store.clone())
            .build()
            .unwrap();
        assert!(
            ready(layer.check(&Key::from(1u64), 1))
                .unwrap()
                .is_allowed()
        );
        store
    };
    let layer = one(Policy::gcra("10/s")).store(used).build().unwrap();
    assert!(!layer.store().per_thread_reads());
    assert_eq!(
        layer.store().len(),
        1,
        "the state of the layer before is kept"
    );
}

/// Two layers on one store (two instances' worth of tasks, on 8 threads) race on four keys
/// under two and three policies of every algorithm pair: each key is admitted the smallest
/// limit, and every policy is charged exactly what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn racing_layers_charge_several_policies_all_or_nothing() {
    for per_thread_reads in [false, true] {
        for (i, set) in support::lease::several_policy_sets().iter().enumerate() {
            let store = MemoryStore::builder()
                .per_thread_reads(per_thread_reads)
                .clock(ManualClock::new())
                .build();
            support::lease::race_several(store.clone(), store, &format!("s{i}"), set, 800, 4).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_requests_under_two_policies_are_all_or_nothing() {
    two_policies_are_all_or_nothing(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn with_per_thread_reads_two_policies_are_all_or_nothing() {
    // The exclusive path takes every reader lock of each shard it locks, in the same order.
    two_policies_are_all_or_nothing(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn a_policy_decided_alone_and_beside_another_counts_every_admission_once() {
    // One store, two layers: `both` decides `a` (100, a GCRA or a fixed window) and the GCRA
    // `b` (60) of one key together, on their packed words under the shard's shared lock;
    // `alone` decides `a` by itself, on the same word (by compare-and-swap, or for the window
    // by claiming it). Four tasks on each race on 8 threads. `a` admits exactly 100 in all,
    // `b` exactly what `both` admitted: no admission is lost or counted twice, whichever
    // decision holds the word.
    for (alg, per_thread_reads) in [Algorithm::Gcra, Algorithm::FixedWindow]
        .into_iter()
        .flat_map(|alg| [(alg, false), (alg, true)])
    {
        let store = MemoryStore::builder()
            .per_thread_reads(per_thread_reads)
            .clock(ManualClock::new())
            .build();
        let a = || Policy::new(alg, "100/h").name("a");
        let both = RateLimitLayer::builder()
            .store(store.clone())
            .policy(a())
            .policy(Policy::gcra("60/h").name("b"))
            .build()
            .unwrap();
        let alone = RateLimitLayer::builder()
            .store(store)
            .policy(a())
            .build()
            .unwrap();
        let key = Key::from("k");
        // The key's rows are made by this one (under the exclusive lock); the race then decides
        // on their words.
        assert!(both.check(&key, 1).await.unwrap().is_allowed());
        let barrier = Arc::new(Barrier::new(8));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let layer = if i % 2 == 0 {
                    both.clone()
                } else {
                    alone.clone()
                };
                let (barrier, key) = (barrier.clone(), key.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut admitted = 0u64;
                    for _ in 0..200 {
                        let decision = layer.check(&key, 1).await.unwrap();
                        admitted += u64::from(decision.is_allowed());
                        // A denial is told a wait within one emission interval (36 s for a
                        // GCRA `a`, 60 s for `b`) or the window (an hour): never a state read
                        // while another decision held it.
                        for o in decision.violated() {
                            let wait = o.retry_after().expect("a retry time");
                            let most = if o.policy() == "a" && alg == Algorithm::FixedWindow {
                                3600
                            } else {
                                60
                            };
                            assert!(wait <= Duration::from_secs(most), "{wait:?}");
                        }
                    }
                    (i % 2 == 0, admitted)
                })
            })
            .collect();
        let (mut by_both, mut by_alone) = (1, 0);
        for task in tasks {
            match task.await.unwrap() {
                (true, n) => by_both += n,
                (false, n) => by_alone += n,
            }
        }
        let what = format!("{alg}, per-thread reads {per_thread_reads}");
        assert_eq!(by_both + by_alone, 100, "{what}");
        assert!(by_both <= 60, "{what}: {by_both}");
        let left = support::lease::remaining(&both, &key).await;
        assert_eq!(left, [0, 60 - by_both], "{what}");
    }
}

async fn two_policies_are_all_or_nothing(per_thread_reads: bool) {
    // A global limit of 100 and 5 per key; 50 keys send 20 requests each. Each key can get at
    // most 5 through, i.e. 250 in all, so the global limit is what binds: exactly 100 are
    // admitted, and only if denials charge nothing (a request denied by one policy charging the
    // other would leave fewer than 100). Concurrent multi-shard checks must not deadlock.
    const KEYS: u64 = 50;
    const PER_KEY: u64 = 20;
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("100/s").name("global").key(GlobalKey))
        .policy(Policy::sliding_log("5/s").name("per-key"))
        .key(id_key())
        .store(
            MemoryStore::builder()
                .shards(8)
                .per_thread_reads(per_thread_reads)
                .clock(clock.clone())
                .build(),
        )
        .build()
        .unwrap();
    let decisions: Arc<Mutex<Vec<Decision>>> = Arc::default();
    let svc = wrap(layer, decisions.clone());
    let barrier = Arc::new(Barrier::new((KEYS * PER_KEY) as usize));
    let tasks: Vec<_> = (0..KEYS * PER_KEY)
        .map(|i| {
            let svc = svc.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let id = i % KEYS;
                (id, svc.oneshot(with_id(id)).await.unwrap().status())
            })
        })
        .collect();
    let mut per_key: HashMap<u64, u64> = HashMap::new();
    let all = async {
        for task in tasks {
            let (id, status) = task.await.unwrap();
            if status == StatusCode::OK {
                *per_key.entry(id).or_default() += 1;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("no deadlock");
    assert_eq!(per_key.values().sum::<u64>(), 100);
    assert!(per_key.values().all(|&n| n <= 5), "{per_key:?}");
    // The global remaining values seen by admitted requests are each of 0..100 once.
    let mut global: Vec<u64> = decisions
        .lock()
        .unwrap()
        .iter()
        .map(|d| d.outcomes()[0].remaining())
        .collect();
    global.sort_unstable();
    assert_eq!(global, (0..100).collect::<Vec<_>>());
}

// ---------------------------------------------------------------------------------------------
// Memory bound, expiry, sweeping
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_flood_of_distinct_keys_stays_within_capacity_and_sweeps_to_zero() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .max_keys(1_000)
        .clock(clock.clone())
        .build();
    assert!(store.capacity() <= 1_000 && store.capacity() > 0);
    assert!(store.is_empty());
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("10/s"))
        .key(id_key())
        .store(store.clone())
        .build()
        .unwrap();
    let svc = wrap(layer, Arc::default());

    for id in 0..50_000u64 {
        let r = svc.clone().oneshot(with_id(id)).await.unwrap();
        // A new key is always admitted, even into a full store: it never shares a bucket.
        assert_eq!(r.status(), StatusCode::OK, "key {id}");
        assert_eq!(num(&r, X_RATELIMIT_REMAINING), Some(9), "key {id}");
        if id % 500 == 0 {
            assert!(
                store.len() <= store.capacity(),
                "{} keys after {id}",
                store.len()
            );
        }
    }
    // Every shard received far more keys than it holds, and eviction makes room for one key at
    // a time, so the store ends up exactly full.
    assert_eq!(store.len(), store.capacity());

    // Nothing has expired yet: a sweep drops nothing.
    assert_eq!(store.sweep(), 0);
    assert_eq!(store.len(), store.capacity());

    // The window (and so every entry) ends 1 s after the clock's start, which is on a second.
    clock.advance(Duration::from_micros(999_999));
    assert_eq!(
        store.sweep(),
        0,
        "one microsecond before the end of the window"
    );
    clock.advance(Duration::from_micros(1));
    assert_eq!(store.sweep(), store.capacity());
    assert_eq!(store.len(), 0);
    assert!(store.is_empty());
}

#[tokio::test]
async fn entries_expire_exactly_when_the_key_is_reset_for_every_algorithm() {
    // A store entry is dropped by `sweep` exactly when the key is back to a fresh state, which
    // is what the decision's `reset_after` (X-RateLimit-Reset) announces.
    for alg in Algorithm::ALL {
        let clock = ManualClock::new();
        clock.advance_micros(123_457);
        let store = MemoryStore::builder()
            .max_keys(500)
            .shards(4)
            .clock(clock.clone())
            .build();
        let decisions: Arc<Mutex<Vec<Decision>>> = Arc::default();
        let layer = RateLimitLayer::builder()
            .policy(Policy::new(alg, "10/s"))
            .key(id_key())
            .store(store.clone())
            .build()
            .unwrap();
        let svc = wrap(layer, decisions.clone());

        for id in 0..2_000u64 {
            let r = svc.clone().oneshot(with_id(id)).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
        }
        assert_eq!(store.len(), store.capacity(), "{alg}");

        let reset = {
            let decisions = decisions.lock().unwrap();
            let reset = decisions[0].tightest().reset_after();
            assert!(
                decisions
                    .iter()
                    .all(|d| d.tightest().reset_after() == reset),
                "{alg}: same time, same usage, same reset"
            );
            reset.as_micros() as u64
        };
        assert!(reset > 0, "{alg}");

        clock.advance_micros(reset - 1);
        assert_eq!(
            store.sweep(),
            0,
            "{alg}: swept before reset_after ({reset} µs)"
        );
        assert_eq!(store.len(), store.capacity(), "{alg}");
        clock.advance_micros(1);
        assert_eq!(
            store.sweep(),
            store.capacity(),
            "{alg}: not swept at reset_after"
        );
        assert!(store.is_empty(), "{alg}");
    }
}

#[tokio::test]
async fn expired_entries_make_room_before_live_ones_are_evicted() {
    // Once a first flood has expired, a full shard drops its expired entries to make room for
    // a new key instead of evicting a live one: new keys keep their state.
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .max_keys(256)
        .shards(4)
        .clock(clock.clone())
        .build();
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s"))
        .key(id_key())
        .store(store.clone())
        .build()
        .unwrap();
    let svc = wrap(layer, Arc::default());
    for id in 0..2_000u64 {
        svc.clone().oneshot(with_id(id)).await.unwrap();
    }
    assert_eq!(store.len(), 256);

    clock.advance(Duration::from_secs(1));
    // 100 new keys over 4 shards of 64 (far fewer than 64 land in any one shard).
    for id in 10_000..10_100u64 {
        let first = svc.clone().oneshot(with_id(id)).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        let second = svc.clone().oneshot(with_id(id)).await.unwrap();
        assert_eq!(
            second.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "key {id} was forgotten"
        );
    }
    assert!(store.len() <= 256);
    // What is left of the first flood has expired; the 100 new keys have not.
    let before = store.len();
    assert_eq!(store.sweep(), before - 100);
    assert_eq!(store.len(), 100);
    clock.advance(Duration::from_secs(1));
    assert_eq!(store.sweep(), 100);
    assert!(store.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Eviction and exactness
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn eviction_does_not_touch_keys_that_expire_later_than_the_flood() {
    // What is asserted: when a full shard has to evict a live entry it takes the one that
    // expires soonest among a sample, so a key whose state expires later than every entry of a
    // flood is never the victim. Such a key keeps its exact state through the flood: every
    // response it gets, before, during and after, is the same as from a control store with the
    // same history and no flood.
    //
    // Here the hot keys are limited by a "3/min" policy (state kept for up to 66 s) and the
    // flood goes through a "10/s" policy on the same store (state kept for at most 1.1 s).
    // The flood puts 5,000 entries in a store of under 1,000, so live entries are evicted.
    //
    // What is not asserted: flood keys may be forgotten (that is the documented cost of the
    // bound), and so may any key whose state expires as soon as the flood's.
    const HOT: u64 = 10;
    for alg in Algorithm::ALL {
        let clock = ManualClock::starting_at(MINUTE_ALIGNED);
        let flooded = MemoryStore::builder()
            .max_keys(1_000)
            .shards(16)
            .clock(clock.clone())
            .build();
        let control = MemoryStore::with_clock(clock.clone());
        let layer = |store: &MemoryStore, quota: &str, name: &str| {
            RateLimitLayer::builder()
                .policy(Policy::new(alg, quota).name(name))
                .key(id_key())
                .store(store.clone())
                .build()
                .unwrap()
        };
        let hot = wrap(layer(&flooded, "3/min", "hot"), Arc::default());
        let hot_control = wrap(layer(&control, "3/min", "hot"), Arc::default());
        let flood = wrap(layer(&flooded, "10/s", "flood"), Arc::default());

        // Sends `n` requests for every hot key to both stores; they must be answered alike.
        // Returns the answers for key 0.
        let both = |n: usize, phase: &'static str| {
            let (hot, hot_control) = (hot.clone(), hot_control.clone());
            async move {
                let mut first = Vec::new();
                for id in 0..HOT {
                    for i in 0..n {
                        let a = answer(&hot.clone().oneshot(with_id(id)).await.unwrap());
                        let b = answer(&hot_control.clone().oneshot(with_id(id)).await.unwrap());
                        assert_eq!(a, b, "{alg}, {phase}: hot key {id}, request {i}");
                        if id == 0 {
                            first.push(a);
                        }
                    }
                }
                first
            }
        };

        let start = both(4, "before the flood").await;
        let statuses: Vec<_> = start.iter().map(|a| a.0).collect();
        assert_eq!(statuses, [200, 200, 200, 429], "{alg}");

        for id in HOT..HOT + 5_000 {
            let r = flood.clone().oneshot(with_id(id)).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{alg}");
        }
        assert_eq!(
            flooded.len(),
            flooded.capacity(),
            "{alg}: the store is full"
        );

        let after = both(1, "right after the flood").await;
        assert_eq!(
            after[0], start[3],
            "{alg}: the same 429 as before the flood"
        );

        let wait = start[3].4.expect("a Retry-After");
        clock.advance(Duration::from_secs(wait));
        let later = both(4, "after Retry-After").await;
        assert_eq!(later[0].0, 200, "{alg}: admitted after Retry-After");

        clock.advance(Duration::from_secs(25));
        both(4, "later still").await;
    }
}

/// `(status, limit, remaining, reset, retry-after)`.
fn answer(r: &Reply) -> (u16, Option<u64>, Option<u64>, Option<u64>, Option<u64>) {
    (
        r.status().as_u16(),
        num(r, X_RATELIMIT_LIMIT),
        num(r, X_RATELIMIT_REMAINING),
        num(r, X_RATELIMIT_RESET),
        num(r, RETRY_AFTER),
    )
}

/// A clock whose first reading waits (up to `HOLD`) until the test lets it go, and which moves
/// one millisecond per reading: it holds one decision between reading the time and using it.
#[derive(Debug)]
struct HeldClock {
    now: AtomicU64,
    entered: SyncSender<()>,
    released: (Mutex<bool>, Condvar),
}

/// How long the held reading waits for the test: long enough for the other decision to run
/// when it can; it cannot when the held one holds the key's lock.
const HOLD: Duration = Duration::from_millis(300);

impl tower_ratelimit::Clock for HeldClock {
    fn now_micros(&self) -> u64 {
        let now = self.now.fetch_add(1_000, Ordering::SeqCst);
        if now == MINUTE_ALIGNED {
            let _ = self.entered.try_send(());
            let (released, wake) = &self.released;
            let guard = released.lock().unwrap();
            let _ = wake.wait_timeout_while(guard, HOLD, |r| !*r).unwrap();
        }
        now
    }
}

#[test]
fn a_decision_reads_the_time_in_the_order_it_is_made() {
    // Decision A reads the time and is held; decision B, on the same key, then runs. If A had
    // read its time before taking the key's lock, B would commit first, at a later time, and A
    // would see time go back: two requests admitted with the same `remaining` (or one
    // skipped). Reading the time under the lock, A decides first and B waits for it.
    let (entered, entered_rx) = sync_channel(1);
    let clock = Arc::new(HeldClock {
        now: AtomicU64::new(MINUTE_ALIGNED),
        entered,
        released: Default::default(),
    });
    let store = MemoryStore::with_clock(clock.clone());
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("5/h").name("held"))
        .store(store)
        .build()
        .unwrap();
    let decide = |layer: RateLimitLayer<MemoryStore>| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let decision = rt.block_on(layer.check(&Key::from(7u64), 1)).unwrap();
        assert!(decision.is_allowed());
        decision.tightest().remaining()
    };
    let a = std::thread::spawn({
        let layer = layer.clone();
        move || decide(layer)
    });
    entered_rx.recv().unwrap();
    let b = decide(layer.clone());
    *clock.released.0.lock().unwrap() = true;
    clock.released.1.notify_all();
    let a = a.join().unwrap();
    assert_eq!(
        (a, b),
        (4, 3),
        "A decided first, then B, each leaving one less"
    );
}
