//! Messages through a WebSocket (`scripts/bench.sh`, rows 14): an echo server in process on
//! loopback, on a runtime of one thread of its own, and a client on another thread that opens
//! the socket with tokio-tungstenite, then writes text frames of 100 bytes ready-made, many
//! per write, while counting the echoed bytes: it does little per message, so the server is
//! the one kept busy. The messages are decided by a `StreamLimiter` against the same echo
//! without it. Not an example of how to use the crate.
//!
//! ```text
//! streams memory [--runs 101] [--messages 100000] # messages/s, plain and limited (memory)
//! streams redis URL [--messages 20000]            # through a Redis store with leases of 20
//! ```
//!
//! The limited echo's policy is GCRA 1,000,000/s, so every message is admitted and charged;
//! in Redis it takes leases of 20 units. Runs alternate, each going first in turn. Two figures
//! a run: messages per second of the wall clock, and of the server thread's CPU time
//! (`/proc/thread-self/schedstat`: user and kernel time), the throughput of a saturated core,
//! which is what the layer's work takes from. The kernel's work on loopback, most of the
//! echo's, changes its pace from run to run by up to a fifth on a shared 2-core machine; so
//! the ratios are medians of each limited run's rate against the plain run beside it. Output
//! is `name=value` lines, medians; `scripts/bench.sh` counts the store's calls around the
//! Redis run.

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

#[path = "common/args.rs"]
mod args;
use args::{arg, median};

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

/// A client's text frame of 100 bytes, masked (by a key of zeros, which leaves it as it is).
const FRAME: [u8; 106] = {
    let mut frame = [b'x'; 106];
    (frame[0], frame[1]) = (0x81, 0x80 | 100);
    (frame[2], frame[3], frame[4], frame[5]) = (0, 0, 0, 0);
    frame
};

/// The server's echo of [`FRAME`]: two bytes of header and the text.
const ECHOED: usize = 2 + 100;

/// Sends `n` messages of 100 bytes on a new socket to `path` while reading their echoes:
/// messages per second from the first sent to the last echoed, and per second of the server
/// thread's time. Once the socket is open, the client writes its frames ready-made, many per
/// write, and counts the echoed bytes without reading frames: it does little per message, so
/// the server is the one kept busy and measured.
async fn messages_per_second(server: &Server, path: &str, n: usize) -> Rate {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::MaybeTlsStream;
    let url = format!("ws://{}{path}", server.addr);
    let (client, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let MaybeTlsStream::Plain(socket) = client.into_inner() else {
        unreachable!("a plain socket")
    };
    let (mut reader, mut writer) = socket.into_split();
    let chunk: Vec<u8> = FRAME
        .iter()
        .copied()
        .cycle()
        .take(FRAME.len() * 256)
        .collect();
    let (started, ran) = (Instant::now(), server.cpu_ns());
    let sending = tokio::spawn(async move {
        let mut left = n;
        while left > 0 {
            let frames = left.min(256);
            writer
                .write_all(&chunk[..frames * FRAME.len()])
                .await
                .unwrap();
            left -= frames;
        }
        writer
    });
    let (mut buffer, mut echoed) = (vec![0; 1 << 16], 0);
    while echoed < n * ECHOED {
        let read = reader.read(&mut buffer).await.unwrap();
        assert!(read > 0, "the server closed the socket");
        echoed += read;
    }
    let (took, ran) = (started.elapsed(), server.cpu_ns() - ran);
    drop(sending.await.unwrap());
    Rate {
        wall: n as f64 / took.as_secs_f64(),
        cpu: n as f64 / (ran as f64 / 1e9),
    }
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
    // Each limited run against the plain run beside it: what changes slowly on a shared
    // machine (the kernel's pace on loopback, the neighbours' load) moves both alike.
    let ratio =
        |f: fn(&Rate) -> f64| median(ours.iter().zip(&bare).map(|(o, b)| f(o) / f(b)).collect());
    println!("ws_memory_ratio={:.3}", ratio(|r| r.wall));
    println!("ws_memory_cpu_ratio={:.3}", ratio(|r| r.cpu));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match args.first().map(String::as_str) {
        Some("memory") => {
            let n = arg(&args, "--messages", 100_000);
            runtime.block_on(memory(arg(&args, "--runs", 101), n));
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
