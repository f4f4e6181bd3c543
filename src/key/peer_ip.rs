use std::net::SocketAddr;

use super::{Key, KeyExtractor, KeyRejection, RequestRef};

/// The IP address of the socket peer: the client, or the last proxy in front of the server.
///
/// The address is looked up in the request extensions, in this order: axum's
/// `ConnectInfo<SocketAddr>` (serve with `into_make_service_with_connect_info::<SocketAddr>()`),
/// axum's `MockConnectInfo<SocketAddr>` (for tests), then a plain [`SocketAddr`] (for hyper or
/// tonic services that insert one). The axum lookups need the `axum` feature. A request with no
/// address is rejected with `500 Internal Server Error`, since the server is set up wrong.
///
/// Behind a reverse proxy every request has the proxy's address; the client-IP extractor with
/// trusted proxies is the one to use there.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerIp;

impl PeerIp {
    /// The peer-IP extractor.
    pub const fn new() -> Self {
        PeerIp
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
            .map(|addr| Key::from(addr.ip().to_canonical()))
            .ok_or_else(|| {
                KeyRejection::misconfigured(
                    "no_peer_address",
                    "no peer address in the request extensions; with axum, serve with into_make_service_with_connect_info::<SocketAddr>()",
                )
            })
    }
}
