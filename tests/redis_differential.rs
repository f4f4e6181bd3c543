//! The Redis store's Lua twins against the in-memory Rust algorithms: the same random
//! sequences of (time step, cost) must give identical decisions, remaining counts, reset and
//! retry-after times, on a real redis-server, with one injected clock.

mod support;

use std::time::{Duration, UNIX_EPOCH};

use support::{RedisServer, Rng, assert_no_key_without_ttl};
use tower_ratelimit::key::Key;
use tower_ratelimit::{
    Algorithm, Decision, ManualClock, MemoryStore, Policy, Quota, RateLimitLayer, Store,
    calendar::Calendar, calendar::Weekday,
};

fn summary(d: &Decision) -> Vec<(bool, u64, Duration, Option<Duration>)> {
    d.outcomes()
        .iter()
        .map(|o| {
            (
                o.is_allowed(),
                o.remaining(),
                o.reset_after(),
                o.retry_after(),
            )
        })
        .collect()
}

/// A layer of `policy` alone on `store`.
fn layer_of<St: Store>(policy: &Policy, store: St) -> RateLimitLayer<St> {
    RateLimitLayer::builder()
        .policy(policy.clone())
        .store(store)
        .build()
        .unwrap()
}

/// [`layer_of`] whose own clock (the one a key's own limit's end is checked on) is `clock`,
/// the stores'.
fn layer_on<St: Store>(policy: &Policy, store: St, clock: &ManualClock) -> RateLimitLayer<St> {
    RateLimitLayer::builder()
        .policy(policy.clone())
        .clock(clock.clone())
        .store(store)
        .build()
        .unwrap()
}

fn random_policy(rng: &mut Rng, algorithm: Algorithm, name: String) -> Policy {
    let limit = rng.range(1, 12) as u32;
    let (window, buckets) = if algorithm == Algorithm::SlidingWindow {
        let buckets = rng.range(1, 6);
        (rng.range(1, 400) * buckets * 7, Some(buckets as u32))
    } else {
        (rng.range(1, 5_000), None)
    };
    let quota = Quota::new(limit, Duration::from_micros(window)).unwrap();
    let mut policy = Policy::new(algorithm, quota).name(name);
    if algorithm.has_burst() && rng.range(0, 1) == 1 {
        policy = policy.burst(rng.range(1, 15) as u32);
    }
    if let Some(b) = buckets {
        policy = policy.buckets(b);
    }
    policy
}

/// Moves `clock` one random step: nothing, a little or up to 6 ms forward, and now and then
/// back (as Redis TIME may go after a failover).
fn random_step(rng: &mut Rng, clock: &ManualClock) {
    let dt = match rng.range(0, 3) {
        0 => 0,
        1 => rng.range(1, 50),
        _ => rng.range(1, 6_000),
    };
    if rng.range(0, 15) == 0 {
        let now = tower_ratelimit::Clock::now_micros(clock);
        clock.set_micros(now - rng.range(1, 3_000));
    } else {
        clock.advance_micros(dt);
    }
}

/// A random cost: mostly 1, now and then 0 (a look) or several units.
fn random_cost(rng: &mut Rng) -> u32 {
    match rng.range(0, 9) {
        0 => 0,
        1 => rng.range(2, 20) as u32,
        _ => 1,
    }
}

/// The real cost of a request charged `estimate`: as much, less, somewhat more, or now and
/// then far more (a debt of several times any limit the sequences use).
fn random_actual(rng: &mut Rng, estimate: u32) -> u64 {
    let estimate = u64::from(estimate);
    match rng.range(0, 8) {
        0 => estimate,
        1 | 2 => rng.range(0, estimate),
        3 => rng.range(100, 400),
        _ => estimate + rng.range(1, 30),
    }
}

/// An operation run on both stores.
#[derive(Clone, Copy, Debug)]
enum Op {
    Check,
    Refund,
    Penalize,
    Reset,
    Block(Duration),
    /// A request charged its cost up front, settled at these units.
    Settle(u64),
}

/// Runs `op` at `cost` on both layers: memory's decision and Redis's.
async fn on_both<A: Store, B: Store>(
    op: Op,
    memory: &RateLimitLayer<A>,
    redis: &RateLimitLayer<B>,
    key: &Key,
    cost: u32,
) -> (Decision, Decision) {
    match op {
        Op::Check => (
            memory.check(key, cost).await.unwrap(),
            redis.check(key, cost).await.unwrap(),
        ),
        Op::Refund => (
            memory.refund(key, cost).await.unwrap(),
            redis.refund(key, cost).await.unwrap(),
        ),
        Op::Penalize => (
            memory.penalize(key, cost).await.unwrap(),
            redis.penalize(key, cost).await.unwrap(),
        ),
        Op::Reset => (
            memory.control().reset(key).await.unwrap(),
            redis.control().reset(key).await.unwrap(),
        ),
        Op::Block(d) => (
            memory.control().block_for(key, d).await.unwrap(),
            redis.control().block_for(key, d).await.unwrap(),
        ),
        Op::Settle(actual) => (
            memory.settle(key, cost, actual).await.unwrap(),
            redis.settle(key, cost, actual).await.unwrap(),
        ),
    }
}

/// Fails unless memory's decision `m` and Redis's `r` are the same (waits included); prints
/// both when `trace`. `what` names the step.
fn assert_alike(what: &str, trace: bool, m: &Decision, r: &Decision) {
    let (m, r) = ((summary(m), m.wait()), (summary(r), r.wait()));
    if trace {
        eprintln!("{what}: m={m:?} r={r:?}");
    }
    assert_eq!(m, r, "{what}: memory vs redis");
}

/// Whether `DIFF_TRACE` asks for the steps of the sequence of `seed`.
fn traced(seed: u64) -> bool {
    std::env::var("DIFF_TRACE").is_ok_and(|s| s == seed.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_twins_match_the_rust_algorithms() {
    twins_match(true, 200).await;
}

/// The same, with the decision sent as a script (`EVALSHA`), as on a Redis without functions
/// (before 7.0, or an ACL without `FUNCTION`): the same code, loaded and called the other way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_twins_match_the_rust_algorithms_through_evalsha() {
    twins_match(false, 50).await;
}

/// Random sequences of decisions and administrative operations, `sequences_per_algorithm` for
/// each algorithm, on both stores: the Redis store deciding with `FCALL` (`functions`) or with
/// `EVALSHA`.
async fn twins_match(functions: bool, sequences_per_algorithm: u64) {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store_calling("diff:", Some(&clock), functions).await;
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut decisions = 0;
    for algorithm in Algorithm::ALL {
        for seq in 0..sequences_per_algorithm {
            let seed = (algorithm as u64) << 32 | seq;
            let mut rng = Rng::new(seed);
            let name = format!("{}-{seq}", algorithm.name());
            let policy = random_policy(&mut rng, algorithm, name);
            // A memory store per sequence: a shard sweeps its expired entries every 1,024
            // operations, and which shard a key lands in depends on the store's random hash
            // seed. A key swept just before the clock steps back would be fresh in memory but
            // not in Redis, whose keys outlive an injected clock's expiry by a minute of real
            // time: a difference of the test's set-up (with Redis TIME, Redis forgets expired
            // keys as the sweep does), not of the twins. Thirty steps never reach a sweep.
            let memory = MemoryStore::with_clock(clock.clone());
            let on_memory = layer_of(&policy, memory.clone());
            let on_redis = layer_of(&policy, redis.clone());
            let key = Key::from(format!("k{seq}"));
            let redis_key =
                String::from_utf8(redis.key_for(&format!("{}-{seq}", algorithm.name()), &key))
                    .unwrap();
            for step in 0..30 {
                random_step(&mut rng, &clock);
                let cost = random_cost(&mut rng);
                // Mostly checks; now and then an administrative operation.
                let op = match rng.range(0, 26) {
                    0 | 1 => Op::Refund,
                    2 | 3 => Op::Penalize,
                    4 => Op::Reset,
                    5 => Op::Block(Duration::from_micros(rng.range(1, 5_000))),
                    6 | 7 => Op::Settle(random_actual(&mut rng, cost)),
                    _ => Op::Check,
                };
                // Now and then something else takes the key's TTL away: the decision gives it
                // one back (the common check on the fused path, the others on the general).
                let persisted = rng.range(0, 12) == 0;
                if persisted {
                    let _: i64 = redis::cmd("PERSIST")
                        .arg(&redis_key)
                        .query(&mut con)
                        .unwrap();
                }
                let (m, r) = on_both(op, &on_memory, &on_redis, &key, cost).await;
                if persisted {
                    let ttl: i64 = redis::cmd("PTTL").arg(&redis_key).query(&mut con).unwrap();
                    assert_ne!(ttl, -1, "{algorithm} seed {seed} step {step}: TTL repaired");
                }
                if traced(seed) {
                    eprintln!(
                        "step {step} t={} cost={cost} op={op:?} m={:?} r={:?}",
                        tower_ratelimit::Clock::now_micros(&clock),
                        summary(&m),
                        summary(&r)
                    );
                }
                assert_eq!(
                    summary(&m),
                    summary(&r),
                    "{algorithm} seed {seed} step {step}: memory vs redis (cost {cost}, {op:?})"
                );
                decisions += 1;
            }
        }
    }
    assert_eq!(decisions, 6 * sequences_per_algorithm as usize * 30);
    assert_no_key_without_ttl(&server, "diff:");
    // Every decision went the way asked.
    server.assert_calls(functions);
}

/// Several policies on one key (two or three, of random algorithms, a pair of the same one
/// included): random sequences of decisions and administrative operations, on both stores,
/// give the same decision for every policy. Redis decides the usual request of several with
/// the fused decisions (`decide_fused`), the rest on the general path; a request one policy
/// admits and another denies charges neither, and both report the state as it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_policies_decide_alike_in_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store("diffs:", &clock).await;
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let (sequences, mut mixed, mut admitted) = (200, 0, 0);
    for seq in 0..sequences {
        let seed = 13 << 40 | seq;
        let mut rng = Rng::new(seed);
        let count = rng.range(2, 3) as usize;
        let names: Vec<String> = (0..count).map(|i| format!("s{seq}-{i}")).collect();
        let policies: Vec<Policy> = names
            .iter()
            .map(|name| {
                let algorithm = Algorithm::ALL[rng.range(0, 5) as usize];
                random_policy(&mut rng, algorithm, name.clone())
            })
            .collect();
        let algorithms: Vec<Algorithm> = policies.iter().map(|p| p.algorithm()).collect();
        let builder = || RateLimitLayer::builder().policies(policies.clone());
        // A memory store per sequence, as in `twins_match`.
        let memory = MemoryStore::with_clock(clock.clone());
        let on_memory = builder().store(memory).build().unwrap();
        let on_redis = builder().store(redis.clone()).build().unwrap();
        let key = Key::from(format!("k{seq}"));
        for step in 0..30 {
            random_step(&mut rng, &clock);
            let cost = random_cost(&mut rng);
            let op = match rng.range(0, 32) {
                0 => Op::Refund,
                1 => Op::Penalize,
                2 => Op::Reset,
                3 => Op::Block(Duration::from_micros(rng.range(1, 5_000))),
                4 | 5 => Op::Settle(random_actual(&mut rng, cost)),
                _ => Op::Check,
            };
            // Now and then one policy's key loses its TTL: the decision gives it one back.
            let persisted = (rng.range(0, 12) == 0).then(|| {
                let name = &names[rng.range(0, count as u64 - 1) as usize];
                String::from_utf8(redis.key_for(name, &key)).unwrap()
            });
            if let Some(k) = &persisted {
                let _: i64 = redis::cmd("PERSIST").arg(k).query(&mut con).unwrap();
            }
            let (m, r) = on_both(op, &on_memory, &on_redis, &key, cost).await;
            let what = format!("{algorithms:?} seed {seed} step {step} ({op:?}, cost {cost})");
            assert_alike(&what, traced(seed), &m, &r);
            if let Some(k) = &persisted {
                let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut con).unwrap();
                assert_ne!(ttl, -1, "{what}: TTL repaired");
            }
            if matches!(op, Op::Check) && cost > 0 {
                let allowed = m.outcomes().iter().filter(|o| o.is_allowed()).count();
                mixed += usize::from(allowed > 0 && allowed < count);
                admitted += usize::from(m.is_allowed());
            }
        }
    }
    assert!(
        mixed > 200 && admitted > 1_000,
        "the sequences are admitted ({admitted}) and split between policies ({mixed})"
    );
    assert_no_key_without_ttl(&server, "diffs:");
}

/// Reloads, converted by the twins: both stores run the same requests while the policy is
/// reloaded, now and then, with another random quota of the same algorithm under the same
/// name (another limit, window, burst or number of buckets; sometimes letting requests wait),
/// so each converts the key's state to the new quota when it next sees it. The decisions must
/// stay identical, through blocks, refunds, penalties, booked times and a clock going back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_convert_alike_in_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store("reload:", &clock).await;
    let sequences_per_algorithm = 120;
    let (mut decisions, mut reloads) = (0, 0);
    let reloaded = |rng: &mut Rng, algorithm, name: &str| {
        let policy = random_policy(rng, algorithm, name.to_owned());
        match rng.range(0, 2) {
            0 => policy.wait_up_to(Duration::from_micros(rng.range(1, 6_000))),
            _ => policy,
        }
    };
    for algorithm in Algorithm::ALL {
        for seq in 0..sequences_per_algorithm {
            let seed = 9 << 40 | (algorithm as u64) << 32 | seq;
            let mut rng = Rng::new(seed);
            let name = format!("r-{}-{seq}", algorithm.name());
            let policy = reloaded(&mut rng, algorithm, &name);
            let on_memory = layer_of(&policy, MemoryStore::with_clock(clock.clone()));
            let on_redis = layer_of(&policy, redis.clone());
            let key = Key::from(format!("k{seq}"));
            for step in 0..30 {
                if rng.range(0, 5) == 0 {
                    let policy = reloaded(&mut rng, algorithm, &name);
                    if traced(seed) {
                        eprintln!("reload {policy:?}");
                    }
                    on_memory.control().reload([policy.clone()]).unwrap();
                    on_redis.control().reload([policy]).unwrap();
                    reloads += 1;
                }
                match rng.range(0, 14) {
                    0 => {
                        let now = tower_ratelimit::Clock::now_micros(&clock);
                        clock.set_micros(now - rng.range(1, 3_000));
                    }
                    1..=3 => {}
                    _ => clock.advance_micros(rng.range(1, 4_000)),
                }
                let cost = match rng.range(0, 9) {
                    0 => 0,
                    1 => rng.range(2, 8) as u32,
                    _ => 1,
                };
                let op = match rng.range(0, 24) {
                    0 => Op::Refund,
                    1 | 2 => Op::Penalize,
                    3 => Op::Block(Duration::from_micros(rng.range(1, 3_000))),
                    _ => Op::Check,
                };
                let (m, r) = on_both(op, &on_memory, &on_redis, &key, cost).await;
                let at = tower_ratelimit::Clock::now_micros(&clock);
                let what = format!("{algorithm} seed {seed} step {step} t={at} cost={cost} {op:?}");
                assert_alike(&what, traced(seed), &m, &r);
                decisions += 1;
            }
        }
    }
    assert_eq!(decisions, 6 * sequences_per_algorithm as usize * 30);
    assert!(reloads > 3_000, "the sequences reload: {reloads}");
    assert_no_key_without_ttl(&server, "reload:");
}

/// Reservations, decided by the twins: a policy that lets requests wait books the same
/// times in both stores (the same waits, remaining counts and resets), whatever the
/// algorithm, with the clock moving on or going back, refunds and penalties in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_are_made_alike_in_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store("wait:", &clock).await;
    let sequences_per_algorithm = 80;
    let (mut decisions, mut waited) = (0, 0);
    for algorithm in Algorithm::ALL {
        for seq in 0..sequences_per_algorithm {
            let seed = 7 << 40 | (algorithm as u64) << 32 | seq;
            let mut rng = Rng::new(seed);
            let name = format!("w-{}-{seq}", algorithm.name());
            let wait = Duration::from_micros(rng.range(1, 8_000));
            let policy = random_policy(&mut rng, algorithm, name).wait_up_to(wait);
            let memory = MemoryStore::with_clock(clock.clone());
            let on_memory = layer_of(&policy, memory);
            let on_redis = layer_of(&policy, redis.clone());
            let key = Key::from(format!("k{seq}"));
            for step in 0..30 {
                match rng.range(0, 12) {
                    0 => {
                        let now = tower_ratelimit::Clock::now_micros(&clock);
                        clock.set_micros(now - rng.range(1, 3_000));
                    }
                    1..=4 => {}
                    _ => clock.advance_micros(rng.range(1, 3_000)),
                }
                let cost = match rng.range(0, 9) {
                    0 => 0,
                    1 => rng.range(2, 6) as u32,
                    _ => 1,
                };
                let op = match rng.range(0, 20) {
                    0 => Op::Refund,
                    1 => Op::Penalize,
                    _ => Op::Check,
                };
                let (m, r) = on_both(op, &on_memory, &on_redis, &key, cost).await;
                let at = tower_ratelimit::Clock::now_micros(&clock);
                let what = format!("{algorithm} seed {seed} step {step} t={at} cost={cost} {op:?}");
                assert_alike(&what, traced(seed), &m, &r);
                assert!(m.wait() <= wait, "{algorithm}: waits at most {wait:?}");
                if m.wait() > Duration::ZERO {
                    assert!(m.is_allowed(), "a request that waits is admitted");
                    waited += 1;
                }
                decisions += 1;
            }
        }
    }
    assert_eq!(decisions, 6 * sequences_per_algorithm as usize * 30);
    assert!(waited > 500, "the sequences reserve times: {waited} waits");
    assert_no_key_without_ttl(&server, "wait:");
}

/// Leases, decided by the twins: the same requests at the same times, through a layer whose
/// policy takes leases, leave the same state in both stores (looked at by a layer without a
/// lease after every step) and get the same answers. Covers the `LEASE` and `GIVE_BACK` steps
/// of every algorithm: leases taken, spent, ended by the clock, and given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_counted_alike_in_both_stores() {
    use support::http::{Seen, get, inner};
    use tower::Layer;
    use tower_ratelimit::key::GlobalKey;

    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store("diffl:", &clock).await;
    let sequences_per_algorithm = 60;
    let mut steps = 0;
    for algorithm in Algorithm::ALL {
        for seq in 0..sequences_per_algorithm {
            let seed = (algorithm as u64) << 32 | seq | 1 << 31;
            let mut rng = Rng::new(seed);
            let name = format!("{}-{seq}", algorithm.name());
            let plain = random_policy(&mut rng, algorithm, name);
            let capacity = {
                let l = RateLimitLayer::builder()
                    .policy(plain.clone())
                    .build()
                    .unwrap();
                l.check(&Key::global(), 0).await.unwrap().outcomes()[0].limit()
            };
            let window = {
                let l = RateLimitLayer::builder()
                    .policy(plain.clone())
                    .build()
                    .unwrap();
                l.check(&Key::global(), 0).await.unwrap().outcomes()[0].window()
            };
            let units = rng.range(1, capacity) as u32;
            // A lease life up to the reported window, where the quota's window allows it (a
            // bucket's reported window can be longer), else the default one.
            let ttl = Duration::from_micros(rng.range(1, window.as_micros().max(1) as u64));
            let mut leased = plain.clone().lease(units).lease_ttl(ttl);
            if RateLimitLayer::builder()
                .policy(leased.clone())
                .build()
                .is_err()
            {
                leased = plain.clone().lease(units);
            }
            let memory = MemoryStore::with_clock(clock.clone());
            let build = |policy: &Policy, redis_store: bool| {
                let b = RateLimitLayer::builder()
                    .policy(policy.clone())
                    .key(GlobalKey)
                    .clock(clock.clone());
                if redis_store {
                    Err(b.store(redis.clone()).build().unwrap())
                } else {
                    Ok(b.store(memory.clone()).build().unwrap())
                }
            };
            let (Ok(on_memory), Err(on_redis)) = (build(&leased, false), build(&leased, true))
            else {
                unreachable!()
            };
            let (Ok(look_memory), Err(look_redis)) = (build(&plain, false), build(&plain, true))
            else {
                unreachable!()
            };
            let seen = Seen::default();
            let (svc_m, svc_r) = (on_memory.layer(inner(&seen)), on_redis.layer(inner(&seen)));
            for step in 0..30 {
                match rng.range(0, 3) {
                    0 => {}
                    1 => clock.advance_micros(rng.range(1, ttl.as_micros() as u64 + 1)),
                    _ => clock.advance_micros(rng.range(1, 6_000)),
                }
                let (m, r) = (get(&svc_m).await, get(&svc_r).await);
                assert_eq!(
                    (m.status, m.rate_headers()),
                    (r.status, r.rate_headers()),
                    "{algorithm} seed {seed} step {step}: memory vs redis"
                );
                let key = Key::global();
                let (m, r) = (
                    look_memory.check(&key, 0).await.unwrap(),
                    look_redis.check(&key, 0).await.unwrap(),
                );
                assert_eq!(
                    summary(&m),
                    summary(&r),
                    "{algorithm} seed {seed} step {step}: the stores' states differ"
                );
                steps += 1;
            }
        }
    }
    assert_eq!(steps, 6 * sequences_per_algorithm as usize * 30);
    assert_no_key_without_ttl(&server, "diffl:");
}

/// Concurrency limits, decided by the twins (`CONCURRENCY` and `RELEASE`): the same requests start,
/// end, are dropped before their decision comes, or are lost with their instance (their slots
/// never given back, until the limit's longest hold frees them), at the same times, through a
/// layer whose concurrency policy is alone or beside a rate policy (decided atomically: no slot
/// taken when the rate policy rejects). Both stores answer alike and keep the same slots taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limits_hold_alike_in_both_stores() {
    use http::{Request, Response};
    use support::http::{Seen, inner};
    use tower::{Layer, ServiceExt};
    use tower_ratelimit::key::GlobalKey;

    /// A response's status and rate-limit headers.
    fn seen<B>(r: &Response<B>) -> (u16, Vec<Option<String>>) {
        let names = ["x-ratelimit-limit", "x-ratelimit-remaining", "retry-after"];
        let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
        (
            r.status().as_u16(),
            names.iter().map(|n| header(n)).collect(),
        )
    }

    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store("diffc:", &clock).await;
    let sequences = 80;
    let (mut steps, mut held, mut lost) = (0, 0, 0);
    for seq in 0..sequences {
        let seed = 11 << 40 | seq;
        let mut rng = Rng::new(seed);
        let max = Duration::from_micros(rng.range(2_000, 20_000));
        let mut policies = vec![
            Policy::concurrency(rng.range(1, 4) as u32)
                .name(format!("c-{seq}"))
                .max_duration(max),
        ];
        if rng.range(0, 1) == 1 {
            let algorithm = Algorithm::ALL[rng.range(0, 5) as usize];
            policies.push(random_policy(&mut rng, algorithm, format!("c-{seq}-rate")));
        }
        let builder = || {
            RateLimitLayer::builder()
                .policies(policies.clone())
                .key(GlobalKey)
                .clock(clock.clone())
        };
        let memory = MemoryStore::with_clock(clock.clone());
        let on_memory = builder().store(memory).build().unwrap();
        let on_redis = builder().store(redis.clone()).build().unwrap();
        let seen_by = Seen::default();
        let (svc_m, svc_r) = (
            on_memory.clone().layer(inner(&seen_by)),
            on_redis.clone().layer(inner(&seen_by)),
        );
        let mut in_flight = Vec::new();
        for step in 0..30 {
            let what = format!("seed {seed} step {step}");
            match rng.range(0, 11) {
                0..=4 => {
                    let (m, r) = (
                        svc_m.clone().oneshot(Request::new(())).await.unwrap(),
                        svc_r.clone().oneshot(Request::new(())).await.unwrap(),
                    );
                    assert_eq!(seen(&m), seen(&r), "{what}: a request starts");
                    if m.status().is_success() {
                        in_flight.push((m, r));
                        held += 1;
                    }
                }
                5 | 6 if !in_flight.is_empty() => {
                    // A request ends: its body is dropped, and its slots go back.
                    let i = rng.range(0, in_flight.len() as u64 - 1) as usize;
                    drop(in_flight.swap_remove(i));
                }
                7 if !in_flight.is_empty() => {
                    // Its instance is lost: the slots are never given back.
                    let i = rng.range(0, in_flight.len() as u64 - 1) as usize;
                    std::mem::forget(in_flight.swap_remove(i));
                    lost += 1;
                }
                8 => {
                    // A request dropped before its decision is read: whatever it took goes
                    // back (in Redis, once the abandoned decision has come).
                    drop(svc_m.clone().oneshot(Request::new(())));
                    drop(svc_r.clone().oneshot(Request::new(())));
                }
                _ => clock.advance_micros(rng.range(1, max.as_micros() as u64 / 2)),
            }
            let key = Key::global();
            let memory_sees = summary(&on_memory.check(&key, 0).await.unwrap());
            support::eventually(
                &format!("{what}: both stores hold the same slots"),
                async || summary(&on_redis.check(&key, 0).await.unwrap()) == memory_sees,
            )
            .await;
            steps += 1;
        }
    }
    assert_eq!(steps, sequences as usize * 30);
    assert!(
        held > 300 && lost > 20,
        "the sequences hold slots: {held}, lose {lost}"
    );
    assert_no_key_without_ttl(&server, "diffc:");
}

/// A random calendar: UTC, a zone with daylight saving (Paris, New York) or one 30 minutes
/// off the hour (Kolkata), weeks from a random day, months from a random day of the month.
fn random_calendar(rng: &mut Rng) -> Calendar {
    let zone =
        ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"][rng.range(0, 3) as usize];
    let days = [Weekday::Monday, Weekday::Sunday, Weekday::Wednesday];
    Calendar::in_zone(zone)
        .unwrap()
        .week_starts_on(days[rng.range(0, 2) as usize])
        .month_starts_on(match rng.range(0, 3) {
            0 => 1,
            _ => rng.range(1, 31) as u8,
        })
}

/// A fixed window of a random limit a day, a week or a month of a random calendar, and its
/// period.
fn random_plan(rng: &mut Rng, name: &str) -> (Policy, &'static str) {
    let period = ["day", "week", "month"][rng.range(0, 2) as usize];
    let quota = format!("{}/{period}", rng.range(1, 12));
    let policy = Policy::new(Algorithm::FixedWindow, quota.as_str())
        .name(name)
        .calendar(random_calendar(rng));
    (policy, period)
}

/// Calendar periods decided alike: random sequences start a few hours before a month end, a
/// leap day or a daylight-saving change, and step across it by seconds to hours (now and then
/// back), with administrative operations and reloads of the limit or the calendar between
/// decisions. Redis finds each period among the boundaries the call carries, memory from the
/// time-zone database: both give the same decisions, remaining counts, resets and retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_periods_decide_alike_in_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store("cal:", &clock).await;
    let utc = |y, m, d, h| {
        let t = jiff::civil::date(y, m, d).at(h, 0, 0, 0);
        t.to_zoned_datetime(jiff::tz::TimeZone::UTC)
            .unwrap()
            .timestamp()
            .as_microsecond() as u64
    };
    // A month end, February of a leap year, Paris's two changes, New York's autumn one, and
    // the end of a week.
    let starts = [
        utc(2026, 1, 31, 20),
        utc(2028, 2, 28, 20),
        utc(2026, 3, 28, 22),
        utc(2026, 10, 24, 22),
        utc(2026, 11, 1, 3),
        utc(2026, 11, 29, 18),
    ];
    let sequences = 150;
    let (mut decisions, mut reloads) = (0, 0);
    for seq in 0..sequences {
        let seed = 11 << 40 | seq;
        let mut rng = Rng::new(seed);
        let name = format!("c-{seq}");
        let (policy, mut period) = random_plan(&mut rng, &name);
        if traced(seed) {
            eprintln!("{policy:?}");
        }
        let on_memory = layer_on(&policy, MemoryStore::with_clock(clock.clone()), &clock);
        let on_redis = layer_on(&policy, redis.clone(), &clock);
        let key = Key::from(format!("k{seq}"));
        clock.set_micros(starts[rng.range(0, 5) as usize] + rng.range(0, 4 * 3_600_000_000));
        for step in 0..30 {
            if rng.range(0, 7) == 0 {
                let policy;
                (policy, period) = random_plan(&mut rng, &name);
                if traced(seed) {
                    eprintln!("reload {policy:?}");
                }
                on_memory.control().reload([policy.clone()]).unwrap();
                on_redis.control().reload([policy]).unwrap();
                reloads += 1;
            }
            if rng.range(0, 6) == 0 {
                // A key's own limit of the policy's period, ending within hours or not, or
                // cleared.
                let now = tower_ratelimit::Clock::now_micros(&clock);
                let (m, r) = match rng.range(0, 2) {
                    0 => (
                        on_memory.control().clear_limit(&name, &key).await.unwrap(),
                        on_redis.control().clear_limit(&name, &key).await.unwrap(),
                    ),
                    _ => {
                        let quota = format!("{}/{period}", rng.range(1, 20));
                        let until = (rng.range(0, 1) == 1).then(|| {
                            UNIX_EPOCH
                                + Duration::from_micros(now + rng.range(1, 6 * 3_600_000_000))
                        });
                        (
                            on_memory
                                .control()
                                .set_limit(&name, &key, quota.as_str(), until)
                                .await
                                .unwrap(),
                            on_redis
                                .control()
                                .set_limit(&name, &key, quota.as_str(), until)
                                .await
                                .unwrap(),
                        )
                    }
                };
                assert_alike(
                    &format!("seed {seed} step {step} limit"),
                    traced(seed),
                    &m,
                    &r,
                );
            }
            match rng.range(0, 9) {
                0 => {
                    let now = tower_ratelimit::Clock::now_micros(&clock);
                    clock.set_micros(now - rng.range(1, 3_600_000_000));
                }
                1 | 2 => {}
                3..=5 => clock.advance_micros(rng.range(1, 60_000_000)),
                _ => clock.advance_micros(rng.range(1, 3 * 3_600_000_000)),
            }
            let cost = random_cost(&mut rng);
            let op = match rng.range(0, 24) {
                0 => Op::Refund,
                1 | 2 => Op::Penalize,
                3 => Op::Reset,
                4 => Op::Block(Duration::from_micros(rng.range(1, 3_600_000_000))),
                5 | 6 => Op::Settle(random_actual(&mut rng, cost)),
                _ => Op::Check,
            };
            let (m, r) = on_both(op, &on_memory, &on_redis, &key, cost).await;
            let at = tower_ratelimit::Clock::now_micros(&clock);
            let what = format!("seed {seed} step {step} t={at} cost={cost} {op:?}");
            assert_alike(&what, traced(seed), &m, &r);
            decisions += 1;
        }
    }
    assert_eq!(decisions, sequences as usize * 30);
    assert!(reloads > 400, "the sequences reload: {reloads}");
    assert_no_key_without_ttl(&server, "cal:");
}

/// A key's own limit, decided alike: on every algorithm, random sequences set a key's own
/// limit (a random quota, ending soon or not), change it, let it end, clear it, and reload
/// the policy, between checks and administrative operations. Both stores give the same
/// decisions and report the same limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_limits_decide_alike_in_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let redis = server.store("own:", &clock).await;
    let sequences_per_algorithm = 60;
    let (mut decisions, mut limits) = (0, 0);
    for algorithm in Algorithm::ALL {
        for seq in 0..sequences_per_algorithm {
            let seed = 13 << 40 | (algorithm as u64) << 32 | seq;
            let mut rng = Rng::new(seed);
            let name = format!("o-{}-{seq}", algorithm.name());
            // The sliding window's buckets, which a key's own window must divide into.
            let buckets = rng.range(1, 6);
            let sliding = |rng: &mut Rng| {
                let window = rng.range(1, 400) * buckets * 7;
                let quota = Quota::new(rng.range(1, 12) as u32, Duration::from_micros(window));
                Policy::new(algorithm, quota.unwrap())
                    .name(name.as_str())
                    .buckets(buckets as u32)
            };
            let policy = match algorithm {
                Algorithm::SlidingWindow => sliding(&mut rng),
                _ => random_policy(&mut rng, algorithm, name.clone()),
            };
            let on_memory = layer_on(&policy, MemoryStore::with_clock(clock.clone()), &clock);
            let on_redis = layer_on(&policy, redis.clone(), &clock);
            let key = Key::from(format!("k{seq}"));
            for step in 0..30 {
                random_step(&mut rng, &clock);
                let now = tower_ratelimit::Clock::now_micros(&clock);
                let cost = random_cost(&mut rng);
                let what = format!("{algorithm} seed {seed} step {step} t={now} cost={cost}");
                let (m, r) = match rng.range(0, 12) {
                    0 | 1 => {
                        let limit = rng.range(1, 12) as u32;
                        let window = match algorithm {
                            Algorithm::SlidingWindow => rng.range(1, 400) * buckets * 7,
                            _ => rng.range(1, 5_000),
                        };
                        let quota = Quota::new(limit, Duration::from_micros(window)).unwrap();
                        let until = match rng.range(0, 2) {
                            0 => None,
                            _ => {
                                Some(UNIX_EPOCH + Duration::from_micros(now + rng.range(1, 20_000)))
                            }
                        };
                        if traced(seed) {
                            eprintln!("set_limit {quota} until {until:?}");
                        }
                        limits += 1;
                        (
                            on_memory
                                .control()
                                .set_limit(&name, &key, quota, until)
                                .await
                                .unwrap(),
                            on_redis
                                .control()
                                .set_limit(&name, &key, quota, until)
                                .await
                                .unwrap(),
                        )
                    }
                    2 => (
                        on_memory.control().clear_limit(&name, &key).await.unwrap(),
                        on_redis.control().clear_limit(&name, &key).await.unwrap(),
                    ),
                    3 => {
                        let policy = match algorithm {
                            // The buckets stay: a key's own window divides into them.
                            Algorithm::SlidingWindow => sliding(&mut rng),
                            _ => random_policy(&mut rng, algorithm, name.clone()),
                        };
                        on_memory.control().reload([policy.clone()]).unwrap();
                        on_redis.control().reload([policy]).unwrap();
                        on_both(Op::Check, &on_memory, &on_redis, &key, cost).await
                    }
                    4 => on_both(Op::Refund, &on_memory, &on_redis, &key, cost).await,
                    5 => on_both(Op::Penalize, &on_memory, &on_redis, &key, cost).await,
                    6 => {
                        let actual = random_actual(&mut rng, cost);
                        on_both(Op::Settle(actual), &on_memory, &on_redis, &key, cost).await
                    }
                    7 => {
                        let block = Op::Block(Duration::from_micros(rng.range(1, 5_000)));
                        on_both(block, &on_memory, &on_redis, &key, cost).await
                    }
                    _ => on_both(Op::Check, &on_memory, &on_redis, &key, cost).await,
                };
                assert_alike(&what, traced(seed), &m, &r);
                let limit = |d: &Decision| d.outcomes()[0].limit();
                assert_eq!(limit(&m), limit(&r), "{what}: the limit reported");
                decisions += 1;
            }
        }
    }
    assert_eq!(decisions, 6 * sequences_per_algorithm as usize * 30);
    assert!(limits > 1_000, "the sequences set limits: {limits}");
    assert_no_key_without_ttl(&server, "own:");
}
