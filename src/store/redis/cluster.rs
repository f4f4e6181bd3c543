//! A cluster's connection, which the store makes again whole when a node's connection goes
//! silent: after a decision missed its deadline, one `PING` to every primary (within the check
//! timeout) tells a slow cluster from a connection that no longer answers, and a silent one is
//! replaced by a new connection to every node (redis-rs's cluster keeps a node's connection
//! while it is open, however long its replies take).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, IntoConnectionInfo};

pub(super) struct ClusterLink {
    client: ClusterClient,
    current: ArcSwap<ClusterConnection<Node>>,
    /// A task is checking the connection, or making it again.
    checking: AtomicBool,
    /// How long the `PING`s may take, and making the connection again.
    check: Duration,
    connect: Duration,
    /// How the store calls it.
    kind: &'static str,
}

impl ClusterLink {
    pub(super) fn new(
        client: ClusterClient,
        conn: ClusterConnection<Node>,
        check: Duration,
        connect: Duration,
        kind: &'static str,
    ) -> Self {
        ClusterLink {
            client,
            current: ArcSwap::from_pointee(conn),
            checking: AtomicBool::new(false),
            check,
            connect,
            kind,
        }
    }

    /// The connection, for one call.
    pub(super) fn conn(&self) -> ClusterConnection<Node> {
        (**self.current.load()).clone()
    }

    pub(super) fn kind(&self) -> &'static str {
        self.kind
    }

    /// A decision missed its deadline: every primary is pinged on a task of its own, and
    /// the connection made again if one does not answer in time.
    pub(super) fn missed_deadline(self: &Arc<Self>) {
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = self.clone();
        tokio::spawn(async move {
            let mut conn = link.conn();
            let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            let ping = conn.route_command(redis::cmd("PING"), all);
            let answered = matches!(tokio::time::timeout(link.check, ping).await, Ok(Ok(_)));
            if !answered {
                let connecting = link.client.get_async_generic_connection::<Node>();
                match tokio::time::timeout(link.connect, connecting).await {
                    Ok(Ok(new)) => {
                        link.current.store(Arc::new(new));
                        tracing::warn!("a Redis Cluster node stopped answering; connected again");
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "could not connect to the Redis Cluster again")
                    }
                    Err(_) => tracing::debug!("connecting to the Redis Cluster again timed out"),
                }
            }
            link.checking.store(false, Ordering::Release);
        });
    }
}

/// A cluster node's connection. redis-rs's cluster connects each node through this type
/// (`get_async_generic_connection`: public, but hidden from redis-rs's docs): the store dials
/// a TLS node with verification itself, to coalesce its writes (`dial.rs`); redis-rs connects
/// the others as it connects its own nodes.
#[derive(Clone)]
pub(super) struct Node(MultiplexedConnection);

impl redis::cluster_async::Connect for Node {
    fn connect_with_config<'a, T>(
        info: T,
        config: AsyncConnectionConfig,
    ) -> redis::RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        Box::pin(async move {
            let info = info.into_connection_info()?;
            #[cfg(feature = "tls")]
            if let Some(dial) = super::dial::for_node(&info, &config) {
                return dial.connect().await.map(Node);
            }
            MultiplexedConnection::connect_with_config(info, config)
                .await
                .map(Node)
        })
    }
}

impl ConnectionLike for Node {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, redis::Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.0.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}
