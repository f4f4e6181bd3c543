use http::HeaderName;
use http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};

use super::{EntryError, Key, KeyExtractor, KeyParts, KeyRejection, RequestRef, entry_text, shown};
use crate::error::ConfigError;

/// The longest header value read.
const MAX_LEN: usize = 4096;

/// An API key or bearer token, keyed by its SHA-256 hash so that the secret itself never
/// reaches the store (Redis keys, memory) or the logs.
///
/// * [`ApiKey::bearer`] reads `Authorization: Bearer <token>` (the scheme in any case).
/// * [`ApiKey::header`] reads the whole value of a header such as `x-api-key`.
///
/// A request where the header is missing, empty, longer than 4 KiB, present more than once, or
/// (for `bearer`) not a `Bearer` credential is rejected with `400 Bad Request`; messages name
/// the header, never its value.
///
/// The key is not checked: any string gets a bucket. Put the limit after authentication (or
/// [combine](super::first_of) it with [`ClientIp`](super::ClientIp)) so that a client cannot
/// get fresh buckets by inventing keys. The unsalted hash of a high-entropy key cannot be
/// reversed; low-entropy secrets such as passwords do not belong in a rate-limit key.
///
/// ```
/// use tower_ratelimit::key::ApiKey;
///
/// let by_token = ApiKey::bearer();
/// let by_header = ApiKey::try_header("x-api-key")?;
/// # let _ = (by_token, by_header);
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ApiKey {
    source: TokenSource,
}

#[derive(Clone, Debug)]
enum TokenSource {
    Bearer,
    Header(HeaderName),
}

impl ApiKey {
    /// The token of an `Authorization: Bearer <token>` header.
    pub fn bearer() -> Self {
        ApiKey {
            source: TokenSource::Bearer,
        }
    }

    /// The whole value of the header `name`, e.g. `x-api-key`.
    pub fn header(name: HeaderName) -> Self {
        ApiKey {
            source: TokenSource::Header(name),
        }
    }

    /// Like [`ApiKey::header`], from a string; fails when it is not a valid header name.
    pub fn try_header(name: &str) -> Result<Self, ConfigError> {
        HeaderName::try_from(name)
            .map(Self::header)
            .map_err(|_| ConfigError::new(format!("{name:?} is not a valid header name")))
    }

    /// The key a token is charged to: its SHA-256 hash. Useful to find or reset a client's
    /// bucket without storing its secret.
    pub fn key_for(token: &[u8]) -> Key {
        Key::from(Sha256::digest(token).as_slice())
    }

    fn name(&self) -> &HeaderName {
        match &self.source {
            TokenSource::Bearer => &AUTHORIZATION,
            TokenSource::Header(name) => name,
        }
    }
}

impl KeyExtractor for ApiKey {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        let name = self.name();
        let mut values = request.headers().get_all(name).iter();
        let value = values.next().ok_or_else(|| {
            KeyRejection::bad_request(
                "missing_api_key",
                format!("the request has no {name} header"),
            )
        })?;
        if values.next().is_some() {
            return Err(KeyRejection::bad_request(
                "ambiguous_api_key",
                format!("the request has more than one {name} header"),
            ));
        }
        let bytes = value.as_bytes();
        if bytes.len() > MAX_LEN {
            return Err(KeyRejection::bad_request(
                "api_key_too_long",
                format!("the {name} header is longer than {MAX_LEN} bytes"),
            ));
        }
        let token = match self.source {
            TokenSource::Header(_) => bytes.trim_ascii(),
            TokenSource::Bearer => bearer_token(bytes).ok_or_else(|| {
                KeyRejection::bad_request(
                    "missing_api_key",
                    "the Authorization header is not a Bearer token",
                )
            })?,
        };
        if token.is_empty() {
            return Err(KeyRejection::bad_request(
                "missing_api_key",
                format!("the {name} header is empty"),
            ));
        }
        Ok(Self::key_for(token))
    }

    /// The token a client sends, hashed (`Bearer ` before it is taken off); the digest a
    /// report shows (`0x` and 64 hex digits) as it is; a key of 32 bytes (a digest taken
    /// from a report in code) as it is, and hashed too.
    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        let bytes = match entry.parts() {
            KeyParts::Bytes(bytes) => bytes,
            // A long key as the layer keeps it (a digest taken from a report): as it is.
            KeyParts::Hashed(_) => return Ok(vec![entry.clone()]),
            KeyParts::Ip(_) | KeyParts::Global => {
                return Err(EntryError::new(format!(
                    "{} is no API key: keys here are the digests of the tokens clients send",
                    shown(entry)
                )));
            }
        };
        let text = entry_text(entry);
        if let Some(digest) = text.and_then(digest_of) {
            return Ok(vec![Key::from(&digest[..])]);
        }
        let token = match text {
            Some(text) => bearer_token(text.as_bytes()).unwrap_or(text.as_bytes()),
            None => bytes,
        };
        if token.is_empty()
            || token.len() > MAX_LEN
            || token.iter().any(|&b| b == b' ' || b == b'\t')
        {
            return Err(EntryError::new(
                "an API key is 1 to 4,096 bytes without spaces",
            ));
        }
        let mut keys = vec![Self::key_for(token)];
        if bytes.len() == 32 {
            keys.push(entry.clone());
        }
        Ok(keys)
    }
}

/// The digest `0x` and 64 hex digits write, as a report of limited keys shows it.
fn digest_of(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("0x")?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let digit = |b: u8| (b as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// The token of `Bearer <token>`: the scheme in any case, one or more spaces, then a token
/// without spaces.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    if token.is_empty() || token.iter().any(|&b| b == b' ' || b == b'\t') {
        return None;
    }
    Some(token)
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    fn extract(key: &ApiKey, headers: &[(&str, &str)]) -> Result<Key, KeyRejection> {
        let mut req = Request::new(());
        for (name, value) in headers {
            req.headers_mut()
                .append(HeaderName::try_from(*name).unwrap(), value.parse().unwrap());
        }
        key.extract(&RequestRef::new(&req))
    }

    #[test]
    fn bearer_tokens_are_hashed() {
        let key = ApiKey::bearer();
        let alice = extract(&key, &[("authorization", "Bearer alice-token")]).unwrap();
        assert_eq!(alice, ApiKey::key_for(b"alice-token"));
        // Exactly the SHA-256 of the token, never the token.
        let mut encoded = Vec::new();
        alice.encode(&mut encoded);
        assert_eq!(encoded[0], b'b');
        assert_eq!(encoded[1..], Sha256::digest(b"alice-token")[..]);
        assert!(!encoded.windows(5).any(|w| w == b"alice"));
        assert_eq!(
            extract(&key, &[("authorization", "bearer   alice-token ")]).unwrap(),
            alice
        );
        assert_eq!(
            extract(&key, &[("authorization", "BEARER alice-token")]).unwrap(),
            alice
        );
        assert_ne!(
            extract(&key, &[("authorization", "Bearer bob-token")]).unwrap(),
            alice
        );
        for bad in [
            "Basic YWxpY2U6cHc=",
            "Bearer",
            "Bearer ",
            "Bearerx abc",
            "Bearer a b",
            "Token abc",
        ] {
            let err = extract(&key, &[("authorization", bad)]).unwrap_err();
            assert_eq!(err.code(), "missing_api_key", "{bad}");
            assert!(!err.message().contains("YWxp"), "no secret in {err}");
        }
        assert_eq!(extract(&key, &[]).unwrap_err().code(), "missing_api_key");
        let two = [("authorization", "Bearer a"), ("authorization", "Bearer b")];
        assert_eq!(extract(&key, &two).unwrap_err().code(), "ambiguous_api_key");
    }

    #[test]
    fn header_keys_are_hashed() {
        let key = ApiKey::try_header("x-api-key").unwrap();
        assert_eq!(
            extract(&key, &[("x-api-key", "k1")]).unwrap(),
            ApiKey::key_for(b"k1")
        );
        assert_eq!(
            extract(&key, &[("x-api-key", " k1 ")]).unwrap(),
            ApiKey::key_for(b"k1")
        );
        assert_eq!(
            extract(&key, &[("x-api-key", "")]).unwrap_err().code(),
            "missing_api_key"
        );
        let long = "k".repeat(MAX_LEN + 1);
        assert_eq!(
            extract(&key, &[("x-api-key", &long)]).unwrap_err().code(),
            "api_key_too_long"
        );
        assert!(ApiKey::try_header("bad header").is_err());
        assert!(!format!("{:?}", ApiKey::key_for(b"secret")).contains("secret"));
    }
}
