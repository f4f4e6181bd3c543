//! The echo WebSocket `GET /ws` and its limits (`MESSAGE_LIMIT`, `ON_MESSAGE_LIMIT`,
//! `CONNECTIONS`, `MAX_CONNECTION_S`): a key's messages and sockets, keyed as its requests are
//! (`KEY`), shared across its sockets and across the instances of one store.

use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
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
        Ok(Sockets {
            limit,
            on_limit,
            connections,
            lifetime,
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
        if self.limit.is_none() && self.connections.is_none() && self.lifetime.is_none() {
            return Ok(Router::new().route("/ws", get(plain)));
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
            .route("/ws", get(limited))
            .layer(axum::Extension(limiter)))
    }
}

/// `GET /ws` without limits.
async fn plain(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(|socket: WebSocket| echo(socket))
}

/// `GET /ws` with them.
async fn limited(upgrade: WebSocketUpgrade, limits: Connection) -> Response {
    upgrade.on_upgrade(move |socket| echo(limits.socket(socket)))
}

/// Echoes text and binary messages as they came, until the socket ends.
async fn echo<S, E>(mut socket: S)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message> + Unpin,
{
    while let Some(Ok(message)) = socket.next().await {
        let data = matches!(message, Message::Text(_) | Message::Binary(_));
        if data && socket.send(message).await.is_err() {
            break;
        }
    }
}
