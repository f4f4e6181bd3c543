use super::{ClientIp, EntryError, Key, KeyExtractor, KeyRejection, RequestRef};

/// The first key one of several extractors finds; see [`first_of`].
#[derive(Clone, Copy, Debug)]
pub struct FirstOf<T>(T);

/// One key made of the keys of several extractors; see [`all`].
#[derive(Clone, Copy, Debug)]
pub struct All<T>(T);

/// Tries each extractor in turn and keys on the first that finds a key: the user id, else the
/// API key, else the client IP. When all reject, the last rejection is the answer.
///
/// Takes a tuple of up to 8 extractors, or a `Vec` of one type (such as
/// `Box<dyn KeyExtractor>`). [`KeyExtractor::or`] is the same with two.
///
/// The key records which extractor made it, so two alternatives can never produce the same key:
/// a client cannot pick a header value equal to another user's id and drain that user's bucket.
///
/// ```
/// use tower_ratelimit::key::{self, ClientIp, HeaderKey, Key, KeyExtractor};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// let client_ip = ClientIp::new(["10.0.0.0/8"])?;
/// // Signed-in users by id, everyone else by address:
/// let key = key::extension_with(|u: &UserId| Key::from(u.0)).or(client_ip.clone());
/// // The same, with three alternatives:
/// let key3 = key::first_of((
///     key::extension_with(|u: &UserId| Key::from(u.0)),
///     key::ApiKey::bearer(),
///     client_ip,
/// ));
/// # let _ = (key, key3);
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
pub fn first_of<T>(extractors: T) -> FirstOf<T>
where
    FirstOf<T>: KeyExtractor,
{
    FirstOf(extractors)
}

/// Runs every extractor and combines their keys into one: per route and client, per tenant and
/// user. A request is rejected when any of them rejects it (the first rejection is the answer).
///
/// Takes a tuple of up to 8 extractors, or a `Vec` of one type. The combined key is the
/// length-prefixed concatenation of each key's [`Key::encode`]ing, so no two different lists
/// of keys combine into the same key.
///
/// ```
/// use axum::extract::MatchedPath;
/// use tower_ratelimit::key::{self, ClientIp};
///
/// let per_route_and_client =
///     key::all((key::matched_route(MatchedPath::as_str), ClientIp::new(["10.0.0.0/8"])?));
/// # let _ = per_route_and_client;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
pub fn all<T>(extractors: T) -> All<T>
where
    All<T>: KeyExtractor,
{
    All(extractors)
}

/// Appends `n` as an unsigned LEB128 varint (prefix-free, so concatenations stay unambiguous).
fn push_varint(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The key of alternative `index`: the index, then the key's encoding.
fn tagged(index: usize, key: &Key) -> Key {
    let mut out = Vec::with_capacity(24);
    push_varint(&mut out, index as u64);
    key.encode(&mut out);
    Key::from(out)
}

/// Appends one part of a combined key: its encoding's length, then the encoding.
fn push_part(out: &mut Vec<u8>, scratch: &mut Vec<u8>, key: &Key) {
    scratch.clear();
    key.encode(scratch);
    push_varint(out, scratch.len() as u64);
    out.extend_from_slice(scratch);
}

fn empty() -> KeyRejection {
    KeyRejection::misconfigured("no_extractors", "a composite key has no extractors")
}

fn first_of_dyn<'a>(
    extractors: impl Iterator<Item = &'a dyn KeyExtractor>,
    request: &RequestRef<'_>,
) -> Result<Key, KeyRejection> {
    let mut last = None;
    for (index, extractor) in extractors.enumerate() {
        match extractor.extract(request) {
            Ok(key) => return Ok(tagged(index, &key)),
            Err(rejection) => last = Some(rejection),
        }
    }
    Err(last.unwrap_or_else(empty))
}

fn all_dyn<'a>(
    extractors: impl Iterator<Item = &'a dyn KeyExtractor>,
    request: &RequestRef<'_>,
) -> Result<Key, KeyRejection> {
    let mut out = Vec::new();
    let mut scratch = Vec::new();
    let mut any = false;
    for extractor in extractors {
        push_part(&mut out, &mut scratch, &extractor.extract(request)?);
        any = true;
    }
    if any {
        Ok(Key::from(out))
    } else {
        Err(empty())
    }
}

/// The keys of the parts that make one of `entry`, each tagged with its part's place as a
/// request's key is; an error when none does.
fn first_of_entry<'a>(
    extractors: impl Iterator<Item = &'a dyn KeyExtractor>,
    entry: &Key,
) -> Result<Vec<Key>, EntryError> {
    let (mut keys, mut why) = (Vec::new(), Vec::new());
    for (index, extractor) in extractors.enumerate() {
        match extractor.entry_keys(entry) {
            Ok(made) => keys.extend(made.iter().map(|k| tagged(index, k))),
            Err(e) => why.push(e.to_string()),
        }
    }
    if keys.is_empty() {
        return Err(EntryError::new(format!(
            "no part of the key makes it: {}",
            why.join("; ")
        )));
    }
    Ok(keys)
}

/// A key of several parts takes no entry: it would have to name every part.
fn all_entry() -> Result<Vec<Key>, EntryError> {
    Err(EntryError::new(
        "a key made of several parts (key::all) takes no entry; give the policy or the lists a key of one part",
    ))
}

/// The first part's [`ClientIp`], if one has one.
fn client_ip_of<'a>(
    mut extractors: impl Iterator<Item = &'a dyn KeyExtractor>,
) -> Option<&'a ClientIp> {
    extractors.find_map(|k| k.client_ip())
}

impl<K: KeyExtractor> KeyExtractor for FirstOf<Vec<K>> {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        first_of_dyn(self.0.iter().map(|k| k as &dyn KeyExtractor), request)
    }

    fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        first_of_entry(self.0.iter().map(|k| k as &dyn KeyExtractor), entry)
    }

    fn client_ip(&self) -> Option<&ClientIp> {
        client_ip_of(self.0.iter().map(|k| k as &dyn KeyExtractor))
    }

    fn reads_body(&self) -> bool {
        self.0.iter().any(KeyExtractor::reads_body)
    }
}

impl<K: KeyExtractor> KeyExtractor for All<Vec<K>> {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        all_dyn(self.0.iter().map(|k| k as &dyn KeyExtractor), request)
    }

    fn entry_keys(&self, _: &Key) -> Result<Vec<Key>, EntryError> {
        all_entry()
    }

    fn client_ip(&self) -> Option<&ClientIp> {
        client_ip_of(self.0.iter().map(|k| k as &dyn KeyExtractor))
    }

    fn reads_body(&self) -> bool {
        self.0.iter().any(KeyExtractor::reads_body)
    }
}

macro_rules! tuples {
    ($( ($($name:ident $index:tt),+) )+) => {$(
        impl<$($name: KeyExtractor),+> KeyExtractor for FirstOf<($($name,)+)> {
            fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
                let list: &[&dyn KeyExtractor] = &[$(&self.0.$index),+];
                first_of_dyn(list.iter().copied(), request)
            }

            fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
                let list: &[&dyn KeyExtractor] = &[$(&self.0.$index),+];
                first_of_entry(list.iter().copied(), entry)
            }

            fn client_ip(&self) -> Option<&ClientIp> {
                let list: &[&dyn KeyExtractor] = &[$(&self.0.$index),+];
                client_ip_of(list.iter().copied())
            }

            fn reads_body(&self) -> bool {
                $(self.0.$index.reads_body())||+
            }
        }

        impl<$($name: KeyExtractor),+> KeyExtractor for All<($($name,)+)> {
            fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
                let list: &[&dyn KeyExtractor] = &[$(&self.0.$index),+];
                all_dyn(list.iter().copied(), request)
            }

            fn entry_keys(&self, _: &Key) -> Result<Vec<Key>, EntryError> {
                all_entry()
            }

            fn client_ip(&self) -> Option<&ClientIp> {
                let list: &[&dyn KeyExtractor] = &[$(&self.0.$index),+];
                client_ip_of(list.iter().copied())
            }

            fn reads_body(&self) -> bool {
                $(self.0.$index.reads_body())||+
            }
        }
    )+};
}

tuples! {
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
    (A 0, B 1, C 2, D 3, E 4)
    (A 0, B 1, C 2, D 3, E 4, F 5)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7)
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;
    use crate::key::{GlobalKey, HeaderKey, from_fn};

    fn req(headers: &[(&'static str, &'static str)]) -> Request<()> {
        let mut req = Request::new(());
        for (name, value) in headers {
            req.headers_mut().append(*name, value.parse().unwrap());
        }
        req
    }

    fn key(
        extractor: &impl KeyExtractor,
        headers: &[(&'static str, &'static str)],
    ) -> Result<Key, KeyRejection> {
        extractor.extract(&RequestRef::new(&req(headers)))
    }

    fn reject(code: &'static str) -> impl KeyExtractor {
        from_fn(move |_: &RequestRef<'_>| Err(KeyRejection::bad_request(code, code)))
    }

    #[test]
    fn varints() {
        for (n, bytes) in [
            (0u64, &[0u8][..]),
            (127, &[127]),
            (128, &[0x80, 1]),
            (300, &[0xac, 2]),
        ] {
            let mut out = Vec::new();
            push_varint(&mut out, n);
            assert_eq!(out, bytes, "{n}");
        }
    }

    #[test]
    fn first_of_takes_the_first_key_and_tags_it() {
        let user = HeaderKey::try_new("x-user").unwrap();
        let tenant = HeaderKey::try_new("x-tenant").unwrap();
        let either = first_of((user.clone(), tenant.clone()));
        let alice_user = key(&either, &[("x-user", "alice"), ("x-tenant", "acme")]).unwrap();
        assert_eq!(alice_user, Key::from(&b"\x00balice"[..]));
        let alice_tenant = key(&either, &[("x-tenant", "alice")]).unwrap();
        assert_eq!(alice_tenant, Key::from(&b"\x01balice"[..]));
        assert_ne!(alice_user, alice_tenant, "alternatives never collide");
        // All reject: the last rejection.
        let err = key(&first_of((reject("a"), reject("b"))), &[]).unwrap_err();
        assert_eq!(err.code(), "b");
        // `.or` is first_of with two.
        assert_eq!(
            key(&user.clone().or(tenant.clone()), &[("x-tenant", "alice")]).unwrap(),
            alice_tenant
        );
        // A Vec behaves like a tuple.
        let dynamic: Vec<Box<dyn KeyExtractor>> = vec![Box::new(user), Box::new(tenant)];
        assert_eq!(
            key(&first_of(dynamic), &[("x-tenant", "alice")]).unwrap(),
            alice_tenant
        );
        let none: Vec<GlobalKey> = Vec::new();
        assert_eq!(
            key(&first_of(none), &[]).unwrap_err().code(),
            "no_extractors"
        );
    }

    #[test]
    fn all_concatenates_length_prefixed_parts() {
        let a = HeaderKey::try_new("x-a").unwrap();
        let b = HeaderKey::try_new("x-b").unwrap();
        let both = all((a.clone(), b.clone()));
        assert_eq!(
            key(&both, &[("x-a", "ab"), ("x-b", "c")]).unwrap(),
            Key::from(&b"\x03bab\x02bc"[..])
        );
        // Moving bytes between parts changes the key.
        assert_ne!(
            key(&both, &[("x-a", "ab"), ("x-b", "c")]).unwrap(),
            key(&both, &[("x-a", "a"), ("x-b", "bc")]).unwrap()
        );
        assert_eq!(
            key(&all((GlobalKey, a.clone())), &[("x-a", "z")]).unwrap(),
            Key::from(&b"\x01g\x02bz"[..])
        );
        // Any rejection rejects; the first one is the answer.
        assert_eq!(
            key(&both, &[("x-b", "c")]).unwrap_err().code(),
            "missing_header"
        );
        assert_eq!(
            key(&all((reject("a"), reject("b"))), &[])
                .unwrap_err()
                .code(),
            "a"
        );
        assert_eq!(
            key(&all(vec![a, b]), &[("x-a", "ab"), ("x-b", "c")]).unwrap(),
            Key::from(&b"\x03bab\x02bc"[..])
        );
        assert_eq!(
            key(&all(Vec::<GlobalKey>::new()), &[]).unwrap_err().code(),
            "no_extractors"
        );
    }
}
