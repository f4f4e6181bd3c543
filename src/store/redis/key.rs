//! The Redis key layout, owned by the crate.
//!
//! `<prefix><policy>:{<body>}`, where the body identifies the caller's key:
//!
//! | caller key | body |
//! |---|---|
//! | global | `g` |
//! | IPv4 / IPv6 address | `4:192.0.2.1` / `6:2001:db8::1` |
//! | up to 64 bytes of `[A-Za-z0-9._@+=-]` | `b:` and the bytes |
//! | other bytes, up to 64 | `x:` and their hex |
//! | more than 64 bytes | `h:` and the hex SHA-256 of the bytes |
//!
//! The body sits inside the only braces of the key, so it alone is the Redis Cluster hash tag:
//! every policy of one caller key lands in one hash slot, and nothing a caller sends (braces, colons,
//! newlines, invalid UTF-8, 64 KiB) can steer the hash slot, collide with another caller, or escape
//! into another policy's keys. Prefix and policy names cannot contain braces (checked when the
//! store and the layer are built). A key is at most 64 + 64 + 132 bytes long.

use sha2::{Digest, Sha256};

use crate::error::ConfigError;
use crate::key::{Key, KeyParts};

const MAX_RAW: usize = 64;

fn safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._@+=-".contains(&b)
}

fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[(b >> 4) as usize]);
        out.push(HEX[(b & 15) as usize]);
    }
}

/// Appends the hash-tag body for `key`.
pub(crate) fn push_body(out: &mut Vec<u8>, key: &Key) {
    use std::io::Write;
    match key.parts() {
        KeyParts::Global => out.push(b'g'),
        KeyParts::Ip(std::net::IpAddr::V4(ip)) => {
            // The dotted quad, written without the formatting machinery (every request of a
            // per-IP policy comes here).
            out.extend_from_slice(b"4:");
            for (i, octet) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        KeyParts::Ip(std::net::IpAddr::V6(ip)) => {
            let _ = write!(out, "6:{ip}");
        }
        KeyParts::Bytes(b) if b.len() <= MAX_RAW && b.iter().all(|&c| safe(c)) => {
            out.extend_from_slice(b"b:");
            out.extend_from_slice(b);
        }
        KeyParts::Bytes(b) if b.len() <= MAX_RAW => {
            out.extend_from_slice(b"x:");
            push_hex(out, b);
        }
        KeyParts::Bytes(b) => {
            out.extend_from_slice(b"h:");
            push_hex(out, &Sha256::digest(b)[..16]);
        }
        // A long key as the layer keeps it: the same half digest a long key of bytes gets.
        KeyParts::Hashed(digest) => {
            out.extend_from_slice(b"h:");
            push_hex(out, digest);
        }
    }
}

/// The full Redis key of `key` under `policy`.
pub(crate) fn redis_key(prefix: &str, policy: &str, key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + policy.len() + 32);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(policy.as_bytes());
    out.extend_from_slice(b":{");
    push_body(&mut out, key);
    out.push(b'}');
    out
}

/// Checks a key prefix: at most 64 printable ASCII characters, no braces or spaces.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    if prefix.len() > 64
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
    {
        return Err(ConfigError::new(format!(
            "Redis key prefix {prefix:?} must be at most 64 printable ASCII characters without braces or spaces"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(key: &Key) -> String {
        String::from_utf8(redis_key("rl:", "p", key)).unwrap()
    }

    #[test]
    fn layout() {
        assert_eq!(k(&Key::global()), "rl:p:{g}");
        assert_eq!(
            k(&Key::from("192.0.2.1".parse::<std::net::IpAddr>().unwrap())),
            "rl:p:{4:192.0.2.1}"
        );
        assert_eq!(
            k(&Key::from(
                "2001:db8::1".parse::<std::net::IpAddr>().unwrap()
            )),
            "rl:p:{6:2001:db8::1}"
        );
        assert_eq!(k(&Key::from("alice")), "rl:p:{b:alice}");
        assert_eq!(k(&Key::from("{evil}")), "rl:p:{x:7b6576696c7d}");
        let long = k(&Key::from(vec![b'a'; 65_536]));
        assert!(long.starts_with("rl:p:{h:") && long.len() == "rl:p:{h:}".len() + 32);
        // Kept as its hash, the same key.
        assert_eq!(k(&Key::from(vec![b'a'; 65_536]).compact()), long);
    }

    #[test]
    fn ipv4_bodies_are_the_dotted_quad() {
        for octet in [0u8, 1, 9, 10, 99, 100, 101, 199, 200, 255] {
            for ip in [
                std::net::Ipv4Addr::new(octet, 0, 255, octet),
                std::net::Ipv4Addr::new(255, octet, 10, 7),
            ] {
                assert_eq!(
                    k(&Key::from(std::net::IpAddr::V4(ip))),
                    format!("rl:p:{{4:{ip}}}")
                );
            }
        }
    }

    #[test]
    fn prefixes() {
        assert!(validate_prefix("rl:").is_ok());
        assert!(validate_prefix("").is_ok());
        assert!(validate_prefix("a{b").is_err());
        assert!(validate_prefix("a b").is_err());
    }
}
