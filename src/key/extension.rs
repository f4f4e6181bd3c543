use std::fmt;
use std::marker::PhantomData;

use super::{Key, KeyExtractor, KeyRejection, RequestRef};

/// Keys requests by a value of type `T` that an earlier layer put in the request extensions,
/// typically the authenticated user; see [`extension`] and [`extension_with`].
///
/// A request without a `T` is rejected with `500 Internal Server Error`: either the rate-limit
/// layer runs before the layer that inserts it (put it inside), or the route also serves
/// anonymous requests, which need a key of their own:
/// `key::extension::<UserId>().or(client_ip)` (see [`first_of`](super::first_of)).
pub struct ExtensionKey<T, F = fn(&T) -> Key> {
    map: F,
    _type: PhantomData<fn(&T)>,
}

/// Keys requests by the `T` in their extensions, converted with `Into<Key>`.
///
/// ```
/// use tower_ratelimit::key::{self, Key};
///
/// /// Put in the extensions by the authentication layer.
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// impl From<UserId> for Key {
///     fn from(user: UserId) -> Key {
///         Key::from(user.0)
///     }
/// }
///
/// let per_user = key::extension::<UserId>();
/// # let _ = per_user;
/// ```
pub fn extension<T>() -> ExtensionKey<T>
where
    T: Clone + Into<Key> + Send + Sync + 'static,
{
    fn into_key<T: Clone + Into<Key>>(value: &T) -> Key {
        value.clone().into()
    }
    ExtensionKey {
        map: into_key::<T>,
        _type: PhantomData,
    }
}

/// Keys requests by the `T` in their extensions, mapped to a key by `map`.
///
/// ```
/// use tower_ratelimit::key::{self, Key};
///
/// #[derive(Clone)]
/// struct User { id: u64, name: String }
///
/// let per_user = key::extension_with(|user: &User| Key::from(user.id));
/// # let _ = per_user;
/// ```
pub fn extension_with<T, F>(map: F) -> ExtensionKey<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> Key + Send + Sync + 'static,
{
    ExtensionKey {
        map,
        _type: PhantomData,
    }
}

impl<T, F: Clone> Clone for ExtensionKey<T, F> {
    fn clone(&self) -> Self {
        ExtensionKey {
            map: self.map.clone(),
            _type: PhantomData,
        }
    }
}

impl<T, F> fmt::Debug for ExtensionKey<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionKey<{}>", std::any::type_name::<T>())
    }
}

impl<T, F> KeyExtractor for ExtensionKey<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> Key + Send + Sync + 'static,
{
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        request
            .extensions()
            .get::<T>()
            .map(&self.map)
            .ok_or_else(|| {
                KeyRejection::misconfigured(
                    "no_extension",
                    format!(
                        "no {} in the request extensions: put the rate-limit layer inside the layer that inserts it",
                        std::any::type_name::<T>()
                    ),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    #[derive(Clone)]
    struct UserId(u64);

    impl From<UserId> for Key {
        fn from(user: UserId) -> Key {
            Key::from(user.0)
        }
    }

    #[test]
    fn reads_the_extension() {
        let mut req = Request::new(());
        let key = extension::<UserId>();
        let err = key.extract(&RequestRef::new(&req)).unwrap_err();
        assert_eq!((err.status().as_u16(), err.code()), (500, "no_extension"));
        assert!(err.message().contains("UserId"), "{err}");
        req.extensions_mut().insert(UserId(7));
        assert_eq!(
            key.extract(&RequestRef::new(&req)).unwrap(),
            Key::from(7u64)
        );
        let mapped = extension_with(|u: &UserId| Key::from(format!("user-{}", u.0)));
        assert_eq!(
            mapped.extract(&RequestRef::new(&req)).unwrap(),
            Key::from("user-7")
        );
        assert!(format!("{key:?}").contains("UserId"));
    }
}
