//! Requests through a service and what came back: the helpers of the tests that drive the
//! middleware in process (`tower::ServiceExt::oneshot`, no sockets).

use std::convert::Infallible;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt, service_fn};
use tower_ratelimit::Decision;
use tower_ratelimit::headers::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// A response, with its body read, and the `Decision` in its extensions if it carries one
/// (the middleware puts it in those of a limited response).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
    pub decision: Option<Decision>,
}

impl Reply {
    pub fn header(&self, name: impl http::header::AsHeaderName) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn num(&self, name: impl http::header::AsHeaderName) -> Option<u64> {
        self.header(name).map(|v| v.parse().unwrap())
    }

    /// `X-RateLimit-Remaining`.
    pub fn remaining(&self) -> Option<u64> {
        self.num(X_RATELIMIT_REMAINING)
    }

    /// `(limit, remaining, reset, retry_after)` from the headers.
    pub fn rate_headers(&self) -> (Option<u64>, Option<u64>, Option<u64>, Option<u64>) {
        (
            self.num(X_RATELIMIT_LIMIT),
            self.num(X_RATELIMIT_REMAINING),
            self.num(X_RATELIMIT_RESET),
            self.num(RETRY_AFTER),
        )
    }

    pub fn retry_after(&self) -> u64 {
        self.num(RETRY_AFTER).expect("a Retry-After header")
    }
}

/// Sends `req` through a clone of `svc` and reads the whole response.
pub async fn send<S, ReqB, B>(svc: &S, req: Request<ReqB>) -> Reply
where
    S: Service<Request<ReqB>, Response = Response<B>> + Clone,
    S::Error: Debug,
    B: http_body::Body,
    B::Error: Debug,
{
    let response = svc.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
        decision: parts.extensions.get::<Decision>().cloned(),
    }
}

/// Sends an empty `Request<()>`.
pub async fn get<S, B>(svc: &S) -> Reply
where
    S: Service<Request<()>, Response = Response<B>> + Clone,
    S::Error: Debug,
    B: http_body::Body,
    B::Error: Debug,
{
    send(svc, Request::new(())).await
}

/// Sends `GET path` with an empty axum body (to a `Router`).
pub async fn get_path<S, B>(svc: &S, path: &str) -> Reply
where
    S: Service<Request<axum::body::Body>, Response = Response<B>> + Clone,
    S::Error: Debug,
    B: http_body::Body,
    B::Error: Debug,
{
    let req = Request::get(path).body(axum::body::Body::empty()).unwrap();
    send(svc, req).await
}

/// What the inner service saw: how often it was called and the decisions it found.
#[derive(Clone, Default)]
pub struct Seen {
    calls: Arc<AtomicUsize>,
    decisions: Arc<Mutex<Vec<Option<Decision>>>>,
}

impl Seen {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn last_decision(&self) -> Decision {
        self.decisions
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the inner service was called")
            .expect("the request carried a Decision")
    }
}

/// A layer around [`inner`], boxed: what the tests that drive a layer in process send to.
#[allow(dead_code)]
pub type App = tower::util::BoxCloneSyncService<
    Request<()>,
    Response<tower_ratelimit::body::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// `layer` around [`inner`] recording into `seen`, boxed.
#[allow(dead_code)]
pub fn app<St: tower_ratelimit::Store>(
    layer: &tower_ratelimit::RateLimitLayer<St>,
    seen: &Seen,
) -> App {
    use tower::Layer;
    App::new(layer.layer(inner(seen)))
}

/// The inner service: answers 200 "ok", records its calls and the request's `Decision`.
pub fn inner(
    seen: &Seen,
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ use<> {
    let seen = seen.clone();
    service_fn(move |req: Request<()>| {
        seen.calls.fetch_add(1, Ordering::SeqCst);
        seen.decisions
            .lock()
            .unwrap()
            .push(req.extensions().get::<Decision>().cloned());
        async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    })
}

/// A request with the header `name` set to each of `values`.
pub fn with_header(name: &'static str, values: &[&'static str]) -> Request<()> {
    let mut req = Request::new(());
    for v in values {
        req.headers_mut().append(name, HeaderValue::from_static(v));
    }
    req
}

/// A request from the peer `addr` (a `SocketAddr` in the extensions, as servers put it).
pub fn with_peer(addr: &str) -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(addr.parse::<SocketAddr>().unwrap());
    req
}
