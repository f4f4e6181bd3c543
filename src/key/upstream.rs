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
            return Ok(host_key(host, port));
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

/// The key `host:port` (or `host`), the host in lower case: made on the stack, without
/// formatting, for a host of usual length (each outbound call makes one).
fn host_key(host: &str, port: Option<u16>) -> Key {
    // Room for the host, a colon and five digits.
    let mut buf = [0u8; 96];
    if host.len() + 6 > buf.len() {
        let host = host.to_ascii_lowercase();
        return Key::from(match port {
            Some(port) => format!("{host}:{port}"),
            None => host,
        });
    }
    buf[..host.len()].copy_from_slice(host.as_bytes());
    buf[..host.len()].make_ascii_lowercase();
    let mut len = host.len();
    if let Some(port) = port {
        let mut digits = [0u8; 5];
        let (mut at, mut rest) = (digits.len(), port);
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        let digits = &digits[at..];
        buf[len] = b':';
        buf[len + 1..len + 1 + digits.len()].copy_from_slice(digits);
        len += 1 + digits.len();
    }
    Key::from(&buf[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_key_is_the_lower_case_host_and_its_port() {
        assert_eq!(
            host_key("API.Example.com", Some(443)),
            Key::from("api.example.com:443")
        );
        assert_eq!(host_key("h", Some(0)), Key::from("h:0"));
        assert_eq!(host_key("h", Some(65535)), Key::from("h:65535"));
        assert_eq!(host_key("h", None), Key::from("h"));
        let long = "A".repeat(200);
        let key = format!("{}:8080", "a".repeat(200));
        assert_eq!(host_key(&long, Some(8080)), Key::from(key.as_str()));
    }
}
