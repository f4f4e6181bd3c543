//! Real Redis servers for the tests: a standalone `redis-server`, a 3-primary Redis Cluster, or
//! a primary with a replica watched by three `redis-sentinel`s, each on free ports, stopped
//! (killed) when dropped. Nothing here is a mock. A test that needs
//! Redis fails loudly when it cannot start one: run `scripts/test.sh`, which installs it.
#![allow(dead_code, unreachable_pub)]

pub mod demo;
pub mod everything;
pub mod http;
pub mod lease;
pub mod proxy;
pub mod tls;
pub mod trace;
pub mod upstream;
pub mod ws;

/// The three tests of a scenario `async fn(one: St, two: St, clock: ManualClock)` on two
/// layers' stores sharing their state: one memory store (on `clock`), two stores of one
/// Redis under `prefix` (no key left without a TTL after it), and two of a cluster; each
/// test named as given. Used with `#[macro_use] mod support;`.
#[allow(unused_macros)]
macro_rules! on_two_of_each_store {
    ($scenario:ident, $prefix:literal, $memory:ident, $redis:ident, $cluster:ident) => {
        #[tokio::test]
        async fn $memory() {
            let clock = tower_ratelimit::ManualClock::new();
            let store = tower_ratelimit::MemoryStore::builder()
                .clock(clock.clone())
                .build();
            $scenario(store.clone(), store, clock).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $redis() {
            let server = support::RedisServer::start();
            let clock = tower_ratelimit::ManualClock::new();
            let store = || server.store($prefix, &clock);
            $scenario(store().await, store().await, clock.clone()).await;
            support::assert_no_key_without_ttl(&server, $prefix);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $cluster() {
            let cluster = support::RedisCluster::start();
            let clock = tower_ratelimit::ManualClock::new();
            let one = cluster.store($prefix, &clock).await;
            let two = cluster.store($prefix, &clock).await;
            $scenario(one, two, clock).await;
        }
    };
}

/// The three tests of a scenario `fn(a, b)` on demo servers (`support::demo`) run with `env`: one server in
/// memory (as `a` and `b`), two sharing one Redis under `prefix` (no key left without a
/// TTL), and two sharing a cluster; each named as given.
#[allow(unused_macros)]
macro_rules! on_each_demo_store {
    ($scenario:ident, $env:expr, $prefix:literal, $memory:ident, $redis:ident, $cluster:ident) => {
        #[test]
        fn $memory() {
            let server = support::demo::DemoServer::start(&$env);
            $scenario(&server, &server);
        }

        #[test]
        fn $redis() {
            let redis = support::RedisServer::start();
            let url = redis.url();
            let env = support::demo::shared(&url, $prefix, &$env);
            $scenario(
                &support::demo::DemoServer::start(&env),
                &support::demo::DemoServer::start(&env),
            );
            support::assert_no_key_without_ttl(&redis, $prefix);
        }

        #[test]
        fn $cluster() {
            let cluster = support::RedisCluster::start();
            let url = cluster.url();
            let env = support::demo::shared(&url, $prefix, &$env);
            $scenario(
                &support::demo::DemoServer::start(&env),
                &support::demo::DemoServer::start(&env),
            );
        }
    };
}

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Messages keyed by `x-key` (a header, or gRPC metadata), `policy` named `messages`, on
/// `store` (its layer's clock `clock`, else the system's), answered `over` past it.
pub fn stream_limiter<St: tower_ratelimit::Store>(
    store: St,
    clock: Option<&tower_ratelimit::ManualClock>,
    policy: tower_ratelimit::Policy,
    over: tower_ratelimit::streams::OverLimit,
) -> tower_ratelimit::streams::StreamLimiter {
    let mut layer = tower_ratelimit::RateLimitLayer::builder()
        .key(tower_ratelimit::key::HeaderKey::try_new("x-key").unwrap())
        .policy(policy.name("messages"))
        .store(store);
    if let Some(clock) = clock {
        layer = layer.clock(clock.clone());
    }
    tower_ratelimit::streams::StreamLimiter::builder()
        .messages(layer.build().unwrap())
        .on_limit(over)
        .build()
        .unwrap()
}

/// A port nobody listens on now, claimed for this test process alone.
///
/// Ports come from 10000-19999, below the kernel's ephemeral range (32768 and up), so no
/// outgoing connection and no `bind(0)` (the fault proxies') takes one between this call and
/// the server's bind. A cluster node's bus port (10000 above) is checked free too. A port is
/// claimed by a file naming this process, created only if absent, so two test processes
/// (nextest runs them side by side) are never handed the same port; the claim of a process
/// that has ended is taken over.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 10_000;
    const COUNT: u32 = 10_000;
    let claims = std::env::temp_dir().join("tower-ratelimit-ports");
    std::fs::create_dir_all(&claims).expect("create the port claims' directory");
    let me = std::process::id();
    let start = me.wrapping_mul(7919) % COUNT;
    for _ in 0..COUNT {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % COUNT) as u16;
        if claim(&claims, port, me) && bindable(port) && bindable(port + 10_000) {
            return port;
        }
    }
    panic!("no free port left in {FIRST}-{}", FIRST + COUNT - 1)
}

/// Claims `port` for process `me` in `claims` (a file holding its pid), taking over the claim
/// of a process that has ended.
fn claim(claims: &std::path::Path, port: u16, me: u32) -> bool {
    use std::io::Write;
    let file = claims.join(port.to_string());
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
        {
            Ok(mut f) => return write!(f, "{me}").is_ok(),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let owner = std::fs::read_to_string(&file).unwrap_or_default();
                let ended = owner.trim().parse::<u32>().is_ok_and(|pid| {
                    pid != me && !std::path::Path::new(&format!("/proc/{pid}")).exists()
                });
                if !ended {
                    return false;
                }
                let _ = std::fs::remove_file(&file);
            }
            Err(_) => return false,
        }
    }
    false
}

fn bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn redis_cli(port: u16, args: &[&str]) -> std::io::Result<std::process::Output> {
    redis_cli_as(port, &[], args)
}

/// redis-cli with `connect` (TLS options, credentials) before the command.
fn redis_cli_as(
    port: u16,
    connect: &[String],
    args: &[&str],
) -> std::io::Result<std::process::Output> {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(connect)
        .args(args)
        .stdin(Stdio::null())
        .output()
}

/// Polls `cond` every few milliseconds until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Awaits `cond` every millisecond of real time until it holds; fails the test, naming
/// `what`, after 30 seconds (a TLS cluster reconnecting on a loaded 2-core machine once took
/// more than 10).
pub async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !cond().await {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The error that building a layer of `policy` alone fails with.
pub fn build_error(policy: tower_ratelimit::Policy) -> String {
    tower_ratelimit::RateLimitLayer::builder()
        .policy(policy)
        .build()
        .unwrap_err()
        .to_string()
}

/// A layer of `policy` on `store`, keyed by one global key, on `clock`.
pub fn global_layer<St: tower_ratelimit::Store>(
    store: St,
    policy: tower_ratelimit::Policy,
    clock: &tower_ratelimit::ManualClock,
) -> tower_ratelimit::RateLimitLayer<St> {
    tower_ratelimit::RateLimitLayer::builder()
        .policy(policy)
        .key(tower_ratelimit::key::GlobalKey)
        .store(store)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Fails the test with one line saying how to get Redis when `redis-server` or `redis-cli`
/// is not installed.
fn require_redis() {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        for tool in ["redis-server", "redis-cli"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        assert!(
            found,
            "{tool} is not installed: run scripts/test.sh, which installs it (Debian/Ubuntu: apt-get install redis-server redis-tools)"
        );
        }
    });
}

/// One `redis-server` process.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
    /// What redis-cli needs to be let in (TLS options, the admin's credentials).
    cli_connect: Vec<String>,
    /// Whether `port` is a TLS port (and there is no plain-text one).
    tls: bool,
}

impl RedisServer {
    /// Starts a standalone server on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line options (e.g. `--cluster-enabled yes`).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_as(extra, &[], false)
    }

    /// Starts a server with extra options, which redis-cli reaches with `cli_connect`; when
    /// `tls`, its only port is a TLS one (`extra` names the certificates).
    pub fn start_as(extra: &[&str], cli_connect: &[String], tls: bool) -> Self {
        Self::start_on(free_port(), extra, cli_connect, tls)
    }

    /// [`RedisServer::start_as`] on `port` (one a store was told of before the server came).
    pub fn start_on(port: u16, extra: &[&str], cli_connect: &[String], tls: bool) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tower-ratelimit-redis-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = RedisServer {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            cli_connect: cli_connect.to_vec(),
            tls,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        require_redis();
        let port = self.port.to_string();
        let ports = match self.tls {
            true => ["--port", "0", "--tls-port", &port],
            false => ["--port", &port, "--tls-port", "0"],
        };
        let child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", self.dir.to_str().unwrap()])
            .args(["--logfile", self.dir.join("redis.log").to_str().unwrap()])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}); run scripts/test.sh, which installs it")
            });
        self.child = Some(child);
        wait_until(
            Duration::from_secs(10),
            "redis-server to answer PING",
            || {
                self.fail_if_exited();
                self.cli(&["PING"]).starts_with("PONG")
            },
        );
    }

    /// Fails the test at once, with the server's log, when the server exited (a port taken,
    /// an option refused) instead of waiting for a `PING` that cannot come.
    fn fail_if_exited(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
            panic!(
                "redis-server on port {} exited at start ({status}):\n{log}",
                self.port
            );
        }
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://localhost:<port>` for a TLS server (its
    /// certificate names `localhost`).
    pub fn url(&self) -> String {
        match self.tls {
            true => format!("rediss://localhost:{}", self.port),
            false => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Runs a command with redis-cli and returns its trimmed standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = redis_cli_as(self.port, &self.cli_connect, args).expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Kills the server with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (with empty data).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// How many times this server ran `command` (lowercase), from `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary, its replica, and three `redis-sentinel` processes watching them (quorum 2, the
/// primary judged down after 500 ms), on free ports.
pub struct Sentinels {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub ports: Vec<u16>,
    children: Vec<Child>,
    dir: PathBuf,
    cli_connect: Vec<String>,
    tls: bool,
}

/// The name the sentinels know the primary by.
pub const MASTER: &str = "mymaster";

impl Sentinels {
    pub fn start() -> Self {
        Self::start_as(&[], &[], false)
    }

    /// Servers and sentinels started with `extra` (TLS options when `tls`: then every port is
    /// a TLS one), which redis-cli reaches with `cli_connect`.
    pub fn start_as(extra: &[&str], cli_connect: &[String], tls: bool) -> Self {
        Self::watching(extra, cli_connect, tls, |port| port, 500)
    }

    /// Sentinels that watch the primary through a fault proxy (they name it to clients by
    /// the proxy's address) and judge it down only after a minute: a test may freeze the
    /// proxy's connections without a failover.
    pub fn behind_proxy() -> (Self, proxy::FaultProxy) {
        let mut proxy = None;
        let through = |port| {
            let started = proxy::FaultProxy::start(port);
            let at = started.port();
            proxy = Some(started);
            at
        };
        let sentinels = Self::watching(&[], &[], false, through, 60_000);
        (sentinels, proxy.expect("the proxy started"))
    }

    /// Servers and sentinels started with `extra`, the sentinels watching the primary at the
    /// port `through` gives for its own, judging it down after `down_after_ms`.
    fn watching(
        extra: &[&str],
        cli_connect: &[String],
        tls: bool,
        through: impl FnOnce(u16) -> u16,
        down_after_ms: u32,
    ) -> Self {
        let primary = RedisServer::start_as(extra, cli_connect, tls);
        let watched = through(primary.port);
        let mut replica_args = extra.to_vec();
        let primary_port = primary.port.to_string();
        replica_args.extend(["--replicaof", "127.0.0.1", &primary_port]);
        let replica = RedisServer::start_as(&replica_args, cli_connect, tls);
        wait_until(Duration::from_secs(20), "the replica to sync", || {
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        let found = Command::new("redis-sentinel")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok();
        assert!(
            found,
            "redis-sentinel is not installed: run scripts/test.sh, which installs it (Debian/Ubuntu: apt-get install redis-sentinel)"
        );
        let dir = std::env::temp_dir().join(format!(
            "tower-ratelimit-sentinel-{}-{}",
            std::process::id(),
            primary.port
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut children = Vec::new();
        let mut ports = Vec::new();
        for i in 0..3 {
            let port = free_port();
            // Sentinel rewrites its file, so each gets one of its own. Its TLS options are the
            // servers' (`--name value` pairs become `name value` lines).
            let conf = dir.join(format!("sentinel-{i}.conf"));
            let listen = match tls {
                true => format!("port 0\ntls-port {port}\n"),
                false => format!("port {port}\n"),
            };
            let options: String = extra
                .chunks(2)
                .filter(|kv| kv[0].starts_with("--tls"))
                .map(|kv| format!("{} {}\n", &kv[0][2..], kv[1]))
                .collect();
            std::fs::write(
                &conf,
                format!(
                    "{listen}{options}bind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {watched} 2\n\
                     sentinel down-after-milliseconds {MASTER} {down_after_ms}\n\
                     sentinel failover-timeout {MASTER} 10000\n",
                    dir = dir.display(),
                ),
            )
            .unwrap();
            let child = Command::new("redis-sentinel")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-sentinel");
            children.push(child);
            ports.push(port);
        }
        // Ready when each sentinel knows the replica and the two other sentinels (they find
        // each other through the primary, every two seconds): only then can they fail over.
        for &port in &ports {
            wait_until(
                Duration::from_secs(30),
                "the sentinels to know each other",
                || {
                    let out = redis_cli_as(port, cli_connect, &["SENTINEL", "MASTER", MASTER]);
                    let Ok(out) = out else { return false };
                    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .map(str::to_owned)
                        .collect();
                    let field = |name: &str| {
                        lines
                            .iter()
                            .position(|l| l == name)
                            .and_then(|i| lines.get(i + 1).cloned())
                    };
                    field("num-slaves").as_deref() == Some("1")
                        && field("num-other-sentinels").as_deref() == Some("2")
                },
            );
        }
        Sentinels {
            primary,
            replica,
            ports,
            children,
            dir,
            cli_connect: cli_connect.to_vec(),
            tls,
        }
    }

    /// `redis+sentinel://127.0.0.1:<port>,…/mymaster` (`rediss+sentinel://` with TLS).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The port of the primary the first sentinel names.
    pub fn primary_port(&self) -> u16 {
        let out = redis_cli_as(
            self.ports[0],
            &self.cli_connect,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER],
        )
        .unwrap();
        let out = String::from_utf8_lossy(&out.stdout).to_string();
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A real Redis Cluster of three primaries on free ports.
/// What each node of a test cluster starts with.
pub const CLUSTER_NODE: [&str; 6] = [
    "--cluster-enabled",
    "yes",
    "--cluster-node-timeout",
    "5000",
    "--cluster-config-file",
    "nodes.conf",
];

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    tls: bool,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_as(&[], &[], false)
    }

    /// A cluster whose nodes start with `extra` (TLS options when `tls`), which redis-cli
    /// reaches with `cli_connect`.
    pub fn start_as(extra: &[&str], cli_connect: &[String], tls: bool) -> Self {
        let mut args = CLUSTER_NODE.to_vec();
        args.extend_from_slice(extra);
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_as(&args, cli_connect, tls))
            .collect();
        Self::create(nodes, cli_connect, tls)
    }

    /// The cluster of `nodes` (started with cluster mode on), its slots shared out.
    pub fn create(nodes: Vec<RedisServer>, cli_connect: &[String], tls: bool) -> Self {
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = cli_connect.to_vec();
        args.extend(["--cluster".to_string(), "create".to_string()]);
        args.extend(addrs.iter().cloned());
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for node in &nodes {
            wait_until(Duration::from_secs(20), "the cluster to be ok", || {
                node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
            });
        }
        RedisCluster { nodes, tls }
    }

    /// `redis+cluster://host:port,host:port,host:port` (`rediss+cluster://` with TLS).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}+cluster://{}", hosts.join(","))
    }

    /// A store on this cluster with keys under `prefix`, deciding on `clock`, with a deadline
    /// no loaded machine misses.
    #[allow(dead_code)]
    pub async fn store(
        &self,
        prefix: &str,
        clock: &tower_ratelimit::ManualClock,
    ) -> tower_ratelimit::RedisStore {
        tower_ratelimit::RedisStore::builder(&self.url())
            .prefix(prefix)
            .deadline(Duration::from_secs(10))
            .clock(clock.clone())
            .build()
            .await
            .expect("connect to the test cluster")
    }

    /// The node that serves `key`'s hash slot.
    pub fn node_for(&self, key: &[u8]) -> &RedisServer {
        let hash_slot: u16 = self.nodes[0]
            .cli(&[
                "CLUSTER",
                "KEYSLOT",
                std::str::from_utf8(key).expect("utf-8 key"),
            ])
            .parse()
            .unwrap();
        self.nodes
            .iter()
            .find(|n| owns_hash_slot(n, hash_slot))
            .expect("a node owns the hash slot")
    }
}

fn owns_hash_slot(node: &RedisServer, hash_slot: u16) -> bool {
    // CLUSTER SLOTS lists ranges and the primary's port.
    let out = node.cli(&["CLUSTER", "NODES"]);
    out.lines().filter(|l| l.contains("myself")).any(|line| {
        line.split_whitespace().skip(8).any(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            match (a.parse::<u16>(), b.parse::<u16>()) {
                (Ok(a), Ok(b)) => (a..=b).contains(&hash_slot),
                _ => false,
            }
        })
    })
}

/// Every key under `prefix` on `server`, with its PTTL.
pub fn keys_with_ttl(server: &RedisServer, prefix: &str) -> Vec<(String, i64)> {
    let keys = server.cli(&["--scan", "--pattern", &format!("{prefix}*")]);
    keys.lines()
        .filter(|k| !k.is_empty())
        .map(|k| (k.to_owned(), server.cli(&["PTTL", k]).parse().unwrap_or(-3)))
        .collect()
}

/// Fails if any key under `prefix` has no TTL (PTTL -1; -2 is a key that expired between
/// the scan and the PTTL).
pub fn assert_no_key_without_ttl(server: &RedisServer, prefix: &str) {
    let leaked: Vec<_> = keys_with_ttl(server, prefix)
        .into_iter()
        .filter(|(_, ttl)| *ttl == -1)
        .collect();
    assert!(leaked.is_empty(), "keys without a TTL: {leaked:?}");
}

/// A small deterministic pseudo-random generator (xorshift64*), so failures replay exactly.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

impl RedisServer {
    /// A store on this server with keys under `prefix`, deciding on `clock`, with a deadline
    /// no loaded machine misses.
    pub async fn store(
        &self,
        prefix: &str,
        clock: &tower_ratelimit::ManualClock,
    ) -> tower_ratelimit::RedisStore {
        tower_ratelimit::RedisStore::builder(&self.url())
            .deadline(Duration::from_secs(10))
            .prefix(prefix)
            .clock(clock.clone())
            .build()
            .await
            .expect("connect to the test redis-server")
    }

    /// A store on this server with keys under `prefix`, deciding on `clock` (else Redis's),
    /// with `FCALL` when `functions` and with `EVALSHA` when not (checked), with a deadline no
    /// loaded machine misses.
    pub async fn store_calling(
        &self,
        prefix: &str,
        clock: Option<&tower_ratelimit::ManualClock>,
        functions: bool,
    ) -> tower_ratelimit::RedisStore {
        self.store_calling_within(prefix, clock, functions, Duration::from_secs(10))
            .await
    }

    /// [`store_calling`](Self::store_calling), each decision awaited for up to `deadline`;
    /// a longer one than its 10 s also awaits each reply on the connection as long (past the
    /// default second).
    pub async fn store_calling_within(
        &self,
        prefix: &str,
        clock: Option<&tower_ratelimit::ManualClock>,
        functions: bool,
        deadline: Duration,
    ) -> tower_ratelimit::RedisStore {
        let mut builder = tower_ratelimit::RedisStore::builder(&self.url()).deadline(deadline);
        if deadline > Duration::from_secs(10) {
            builder = builder.response_timeout(deadline);
        }
        let mut builder = builder.prefix(prefix).functions(functions);
        if let Some(clock) = clock {
            builder = builder.clock(clock.clone());
        }
        let store = builder
            .build()
            .await
            .expect("connect to the test redis-server");
        assert_eq!(store.uses_functions(), functions);
        store
    }

    /// Asserts that the decisions this server saw were all `FCALL`s (`functions`) or all
    /// `EVALSHA`s, from its command statistics.
    pub fn assert_calls(&self, functions: bool) {
        let stats = self.cli(&["INFO", "commandstats"]);
        let (used, unused) = match functions {
            true => ("cmdstat_fcall:", "cmdstat_evalsha:"),
            false => ("cmdstat_evalsha:", "cmdstat_fcall:"),
        };
        assert!(stats.contains(used) && !stats.contains(unused), "{stats}");
    }
}
