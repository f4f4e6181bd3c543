//! Our costs against the peer crates, in the same run (comparisons 4 and 6 of
//! `scripts/bench.sh`).
//!
//! `cargo bench --bench peers`
//!
//! * `decision/*`: one decision for a key cycling through 10,000 keys under an in-memory GCRA
//!   that never limits. Ours is `RateLimitLayer::check` on the memory store, polled once with
//!   a no-op waker (the memory store's future is always ready), so no runtime is measured;
//!   governor's is `RateLimiter::keyed` `check_key`.
//! * `request/*`: one request through an axum hello-world `Router`, bare, with our layer and
//!   with `tower_governor`'s (each an in-memory GCRA per peer IP that never limits, with and
//!   without rate-limit headers): the middleware's whole cost per request, without the
//!   sockets that dominate (and blur) the same comparison under wrk. `ours_lean*` is ours as a
//!   service that never reads the `Decision` would configure it: `decision_extension(false)`
//!   and `body::<AxumBody>()`.

use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tower_ratelimit::key::Key;
use tower_ratelimit::{Algorithm, Policy, RateLimitLayer};

#[path = "common/open_layer.rs"]
mod open_layer;
use open_layer::open_layer;
#[path = "common/ready.rs"]
mod ready;
use ready::now;

const KEYS: u64 = 10_000;

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

async fn hello() -> &'static str {
    "hello"
}

fn request_cost(c: &mut Criterion) {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::routing::get;
    use tower::{Service, ServiceExt};
    use tower_governor::GovernorLayer;
    use tower_governor::governor::GovernorConfigBuilder;
    use tower_ratelimit::axum::AxumBody;
    use tower_ratelimit::headers::HeaderStyle;

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let base = || Router::new().route("/", get(hello));
    let ours = |headers| base().layer(open_layer(headers, true));
    // What an axum service that never reads the `Decision` would configure: no extension, and
    // responses in axum's own body.
    let lean = |headers| base().layer(open_layer(headers, false).body::<AxumBody>());
    let governor = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .finish()
        .unwrap();
    let governor_headers = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .unwrap();
    let routers = [
        ("bare", base()),
        ("ours", ours(HeaderStyle::Legacy)),
        ("ours_no_headers", ours(HeaderStyle::None)),
        ("ours_lean", lean(HeaderStyle::Legacy)),
        ("ours_lean_no_headers", lean(HeaderStyle::None)),
        ("tower_governor", base().layer(GovernorLayer::new(governor))),
        (
            "tower_governor_headers",
            base().layer(GovernorLayer::new(governor_headers)),
        ),
    ];
    let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 40_000));
    let mut group = c.benchmark_group("request");
    for (name, mut router) in routers {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut request = http::Request::new(Body::empty());
                request.extensions_mut().insert(ConnectInfo(peer));
                rt.block_on(async {
                    let ready = ServiceExt::<http::Request<Body>>::ready(&mut router).await;
                    let response = ready.unwrap().call(request).await.unwrap();
                    assert!(response.status().is_success());
                    black_box(response)
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decision_cost, request_cost);
criterion_main!(benches);
