use http::HeaderName;

use super::{Key, KeyExtractor, KeyRejection, RequestRef};
use crate::error::ConfigError;

/// The longest header value accepted as a key.
const MAX_LEN: usize = 4096;

/// The value of one request header, e.g. an API key in `x-api-key`.
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
        let bytes = value.as_bytes();
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
}
