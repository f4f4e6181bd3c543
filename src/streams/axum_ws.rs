//! Feature `ws`: axum's and tokio-tungstenite's WebSocket messages as [`Frame`]s, and a
//! [`Connection`] as an axum extractor.

use axum::extract::FromRequestParts;
use axum::extract::ws::{CloseFrame, Message};
use http::StatusCode;
use http::request::Parts;

use crate::key::RequestRef;

use super::frame::{CloseCode, Frame};
use super::limiter::{Connection, StreamLimiter};

impl Frame for Message {
    fn counted_size(&self) -> Option<usize> {
        match self {
            Message::Text(text) => Some(text.len()),
            Message::Binary(bytes) => Some(bytes.len()),
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) => None,
        }
    }

    fn text(text: String) -> Self {
        Message::Text(text.into())
    }

    fn close(code: CloseCode, reason: String) -> Self {
        Message::Close(Some(CloseFrame {
            code: code.get(),
            reason: reason.into(),
        }))
    }
}

impl Frame for tungstenite::Message {
    fn counted_size(&self) -> Option<usize> {
        use tungstenite::Message as M;
        match self {
            M::Text(text) => Some(text.len()),
            M::Binary(bytes) => Some(bytes.len()),
            M::Frame(frame) => Some(frame.payload().len()),
            M::Ping(_) | M::Pong(_) | M::Close(_) => None,
        }
    }

    fn text(text: String) -> Self {
        tungstenite::Message::Text(text.into())
    }

    fn close(code: CloseCode, reason: String) -> Self {
        tungstenite::Message::Close(Some(tungstenite::protocol::CloseFrame {
            code: code.get().into(),
            reason: reason.into(),
        }))
    }
}

/// The connection a request opens ([`StreamLimiter::open`]), with the [`StreamLimiter`] in the
/// request's extensions (`.layer(Extension(limiter))`): a connection the connections' layer
/// refuses is answered its [`Refusal`](super::Refusal) (`429` with `Retry-After`) before the
/// handler runs, so before any upgrade; `500` when there is no limiter.
///
/// ```
/// use std::time::Duration;
/// use axum::extract::ws::WebSocketUpgrade;
/// use axum::{Extension, Router, response::Response, routing::get};
/// use tower_ratelimit::streams::{Connection, StreamLimiter};
/// use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp};
///
/// async fn echo(upgrade: WebSocketUpgrade, limits: Connection) -> Response {
///     upgrade.on_upgrade(move |socket| async move {
///         let mut socket = limits.socket(socket);
///         while let Some(Ok(message)) = socket.recv().await {
///             if socket.send(message).await.is_err() {
///                 break;
///             }
///         }
///     })
/// }
///
/// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
/// let limits = StreamLimiter::builder()
///     // 5 messages a second per client...
///     .messages(RateLimitLayer::builder().key(PeerIp::new()).policy(Policy::gcra("5/s")).build()?)
///     // ...on at most 3 sockets at once, each open an hour at most.
///     .connections(
///         RateLimitLayer::builder()
///             .key(PeerIp::new())
///             .policy(Policy::concurrency(3).max_duration(Duration::from_secs(3600)))
///             .build()?,
///     )
///     .build()?;
/// let app: Router = Router::new().route("/ws", get(echo)).layer(Extension(limits));
/// # let _ = app;
/// # Ok(()) }
/// ```
impl<S: Send + Sync> FromRequestParts<S> for Connection {
    type Rejection = axum::response::Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        use axum::response::IntoResponse;
        let Some(limiter) = parts.extensions.get::<StreamLimiter>() else {
            let missing =
                "no StreamLimiter in the request's extensions: add .layer(Extension(limiter))";
            return Err((StatusCode::INTERNAL_SERVER_ERROR, missing).into_response());
        };
        let head = super::admit::head(&RequestRef::from_parts(parts));
        let opened = limiter.open_head(head).await;
        opened.map_err(|refusal| refusal.map(axum::body::Body::from))
    }
}
