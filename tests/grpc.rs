//! gRPC: a tonic server (the standard health service) behind the layer, called by tonic's own
//! client over a real socket. A limited call is `RESOURCE_EXHAUSTED` with its retry delay in
//! the status details and the rate-limit headers as metadata; a failed store under `Closed` is
//! `UNAVAILABLE`; methods are keys and routes, metadata is a header. On the memory store (time
//! from a `ManualClock`), on one Redis shared by two servers, on a Redis Cluster, and through
//! the gRPC demo server (`examples/grpc.rs`) as a child process.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_types::StatusExt;
use tower::{Service, ServiceExt};
use tower_ratelimit::key::{GlobalKey, GrpcMethod, HeaderKey, all};
use tower_ratelimit::{
    FailurePolicy, ManualClock, MemoryStore, Policy, RateLimitLayer, Store, grpc::ResponseStyle,
};

mod support;

use support::demo::DemoServer;
use support::{RedisCluster, RedisServer};

const CHECK: &str = "/grpc.health.v1.Health/Check";
const WATCH: &str = "/grpc.health.v1.Health/Watch";

/// A tonic server with the health service behind `layer`, on a free port; stopped when
/// dropped.
struct GrpcServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<St: Store + Clone>(layer: RateLimitLayer<St>) -> GrpcServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    GrpcServer { addr, task }
}

/// A server behind `layer`, and a client of it.
async fn started<St: Store + Clone>(
    layer: RateLimitLayer<St>,
) -> (GrpcServer, HealthClient<Channel>) {
    let server = serve(layer).await;
    let client = client(server.addr).await;
    (server, client)
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect to the gRPC server");
    HealthClient::new(channel)
}

/// `Check` of the whole server, with `x-api-key` metadata when given.
async fn check(
    client: &mut HealthClient<Channel>,
    api_key: Option<&str>,
) -> Result<tonic::Response<HealthCheckResponse>, Status> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(key) = api_key {
        request
            .metadata_mut()
            .insert("x-api-key", key.parse().unwrap());
    }
    client.check(request).await
}

/// `Watch` of the whole server: its first message, or how the call failed.
async fn watch(client: &mut HealthClient<Channel>) -> Result<(), Status> {
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let mut stream = client.watch(request).await?.into_inner();
    stream.message().await?.expect("a first status");
    Ok(())
}

fn metadata<'a>(status: &'a Status, name: &str) -> &'a str {
    status
        .metadata()
        .get(name)
        .unwrap_or_else(|| panic!("metadata {name} in {status:?}"))
        .to_str()
        .unwrap()
}

/// How many of `n` checks, spread over `clients` in turn, are admitted; every other one must be
/// `RESOURCE_EXHAUSTED`.
async fn admitted(clients: &mut [HealthClient<Channel>], n: usize) -> usize {
    let mut admitted = 0;
    for i in 0..n {
        let k = i % clients.len();
        match check(&mut clients[k], None).await {
            Ok(_) => admitted += 1,
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}"),
        }
    }
    admitted
}

// ---------------------------------------------------------------------------------------------
// The answers
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_limited_call_is_resource_exhausted_with_its_retry_delay() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("2/min").name("per-method"))
        .key(GrpcMethod::new())
        .store(MemoryStore::with_clock(clock.clone()))
        .clock(clock.clone())
        .build()
        .unwrap();
    let (_server, mut client) = started(layer).await;
    for _ in 0..2 {
        let ok = check(&mut client, None).await.expect("admitted");
        // The rate-limit headers are initial metadata of an admitted call.
        assert!(ok.metadata().get("x-ratelimit-remaining").is_some());
    }
    clock.advance(Duration::from_millis(15_250));
    let status = check(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limit exceeded (per-method)");
    // The delay, exact in the details, in whole seconds (rounded up) as metadata.
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_millis(44_750)));
    assert_eq!(metadata(&status, "retry-after"), "45");
    assert_eq!(metadata(&status, "x-ratelimit-limit"), "2");
    assert_eq!(metadata(&status, "x-ratelimit-remaining"), "0");
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations.len(), 1);
    assert_eq!(quota.violations[0].subject, "per-method");
    // The window over, calls go through again.
    clock.advance(Duration::from_secs(45));
    check(&mut client, None)
        .await
        .expect("admitted in the next window");
}

#[tokio::test]
async fn methods_are_routes_and_keys_and_metadata_is_a_header() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::fixed_window("2/min")
                .name("per-caller-method")
                .key(all((
                    GrpcMethod::new(),
                    HeaderKey::try_new("x-api-key").unwrap(),
                ))),
        )
        .policy(
            Policy::fixed_window("1/min")
                .name("watch")
                .route(None, WATCH)
                .key(GlobalKey),
        )
        .store(MemoryStore::with_clock(clock.clone()))
        .clock(clock.clone())
        .build()
        .unwrap();
    let (server, mut client) = started(layer).await;
    // Each caller its own budget, read from the metadata.
    for _ in 0..2 {
        check(&mut client, Some("alice")).await.expect("alice");
    }
    let status = check(&mut client, Some("alice")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded (per-caller-method)");
    check(&mut client, Some("bob"))
        .await
        .expect("bob has his own");
    // Watch is another method: its own bucket of the first policy, and the second policy,
    // which applies to it alone.
    let mut watcher = HealthClient::new(
        Channel::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let with_key = |mut client: HealthClient<Channel>| async move {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request
            .metadata_mut()
            .insert("x-api-key", "alice".parse().unwrap());
        let mut stream = client.watch(request).await?.into_inner();
        stream.message().await.map(|m| m.is_some())
    };
    assert!(
        with_key(watcher.clone())
            .await
            .expect("alice may watch once")
    );
    let status = with_key(watcher.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded (watch)");
    // A call without the metadata has no key: INVALID_ARGUMENT, saying what is missing.
    let status = watch(&mut watcher).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("x-api-key"), "{status:?}");
}

/// A concurrency policy holds its slot until the response body ends: for a streaming call,
/// while the stream is open.
#[tokio::test]
async fn a_concurrency_limit_counts_open_streams() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::concurrency(1).name("streams").route(None, WATCH))
        .key(GlobalKey)
        .build()
        .unwrap();
    let (_server, mut client) = started(layer).await;
    let open = |mut client: HealthClient<Channel>| async move {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let mut stream = client.watch(request).await?.into_inner();
        stream.message().await?;
        Ok::<_, Status>(stream)
    };
    let first = open(client.clone()).await.expect("the first stream");
    let status = open(client.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded (streams)");
    check(&mut client, None)
        .await
        .expect("unary calls are not counted");
    // The client closes the stream: its slot goes back once the server sees it.
    drop(first);
    support::eventually("the closed stream's slot to go back", async || {
        open(client.clone()).await.is_ok()
    })
    .await;
}

#[tokio::test]
async fn a_failed_store_under_closed_is_unavailable() {
    let mut redis = RedisServer::start();
    let store = tower_ratelimit::RedisStore::builder(&redis.url())
        .deadline(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("100/s"))
        .key(GrpcMethod::new())
        .store(store)
        .on_store_error(FailurePolicy::Closed)
        .circuit_breaker(None)
        .build()
        .unwrap();
    let (_server, mut client) = started(layer).await;
    check(&mut client, None).await.expect("admitted");
    redis.kill();
    let status = check(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "the rate limiter is unavailable");
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
}

/// One layer answers HTTP requests with HTTP statuses and gRPC requests the gRPC way, unless
/// a style is chosen.
#[tokio::test]
async fn the_style_follows_the_content_type_unless_chosen() {
    async fn denied(style: Option<ResponseStyle>, grpc: bool) -> http::Response<Bytes> {
        let clock = ManualClock::new();
        let mut builder = RateLimitLayer::builder()
            .policy(Policy::fixed_window("1/min"))
            .key(GlobalKey)
            .store(MemoryStore::with_clock(clock.clone()));
        if let Some(style) = style {
            builder = builder.response_style(style);
        }
        let layer = builder.build().unwrap();
        let mut svc = tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
            });
        let request = || {
            let mut r = Request::post(CHECK);
            if grpc {
                r = r.header("content-type", "application/grpc+proto");
            }
            r.body(()).unwrap()
        };
        let first = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        let response = svc.ready().await.unwrap().call(request()).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        http::Response::from_parts(parts, body)
    }
    let grpc = |r: &http::Response<Bytes>| {
        r.headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    for (style, grpc_request, expect_grpc) in [
        (None, true, true),
        (None, false, false),
        (Some(ResponseStyle::Http), true, false),
        (Some(ResponseStyle::Grpc), false, true),
    ] {
        let r = denied(style, grpc_request).await;
        if expect_grpc {
            // Trailers-only: 200, no body, the status in the headers.
            assert_eq!(r.status(), StatusCode::OK);
            assert!(r.body().is_empty());
            assert_eq!(grpc(&r).as_deref(), Some("8"));
            assert_eq!(r.headers()["content-type"], "application/grpc");
            assert_eq!(r.headers()["retry-after"], "60");
        } else {
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{style:?}");
            assert_eq!(grpc(&r), None);
            assert!(!r.body().is_empty());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis: two servers sharing one, and the cluster
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn two_servers_sharing_one_redis_keep_one_limit() {
    let redis = RedisServer::start();
    let clock = ManualClock::new();
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let layer = RateLimitLayer::builder()
            .policy(Policy::sliding_window("5/min").name("shared"))
            .key(GrpcMethod::new())
            .store(redis.store("grpc:", &clock).await)
            .clock(clock.clone())
            .build()
            .unwrap();
        let server = serve(layer).await;
        clients.push(client(server.addr).await);
        servers.push(server);
    }
    assert_eq!(admitted(&mut clients, 12).await, 5);
    let status = check(&mut clients[1], None).await.unwrap_err();
    assert_eq!(status.message(), "rate limit exceeded (shared)");
}

#[tokio::test]
async fn the_cluster_limits_grpc_calls() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let store = tower_ratelimit::RedisStore::builder(&cluster.url())
        .deadline(Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .await
        .unwrap();
    // Two keys, so two hash slots: the per-method policy and a global one.
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("4/h").name("method").key(GrpcMethod::new()))
        .policy(Policy::fixed_window("100/h").name("all").key(GlobalKey))
        .store(store)
        .clock(clock.clone())
        .build()
        .unwrap();
    let (_server, client) = started(layer).await;
    let mut clients = [client];
    assert_eq!(admitted(&mut clients, 7).await, 4);
    let status = check(&mut clients[0], None).await.unwrap_err();
    assert_eq!(status.message(), "rate limit exceeded (method)");
    // GCRA: one more call every 15 minutes.
    clock.advance(Duration::from_secs(15 * 60));
    assert_eq!(admitted(&mut clients, 3).await, 1);
}

// ---------------------------------------------------------------------------------------------
// The gRPC demo server
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_grpc_demo_server_limits_methods() {
    let server = DemoServer::start_grpc(&[
        ("RATE_LIMIT", "3/h"),
        ("METHOD_LIMIT", &format!("{WATCH}=1/h")),
    ]);
    assert!(
        server.first_line.contains("store=memory"),
        "{}",
        server.first_line
    );
    let mut clients = [client(server.addr).await];
    assert_eq!(admitted(&mut clients, 5).await, 3);
    let status = check(&mut clients[0], None).await.unwrap_err();
    assert_eq!(status.message(), "rate limit exceeded (gcra:3/h)");
    assert!(status.get_details_retry_info().is_some());
    // Watch: its own bucket of RATE_LIMIT, and its METHOD_LIMIT of one call.
    watch(&mut clients[0]).await.expect("the first watch");
    let status = watch(&mut clients[0]).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded (method:watch)");
}

#[tokio::test]
async fn two_grpc_demo_servers_share_redis() {
    let redis = RedisServer::start();
    let env = [("RATE_LIMIT", "4/h"), ("REDIS_URL", &redis.url() as &str)];
    let (a, b) = (DemoServer::start_grpc(&env), DemoServer::start_grpc(&env));
    assert!(a.first_line.contains("store=redis"), "{}", a.first_line);
    let mut clients = [client(a.addr).await, client(b.addr).await];
    assert_eq!(admitted(&mut clients, 9).await, 4);
}

#[test]
fn the_grpc_demo_server_refuses_a_bad_method_limit() {
    let out = std::process::Command::new(support::demo::grpc_binary())
        .env_clear()
        .env("METHOD_LIMIT", "/grpc.health.v1.Health/Check")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("METHOD_LIMIT"), "{err}");
}
