//! Leases under contention: two instances hammering one key, and what they must admit.

use http::StatusCode;
use tower::Layer;
use tower_ratelimit::key::GlobalKey;
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
