use std::fmt;

use super::{Key, KeyExtractor, KeyRejection, RequestRef};

/// A key extractor from a closure; see [`from_fn`].
#[derive(Clone, Copy)]
pub struct FromFn<F>(F);

/// Makes a key extractor from a closure over the request head.
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&RequestRef<'_>) -> Result<Key, KeyRejection> + Send + Sync + 'static,
{
    FromFn(f)
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FromFn")
    }
}

impl<F> KeyExtractor for FromFn<F>
where
    F: Fn(&RequestRef<'_>) -> Result<Key, KeyRejection> + Send + Sync + 'static,
{
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        (self.0)(request)
    }
}
