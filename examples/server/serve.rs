//! Serving a router over HTTP/1.1 and HTTP/2 with hyper-util's server, as `axum::serve` does,
//! plus a bound on how long a connection goes without a request (`HEADER_TIMEOUT_MS`, axum's
//! own `serve` sets none): a connection that has sent no whole request head that long after
//! it opened or after its last response is closed, whatever it sent meanwhile (nothing, half
//! an HTTP/1 head, the HTTP/2 preface); HTTP/2 pings find a peer that has gone away while a
//! request is in flight.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::Notify;
use tower::ServiceExt;

/// How long a connection may go without a request head, unless `HEADER_TIMEOUT_MS` says.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` completes, then lets the connections in
/// flight finish their requests. Each request carries its peer as `ConnectInfo<SocketAddr>`;
/// a connection without a request in flight for `timeout` is closed.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(timeout)
        .keep_alive_timeout(timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: wait a moment, as axum::serve does.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::default());
        let service = service(app.clone(), peer, activity.clone());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            // Dropping an idle connection closes it (an upgraded one has left it by then).
            tokio::select! {
                _ = connection => {}
                () = activity.idle(timeout) => {}
            }
        });
    }
    graceful.shutdown().await;
}

/// `app` as hyper calls it for the connection of `peer`: each request counted in `activity`
/// until its response body is done.
fn service(
    app: Router,
    peer: SocketAddr,
    activity: Arc<Activity>,
) -> impl hyper::service::Service<
    hyper::Request<Incoming>,
    Response = axum::response::Response,
    Error = Infallible,
    Future = impl Future<Output = Result<axum::response::Response, Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let busy = Busy::new(&activity);
        request
            .extensions_mut()
            .insert(ConnectInfo::<SocketAddr>(peer));
        let request = request.map(axum::body::Body::new);
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap_or_else(|e| match e {});
            Ok::<_, Infallible>(response.map(|body| {
                axum::body::Body::new(body.map_frame(move |frame| {
                    let _held = &busy;
                    frame
                }))
            }))
        }
    })
}

/// A connection's requests in flight, and a wake-up each time their number changes.
#[derive(Default)]
struct Activity {
    busy: AtomicUsize,
    changed: Notify,
}

impl Activity {
    /// Completes once the connection has had no request in flight for `timeout` at a
    /// stretch.
    async fn idle(&self, timeout: Duration) {
        loop {
            // A change before this wait is kept by `Notify` and ends it at once.
            let changed = self.changed.notified();
            if self.busy.load(Ordering::SeqCst) > 0 {
                changed.await;
            } else if tokio::time::timeout(timeout, changed).await.is_err() {
                return;
            }
        }
    }
}

/// One request in flight on a connection, until dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.busy.fetch_add(1, Ordering::SeqCst);
        activity.changed.notify_one();
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_one();
    }
}
