//! [`TopLimitedService`]: the JSON admin route of the summary of the keys each policy denied.

use std::convert::Infallible;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode, header};

use super::{LimitedKey, SHARDS, TopReport, Tracker};
use crate::admin::AdminGuardLayer;
use crate::clock::Clock;
use crate::response::push_json_str;

/// A JSON admin route reporting the heaviest denied keys, made by
/// [`RateLimitControl::top_limited_service`](crate::RateLimitControl::top_limited_service).
///
/// `GET` answers `200` with every policy's report, or one policy's with `?policy=<name>`;
/// `n=<count>` sets how many keys each report lists (default 10, at most the summary's size):
///
/// ```json
/// {"period_seconds":60,"keys_as":"text","policies":[
///   {"policy":"per-ip","limited":2113,"keys":[{"key":"203.0.113.7","count":1980,"error":0}]}]}
/// ```
///
/// `keys_as` is `text`, or `partition_key` when the summary is [`hashed`](super::TopLimited::hashed).
/// A layer built without [`top_limited`](crate::RateLimitLayerBuilder::top_limited) answers
/// `404`, as does an unknown policy; a malformed `n`, `400`; another method, `405`. Every error
/// is JSON `{"error": "..."}`.
///
/// It names other clients' keys, so it is guarded: by default it answers loopback clients
/// only, with a loopback `Host` ([`AdminGuardLayer::loopback`]); give it a token with
/// [`guard`](Self::guard) to serve it elsewhere. Mount it outside the rate limit:
///
/// ```
/// use axum::{Router, routing::get};
/// use tower_ratelimit::admin::{AdminGuardLayer, AdminToken};
/// use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp, top::TopLimited};
///
/// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
/// let layer = RateLimitLayer::builder()
///     .key(PeerIp::new())
///     .policy(Policy::gcra("10/s"))
///     .top_limited(TopLimited::new())
///     .build()?;
/// let admin: Router = Router::new().route_service(
///     "/admin/top",
///     layer
///         .control()
///         .top_limited_service()
///         .guard(AdminGuardLayer::token(AdminToken::new("a-long-random-secret")?)),
/// );
/// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(layer);
/// # let _ = (admin, app);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TopLimitedService {
    tracker: Option<Arc<Tracker>>,
    clock: Arc<dyn Clock>,
    guard: AdminGuardLayer,
}

impl fmt::Debug for TopLimitedService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopLimitedService")
            .field("tracker", &self.tracker)
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl TopLimitedService {
    pub(crate) fn new(tracker: Option<Arc<Tracker>>, clock: Arc<dyn Clock>) -> Self {
        TopLimitedService {
            tracker,
            clock,
            guard: AdminGuardLayer::loopback(),
        }
    }

    /// Answers the requests `guard` admits only (by default [`AdminGuardLayer::loopback`]).
    #[must_use]
    pub fn guard(mut self, guard: AdminGuardLayer) -> Self {
        self.guard = guard;
        self
    }

    /// The answer to a request for `query` (the URI's query string).
    fn answer(&self, method: &Method, query: Option<&str>) -> (StatusCode, String) {
        if method != Method::GET && method != Method::HEAD {
            return error(StatusCode::METHOD_NOT_ALLOWED, "only GET is answered");
        }
        let Some(tracker) = &self.tracker else {
            return error(
                StatusCode::NOT_FOUND,
                "top limited keys are not tracked: build the layer with top_limited",
            );
        };
        let (mut policy, mut n) = (None, 10);
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value);
            match name {
                "policy" => policy = Some(value),
                "n" => match value.parse::<usize>() {
                    Ok(v) if v > 0 => n = v.min(tracker.capacity * SHARDS),
                    _ => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            &format!("n={value:?} is not a positive number of keys"),
                        );
                    }
                },
                _ => {}
            }
        }
        let now = self.clock.now_micros();
        let reports = match policy {
            None => tracker.top_all(n, now),
            Some(name) => {
                if !tracker.policies().iter().any(|p| **p == *name) {
                    return error(
                        StatusCode::NOT_FOUND,
                        &format!("no policy is named {name:?}"),
                    );
                }
                vec![tracker.top(&name, n, now)]
            }
        };
        (StatusCode::OK, json(tracker, &reports))
    }
}

/// The reports as the route's JSON body.
fn json(tracker: &Tracker, reports: &[TopReport]) -> String {
    let mut out = format!(
        r#"{{"period_seconds":{},"keys_as":"{}","policies":["#,
        tracker.period.as_secs_f64(),
        if tracker.partition.is_some() {
            "partition_key"
        } else {
            "text"
        }
    );
    for (i, report) in reports.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(r#"{"policy":"#);
        push_json_str(&mut out, report.policy());
        let _ = write!(out, r#","limited":{},"keys":"#, report.limited());
        push_keys(&mut out, report.keys());
        let _ = write!(out, r#","near_limit":{},"near_keys":"#, report.near_limit());
        push_keys(&mut out, report.near_keys());
        out.push('}');
    }
    out.push_str("]}\n");
    out
}

/// `keys` as a JSON array of key, count and error.
fn push_keys(out: &mut String, keys: &[LimitedKey]) {
    out.push('[');
    for (j, key) in keys.iter().enumerate() {
        if j > 0 {
            out.push(',');
        }
        out.push_str(r#"{"key":"#);
        push_json_str(out, key.text());
        let _ = write!(out, r#","count":{},"error":{}}}"#, key.count(), key.error());
    }
    out.push(']');
}

fn error(status: StatusCode, message: &str) -> (StatusCode, String) {
    let mut out = String::from(r#"{"error":"#);
    push_json_str(&mut out, message);
    out.push_str("}\n");
    (status, out)
}

/// A query value with `%XX` and `+` decoded (bytes that are not UTF-8 replaced).
pub(super) fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl<B> tower_service::Service<Request<B>> for TopLimitedService {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if let Err(refused) = self.guard.admit(&request) {
            return std::future::ready(Ok(refused.response()));
        }
        let (status, body) = self.answer(request.method(), request.uri().query());
        let mut response = Response::new(body);
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        response.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        std::future::ready(Ok(response))
    }
}
