//! Limits inside long-lived connections: the messages of a WebSocket, of a gRPC stream, of
//! anything that is a [`Stream`](futures_core::Stream) of messages.
//!
//! A connection is one HTTP request that may live for hours; the layer decides it once, when
//! it opens. A [`StreamLimiter`] bounds the connections a key holds open at once and how long
//! each lives, and decides each message they carry, with a layer of its own
//! (its policies, algorithms, store and leases, as for requests): the message is decided as a
//! request with the head of the request that opened the connection, so it is keyed as that
//! request was (client, user, route), shared across instances through the store, and a lease
//! decides most messages without a store call.
//!
//! A message over the limit gets the answer its policy was given ([`OverLimit`]):
//! - **wait**: it is handed on when the budget allows and nothing more is read meanwhile, so
//!   TCP slows the sender down; a message that would wait longer than the longest wait gets
//!   the answer after it;
//! - **error**: the message is dropped and the client gets an error message, by default
//!   `{"error":"rate_limited","retry_after_ms":N,"policy":"<name>"}`; the connection stays;
//! - **close**: the connection is closed, a WebSocket with `1008` (policy violation) or
//!   `1013` (try again later) and a reason naming the policy.
//!
//! A message costs one unit, or its size in bytes with [`message_bytes`] as a policy's cost.
//! Control frames (ping, pong, close) are never counted.
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::streams::{CloseCode, OverLimit, StreamLimiter};
//! use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! let limits = StreamLimiter::builder()
//!     .messages(
//!         RateLimitLayer::builder()
//!             .key(PeerIp::new())
//!             .policy(Policy::gcra("5/s").name("messages"))
//!             .build()?,
//!     )
//!     // Over 5 a second: wait up to a second, then close with 1013.
//!     .on_limit(
//!         OverLimit::wait(Duration::from_secs(1))
//!             .then(OverLimit::close(CloseCode::TRY_AGAIN_LATER)),
//!     )
//!     .build()?;
//! # let _ = limits;
//! # Ok(()) }
//! ```
//!
//! The adapters: [`LimitedSocket`] for a WebSocket (axum's, tokio-tungstenite's, or any
//! [`Stream`](futures_core::Stream) and [`Sink`](futures_sink::Sink) of [`Frame`]s), and
//! [`LimitedStream`] for a stream whose caller answers a [`Limited`] itself (a tonic
//! `Streaming`, server-sent events, a framed TCP stream). The [guide](crate::guide::streams)
//! shows each with what a client sees.

mod admit;
#[cfg(feature = "ws")]
mod axum_ws;
mod decide;
mod frame;
mod lifetime;
mod limited;
mod limiter;
mod message;
mod refusals;
#[cfg(feature = "ws")]
mod listener;
mod socket;
mod stream;

pub use admit::Refusal;
pub use frame::{CloseCode, Frame};
pub use limited::{Answer, Limited, OverLimit, message_bytes};
pub use limiter::{Connection, StreamLimiter, StreamLimiterBuilder};
#[cfg(feature = "ws")]
pub use listener::{DECIDING_AT_MOST, LimitedIo, LimitedListener};
pub use message::{Direction, Message};
pub use socket::LimitedSocket;
pub use stream::LimitedStream;
