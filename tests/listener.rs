//! `LimitedListener`: a connection accepted holds its answer (a concurrency policy's slot) as
//! long as it lives, so a concurrency policy bounds the connections an address holds open,
//! across listeners sharing a store (in memory, two instances of one Redis, the cluster); its
//! decisions are made off the accept loop, several at once, at most as many as it is told: a
//! decision waiting for a paused Redis holds back no connection decided without it.

#[macro_use]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::serve::Listener;
use support::RedisServer;
use tokio::io::{AsyncReadExt, DuplexStream};
use tokio::sync::mpsc;
use tower_ratelimit::key::PeerIp;
use tower_ratelimit::lists::Lists;
use tower_ratelimit::streams::{LimitedIo, LimitedListener};
use tower_ratelimit::{ManualClock, Policy, RateLimitLayer, Store};

/// A listener that accepts the connections it is fed, counting them.
struct Fed {
    incoming: mpsc::UnboundedReceiver<(DuplexStream, SocketAddr)>,
    pulled: Arc<AtomicUsize>,
}

impl Listener for Fed {
    type Io = DuplexStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (DuplexStream, SocketAddr) {
        match self.incoming.recv().await {
            Some(connection) => {
                self.pulled.fetch_add(1, Ordering::SeqCst);
                connection
            }
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(([127, 0, 0, 1], 80).into())
    }
}

/// A `LimitedListener` around a [`Fed`] listener, accepting on a task of its own.
struct Accepting {
    feed: mpsc::UnboundedSender<(DuplexStream, SocketAddr)>,
    accepted: mpsc::UnboundedReceiver<LimitedIo<DuplexStream>>,
    pulled: Arc<AtomicUsize>,
}

impl Accepting {
    fn start<St: Store>(layer: RateLimitLayer<St>, most: usize) -> Self {
        let (feed, incoming) = mpsc::unbounded_channel();
        let (done, accepted) = mpsc::unbounded_channel();
        let pulled = Arc::new(AtomicUsize::new(0));
        let fed = Fed {
            incoming,
            pulled: pulled.clone(),
        };
        let mut listener = LimitedListener::new(fed, layer).deciding_at_most(most);
        tokio::spawn(async move {
            loop {
                let (io, _) = listener.accept().await;
                if done.send(io).is_err() {
                    return;
                }
            }
        });
        Accepting {
            feed,
            accepted,
            pulled,
        }
    }

    /// A connection from `peer`: the client's end.
    fn connect(&self, peer: &str) -> DuplexStream {
        let (client, server) = tokio::io::duplex(64);
        let peer = SocketAddr::new(peer.parse().unwrap(), 40000);
        self.feed.send((server, peer)).unwrap();
        client
    }

    /// The next connection accepted.
    async fn next(&mut self) -> LimitedIo<DuplexStream> {
        let next = tokio::time::timeout(Duration::from_secs(10), self.accepted.recv());
        next.await.expect("accepted within 10 s").unwrap()
    }
}

/// Asserts the connection whose client's end is `client` was closed unaccepted.
async fn assert_closed(client: &mut DuplexStream) {
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), client.read(&mut byte));
    assert_eq!(read.await.expect("closed within 10 s").unwrap(), 0);
}

/// At most 2 connections open per address, on `store`.
fn two_open<St: Store>(store: St, clock: &ManualClock) -> RateLimitLayer<St> {
    RateLimitLayer::builder()
        .clock(clock.clone())
        .key(PeerIp::new())
        .policy(
            Policy::concurrency(2)
                .name("open")
                .max_duration(Duration::from_secs(3600)),
        )
        .store(store)
        .build()
        .unwrap()
}

async fn open_connections<St: Store>(one: St, two: St, clock: ManualClock) {
    let mut one = Accepting::start(two_open(one, &clock), 8);
    let mut two = Accepting::start(two_open(two, &clock), 8);
    let _first = one.connect("192.0.2.1");
    let first = one.next().await;
    let _second = two.connect("192.0.2.1");
    let second = two.next().await;
    // The third, on either listener, is closed; another address is not touched.
    let mut third = one.connect("192.0.2.1");
    assert_closed(&mut third).await;
    let mut third = two.connect("192.0.2.1");
    assert_closed(&mut third).await;
    let _other = two.connect("192.0.2.2");
    let _other = two.next().await;
    // One closed: its place is free.
    drop(first);
    let _fourth = one.connect("192.0.2.1");
    let _fourth = one.next().await;
    let mut fifth = two.connect("192.0.2.1");
    assert_closed(&mut fifth).await;
    drop(second);
}

on_two_of_each_store!(
    open_connections,
    "listener-open:",
    a_concurrency_policy_bounds_the_connections_open_in_memory,
    a_concurrency_policy_bounds_the_connections_open_on_two_instances_of_one_redis,
    a_concurrency_policy_bounds_the_connections_open_on_the_cluster
);

/// Sends `signal` to the server's process.
fn signal(server: &RedisServer, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Redis paused (SIGSTOP): the decisions of two connections wait for it, and a connection from
/// an allowed network (decided without the store) is accepted meanwhile; a listener deciding
/// at most two at once accepts it only once one of them is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_decision_holds_back_no_other_connection() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let layer = |prefix: &'static str| {
        let server = &server;
        let clock = clock.clone();
        async move {
            RateLimitLayer::builder()
                .clock(clock.clone())
                .key(PeerIp::new())
                .policy(Policy::gcra("100/s").name("accepts"))
                .lists(Lists::new().allow(["198.51.100.0/24"]).kept_in_store(false))
                .store(server.store(prefix, &clock).await)
                .build()
                .unwrap()
        }
    };
    let mut three = Accepting::start(layer("slow-three:").await, 3);
    let mut two = Accepting::start(layer("slow-two:").await, 2);
    signal(&server, "-STOP");
    let _slow = [three.connect("192.0.2.1"), three.connect("192.0.2.2")];
    let _allowed = three.connect("198.51.100.1");
    let allowed = three.next().await;
    let _slow_too = [two.connect("192.0.2.1"), two.connect("192.0.2.2")];
    support::wait_until(Duration::from_secs(10), "two deciding", || {
        two.pulled.load(Ordering::SeqCst) == 2
    });
    let _held_back = two.connect("198.51.100.1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(two.pulled.load(Ordering::SeqCst), 2, "not accepted yet");
    assert!(two.accepted.try_recv().is_err());
    signal(&server, "-CONT");
    for _ in 0..3 {
        two.next().await;
    }
    for _ in 0..2 {
        three.next().await;
    }
    drop(allowed);
}
