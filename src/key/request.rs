//! [`RequestRef`]: what a key extractor sees of a request.

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// The part a body key gives a request whose body was refused (too large, too slow, not
/// JSON, a batch past its bounds): its head's other parts keep it apart from other clients
/// (`all((ip, jsonrpc()))` keys it `<ip>` and `(unread)`), and the refusal is charged there,
/// so a client that floods bad bodies meets `429` (see `BodyLimits::charge_rejected`). A
/// policy keyed by the body alone is not charged: its one key would be every client's.
pub const UNREAD: &str = "(unread)";

/// A borrowed view of a request's head, whatever its body type.
#[derive(Clone, Copy, Debug)]
pub struct RequestRef<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
    /// The JSON the body keys read instead of the body's: one call of a JSON-RPC batch.
    #[cfg(feature = "json")]
    call: Option<&'a serde_json::Value>,
    /// The message of a long-lived connection being decided as this request.
    message: Option<crate::streams::Message>,
    /// Whether the body keys read [`UNREAD`](crate::key::UNREAD): the head of a request
    /// whose body was refused, charged before it was read.
    unread: bool,
}

impl<'a> RequestRef<'a> {
    /// Borrows the head of `request`.
    pub fn new<B>(request: &'a Request<B>) -> Self {
        RequestRef {
            method: request.method(),
            uri: request.uri(),
            version: request.version(),
            headers: request.headers(),
            extensions: request.extensions(),
            #[cfg(feature = "json")]
            call: None,
            message: None,
            unread: false,
        }
    }

    /// Borrows the head `parts` (of an `http::Request` taken apart, as an axum extractor
    /// sees it).
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        RequestRef {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
            #[cfg(feature = "json")]
            call: None,
            message: None,
            unread: false,
        }
    }

    /// The same request, deciding `message` of the connection it opened.
    pub(crate) fn with_message(mut self, message: crate::streams::Message) -> Self {
        self.message = Some(message);
        self
    }

    /// The same request, its body keys reading [`UNREAD`](crate::key::UNREAD) (its body
    /// refused, or not read yet).
    pub(crate) fn unread(mut self) -> Self {
        self.unread = true;
        self
    }

    /// Whether its body keys read [`UNREAD`](crate::key::UNREAD).
    #[cfg(feature = "json")]
    pub(crate) fn is_unread(&self) -> bool {
        self.unread
    }

    /// Whether this head was made to decide a connection's message at once (nothing reads
    /// its decision or headers): the field alone, no lookup in the extensions.
    #[inline]
    pub(crate) fn is_message(&self) -> bool {
        self.message.is_some()
    }

    /// The message of a long-lived connection this request stands for, when a
    /// [`StreamLimiter`](crate::streams::StreamLimiter) decides one: its size and direction.
    /// Costs, exemptions and a policy's routes may read it; a key does not: a connection's key
    /// is taken once, from the request that opened it, when its policy is decided alone.
    pub fn message(&self) -> Option<crate::streams::Message> {
        self.message
            .or_else(|| self.extensions.get::<crate::streams::Message>().copied())
    }

    /// The same request, its body keys reading `call` (one call of a JSON-RPC batch).
    #[cfg(feature = "json")]
    pub(crate) fn with_call(mut self, call: &'a serde_json::Value) -> Self {
        self.call = Some(call);
        self
    }

    /// The call of a JSON-RPC batch its body keys read, if they read one.
    #[cfg(feature = "graphql")]
    pub(crate) fn call(&self) -> Option<&'a serde_json::Value> {
        self.call
    }

    /// The request body as the layer read it, if it did
    /// ([`read_bodies`](crate::RateLimitLayerBuilder::read_bodies)).
    pub fn body(&self) -> Option<&'a crate::request_body::RequestBody> {
        self.extensions.get()
    }

    /// The JSON a key of the body reads: the body parsed, or in a JSON-RPC batch the call
    /// being keyed; `None` when the layer did not read the body as JSON.
    #[cfg(feature = "json")]
    pub fn json(&self) -> Option<&'a serde_json::Value> {
        self.call.or_else(|| self.body()?.json())
    }

    /// The request method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The request headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions (peer address, authenticated user, matched route, ...).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}
