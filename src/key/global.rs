use super::{EntryError, Key, KeyExtractor, KeyRejection, RequestRef, entry_text};

/// One bucket for every request: a limit on the whole service (or route).
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract(&self, _: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        Ok(Key::global())
    }

    /// `global` (or the global key) is the one key; any other entry is kept as it is, for a
    /// layer asked about keys of its own in code ([`check`](crate::RateLimitLayer::check)).
    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        match entry_text(entry) {
            Some("global") => Ok(vec![Key::global()]),
            _ => Ok(vec![entry.clone()]),
        }
    }
}
