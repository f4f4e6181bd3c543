use super::{Key, KeyExtractor, KeyRejection, RequestRef};

/// One bucket for every request: a limit on the whole service (or route).
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract(&self, _: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        Ok(Key::global())
    }
}
