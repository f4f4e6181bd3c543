//! The egress layer around a tonic `Channel`: tonic's own health client calls a tonic server
//! (over a real socket) through it. The server limits itself (this crate's layer, answering
//! `RESOURCE_EXHAUSTED` with `retry-after` and the rate-limit fields as metadata); a refusal
//! learned by one client pauses the other, on one memory store, on one Redis and on a
//! cluster; a call given up is a tonic `Status` naming the policy.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{Layer, ServiceBuilder};
use tower_ratelimit::egress::{Egress, EgressLayer};
use tower_ratelimit::headers::HeaderStyle;
use tower_ratelimit::key::GlobalKey;
use tower_ratelimit::{MemoryStore, Policy, RateLimitLayer, RedisStore, Store};

use support::{RedisCluster, RedisServer};

/// A tonic health server limited to 2 calls a second (two at once), on a free port; its
/// calls counted as they arrive (before its limit).
struct Server {
    addr: SocketAddr,
    arrived: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `headers`: whether its answers carry the rate-limit fields (`RateLimit: …;r=0;t=1` once
/// nothing is left), else only a refusal's `retry-after`.
async fn server(headers: HeaderStyle) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let arrived = Arc::new(AtomicUsize::new(0));
    let count = arrived.clone();
    let counting = tower::util::MapRequestLayer::new(move |call: http::Request<_>| {
        count.fetch_add(1, Ordering::SeqCst);
        call
    });
    let limit = RateLimitLayer::builder()
        .key(GlobalKey)
        .policy(Policy::gcra("2/s"))
        .headers(headers)
        .build()
        .unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(ServiceBuilder::new().layer(counting).layer(limit))
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    Server {
        addr,
        arrived,
        task,
    }
}

/// A health client of the server at `addr` through `layer`: the calls name the server as
/// their origin, which the layer keys them by (`UpstreamHost`).
async fn client<St: Store>(
    layer: &EgressLayer<St>,
    addr: SocketAddr,
) -> HealthClient<Egress<Channel, St>> {
    let origin: http::Uri = format!("http://{addr}").parse().unwrap();
    let channel = Channel::builder(origin.clone())
        .connect()
        .await
        .expect("connect to the gRPC server");
    HealthClient::with_origin(layer.layer(channel), origin)
}

/// An egress layer on `store` allowing 10 calls a second (more than the server's 2),
/// waiting up to `max_wait`.
fn egress<St: Store>(store: St, max_wait: Duration) -> EgressLayer<St> {
    EgressLayer::builder()
        .store(store)
        .policy(Policy::gcra("10/s").name("partner"))
        .max_wait(max_wait)
        .build()
        .unwrap()
}

async fn check<St: Store>(
    client: &mut HealthClient<Egress<Channel, St>>,
) -> Result<(), tonic::Status> {
    client
        .check(HealthCheckRequest::default())
        .await
        .map(|_| ())
}

/// Two calls through `a` are answered, then the next through `b` waits about a second and
/// is answered: with the rate-limit fields (`HeaderStyle::Ietf`), the second answer says
/// nothing is left for a second (`RateLimit: "default";r=0;t=1` as metadata) and the server
/// refuses nothing; without them, the server refuses a third call through `a`
/// (`RESOURCE_EXHAUSTED`, `retry-after: 1` as metadata), which pauses both.
async fn a_servers_answer_pauses_both<St: Store>(
    a: &EgressLayer<St>,
    b: &EgressLayer<St>,
    fields: HeaderStyle,
) {
    let server = server(fields).await;
    let (mut a, mut b) = (client(a, server.addr).await, client(b, server.addr).await);
    check(&mut a).await.unwrap();
    check(&mut a).await.unwrap();
    let refusing = fields == HeaderStyle::None;
    if refusing {
        let refused = check(&mut a).await.expect_err("refused by the server");
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    }
    let paused = Instant::now();
    check(&mut b).await.unwrap();
    let waited = paused.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "sent after {waited:?}"
    );
    let arrived = if refusing { 4 } else { 3 };
    assert_eq!(server.arrived.load(Ordering::SeqCst), arrived);
}

/// Both scenarios on two layers of `stores()`'s stores.
async fn both<St: Store, F: std::future::Future<Output = St>>(stores: impl Fn() -> F) {
    let wait = Duration::from_secs(5);
    for fields in [HeaderStyle::Ietf, HeaderStyle::None] {
        let (a, b) = (egress(stores().await, wait), egress(stores().await, wait));
        a_servers_answer_pauses_both(&a, &b, fields).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_servers_answers_pause_both_clients_in_memory() {
    let store = MemoryStore::new();
    both(|| std::future::ready(store.clone())).await;
}

async fn redis(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_servers_answers_pause_both_clients_on_redis() {
    let server = RedisServer::start();
    let url = server.url();
    both(|| redis(&url, "grpc:")).await;
    support::assert_no_key_without_ttl(&server, "grpc:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_servers_answers_pause_both_clients_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    both(|| redis(&url, "grpc:")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_given_up_is_a_status_naming_the_policy() {
    let server = server(HeaderStyle::None).await;
    let layer = EgressLayer::builder()
        .policy(Policy::gcra("1/min").name("partner"))
        .max_wait(Duration::from_millis(10))
        .build()
        .unwrap();
    let mut client = client(&layer, server.addr).await;
    check(&mut client).await.unwrap();
    let given_up = check(&mut client).await.expect_err("given up");
    assert!(
        given_up.message().contains("limited by \"partner\""),
        "{given_up:?}"
    );
    assert_eq!(server.arrived.load(Ordering::SeqCst), 1);
}
