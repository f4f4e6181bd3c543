//! [`LimitedListener`]: connections accepted per client address, at the listener.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::serve::Listener;
use http::Request;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::task::JoinSet;

use super::admit::{self, Admitting, Answered};
use crate::layer::RateLimitLayer;
use crate::store::Store;

/// The most connections a [`LimitedListener`] decides at once, by default.
pub const DECIDING_AT_MOST: usize = 128;

/// What a decision of the listener gives: the connection admitted, with its answer.
type Decided<I> = Option<(I, SocketAddr, Answered)>;

/// A listener for `axum::serve` that decides each connection it accepts with a layer's
/// policies, before a byte of HTTP is read: a connection refused is closed at once. Each is
/// decided as a request `GET /` from its peer (the peer's address in its extensions, as
/// `ConnectInfo` puts it), so the layer's key is the peer's address
/// ([`PeerIp`](crate::key::PeerIp), IPv6 grouped as it says) and its policies bound how
/// often an address connects, on every instance sharing its store. Counted in
/// `ratelimit_connections_refused_total{at="listener"}`.
///
/// The connection accepted ([`LimitedIo`]) holds the layer's answer as long as it lives: a
/// concurrency policy ([`Policy::concurrency`](crate::Policy::concurrency)) bounds the
/// connections an address holds open at once, each holding its slot until it is dropped.
/// Decisions are made off the accept loop, several at once (a slow one holds no other
/// connection back), at most [`DECIDING_AT_MOST`] by default
/// ([`deciding_at_most`](Self::deciding_at_most)): past it, no connection is accepted until a
/// decision ends, and the others wait in the listener's backlog. The listener inside must
/// accept cancel-safely (as tokio's do): its accept is dropped when a decision ends first.
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
pub struct LimitedListener<L: Listener> {
    listener: L,
    admitting: Arc<dyn Admitting>,
    deciding: JoinSet<Decided<L::Io>>,
    most: usize,
}

impl<L: Listener> fmt::Debug for LimitedListener<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedListener")
            .field("deciding", &self.deciding.len())
            .field("most", &self.most)
            .finish_non_exhaustive()
    }
}

impl<L: Listener> LimitedListener<L> {
    /// `listener`, each connection it accepts decided by `layer`.
    pub fn new<St: Store>(listener: L, layer: RateLimitLayer<St>) -> Self {
        LimitedListener {
            listener,
            admitting: admit::admitting(layer),
            deciding: JoinSet::new(),
            most: DECIDING_AT_MOST,
        }
    }

    /// Decides at most `most` connections at once (at least one; default
    /// [`DECIDING_AT_MOST`]): what a flood of connections makes it hold.
    #[must_use]
    pub fn deciding_at_most(mut self, most: usize) -> Self {
        self.most = most.max(1);
        self
    }

    /// The listener inside.
    pub fn get_ref(&self) -> &L {
        &self.listener
    }
}

/// The head a connection from `peer` is decided as.
fn head_of(peer: SocketAddr) -> Request<()> {
    let mut head = Request::new(());
    head.extensions_mut().insert(peer);
    head.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    head
}

impl<L> Listener for LimitedListener<L>
where
    L: Listener<Addr = SocketAddr>,
{
    type Io = LimitedIo<L::Io>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        loop {
            let (listener, deciding) = (&mut self.listener, &mut self.deciding);
            let most = self.most;
            let mut accept = pin!(listener.accept());
            let next = poll_fn(|cx| {
                if let Poll::Ready(Some(decided)) = deciding.poll_join_next(cx) {
                    return Poll::Ready(Err(decided));
                }
                if deciding.len() >= most {
                    return Poll::Pending;
                }
                accept.as_mut().poll(cx).map(Ok)
            });
            match next.await {
                Ok((io, peer)) => {
                    let answer = self.admitting.ask(head_of(peer));
                    self.deciding.spawn(async move {
                        let answer = answer.await;
                        if admit::admitted(&answer) {
                            return Some((io, peer, answer));
                        }
                        admit::connection_refused(&answer, "listener");
                        None
                    });
                }
                Err(Ok(Some((io, peer, answer)))) => {
                    let held = Box::new(answer);
                    return (LimitedIo { io, _held: held }, peer);
                }
                // Refused (and closed), or its decision panicked.
                Err(_) => {}
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A connection a [`LimitedListener`] accepted: the connection inside, holding the layer's
/// answer (the slots of its concurrency policies) until it is dropped.
pub struct LimitedIo<I> {
    io: I,
    /// The layer's answer, which holds its slots until dropped.
    _held: Box<Answered>,
}

impl<I> fmt::Debug for LimitedIo<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedIo").finish_non_exhaustive()
    }
}

impl<I> LimitedIo<I> {
    /// The connection inside.
    pub fn get_ref(&self) -> &I {
        &self.io
    }

    /// The connection inside, mutably.
    pub fn get_mut(&mut self) -> &mut I {
        &mut self.io
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for LimitedIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for LimitedIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
