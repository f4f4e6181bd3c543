//! Keys: whom a request is counted against.
//!
//! A [`KeyExtractor`] returns the [`Key`] of the bucket a request is charged to, or a
//! [`KeyRejection`] when it lacks what the key is made of: answered (400 by default), never
//! counted in a shared bucket.
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
//! | [`GrpcMethod`] | the full gRPC method name, `/package.Service/Method` |
//! | [`first_of`], [`KeyExtractor::or`] | the first of several that finds a key (user id, else client IP) |
//! | [`all`] | several keys combined into one (route and client) |
//! | [`from_fn`] | anything a closure computes from the request |
//! | [`json`] | the value at a JSON pointer of the request's JSON body (feature `json`) |
//! | [`jsonrpc`] | a JSON-RPC call's method, `tools/call:<name>` for an MCP tool (feature `json`) |
//! | [`UpstreamHost`] | an outbound call's upstream, host and port ([`egress`](crate::egress)) |
//!
//! Behind a load balancer or reverse proxy, [`PeerIp`] sees only the proxy: every client shares
//! one bucket. Never key on the leftmost `X-Forwarded-For` entry instead: the client writes it,
//! and could send a new one each time (a fresh bucket) or a victim's (draining theirs).
//! [`ClientIp`] reads only what your proxies wrote.
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
mod entry;
mod client_ip;
mod composite;
mod extension;
mod forwarded;
mod from_fn;
mod global;
mod grpc;
mod header;
mod ip_group;
#[cfg(feature = "json")]
mod json;
mod peer_ip;
mod request;
mod route;
mod upstream;

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;

use bytes::Bytes;

pub use crate::error::{EntryError, KeyRejection};
pub use api_key::ApiKey;
pub use cidr::Cidr;
pub use client_ip::{Basis, ClientIp, ClientIpBuilder, DEFAULT_MAX_HOPS, ProxyHeader, Resolution};
pub use composite::{All, FirstOf, all, first_of};
pub(crate) use entry::{entry_text, ip_entry, kept_entry_keys, shown};
pub use extension::{ExtensionKey, extension, extension_with};
pub use from_fn::{FromFn, from_fn};
pub use global::GlobalKey;
pub use grpc::GrpcMethod;
pub use header::HeaderKey;
#[cfg(feature = "graphql")]
pub(crate) use json::body_json;
#[cfg(feature = "json")]
pub use json::{JsonKey, JsonRpcKey, MISSING, json, jsonrpc};
#[cfg(feature = "json")]
pub(crate) use json::{check_pointer, cost_at};
pub(crate) use peer_ip::DefaultKey;
pub use peer_ip::PeerIp;
pub use request::{RequestRef, UNREAD};
pub use route::{MatchedRoute, matched_route};
pub use upstream::UpstreamHost;

/// Finds the key a request is charged to.
pub trait KeyExtractor: Send + Sync + fmt::Debug + 'static {
    /// The key for `request`, or why there is none.
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection>;

    /// The keys this extractor makes of the requests `entry` names: what an administrator's
    /// entry (on a deny or allow list, or a key given a limit of its own) is kept as, so that
    /// it matches those requests. `entry` is an operator's text (`Key::from("::1")`) or a key
    /// made in code (`Key::from(ip)`).
    ///
    /// An address extractor takes an address in any form (`::1`, `0:0:0:0:0:0:0:1`,
    /// `::ffff:127.0.0.1`) and groups it as it groups requests (IPv6 by `/64`); [`ApiKey`]
    /// takes the token a client sends (or the `0x...` digest a report shows) and hashes it;
    /// [`HeaderKey`] takes a value without the spaces around it; [`first_of`] gives the key of
    /// every part that can make one. `Err` says why no request can have such a key (`alice`
    /// where keys are addresses): the entry is refused rather than kept and never matched.
    ///
    /// The default keeps the entry as it is: right for an extractor whose keys are the text
    /// it reads ([`from_fn`], [`extension`]).
    ///
    /// ```
    /// use tower_ratelimit::key::{ApiKey, ClientIp, Key, KeyExtractor, PeerIp};
    ///
    /// let peer = PeerIp::new();
    /// let keys = peer.entry_keys(&Key::from("::ffff:127.0.0.1")).unwrap();
    /// assert_eq!(keys, [Key::from("127.0.0.1".parse::<std::net::IpAddr>().unwrap())]);
    /// assert!(peer.entry_keys(&Key::from("alice")).is_err());
    /// // An API key, or else the address: the entry names every part it can, here both the
    /// // address ::1 and a client whose token is "::1".
    /// let either = ApiKey::bearer().or(ClientIp::new(["10.0.0.0/8"]).unwrap());
    /// assert_eq!(either.entry_keys(&Key::from("::1")).unwrap().len(), 2);
    /// assert_eq!(either.entry_keys(&Key::from("s3cret")).unwrap().len(), 1);
    /// ```
    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        Ok(vec![entry.clone()])
    }

    /// The [`ClientIp`] this extractor finds a client's address with, if it has one (itself,
    /// or a part of a composite): the allow and deny lists match their networks against the
    /// address it finds, unless given their own ([`Lists::client_ip`](crate::lists::Lists::client_ip)).
    fn client_ip(&self) -> Option<&ClientIp> {
        None
    }

    /// Whether this extractor reads the request body ([`json`], [`jsonrpc`], or a part of a
    /// composite that does): a policy keyed so has the layer read the bodies of its requests,
    /// and needs a layer that reads bodies
    /// ([`read_bodies`](crate::RateLimitLayerBuilder::read_bodies)). An extractor of your own
    /// that reads [`RequestRef::body`] says so here.
    fn reads_body(&self) -> bool {
        false
    }

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

    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        (**self).entry_keys(entry)
    }

    fn client_ip(&self) -> Option<&ClientIp> {
        (**self).client_ip()
    }

    fn reads_body(&self) -> bool {
        (**self).reads_body()
    }
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for Box<K> {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        (**self).extract(request)
    }

    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        (**self).entry_keys(entry)
    }

    fn client_ip(&self) -> Option<&ClientIp> {
        (**self).client_ip()
    }

    fn reads_body(&self) -> bool {
        (**self).reads_body()
    }
}

/// The identity of a bucket: an IP address, some bytes, or the single global bucket.
///
/// Keys compare by value; `Key::from("alice")` and `Key::from(b"alice".as_slice())` are the same
/// key, while an IP address and its text form are different keys.
///
/// A key of up to 38 bytes is held inline: making, cloning and comparing one allocates nothing
/// and follows no pointer.
#[derive(Clone)]
pub struct Key(Repr);

/// The longest byte key held inline; longer ones are shared [`Bytes`].
const INLINE: usize = 38;

#[derive(Clone)]
enum Repr {
    Global,
    Ip(IpAddr),
    /// `len` bytes, at most [`INLINE`]; the rest is zero.
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    /// More than [`INLINE`] bytes (a key of fewer is always inline, so each value has one
    /// representation).
    Bytes(Bytes),
}

/// The two bytes before the 128-bit hash of a key longer than [`LONGEST`], as the layer
/// keeps it ([`Key::compact`]): inline bytes, so that deciding costs what it did (a key of
/// bytes beginning with a NUL, which no header value holds, is the only one it could be
/// mistaken for).
const HASHED: [u8; 2] = [0, b'#'];

/// The longest key the layer keeps whole: a longer one is kept as a 128-bit hash of its
/// bytes (SHA-256's first half), so that a client sending 4 KiB keys costs what one sending
/// short ones does, in the memory store, the warnings near the limit, the top limited keys,
/// the deny cache and in Redis alike. Two long keys are one when their hashes are (a chance
/// of about n^2 / 2^129 among n long keys, and no known way to make two collide on purpose).
pub const LONGEST: usize = 64;

impl Key {
    /// The one bucket shared by every request.
    pub const fn global() -> Self {
        Key(Repr::Global)
    }

    /// A key made of arbitrary bytes.
    pub fn from_bytes(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        Key::inline(&bytes).unwrap_or(Key(Repr::Bytes(bytes)))
    }

    /// A key of `bytes`, copied inline when they are short enough, else into a [`Bytes`].
    fn copied(bytes: &[u8]) -> Self {
        Key::inline(bytes).unwrap_or_else(|| Key(Repr::Bytes(Bytes::copy_from_slice(bytes))))
    }

    /// Whether the key is longer than [`LONGEST`], kept as its hash once compacted.
    #[inline]
    pub(crate) fn is_long(&self) -> bool {
        matches!(&self.0, Repr::Bytes(bytes) if bytes.len() > LONGEST)
    }

    /// The key as the layer keeps it: a key of more than [`LONGEST`] bytes as their hash, any
    /// other as it is. Every key a request or an administrator gives is made so before a store
    /// sees it.
    #[inline]
    pub(crate) fn compact(self) -> Key {
        match &self.0 {
            Repr::Bytes(bytes) if bytes.len() > LONGEST => {
                use sha2::{Digest, Sha256};
                let digest = Sha256::digest(bytes);
                let mut marked = [0; 18];
                marked[..2].copy_from_slice(&HASHED);
                marked[2..].copy_from_slice(&digest[..16]);
                Key::copied(&marked)
            }
            _ => self,
        }
    }

    /// A key of `bytes` held inline, if they fit.
    fn inline(bytes: &[u8]) -> Option<Self> {
        (bytes.len() <= INLINE).then(|| {
            let mut inline = [0; INLINE];
            inline[..bytes.len()].copy_from_slice(bytes);
            Key(Repr::Inline {
                len: bytes.len() as u8,
                bytes: inline,
            })
        })
    }

    /// The bytes of a byte key.
    fn bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Inline { len, bytes } => Some(&bytes[..usize::from(*len)]),
            Repr::Bytes(b) => Some(b),
            Repr::Global | Repr::Ip(_) => None,
        }
    }

    /// The key's binary form: a tag byte and the address octets (put in `octets`) or the raw
    /// bytes. What [`encode`](Self::encode) writes and [`hash_with`](Self::hash_with) hashes.
    #[inline]
    fn tagged<'a>(&'a self, octets: &'a mut [u8; 16]) -> (u8, &'a [u8]) {
        match &self.0 {
            Repr::Global => (b'g', &[]),
            Repr::Ip(IpAddr::V4(ip)) => {
                octets[..4].copy_from_slice(&ip.octets());
                (b'4', &octets[..4])
            }
            Repr::Ip(IpAddr::V6(ip)) => {
                *octets = ip.octets();
                (b'6', &octets[..])
            }
            Repr::Inline { .. } | Repr::Bytes(_) => (b'b', self.bytes().unwrap_or_default()),
        }
    }

    /// Appends a stable, unambiguous binary encoding of the key to `out` (a tag byte, then the
    /// address octets or the raw bytes).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut octets = [0; 16];
        let (tag, bytes) = self.tagged(&mut octets);
        out.push(tag);
        out.extend_from_slice(bytes);
    }

    /// The hash of (`id`, this key) from `hasher`, for the stores' tables: the key's own
    /// hash ([`hash_in`](Self::hash_in)) with the id mixed in ([`with_id`](Self::with_id)), so
    /// that the policies of one key hash it once.
    #[inline]
    pub(crate) fn hash_with(&self, id: u32, hasher: &impl BuildHasher) -> u64 {
        Self::with_id(self.hash_in(hasher), id)
    }

    /// A key's hash ([`hash_in`](Self::hash_in)) made the hash of (`id`, the key): XOR with a
    /// constant of the id. For one id this is a bijection of the keyed hash, so keys a client
    /// chooses collide under one policy no more than they do under SipHash itself; the ids'
    /// constants differ in their low bits, which place a row in its table, and in their high
    /// ones. (The memory store picks a key's shard from the key's own hash, so that every
    /// policy of a key is in one shard.)
    #[inline]
    pub(crate) fn with_id(key_hash: u64, id: u32) -> u64 {
        key_hash ^ (u64::from(id) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// The hash of this key from `hasher`: its binary form (as [`tagged`](Self::tagged) gives
    /// it) in one `write` (two for a key too long to be inline), where hashing it field by
    /// field makes several, each paying SipHash's own buffering. Every copy into the buffer
    /// has a fixed size (an inline key's bytes are zero past its length), so none calls
    /// `memcpy`.
    #[inline(always)]
    pub(crate) fn hash_in(&self, hasher: &impl BuildHasher) -> u64 {
        let mut h = hasher.build_hasher();
        let mut buf = [0u8; 1 + INLINE];
        let len = match &self.0 {
            Repr::Global => {
                buf[0] = b'g';
                0
            }
            Repr::Ip(IpAddr::V4(ip)) => {
                buf[0] = b'4';
                buf[1..5].copy_from_slice(&ip.octets());
                4
            }
            Repr::Ip(IpAddr::V6(ip)) => {
                buf[0] = b'6';
                buf[1..17].copy_from_slice(&ip.octets());
                16
            }
            Repr::Inline { len, bytes } => {
                buf[0] = b'b';
                buf[1..].copy_from_slice(bytes);
                usize::from(*len)
            }
            Repr::Bytes(bytes) => {
                // SipHash streams: the same hash as one write of both.
                h.write(b"b");
                h.write(bytes);
                return h.finish();
            }
        };
        h.write(&buf[..1 + len]);
        h.finish()
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn parts(&self) -> KeyParts<'_> {
        match &self.0 {
            Repr::Global => KeyParts::Global,
            Repr::Ip(ip) => KeyParts::Ip(*ip),
            Repr::Inline { .. } | Repr::Bytes(_) => {
                let bytes = self.bytes().unwrap_or_default();
                match bytes.split_first_chunk::<2>() {
                    Some((&HASHED, digest)) if digest.len() == 16 => {
                        KeyParts::Hashed(digest.try_into().expect("16 bytes"))
                    }
                    _ => KeyParts::Bytes(bytes),
                }
            }
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
    /// A key longer than [`LONGEST`], as its hash.
    Hashed(&'a [u8; 16]),
}

impl PartialEq for Key {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        // Each value has one representation (a key that fits inline is always inline), so two
        // representations never hold the same key; inline bytes are zero past `len`, so the
        // whole arrays compare (one fixed-size comparison, not a slice of each).
        match (&self.0, &other.0) {
            (Repr::Global, Repr::Global) => true,
            (Repr::Ip(a), Repr::Ip(b)) => a == b,
            (Repr::Inline { len: a, bytes: x }, Repr::Inline { len: b, bytes: y }) => {
                a == b && same_inline(x, y)
            }
            (Repr::Bytes(a), Repr::Bytes(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Key {}

/// Whether two inline arrays are equal, compared as three 16-byte words (the last two overlap)
/// where `==` on arrays calls `memcmp`.
#[inline]
fn same_inline(x: &[u8; INLINE], y: &[u8; INLINE]) -> bool {
    const _: () = assert!(INLINE > 16 && INLINE <= 48);
    let word = |b: &[u8; INLINE], at: usize| {
        let mut w = [0; 16];
        w.copy_from_slice(&b[at..at + 16]);
        u128::from_ne_bytes(w)
    };
    word(x, 0) == word(y, 0)
        && word(x, 16) == word(y, 16)
        && word(x, INLINE - 16) == word(y, INLINE - 16)
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match &self.0 {
            Repr::Global => state.write_u8(0),
            Repr::Ip(ip) => {
                state.write_u8(1);
                ip.hash(state);
            }
            Repr::Inline { .. } | Repr::Bytes(_) => {
                state.write_u8(2);
                self.bytes().unwrap_or_default().hash(state);
            }
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.0, self.bytes()) {
            (Repr::Global, _) => f.write_str("Key(global)"),
            (Repr::Ip(ip), _) => write!(f, "Key({ip})"),
            (_, bytes) => write!(f, "Key({} bytes)", bytes.unwrap_or_default().len()),
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
        Key::copied(s.as_bytes())
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::inline(s.as_bytes()).unwrap_or_else(|| Key::from_bytes(s))
    }
}

impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Self {
        Key::copied(b)
    }
}

impl From<Vec<u8>> for Key {
    fn from(b: Vec<u8>) -> Self {
        Key::inline(&b).unwrap_or_else(|| Key::from_bytes(b))
    }
}

impl From<Bytes> for Key {
    fn from(b: Bytes) -> Self {
        Key::from_bytes(b)
    }
}

impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Key::copied(&n.to_be_bytes())
    }
}

#[cfg(test)]
mod tests;
