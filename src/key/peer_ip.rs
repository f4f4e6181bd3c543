use std::net::SocketAddr;

use super::ip_group::{DEFAULT_IPV6_PREFIX, group, valid_prefix};
use super::{EntryError, Key, KeyExtractor, KeyRejection, RequestRef, ip_entry};

/// The IP address of the socket peer: the client, or the last proxy in front of the server.
///
/// The address is looked up in the request extensions, in this order: axum's
/// `ConnectInfo<SocketAddr>` (serve with `into_make_service_with_connect_info::<SocketAddr>()`),
/// axum's `MockConnectInfo<SocketAddr>` (for tests), then a plain [`SocketAddr`] (for hyper or
/// tonic services that insert one). The axum lookups need the `axum` feature. A request with no
/// address is rejected with `500 Internal Server Error`, since the server is set up wrong.
///
/// An IPv4-mapped IPv6 peer (`::ffff:192.0.2.1`) is keyed as the IPv4 address, and other IPv6
/// peers by their `/64` network (see [`ipv6_prefix`](PeerIp::ipv6_prefix)), so a client cannot
/// get a fresh bucket by moving to another address of its own `/64`.
///
/// Behind a reverse proxy every request has the proxy's address; use
/// [`ClientIp`](super::ClientIp) with the proxy's address as trusted there.
#[derive(Clone, Copy, Debug)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// The peer-IP extractor, grouping IPv6 peers by `/64`.
    pub const fn new() -> Self {
        PeerIp {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Keys IPv6 peers by their network of `bits` bits instead of `/64` (`56` or `48` for a
    /// whole customer allocation, `128` for single addresses).
    ///
    /// # Panics
    ///
    /// If `bits` is more than 128 (at compile time in a `const`).
    #[must_use]
    pub const fn ipv6_prefix(self, bits: u8) -> Self {
        assert!(
            valid_prefix(bits),
            "PeerIp::ipv6_prefix: an IPv6 prefix length is at most 128"
        );
        PeerIp { ipv6_prefix: bits }
    }

    /// The peer's socket address, where the request carries one.
    pub fn peer_addr(request: &RequestRef<'_>) -> Option<SocketAddr> {
        let ext = request.extensions();
        #[cfg(feature = "axum")]
        {
            use axum::extract::ConnectInfo;
            use axum::extract::connect_info::MockConnectInfo;
            if let Some(ConnectInfo(addr)) = ext.get::<ConnectInfo<SocketAddr>>() {
                return Some(*addr);
            }
            if let Some(MockConnectInfo(addr)) = ext.get::<MockConnectInfo<SocketAddr>>() {
                return Some(*addr);
            }
        }
        ext.get::<SocketAddr>().copied()
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        Self::peer_addr(request)
            .map(|addr| Key::from(group(addr.ip(), self.ipv6_prefix)))
            .ok_or_else(no_peer_address)
    }

    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        ip_entry(entry, self.ipv6_prefix)
    }
}

/// The rejection for a request without a peer address.
pub(super) fn no_peer_address() -> KeyRejection {
    KeyRejection::misconfigured(
        "no_peer_address",
        "no peer address in the request extensions; with axum, serve with into_make_service_with_connect_info::<SocketAddr>()",
    )
}

/// The layer's key when none is given: the peer's address, as [`PeerIp`] finds it. An
/// administrator's entry that is an address is that address's key; any other is taken as it
/// is, for a layer asked about keys of its own in code
/// ([`check`](crate::RateLimitLayer::check)). Give the layer `PeerIp` itself to have such
/// entries refused.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DefaultKey;

impl KeyExtractor for DefaultKey {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        PeerIp::new().extract(request)
    }

    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        ip_entry(entry, DEFAULT_IPV6_PREFIX).or_else(|_| Ok(vec![entry.clone()]))
    }
}
