//! The unit tests of `key/mod.rs`: keys equal and hashed alike whatever their representation.

use std::hash::BuildHasher;

use super::*;

/// `hash_in` hashes the key's binary form (`tagged`) as one stream, whatever the key's
/// representation, and `hash_with` mixes the id into it: the tables' hash is the form's,
/// no two forms share one, and no two ids.
#[test]
fn hash_with_hashes_the_tagged_form_and_mixes_the_id() {
    let hasher = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
    let long = "k".repeat(INLINE + 1);
    let keys = [
        Key::global(),
        Key::from(IpAddr::from([10, 0, 0, 1])),
        Key::from(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1])),
        Key::from(""),
        Key::from("alice"),
        Key::from("k".repeat(INLINE).as_str()),
        Key::from(long.as_str()),
    ];
    let mut seen = std::collections::HashSet::new();
    for key in &keys {
        let mut octets = [0; 16];
        let (tag, bytes) = key.tagged(&mut octets);
        let mut form = vec![tag];
        form.extend_from_slice(bytes);
        let mut h = hasher.build_hasher();
        h.write(&form);
        assert_eq!(key.hash_in(&hasher), h.finish(), "{key:?}");
        let mixed = Key::with_id(h.finish(), 7);
        assert_eq!(key.hash_with(7, &hasher), mixed, "{key:?}");
        assert!(seen.insert(key.hash_with(7, &hasher)), "{key:?}");
        assert_ne!(key.hash_with(7, &hasher), key.hash_with(8, &hasher));
    }
}

/// Every way of making a byte key gives the same key, inline or not, on both sides of the
/// inline limit.
#[test]
fn byte_keys_are_equal_and_hash_alike_whatever_their_representation() {
    let hasher = std::collections::hash_map::RandomState::new();
    for len in [0, 1, 8, INLINE - 1, INLINE, INLINE + 1, 64, 200] {
        let text: String = (0..len)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let made = [
            Key::from(text.as_str()),
            Key::from(text.clone()),
            Key::from(text.as_bytes()),
            Key::from(text.as_bytes().to_vec()),
            Key::from(Bytes::from(text.clone())),
            Key::from_bytes(text.clone()),
        ];
        for key in &made {
            assert_eq!(*key, made[0], "length {len}");
            assert_eq!(
                hasher.hash_one(key),
                hasher.hash_one(&made[0]),
                "length {len}"
            );
            assert_eq!(key.bytes(), Some(text.as_bytes()));
            assert_eq!(matches!(key.0, Repr::Inline { .. }), len <= INLINE);
            let mut encoded = Vec::new();
            key.encode(&mut encoded);
            assert_eq!(encoded, [b"b", text.as_bytes()].concat());
        }
        let mut longer = text.clone();
        longer.push('z');
        assert_ne!(Key::from(longer), made[0]);
    }
    assert_ne!(Key::from(""), Key::global());
    assert_ne!(
        Key::from([127u8, 0, 0, 1].as_slice()),
        Key::from(IpAddr::from([127, 0, 0, 1]))
    );
    assert_eq!(std::mem::size_of::<Key>(), 40);
}
