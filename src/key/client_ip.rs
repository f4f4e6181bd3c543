use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderName};

use super::cidr::Cidr;
use super::forwarded::{
    Hop, MAX_FORWARDED_ELEMENT, MAX_XFF_ELEMENT, RevElements, parse_forwarded_element,
    parse_single_value, parse_xff_element,
};
use super::ip_group::{DEFAULT_IPV6_PREFIX, group, valid_prefix};
use super::{EntryError, Key, KeyExtractor, KeyRejection, PeerIp, RequestRef, ip_entry};
use crate::error::ConfigError;

/// The default cap on the number of forwarding-header elements examined per request.
pub const DEFAULT_MAX_HOPS: usize = 32;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static FORWARDED: HeaderName = http::header::FORWARDED;

/// The client's IP address, read through a chain of proxies you trust and no others.
///
/// The socket peer (found as [`PeerIp`] finds it) is the client unless it is in one of the
/// trusted proxy networks. Only then is a forwarding header read, and only the part of it that
/// the trusted proxies wrote: the list is walked from the right, skipping trusted addresses,
/// and the first untrusted address is the client. The leftmost entries are never trusted: the
/// client writes them, and a limiter that believes them can be bypassed by sending a new fake
/// address with each request, or turned against a victim by sending theirs.
///
/// ```
/// use tower_ratelimit::key::{ClientIp, ProxyHeader};
///
/// // Behind a load balancer in 10.0.0.0/8 that appends to X-Forwarded-For:
/// let client_ip = ClientIp::new(["10.0.0.0/8"])?;
///
/// // Behind proxies that write RFC 7239 `Forwarded`, grouping IPv6 clients by /56:
/// let client_ip = ClientIp::builder()
///     .trusted_proxies(["10.0.0.0/8", "2001:db8:ffff::/48"])
///     .header(ProxyHeader::Forwarded)
///     .ipv6_prefix(56)
///     .build()?;
///
/// // Behind Cloudflare (list Cloudflare's published ranges), which sets CF-Connecting-IP:
/// let client_ip = ClientIp::builder()
///     .trusted_proxies(["173.245.48.0/20", "2400:cb00::/32"])
///     .header(ProxyHeader::single("cf-connecting-ip")?)
///     .build()?;
/// # let _ = client_ip;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
///
/// # The walk, and what happens when it cannot find the client
///
/// The trusted peer wrote the rightmost element (the address of whoever connected to it); if
/// that address is trusted too, that proxy wrote the element to its left, and so on. So every
/// element up to and including the first untrusted one was written by a trusted proxy, and
/// nothing to its left is read. When the walk stops before finding an untrusted address, the
/// request is keyed on the **last trusted hop reached**, the most specific address a trusted
/// proxy vouched for; this never lets a client choose its key, at the price of putting the
/// unidentifiable requests of one proxy in one bucket (a one-time warning says so):
///
/// | what the walk meets | key | [`Basis`] |
/// |---|---|---|
/// | an untrusted peer | the peer; headers ignored (one-time warning if it sent any) | [`UntrustedPeer`](Basis::UntrustedPeer) |
/// | an untrusted address | that address | [`Header`](Basis::Header) |
/// | a trusted peer and no header | the peer (one-time warning) | [`NoHeader`](Basis::NoHeader) |
/// | only trusted addresses | the leftmost of them | [`AllTrusted`](Basis::AllTrusted) |
/// | `unknown`, `_obfuscated`, a `Forwarded` element without `for=` | the last trusted hop | [`Unidentified`](Basis::Unidentified) |
/// | anything else that is not an address | the last trusted hop | [`Malformed`](Basis::Malformed) |
/// | more than [`max_hops`](ClientIpBuilder::max_hops) elements (default 32) | the last trusted hop | [`HopLimit`](Basis::HopLimit) |
///
/// `unknown` and obfuscated identifiers are not skipped: whoever they stand for is not known to
/// be trusted, so nothing they forwarded can be believed either. Rejecting such requests
/// instead would turn a proxy's privacy setting into an outage; keying them on the proxy keeps
/// them limited and leaves no bypass. Empty list elements are ignored, as HTTP requires.
///
/// # Cost
///
/// Headers are read in place from the right, one element at a time, without allocating. At
/// most [`max_hops`](ClientIpBuilder::max_hops) elements are examined, and an element longer
/// than 128 bytes (`X-Forwarded-For`, single-value headers) or 1 KiB (`Forwarded`) is malformed
/// after that many bytes, so a 400 KB header or ten thousand hops cost what the trusted hops cost.
///
/// # Addresses
///
/// An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) is the IPv4 address, both for matching the
/// trusted networks and in the key. Other IPv6 clients are keyed by their `/64` network
/// ([`ipv6_prefix`](ClientIpBuilder::ipv6_prefix) changes it), since one subscriber holds at
/// least a `/64` and could otherwise rotate through 2⁶⁴ addresses, one bucket each.
///
/// # Misconfiguration
///
/// Two mistakes are reported once per extractor through `tracing` at `WARN` level, without any
/// address: forwarding headers arriving from an untrusted peer (is the proxy missing from the
/// trusted list?), and a request from a trusted proxy being keyed on a proxy's own address
/// (does the proxy set the header this extractor reads?). A request without a peer address is
/// rejected with `500`, as with [`PeerIp`].
#[derive(Clone)]
pub struct ClientIp {
    inner: Arc<ClientIpRules>,
}

struct ClientIpRules {
    trusted: Vec<Cidr>,
    header: ProxyHeader,
    ipv6_prefix: u8,
    max_hops: usize,
    warned_untrusted_headers: AtomicBool,
    warned_keyed_on_proxy: AtomicBool,
}

/// The forwarding header a [`ClientIp`] reads when the peer is a trusted proxy.
///
/// Exactly one: a header is believable only if every trusted proxy in the chain writes it, and
/// a client can always add the other one. Pick the header your proxies append to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`, appended to by each proxy (the default).
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1;proto=https, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// A header holding one address, set (not appended to) by the proxy in front of the
    /// server, such as `X-Real-IP` or `CF-Connecting-IP`. Use it only if that proxy always
    /// overwrites the header; a request where it appears more than once is keyed on the peer.
    Single(HeaderName),
}

impl ProxyHeader {
    /// A [`Single`](ProxyHeader::Single) header from its name; fails when the name is not a
    /// valid header name, or names `X-Forwarded-For` or `Forwarded` (which are lists).
    pub fn single(name: &str) -> Result<Self, ConfigError> {
        let header = HeaderName::try_from(name)
            .map_err(|_| ConfigError::new(format!("{name:?} is not a valid header name")))?;
        if header == X_FORWARDED_FOR || header == FORWARDED {
            return Err(ConfigError::new(format!(
                "{header} is a list of hops, not a single value: use ProxyHeader::XForwardedFor or ProxyHeader::Forwarded"
            )));
        }
        Ok(ProxyHeader::Single(header))
    }

    fn name(&self) -> &HeaderName {
        match self {
            ProxyHeader::XForwardedFor => &X_FORWARDED_FOR,
            ProxyHeader::Forwarded => &FORWARDED,
            ProxyHeader::Single(name) => name,
        }
    }
}

/// Why a [`ClientIp`] settled on the address it did; see the table on [`ClientIp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Basis {
    /// The peer is not a trusted proxy, so it is the client; forwarding headers were ignored.
    UntrustedPeer,
    /// The first untrusted address in the forwarding header, walking from the right (or the
    /// value of a single-value header).
    Header,
    /// The peer is a trusted proxy, but the request has no forwarding header (or only empty
    /// elements): the peer.
    NoHeader,
    /// Every address in the header is trusted: the leftmost.
    AllTrusted,
    /// The header has more elements than the cap, all trusted so far: the last trusted hop.
    HopLimit,
    /// Where a client address was expected, the header has `unknown`, an obfuscated identifier
    /// such as `_hidden`, or a `Forwarded` element without `for=`: the last trusted hop.
    Unidentified,
    /// Where a client address was expected, the header has something that is not an address,
    /// an element that is too long, or (single-value header) more than one value: the last
    /// trusted hop.
    Malformed,
}

impl Basis {
    /// Whether the address is a trusted proxy's, reached because the client could not be
    /// identified past it.
    pub fn is_fallback(self) -> bool {
        !matches!(
            self,
            Basis::UntrustedPeer | Basis::Header | Basis::AllTrusted
        )
    }

    fn describe(self) -> &'static str {
        match self {
            Basis::UntrustedPeer => "untrusted peer",
            Basis::Header => "forwarding header",
            Basis::NoHeader => "the request has no forwarding header",
            Basis::AllTrusted => "every hop is trusted",
            Basis::HopLimit => "more hops than the cap",
            Basis::Unidentified => "the client is unknown or obfuscated",
            Basis::Malformed => "the forwarding header is malformed",
        }
    }
}

/// The address a [`ClientIp`] found for a request, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolution {
    ip: IpAddr,
    basis: Basis,
    hops: usize,
    bytes: usize,
}

impl Resolution {
    /// The client's address, IPv4-mapped IPv6 turned into IPv4, before IPv6 grouping.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// Why this address.
    pub fn basis(&self) -> Basis {
        self.basis
    }

    /// How many header elements were examined (at most the hop cap).
    pub fn hops_examined(&self) -> usize {
        self.hops
    }

    /// How many header bytes were looked at: bounded by the hops examined, not by the
    /// length of the header.
    pub fn bytes_examined(&self) -> usize {
        self.bytes
    }
}

impl ClientIp {
    /// A client-IP extractor that trusts the proxies in `trusted_proxies` (networks such as
    /// `10.0.0.0/8`, or single addresses) and reads `X-Forwarded-For`; fails on a string that
    /// is not a network or an address.
    ///
    /// With an empty list it keys on the peer, like [`PeerIp`], and warns once if requests
    /// carry forwarding headers.
    pub fn new<I>(trusted_proxies: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::builder().trusted_proxies(trusted_proxies).build()
    }

    /// A builder, to choose the header, the IPv6 prefix and the hop cap.
    pub fn builder() -> ClientIpBuilder {
        ClientIpBuilder::default()
    }

    /// The trusted proxy networks.
    pub fn trusted_proxies(&self) -> &[Cidr] {
        &self.inner.trusted
    }

    /// The forwarding header read from trusted peers.
    pub fn header(&self) -> &ProxyHeader {
        &self.inner.header
    }

    /// The IPv6 grouping prefix length.
    pub fn ipv6_prefix_len(&self) -> u8 {
        self.inner.ipv6_prefix
    }

    /// Whether `ip` is in a trusted proxy network.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.inner.trusted.iter().any(|net| net.contains(ip))
    }

    /// Finds the client of `request`, with the reason; `500` when the request has no peer
    /// address.
    pub fn resolve(&self, request: &RequestRef<'_>) -> Result<Resolution, KeyRejection> {
        let peer = PeerIp::peer_addr(request).ok_or_else(super::peer_ip::no_peer_address)?;
        Ok(self.resolve_from(peer.ip(), request.headers()))
    }

    /// Finds the client of a request that came from `peer` with `headers`.
    pub fn resolve_from(&self, peer: IpAddr, headers: &HeaderMap) -> Resolution {
        let inner = &*self.inner;
        let peer = peer.to_canonical();
        if !self.is_trusted(peer) {
            if headers.contains_key(&X_FORWARDED_FOR)
                || headers.contains_key(&FORWARDED)
                || headers.contains_key(inner.header.name())
            {
                warn_once(&inner.warned_untrusted_headers, || {
                    tracing::warn!(
                        "ClientIp: a request from a peer outside the trusted proxy networks carries forwarding headers; they are ignored and the peer is taken as the client. If this server is behind a proxy, add the proxy's network to the trusted proxies (logged once)"
                    );
                });
            }
            return Resolution {
                ip: peer,
                basis: Basis::UntrustedPeer,
                hops: 0,
                bytes: 0,
            };
        }
        let resolution = match &inner.header {
            ProxyHeader::XForwardedFor => self.walk(peer, headers, false),
            ProxyHeader::Forwarded => self.walk(peer, headers, true),
            ProxyHeader::Single(name) => single(peer, headers, name),
        };
        if resolution.basis.is_fallback() {
            warn_once(&inner.warned_keyed_on_proxy, || {
                tracing::warn!(
                    reason = resolution.basis.describe(),
                    header = %inner.header.name(),
                    "ClientIp: a request from a trusted proxy was keyed on a proxy's own address; if this happens to most requests, all clients share one bucket: check that the proxies set the header this extractor reads (logged once)"
                );
            });
        }
        resolution
    }

    /// Walks a list header from the right.
    fn walk(&self, peer: IpAddr, headers: &HeaderMap, forwarded: bool) -> Resolution {
        let max_hops = self.inner.max_hops;
        let mut last_trusted = peer;
        let mut hops = 0;
        let mut bytes = 0;
        let mut seen_any = false;
        let done = |ip, basis, hops, bytes| Resolution {
            ip,
            basis,
            hops,
            bytes,
        };
        let (max_len, parse): (usize, fn(&[u8]) -> Hop) = if forwarded {
            (MAX_FORWARDED_ELEMENT, parse_forwarded_element)
        } else {
            (MAX_XFF_ELEMENT, parse_xff_element)
        };
        let name = self.inner.header.name();
        // Later header lines were added by later (closer) proxies: read them first.
        for line in headers.get_all(name).iter().rev() {
            let mut elements = RevElements::new(line.as_bytes(), forwarded, max_len);
            while let Some(element) = elements.next() {
                if hops == max_hops {
                    bytes += elements.scanned();
                    return done(last_trusted, Basis::HopLimit, hops, bytes);
                }
                hops += 1;
                let hop = match element {
                    Ok(element) => parse(element),
                    Err(_) => Hop::Malformed,
                };
                let stop = match hop {
                    Hop::Empty => None,
                    Hop::Addr(ip) => {
                        seen_any = true;
                        let ip = ip.to_canonical();
                        if self.is_trusted(ip) {
                            last_trusted = ip;
                            None
                        } else {
                            Some((ip, Basis::Header))
                        }
                    }
                    Hop::Unidentified => Some((last_trusted, Basis::Unidentified)),
                    Hop::Malformed => Some((last_trusted, Basis::Malformed)),
                };
                if let Some((ip, basis)) = stop {
                    bytes += elements.scanned();
                    return done(ip, basis, hops, bytes);
                }
            }
            bytes += elements.scanned();
        }
        let basis = if seen_any {
            Basis::AllTrusted
        } else {
            Basis::NoHeader
        };
        done(last_trusted, basis, hops, bytes)
    }
}

/// Reads a single-value header set by the trusted peer.
fn single(peer: IpAddr, headers: &HeaderMap, name: &HeaderName) -> Resolution {
    let mut values = headers.get_all(name).iter();
    let (basis, ip, bytes) = match (values.next(), values.next()) {
        (None, _) => (Basis::NoHeader, peer, 0),
        (Some(_), Some(_)) => (Basis::Malformed, peer, 0),
        (Some(value), None) => {
            let bytes = value.len().min(super::forwarded::MAX_SINGLE_VALUE + 1);
            match parse_single_value(value.as_bytes()) {
                Hop::Addr(ip) => (Basis::Header, ip.to_canonical(), bytes),
                Hop::Unidentified => (Basis::Unidentified, peer, bytes),
                Hop::Empty | Hop::Malformed => (Basis::Malformed, peer, bytes),
            }
        }
    };
    Resolution {
        ip,
        basis,
        hops: usize::from(basis != Basis::NoHeader),
        bytes,
    }
}

fn warn_once(flag: &AtomicBool, warn: impl FnOnce()) {
    if !flag.load(Ordering::Relaxed) && !flag.swap(true, Ordering::Relaxed) {
        warn();
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        let resolution = self.resolve(request)?;
        Ok(Key::from(group(resolution.ip, self.inner.ipv6_prefix)))
    }

    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        ip_entry(entry, self.inner.ipv6_prefix)
    }

    fn client_ip(&self) -> Option<&ClientIp> {
        Some(self)
    }
}

impl fmt::Debug for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIp")
            .field("trusted_proxies", &self.inner.trusted)
            .field("header", &self.inner.header)
            .field("ipv6_prefix", &self.inner.ipv6_prefix)
            .field("max_hops", &self.inner.max_hops)
            .finish()
    }
}

/// Configures a [`ClientIp`]; see [`ClientIp::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct ClientIpBuilder {
    trusted: Vec<Cidr>,
    header: ProxyHeader,
    ipv6_prefix: u8,
    max_hops: usize,
    error: Option<ConfigError>,
}

impl Default for ClientIpBuilder {
    fn default() -> Self {
        ClientIpBuilder {
            trusted: Vec::new(),
            header: ProxyHeader::XForwardedFor,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            max_hops: DEFAULT_MAX_HOPS,
            error: None,
        }
    }
}

impl ClientIpBuilder {
    /// Trusts the proxies in these networks (`10.0.0.0/8`, `2001:db8::/32`) or at these
    /// addresses (`192.0.2.1`). Adds to what was trusted before. A string that is not a
    /// network or an address makes [`build`](Self::build) fail.
    pub fn trusted_proxies<I>(mut self, networks: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        for network in networks {
            match network.as_ref().parse::<Cidr>() {
                Ok(cidr) => self.trusted.push(cidr),
                Err(e) => {
                    self.error
                        .get_or_insert_with(|| e.context("trusted proxies"));
                }
            }
        }
        self
    }

    /// Trusts the proxies in `network`.
    pub fn trusted_network(mut self, network: Cidr) -> Self {
        self.trusted.push(network);
        self
    }

    /// The header to read when the peer is trusted; [`ProxyHeader::XForwardedFor`] by default.
    pub fn header(mut self, header: ProxyHeader) -> Self {
        self.header = header;
        self
    }

    /// Keys IPv6 clients by their network of `bits` bits (64 by default; 56 or 48 to treat a
    /// whole customer allocation as one client, 128 for single addresses). More than 128 makes
    /// [`build`](Self::build) fail.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// Examines at most `hops` header elements per request (32 by default); at least 1.
    pub fn max_hops(mut self, hops: usize) -> Self {
        self.max_hops = hops;
        self
    }

    /// The extractor, or the first configuration mistake.
    pub fn build(self) -> Result<ClientIp, ConfigError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        if !valid_prefix(self.ipv6_prefix) {
            return Err(ConfigError::new(format!(
                "ClientIp: the IPv6 prefix length is at most 128, not {}",
                self.ipv6_prefix
            )));
        }
        if self.max_hops == 0 {
            return Err(ConfigError::new("ClientIp: max_hops must be at least 1"));
        }
        Ok(ClientIp {
            inner: Arc::new(ClientIpRules {
                trusted: self.trusted,
                header: self.header,
                ipv6_prefix: self.ipv6_prefix,
                max_hops: self.max_hops,
                warned_untrusted_headers: AtomicBool::new(false),
                warned_keyed_on_proxy: AtomicBool::new(false),
            }),
        })
    }
}
