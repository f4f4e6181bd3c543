//! [`StreamLimiter`], built from a layer, and the [`Connection`] it limits.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Request;

use super::admit::{self, Admitting, Head, Opened, Refusal};
use super::decide::{self, Decided};
use super::limited::{Answers, LONGEST_WAIT, Limited, OverLimit};
use super::message::{Direction, Message};
use crate::error::ConfigError;
use crate::key::RequestRef;
use crate::layer::RateLimitLayer;
use crate::store::Store;

/// The error message a connection sends for a [`Limited`] message.
type ErrorMessage = Arc<dyn Fn(&Limited) -> String + Send + Sync>;

/// Limits long-lived connections and what flows in them (see the [module](super)): built once,
/// from a layer for the messages ([`messages`](StreamLimiterBuilder::messages)), a layer for
/// the connections themselves ([`connections`](StreamLimiterBuilder::connections)), a longest
/// lifetime, or any of them; [`open`](Self::open) for each connection. Cheap to clone.
#[derive(Clone)]
pub struct StreamLimiter {
    shared: Arc<Shared>,
}

struct Shared {
    messages: Option<Arc<dyn Admitting>>,
    connections: Option<Arc<dyn Admitting>>,
    lifetime: Option<Duration>,
    answers: Arc<Answers>,
    error: ErrorMessage,
    outbound: bool,
}

impl fmt::Debug for StreamLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamLimiter")
            .field("messages", &self.shared.messages.is_some())
            .field("connections", &self.shared.connections.is_some())
            .field("lifetime", &self.shared.lifetime)
            .field("answers", &self.shared.answers)
            .field("outbound", &self.shared.outbound)
            .finish_non_exhaustive()
    }
}

impl StreamLimiter {
    /// Starts a limiter, which limits nothing until given something to limit.
    pub fn builder() -> StreamLimiterBuilder {
        StreamLimiterBuilder {
            names: Vec::new(),
            messages: None,
            connections: None,
            held_at_most: None,
            lifetime: None,
            over: OverLimit::default(),
            by_policy: HashMap::new(),
            error: Arc::new(Limited::to_json),
            outbound: false,
        }
    }

    /// Opens a connection for `request`: takes its place in the connections' layer (a slot of
    /// a concurrency policy is held until the [`Connection`] and every clone of it are
    /// dropped), or answers the [`Refusal`] to send instead of upgrading. Its head is kept:
    /// each message is decided as this request, carrying the [`Message`]
    /// ([`RequestRef::message`]). When the messages' layer has one policy on a store that
    /// decides at once (the memory store), the key is taken here, once, with its hash: a
    /// message then pays for its decision alone (after a reload of the layer's policies, its
    /// messages are decided the general way, with the new policies).
    pub fn open<B>(
        &self,
        request: &Request<B>,
    ) -> impl Future<Output = Result<Connection, Refusal>> + Send + 'static + use<B> {
        self.open_head(admit::head(&RequestRef::new(request)))
    }

    /// [`open`](Self::open) for the request whose head is `head`.
    pub fn open_head(
        &self,
        head: Request<()>,
    ) -> impl Future<Output = Result<Connection, Refusal>> + Send + 'static + use<> {
        let shared = self.shared.clone();
        async move {
            let held = match &shared.connections {
                None => None,
                Some(connections) => {
                    let answer = connections.ask(Head::clone(&head)).await;
                    if !admit::admitted(&answer) {
                        admit::connection_refused(&answer, "upgrade");
                        return Err(admit::refusal(answer));
                    }
                    Some(Arc::new(answer))
                }
            };
            let opened = Arc::new(match &shared.messages {
                Some(messages) => messages.open(head),
                None => Opened::new(head),
            });
            let ends = (shared.lifetime).map(|lifetime| tokio::time::Instant::now() + lifetime);
            Ok(Connection {
                shared,
                opened,
                held,
                ends,
            })
        }
    }
}

/// Configures a [`StreamLimiter`]; [`build`](Self::build) checks it.
pub struct StreamLimiterBuilder {
    names: Vec<String>,
    messages: Option<Arc<dyn Admitting>>,
    connections: Option<Arc<dyn Admitting>>,
    /// The shortest time a slot of the connections' layer is held in the store.
    held_at_most: Option<Duration>,
    lifetime: Option<Duration>,
    over: OverLimit,
    by_policy: HashMap<String, OverLimit>,
    error: ErrorMessage,
    outbound: bool,
}

impl fmt::Debug for StreamLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamLimiterBuilder")
            .field("policies", &self.names)
            .field("lifetime", &self.lifetime)
            .field("over", &self.over)
            .finish_non_exhaustive()
    }
}

impl StreamLimiterBuilder {
    /// Decides each message with `layer`'s policies, store and key, as the request that
    /// opened its connection.
    #[must_use]
    pub fn messages<St: Store>(mut self, layer: RateLimitLayer<St>) -> Self {
        self.names = layer.policy_names();
        self.messages = Some(admit::admitting(layer));
        self
    }

    /// Decides each connection when it opens with `layer`'s policies, store and key: a
    /// concurrency policy ([`Policy::concurrency`](crate::Policy::concurrency)) bounds the
    /// connections a key holds open at once, across instances, each holding its slot for its
    /// whole life; a rate policy bounds how often a key opens them. A connection refused
    /// gets the layer's answer, a [`Refusal`], before any upgrade.
    ///
    /// A slot is held in the store at most its policy's
    /// [`max_duration`](crate::Policy::max_duration) (what frees the slots of a crashed
    /// instance), so no connection may live longer: the [lifetime](Self::max_lifetime) is that
    /// duration unless shorter.
    #[must_use]
    pub fn connections<St: Store>(mut self, layer: RateLimitLayer<St>) -> Self {
        self.held_at_most = layer.slots_held_at_most();
        self.connections = Some(admit::admitting(layer));
        self
    }

    /// How long a connection lives at most: at its end a WebSocket is closed with `1013`
    /// (and a [`LimitedStream`](super::LimitedStream) ends with a [`Limited`] whose
    /// [`status`](Limited::status) is `408`).
    #[must_use]
    pub fn max_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = Some(lifetime);
        self
    }

    /// The answer to a message over the limit (default: close with `1008`).
    #[must_use]
    pub fn on_limit(mut self, over: OverLimit) -> Self {
        self.over = over;
        self
    }

    /// The answer to a message over the limit of the policy named `policy`.
    #[must_use]
    pub fn on_limit_of(mut self, policy: &str, over: OverLimit) -> Self {
        self.by_policy.insert(policy.to_owned(), over);
        self
    }

    /// The error message an [`OverLimit::error`] answer sends (default:
    /// [`Limited::to_json`]).
    #[must_use]
    pub fn error_message<F>(mut self, message: F) -> Self
    where
        F: Fn(&Limited) -> String + Send + Sync + 'static,
    {
        self.error = Arc::new(message);
        self
    }

    /// Whether the messages the server sends are decided too (default: only the client's). A
    /// message a policy reads as [`Direction::Outbound`] in its [`Message`]; over the limit it
    /// waits as its answer says, and is then dropped (an error answer) or closes the
    /// connection.
    #[must_use]
    pub fn outbound(mut self, outbound: bool) -> Self {
        self.outbound = outbound;
        self
    }

    /// The limiter; fails when it limits nothing, when [`on_limit_of`](Self::on_limit_of)
    /// names a policy the messages' layer does not have, on a wait over an hour, and on a
    /// lifetime of zero or longer than a connection's slot is held.
    pub fn build(self) -> Result<StreamLimiter, ConfigError> {
        self.check()?;
        let lifetime = self.lifetime.or(self.held_at_most);
        Ok(StreamLimiter {
            shared: Arc::new(Shared {
                messages: self.messages,
                connections: self.connections,
                lifetime,
                answers: Arc::new(Answers {
                    over: self.over,
                    by_policy: self.by_policy,
                }),
                error: self.error,
                outbound: self.outbound,
            }),
        })
    }

    fn check(&self) -> Result<(), ConfigError> {
        let error = |text: String| Err(ConfigError::new(text));
        if self.messages.is_none() && self.connections.is_none() && self.lifetime.is_none() {
            return error(
                "a StreamLimiter limits nothing: give it messages, connections or max_lifetime"
                    .into(),
            );
        }
        for name in self.by_policy.keys() {
            if !self.names.contains(name) {
                return error(format!(
                    "on_limit_of names the policy {name:?}, which the messages' layer does not have (it has {:?})",
                    self.names
                ));
            }
        }
        let answers = std::iter::once(&self.over).chain(self.by_policy.values());
        if answers.into_iter().any(|o| o.wait > LONGEST_WAIT) {
            return error("a message's longest wait must be at most an hour".into());
        }
        match (self.lifetime, self.held_at_most) {
            (Some(Duration::ZERO), _) => error("max_lifetime must be above zero".into()),
            (Some(lifetime), Some(held)) if lifetime > held => error(format!(
                "max_lifetime is {lifetime:?}, but the connections' slots are held in the store {held:?} at most (their policy's max_duration): set it at least as long"
            )),
            _ => Ok(()),
        }
    }
}

/// The limits of one connection opened by [`StreamLimiter::open`]: its messages decided as
/// the request that opened it, its slot held while it or a clone lives, its lifetime. Wrap the
/// connection with [`socket`](Self::socket) or [`stream`](Self::stream), or decide each
/// message with [`admit`](Self::admit).
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    opened: Arc<Opened>,
    /// The connections' layer's answer, which holds its slots until dropped.
    held: Option<Arc<admit::Answered>>,
    ends: Option<tokio::time::Instant>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("method", self.opened.head.method())
            .field("uri", self.opened.head.uri())
            .field("holds_slot", &self.held.is_some())
            .field("ends", &self.ends)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Decides a message of `bytes` going `direction`: `Ok` when it may go on (after a wait,
    /// when its answer waits), else the [`Limited`] saying why and what to answer. The
    /// future owns what it needs.
    pub fn admit(
        &self,
        bytes: usize,
        direction: Direction,
    ) -> impl Future<Output = Result<(), Limited>> + Send + 'static + use<> {
        let decided = self.decide(bytes, direction);
        async move {
            match decided {
                Decided::Now(decided) => decided,
                Decided::Later(deciding) => deciding.await,
            }
        }
    }

    /// [`admit`](Self::admit), at once when the engine decides at once.
    pub(super) fn decide(&self, bytes: usize, direction: Direction) -> Decided {
        let Some(messages) = &self.shared.messages else {
            return Decided::Now(Ok(()));
        };
        let message = Message { bytes, direction };
        decide::decide(messages, &self.opened, message, &self.shared.answers)
    }

    /// Whether its messages are decided at all.
    pub fn decides_messages(&self) -> bool {
        self.shared.messages.is_some()
    }

    /// The error message for `limited`.
    pub fn error_message(&self, limited: &Limited) -> String {
        (self.shared.error)(limited)
    }

    /// Whether the server's messages are decided too.
    pub fn decides_outbound(&self) -> bool {
        self.shared.outbound && self.decides_messages()
    }

    /// When its lifetime ends, if it has one.
    pub fn ends_at(&self) -> Option<tokio::time::Instant> {
        self.ends
    }
}
