//! The demo server's WebSocket contract (`GET /ws`, `MESSAGE_LIMIT`, `ON_MESSAGE_LIMIT`),
//! checked from outside: in memory, on two servers sharing one Redis, and on two sharing a
//! cluster; a key's messages shared across its sockets on both servers.

#[macro_use]
mod support;

use std::time::{Duration, Instant};

use futures_util::SinkExt;
use support::demo::{DemoServer, start_error};
use support::ws::{connect, next, say, try_connect};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// Runs `scenario` on a runtime of its own (the demo tests are synchronous).
fn run<F: Future<Output = ()>>(scenario: F) {
    tokio::runtime::Runtime::new().unwrap().block_on(scenario);
}

const CLOSE: [(&str, &str); 3] = [
    ("MESSAGE_LIMIT", "3/min"),
    ("KEY", "header:x-key"),
    ("RATE_LIMIT", "100/s"),
];

fn closed(a: &DemoServer, b: &DemoServer) {
    run(async {
        let mut first = connect(a.addr, "k").await;
        assert_eq!(say(&mut first, "1").await, Message::text("1"));
        let binary = Message::binary(vec![0u8, 1, 2]);
        first.send(binary.clone()).await.unwrap();
        assert_eq!(next(&mut first).await, binary);
        let mut second = connect(b.addr, "k").await;
        assert_eq!(say(&mut second, "3").await, Message::text("3"));
        let Message::Close(Some(frame)) = say(&mut second, "4").await else {
            panic!("a close frame");
        };
        assert_eq!(frame.code, CloseCode::Policy);
        assert_eq!(frame.reason.as_str(), "rate limited: messages");
        // Another key's socket is not touched.
        let mut other = connect(a.addr, "other").await;
        assert_eq!(say(&mut other, "5").await, Message::text("5"));
    });
}

on_each_demo_store!(
    closed,
    CLOSE,
    "demo-ws-close:",
    a_socket_past_message_limit_is_closed_with_1008_in_memory,
    a_socket_past_message_limit_is_closed_with_1008_on_two_servers_of_one_redis,
    a_socket_past_message_limit_is_closed_with_1008_on_two_servers_of_a_cluster
);

const ERROR: [(&str, &str); 4] = [
    ("MESSAGE_LIMIT", "3/min"),
    ("ON_MESSAGE_LIMIT", "error"),
    ("KEY", "header:x-key"),
    ("RATE_LIMIT", "100/s"),
];

fn answered(a: &DemoServer, b: &DemoServer) {
    run(async {
        let (mut first, mut second) = (connect(a.addr, "k").await, connect(b.addr, "k").await);
        assert_eq!(say(&mut first, "1").await, Message::text("1"));
        assert_eq!(say(&mut second, "2").await, Message::text("2"));
        assert_eq!(say(&mut first, "3").await, Message::text("3"));
        for client in [&mut second, &mut first] {
            let Message::Text(error) = say(client, "4").await else {
                panic!("an error message");
            };
            let error: serde_json::Value = serde_json::from_str(error.as_str()).unwrap();
            assert_eq!(error["error"], "rate_limited");
            assert_eq!(error["policy"], "messages");
            let retry = error["retry_after_ms"].as_u64().unwrap();
            assert!(retry > 0 && retry <= 60_000, "{retry}");
            // The socket stays open.
            client.send(Message::Ping("p".into())).await.unwrap();
            assert_eq!(next(client).await, Message::Pong("p".into()));
        }
    });
}

on_each_demo_store!(
    answered,
    ERROR,
    "demo-ws-error:",
    a_message_past_message_limit_gets_an_error_and_the_socket_stays_in_memory,
    a_message_past_message_limit_gets_an_error_and_the_socket_stays_on_two_servers_of_one_redis,
    a_message_past_message_limit_gets_an_error_and_the_socket_stays_on_two_servers_of_a_cluster
);

const WAIT: [(&str, &str); 5] = [
    ("MESSAGE_LIMIT", "5/s"),
    ("ALGORITHM", "gcra"),
    ("ON_MESSAGE_LIMIT", "wait"),
    ("KEY", "header:x-key"),
    ("RATE_LIMIT", "100/s"),
];

/// Ten messages of one key at once on two servers, 5 a second: the first five at once, the
/// others one every 200 ms, so the last no sooner than a second after the first (real time:
/// a tolerance of 300 ms), and every one echoed.
fn waited(a: &DemoServer, b: &DemoServer) {
    run(async {
        let (mut first, mut second) = (connect(a.addr, "w").await, connect(b.addr, "w").await);
        let started = Instant::now();
        for i in 0..5 {
            first.send(Message::text(format!("a{i}"))).await.unwrap();
            second.send(Message::text(format!("b{i}"))).await.unwrap();
        }
        for i in 0..5 {
            assert_eq!(next(&mut first).await, Message::text(format!("a{i}")));
            assert_eq!(next(&mut second).await, Message::text(format!("b{i}")));
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(700), "{took:?}");
    });
}

on_each_demo_store!(
    waited,
    WAIT,
    "demo-ws-wait:",
    messages_past_message_limit_wait_their_turn_in_memory,
    messages_past_message_limit_wait_their_turn_on_two_servers_of_one_redis,
    messages_past_message_limit_wait_their_turn_on_two_servers_of_a_cluster
);

const CONNECTIONS: [(&str, &str); 3] = [
    ("CONNECTIONS", "2"),
    ("KEY", "header:x-key"),
    ("RATE_LIMIT", "100/s"),
];

fn bounded(a: &DemoServer, b: &DemoServer) {
    run(async {
        let mut first = connect(a.addr, "c").await;
        let mut second = connect(b.addr, "c").await;
        assert_eq!(say(&mut second, "1").await, Message::text("1"));
        for server in [a, b] {
            let refused = try_connect(server.addr, "c").await.err().map(|refused| {
                let retry = refused.headers().get("retry-after");
                let retry = retry.map_or(String::new(), |v| v.to_str().unwrap().to_owned());
                (refused.status().as_u16(), retry)
            });
            assert_eq!(refused, Some((429, "1".to_owned())), "a third socket");
        }
        connect(a.addr, "other").await;
        first.close(None).await.unwrap();
        support::eventually("the closed socket's place is free", async || {
            try_connect(b.addr, "c").await.is_ok()
        })
        .await;
        assert_eq!(say(&mut second, "2").await, Message::text("2"));
    });
}

on_each_demo_store!(
    bounded,
    CONNECTIONS,
    "demo-ws-connections:",
    a_keys_sockets_past_connections_are_refused_before_upgrading_in_memory,
    a_keys_sockets_past_connections_are_refused_before_upgrading_on_two_servers_of_one_redis,
    a_keys_sockets_past_connections_are_refused_before_upgrading_on_two_servers_of_a_cluster
);

#[test]
fn a_socket_open_past_max_connection_s_is_closed_with_1013() {
    let server = DemoServer::start(&[("MAX_CONNECTION_S", "1"), ("CONNECTIONS", "1")]);
    run(async {
        let started = Instant::now();
        let mut client = connect(server.addr, "l").await;
        assert_eq!(say(&mut client, "1").await, Message::text("1"));
        let Message::Close(Some(frame)) = next(&mut client).await else {
            panic!("a close frame");
        };
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert_eq!(frame.code, CloseCode::Again);
        assert_eq!(frame.reason.as_str(), "connection lifetime ended");
        // Its place is free again.
        support::eventually("the place is free", async || {
            try_connect(server.addr, "l").await.is_ok()
        })
        .await;
    });
}

#[test]
fn without_message_limit_the_socket_echoes_everything() {
    let server = DemoServer::start(&[("RATE_LIMIT", "100/s")]);
    run(async {
        let mut client = connect(server.addr, "k").await;
        for i in 0..50 {
            let text = i.to_string();
            assert_eq!(say(&mut client, &text).await, Message::text(text));
        }
    });
}

#[test]
fn bad_values_stop_the_server_naming_the_variable() {
    for (name, value) in [
        ("MESSAGE_LIMIT", "lots"),
        ("MESSAGE_LIMIT", "0/s"),
        ("ON_MESSAGE_LIMIT", "drop"),
        ("CONNECTIONS", "0"),
        ("CONNECTIONS", "many"),
        ("MAX_CONNECTION_S", "-1"),
    ] {
        let err = start_error(&[("MESSAGE_LIMIT", "5/s"), (name, value)]);
        assert!(err.contains(name), "{name}={value}: {err}");
    }
}

/// The close frame that ends `client`'s socket, within 20 s.
async fn close_frame(client: &mut support::ws::Client) -> (CloseCode, String) {
    use futures_util::StreamExt;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), client.next())
            .await
            .expect("an answer within 20 s")
            .expect("a close frame before the socket ends")
            .expect("a message, not an error");
        if let Message::Close(Some(frame)) = message {
            return (frame.code, frame.reason.as_str().to_owned());
        }
    }
}

/// `/ws` reads messages of `WS_MAX_MESSAGE` bytes at most (1 MiB by default): one at the bound
/// is echoed, one past it closes the socket with 1009 (message too big), with `MESSAGE_LIMIT`
/// too; a bad value stops the server naming the variable.
#[test]
fn a_message_past_ws_max_message_closes_its_socket_with_1009() {
    let small = DemoServer::start(&[("WS_MAX_MESSAGE", "4096")]);
    let limited = DemoServer::start(&[("WS_MAX_MESSAGE", "4096"), ("MESSAGE_LIMIT", "100/s")]);
    let default = DemoServer::start(&[]);
    run(async {
        for (server, bound) in [(&small, 4096), (&limited, 4096), (&default, 1 << 20)] {
            let mut client = connect(server.addr, "k").await;
            let at = Message::binary(vec![7u8; bound]);
            client.send(at.clone()).await.unwrap();
            assert_eq!(next(&mut client).await, at, "{bound} bytes echoed");
            assert_eq!(say(&mut client, "small").await, Message::text("small"));
            // The server may close before it has read the whole message.
            let _ = client.send(Message::binary(vec![7u8; bound + 1])).await;
            let (code, reason) = close_frame(&mut client).await;
            assert_eq!(code, CloseCode::Size, "{bound} + 1 bytes: {reason}");
            assert!(reason.contains("too big"), "{reason}");
        }
    });
    for bad in ["0", "1M", "67108865"] {
        let err = start_error(&[("WS_MAX_MESSAGE", bad)]);
        assert!(err.starts_with("error: WS_MAX_MESSAGE:"), "{bad}: {err}");
    }
}
