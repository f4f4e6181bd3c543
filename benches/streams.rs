//! Messages through a WebSocket (`scripts/bench.sh`, rows 14): an echo server in process on
//! loopback, a tokio-tungstenite client sending messages of 100 bytes and reading their
//! echoes, with the messages decided by a `StreamLimiter` against the same echo without it.
//! Not an example of how to use the crate.
//!
//! ```text
//! streams memory [--runs 5] [--messages 100000] # messages/s, plain and limited (memory)
//! streams redis URL [--messages 20000]          # through a Redis store with leases of 20
//! ```
//!
//! The limited echo's policy is GCRA 1,000,000/s, so every message is admitted and charged;
//! in Redis it takes leases of 20 units. Output is `name=value` lines; `scripts/bench.sh`
//! counts the store's calls around the Redis run.

use std::net::SocketAddr;
use std::time::Instant;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use tower_ratelimit::streams::{Connection, StreamLimiter};
use tower_ratelimit::{Policy, RateLimitLayer, RedisStore, Store};

/// Echoes text and binary messages until the socket ends.
async fn echo<S, E>(mut socket: S)
where
    S: futures_util::Stream<Item = Result<Message, E>> + futures_util::Sink<Message> + Unpin,
{
    while let Some(Ok(message)) = socket.next().await {
        if matches!(message, Message::Text(_) | Message::Binary(_))
            && socket.send(message).await.is_err()
        {
            break;
        }
    }
}

async fn plain(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(|socket: WebSocket| echo(socket))
}

async fn limited(upgrade: WebSocketUpgrade, limits: Connection) -> Response {
    upgrade.on_upgrade(move |socket| echo(limits.socket(socket)))
}

/// A server at `/plain` and `/limited` (its messages decided on `store`), on loopback.
async fn serve<St: Store>(store: St, lease: bool) -> SocketAddr {
    let mut policy = Policy::gcra("1000000/s").name("messages");
    if lease {
        policy = policy.lease(20);
    }
    let layer = RateLimitLayer::builder()
        .store(store)
        .key(tower_ratelimit::key::GlobalKey)
        .policy(policy)
        .build()
        .unwrap();
    let limiter = StreamLimiter::builder().messages(layer).build().unwrap();
    let app = Router::new()
        .route("/plain", get(plain))
        .route("/limited", get(limited))
        .layer(axum::Extension(limiter));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Sends `n` messages of 100 bytes on a new socket to `path` while reading their echoes:
/// messages per second, from the first sent to the last echoed.
async fn messages_per_second(addr: SocketAddr, path: &str, n: usize) -> f64 {
    let url = format!("ws://{addr}{path}");
    let (client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let (mut sink, mut stream) = client.split();
    let payload = "x".repeat(100);
    let started = Instant::now();
    let sending = tokio::spawn(async move {
        for _ in 0..n {
            let message = tokio_tungstenite::tungstenite::Message::text(payload.as_str());
            sink.feed(message).await.unwrap();
        }
        sink.flush().await.unwrap();
        sink
    });
    for _ in 0..n {
        stream.next().await.unwrap().unwrap();
    }
    let took = started.elapsed();
    drop(sending.await.unwrap());
    n as f64 / took.as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    (args.iter().position(|a| a == name))
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let n = arg(&args, "--messages", 100_000);
    match args.first().map(String::as_str) {
        Some("memory") => runtime.block_on(async {
            let addr = serve(tower_ratelimit::MemoryStore::new(), false).await;
            messages_per_second(addr, "/limited", n / 10).await; // warm-up
            let (mut bare, mut ours) = (Vec::new(), Vec::new());
            // Interleaved runs, each going first in turn, so both see the machine alike.
            for run in 0..arg(&args, "--runs", 5) {
                if run % 2 == 0 {
                    bare.push(messages_per_second(addr, "/plain", n).await);
                    ours.push(messages_per_second(addr, "/limited", n).await);
                } else {
                    ours.push(messages_per_second(addr, "/limited", n).await);
                    bare.push(messages_per_second(addr, "/plain", n).await);
                }
            }
            println!("ws_plain_msgs_per_s={:.0}", median(bare));
            println!("ws_memory_msgs_per_s={:.0}", median(ours));
        }),
        Some("redis") => runtime.block_on(async {
            let url = args.get(1).expect("a Redis URL");
            let store = RedisStore::builder(url).prefix("bench-ws:").build().await;
            let addr = serve(store.expect("connect to Redis"), true).await;
            let rate = messages_per_second(addr, "/limited", n).await;
            println!("ws_lease_messages={n}");
            println!("ws_lease_msgs_per_s={rate:.0}");
        }),
        _ => {
            eprintln!("usage: streams memory [--runs N] [--messages N] | streams redis URL");
            std::process::exit(2);
        }
    }
}
