//! [`MessageLimiter`], built from a layer, and the [`Connection`] it limits.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::Request;

use super::admit::{self, Admitting, Head};
use super::limited::{Direction, LONGEST_WAIT, Limited, Message, OverLimit};
use crate::error::ConfigError;
use crate::key::RequestRef;
use crate::layer::RateLimitLayer;
use crate::store::Store;

/// The error message a connection sends for a [`Limited`] message.
type ErrorMessage = Arc<dyn Fn(&Limited) -> String + Send + Sync>;

/// Decides the messages of connections: built once, from a [`RateLimitLayer`] whose policies
/// are the messages' (see the [module](super)); [`connection`](Self::connection) for each
/// connection opened. Cheap to clone.
#[derive(Clone)]
pub struct MessageLimiter {
    shared: Arc<Shared>,
}

struct Shared {
    admitting: Arc<dyn Admitting>,
    over: OverLimit,
    by_policy: HashMap<String, OverLimit>,
    error: ErrorMessage,
    outbound: bool,
}

impl fmt::Debug for MessageLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageLimiter")
            .field("over", &self.shared.over)
            .field("by_policy", &self.shared.by_policy)
            .field("outbound", &self.shared.outbound)
            .finish_non_exhaustive()
    }
}

impl MessageLimiter {
    /// Starts a limiter deciding messages with `layer`'s policies, store and key.
    pub fn builder<St: Store>(layer: RateLimitLayer<St>) -> MessageLimiterBuilder {
        MessageLimiterBuilder {
            names: layer.policy_names(),
            admitting: admit::admitting(layer),
            over: OverLimit::default(),
            by_policy: HashMap::new(),
            error: Arc::new(Limited::to_json),
            outbound: false,
        }
    }

    /// The limits of one connection, opened by `request` (its head is kept: each message is
    /// decided as this request with the [`Message`] in its extensions).
    pub fn connection<B>(&self, request: &Request<B>) -> Connection {
        self.connection_of(admit::head(&RequestRef::new(request)))
    }

    /// The limits of one connection opened by the request whose head is `head`.
    pub fn connection_of(&self, head: Request<()>) -> Connection {
        Connection {
            shared: self.shared.clone(),
            head: Arc::new(head),
        }
    }
}

/// Configures a [`MessageLimiter`]; [`build`](Self::build) checks it.
pub struct MessageLimiterBuilder {
    names: Vec<String>,
    admitting: Arc<dyn Admitting>,
    over: OverLimit,
    by_policy: HashMap<String, OverLimit>,
    error: ErrorMessage,
    outbound: bool,
}

impl fmt::Debug for MessageLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageLimiterBuilder")
            .field("policies", &self.names)
            .field("over", &self.over)
            .finish_non_exhaustive()
    }
}

impl MessageLimiterBuilder {
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

    /// The limiter; fails naming a policy [`on_limit_of`](Self::on_limit_of) names that the
    /// layer does not have, or a wait over an hour.
    pub fn build(self) -> Result<MessageLimiter, ConfigError> {
        for name in self.by_policy.keys() {
            if !self.names.contains(name) {
                return Err(ConfigError::new(format!(
                    "on_limit_of names the policy {name:?}, which the messages' layer does not have (it has {:?})",
                    self.names
                )));
            }
        }
        let answers = std::iter::once(&self.over).chain(self.by_policy.values());
        if answers.into_iter().any(|o| o.wait > LONGEST_WAIT) {
            return Err(ConfigError::new(
                "a message's longest wait must be at most an hour",
            ));
        }
        Ok(MessageLimiter {
            shared: Arc::new(Shared {
                admitting: self.admitting,
                over: self.over,
                by_policy: self.by_policy,
                error: self.error,
                outbound: self.outbound,
            }),
        })
    }
}

/// The limits of one connection: its messages decided as the request that opened it
/// ([`MessageLimiter::connection`]). Wrap the connection with [`socket`](Self::socket) or
/// [`stream`](Self::stream), or decide each message with [`admit`](Self::admit).
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    head: Arc<Head>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("method", self.head.method())
            .field("uri", self.head.uri())
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
    ) -> impl Future<Output = Result<(), Limited>> + Send + 'static {
        let (shared, head) = (self.shared.clone(), self.head.clone());
        let over = move |policy: &str| over(&shared, policy);
        let admitting = self.shared.admitting.clone();
        admit::decide(admitting, head, Message { bytes, direction }, over)
    }

    /// The error message for `limited`.
    pub fn error_message(&self, limited: &Limited) -> String {
        (self.shared.error)(limited)
    }

    /// Whether the server's messages are decided too.
    pub fn decides_outbound(&self) -> bool {
        self.shared.outbound
    }
}

/// The answer to a message `policy` denied.
fn over(shared: &Shared, policy: &str) -> OverLimit {
    (shared.by_policy.get(policy)).map_or(shared.over, |o| *o)
}
