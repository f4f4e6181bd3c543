//! Messages of tonic streams decided by `tower_ratelimit::streams`: a bidirectional streaming
//! call whose requests are decided as they are read, a key's messages counted across two
//! servers sharing a store (in memory, two instances of one Redis, the cluster); the message
//! over the limit answered `RESOURCE_EXHAUSTED` with a `RetryInfo` and a `QuotaFailure` that
//! tonic-types decodes, and a server stream whose responses wait for their turn.

#[macro_use]
mod support;

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use futures_util::{Stream, StreamExt};
use http::uri::PathAndQuery;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};
use tonic_types::StatusExt;
use tower_ratelimit::streams::{CloseCode, Connection, OverLimit, StreamLimiter};
use tower_ratelimit::{ManualClock, Policy, Store};

/// Messages as the bytes they are: a codec needing no protobuf schema.
#[derive(Clone, Copy, Debug, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

const CHAT: &str = "/echo.Echo/Chat";
const FEED: &str = "/echo.Echo/Feed";

type Replies = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// The status that answers a message over the limit.
fn status(limited: &tower_ratelimit::streams::Limited) -> Status {
    let (code, message, details) = limited.grpc_status();
    Status::with_details(Code::from(code), message, details)
}

/// `Chat`: echoes each message the limits admit; the first over them ends the call with its
/// status.
fn chat(connection: Connection, call: tonic::Request<Streaming<Bytes>>) -> Replies {
    let size = |m: &Result<Bytes, Status>| m.as_ref().ok().map(Bytes::len);
    Box::pin(connection.stream(call.into_inner(), size).map(|m| match m {
        Ok(message) => message,
        Err(limited) => Err(status(&limited)),
    }))
}

/// `Feed`: the server sends as many messages as the metadata `x-n` says, each decided on its
/// way out.
fn feed(connection: Connection, call: tonic::Request<Streaming<Bytes>>) -> Replies {
    let n: usize = (call.metadata().get("x-n"))
        .and_then(|n| n.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let items = futures_util::stream::iter(0..n).map(|i| Bytes::from(i.to_string()));
    Box::pin(
        connection
            .stream(items, |_| Some(1))
            .outbound()
            .map(|m| match m {
                Ok(message) => Ok(message),
                Err(limited) => Err(status(&limited)),
            }),
    )
}

type Reply = fn(Connection, tonic::Request<Streaming<Bytes>>) -> Replies;

/// A gRPC server of `Chat` and `Feed` whose messages `limiter` decides.
async fn serve(limiter: StreamLimiter) -> SocketAddr {
    use axum::routing::post;
    let handler = |reply: Reply| {
        let limiter = limiter.clone();
        move |request: http::Request<axum::body::Body>| {
            let opened = limiter.open(&request);
            async move {
                let connection = match opened.await {
                    Ok(connection) => connection,
                    Err(refusal) => return refusal.map(axum::body::Body::from),
                };
                let service = tower::service_fn(move |call: tonic::Request<Streaming<Bytes>>| {
                    let replies = reply(connection.clone(), call);
                    async move { Ok::<_, Status>(tonic::Response::new(replies)) }
                });
                let mut grpc = tonic::server::Grpc::new(Raw);
                grpc.streaming(service, request)
                    .await
                    .map(axum::body::Body::new)
            }
        }
    };
    let router = axum::Router::new()
        .route(CHAT, post(handler(chat)))
        .route(FEED, post(handler(feed)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::from(router))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

/// A call of `path` on the server at `addr`, keyed `key`, sending `messages` (and the
/// metadata `x-n`: `n`): the replies.
async fn call(
    addr: SocketAddr,
    path: &'static str,
    key: &str,
    n: usize,
    messages: Vec<&'static str>,
) -> Streaming<Bytes> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect to the gRPC server");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let outgoing = futures_util::stream::iter(
        messages
            .into_iter()
            .map(|m: &'static str| Bytes::from_static(m.as_bytes())),
    );
    let mut request = tonic::Request::new(outgoing);
    request.metadata_mut().insert("x-key", key.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-n", n.to_string().parse().unwrap());
    let path = PathAndQuery::from_static(path);
    grpc.streaming(request, path, Raw)
        .await
        .unwrap()
        .into_inner()
}

async fn exhausted_across_two_servers<St: Store>(one: St, two: St, clock: ManualClock) {
    let over = OverLimit::close(CloseCode::TRY_AGAIN_LATER);
    let one = serve(support::stream_limiter(
        one,
        Some(&clock),
        Policy::gcra("3/h"),
        over,
    ))
    .await;
    let two = serve(support::stream_limiter(
        two,
        Some(&clock),
        Policy::gcra("3/h"),
        over,
    ))
    .await;
    let mut first = call(one, CHAT, "k", 0, vec!["a", "b"]).await;
    assert_eq!(first.message().await.unwrap().unwrap(), "a");
    assert_eq!(first.message().await.unwrap().unwrap(), "b");
    assert!(first.message().await.unwrap().is_none(), "the call ends");
    let mut second = call(two, CHAT, "k", 0, vec!["c", "d", "e"]).await;
    assert_eq!(second.message().await.unwrap().unwrap(), "c");
    let status = second.message().await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded (messages)");
    let retry = status.get_details_retry_info().expect("a RetryInfo");
    let delay = retry.retry_delay.expect("a delay");
    assert!((1199..=1200).contains(&delay.as_secs()), "{delay:?}");
    let failure = status.get_details_quota_failure().expect("a QuotaFailure");
    assert_eq!(failure.violations[0].subject, "messages");
    // Another key's call is not touched.
    let mut other = call(one, CHAT, "other", 0, vec!["f"]).await;
    assert_eq!(other.message().await.unwrap().unwrap(), "f");
}

on_two_of_each_store!(
    exhausted_across_two_servers,
    "streams-grpc:",
    a_keys_stream_messages_across_two_servers_are_exhausted_past_the_limit_in_memory,
    a_keys_stream_messages_across_two_servers_are_exhausted_past_the_limit_on_redis,
    a_keys_stream_messages_across_two_servers_are_exhausted_past_the_limit_on_the_cluster
);

/// A server stream of 8 messages at 20 a second with no burst: each waits its turn, so the
/// last comes no sooner than 7 intervals after the first (real time: a tolerance of two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_streams_messages_wait_their_turn() {
    let over = OverLimit::wait(Duration::from_secs(5));
    let store = tower_ratelimit::MemoryStore::new();
    let server = serve(support::stream_limiter(
        store,
        None,
        Policy::gcra("20/s").burst(1),
        over,
    ))
    .await;
    let started = Instant::now();
    let mut feed = call(server, FEED, "f", 8, vec![]).await;
    for i in 0..8 {
        assert_eq!(feed.message().await.unwrap().unwrap(), i.to_string());
    }
    assert!(feed.message().await.unwrap().is_none());
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(250), "{took:?}");
}
