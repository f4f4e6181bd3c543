//! axum integration (feature `axum`): the [`Decision`] as an extractor.
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
//!     format!("{} requests left", decision.binding().remaining())
//! }
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! let app: Router = Router::new().route("/", get(handler)).layer(
//!     RateLimitLayer::builder().policy(Policy::gcra("10/s")).key(GlobalKey).build()?,
//! );
//! # Ok(()) }
//! ```

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use http::StatusCode;
use http::request::Parts;

use crate::decision::Decision;

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
