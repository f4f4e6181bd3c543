//! Turning a client address into the address its bucket is keyed on.
//!
//! Shared by [`PeerIp`](super::PeerIp) and [`ClientIp`](super::ClientIp): an IPv4-mapped IPv6
//! address (`::ffff:192.0.2.1`, recognised by its bits, however it was written) is the IPv4
//! address it carries, and any other IPv6 address is replaced by its network under a prefix
//! (`/64` by default), since one subscriber usually holds a whole `/64` (often a `/56` or `/48`)
//! and can rotate through it at will.

use std::net::{IpAddr, Ipv6Addr};

/// The default IPv6 grouping prefix: one bucket per `/64`.
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The mask of the first `prefix` bits of a 128-bit address (`prefix` at most 128).
pub(crate) const fn mask128(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix as u32)
    }
}

/// The mask of the first `prefix` bits of a 32-bit address (`prefix` at most 32).
pub(crate) const fn mask32(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    }
}

/// The address `ip`'s bucket is keyed on: IPv4 as is (mapped IPv6 included), IPv6 masked to
/// its first `ipv6_prefix` bits (at most 128).
pub(crate) fn group(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & mask128(ipv6_prefix.min(128));
            IpAddr::V6(Ipv6Addr::from(bits))
        }
    }
}

/// Checks an IPv6 grouping prefix.
pub(crate) const fn valid_prefix(ipv6_prefix: u8) -> bool {
    ipv6_prefix <= 128
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn masks() {
        assert_eq!(mask128(0), 0);
        assert_eq!(mask128(128), u128::MAX);
        assert_eq!(mask128(64), u128::MAX << 64);
        assert_eq!(mask32(0), 0);
        assert_eq!(mask32(32), u32::MAX);
        assert_eq!(mask32(8), 0xff00_0000);
    }

    #[test]
    fn grouping() {
        for (input, prefix, expected) in [
            ("192.0.2.1", 64, "192.0.2.1"),
            ("::ffff:192.0.2.1", 64, "192.0.2.1"),
            ("::ffff:c000:0201", 64, "192.0.2.1"),
            ("0:0:0:0:0:ffff:192.0.2.1", 0, "192.0.2.1"),
            ("2001:db8::1", 64, "2001:db8::"),
            ("2001:db8::ffff", 64, "2001:db8::"),
            ("2001:db8:0:1::1", 64, "2001:db8:0:1::"),
            ("2001:db8:0:1::1", 56, "2001:db8::"),
            ("2001:db8:0:ff::1", 56, "2001:db8::"),
            ("2001:db8:0:100::1", 56, "2001:db8:0:100::"),
            ("2001:db8::1", 128, "2001:db8::1"),
            ("2001:db8::1", 0, "::"),
            // Not mapped: an IPv4 suffix in an ordinary IPv6 address, and the compatible form.
            ("2001:db8::1.2.3.4", 128, "2001:db8::102:304"),
            ("2001:db8::1.2.3.4", 64, "2001:db8::"),
            ("::1.2.3.4", 128, "::102:304"),
            ("::1", 64, "::"),
        ] {
            assert_eq!(group(ip(input), prefix), ip(expected), "{input}/{prefix}");
        }
    }
}
