//! What an administrator's entry names (`KeyExtractor::entry_keys`): its text, an address in
//! any form, and how an error shows it.

use std::net::IpAddr;

use super::{EntryError, Key, KeyExtractor, KeyParts, ip_group};

/// An entry's text, without the spaces around it: `None` for a key that is no text (an
/// address, the global key, bytes that are not UTF-8).
pub(crate) fn entry_text(entry: &Key) -> Option<&str> {
    match entry.parts() {
        KeyParts::Bytes(bytes) => std::str::from_utf8(bytes).ok().map(str::trim),
        KeyParts::Ip(_) | KeyParts::Global | KeyParts::Hashed(_) => None,
    }
}

/// An address entry (an address key, or its text in any form, `[v6]` included), grouped as
/// keys of `ipv6_prefix` bits are.
pub(crate) fn ip_entry(entry: &Key, ipv6_prefix: u8) -> Result<Vec<Key>, EntryError> {
    let ip = match entry.parts() {
        KeyParts::Ip(ip) => Some(ip),
        KeyParts::Bytes(_) => entry_text(entry).and_then(|text| {
            let bare = text
                .strip_prefix('[')
                .and_then(|t| t.strip_suffix(']'))
                .unwrap_or(text);
            bare.parse::<IpAddr>().ok()
        }),
        KeyParts::Global | KeyParts::Hashed(_) => None,
    };
    match ip {
        Some(ip) => Ok(vec![Key::from(ip_group::group(ip, ipv6_prefix))]),
        None => Err(EntryError::new(format!(
            "{} is not an IP address, and keys here are client addresses (IPv6 by /{ipv6_prefix})",
            shown(entry)
        ))),
    }
}

/// An entry as an error shows it: its text quoted (its first 64 characters), an address, or
/// `global`.
pub(crate) fn shown(entry: &Key) -> String {
    match entry.parts() {
        KeyParts::Global => "global".into(),
        KeyParts::Ip(ip) => ip.to_string(),
        KeyParts::Bytes(_) => match entry_text(entry) {
            Some(text) => format!("{:?}", text.chars().take(64).collect::<String>()),
            None => "a key of bytes that are not text".into(),
        },
        KeyParts::Hashed(_) => "a key of more than 64 bytes".into(),
    }
}

/// The keys `extractor` makes of the requests `entry` names, as the layer keeps them
/// ([`Key::compact`]): what every administrator's entry is stored and matched as.
pub(crate) fn kept_entry_keys(
    extractor: &dyn KeyExtractor,
    entry: &Key,
) -> Result<Vec<Key>, EntryError> {
    let keys = extractor.entry_keys(entry)?;
    Ok(keys.into_iter().map(Key::compact).collect())
}
