//! Parsing of forwarding headers: `X-Forwarded-For`, RFC 7239 `Forwarded`, and single-value
//! headers such as `X-Real-IP`.
//!
//! Everything here reads borrowed bytes from the right, one list element at a time, and never
//! allocates. An element longer than its cap is reported as [`Hop::Malformed`] after at most
//! `cap + 1` bytes have been looked at, so the cost of a walk is bounded by the number of
//! elements examined times the cap, whatever the length of the header. Nothing here panics on
//! any input bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest `X-Forwarded-For` element (one address, possibly bracketed with a port) read.
pub(crate) const MAX_XFF_ELEMENT: usize = 128;
/// The longest `Forwarded` element (`for=...;by=...;host=...;proto=...`) read.
pub(crate) const MAX_FORWARDED_ELEMENT: usize = 1024;
/// The longest single-value header (`X-Real-IP` and the like) read.
pub(crate) const MAX_SINGLE_VALUE: usize = 128;

/// What one element of a forwarding header says about a hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// An address (its port, if any, dropped).
    Addr(IpAddr),
    /// `unknown`, an obfuscated identifier such as `_hidden`, or a `Forwarded` element
    /// without a `for=` parameter: there was a hop, but it is not identified.
    Unidentified,
    /// An empty list element, which HTTP says to ignore.
    Empty,
    /// Anything else: not an address, a repeated `for=`, a broken quoted string, too long.
    Malformed,
}

/// The elements of a comma-separated header value, from the right.
///
/// With `quoted`, commas inside quoted strings (`"..."`, with `\` escapes) do not split; that
/// is the `Forwarded` syntax. Each element is at most `max_len` bytes; a longer one ends the
/// iteration with `Err(TooLong)`.
#[derive(Debug)]
pub(crate) struct RevElements<'a> {
    rest: &'a [u8],
    finished: bool,
    quoted: bool,
    max_len: usize,
    scanned: usize,
}

/// An element longer than the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TooLong;

impl<'a> RevElements<'a> {
    pub(crate) fn new(list: &'a [u8], quoted: bool, max_len: usize) -> Self {
        RevElements {
            rest: list,
            finished: false,
            quoted,
            max_len,
            scanned: 0,
        }
    }

    /// How many bytes have been looked at so far.
    pub(crate) fn scanned(&self) -> usize {
        self.scanned
    }
}

impl<'a> Iterator for RevElements<'a> {
    type Item = Result<&'a [u8], TooLong>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        let bytes = self.rest;
        let mut in_quotes = false;
        let mut i = bytes.len();
        let mut len = 0usize;
        while i > 0 {
            let b = bytes[i - 1];
            self.scanned += 1;
            if b == b',' && !in_quotes {
                self.rest = &bytes[..i - 1];
                return Some(Ok(&bytes[i..]));
            }
            len += 1;
            if len > self.max_len {
                self.finished = true;
                return Some(Err(TooLong));
            }
            if self.quoted && b == b'"' {
                if in_quotes {
                    // The closing quote (seen first from the right) pairs with an opening quote
                    // unless it is escaped: preceded by an odd number of backslashes.
                    let mut backslashes = 0usize;
                    while backslashes < i - 1
                        && backslashes <= self.max_len
                        && bytes[i - 2 - backslashes] == b'\\'
                    {
                        backslashes += 1;
                    }
                    self.scanned += backslashes;
                    if backslashes.is_multiple_of(2) {
                        in_quotes = false;
                    }
                } else {
                    in_quotes = true;
                }
            }
            i -= 1;
        }
        self.finished = true;
        Some(Ok(bytes))
    }
}

/// An obfuscated identifier or port after its leading `_`: `1*( ALPHA / DIGIT / "." / "_" / "-" )`.
fn obfuscated(rest: &[u8]) -> bool {
    !rest.is_empty()
        && rest
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// A port: 1 to 5 digits no larger than 65535, or an obfuscated port (`_abc`).
fn port(bytes: &[u8]) -> bool {
    match bytes {
        [b'_', rest @ ..] => obfuscated(rest),
        _ => {
            !bytes.is_empty()
                && bytes.len() <= 5
                && bytes.iter().all(u8::is_ascii_digit)
                && std::str::from_utf8(bytes).is_ok_and(|s| s.parse::<u16>().is_ok())
        }
    }
}

fn parse_ip<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A node, as RFC 7239 writes it and as `X-Forwarded-For` writers do in practice:
/// `192.0.2.1`, `192.0.2.1:4711`, `[2001:db8::1]`, `[2001:db8::1]:4711`, a bare `2001:db8::1`,
/// `unknown`, or an obfuscated `_identifier` (optionally with a port).
pub(crate) fn parse_node(node: &[u8]) -> Hop {
    if node.eq_ignore_ascii_case(b"unknown") {
        return Hop::Unidentified;
    }
    if let [b'_', rest @ ..] = node {
        // `_hidden` or `_hidden:_port`.
        let (id, port_part) = match rest.iter().position(|&b| b == b':') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        return match (obfuscated(id), port_part) {
            (true, None) => Hop::Unidentified,
            (true, Some(p)) if port(p) => Hop::Unidentified,
            _ => Hop::Malformed,
        };
    }
    if let [b'[', rest @ ..] = node {
        let Some(close) = rest.iter().position(|&b| b == b']') else {
            return Hop::Malformed;
        };
        let after = &rest[close + 1..];
        let port_ok = match after {
            [] => true,
            [b':', p @ ..] => port(p),
            _ => false,
        };
        return match parse_ip::<Ipv6Addr>(&rest[..close]) {
            Some(ip) if port_ok => Hop::Addr(IpAddr::V6(ip)),
            _ => Hop::Malformed,
        };
    }
    let colons = node.iter().filter(|&&b| b == b':').count();
    if colons == 1 {
        // IPv4 with a port.
        let i = node.iter().position(|&b| b == b':').unwrap_or(node.len());
        return match parse_ip::<Ipv4Addr>(&node[..i]) {
            Some(ip) if port(&node[i + 1..]) => Hop::Addr(IpAddr::V4(ip)),
            _ => Hop::Malformed,
        };
    }
    // IPv4, or a bare IPv6 address (not valid in `Forwarded`, but common in `X-Forwarded-For`).
    parse_ip::<IpAddr>(node).map_or(Hop::Malformed, Hop::Addr)
}

/// One `X-Forwarded-For` element.
pub(crate) fn parse_xff_element(element: &[u8]) -> Hop {
    let node = element.trim_ascii();
    if node.is_empty() {
        Hop::Empty
    } else {
        parse_node(node)
    }
}

/// The pairs of one `Forwarded` element, split on `;` outside quoted strings, left to right.
fn pairs(element: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(element);
    std::iter::from_fn(move || {
        let bytes = rest?;
        let mut in_quotes = false;
        let mut escaped = false;
        for (i, &b) in bytes.iter().enumerate() {
            if escaped {
                escaped = false;
            } else if in_quotes && b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_quotes = !in_quotes;
            } else if b == b';' && !in_quotes {
                rest = Some(&bytes[i + 1..]);
                return Some(&bytes[..i]);
            }
        }
        rest = None;
        Some(bytes)
    })
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// One `Forwarded` element, such as `for=192.0.2.60;proto=http;by=203.0.113.43`: the hop its
/// `for=` parameter names.
pub(crate) fn parse_forwarded_element(element: &[u8]) -> Hop {
    let element = element.trim_ascii();
    if element.is_empty() {
        return Hop::Empty;
    }
    let mut node = None;
    for pair in pairs(element) {
        let pair = pair.trim_ascii();
        if pair.is_empty() {
            continue;
        }
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            return Hop::Malformed;
        };
        let (name, value) = (&pair[..eq], &pair[eq + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Hop::Malformed;
        }
        let value = match value {
            [b'"', inner @ .., b'"'] => {
                // Addresses never need escapes; a quoted value with one is left unread, and is
                // an error only if it is the `for=` value.
                if inner.iter().any(|&b| b == b'"' || b == b'\\') {
                    if name.eq_ignore_ascii_case(b"for") {
                        return Hop::Malformed;
                    }
                    continue;
                }
                inner
            }
            _ if value.is_empty()
                || !value
                    .iter()
                    .all(|&b| is_tchar(b) || b == b':' || b == b'[' || b == b']') =>
            {
                if name.eq_ignore_ascii_case(b"for") {
                    return Hop::Malformed;
                }
                continue;
            }
            _ => value,
        };
        if name.eq_ignore_ascii_case(b"for") {
            if node.is_some() {
                // RFC 7239: a parameter must not occur more than once per element.
                return Hop::Malformed;
            }
            node = Some(value);
        }
    }
    match node {
        Some(node) => parse_node(node),
        None => Hop::Unidentified,
    }
}

/// A single-value header such as `X-Real-IP: 203.0.113.7`.
pub(crate) fn parse_single_value(value: &[u8]) -> Hop {
    // Checked before trimming, so that a huge value is not scanned.
    if value.len() > MAX_SINGLE_VALUE {
        return Hop::Malformed;
    }
    let value = value.trim_ascii();
    if value.is_empty() {
        return Hop::Malformed;
    }
    match parse_node(value) {
        Hop::Empty => Hop::Malformed,
        hop => hop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Hop {
        Hop::Addr(s.parse().unwrap())
    }

    fn rev(list: &str, quoted: bool, max: usize) -> Vec<Result<&str, TooLong>> {
        RevElements::new(list.as_bytes(), quoted, max)
            .map(|r| r.map(|b| std::str::from_utf8(b).unwrap()))
            .collect()
    }

    #[test]
    fn splits_from_the_right() {
        assert_eq!(rev("a, b,c", false, 10), [Ok("c"), Ok(" b"), Ok("a")]);
        assert_eq!(rev("", false, 10), [Ok("")]);
        assert_eq!(rev(",", false, 10), [Ok(""), Ok("")]);
        assert_eq!(rev("a,,b", false, 10), [Ok("b"), Ok(""), Ok("a")]);
        // Quotes protect commas in Forwarded, not in X-Forwarded-For.
        assert_eq!(rev(r#"a="x,y",b"#, true, 10), [Ok("b"), Ok(r#"a="x,y""#)]);
        assert_eq!(
            rev(r#"a="x,y",b"#, false, 10),
            [Ok("b"), Ok(r#"y""#), Ok(r#"a="x"#)]
        );
        // An escaped quote does not close the string.
        assert_eq!(
            rev(r#"a="x\",y",b"#, true, 20),
            [Ok("b"), Ok(r#"a="x\",y""#)]
        );
        assert_eq!(rev(r#"a="x\\",y"#, true, 20), [Ok("y"), Ok(r#"a="x\\""#)]);
        assert_eq!(
            rev(r#"c,a="x\",y""#, true, 20),
            [Ok(r#"a="x\",y""#), Ok("c")]
        );
        // An unbalanced quote on the left swallows only what is left of it.
        assert_eq!(
            rev(r#"for="x, for=1.2.3.4"#, true, 20),
            [Ok(" for=1.2.3.4"), Ok(r#"for="x"#)]
        );
    }

    #[test]
    fn long_elements_stop_the_walk_after_a_bounded_scan() {
        let long = format!("{}, 1.2.3.4", "9".repeat(100_000));
        let mut it = RevElements::new(long.as_bytes(), false, 16);
        assert_eq!(it.next(), Some(Ok(&b" 1.2.3.4"[..])));
        assert_eq!(it.next(), Some(Err(TooLong)));
        assert_eq!(it.next(), None);
        assert!(it.scanned() <= 9 + 17, "scanned {}", it.scanned());
        // Backslashes before a quote are counted once, within the cap.
        let slashes = format!("\"{}\"", "\\".repeat(100_000));
        let mut it = RevElements::new(slashes.as_bytes(), true, 16);
        assert_eq!(it.next(), Some(Err(TooLong)));
        assert!(it.scanned() <= 64, "scanned {}", it.scanned());
    }

    #[test]
    fn nodes() {
        for (node, hop) in [
            ("192.0.2.1", ip("192.0.2.1")),
            ("192.0.2.1:4711", ip("192.0.2.1")),
            ("192.0.2.1:_port", ip("192.0.2.1")),
            ("[2001:db8::1]", ip("2001:db8::1")),
            ("[2001:db8::1]:4711", ip("2001:db8::1")),
            ("2001:db8::1", ip("2001:db8::1")),
            ("::ffff:192.0.2.1", ip("::ffff:192.0.2.1")),
            ("unknown", Hop::Unidentified),
            ("UNKNOWN", Hop::Unidentified),
            ("_hidden", Hop::Unidentified),
            ("_SEVKISEK", Hop::Unidentified),
            ("_hidden:_port", Hop::Unidentified),
            ("_hidden:80", Hop::Unidentified),
            ("_", Hop::Malformed),
            ("_a b", Hop::Malformed),
            ("192.0.2.1:", Hop::Malformed),
            ("192.0.2.1:65536", Hop::Malformed),
            ("192.0.2.1:123456", Hop::Malformed),
            ("192.0.2.1:+80", Hop::Malformed),
            ("[2001:db8::1", Hop::Malformed),
            ("[2001:db8::1]x", Hop::Malformed),
            ("[2001:db8::1]:", Hop::Malformed),
            ("[192.0.2.1]", Hop::Malformed),
            ("2001:db8::1:4711x", Hop::Malformed),
            ("010.0.0.1", Hop::Malformed),
            ("fe80::1%eth0", Hop::Malformed),
            ("example.com", Hop::Malformed),
            ("1.2.3.4 5.6.7.8", Hop::Malformed),
            ("", Hop::Malformed),
        ] {
            assert_eq!(parse_node(node.as_bytes()), hop, "{node:?}");
        }
    }

    #[test]
    fn forwarded_elements() {
        for (element, hop) in [
            ("for=192.0.2.60", ip("192.0.2.60")),
            (" for=192.0.2.60 ", ip("192.0.2.60")),
            ("For=192.0.2.60", ip("192.0.2.60")),
            ("FOR=\"192.0.2.60:8080\"", ip("192.0.2.60")),
            (
                "for=192.0.2.60;proto=http;by=203.0.113.43",
                ip("192.0.2.60"),
            ),
            (
                "proto=http; for=192.0.2.60 ;by=203.0.113.43",
                ip("192.0.2.60"),
            ),
            ("for=\"[2001:db8:cafe::17]:4711\"", ip("2001:db8:cafe::17")),
            ("for=\"[2001:db8:cafe::17]\"", ip("2001:db8:cafe::17")),
            ("for=unknown", Hop::Unidentified),
            ("for=\"unknown\"", Hop::Unidentified),
            ("for=_hidden", Hop::Unidentified),
            ("for=\"_gazonk\"", Hop::Unidentified),
            ("by=203.0.113.43;proto=https", Hop::Unidentified),
            ("host=\"a;b,c\";for=192.0.2.1", ip("192.0.2.1")),
            ("host=\"a\\\"b\";for=192.0.2.1", ip("192.0.2.1")),
            ("for=192.0.2.1;", ip("192.0.2.1")),
            ("", Hop::Empty),
            ("   ", Hop::Empty),
            ("for=192.0.2.1;for=192.0.2.2", Hop::Malformed),
            ("for=\"192.0.2.1", Hop::Malformed),
            ("for=192.0.2.1\"", Hop::Malformed),
            ("for=\"192.0.2.1\\\"\"", Hop::Malformed),
            ("for=", Hop::Malformed),
            ("for", Hop::Malformed),
            ("=192.0.2.1", Hop::Malformed),
            ("for =192.0.2.1", Hop::Malformed),
            ("for=example.com", Hop::Malformed),
            ("for=192.0.2.1 by=x", Hop::Malformed),
        ] {
            assert_eq!(
                parse_forwarded_element(element.as_bytes()),
                hop,
                "{element:?}"
            );
        }
    }

    #[test]
    fn single_values() {
        assert_eq!(parse_single_value(b" 203.0.113.7 "), ip("203.0.113.7"));
        assert_eq!(parse_single_value(b"[2001:db8::7]:443"), ip("2001:db8::7"));
        assert_eq!(parse_single_value(b"203.0.113.7, 10.0.0.1"), Hop::Malformed);
        assert_eq!(parse_single_value(b""), Hop::Malformed);
        assert_eq!(parse_single_value(b"unknown"), Hop::Unidentified);
        assert_eq!(
            parse_single_value("1".repeat(200).as_bytes()),
            Hop::Malformed
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 1024,
            failure_persistence: None,
            ..Default::default()
        });
        runner
            .run(
                &(
                    proptest::collection::vec(any::<u8>(), 0..300),
                    0usize..40,
                    any::<bool>(),
                ),
                |(bytes, max, quoted)| {
                    let _ = parse_node(&bytes);
                    let _ = parse_xff_element(&bytes);
                    let _ = parse_forwarded_element(&bytes);
                    let _ = parse_single_value(&bytes);
                    let mut it = RevElements::new(&bytes, quoted, max);
                    let mut total = 0;
                    for element in it.by_ref().flatten() {
                        prop_assert!(element.len() <= max);
                        total += element.len() + 1;
                    }
                    prop_assert!(it.scanned() <= bytes.len() + bytes.len() * (max + 1));
                    prop_assert!(total <= bytes.len() + 1);
                    Ok(())
                },
            )
            .unwrap();
    }
}
