//! Redis decisions per second with 50 concurrent tasks: the shared multiplexed connection
//! against a deadpool pool, in the same run, on a redis-server the bench starts itself.
//!
//! `cargo bench --bench redis`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tower_ratelimit::key::Key;
use tower_ratelimit::{Policy, RateLimitLayer, RedisStore};

const TASKS: usize = 50;

async fn burst(layer: &RateLimitLayer<RedisStore>, per_task: usize) {
    let mut tasks = Vec::with_capacity(TASKS);
    for t in 0..TASKS {
        let layer = layer.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_task {
                let key = Key::from(((t * per_task + i) % 10_000) as u64);
                layer.check(&key, 1).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn connections(c: &mut Criterion) {
    let server = support::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let per_task = 20;
    let mut group = c.benchmark_group("redis_50_tasks");
    group.throughput(Throughput::Elements((TASKS * per_task) as u64));
    group.measurement_time(Duration::from_secs(5));
    for (name, pool) in [
        ("multiplexed", None),
        ("pool_16", Some(16)),
        ("pool_50", Some(50)),
    ] {
        let layer = rt.block_on(async {
            let mut b = RedisStore::builder(&server.url())
                .deadline(std::time::Duration::from_secs(10))
                .prefix("bench:");
            if let Some(size) = pool {
                b = b.pool(size);
            }
            let store = b.build().await.unwrap();
            RateLimitLayer::builder()
                .policy(Policy::gcra("1000000/s").name("g"))
                .store(store)
                .build()
                .unwrap()
        });
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        burst(&layer, per_task).await;
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, connections);
criterion_main!(benches);
