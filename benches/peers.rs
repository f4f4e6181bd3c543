//! In-memory decision cost against the peer crate `governor`'s keyed limiter, on the same
//! keys, in the same run (comparison 6 of `scripts/bench.sh`).
//!
//! `cargo bench --bench peers`
//!
//! Both decide one request for a key cycling through 10,000 keys under an in-memory GCRA
//! that never limits. Ours is `RateLimitLayer::check` on the memory store, polled once with a
//! no-op waker (the memory store's future is always ready), so no runtime is measured.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tower_ratelimit::key::Key;
use tower_ratelimit::{Algorithm, Policy, RateLimitLayer};

const KEYS: u64 = 10_000;

/// Polls a future that is ready at once.
fn now<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => unreachable!("the memory store decides at once"),
    }
}

fn decision_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap());

    let ours_u64: Vec<Key> = (0..KEYS).map(Key::from).collect();
    let governor = RateLimiter::keyed(quota);
    let mut i = 0;
    group.bench_function("governor_keyed/u64", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(governor.check_key(&i).is_ok())
        })
    });
    // The same keys as ours: `Key` values (hashable, cheap to clone).
    let governor_key = RateLimiter::keyed(quota);
    let mut i = 0;
    group.bench_function("governor_keyed/key", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS as usize;
            black_box(governor_key.check_key(&ours_u64[i]).is_ok())
        })
    });
    for algorithm in [Algorithm::Gcra, Algorithm::FixedWindow] {
        let layer = RateLimitLayer::builder()
            .policy(Policy::new(algorithm, "1000000/s"))
            .build()
            .unwrap();
        let mut i = 0;
        group.bench_function(format!("ours/{algorithm}"), |b| {
            b.iter(|| {
                i = (i + 1) % KEYS as usize;
                black_box(now(layer.check(&ours_u64[i], 1)).unwrap().is_allowed())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decision_cost);
criterion_main!(benches);
