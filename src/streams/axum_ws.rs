//! Feature `ws`: axum's and tokio-tungstenite's WebSocket messages as [`Frame`]s, and a
//! [`Connection`] as an axum extractor.

use axum::extract::FromRequestParts;
use axum::extract::ws::{CloseFrame, Message};
use http::StatusCode;
use http::request::Parts;

use crate::key::RequestRef;

use super::frame::{CloseCode, Frame};
use super::limiter::{Connection, MessageLimiter};

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

/// The connection a request opens, with the [`MessageLimiter`] in the request's extensions
/// (`.layer(Extension(limiter))`): `500` when there is none.
///
/// ```
/// use axum::extract::ws::WebSocketUpgrade;
/// use axum::{Extension, Router, response::Response, routing::get};
/// use tower_ratelimit::streams::{Connection, MessageLimiter};
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
/// let messages = MessageLimiter::builder(
///     RateLimitLayer::builder().key(PeerIp::new()).policy(Policy::gcra("5/s")).build()?,
/// )
/// .build()?;
/// let app: Router = Router::new().route("/ws", get(echo)).layer(Extension(messages));
/// # let _ = app;
/// # Ok(()) }
/// ```
impl<S: Send + Sync> FromRequestParts<S> for Connection {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let limiter = parts.extensions.get::<MessageLimiter>().ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "no MessageLimiter in the request's extensions: add .layer(Extension(limiter))",
        ))?;
        let request = RequestRef::from_parts(parts);
        Ok(limiter.connection_of(super::admit::head(&request)))
    }
}
