//! Heap allocations per request through an axum router, counted by a counting global
//! allocator (dhat's) (row 10 of `scripts/bench.sh`):
//!
//! ```text
//! cargo bench --bench allocations
//! ```
//!
//! Prints one `mode=allocations per request` line per router: `bare` (a hello-world router),
//! `identity` (the same with a layer that does nothing but hold an `Arc`, as any configured
//! layer does: what `Router::layer` itself allocates; axum boxes the layer per request, which
//! allocates nothing for a zero-sized layer such as `tower::layer::util::Identity`),
//! our layer (memory store, GCRA 1,000,000/s per peer IP) with `X-RateLimit-*` headers or none,
//! each with and without the `Decision` in the request's extensions, the same in axum's own
//! body (`RateLimitLayer::body::<AxumBody>()`, which axum does not box again), and `tower_governor`'s
//! with and without its headers. Each router serves 20,480 requests from 10,240 peers first, so
//! every key exists and the tables have grown, then 10,240 counted ones.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::{Router, body::Body, routing::get};
use http::Request;
use tower::Layer;
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_ratelimit::axum::AxumBody;
use tower_ratelimit::headers::HeaderStyle;

#[path = "common/open_layer.rs"]
mod open_layer;
use open_layer::open_layer;

/// Counts every allocation (dhat's heap profiler, in its testing mode: no file written).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

fn allocations() -> u64 {
    dhat::HeapStats::get().total_blocks
}

const PEERS: u64 = 10_240;

/// A layer that passes every request to the inner service, holding an `Arc` like a real one
/// (its configuration, never read here).
#[derive(Clone)]
struct PassThrough(#[allow(dead_code)] std::sync::Arc<()>);

impl<S> Layer<S> for PassThrough {
    type Service = S;

    fn layer(&self, inner: S) -> S {
        inner
    }
}

async fn serve(app: &Router, requests: u64) {
    for i in 0..requests {
        let peer = SocketAddr::from(([10, 0, (i / 256 % 40) as u8, (i % 256) as u8], 1000));
        let mut request = Request::get("/").body(Body::empty()).expect("a request");
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = app.clone().oneshot(request).await.expect("a response");
        assert!(response.status().is_success());
        std::hint::black_box(response);
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let _profiler = dhat::Profiler::builder().testing().build();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let base = || Router::new().route("/", get(|| async { "hello" }));
    let ours = |style, extension| base().layer(open_layer(style, extension));
    let governor = |headers: bool| {
        let mut config = GovernorConfigBuilder::default();
        config.per_nanosecond(1).burst_size(1_000_000);
        if headers {
            let config = config.use_headers().finish().expect("a valid config");
            base().layer(GovernorLayer::new(config))
        } else {
            base().layer(GovernorLayer::new(config.finish().expect("a valid config")))
        }
    };
    let routers = [
        ("bare", base()),
        ("identity", base().layer(PassThrough(Default::default()))),
        ("ours", ours(HeaderStyle::Legacy, true)),
        ("ours_no_extension", ours(HeaderStyle::Legacy, false)),
        ("ours_no_headers", ours(HeaderStyle::None, true)),
        (
            "ours_no_headers_no_extension",
            ours(HeaderStyle::None, false),
        ),
        (
            "ours_no_headers_no_extension_axum_body",
            base().layer(open_layer(HeaderStyle::None, false).body::<AxumBody>()),
        ),
        (
            "ours_axum_body",
            base().layer(open_layer(HeaderStyle::Legacy, true).body::<AxumBody>()),
        ),
        ("tower_governor", governor(false)),
        ("tower_governor_headers", governor(true)),
    ];
    for (mode, app) in routers {
        rt.block_on(async {
            serve(&app, 2 * PEERS).await;
            let before = allocations();
            serve(&app, PEERS).await;
            let per = (allocations() - before) as f64 / PEERS as f64;
            println!("{mode}={per:.2}");
        });
    }
}
