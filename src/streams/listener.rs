//! [`LimitedListener`]: connections accepted per client address, at the listener.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::Listener;
use http::Request;

use super::admit::{self, Admitting};
use crate::layer::RateLimitLayer;
use crate::store::Store;

/// A listener for `axum::serve` that decides each connection it accepts with a layer's
/// policies, before a byte of HTTP is read: a connection refused is closed at once. Each is
/// decided as a request `GET /` from its peer (the peer's address in its extensions, as
/// `ConnectInfo` puts it), so the layer's key is the peer's address
/// ([`PeerIp`](crate::key::PeerIp), IPv6 grouped as it says) and its policies bound how
/// often an address connects, on every instance sharing its store. Counted in
/// `ratelimit_connections_refused_total{at="listener"}`.
///
/// ```no_run
/// use axum::{Router, routing::get};
/// use tower_ratelimit::streams::LimitedListener;
/// use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let accepts = RateLimitLayer::builder()
///     .key(PeerIp::new())
///     // 20 connections a second per address, bursts of 40.
///     .policy(Policy::gcra("20/s").burst(40).name("accepts"))
///     .build()?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// let app = Router::new().route("/", get(|| async { "hello" }));
/// axum::serve(LimitedListener::new(listener, accepts), app).await?;
/// # Ok(()) }
/// ```
pub struct LimitedListener<L> {
    listener: L,
    admitting: Arc<dyn Admitting>,
}

impl<L> fmt::Debug for LimitedListener<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedListener").finish_non_exhaustive()
    }
}

impl<L> LimitedListener<L> {
    /// `listener`, each connection it accepts decided by `layer`.
    pub fn new<St: Store>(listener: L, layer: RateLimitLayer<St>) -> Self {
        LimitedListener {
            listener,
            admitting: admit::admitting(layer),
        }
    }

    /// The listener inside.
    pub fn get_ref(&self) -> &L {
        &self.listener
    }
}

impl<L> Listener for LimitedListener<L>
where
    L: Listener<Addr = SocketAddr>,
{
    type Io = L::Io;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        loop {
            let (io, peer) = self.listener.accept().await;
            let mut head = Request::new(());
            head.extensions_mut().insert(peer);
            head.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let answer = self.admitting.ask(head).await;
            if admit::admitted(&answer) {
                return (io, peer);
            }
            admit::connection_refused(&answer, "listener");
            drop(io);
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}
