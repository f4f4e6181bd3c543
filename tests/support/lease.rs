//! Races under contention: two instances hammering keys (with leases, or several policies), and
//! what they must admit.

use http::StatusCode;
use tower::Layer;
use tower_ratelimit::key::{GlobalKey, Key};
use tower_ratelimit::{Algorithm, Policy, RateLimitLayer, Store};

use super::http::{Seen, get, inner};

/// `n` concurrent checks alternating between two layers (two instances), on four keys (so,
/// on a cluster, several slots and nodes); returns how many were admitted.
pub async fn race_on_four_keys<St: Store>(
    a: &RateLimitLayer<St>,
    b: &RateLimitLayer<St>,
    n: usize,
) -> usize {
    race(a, b, n, 4).await
}

/// `n` concurrent checks alternating between two layers (two instances), spread over `keys`
/// keys; returns how many were admitted.
pub async fn race<St: Store>(
    a: &RateLimitLayer<St>,
    b: &RateLimitLayer<St>,
    n: usize,
    keys: usize,
) -> usize {
    let mut tasks = Vec::new();
    for i in 0..n {
        let layer = if i % 2 == 0 { a.clone() } else { b.clone() };
        let key = tower_ratelimit::key::Key::from(format!("client-{}", i % keys));
        tasks.push(tokio::spawn(async move {
            layer.check(&key, 1).await.unwrap().is_allowed()
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    admitted
}

/// Two instances, each with its own connection, send `per_instance` concurrent requests for
/// one key under `policy`; returns how many were admitted.
pub async fn hammer<St: Store>(a: St, b: St, policy: Policy, per_instance: usize) -> usize {
    let build = |store: St| {
        RateLimitLayer::builder()
            .policy(policy.clone())
            .key(GlobalKey)
            .store(store)
            .build()
            .unwrap()
            .layer(inner(&Seen::default()))
    };
    let (sa, sb) = (build(a), build(b));
    let mut tasks = Vec::new();
    for i in 0..2 * per_instance {
        let svc = if i % 2 == 0 { sa.clone() } else { sb.clone() };
        tasks.push(tokio::spawn(async move { get(&svc).await.status }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap() == StatusCode::OK);
    }
    admitted
}

/// The fewest units two instances with leases of `lease` must admit of `limit`: all but what
/// their leases hold unspent at the end, and for GCRA and the buckets, which count a lease's
/// units as spent at its end, the refill of one lease's life (a second of 100/h: under one
/// unit, one once rounded) while the first lease lives.
pub fn fewest_admitted(algorithm: Algorithm, limit: usize, lease: usize) -> usize {
    let spent_at_the_end = matches!(
        algorithm,
        Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket
    );
    limit - 2 * lease - usize::from(spent_at_the_end)
}

/// What each of `layer`'s policies has left for `key`, by a look (a check of cost 0).
pub async fn remaining<St: Store>(layer: &RateLimitLayer<St>, key: &Key) -> Vec<u64> {
    let decision = layer.check(key, 0).await.expect("a decision");
    decision.outcomes().iter().map(|o| o.remaining()).collect()
}

/// The sets of algorithms the several-policy races run: each algorithm beside the next (a
/// pair of every algorithm twice, in both places) and three of different families.
pub fn several_policy_sets() -> Vec<Vec<Algorithm>> {
    let all = Algorithm::ALL;
    let mut sets: Vec<Vec<Algorithm>> = (0..all.len())
        .map(|i| vec![all[i], all[(i + 1) % all.len()]])
        .collect();
    sets.push(vec![
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ]);
    // Every state packed: the memory store decides these on the words, under the shared lock.
    sets.push(vec![Algorithm::Gcra; 2]);
    sets.push(vec![Algorithm::Gcra; 3]);
    sets.push(vec![Algorithm::FixedWindow; 2]);
    sets.push(vec![
        Algorithm::FixedWindow,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
    ]);
    sets
}

/// Two instances (layers on `a` and `b`) race `n` checks over `keys` keys under the policies
/// of `algorithms`, the i-th allowing `limits[i]` an hour, then asserts that every key was
/// admitted exactly the smallest limit and that each policy was charged exactly that: all or
/// nothing, whatever the interleaving. The stores share a `ManualClock` that does not move,
/// so nothing refills. `name` prefixes the policies' names.
pub async fn race_several<St: Store>(
    a: St,
    b: St,
    name: &str,
    algorithms: &[Algorithm],
    n: usize,
    keys: usize,
) {
    let limits: Vec<u32> = [100, 70, 45][..algorithms.len()].to_vec();
    let policies: Vec<Policy> = algorithms
        .iter()
        .zip(&limits)
        .enumerate()
        .map(|(i, (&algorithm, limit))| {
            Policy::new(algorithm, format!("{limit}/h").as_str()).name(format!("{name}-{i}"))
        })
        .collect();
    let build = |store: St| {
        RateLimitLayer::builder()
            .policies(policies.clone())
            .store(store)
            .build()
            .unwrap()
    };
    let (la, lb) = (build(a), build(b));
    let fewest = *limits.iter().min().unwrap();
    let admitted = race(&la, &lb, n, keys).await;
    assert_eq!(admitted, keys * fewest as usize, "{algorithms:?}");
    for k in 0..keys {
        let key = Key::from(format!("client-{k}"));
        let left = remaining(&la, &key).await;
        let expected: Vec<u64> = limits.iter().map(|&l| u64::from(l - fewest)).collect();
        assert_eq!(
            left, expected,
            "{algorithms:?} client-{k}: each charged the admitted"
        );
    }
}
