//! Connections to Redis of every kind the store supports (one multiplexed connection, a pool,
//! a cluster, the primary behind Sentinel), and loading the decision into Redis.
//!
//! One node's connection the store holds itself (`redial.rs`): checked after a missed
//! deadline and made again when it is gone (plain TCP; a TLS node with verification, which the
//! store dials itself to coalesce its writes, `dial.rs`, `coalesce.rs`; the primary behind
//! Sentinel). redis-rs makes and keeps a cluster's; a pool's connection that missed its
//! deadline is taken out of the pool.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd};

use super::cluster::{ClusterLink, Node};
use super::endpoint::Endpoints;
use super::redial::{self, Redial};
use super::script::SCRIPT;
use super::sentinel;
use crate::error::StoreError;

pub(super) enum Conn {
    Redial(Arc<Redial>),
    Pool(deadpool::managed::Pool<NodeManager>),
    /// The connection, made again when it goes silent.
    Cluster(Arc<ClusterLink>),
    ClusterPool(deadpool::managed::Pool<ClusterManager>),
}

impl Conn {
    /// A decision on this connection missed its deadline: a connection the store holds is
    /// checked, and made again when it no longer answers (a pool's was taken out already).
    pub(super) fn missed_deadline(&self) {
        match self {
            Conn::Redial(redial) => redial.missed_deadline(),
            Conn::Cluster(link) => link.missed_deadline(),
            Conn::Pool(_) | Conn::ClusterPool(_) => {}
        }
    }

    pub(super) fn kind(&self) -> &'static str {
        match self {
            Conn::Redial(redial) => redial.source().kind(),
            Conn::Pool(_) => "pool",
            Conn::Cluster(link) => link.kind(),
            Conn::ClusterPool(_) => "cluster-pool",
        }
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(..) | Conn::ClusterPool(_))
    }
}

/// How to connect, as the builder says.
pub(super) struct Connect {
    pub(super) endpoints: Endpoints,
    pub(super) cluster: bool,
    pub(super) pool: Option<deadpool_redis::PoolConfig>,
    pub(super) sentinel: Option<sentinel::Target>,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
}

impl Connect {
    /// Connects; `fail` says what could not be done, and why.
    pub(super) async fn connect(
        &self,
        fail: &(dyn Fn(&str, &dyn fmt::Display) -> StoreError + Sync),
    ) -> Result<Conn, StoreError> {
        let within = |e| fail("connect to", &e);
        Ok(match (self.cluster, self.pool, &self.sentinel) {
            (_, _, Some(t)) => {
                let source =
                    sentinel::source(t, &self.endpoints, self.config(), self.connect_timeout)
                        .map_err(within)?;
                Conn::Redial(self.redial(source).await.map_err(within)?)
            }
            (false, None, None) => {
                let source = (self.endpoints)
                    .redial(self.config(), self.connect_timeout)
                    .map_err(|e| fail("open", &e))?;
                Conn::Redial(self.redial(source).await.map_err(within)?)
            }
            (false, Some(config), None) => self
                .pool(config)
                .map_err(|e| fail("configure a pool for", &e))?,
            (true, None, None) => self.cluster_conn(fail).await?,
            (true, Some(config), None) => self
                .cluster_pool(config)
                .map_err(|e| fail("configure a pool for", &e))?,
        })
    }
}

impl Connect {
    /// A cluster's multiplexed connection.
    async fn cluster_conn(
        &self,
        fail: &(dyn Fn(&str, &dyn fmt::Display) -> StoreError + Sync),
    ) -> Result<Conn, StoreError> {
        let within = |e| fail("connect to", &e);
        let client = self
            .endpoints
            .cluster()
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .build()
            .map_err(|e| fail("open", &e))?;
        let kind = match self.endpoints.dial_cluster_nodes(self.connect_timeout) {
            true => "cluster (TLS, coalesced writes)",
            false => "cluster",
        };
        let connecting = client.get_async_generic_connection::<Node>();
        let conn = tokio::time::timeout(self.connect_timeout * 2, connecting)
            .await
            .map_err(|_| fail("connect to", &self.endpoints.timed_out()))?
            .map_err(|e| within(e.to_string()))?;
        let check = self.response_timeout.min(redial::CHECK_TIMEOUT);
        let link = ClusterLink::new(client, conn, check, self.connect_timeout * 2, kind);
        Ok(Conn::Cluster(Arc::new(link)))
    }
}

impl Connect {
    /// The settings of a connection the store holds itself (before the credentials provider).
    fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
    }

    /// A connection the store holds itself, to `source`: a round of connecting may take the
    /// connect and the response timeouts (asking the sentinels, then connecting), a `PING`
    /// the response timeout.
    async fn redial(&self, source: redial::DialSource) -> Result<Arc<Redial>, String> {
        let round = self.connect_timeout + self.response_timeout;
        let check = self.response_timeout.min(redial::CHECK_TIMEOUT);
        Redial::connect(source, round, check).await
    }

    /// A pool of connections to the first node, each with the store's timeouts and
    /// credentials provider.
    fn pool(&self, config: deadpool_redis::PoolConfig) -> Result<Conn, String> {
        let connection = self.endpoints.connection_config(self.config());
        let first = self.endpoints.nodes[0].clone();
        let client = redis::Client::open(first).map_err(|e| e.to_string())?;
        let pool = deadpool::managed::Pool::builder(NodeManager(client, connection))
            .config(config)
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Conn::Pool(pool))
    }

    /// A pool of cluster connections, each made by the store's cluster client (no retries:
    /// see `Endpoints::cluster`), with the store's timeouts.
    fn cluster_pool(&self, config: deadpool_redis::PoolConfig) -> Result<Conn, String> {
        let client = (self.endpoints.cluster())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .build()
            .map_err(|e| e.to_string())?;
        let pool = deadpool::managed::Pool::builder(ClusterManager(client))
            .config(config)
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Conn::ClusterPool(pool))
    }
}

impl Conn {
    /// Runs `f` with a connection of this kind.
    pub(super) async fn with<F, Fut, T>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(AnyConn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = match self {
            Conn::Redial(redial) => {
                let conn = redial.get()?;
                let result = f(AnyConn::Direct((*conn).clone())).await;
                if let Err(e) = &result {
                    redial.failed(&conn, e);
                }
                return result.map_err(StoreError::new);
            }
            Conn::Cluster(link) => AnyConn::Cluster(link.conn()),
            // Boxed: the pools' futures are large, and every decision's future would carry
            // room for them.
            Conn::Pool(p) => {
                let pooled = Box::pin(p.get()).await.map_err(StoreError::new)?;
                let mut checkout = Checkout(Some(pooled));
                let conn = checkout.conn().clone();
                let result = f(AnyConn::Direct(conn)).await;
                if let Err(e) = &result
                    && (e.is_connection_dropped() || e.is_io_error() || e.is_unrecoverable_error())
                {
                    // Broken: out of the pool, which makes another.
                    return result.map_err(StoreError::new);
                }
                checkout.done();
                return result.map_err(StoreError::new);
            }
            Conn::ClusterPool(p) => {
                let pooled = Box::pin(p.get()).await.map_err(StoreError::new)?;
                let mut checkout = Checkout(Some(pooled));
                let result = f(AnyConn::ClusterPool(checkout.conn().clone())).await;
                checkout.done();
                return result.map_err(StoreError::new);
            }
        };
        f(conn).await.map_err(StoreError::new)
    }
}

/// A connection checked out of a pool for one call: back into the pool when the call ended
/// (`done`), else taken out of it when dropped, so that a connection whose call was cut short
/// (a missed deadline: it may have gone silent) or failed is made again.
struct Checkout<M: deadpool::managed::Manager>(Option<deadpool::managed::Object<M>>);

impl<M: deadpool::managed::Manager> Checkout<M> {
    fn conn(&self) -> &M::Type {
        self.0.as_ref().expect("checked out until done or dropped")
    }

    /// The call ended: the connection goes back into the pool.
    fn done(&mut self) {
        self.0 = None;
    }
}

impl<M: deadpool::managed::Manager> Drop for Checkout<M> {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            drop(deadpool::managed::Object::take(object));
        }
    }
}

/// Loads the decision into Redis within `timeout`: as a library of functions when `wanted` and
/// Redis accepts it, else as a script. Returns whether decisions are `FCALL`s.
pub(super) async fn load_decision(
    conn: &Conn,
    wanted: bool,
    timeout: Duration,
    fail: &(dyn Fn(&str, &dyn fmt::Display) -> StoreError + Sync),
) -> Result<bool, StoreError> {
    let mut functions = false;
    if wanted {
        match load(conn, true, timeout).await {
            Ok(()) => functions = true,
            Err(e) => tracing::info!(
                error = %e,
                "Redis did not load the decision function; deciding with EVALSHA"
            ),
        }
    }
    if !functions {
        load(conn, false, timeout)
            .await
            .map_err(|e| fail("load the script into", &e))?;
    }
    Ok(functions)
}

/// Loads the decision into Redis within `timeout`: the library (`FUNCTION LOAD REPLACE`, on
/// every primary of a cluster) or the script (`SCRIPT LOAD`).
pub(super) async fn load(conn: &Conn, functions: bool, timeout: Duration) -> Result<(), String> {
    let loading = conn.with(|mut c| async move {
        let cmd = if functions {
            let mut cmd = redis::cmd("FUNCTION");
            cmd.arg("LOAD").arg("REPLACE").arg(SCRIPT.library());
            cmd
        } else {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(SCRIPT.source());
            cmd
        };
        cmd.query_async::<redis::Value>(&mut c).await.map(drop)
    });
    match tokio::time::timeout(timeout, loading).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// One connection of any kind, for the duration of a call.
pub(super) enum AnyConn {
    Direct(redis::aio::MultiplexedConnection),
    Cluster(ClusterConnection<Node>),
    ClusterPool(ClusterConnection),
}

/// deadpool's manager of connections to one node, made by the store's client with its
/// timeouts and credentials. A connection goes back into use as it is: deadpool-redis's own
/// manager sends `UNWATCH` and `PING` at every checkout, a round trip more per decision; a
/// connection a call found broken is taken out of the pool instead (`Conn::with`).
pub(super) struct NodeManager(redis::Client, redis::AsyncConnectionConfig);

impl deadpool::managed::Manager for NodeManager {
    type Type = redis::aio::MultiplexedConnection;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<Self::Type, redis::RedisError> {
        self.0
            .get_multiplexed_async_connection_with_config(&self.1)
            .await
    }

    async fn recycle(
        &self,
        _: &mut Self::Type,
        _: &deadpool::managed::Metrics,
    ) -> deadpool::managed::RecycleResult<redis::RedisError> {
        Ok(())
    }
}

/// deadpool's manager of cluster connections made by the store's cluster client:
/// deadpool-redis's own makes a client of its own, which sends a call again when its
/// connection drops, and so charges a decision whose reply was lost twice.
pub(super) struct ClusterManager(redis::cluster::ClusterClient);

impl deadpool::managed::Manager for ClusterManager {
    type Type = ClusterConnection;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<ClusterConnection, redis::RedisError> {
        self.0.get_async_connection().await
    }

    /// Kept as it is: a cluster connection dials its nodes again by itself (a `PING` here
    /// would cost every checkout a round trip).
    async fn recycle(
        &self,
        _: &mut ClusterConnection,
        _: &deadpool::managed::Metrics,
    ) -> deadpool::managed::RecycleResult<redis::RedisError> {
        Ok(())
    }
}

impl AnyConn {
    /// `call` sent again to the node a cluster's `MOVED` or `ASK` named (after `ASKING` for
    /// an `ASK`): Redis did not run it where it went. None when `error` is no redirection, or
    /// the connection no cluster's.
    pub(super) async fn redirected(
        &mut self,
        error: &redis::RedisError,
        call: &Cmd,
    ) -> Option<redis::RedisResult<Vec<i64>>> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let (addr, _slot) = error.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port: port.parse().ok()?,
        });
        let ask = error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask);
        Some(match self {
            AnyConn::Cluster(c) => redirect(c, ask, route, call).await,
            AnyConn::ClusterPool(c) => redirect(c, ask, route, call).await,
            _ => return None,
        })
    }
}

/// `call` on the node of `route`, after `ASKING` when `ask`.
async fn redirect<C>(
    conn: &mut ClusterConnection<C>,
    ask: bool,
    route: redis::cluster_routing::RoutingInfo,
    call: &Cmd,
) -> redis::RedisResult<Vec<i64>>
where
    C: redis::aio::ConnectionLike + redis::cluster_async::Connect,
    C: Clone + Send + Sync + Unpin + 'static,
{
    if ask {
        conn.route_command(redis::cmd("ASKING"), route.clone())
            .await?;
    }
    Ok(redis::from_redis_value(
        conn.route_command(call.clone(), route).await?,
    )?)
}

impl ConnectionLike for AnyConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            AnyConn::Direct(c) => c.req_packed_command(cmd),
            AnyConn::Cluster(c) => c.req_packed_command(cmd),
            AnyConn::ClusterPool(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            AnyConn::Direct(c) => c.req_packed_commands(cmd, offset, count),
            AnyConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            AnyConn::ClusterPool(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AnyConn::Direct(c) => c.get_db(),
            AnyConn::Cluster(c) => c.get_db(),
            AnyConn::ClusterPool(c) => c.get_db(),
        }
    }
}
