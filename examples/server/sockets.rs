//! The echo WebSocket `GET /ws` and its limits (`MESSAGE_LIMIT`, `ON_MESSAGE_LIMIT`,
//! `CONNECTIONS`, `MAX_CONNECTION_S`): a key's messages and sockets, keyed as its requests are
//! (`KEY`), shared across its sockets and across the instances of one store; and the size of
//! a message (`WS_MAX_MESSAGE`), past which its socket is closed with 1009.

use std::time::Duration;

use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::response::Response;
use axum::routing::get;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tower_ratelimit::streams::{CloseCode, Connection, OverLimit, StreamLimiter};
use tower_ratelimit::{Policy, Quota, RateLimitLayer, Store};

use crate::config::{Config, env_or, key_extractor};

/// How long a message over `MESSAGE_LIMIT` waits with `ON_MESSAGE_LIMIT=wait`, at most,
/// before its socket is closed with 1013.
const LONGEST_WAIT: Duration = Duration::from_secs(10);

/// How long a socket lives at most without `MAX_CONNECTION_S`, when `CONNECTIONS` holds a
/// slot for it.
const LIFETIME_WITH_SLOT: Duration = Duration::from_secs(3600);

/// The largest message (and frame) of `/ws` unless `WS_MAX_MESSAGE` says: 1 MiB.
const MAX_MESSAGE: usize = 1 << 20;

/// The largest `WS_MAX_MESSAGE`: tungstenite's own bound, 64 MiB.
const MAX_MAX_MESSAGE: usize = 64 << 20;

/// The limits of `/ws`.
pub(crate) struct Sockets {
    /// `MESSAGE_LIMIT`: the messages a key may send.
    limit: Option<Quota>,
    /// `ON_MESSAGE_LIMIT`: what a message over it gets.
    on_limit: (OverLimit, &'static str),
    /// `CONNECTIONS`: the sockets a key may hold open at once.
    connections: Option<u32>,
    /// `MAX_CONNECTION_S`: how long a socket lives at most.
    lifetime: Option<Duration>,
    /// `WS_MAX_MESSAGE`: the largest message (and frame) read, in bytes.
    max_message: usize,
}

impl Sockets {
    /// Reads the variables; a bad value names its variable.
    pub(crate) fn from_env() -> Result<Self, String> {
        let limit = match env_or("MESSAGE_LIMIT", "")?.as_str() {
            "" => None,
            text => Some(
                text.parse::<Quota>()
                    .map_err(|e| format!("MESSAGE_LIMIT: {e}"))?,
            ),
        };
        let on_limit = match env_or("ON_MESSAGE_LIMIT", "close")?.as_str() {
            "close" => (OverLimit::close(CloseCode::POLICY_VIOLATION), "close"),
            "error" => (OverLimit::error(), "error"),
            "wait" => (OverLimit::wait(LONGEST_WAIT), "wait"),
            other => {
                return Err(format!(
                    "ON_MESSAGE_LIMIT: {other:?} is none of close, wait and error"
                ));
            }
        };
        let connections = crate::config::positive("CONNECTIONS")?;
        let lifetime =
            crate::config::positive("MAX_CONNECTION_S")?.map(|s| Duration::from_secs(u64::from(s)));
        let max_message = env_or("WS_MAX_MESSAGE", &MAX_MESSAGE.to_string())?;
        let max_message = match max_message.parse::<usize>() {
            Ok(n) if (1..=MAX_MAX_MESSAGE).contains(&n) => n,
            _ => {
                return Err(format!(
                    "WS_MAX_MESSAGE: {max_message:?} is not a number of bytes from 1 to {MAX_MAX_MESSAGE}"
                ));
            }
        };
        Ok(Sockets {
            limit,
            on_limit,
            connections,
            lifetime,
            max_message,
        })
    }

    /// What the startup line says of them.
    pub(crate) fn describe(&self) -> String {
        match &self.limit {
            Some(quota) => format!(
                " MESSAGE_LIMIT={quota} ON_MESSAGE_LIMIT={}",
                self.on_limit.1
            ),
            None => String::new(),
        }
    }

    /// `GET /ws`, limited on `store` as the variables say (by `ALGORITHM`, keyed by `KEY`).
    pub(crate) fn routes<St: Store>(&self, config: &Config, store: St) -> Result<Router, String> {
        let max = self.max_message;
        if self.limit.is_none() && self.connections.is_none() && self.lifetime.is_none() {
            return Ok(Router::new().route("/ws", get(move |upgrade| plain(upgrade, max))));
        }
        let key = || key_extractor(&config.key, &config.trusted_proxies, config.abuse.listed);
        let mut limiter = StreamLimiter::builder().on_limit(self.on_limit.0);
        if let Some(quota) = self.limit {
            let messages = RateLimitLayer::builder()
                .store(store.clone())
                .key(key()?)
                .policy(Policy::new(config.algorithm, quota).name("messages"))
                .build()
                .map_err(|e| format!("MESSAGE_LIMIT: {e}"))?;
            limiter = limiter.messages(messages);
        }
        if let Some(n) = self.connections {
            let held = self.lifetime.unwrap_or(LIFETIME_WITH_SLOT);
            let connections = RateLimitLayer::builder()
                .store(store)
                .key(key()?)
                .policy(
                    Policy::concurrency(n)
                        .name("connections")
                        .max_duration(held),
                )
                .build()
                .map_err(|e| format!("CONNECTIONS: {e}"))?;
            limiter = limiter.connections(connections);
        }
        if let Some(lifetime) = self.lifetime {
            limiter = limiter.max_lifetime(lifetime);
        }
        let limiter = limiter
            .build()
            .map_err(|e| format!("MAX_CONNECTION_S: {e}"))?;
        Ok(Router::new()
            .route(
                "/ws",
                get(move |upgrade, limits| limited(upgrade, limits, max)),
            )
            .layer(axum::Extension(limiter)))
    }
}

/// `GET /ws` without limits, its messages of `max` bytes at most.
async fn plain(upgrade: WebSocketUpgrade, max: usize) -> Response {
    bounded(upgrade, max).on_upgrade(|socket: WebSocket| echo(socket))
}

/// `GET /ws` with them.
async fn limited(upgrade: WebSocketUpgrade, limits: Connection, max: usize) -> Response {
    bounded(upgrade, max).on_upgrade(move |socket| echo(limits.socket(socket)))
}

/// `upgrade`, reading messages and frames of `max` bytes at most.
fn bounded(upgrade: WebSocketUpgrade, max: usize) -> WebSocketUpgrade {
    upgrade.max_message_size(max).max_frame_size(max)
}

/// Echoes text and binary messages as they came, until the socket ends; a message over the
/// bound closes it with 1009 (tungstenite only stops reading).
async fn echo<S, E>(mut socket: S)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin,
    E: std::error::Error + 'static,
{
    while let Some(received) = socket.next().await {
        let message = match received {
            Ok(message) => message,
            Err(error) => {
                if too_big(&error) {
                    let close = CloseFrame {
                        code: close_code::SIZE,
                        reason: "message too big".into(),
                    };
                    let _ = socket.send(Message::Close(Some(close))).await;
                }
                break;
            }
        };
        let data = matches!(message, Message::Text(_) | Message::Binary(_));
        if data && socket.send(message).await.is_err() {
            break;
        }
    }
}

/// Whether `error` (axum's, around tungstenite's) is a message or frame over the bound.
fn too_big(error: &(dyn std::error::Error + 'static)) -> bool {
    use tokio_tungstenite::tungstenite::error::{CapacityError, Error};
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(Error::Capacity(CapacityError::MessageTooLong { .. })) = error.downcast_ref() {
            return true;
        }
        cause = error.source();
    }
    false
}
