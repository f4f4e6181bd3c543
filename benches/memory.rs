//! In-memory decision cost per algorithm, and the layer's overhead over a bare service, both
//! measured in the same run.
//!
//! `cargo bench --bench memory`

use std::convert::Infallible;
use std::hint::black_box;

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::Full;
use tower::{Service, ServiceExt, service_fn};
use tower_layer::Layer;
use tower_ratelimit::key::{self, Key};
use tower_ratelimit::{Algorithm, Policy, RateLimitLayer};

fn hello(_: Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>> {
    std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"hello")))))
}

/// A key from the `x-client` header, so a benchmark can spread requests over many keys.
fn client_key() -> impl key::KeyExtractor {
    key::from_fn(|req| {
        Ok(Key::from(req.headers().get("x-client").map_or(0, |v| {
            v.as_bytes()
                .iter()
                .fold(0u64, |a, b| a * 10 + u64::from(b - b'0'))
        })))
    })
}

fn requests(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

/// Sends one request per iteration through `svc`, the key cycling through `keys`.
fn bench_service<S, B>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    rt: &tokio::runtime::Runtime,
    keys: &[String],
    mut svc: S,
) where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
{
    let mut i = 0;
    group.bench_function(name, |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            let req = Request::builder()
                .header("x-client", &keys[i])
                .body(())
                .unwrap();
            rt.block_on(async { black_box(svc.ready().await.unwrap().call(req).await.unwrap()) })
        })
    });
}

fn layer_overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let keys = requests(10_000);
    let mut group = c.benchmark_group("service");
    bench_service(&mut group, "bare", &rt, &keys, service_fn(hello));
    for algorithm in Algorithm::ALL {
        let layer = RateLimitLayer::builder()
            .policy(Policy::new(algorithm, "10000/s"))
            .key(client_key())
            .build()
            .unwrap();
        let name = format!("limited/{algorithm}");
        bench_service(
            &mut group,
            &name,
            &rt,
            &keys,
            layer.layer(service_fn(hello)),
        );
    }
    group.finish();
}

criterion_group!(benches, layer_overhead);
criterion_main!(benches);
