use http::HeaderName;

use super::{EntryError, Key, KeyExtractor, KeyParts, KeyRejection, RequestRef};
use crate::error::ConfigError;

/// The longest header value accepted as a key.
const MAX_LEN: usize = 4096;

/// The value of one request header, e.g. an API key in `x-api-key`.
///
/// Spaces and tabs around the value are not part of it (HTTP/1.1 parsers drop them; an
/// HTTP/2 peer may send them), so `" acme"` and `"acme"` are one key.
///
/// A request where the header is missing, empty, longer than 4 KiB, or present more than once
/// (which would let a client pick among several identities) is rejected with `400 Bad Request`.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by the header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }

    /// Like [`HeaderKey::new`], from a string; fails when it is not a valid header name.
    pub fn try_new(name: &str) -> Result<Self, ConfigError> {
        HeaderName::try_from(name)
            .map(Self::new)
            .map_err(|_| ConfigError::new(format!("{name:?} is not a valid header name")))
    }

    /// The header's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        let mut values = request.headers().get_all(&self.name).iter();
        let value = values.next().ok_or_else(|| {
            KeyRejection::bad_request(
                "missing_header",
                format!("the request has no {} header", self.name),
            )
        })?;
        if values.next().is_some() {
            return Err(KeyRejection::bad_request(
                "ambiguous_header",
                format!("the request has more than one {} header", self.name),
            ));
        }
        let bytes = trim_ows(value.as_bytes());
        if bytes.is_empty() {
            return Err(KeyRejection::bad_request(
                "empty_header",
                format!("the {} header is empty", self.name),
            ));
        }
        if bytes.len() > MAX_LEN {
            return Err(KeyRejection::bad_request(
                "header_too_long",
                format!("the {} header is longer than {MAX_LEN} bytes", self.name),
            ));
        }
        Ok(Key::from(bytes))
    }

    /// The value a request sends: text without the spaces around it (an address key is its
    /// text), not empty, at most 4 KiB.
    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        let value = match entry.parts() {
            KeyParts::Bytes(bytes) => trim_ows(bytes).to_vec(),
            KeyParts::Ip(ip) => ip.to_string().into_bytes(),
            KeyParts::Hashed(_) => return Ok(vec![entry.clone()]),
            KeyParts::Global => {
                return Err(EntryError::new(format!(
                    "the global key is none a {} header makes",
                    self.name
                )));
            }
        };
        if value.is_empty() || value.len() > MAX_LEN {
            return Err(EntryError::new(format!(
                "a {} header's value is 1 to {MAX_LEN} bytes",
                self.name
            )));
        }
        Ok(vec![Key::from(value)])
    }
}

/// `value` without the spaces and tabs (HTTP's optional whitespace) around it.
fn trim_ows(value: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !ows(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &value[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_trimmed_of_spaces_and_tabs() {
        let key = HeaderKey::try_new("x-api-key").unwrap();
        let of = |value: &'static str| {
            let request = http::Request::builder()
                .header("x-api-key", http::HeaderValue::from_static(value))
                .body(())
                .unwrap();
            key.extract(&RequestRef::new(&request))
        };
        for value in ["acme", " acme", "acme\t", " \t acme  "] {
            assert_eq!(of(value).unwrap(), Key::from("acme"), "{value:?}");
        }
        assert_eq!(of("a b").unwrap(), Key::from("a b"));
        for blank in ["", " ", "\t \t"] {
            assert!(of(blank).is_err(), "{blank:?}");
        }
    }
}
