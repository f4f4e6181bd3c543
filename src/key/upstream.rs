use super::{Key, KeyExtractor, KeyRejection, RequestRef};

/// The upstream an outbound call goes to: its URI's host and port (`api.example.com:443`,
/// the port its scheme implies when the URI names none), else its `Host` header: the default
/// key of an [`EgressLayer`](crate::egress::EgressLayer), so that every call to one upstream,
/// from any instance, shares one budget.
///
/// ```
/// use tower_ratelimit::key::{Key, KeyExtractor, RequestRef, UpstreamHost};
///
/// let call = http::Request::get("https://api.example.com/v1/chat").body(()).unwrap();
/// let key = UpstreamHost.extract(&RequestRef::new(&call)).unwrap();
/// assert_eq!(key, Key::from("api.example.com:443"));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct UpstreamHost;

impl KeyExtractor for UpstreamHost {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        let uri = request.uri();
        if let Some(host) = uri.host() {
            let port = uri.port_u16().or(match uri.scheme_str() {
                Some("https" | "wss") => Some(443),
                Some("http" | "ws") => Some(80),
                _ => None,
            });
            let host = host.to_ascii_lowercase();
            return Ok(Key::from(match port {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }));
        }
        let header = request.headers().get(http::header::HOST);
        match header.and_then(|h| h.to_str().ok()).map(str::trim) {
            Some(host) if !host.is_empty() => Ok(Key::from(host.to_ascii_lowercase())),
            _ => Err(KeyRejection::misconfigured(
                "no_upstream",
                "the call names no upstream: neither its URI nor a Host header has a host",
            )),
        }
    }
}
