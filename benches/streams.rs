//! Messages through a WebSocket (`scripts/bench.sh`, rows 14): an echo server in process on
//! loopback, on a runtime of one thread of its own, and a tokio-tungstenite client on another
//! thread sending messages of 100 bytes while reading their echoes; the messages decided by a
//! `StreamLimiter` against the same echo without it. Not an example of how to use the crate.
//!
//! ```text
//! streams memory [--runs 31] [--messages 300000] # messages/s, plain and limited (memory)
//! streams redis URL [--messages 20000]           # through a Redis store with leases of 20
//! ```
//!
//! The limited echo's policy is GCRA 1,000,000/s, so every message is admitted and charged;
//! in Redis it takes leases of 20 units. Runs alternate, each going first in turn. Two figures
//! a run: messages per second of the wall clock (the client's view, which the other tasks of a
//! shared 2-core machine move by several percent from run to run), and messages per second of
//! the server thread's CPU time (`/proc/thread-self/schedstat`: user and kernel time), the
//! throughput of a saturated core, which is what the layer's work takes from. Output is
//! `name=value` lines, medians; `scripts/bench.sh` counts the store's calls around the Redis
//! run.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
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

/// The echo server: its address, and its thread's scheduler statistics.
struct Server {
    addr: SocketAddr,
    schedstat: PathBuf,
}

impl Server {
    /// Nanoseconds the server's thread has run.
    fn cpu_ns(&self) -> u64 {
        let stat = std::fs::read_to_string(&self.schedstat).expect("the thread's schedstat");
        let ran = stat.split_whitespace().next().expect("a first field");
        ran.parse().expect("nanoseconds")
    }
}

/// A server at `/plain` and `/limited` (its messages decided on the store `store` makes), on
/// loopback, run by a runtime of one thread of its own.
fn serve<St, F>(store: impl FnOnce() -> F + Send + 'static, lease: bool) -> Server
where
    St: Store,
    F: Future<Output = St>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new().name("server".into());
    let spawned = thread.spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut policy = Policy::gcra("1000000/s").name("messages");
            if lease {
                policy = policy.lease(20);
            }
            let layer = RateLimitLayer::builder()
                .store(store().await)
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
            let thread = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
            let addr = listener.local_addr().unwrap();
            tx.send(Server {
                addr,
                schedstat: PathBuf::from("/proc").join(thread).join("schedstat"),
            })
            .unwrap();
            axum::serve(listener, app).await.unwrap()
        })
    });
    spawned.expect("a server thread");
    rx.recv().unwrap()
}

/// Messages per second of a run.
struct Rate {
    wall: f64,
    cpu: f64,
}

/// Sends `n` messages of 100 bytes on a new socket to `path` while reading their echoes:
/// messages per second from the first sent to the last echoed, and per second of the server
/// thread's time.
async fn messages_per_second(server: &Server, path: &str, n: usize) -> Rate {
    let url = format!("ws://{}{path}", server.addr);
    let (client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let (mut sink, mut stream) = client.split();
    let payload = "x".repeat(100);
    let (started, ran) = (Instant::now(), server.cpu_ns());
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
    let (took, ran) = (started.elapsed(), server.cpu_ns() - ran);
    drop(sending.await.unwrap());
    Rate {
        wall: n as f64 / took.as_secs_f64(),
        cpu: n as f64 / (ran as f64 / 1e9),
    }
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

/// Plain and limited runs, alternating, each going first in turn: the medians.
async fn memory(runs: usize, n: usize) {
    let server = serve(|| async { tower_ratelimit::MemoryStore::new() }, false);
    messages_per_second(&server, "/limited", n / 10).await; // warm-up
    let (mut bare, mut ours) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let order = if run % 2 == 0 {
            [(&mut bare, "/plain"), (&mut ours, "/limited")]
        } else {
            [(&mut ours, "/limited"), (&mut bare, "/plain")]
        };
        for (rates, path) in order {
            rates.push(messages_per_second(&server, path, n).await);
        }
    }
    let of = |rates: &[Rate], f: fn(&Rate) -> f64| median(rates.iter().map(f).collect());
    println!("ws_plain_msgs_per_s={:.0}", of(&bare, |r| r.wall));
    println!("ws_memory_msgs_per_s={:.0}", of(&ours, |r| r.wall));
    println!("ws_plain_msgs_per_cpu_s={:.0}", of(&bare, |r| r.cpu));
    println!("ws_memory_msgs_per_cpu_s={:.0}", of(&ours, |r| r.cpu));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match args.first().map(String::as_str) {
        Some("memory") => {
            let n = arg(&args, "--messages", 300_000);
            runtime.block_on(memory(arg(&args, "--runs", 31), n));
        }
        Some("redis") => runtime.block_on(async {
            let n = arg(&args, "--messages", 20_000);
            let url = args.get(1).expect("a Redis URL").clone();
            let store = move || async move {
                let store = RedisStore::builder(&url).prefix("bench-ws:").build().await;
                store.expect("connect to Redis")
            };
            let rate = messages_per_second(&serve(store, true), "/limited", n).await;
            println!("ws_lease_messages={n}");
            println!("ws_lease_msgs_per_s={:.0}", rate.wall);
        }),
        _ => {
            eprintln!("usage: streams memory [--runs N] [--messages N] | streams redis URL");
            std::process::exit(2);
        }
    }
}
