//! The Redis side of `scripts/bench.sh`: our decisions against a running `redis-server`,
//! measured the way `redis-benchmark` measures its `EVALSHA` of the same script, so the script
//! can put the two side by side. Not an example of how to use the crate.
//!
//! ```text
//! driver_redis args URL [ALGORITHM[,ALGORITHM…]] [--quota Q[,Q…]] [--lists]  # the decision call (FCALL name …), one word per line; with the lists' looks
//! driver_redis throughput URL [--tasks 50] [--seconds 2] [--pool N] [--threads 1]
//! driver_redis latency URL [--n 20000]   # a rediss:// URL (of any command) trusts the CA in $REDIS_CA
//! driver_redis algorithms URL [--n 20000]
//! driver_redis memory-per-key ALGORITHM [--keys 200000]
//! ```
//!
//! Every decision is `RateLimitLayer::check` of one GCRA policy (1,000,000/s, so every
//! request is admitted and written) on a key drawn from 10,000 keys whose Redis key is
//! `bench:g:{b:NNNNNNNNNNNN}`, the exact bytes `redis-benchmark -r 10000` makes of
//! `bench:g:{b:__rand_int__}`. Output is `name=value` lines.

mod common;

use std::time::{Duration, Instant};

use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::lists::Lists;
use tower_ratelimit::{Algorithm, MemoryStore, Policy, RateLimitLayer, RedisStore};

/// Keys drawn from `0..KEYSPACE`, as `redis-benchmark -r KEYSPACE`.
const KEYSPACE: u64 = 10_000;
const PREFIX: &str = "bench:";

fn policy(algorithm: Algorithm) -> Policy {
    // The sliding log keeps one entry per admitted unit: keep its window small.
    let quota = if algorithm == Algorithm::SlidingLog {
        "1000/s"
    } else {
        "1000000/s"
    };
    Policy::new(algorithm, quota).name("g")
}

/// The caller key `n`, as `redis-benchmark` writes `__rand_int__`: 12 zero-padded digits.
fn key(n: u64) -> Key {
    Key::from(format!("{n:012}"))
}

/// A small xorshift generator: keys spread like `redis-benchmark`'s `random()`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn flag(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

async fn store(url: &str, pool: u64) -> RedisStore {
    let mut builder = RedisStore::builder(url)
        .prefix(PREFIX)
        .deadline(Duration::from_secs(10));
    if url.starts_with("rediss")
        && let Ok(ca) = std::env::var("REDIS_CA")
    {
        let pem = std::fs::read(&ca).expect("read REDIS_CA");
        builder = builder.tls(tower_ratelimit::RedisTls::new().ca_pem(pem));
    }
    if pool > 0 {
        builder = builder.pool(pool as usize);
    }
    builder.build().await.expect("connect to Redis")
}

async fn layer(url: &str, pool: u64, algorithm: Algorithm) -> RateLimitLayer<RedisStore> {
    layer_of(url, pool, policy(algorithm)).await
}

async fn layer_of(url: &str, pool: u64, policy: Policy) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder()
        .policy(policy)
        .store(store(url, pool).await)
        .build()
        .expect("a valid layer")
}

/// Decisions per second with `tasks` tasks deciding in a loop for `seconds`.
async fn throughput(layer: &RateLimitLayer<RedisStore>, tasks: u64, seconds: f64) -> f64 {
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let layer = layer.clone();
            tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                let mut done = 0u64;
                while Instant::now() < stop {
                    let decision = layer.check(&key(rng.next() % KEYSPACE), 1).await;
                    decision.expect("a decision");
                    done += 1;
                }
                done
            })
        })
        .collect();
    let start = Instant::now();
    let mut total = 0;
    for h in handles {
        total += h.await.expect("task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// `n` decisions one after the other (after `n / 5` to warm up): decisions per second and the
/// sorted latencies in microseconds.
async fn latency(layer: &RateLimitLayer<RedisStore>, n: u64) -> (f64, Vec<f64>) {
    let mut rng = Rng(7);
    for _ in 0..n / 5 {
        layer.check(&key(rng.next() % KEYSPACE), 1).await.unwrap();
    }
    let mut us = Vec::with_capacity(n as usize);
    let start = Instant::now();
    for _ in 0..n {
        let k = key(rng.next() % KEYSPACE);
        let t = Instant::now();
        layer.check(&k, 1).await.unwrap();
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let rps = n as f64 / start.elapsed().as_secs_f64();
    us.sort_by(f64::total_cmp);
    (rps, us)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

async fn commandstat(url: &str, command: &str) -> (u64, f64) {
    let client = redis::Client::open(url).expect("URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
        .unwrap_or_default();
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("calls") as u64, field("usec_per_call"))
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if common::started_by_cargo_bench(&args) {
        return;
    }
    let command = args.first().map(String::as_str).unwrap_or("");
    let url = args.get(1).cloned().unwrap_or_default();
    let threads = flag(&args, "--threads", 1) as usize;
    let rt = common::runtime(threads);
    rt.block_on(async {
        match command {
            "args" => {
                // Several algorithms (and quotas), comma-separated: one policy each, on one key,
                // named g, h, i, ...
                let algorithms: Vec<Algorithm> = match args.get(2).filter(|a| !a.starts_with("--"))
                {
                    Some(names) => names
                        .split(',')
                        .map(|n| n.parse().expect("an algorithm name"))
                        .collect(),
                    None => vec![Algorithm::Gcra],
                };
                let quotas: Vec<&str> = args
                    .iter()
                    .position(|a| a == "--quota")
                    .map_or_else(Vec::new, |i| args[i + 1].split(',').collect());
                let policies = algorithms.iter().enumerate().map(|(i, &algorithm)| {
                    let name = ["g", "h", "i", "j"][i];
                    match quotas.get(i) {
                        Some(quota) => Policy::new(algorithm, *quota).name(name),
                        None => policy(algorithm).name(name),
                    }
                });
                let builder = RateLimitLayer::builder()
                    .policies(policies)
                    .store(store(&url, 0).await);
                let call = if args.iter().any(|a| a == "--lists") {
                    // A request of the key RANDINT through a layer with lists kept in the
                    // store: the policies' call with its looks at the key's entries.
                    let layer = (builder.key(HeaderKey::try_new("x-key").unwrap()))
                        .lists(Lists::new())
                        .build()
                        .expect("a valid layer");
                    let service = tower::ServiceBuilder::new().layer(layer).service_fn(
                        |_: http::Request<()>| async {
                            Ok::<_, std::convert::Infallible>(http::Response::new(()))
                        },
                    );
                    let request = http::Request::builder().header("x-key", "RANDINT");
                    let request = request.body(()).unwrap();
                    common::captured(&url, tower::ServiceExt::oneshot(service, request)).await
                } else {
                    let layer = builder.build().expect("a valid layer");
                    common::captured_call(&url, &layer, &Key::from("RANDINT")).await
                };
                for arg in call {
                    println!("{arg}");
                }
            }
            "script" => print!("{}", RedisStore::script_source()),
            "throughput" => {
                let layer = layer(&url, flag(&args, "--pool", 0), Algorithm::Gcra).await;
                let tasks = flag(&args, "--tasks", 50);
                let seconds = flag(&args, "--seconds", 2) as f64;
                throughput(&layer, tasks, 0.5).await; // warm-up
                println!("rps={:.0}", throughput(&layer, tasks, seconds).await);
            }
            "latency" => {
                let layer = layer(&url, 0, Algorithm::Gcra).await;
                let n = flag(&args, "--n", 20_000);
                // On a worker thread, as a server's handlers are: the main thread is not one of
                // the runtime's workers, and every call from it would cross threads twice.
                let (rps, us) = tokio::spawn(async move { latency(&layer, n).await })
                    .await
                    .expect("task");
                println!("rps={rps:.0}");
                println!("p50_us={:.1}", percentile(&us, 0.50));
                println!("p99_us={:.1}", percentile(&us, 0.99));
            }
            "algorithms" => {
                let n = flag(&args, "--n", 20_000);
                for algorithm in Algorithm::ALL {
                    let layer = layer(&url, 0, algorithm).await;
                    common::redis_cmd(&url, &["FLUSHALL"]).await;
                    // Warm-up, then the measured calls on fresh statistics.
                    throughput(&layer, 50, 0.3).await;
                    common::redis_cmd(&url, &["CONFIG", "RESETSTAT"]).await;
                    let mut rng = Rng(11);
                    let mut tasks = Vec::new();
                    for _ in 0..50 {
                        let layer = layer.clone();
                        let keys: Vec<u64> = (0..n / 50).map(|_| rng.next() % KEYSPACE).collect();
                        tasks.push(tokio::spawn(async move {
                            for k in keys {
                                layer.check(&key(k), 1).await.unwrap();
                            }
                        }));
                    }
                    for t in tasks {
                        t.await.unwrap();
                    }
                    let command = if layer.store().uses_functions() {
                        "fcall"
                    } else {
                        "evalsha"
                    };
                    let (calls, usec) = commandstat(&url, command).await;
                    // Memory of one key after one admitted request, under a quota slow enough
                    // for the key to live until it is measured.
                    let probe = key(KEYSPACE + 1);
                    let slow = RateLimitLayer::builder()
                        .policy(Policy::new(algorithm, "100/h").name("m"))
                        .store(layer.store().clone())
                        .build()
                        .unwrap();
                    slow.check(&probe, 1).await.unwrap();
                    let redis_key = layer.store().key_for("m", &probe);
                    let client = redis::Client::open(url.as_str()).expect("URL");
                    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                    let bytes: i64 = redis::cmd("MEMORY")
                        .arg("USAGE")
                        .arg(&redis_key[..])
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    println!("{algorithm}.calls={calls}");
                    println!("{algorithm}.usec_per_call={usec:.2}");
                    println!("{algorithm}.redis_bytes_per_key={bytes}");
                }
            }
            "memory-per-key" => {
                // One algorithm per process: memory freed by another would be reused.
                let keys = flag(&args, "--keys", 200_000);
                let algorithm: Algorithm = url.parse().expect("an algorithm name");
                {
                    let store = MemoryStore::builder().max_keys(keys as usize * 4).build();
                    let layer = RateLimitLayer::builder()
                        .policy(Policy::new(algorithm, "100/h"))
                        .store(store)
                        .build()
                        .unwrap();
                    let names: Vec<Key> = (0..keys).map(key).collect();
                    let before = rss_bytes();
                    for k in &names {
                        layer.check(k, 1).await.unwrap();
                    }
                    let after = rss_bytes();
                    let held = layer.store().len() as u64;
                    println!(
                        "{algorithm}.memory_bytes_per_key={:.0}",
                        after.saturating_sub(before) as f64 / held.max(1) as f64
                    );
                }
            }
            _ => {
                eprintln!("usage: see the comment at the top of benches/driver_redis.rs");
                std::process::exit(2);
            }
        }
    });
}
