//! A TCP proxy between a store and `redis-server` that a test drives: latency and jitter on
//! every reply, a bandwidth cap, a blackhole (connections accepted, nothing forwarded), a freeze
//! of the connections it holds (new ones pass), a reset after some bytes of a reply, a close in
//! the middle of a command. It forwards bytes, so TLS
//! passes through it untouched. It runs on a thread of its own, so a test on any runtime (or
//! none) drives it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower_ratelimit::{RedisStore, RedisStoreBuilder, RedisTls};

use super::tls::Pki;
use super::{RedisCluster, RedisServer};

/// The faults the proxy puts on its connections; the default is none.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Added before each piece of a reply is forwarded.
    pub latency: Duration,
    /// Up to this much more, drawn for each piece.
    pub jitter: Duration,
    /// Replies forwarded at most this fast (bytes a second).
    pub bytes_per_second: Option<u64>,
    /// Nothing forwarded either way; new connections accepted and held.
    pub blackhole: bool,
    /// The connection reset (RST) once this many more bytes of replies were forwarded; the
    /// fault is spent once it fired.
    pub reset_reply_after: Option<usize>,
    /// The next command cut in its middle: half of it forwarded, then both sides closed;
    /// spent once it fired.
    pub close_mid_command: bool,
    /// The connections open when it is set forward nothing more either way, and are never
    /// closed (as a NAT or a load balancer that forgot the flow); new ones pass.
    pub freeze_held: bool,
}

/// What the proxy saw, and its one-shot faults still armed.
#[derive(Debug, Default)]
struct Seen {
    accepted: AtomicUsize,
    resets: AtomicUsize,
    cuts: AtomicUsize,
    /// The reply bytes left before a reset, shared by every connection.
    budget: Mutex<Option<usize>>,
    /// Whether the next command is cut.
    cut: AtomicBool,
    /// Connections accepted before this many are frozen (with `freeze_held`).
    frozen_before: AtomicUsize,
}

/// A proxy to `127.0.0.1:upstream` on a free port of its own.
pub struct FaultProxy {
    port: u16,
    faults: watch::Sender<Faults>,
    seen: Arc<Seen>,
}

impl FaultProxy {
    pub fn start(upstream: u16) -> FaultProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().unwrap().port();
        let (faults, watching) = watch::channel(Faults::default());
        let seen = Arc::new(Seen::default());
        let s = seen.clone();
        std::thread::Builder::new()
            .name(format!("fault-proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the proxy's runtime");
                rt.block_on(serve(listener, upstream, watching, s));
            })
            .expect("the proxy's thread");
        FaultProxy { port, faults, seen }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:port` (`rediss://` when `tls`).
    pub fn url(&self, tls: bool) -> String {
        let scheme = if tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Puts `faults` on every connection from now on.
    pub fn set(&self, faults: Faults) {
        *self.seen.budget.lock().unwrap() = faults.reset_reply_after;
        self.seen
            .cut
            .store(faults.close_mid_command, Ordering::SeqCst);
        if faults.freeze_held {
            let accepted = self.seen.accepted.load(Ordering::SeqCst);
            self.seen.frozen_before.store(accepted, Ordering::SeqCst);
        }
        self.faults.send_replace(faults);
    }

    /// No more faults.
    pub fn clear(&self) {
        self.set(Faults::default());
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.seen.accepted.load(Ordering::SeqCst)
    }

    /// Connections reset, and commands cut, so far.
    pub fn fired(&self) -> (usize, usize) {
        (
            self.seen.resets.load(Ordering::SeqCst),
            self.seen.cuts.load(Ordering::SeqCst),
        )
    }
}

async fn serve(
    listener: std::net::TcpListener,
    upstream: u16,
    faults: watch::Receiver<Faults>,
    seen: Arc<Seen>,
) {
    let listener = TcpListener::from_std(listener).expect("the proxy's listener");
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let number = seen.accepted.fetch_add(1, Ordering::SeqCst);
        let (faults, seen) = (faults.clone(), seen.clone());
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            // A blackhole holds a new connection unanswered until it clears.
            let mut waiting = faults.clone();
            let _ = waiting.wait_for(|f| !f.blackhole).await;
            let addr = SocketAddr::from(([127, 0, 0, 1], upstream));
            let Ok(server) = TcpStream::connect(addr).await else {
                return;
            };
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let link = Arc::new(Link {
                faults,
                seen,
                number,
            });
            let commands = tokio::spawn(link.clone().commands(client_read, server_write));
            link.replies(server_read, client_write).await;
            commands.abort();
        });
    }
}

/// One connection's faults and what it saw.
struct Link {
    faults: watch::Receiver<Faults>,
    seen: Arc<Seen>,
    /// The connection's place among those accepted (from 0).
    number: usize,
}

impl Link {
    /// Commands, client to server.
    async fn commands(self: Arc<Self>, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            self.held().await;
            if self.seen.cut.swap(false, Ordering::SeqCst) {
                self.seen.cuts.fetch_add(1, Ordering::SeqCst);
                let _ = to.write_all(&buf[..n / 2]).await;
                let _ = to.shutdown().await;
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    }

    /// Replies, server to client, delayed, capped and cut as the faults say.
    async fn replies(&self, mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let faults = self.held().await;
            let delay = faults.latency + jitter(faults.jitter);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let (send, reset) = self.within_budget(n);
            let mut sent = 0;
            while sent < send {
                // The cap as it is now: a trickle ends as soon as the test clears it.
                let rate = self.faults.borrow().bytes_per_second;
                let piece = match rate {
                    Some(rate) => {
                        let piece = (send - sent).min((rate / 20).max(1) as usize);
                        tokio::time::sleep(Duration::from_secs_f64(piece as f64 / rate as f64))
                            .await;
                        piece
                    }
                    None => send - sent,
                };
                if to.write_all(&buf[sent..sent + piece]).await.is_err() {
                    return;
                }
                sent += piece;
            }
            if reset {
                self.seen.resets.fetch_add(1, Ordering::SeqCst);
                // SO_LINGER 0: closing sends a reset, not a FIN (once the other half, the
                // commands' task, is dropped too).
                let _ = to.as_ref().set_zero_linger();
                return;
            }
        }
        let _ = to.shutdown().await;
    }

    /// The faults once no blackhole, and no freeze of this connection, holds the traffic.
    async fn held(&self) -> Faults {
        let mut faults = self.faults.clone();
        let frozen = |f: &Faults| {
            f.freeze_held && self.number < self.seen.frozen_before.load(Ordering::SeqCst)
        };
        let now = faults.wait_for(|f| !f.blackhole && !frozen(f)).await;
        now.map(|f| f.clone()).unwrap_or_default()
    }

    /// How much of `n` reply bytes to forward, and whether the connection is then reset.
    fn within_budget(&self, n: usize) -> (usize, bool) {
        let mut budget = self.seen.budget.lock().unwrap();
        match *budget {
            Some(left) if left < n => {
                *budget = None;
                (left, true)
            }
            Some(left) => {
                *budget = Some(left - n);
                (n, false)
            }
            None => (n, false),
        }
    }
}

/// Up to `most`, uniformly.
fn jitter(most: Duration) -> Duration {
    if most.is_zero() {
        return Duration::ZERO;
    }
    use std::hash::{BuildHasher, RandomState};
    let random = RandomState::new().hash_one(0u8);
    Duration::from_nanos(random % (most.as_nanos() as u64 + 1))
}

/// A 3-primary cluster whose nodes announce the ports of fault proxies in front of them, so
/// that a store reaches every node through its proxy; with the proxies, in the nodes' order.
/// With `pki`, the nodes speak TLS only (to their clients and to each other).
pub fn cluster_behind_proxies(pki: Option<&Pki>) -> (RedisCluster, Vec<FaultProxy>) {
    let ports: Vec<u16> = (0..3).map(|_| super::free_port()).collect();
    let proxies: Vec<FaultProxy> = ports.iter().map(|&p| FaultProxy::start(p)).collect();
    let cli = pki.map(Pki::cli_args).unwrap_or_default();
    let nodes = ports
        .iter()
        .zip(&proxies)
        .map(|(&port, proxy)| {
            let (announce, bus) = (proxy.port().to_string(), super::free_port().to_string());
            let mut args: Vec<String> = super::CLUSTER_NODE.map(String::from).to_vec();
            args.extend(
                [
                    "--cluster-announce-ip",
                    "127.0.0.1",
                    "--cluster-announce-port",
                    &announce,
                    "--cluster-announce-tls-port",
                    &announce,
                    "--cluster-port",
                    &bus,
                    "--cluster-announce-bus-port",
                    &bus,
                ]
                .map(String::from),
            );
            if let Some(pki) = pki {
                args.extend(pki.server_args("server", true));
                args.extend(["--tls-cluster", "yes"].map(String::from));
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            RedisServer::start_on(port, &args, &cli, pki.is_some())
        })
        .collect();
    (RedisCluster::create(nodes, &cli, pki.is_some()), proxies)
}

/// Redis behind fault proxies a test drives: one server on plain TCP or through TLS, or a
/// 3-primary cluster (plain or TLS) with a proxy before each node.
pub struct Behind {
    pub proxies: Vec<FaultProxy>,
    pub cluster: Option<RedisCluster>,
    server: Option<RedisServer>,
    /// Sentinels that name the primary by its proxy's address.
    sentinels: Option<super::Sentinels>,
    tls: Option<RedisTls>,
    /// Kept for its files while the servers run.
    _pki: Option<Pki>,
}

impl Behind {
    /// One server on plain TCP.
    pub fn plain() -> Behind {
        Self::one(None)
    }

    /// One server on TLS only, asking for a client certificate.
    pub fn tls() -> Behind {
        Self::one(Some(Pki::new()))
    }

    fn one(pki: Option<Pki>) -> Behind {
        let server = match &pki {
            Some(pki) => pki.server("server", true, &[]),
            None => RedisServer::start(),
        };
        Behind {
            proxies: vec![FaultProxy::start(server.port)],
            cluster: None,
            server: Some(server),
            sentinels: None,
            tls: pki.as_ref().map(Pki::client_tls),
            _pki: pki,
        }
    }

    /// A cluster on plain TCP.
    pub fn cluster() -> Behind {
        Self::many(None)
    }

    /// A cluster on TLS only.
    pub fn tls_cluster() -> Behind {
        Self::many(Some(Pki::new()))
    }

    fn many(pki: Option<Pki>) -> Behind {
        let (cluster, proxies) = cluster_behind_proxies(pki.as_ref());
        Behind {
            proxies,
            cluster: Some(cluster),
            server: None,
            sentinels: None,
            tls: pki.as_ref().map(Pki::client_tls),
            _pki: pki,
        }
    }

    /// A primary and its replica watched by sentinels, which name the primary by the address
    /// of a proxy before it (plain TCP).
    pub fn sentinel() -> Behind {
        let (sentinels, proxy) = super::Sentinels::behind_proxy();
        Behind {
            proxies: vec![proxy],
            cluster: None,
            server: None,
            sentinels: Some(sentinels),
            tls: None,
            _pki: None,
        }
    }

    /// A builder of a store that reaches Redis through the proxies.
    pub fn store(&self) -> RedisStoreBuilder {
        let tls = self.tls.is_some();
        let url = match &self.cluster {
            _ if let Some(sentinels) = &self.sentinels => sentinels.url(),
            Some(_) => {
                let hosts: Vec<String> = (self.proxies.iter())
                    .map(|p| format!("127.0.0.1:{}", p.port()))
                    .collect();
                let scheme = if tls { "rediss" } else { "redis" };
                format!("{scheme}+cluster://{}", hosts.join(","))
            }
            None => self.proxies[0].url(tls),
        };
        let builder = RedisStore::builder(&url);
        match &self.tls {
            Some(tls) => builder.tls(tls.clone()),
            None => builder,
        }
    }

    /// The server that holds `redis_key`, and the proxy before it.
    pub fn holder(&self, redis_key: &[u8]) -> (&RedisServer, &FaultProxy) {
        match (&self.cluster, &self.server) {
            (Some(cluster), _) => {
                let node = cluster.node_for(redis_key);
                let i = (cluster.nodes.iter())
                    .position(|n| n.port == node.port)
                    .unwrap();
                (node, &self.proxies[i])
            }
            (None, Some(server)) => (server, &self.proxies[0]),
            (None, None) => match &self.sentinels {
                Some(sentinels) => (&sentinels.primary, &self.proxies[0]),
                None => unreachable!("a server, a cluster or sentinels"),
            },
        }
    }

    /// Puts `faults` on every proxy.
    pub fn set(&self, faults: Faults) {
        self.proxies.iter().for_each(|p| p.set(faults.clone()));
    }

    /// No more faults anywhere.
    pub fn clear(&self) {
        self.proxies.iter().for_each(FaultProxy::clear);
    }
}
