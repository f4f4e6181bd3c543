//! A guard for administrative routes: a bearer token, or loopback only.
//!
//! The routes that change or read a layer's state (a key's own limit, the allow and deny
//! lists, the top limited keys, which name other clients' keys) must answer operators only.
//! [`AdminGuardLayer`] wraps any such service:
//!
//! * **With a token** ([`AdminGuardLayer::token`]), a request must carry
//!   `Authorization: Bearer <token>`; the token is compared in constant time (of its SHA-256
//!   digest, so neither its bytes nor its length leak by timing). Without it the answer is
//!   `401` problem+json with `WWW-Authenticate: Bearer`.
//! * **Without a token** ([`AdminGuardLayer::loopback`], the default of
//!   [`TopLimitedService`](crate::top::TopLimitedService)), a request is answered only when
//!   its peer is a loopback address, its `Host` (or, without one, its URI's authority) names
//!   the loopback: `localhost`, a name under `.localhost`, an address of `127.0.0.0/8` or
//!   `::1` (`[::1]`, with a port or without), and it carries none of `Forwarded`,
//!   `X-Forwarded-For` and `X-Real-IP`; anything else, a request naming no host included, is
//!   `403` problem+json. The `Host` check defeats DNS rebinding: a page of another site whose
//!   name was pointed at `127.0.0.1` sends its own name as `Host`. The peer is read as
//!   [`crate::key::PeerIp`] reads it; a request that carries no peer address is refused.
//!
//! A reverse proxy or a tunnel on the same machine connects from a loopback address, and
//! passes on the `Host` its client sent: a client that named the machine by its address
//! (`Host: 10.0.0.1`) is refused by the `Host` check, and a proxy that says whom it forwards
//! (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`) by the header check. A proxy that passes on
//! `Host: localhost` from a remote client and adds no such header cannot be told from a local
//! client: behind a proxy on the same machine, give the admin routes a token.
//!
//! ```
//! use axum::{Router, routing::put};
//! use tower_ratelimit::admin::{AdminGuardLayer, AdminToken};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! let token = AdminToken::new("a-long-random-secret-from-the-environment")?;
//! let admin: Router = Router::new()
//!     .route("/admin/deny/{key}", put(|| async { "ok" }))
//!     .route_layer(AdminGuardLayer::token(token));
//! # let _ = admin;
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ConfigError;
use crate::key::{PeerIp, RequestRef};

/// The shortest token [`AdminToken::new`] takes, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;

/// A secret that admin requests present as `Authorization: Bearer <token>`.
///
/// Only its SHA-256 digest is kept; `Debug` shows nothing of it.
#[derive(Clone)]
pub struct AdminToken {
    digest: Arc<[u8; 32]>,
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl AdminToken {
    /// The token `secret`: at least [`MIN_TOKEN_LEN`] bytes, of the characters a bearer token
    /// may hold (RFC 6750: letters, digits and `-._~+/=`).
    pub fn new(secret: impl AsRef<str>) -> Result<Self, ConfigError> {
        let secret = secret.as_ref();
        if secret.len() < MIN_TOKEN_LEN {
            return Err(ConfigError::new(format!(
                "an admin token has at least {MIN_TOKEN_LEN} characters; this one has {}",
                secret.len()
            )));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~+/=".contains(c);
        if let Some(c) = secret.chars().find(|c| !allowed(*c)) {
            return Err(ConfigError::new(format!(
                "an admin token holds letters, digits and -._~+/= only, not {c:?}"
            )));
        }
        Ok(AdminToken {
            digest: Arc::new(Sha256::digest(secret.as_bytes()).into()),
        })
    }

    /// Whether `given` is the token, in time that does not depend on where they differ.
    fn matches(&self, given: &[u8]) -> bool {
        let given: [u8; 32] = Sha256::digest(given).into();
        bool::from(given.ct_eq(&*self.digest))
    }
}

/// Who an admin route answers: the holder of a token, or loopback clients only.
#[derive(Clone, Debug, Default)]
pub struct AdminGuardLayer {
    who: Who,
}

#[derive(Clone, Debug, Default)]
enum Who {
    #[default]
    Loopback,
    Token(AdminToken),
    Anyone,
}

impl AdminGuardLayer {
    /// Answers requests from a loopback peer with a loopback `Host` only (the module docs).
    pub fn loopback() -> Self {
        AdminGuardLayer { who: Who::Loopback }
    }

    /// Answers requests that carry `Authorization: Bearer <token>` only.
    pub fn token(token: AdminToken) -> Self {
        AdminGuardLayer {
            who: Who::Token(token),
        }
    }

    /// [`token`](Self::token) when there is one, else [`loopback`](Self::loopback).
    pub fn token_or_loopback(token: Option<AdminToken>) -> Self {
        token.map_or_else(Self::loopback, Self::token)
    }

    /// Answers every request: for routes that a layer of your own already authenticates.
    pub fn anyone() -> Self {
        AdminGuardLayer { who: Who::Anyone }
    }

    /// Whether this guard asks for a token.
    pub fn has_token(&self) -> bool {
        matches!(self.who, Who::Token(_))
    }

    /// `Ok` when the request may be answered, else why it is refused.
    pub(crate) fn admit<B>(&self, request: &Request<B>) -> Result<(), Refusal> {
        match &self.who {
            Who::Anyone => Ok(()),
            Who::Token(token) => {
                let given = request
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| bearer(v.as_bytes()));
                match given {
                    Some(given) if token.matches(given) => Ok(()),
                    Some(_) => Err(Refusal(
                        StatusCode::UNAUTHORIZED,
                        "the admin token is wrong",
                    )),
                    None => Err(Refusal(
                        StatusCode::UNAUTHORIZED,
                        "admin routes need Authorization: Bearer <token>",
                    )),
                }
            }
            Who::Loopback => {
                let peer = PeerIp::peer_addr(&RequestRef::new(request));
                if !peer.is_some_and(|p| unmapped(p.ip()).is_loopback()) {
                    return Err(Refusal(
                        StatusCode::FORBIDDEN,
                        "admin routes without a token answer loopback clients only",
                    ));
                }
                if FORWARDED.iter().any(|h| request.headers().contains_key(*h)) {
                    return Err(Refusal(
                        StatusCode::FORBIDDEN,
                        "admin routes without a token answer no forwarded request (Forwarded, X-Forwarded-For or X-Real-IP): behind a proxy, give them a token",
                    ));
                }
                if !loopback_host(request) {
                    return Err(Refusal(
                        StatusCode::FORBIDDEN,
                        "admin routes without a token answer a Host of localhost or a loopback address only",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// The headers a proxy adds to say whom it forwards: a request carrying one of them came
/// through a proxy, whatever its peer.
const FORWARDED: [&str; 3] = ["forwarded", "x-forwarded-for", "x-real-ip"];

/// The token of an `Authorization` value `Bearer <token>` (the scheme in any case).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

/// `ip`, an IPv4-mapped IPv6 address as its IPv4 address.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether the request's `Host` (or its URI's authority) names the loopback: `localhost`, a
/// name under `.localhost`, or a loopback address; a request that names no host does not.
fn loopback_host<B>(request: &Request<B>) -> bool {
    let host = match request.headers().get(header::HOST) {
        Some(value) => match value.to_str() {
            Ok(host) => host,
            Err(_) => return false,
        },
        None => match request.uri().authority() {
            Some(authority) => authority.as_str(),
            None => return false,
        },
    };
    // `[v6]:port`, `[v6]`, `name:port`, `v4:port`, `name`.
    let name = match host.strip_prefix('[') {
        Some(rest) => {
            return match rest.split_once(']') {
                Some((v6, port)) if port.is_empty() || port.starts_with(':') => v6
                    .parse::<std::net::Ipv6Addr>()
                    .is_ok_and(|v6| unmapped(IpAddr::V6(v6)).is_loopback()),
                _ => false,
            };
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|v4| v4.is_loopback())
}

/// Why a request is refused: its status and what went wrong.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Refusal(StatusCode, &'static str);

impl Refusal {
    /// The answer: the status with an RFC 9457 problem body; a 401 says how to
    /// authenticate.
    pub(crate) fn response(self) -> Response<String> {
        response(self.0, self.1)
    }
}

fn response(status: StatusCode, detail: &str) -> Response<String> {
    let mut body = String::from(r#"{"type":"about:blank","title":"#);
    crate::response::push_json_str(&mut body, status.canonical_reason().unwrap_or("Refused"));
    body.push_str(&format!(r#","status":{},"detail":"#, status.as_u16()));
    crate::response::push_json_str(&mut body, detail);
    body.push_str("}\n");
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if status == StatusCode::UNAUTHORIZED {
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Bearer realm="admin""#),
        );
    }
    response
}

impl<S> tower_layer::Layer<S> for AdminGuardLayer {
    type Service = AdminGuard<S>;

    fn layer(&self, inner: S) -> AdminGuard<S> {
        AdminGuard {
            inner,
            guard: self.clone(),
        }
    }
}

/// The service [`AdminGuardLayer`] makes: `inner`, answered only as the guard allows.
#[derive(Clone, Debug)]
pub struct AdminGuard<S> {
    inner: S,
    guard: AdminGuardLayer,
}

impl<S> AdminGuard<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, R> tower_service::Service<Request<B>> for AdminGuard<S>
where
    S: tower_service::Service<Request<B>, Response = Response<R>>,
    R: From<String>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = GuardFuture<S::Future, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.guard.admit(&request) {
            Ok(()) => GuardFuture::Inner {
                future: self.inner.call(request),
            },
            Err(refused) => GuardFuture::Refused {
                response: Some(refused.response().map(R::from)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`AdminGuard`]: the inner service's, or the refusal.
    #[project = GuardProj]
    #[allow(missing_docs)]
    pub enum GuardFuture<F, R> {
        Inner { #[pin] future: F },
        Refused { response: Option<Response<R>> },
    }
}

impl<F, R> fmt::Debug for GuardFuture<F, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GuardFuture::Inner { .. } => "GuardFuture::Inner",
            GuardFuture::Refused { .. } => "GuardFuture::Refused",
        })
    }
}

impl<F, R, E> Future for GuardFuture<F, R>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GuardProj::Inner { future } => future.poll(cx),
            GuardProj::Refused { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> Request<()> {
        Request::builder().header("host", value).body(()).unwrap()
    }

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost",
            "localhost:3000",
            "LOCALHOST.",
            "api.localhost:80",
            "127.0.0.1",
            "127.0.0.1:3000",
            "[::1]:3000",
            "[::1]",
            "[::ffff:127.0.0.1]:80",
            "127.255.0.9",
        ] {
            assert!(loopback_host(&host(ok)), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:3000",
            "localhost.evil.example",
            "[::1",
            "[nope]:80",
            "127.0.0.1.nip.io",
            "10.0.0.7:80",
            "10.0.0.1",
            "0.0.0.0",
            "[::]:80",
            "[2001:db8::1]",
            "[::1]x",
            "::1",
            "",
        ] {
            assert!(!loopback_host(&host(refused)), "{refused}");
        }
        let no_host = Request::builder().body(()).unwrap();
        assert!(!loopback_host(&no_host), "no host named");
        let authority = Request::builder()
            .uri("http://127.0.0.1:9000/admin/top")
            .body(())
            .unwrap();
        assert!(loopback_host(&authority), "the URI's authority");
    }

    /// A loopback request with a loopback `Host`, carrying `extra`.
    fn local(extra: Option<(&str, &str)>) -> Request<()> {
        let mut request = Request::builder()
            .header("host", "127.0.0.1:3000")
            .extension(std::net::SocketAddr::from(([127, 0, 0, 1], 4000)));
        if let Some((name, value)) = extra {
            request = request.header(name, value);
        }
        request.body(()).unwrap()
    }

    #[test]
    fn forwarded_requests_are_refused_without_a_token() {
        let guard = AdminGuardLayer::loopback();
        assert!(guard.admit(&local(None)).is_ok());
        for header in [
            ("x-forwarded-for", "203.0.113.9"),
            ("Forwarded", "for=203.0.113.9"),
            ("X-Real-IP", "203.0.113.9"),
            ("x-forwarded-for", ""),
        ] {
            let Err(refusal) = guard.admit(&local(Some(header))) else {
                panic!("{header:?} admitted");
            };
            assert_eq!(refusal.0, StatusCode::FORBIDDEN, "{header:?}");
            assert!(refusal.1.contains("forwarded"), "{}", refusal.1);
        }
        let token = AdminToken::new("0123456789abcdef").unwrap();
        let mut request = local(Some(("x-forwarded-for", "203.0.113.9")));
        request.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer 0123456789abcdef"),
        );
        assert!(
            AdminGuardLayer::token(token).admit(&request).is_ok(),
            "a token holder"
        );
    }

    #[test]
    fn bearer_values() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer"), None);
    }

    #[test]
    fn tokens() {
        assert!(AdminToken::new("short").is_err());
        assert!(AdminToken::new("has spaces in it, sixteen+").is_err());
        let token = AdminToken::new("0123456789abcdef").unwrap();
        assert!(token.matches(b"0123456789abcdef"));
        assert!(!token.matches(b"0123456789abcdeF"));
        assert!(!token.matches(b""));
        assert_eq!(format!("{token:?}"), "AdminToken(..)");
    }
}
