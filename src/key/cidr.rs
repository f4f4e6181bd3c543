use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use super::ip_group::{mask32, mask128};
use crate::error::ConfigError;

/// A network of IP addresses: an address and a prefix length, such as `10.0.0.0/8` or
/// `2001:db8::/32`; a single address is a `/32` (IPv4) or `/128` (IPv6) network.
///
/// Used to list the proxies [`ClientIp`](super::ClientIp) trusts. Parsing is strict: the prefix
/// must fit the address family and the address must have no bits set past the prefix
/// (`10.0.0.1/8` is refused, since it is most likely a typo for `10.0.0.1/32` or `10.0.0.0/8`).
/// An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) is the IPv4 network it maps.
///
/// Matching is by value, never by spelling: `10.0.0.0/8` contains `::ffff:10.1.2.3`.
///
/// ```
/// use tower_ratelimit::key::Cidr;
///
/// let net: Cidr = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse()?));
/// assert!(net.contains("::ffff:10.1.2.3".parse()?));
/// assert!(!net.contains("11.0.0.1".parse()?));
/// assert!("10.0.0.1/8".parse::<Cidr>().is_err());
/// assert_eq!("2001:db8::1".parse::<Cidr>()?.to_string(), "2001:db8::1/128");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The network of `prefix` bits at `addr`; fails when the prefix is longer than the address
    /// or `addr` has bits set past it.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, ConfigError> {
        let (addr, prefix) = match addr {
            // An IPv4-mapped network is the IPv4 network it maps.
            IpAddr::V6(v6) if (96..=128).contains(&prefix) && v6.to_ipv4_mapped().is_some() => {
                (addr.to_canonical(), prefix - 96)
            }
            _ => (addr, prefix),
        };
        let (max, host_bits_clear) = match addr {
            IpAddr::V4(v4) => (32, prefix > 32 || u32::from(v4) & !mask32(prefix) == 0),
            IpAddr::V6(v6) => (128, prefix > 128 || u128::from(v6) & !mask128(prefix) == 0),
        };
        if prefix > max {
            return Err(ConfigError::new(format!(
                "{addr}/{prefix}: the prefix length of an {} network is at most {max}",
                if max == 32 { "IPv4" } else { "IPv6" }
            )));
        }
        if !host_bits_clear {
            let network = Self::network(addr, prefix);
            return Err(ConfigError::new(format!(
                "{addr}/{prefix} has address bits set past its /{prefix} prefix; write {network}/{prefix} for the network, or {addr} for the single address"
            )));
        }
        Ok(Cidr { addr, prefix })
    }

    /// The single-address network of `addr` (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Self {
        let addr = addr.to_canonical();
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        Cidr { addr, prefix }
    }

    fn network(addr: IpAddr, prefix: u8) -> IpAddr {
        match addr {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(prefix))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(prefix))),
        }
    }

    /// The network's first address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in the network. IPv4-mapped IPv6 addresses are compared as the IPv4
    /// address they carry.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                (u32::from(net) ^ u32::from(ip)) & mask32(self.prefix) == 0
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                (u128::from(net) ^ u128::from(ip)) & mask128(self.prefix) == 0
            }
            // An IPv6 network shorter than /96 (`::/0`, `::/64`) may cover the mapped space.
            (IpAddr::V6(net), IpAddr::V4(ip)) => {
                (u128::from(net) ^ u128::from(ip.to_ipv6_mapped())) & mask128(self.prefix) == 0
            }
            (IpAddr::V4(_), IpAddr::V6(_)) => false,
        }
    }
}

impl From<IpAddr> for Cidr {
    fn from(addr: IpAddr) -> Self {
        Cidr::host(addr)
    }
}

impl FromStr for Cidr {
    type Err = ConfigError;

    /// Parses `10.0.0.0/8`, `2001:db8::/32`, or a single address such as `192.0.2.1`.
    /// Surrounding whitespace is ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let bad = || {
            ConfigError::new(format!(
                "{s:?} is not a network such as 10.0.0.0/8 or 2001:db8::/32, nor an address such as 192.0.2.1"
            ))
        };
        let (addr, prefix) = match text.split_once('/') {
            None => (text, None),
            Some((addr, prefix)) => (addr, Some(prefix)),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        match prefix {
            None => Ok(Cidr::host(addr)),
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                let prefix: u8 = p.parse().map_err(|_| bad())?;
                Cidr::new(addr, prefix)
            }
            Some(_) => Err(bad()),
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_networks_and_addresses() {
        for (input, shown) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            (" 192.168.0.0/16 ", "192.168.0.0/16"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("192.0.2.1", "192.0.2.1/32"),
            ("192.0.2.1/32", "192.0.2.1/32"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("2001:db8::1", "2001:db8::1/128"),
            ("::/0", "::/0"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("::ffff:192.0.2.1", "192.0.2.1/32"),
            ("::ffff:0:0/96", "0.0.0.0/0"),
        ] {
            let cidr: Cidr = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(cidr.to_string(), shown, "{input}");
        }
    }

    #[test]
    fn refuses_bad_strings_without_panicking() {
        for input in [
            "",
            "/",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/255",
            "10.0.0.0/256",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/8/8",
            "10.0.0.0/ 8",
            "10.0.0.1/8",
            "2001:db8::1/32",
            "2001:db8::/129",
            "10.0.0",
            "010.0.0.0/8",
            "example.com",
            "[2001:db8::]/32",
            "fe80::1%eth0",
            "10.0.0.0/0008",
            "１０.0.0.0/8",
        ] {
            assert!(input.parse::<Cidr>().is_err(), "{input:?} parsed");
        }
        let err = "10.0.0.1/8".parse::<Cidr>().unwrap_err().to_string();
        assert!(err.contains("10.0.0.0/8"), "{err}");
    }

    #[test]
    fn contains_by_value() {
        let v4: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(v4.contains(ip("10.255.255.255")));
        assert!(v4.contains(ip("::ffff:10.0.0.1")));
        assert!(!v4.contains(ip("11.0.0.0")));
        assert!(!v4.contains(ip("::a00:1")), "IPv4-compatible is not mapped");
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        let all6: Cidr = "::/0".parse().unwrap();
        assert!(
            all6.contains(ip("10.0.0.1")),
            "::/0 covers the mapped space"
        );
        let host: Cidr = "192.0.2.1".parse().unwrap();
        assert!(host.contains(ip("192.0.2.1")));
        assert!(!host.contains(ip("192.0.2.2")));
        let zero: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(zero.contains(ip("203.0.113.9")));
        assert!(!zero.contains(ip("2001:db8::1")));
    }
}
