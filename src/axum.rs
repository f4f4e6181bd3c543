//! axum integration (feature `axum`): the [`Decision`] as an extractor, and responses in
//! axum's own body ([`AxumBody`]).
//!
//! [`PeerIp`](crate::key::PeerIp) already reads axum's `ConnectInfo<SocketAddr>` and
//! `MockConnectInfo<SocketAddr>`. Handlers behind a [`RateLimitLayer`](crate::RateLimitLayer)
//! can take the decision that let their request through:
//!
//! ```
//! use axum::{Router, routing::get};
//! use tower_ratelimit::{Decision, Policy, RateLimitLayer, key::GlobalKey};
//!
//! async fn handler(decision: Decision) -> String {
//!     format!("{} requests left", decision.tightest().remaining())
//! }
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! let app: Router = Router::new().route("/", get(handler)).layer(
//!     RateLimitLayer::builder().policy(Policy::gcra("10/s")).key(GlobalKey).build()?,
//! );
//! # Ok(()) }
//! ```

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use bytes::Bytes;
use http::StatusCode;
use http::request::Parts;

use crate::body::MakeBody;
use crate::decision::Decision;

/// A [`MakeBody`] for axum: responses carry [`axum::body::Body`], so a router does not box them
/// into its body type once more (one allocation per request less). An inner service whose body
/// is already axum's (a `Router`, a handler) passes it through untouched; another body is
/// boxed once, as axum would.
///
/// ```
/// use axum::{Router, routing::get};
/// use tower_ratelimit::{Policy, RateLimitLayer, axum::AxumBody, key::PeerIp};
///
/// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
/// let limit = RateLimitLayer::builder()
///     .policy(Policy::gcra("10/s"))
///     .key(PeerIp::new())
///     .build()?
///     .body::<AxumBody>();
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(limit);
/// # let _ = app;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AxumBody;

impl<B> MakeBody<B> for AxumBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Body = axum::body::Body;

    fn inner(body: B) -> Self::Body {
        // `Body::new` hands an axum body back as it is, and boxes any other.
        axum::body::Body::new(body)
    }

    fn full(data: Bytes) -> Self::Body {
        axum::body::Body::from(data)
    }

    fn held(body: B, held: crate::body::BodyGuard) -> Self::Body {
        axum::body::Body::new(crate::body::ResponseBody::held(body, held))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Decision {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Decision>().cloned().ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "no rate-limit decision for this request: is a RateLimitLayer applied to this route?",
        ))
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Decision {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Decision>().cloned())
    }
}
