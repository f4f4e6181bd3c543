//! Keys: whom a request is counted against.
//!
//! A [`KeyExtractor`] looks at a request and returns the [`Key`] of the bucket it is charged to,
//! or a [`KeyRejection`] when the request lacks what the key is made of. A request without a key
//! is answered (400 by default) rather than silently counted in a shared bucket.
//!
//! | extractor | key |
//! |---|---|
//! | [`GlobalKey`] | one bucket for every request |
//! | [`PeerIp`] | the socket peer's IP address (axum `ConnectInfo`, `MockConnectInfo`, or a `SocketAddr` extension); IPv6 by `/64` |
//! | [`ClientIp`] | the client's IP address behind [trusted proxies](Cidr), from `X-Forwarded-For`, `Forwarded` or a header you name, walked from the right; IPv6 by `/64` |
//! | [`ApiKey`] | the SHA-256 of an API key or bearer token (never the secret itself) |
//! | [`HeaderKey`] | the value of one request header |
//! | [`extension`], [`extension_with`] | a value an earlier layer put in the extensions, e.g. the user id |
//! | [`matched_route`] | the route pattern the router matched, and the method |
//! | [`first_of`], [`KeyExtractor::or`] | the first of several that finds a key (user id, else client IP) |
//! | [`all`] | several keys combined into one (route and client) |
//! | [`from_fn`] | anything a closure computes from the request |
//!
//! Behind a load balancer or reverse proxy, [`PeerIp`] sees only the proxy, so every client
//! shares one bucket. Never key on the leftmost `X-Forwarded-For` entry instead: the client
//! writes it, and could send a new one with each request (a fresh bucket every time) or a
//! victim's (draining theirs). [`ClientIp`] reads only what your proxies wrote.
//!
//! ```
//! use tower_ratelimit::key::{self, Key, KeyRejection, RequestRef};
//!
//! // Charge each tenant named by the `x-tenant` header; reject requests without one.
//! let tenant = key::from_fn(|req: &RequestRef<'_>| {
//!     req.headers()
//!         .get("x-tenant")
//!         .map(|v| Key::from(v.as_bytes()))
//!         .ok_or_else(|| KeyRejection::bad_request("missing_tenant", "send an x-tenant header"))
//! });
//! # let _ = tenant;
//! ```

mod api_key;
mod cidr;
mod client_ip;
mod composite;
mod extension;
mod forwarded;
mod from_fn;
mod global;
mod header;
mod ip_group;
mod peer_ip;
mod route;

use std::fmt;
use std::net::IpAddr;

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

pub use crate::error::KeyRejection;
pub use api_key::ApiKey;
pub use cidr::Cidr;
pub use client_ip::{Basis, ClientIp, ClientIpBuilder, DEFAULT_MAX_HOPS, ProxyHeader, Resolution};
pub use composite::{All, FirstOf, all, first_of};
pub use extension::{ExtensionKey, extension, extension_with};
pub use from_fn::{FromFn, from_fn};
pub use global::GlobalKey;
pub use header::HeaderKey;
pub use peer_ip::PeerIp;
pub use route::{MatchedRoute, matched_route};

/// Finds the key a request is charged to.
pub trait KeyExtractor: Send + Sync + fmt::Debug + 'static {
    /// The key for `request`, or why there is none.
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection>;

    /// This extractor's key, or else `other`'s: [`first_of`] with two.
    ///
    /// ```
    /// use tower_ratelimit::key::{ApiKey, ClientIp, KeyExtractor};
    ///
    /// // Clients with an API key by key, the others by address.
    /// let key = ApiKey::bearer().or(ClientIp::new(["10.0.0.0/8"])?);
    /// # let _ = key;
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    fn or<K: KeyExtractor>(self, other: K) -> FirstOf<(Self, K)>
    where
        Self: Sized,
    {
        first_of((self, other))
    }
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for std::sync::Arc<K> {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        (**self).extract(request)
    }
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for Box<K> {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        (**self).extract(request)
    }
}

/// A borrowed view of a request's head, whatever its body type.
#[derive(Clone, Copy, Debug)]
pub struct RequestRef<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
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
        }
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

/// The identity of a bucket: an IP address, some bytes, or the single global bucket.
///
/// Keys compare by value; `Key::from("alice")` and `Key::from(b"alice".as_slice())` are the same
/// key, while an IP address and its text form are different keys.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Global,
    Ip(IpAddr),
    Bytes(Bytes),
}

impl Key {
    /// The one bucket shared by every request.
    pub const fn global() -> Self {
        Key(Repr::Global)
    }

    /// A key made of arbitrary bytes.
    pub fn from_bytes(bytes: impl Into<Bytes>) -> Self {
        Key(Repr::Bytes(bytes.into()))
    }

    /// Appends a stable, unambiguous binary encoding of the key to `out` (a tag byte, then the
    /// address octets or the raw bytes).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match &self.0 {
            Repr::Global => out.push(b'g'),
            Repr::Ip(IpAddr::V4(ip)) => {
                out.push(b'4');
                out.extend_from_slice(&ip.octets());
            }
            Repr::Ip(IpAddr::V6(ip)) => {
                out.push(b'6');
                out.extend_from_slice(&ip.octets());
            }
            Repr::Bytes(b) => {
                out.push(b'b');
                out.extend_from_slice(b);
            }
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn parts(&self) -> KeyParts<'_> {
        match &self.0 {
            Repr::Global => KeyParts::Global,
            Repr::Ip(ip) => KeyParts::Ip(*ip),
            Repr::Bytes(b) => KeyParts::Bytes(b),
        }
    }

    /// The IP address, if the key is one.
    pub fn as_ip(&self) -> Option<IpAddr> {
        match self.0 {
            Repr::Ip(ip) => Some(ip),
            _ => None,
        }
    }
}

/// A borrowed view of a key's representation.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum KeyParts<'a> {
    Global,
    Ip(IpAddr),
    Bytes(&'a [u8]),
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Global => f.write_str("Key(global)"),
            Repr::Ip(ip) => write!(f, "Key({ip})"),
            Repr::Bytes(b) => write!(f, "Key({} bytes)", b.len()),
        }
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Key(Repr::Ip(ip))
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::from_bytes(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::from_bytes(s)
    }
}

impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Self {
        Key::from_bytes(Bytes::copy_from_slice(b))
    }
}

impl From<Vec<u8>> for Key {
    fn from(b: Vec<u8>) -> Self {
        Key::from_bytes(b)
    }
}

impl From<Bytes> for Key {
    fn from(b: Bytes) -> Self {
        Key::from_bytes(b)
    }
}

impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Key::from_bytes(Bytes::copy_from_slice(&n.to_be_bytes()))
    }
}
