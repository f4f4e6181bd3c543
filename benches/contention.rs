//! Decisions per second from 1, 2, 4 and 8 threads at once, ours against governor's keyed
//! limiter, on the same keys (row 9 of `scripts/bench.sh`):
//!
//! ```text
//! cargo bench --bench contention -- [RUNS] [SECONDS] [WORKLOAD] [THREADS]
//! ```
//!
//! Four workloads: `spread`, each thread cycling through the same 10,000 keys (from different
//! starting points), `hot`, every thread on one key, `two`, as `spread` with a second policy
//! (a fixed window) decided with the first, and `two_gcra`, the same with a second GCRA
//! (ours only). On a machine with fewer cores than
//! threads the larger counts show oversubscription, and still whether a limiter's cost per
//! decision grows with the threads. Ours is `RateLimitLayer::check` on the
//! memory store (polled once: its future is always ready), with its defaults (`ours`: the layer
//! chooses a reader lock per thread group for every workload here, all on packed states) and
//! with one lock a shard (`ours_one_lock`: `MemoryStoreBuilder::per_thread_reads(false)`);
//! governor's is `check_key`. Both
//! limit at one unit a minute with a burst of 1,000,000, as `benches/instructions.rs` does: a
//! spread key is never denied and its state outlives the run, as governor's entries do (at a
//! rate such as 1,000,000/s a key touched every few milliseconds would have expired between
//! touches, and ours, which drops expired keys, would measure inserts where governor updates);
//! the hot key is denied once its burst is spent, by both. Each run measures every workload
//! and limiter in turn, at one thread count; prints the median of each as
//! `limiter/workload/threads=decisions per second`, and, for two policies against one GCRA
//! (`two` and `two_gcra` against `spread`, ours with its defaults), the median of the runs'
//! ratios as `ratio/workload/threads=ratio`: each ratio compares rates measured seconds apart,
//! which a shared machine's drift moves less than it moves the medians.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use tower_ratelimit::key::Key;
use tower_ratelimit::{MemoryStore, Policy, RateLimitLayer};

#[path = "common/ready.rs"]
mod ready;
use ready::now;

const KEYS: usize = 10_000;
const THREADS: [usize; 4] = [1, 2, 4, 8];

/// Decisions per second of `threads` threads running `decide(thread, i)` for `seconds`.
fn rate(threads: usize, seconds: f64, decide: impl Fn(usize, usize) + Sync) -> f64 {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, decide) = (&stop, &decide);
                s.spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for i in 0..256 {
                            decide(t, n as usize + i);
                        }
                        n += 256;
                    }
                    n
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    total as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let runs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5);
    let seconds: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1.0);
    // Optionally one workload (`spread`, `hot`, `two`, `two_gcra`) and one thread count, e.g. to profile
    // it.
    let only = args.get(2).map(String::as_str);
    let only_threads: Option<usize> = args.get(3).and_then(|a| a.parse().ok());
    let keys: Vec<Key> = (0..KEYS as u64).map(Key::from).collect();
    for threads in THREADS {
        if only_threads.is_some_and(|t| t != threads) {
            continue;
        }
        let spread = |t: usize, i: usize| (i + t * KEYS / threads) % KEYS;
        let workloads = [
            ("spread", &spread as &(dyn Fn(usize, usize) -> usize + Sync)),
            ("hot", &|_, _| 0),
            ("two", &spread),
            ("two_gcra", &spread),
        ];
        let workloads: Vec<_> = workloads
            .into_iter()
            .filter(|(w, _)| only.is_none_or(|o| o == *w))
            .collect();
        // Each run measures every workload, one after the other, so that a workload and the
        // one it is compared with are measured close in time (on a shared machine the rates
        // drift from second to second): a line each, in the order first measured.
        let mut rates: Vec<(String, Vec<f64>)> = Vec::new();
        let mut push = |name: String, rate: f64| match rates.iter_mut().find(|(n, _)| *n == name) {
            Some((_, all)) => all.push(rate),
            None => rates.push((name, vec![rate])),
        };
        for _ in 0..runs {
            for &(workload, pick) in &workloads {
                for (name, rate) in measure(workload, pick, threads, seconds, &keys) {
                    push(format!("{name}/{workload}/{threads}"), rate);
                }
            }
        }
        for (name, all) in &rates {
            println!("{name}={:.0}", median(all.clone()));
        }
        // Two policies against one, run by run: the median of the ratios of rates measured
        // seconds apart.
        let of = |name: &str| rates.iter().find(|(n, _)| n == name).map(|(_, all)| all);
        for workload in ["two", "two_gcra"] {
            let both = (
                of(&format!("ours/{workload}/{threads}")),
                of(&format!("ours/spread/{threads}")),
            );
            if let (Some(two), Some(one)) = both {
                let ratios = two.iter().zip(one).map(|(a, b)| a / b).collect();
                println!("ratio/{workload}/{threads}={:.3}", median(ratios));
            }
        }
    }
}

/// One run of `workload` on `threads` threads for `seconds`: the rate of each limiter, ours
/// with its defaults (the layer chooses the store's locks: a reader lock per thread group,
/// as every workload here is decided on packed states), ours with one lock a shard, and
/// governor's (but for two policies, which it has no counterpart of).
fn measure(
    workload: &str,
    pick: &(dyn Fn(usize, usize) -> usize + Sync),
    threads: usize,
    seconds: f64,
    keys: &[Key],
) -> Vec<(&'static str, f64)> {
    // `two`: a second policy on the same keys, a fixed window, decided with the first;
    // `two_gcra`: a second GCRA. Both are decided on their packed words under the shard's
    // shared lock (governor has no counterpart).
    let two = workload.starts_with("two");
    let mut out = Vec::new();
    for (name, told) in [("ours", None), ("ours_one_lock", Some(false))] {
        let mut store = MemoryStore::builder();
        if let Some(yes) = told {
            store = store.per_thread_reads(yes);
        }
        let mut builder = RateLimitLayer::builder()
            .store(store.build())
            .policy(Policy::gcra("1/min").burst(1_000_000));
        if workload == "two" {
            builder = builder.policy(Policy::fixed_window("1000000000/h").name("b"));
        } else if two {
            builder = builder.policy(Policy::gcra("1/h").burst(1_000_000).name("b"));
        }
        let layer = builder.build().expect("a valid layer");
        out.push((
            name,
            rate(threads, seconds, |t, i| {
                black_box(now(layer.check(&keys[pick(t, i)], 1)).unwrap().is_allowed());
            }),
        ));
    }
    if !two {
        let burst = NonZeroU32::new(1_000_000).unwrap();
        let quota = Quota::per_minute(NonZeroU32::MIN).allow_burst(burst);
        let governor = RateLimiter::keyed(quota);
        let rate = rate(threads, seconds, |t, i| {
            black_box(governor.check_key(&keys[pick(t, i)]).is_ok());
        });
        out.push(("governor", rate));
    }
    out
}
