//! Messages of long-lived connections (`tower_ratelimit::streams`): a key's WebSocket
//! messages across two servers sharing a store (in memory, two instances of one Redis, the
//! cluster), answered by a close frame (1008, naming the policy) or an error message that
//! leaves the socket open, control frames never counted; waiting as backpressure on one
//! schedule; any stream's items; configuration mistakes.

#[macro_use]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::{Message as WsMessage, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use support::ws::{connect, next, say, try_connect};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCode;
use tower_ratelimit::key::HeaderKey;
use tower_ratelimit::streams::{Answer, CloseCode, Connection, OverLimit, StreamLimiter};
use tower_ratelimit::{ManualClock, Policy, RateLimitLayer, Store};

async fn echo(upgrade: WebSocketUpgrade, limits: Connection) -> Response {
    upgrade.on_upgrade(move |socket| async move {
        let mut socket = limits.socket(socket);
        while let Some(Ok(message)) = socket.recv().await {
            // Pings are answered by the socket itself.
            let data = matches!(message, WsMessage::Text(_) | WsMessage::Binary(_));
            if data && socket.send(message).await.is_err() {
                break;
            }
        }
    })
}

/// An echo WebSocket server at `/ws` whose messages `limiter` decides.
async fn serve(limiter: StreamLimiter) -> SocketAddr {
    let app = Router::new()
        .route("/ws", get(echo))
        .layer(axum::Extension(limiter));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Asserts a close frame of `code` whose reason names the policy.
fn assert_closed(message: &Message, code: u16) {
    let Message::Close(Some(frame)) = message else {
        panic!("a close frame, not {message:?}");
    };
    assert_eq!(frame.code, WsCode::from(code));
    assert_eq!(frame.reason.as_str(), "rate limited: messages");
}

async fn closed_over_the_limit<St: Store>(one: St, two: St, clock: ManualClock) {
    let over = OverLimit::close(CloseCode::POLICY_VIOLATION);
    let gcra = || Policy::gcra("3/h");
    let one = serve(support::stream_limiter(one, Some(&clock), gcra(), over)).await;
    let two = serve(support::stream_limiter(two, Some(&clock), gcra(), over)).await;
    let mut first = connect(one, "a").await;
    for text in ["1", "2"] {
        assert_eq!(say(&mut first, text).await, Message::text(text));
    }
    // The key's third message on the other server, on a socket of its own.
    let mut second = connect(two, "a").await;
    assert_eq!(say(&mut second, "3").await, Message::text("3"));
    // Control frames are never counted.
    first.send(Message::Ping("p".into())).await.unwrap();
    assert_eq!(next(&mut first).await, Message::Pong("p".into()));
    assert_closed(&say(&mut second, "4").await, 1008);
    assert_closed(&say(&mut first, "5").await, 1008);
    // Another key is not touched.
    let mut other = connect(two, "b").await;
    assert_eq!(say(&mut other, "6").await, Message::text("6"));
}

on_two_of_each_store!(
    closed_over_the_limit,
    "streams-close:",
    a_keys_messages_across_two_servers_close_past_the_limit_in_memory,
    a_keys_messages_across_two_servers_close_past_the_limit_on_redis,
    a_keys_messages_across_two_servers_close_past_the_limit_on_the_cluster
);

async fn answered_with_an_error<St: Store>(one: St, two: St, clock: ManualClock) {
    let gcra = || Policy::gcra("3/h");
    let one = serve(support::stream_limiter(
        one,
        Some(&clock),
        gcra(),
        OverLimit::error(),
    ))
    .await;
    let two = serve(support::stream_limiter(
        two,
        Some(&clock),
        gcra(),
        OverLimit::error(),
    ))
    .await;
    let (mut first, mut second) = (connect(one, "e").await, connect(two, "e").await);
    assert_eq!(say(&mut first, "1").await, Message::text("1"));
    assert_eq!(say(&mut second, "2").await, Message::text("2"));
    assert_eq!(say(&mut first, "3").await, Message::text("3"));
    let Message::Text(error) = say(&mut second, "4").await else {
        panic!("an error message");
    };
    let error: serde_json::Value = serde_json::from_str(error.as_str()).unwrap();
    assert_eq!(error["error"], "rate_limited");
    assert_eq!(error["policy"], "messages");
    // GCRA of 3 an hour: the next unit in 20 minutes.
    let retry = error["retry_after_ms"].as_u64().unwrap();
    assert!((1_199_000..=1_200_000).contains(&retry), "{retry}");
    // The socket stays open, and takes a message once there is room.
    clock.advance(Duration::from_secs(20 * 60));
    assert_eq!(say(&mut second, "5").await, Message::text("5"));
    let Message::Text(again) = say(&mut first, "6").await else {
        panic!("an error message");
    };
    assert!(again.as_str().contains("rate_limited"));
}

on_two_of_each_store!(
    answered_with_an_error,
    "streams-error:",
    messages_over_the_limit_get_an_error_and_the_socket_stays_in_memory,
    messages_over_the_limit_get_an_error_and_the_socket_stays_on_redis,
    messages_over_the_limit_get_an_error_and_the_socket_stays_on_the_cluster
);

/// Twelve messages of one key sent at once on two servers, 20 a second with no burst: each
/// waits its turn on one schedule, so the last is echoed no sooner than 11 intervals after
/// the first (real time: a tolerance of two intervals).
async fn waiting_shares_one_schedule<St: Store>(one: St, two: St) {
    let over = OverLimit::wait(Duration::from_secs(5));
    let policy = || Policy::gcra("20/s").burst(1);
    let one = serve(support::stream_limiter(one, None, policy(), over)).await;
    let two = serve(support::stream_limiter(two, None, policy(), over)).await;
    let (mut first, mut second) = (connect(one, "w").await, connect(two, "w").await);
    let started = Instant::now();
    for i in 0..6 {
        first.send(Message::text(format!("a{i}"))).await.unwrap();
        second.send(Message::text(format!("b{i}"))).await.unwrap();
    }
    for i in 0..6 {
        assert_eq!(next(&mut first).await, Message::text(format!("a{i}")));
        assert_eq!(next(&mut second).await, Message::text(format!("b{i}")));
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(450), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_messages_share_one_schedule_in_memory() {
    let store = tower_ratelimit::MemoryStore::new();
    waiting_shares_one_schedule(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_messages_share_one_schedule_on_two_instances_of_one_redis() {
    let server = support::RedisServer::start();
    let store = || server.store_calling("streams-wait:", None, true);
    waiting_shares_one_schedule(store().await, store().await).await;
    support::assert_no_key_without_ttl(&server, "streams-wait:");
}

/// At most `n` sockets of a key (`x-key`) at once, on `store`.
fn connections<St: Store>(store: St, clock: &ManualClock, n: u32) -> StreamLimiter {
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .key(HeaderKey::try_new("x-key").unwrap())
        .policy(
            Policy::concurrency(n)
                .name("connections")
                .max_duration(Duration::from_secs(3600)),
        )
        .store(store)
        .build()
        .unwrap();
    StreamLimiter::builder().connections(layer).build().unwrap()
}

async fn sockets_per_key<St: Store>(one: St, two: St, clock: ManualClock) {
    let one = serve(connections(one, &clock, 2)).await;
    let two = serve(connections(two, &clock, 2)).await;
    let mut first = connect(one, "c").await;
    let mut second = connect(two, "c").await;
    assert_eq!(say(&mut second, "open").await, Message::text("open"));
    for server in [one, two] {
        let refused = try_connect(server, "c").await.expect_err("a third socket");
        assert_eq!(refused.status(), http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()["retry-after"], "1");
    }
    // Another key's sockets are its own.
    connect(two, "d").await;
    // A socket closed frees its place at once: as soon as the server has seen it go.
    first.close(None).await.unwrap();
    support::eventually("the closed socket's place is free", async || {
        try_connect(two, "c").await.is_ok()
    })
    .await;
    // The socket still open keeps its place, and works.
    assert_eq!(say(&mut second, "still").await, Message::text("still"));
}

on_two_of_each_store!(
    sockets_per_key,
    "streams-connections:",
    a_keys_sockets_across_two_servers_are_bounded_in_memory,
    a_keys_sockets_across_two_servers_are_bounded_on_redis,
    a_keys_sockets_across_two_servers_are_bounded_on_the_cluster
);

/// A plain HTTP request on a new connection to `addr`: the status line's code, or `None` when
/// the connection was closed without an answer.
async fn over_a_new_connection(addr: SocketAddr) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let sent = tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if sent.await.is_err() {
        return None;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer));
    match read.await.expect("an answer or the end within 10 s") {
        Ok(_) if answer.starts_with(b"HTTP/1.1 ") => Some(
            std::str::from_utf8(&answer[9..12])
                .unwrap()
                .parse()
                .unwrap(),
        ),
        _ => None,
    }
}

async fn accepts_per_address<St: Store>(one: St, two: St, clock: ManualClock) {
    let serve_on = |store: St| {
        let layer = RateLimitLayer::builder()
            .clock(clock.clone())
            .key(tower_ratelimit::key::PeerIp::new())
            .policy(Policy::fixed_window("3/h").name("accepts"))
            .store(store)
            .build()
            .unwrap();
        async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let listener = tower_ratelimit::streams::LimitedListener::new(listener, layer);
            let app = Router::new().route("/", get(|| async { "hello" }));
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            addr
        }
    };
    let (one, two) = (serve_on(one).await, serve_on(two).await);
    for server in [one, two, one] {
        assert_eq!(over_a_new_connection(server).await, Some(200));
    }
    // The address's fourth connection, on either server, is closed unanswered.
    assert_eq!(over_a_new_connection(two).await, None);
    assert_eq!(over_a_new_connection(one).await, None);
    clock.advance(Duration::from_secs(3600));
    assert_eq!(over_a_new_connection(two).await, Some(200));
}

on_two_of_each_store!(
    accepts_per_address,
    "streams-accepts:",
    connections_accepted_per_address_across_two_listeners_in_memory,
    connections_accepted_per_address_across_two_listeners_on_redis,
    connections_accepted_per_address_across_two_listeners_on_the_cluster
);

/// A socket open longer than its lifetime is closed with 1013 (real time, a lifetime of
/// 300 ms: closed no sooner, and within 10 s).
#[tokio::test]
async fn a_socket_past_its_lifetime_is_closed_with_1013() {
    let limiter = StreamLimiter::builder()
        .max_lifetime(Duration::from_millis(300))
        .build()
        .unwrap();
    let server = serve(limiter).await;
    let started = Instant::now();
    let mut client = connect(server, "l").await;
    assert_eq!(say(&mut client, "1").await, Message::text("1"));
    let Message::Close(Some(frame)) = next(&mut client).await else {
        panic!("a close frame");
    };
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(frame.code, WsCode::from(1013));
    assert_eq!(frame.reason.as_str(), "connection lifetime ended");
}

/// A socket that always has a message to read, and keeps what it is sent.
#[derive(Default)]
struct Busy {
    sent: Vec<WsMessage>,
}

impl futures_util::Stream for Busy {
    type Item = Result<WsMessage, std::convert::Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::task::Poll::Ready(Some(Ok(WsMessage::text("x"))))
    }
}

impl futures_util::Sink<WsMessage> for Busy {
    type Error = std::convert::Infallible;

    fn poll_ready(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn start_send(mut self: std::pin::Pin<&mut Self>, item: WsMessage) -> Result<(), Self::Error> {
        self.sent.push(item);
        Ok(())
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// A client that never stops sending is closed at its lifetime's end all the same.
#[tokio::test(start_paused = true)]
async fn a_busy_socket_past_its_lifetime_is_closed_with_1013() {
    let limiter = StreamLimiter::builder()
        .max_lifetime(Duration::from_secs(60))
        .build()
        .unwrap();
    let request = http::Request::new(());
    let mut socket = limiter
        .open(&request)
        .await
        .unwrap()
        .socket(Busy::default());
    for _ in 0..3 {
        assert!(matches!(socket.next().await, Some(Ok(_))));
    }
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(matches!(socket.next().await, Some(Ok(_))), "not yet");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(socket.next().await.is_none(), "ended");
    let [WsMessage::Close(Some(frame))] = socket.get_ref().sent.as_slice() else {
        panic!("one close frame, not {:?}", socket.get_ref().sent);
    };
    assert_eq!(frame.code, 1013);
}

#[tokio::test]
async fn a_message_that_would_wait_too_long_gets_the_answer_after_the_wait() {
    let clock = ManualClock::new();
    let over = OverLimit::wait(Duration::from_secs(1)).then(OverLimit::error());
    let messages = support::stream_limiter(
        tower_ratelimit::MemoryStore::builder()
            .clock(clock.clone())
            .build(),
        Some(&clock),
        Policy::gcra("1/min"),
        over,
    );
    let request = http::Request::builder().header("x-key", "t").body(());
    let connection = messages.open(&request.unwrap()).await.unwrap();
    let inbound = tower_ratelimit::streams::Direction::Inbound;
    connection.admit(1, inbound).await.unwrap();
    let limited = connection.admit(1, inbound).await.unwrap_err();
    assert_eq!(limited.answer(), Answer::Error);
    assert_eq!(limited.policy(), "messages");
    assert!(limited.retry_after().unwrap() > Duration::from_secs(59));
}

#[tokio::test]
async fn any_streams_items_are_decided_and_a_close_ends_it() {
    let clock = ManualClock::new();
    let request = http::Request::builder()
        .header("x-key", "s")
        .body(())
        .unwrap();
    for (over, after) in [
        (OverLimit::error(), vec![false, false, false]),
        (OverLimit::close(CloseCode::TRY_AGAIN_LATER), vec![false]),
    ] {
        let store = tower_ratelimit::MemoryStore::builder()
            .clock(clock.clone())
            .build();
        let messages =
            support::stream_limiter(store, Some(&clock), Policy::fixed_window("2/h"), over);
        let items = futures_util::stream::iter(1..=5);
        let decided: Vec<bool> = (messages.open(&request).await.unwrap())
            .stream(items, |_| Some(1))
            .map(|item| item.is_ok())
            .collect()
            .await;
        let expected: Vec<bool> = [true, true].into_iter().chain(after).collect();
        assert_eq!(decided, expected, "{over:?}");
    }
    // An item not counted goes through.
    let store = tower_ratelimit::MemoryStore::builder()
        .clock(clock.clone())
        .build();
    let messages = support::stream_limiter(
        store,
        Some(&clock),
        Policy::fixed_window("1/h"),
        OverLimit::error(),
    );
    let items = futures_util::stream::iter(1..=4);
    let odd = |n: &i32| (n % 2 == 1).then_some(1);
    let connection = messages.open(&request).await.unwrap();
    let decided: Vec<bool> = (connection.stream(items, odd))
        .map(|item| item.is_ok())
        .collect()
        .await;
    assert_eq!(decided, [true, true, false, true]);
}

/// A connection's key is taken when it opens; its messages still follow the policies a
/// reload puts in place, and the exemptions and the keys of other connections.
#[tokio::test]
async fn a_connection_follows_a_reload_of_its_policies() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::try_new("x-key").unwrap())
        .policy(Policy::fixed_window("2/h").name("messages"))
        .store(
            tower_ratelimit::MemoryStore::builder()
                .clock(clock.clone())
                .build(),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let limiter = StreamLimiter::builder()
        .messages(layer.clone())
        .on_limit(OverLimit::error())
        .build()
        .unwrap();
    let opened = |key: &str| {
        let request = http::Request::builder().header("x-key", key).body(());
        limiter.open(&request.unwrap())
    };
    let (a, b) = (opened("a").await.unwrap(), opened("b").await.unwrap());
    let admitted = |connection: &Connection| {
        let decided = connection.admit(10, tower_ratelimit::streams::Direction::Inbound);
        async move { decided.await.is_ok() }
    };
    assert!(admitted(&a).await && admitted(&a).await);
    assert!(!admitted(&a).await, "the third of 2/h");
    assert!(admitted(&b).await, "another key");
    // 5 an hour from now: the 2 used still count.
    layer
        .control()
        .reload([Policy::fixed_window("5/h").name("messages")])
        .unwrap();
    for n in 3..=5 {
        assert!(admitted(&a).await, "message {n} of 5/h");
    }
    let refused = a
        .admit(10, tower_ratelimit::streams::Direction::Inbound)
        .await;
    assert_eq!(refused.unwrap_err().policy(), "messages");
    // And a reload again, to one that applies to another path only: nothing is decided.
    let other = (Policy::fixed_window("1/h").name("messages")).route(None, "/other");
    layer.control().reload([other]).unwrap();
    assert!(admitted(&a).await, "no policy applies");
}

#[test]
fn mistakes_are_errors() {
    let layer = || {
        RateLimitLayer::builder()
            .policy(Policy::gcra("5/s").name("messages"))
            .build()
            .unwrap()
    };
    let unknown = StreamLimiter::builder()
        .messages(layer())
        .on_limit_of("nope", OverLimit::error())
        .build()
        .unwrap_err();
    assert!(unknown.to_string().contains("\"nope\""), "{unknown}");
    let long = StreamLimiter::builder()
        .messages(layer())
        .on_limit(OverLimit::wait(Duration::from_secs(3601)))
        .build()
        .unwrap_err();
    assert!(long.to_string().contains("at most an hour"), "{long}");
    let nothing = StreamLimiter::builder().build().unwrap_err();
    assert!(nothing.to_string().contains("limits nothing"), "{nothing}");
    let slots = RateLimitLayer::builder()
        .policy(Policy::concurrency(2).max_duration(Duration::from_secs(60)))
        .build()
        .unwrap();
    let outlives = StreamLimiter::builder()
        .connections(slots)
        .max_lifetime(Duration::from_secs(61))
        .build()
        .unwrap_err();
    assert!(outlives.to_string().contains("max_duration"), "{outlives}");
    let zero = StreamLimiter::builder()
        .max_lifetime(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(zero.to_string().contains("above zero"), "{zero}");
    assert!(CloseCode::new(1005).is_none());
    assert_eq!(CloseCode::new(4000).map(CloseCode::get), Some(4000));
}
