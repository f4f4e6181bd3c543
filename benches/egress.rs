//! Outbound calls (`scripts/bench.sh`, rows 15): hyper-util's client calling an axum upstream
//! in process over loopback (on a runtime thread of its own), through an `EgressLayer` against
//! the same client without it. Not an example of how to use the crate.
//!
//! ```text
//! egress memory [--runs 41] [--calls 2000]   # calls/s, plain and through the layer (memory)
//! egress redis URL [--calls 2000] [--lease]  # through a Redis store: calls sent
//! ```
//!
//! The policy is GCRA 1,000,000/s, so every call is admitted at once and charged. One task
//! calls, one call after another, so that a run measures what a call costs. Runs alternate, each going first in turn; the ratio is the median of each
//! limited run's time per call against the plain run's beside it. Output is `name=value`
//! lines; `scripts/bench.sh` counts the store's calls around the Redis run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, Service, ServiceExt};
use tower_ratelimit::egress::EgressLayer;
use tower_ratelimit::{MemoryStore, Policy, RedisStore, Store};

#[path = "common/args.rs"]
mod args;
use args::{arg, median};

/// Tasks calling at once: one, so that a run measures what a call costs.
const TASKS: usize = 1;

/// An upstream answering `ok` on loopback, on a runtime of one thread of its own.
fn upstream() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = Router::new().route("/", get(|| async { "ok" }));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

type Plain = Client<HttpConnector, Empty<Bytes>>;

/// hyper-util's client, its connections without Nagle's delay (as a client of small calls
/// sets them).
fn client() -> Plain {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Seconds per call of `n` calls to `addr` through `service`, `TASKS` at a time.
async fn per_call<S, B>(service: S, addr: SocketAddr, n: usize) -> f64
where
    S: Service<http::Request<Empty<Bytes>>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    let left = Arc::new(AtomicUsize::new(n));
    let uri: http::Uri = format!("http://{addr}/").parse().unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (service, left, uri) = (service.clone(), left.clone(), uri.clone());
            tokio::spawn(async move {
                while left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let call = http::Request::get(uri.clone()).body(Empty::new()).unwrap();
                    let response = service.clone().oneshot(call).await.expect("answered");
                    assert!(response.status().is_success());
                    response.into_body().collect().await.expect("read");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    started.elapsed().as_secs_f64() / n as f64
}

/// The layer on `store`: GCRA 1,000,000/s (never limiting), with leases of `lease` units.
fn layer<St: Store>(store: St, lease: Option<u32>) -> EgressLayer<St> {
    let mut policy = Policy::gcra("1000000/s").name("upstream");
    if let Some(units) = lease {
        policy = policy.lease(units);
    }
    EgressLayer::builder()
        .store(store)
        .policy(policy)
        .build()
        .unwrap()
}

/// Plain and limited runs, alternating, each going first in turn.
async fn memory(runs: usize, n: usize) {
    let addr = upstream();
    let limited = layer(MemoryStore::new(), None).layer(client());
    let plain = client();
    per_call(limited.clone(), addr, n).await; // warm-up
    per_call(plain.clone(), addr, n).await;
    let (mut bare, mut ours) = (Vec::new(), Vec::new());
    for run in 0..runs {
        if run % 2 == 0 {
            bare.push(per_call(plain.clone(), addr, n).await);
            ours.push(per_call(limited.clone(), addr, n).await);
        } else {
            ours.push(per_call(limited.clone(), addr, n).await);
            bare.push(per_call(plain.clone(), addr, n).await);
        }
    }
    let ratio = median(ours.iter().zip(&bare).map(|(o, b)| o / b).collect());
    println!("egress_plain_us={:.2}", median(bare) * 1e6);
    println!("egress_memory_us={:.2}", median(ours) * 1e6);
    println!("egress_memory_ratio={ratio:.3}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    match args.first().map(String::as_str) {
        Some("memory") => {
            let n = arg(&args, "--calls", 2000);
            runtime.block_on(memory(arg(&args, "--runs", 41), n));
        }
        Some("redis") => runtime.block_on(async {
            let n = arg(&args, "--calls", 2000);
            let url = args.get(1).expect("a Redis URL").clone();
            let lease = args.iter().any(|a| a == "--lease").then_some(20);
            let store = RedisStore::builder(&url)
                .prefix("bench-egress:")
                .build()
                .await;
            let limited = layer(store.expect("connect to Redis"), lease).layer(client());
            let per_call = per_call(limited, upstream(), n).await;
            let what = if lease.is_some() { "lease" } else { "redis" };
            println!("egress_{what}_calls={n}");
            println!("egress_{what}_us={:.2}", per_call * 1e6);
        }),
        _ => {
            eprintln!("usage: egress memory [--runs N] [--calls N] | egress redis URL [--lease]");
            std::process::exit(2);
        }
    }
}
