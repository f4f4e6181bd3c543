//! `X-Forwarded-For`, `Forwarded` and a single-value header, read by `ClientIp` with a list of
//! trusted proxies: never a panic, never more hops examined than the cap, and the address is
//! the peer's whenever the peer is not trusted.
#![no_main]
use std::net::IpAddr;

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tower_ratelimit::key::{Basis, Cidr, ClientIp, ProxyHeader};

#[derive(Arbitrary, Debug)]
struct Input {
    peer: IpAddr,
    trusted: Vec<(IpAddr, u8)>,
    header: u8,
    max_hops: u8,
    values: Vec<Vec<u8>>,
}

fuzz_target!(|input: Input| {
    let networks: Vec<Cidr> = (input.trusted.iter().take(8))
        .filter_map(|&(ip, prefix)| Cidr::new(ip, prefix).ok())
        .collect();
    let (header, name) = match input.header % 3 {
        0 => (ProxyHeader::XForwardedFor, "x-forwarded-for"),
        1 => (ProxyHeader::Forwarded, "forwarded"),
        _ => (ProxyHeader::single("x-real-ip").unwrap(), "x-real-ip"),
    };
    let builder = networks
        .into_iter()
        .fold(ClientIp::builder(), |b, n| b.trusted_network(n));
    let built = builder
        .header(header)
        .max_hops(usize::from(input.max_hops))
        .build();
    let Ok(client_ip) = built else {
        return;
    };
    let mut headers = HeaderMap::new();
    for value in input.values.iter().take(16) {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(HeaderName::from_static(name), value);
        }
    }
    let found = client_ip.resolve_from(input.peer, &headers);
    assert!(
        found.hops_examined() <= usize::from(input.max_hops),
        "{found:?}"
    );
    if !client_ip.is_trusted(input.peer) {
        assert_eq!(found.basis(), Basis::UntrustedPeer, "{found:?}");
        assert_eq!(found.ip(), input.peer.to_canonical(), "{found:?}");
    }
});
