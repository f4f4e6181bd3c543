//! Every key extractor: `PeerIp` (from a `SocketAddr` extension or axum's `ConnectInfo`),
//! client identity that cannot be spoofed with `ClientIp` behind trusted proxies
//! (X-Forwarded-For, Forwarded, single-value headers), IPv6 grouping, bounded parsing, one-time
//! misconfiguration warnings, `HeaderKey` and its rejections, the other keys (API key,
//! extension, matched route, composites), and end to end through axum and the demo server.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::MatchedPath;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use proptest::prelude::*;
use support::demo::{DemoServer, server_binary};
use support::http::{PROBLEM_JSON, Seen, get_path, inner, send, with_header, with_peer};
use tower::{ServiceBuilder, ServiceExt};
use tower_ratelimit::headers::X_RATELIMIT_REMAINING;
use tower_ratelimit::key::{
    self, ApiKey, Basis, ClientIp, HeaderKey, Key, KeyExtractor, PeerIp, ProxyHeader, RequestRef,
    Resolution,
};
use tower_ratelimit::{
    Decision, ManualClock, MemoryStore, Policy, RateLimitLayer, RateLimitLayerBuilder,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const TRUSTED: [&str; 3] = ["10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.1"];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|_| panic!("{s} is an address"))
}

fn headers(list: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in list {
        map.append(
            HeaderName::try_from(*name).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn client_ip(header: ProxyHeader) -> ClientIp {
    ClientIp::builder()
        .trusted_proxies(TRUSTED)
        .header(header)
        .build()
        .unwrap()
}

/// The key `extractor` gives a request from `peer` with `list` as its headers, through the
/// `KeyExtractor` interface (the peer as a plain `SocketAddr` extension).
fn key_of(extractor: &impl KeyExtractor, peer: &str, list: &[(&str, &str)]) -> Key {
    let mut req = Request::new(());
    *req.headers_mut() = headers(list);
    req.extensions_mut()
        .insert(SocketAddr::new(ip(peer), 40000));
    extractor.extract(&RequestRef::new(&req)).unwrap()
}

/// A table row: what the case is, the peer, the headers, the address expected and why.
type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str, Basis);

fn check(ci: &ClientIp, case: &str, peer: &str, list: &[(&str, &str)], want: &str, basis: Basis) {
    let got = ci.resolve_from(ip(peer), &headers(list));
    assert_eq!(
        (got.ip(), got.basis()),
        (ip(want), basis),
        "{case}: {list:?} from {peer}"
    );
    // The extractor keys on the same address (IPv4 here, or IPv6 /128 in these tables after
    // grouping is checked separately).
    if got.ip().is_ipv4() {
        assert_eq!(key_of(ci, peer, list), Key::from(ip(want)), "{case}: key");
    }
}

// ---------------------------------------------------------------------------------------------
// X-Forwarded-For
// ---------------------------------------------------------------------------------------------

#[test]
fn x_forwarded_for_table() {
    let ci = client_ip(ProxyHeader::XForwardedFor);
    use Basis::*;
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("untrusted peer, spoofed XFF ignored", "203.0.113.9", &[("x-forwarded-for", "198.51.100.7")], "203.0.113.9", UntrustedPeer),
        ("untrusted peer, spoofed trusted XFF ignored", "203.0.113.9", &[("x-forwarded-for", "10.0.0.5")], "203.0.113.9", UntrustedPeer),
        ("untrusted peer, no header", "203.0.113.9", &[], "203.0.113.9", UntrustedPeer),
        ("one trusted hop", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7")], "198.51.100.7", Header),
        ("two trusted hops", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7, 10.0.0.2")], "198.51.100.7", Header),
        ("three trusted hops, single-address network", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7, 192.0.2.1, 10.0.0.2")], "198.51.100.7", Header),
        ("spoofed leftmost entries", "10.0.0.1", &[("x-forwarded-for", "6.6.6.6, 7.7.7.7, 198.51.100.7, 10.0.0.2")], "198.51.100.7", Header),
        ("spoofed leftmost trusted-looking entry", "10.0.0.1", &[("x-forwarded-for", "10.9.9.9, 198.51.100.7, 10.0.0.2")], "198.51.100.7", Header),
        ("spoofed leftmost garbage", "10.0.0.1", &[("x-forwarded-for", "\"not an address, unknown, _x, 198.51.100.7")], "198.51.100.7", Header),
        ("several lines", "10.0.0.1", &[("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "198.51.100.7"), ("x-forwarded-for", "10.0.0.2")], "198.51.100.7", Header),
        ("several lines, several elements", "10.0.0.1", &[("x-forwarded-for", "6.6.6.6, 198.51.100.7"), ("x-forwarded-for", "10.0.0.3, 10.0.0.2")], "198.51.100.7", Header),
        ("ports", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7:4711, 10.0.0.2:80")], "198.51.100.7", Header),
        ("bracketed IPv6 with port", "10.0.0.1", &[("x-forwarded-for", "[2001:db8:1::7]:4711")], "2001:db8:1::7", Header),
        ("bare IPv6", "10.0.0.1", &[("x-forwarded-for", "2001:db8:1::7, 2001:db8:ffff::2")], "2001:db8:1::7", Header),
        ("empty elements ignored", "10.0.0.1", &[("x-forwarded-for", "6.6.6.6, 198.51.100.7,, 10.0.0.2 , ")], "198.51.100.7", Header),
        ("mapped client", "10.0.0.1", &[("x-forwarded-for", "::ffff:198.51.100.7")], "198.51.100.7", Header),
        ("mapped trusted hop", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7, ::ffff:10.0.0.2")], "198.51.100.7", Header),
        ("mapped trusted peer", "::ffff:10.0.0.1", &[("x-forwarded-for", "198.51.100.7")], "198.51.100.7", Header),
        ("mapped untrusted peer", "::ffff:203.0.113.9", &[("x-forwarded-for", "198.51.100.7")], "203.0.113.9", UntrustedPeer),
        ("IPv6 trusted peer", "2001:db8:ffff::1", &[("x-forwarded-for", "198.51.100.7, 2001:db8:ffff::2")], "198.51.100.7", Header),
        ("compatible is not mapped: untrusted", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7, ::10.0.0.2")], "::a00:2", Header),
        ("every hop trusted: the leftmost", "10.0.0.1", &[("x-forwarded-for", "10.0.0.3, 10.0.0.2")], "10.0.0.3", AllTrusted),
        ("trusted peer, no header", "10.0.0.1", &[], "10.0.0.1", NoHeader),
        ("trusted peer, empty header", "10.0.0.1", &[("x-forwarded-for", "")], "10.0.0.1", NoHeader),
        ("trusted peer, only empty elements", "10.0.0.1", &[("x-forwarded-for", " , ,")], "10.0.0.1", NoHeader),
        ("malformed rightmost: the peer", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7, not-an-ip")], "10.0.0.1", Malformed),
        ("malformed after a trusted hop: that hop", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7, garbage, 10.0.0.2")], "10.0.0.2", Malformed),
        ("malformed: leading zeros", "10.0.0.1", &[("x-forwarded-for", "198.051.100.7")], "10.0.0.1", Malformed),
        ("malformed: quoted", "10.0.0.1", &[("x-forwarded-for", "\"198.51.100.7\"")], "10.0.0.1", Malformed),
        ("unknown: the last trusted hop", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7, unknown, 10.0.0.2")], "10.0.0.2", Unidentified),
        ("obfuscated: the last trusted hop", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7, _hidden")], "10.0.0.1", Unidentified),
        ("Forwarded ignored when XFF is read", "10.0.0.1", &[("x-forwarded-for", "198.51.100.7"), ("forwarded", "for=6.6.6.6")], "198.51.100.7", Header),
        ("only Forwarded, XFF read: no header", "10.0.0.1", &[("forwarded", "for=6.6.6.6")], "10.0.0.1", NoHeader),
        ("X-Real-IP ignored when XFF is read", "10.0.0.1", &[("x-real-ip", "6.6.6.6")], "10.0.0.1", NoHeader),
    ];
    for (case, peer, list, want, basis) in cases {
        check(&ci, case, peer, list, want, *basis);
    }
}

#[test]
fn hops_are_counted_and_capped() {
    let ci = client_ip(ProxyHeader::XForwardedFor);
    let r = ci.resolve_from(
        ip("10.0.0.1"),
        &headers(&[(
            "x-forwarded-for",
            "6.6.6.6, 198.51.100.7, 10.0.0.3, 10.0.0.2",
        )]),
    );
    assert_eq!((r.ip(), r.hops_examined()), (ip("198.51.100.7"), 3));
    // 32 trusted hops and the client: found, at the cap.
    let mut chain: Vec<String> = vec!["198.51.100.7".into()];
    chain.extend((0..31).map(|i| format!("10.0.1.{i}")));
    let r = ci.resolve_from(
        ip("10.0.0.1"),
        &headers(&[("x-forwarded-for", &chain.join(", "))]),
    );
    assert_eq!(
        (r.ip(), r.basis(), r.hops_examined()),
        (ip("198.51.100.7"), Basis::Header, 32)
    );
    // One more trusted hop: the cap is reached first; keyed on the last trusted hop examined.
    chain.push("10.0.1.200".into());
    let r = ci.resolve_from(
        ip("10.0.0.1"),
        &headers(&[("x-forwarded-for", &chain.join(", "))]),
    );
    assert_eq!(
        (r.ip(), r.basis(), r.hops_examined()),
        (ip("10.0.1.0"), Basis::HopLimit, 32)
    );
    // Exactly 32 trusted hops, nothing more: all trusted, not the cap.
    let all: Vec<String> = (0..32).map(|i| format!("10.0.1.{i}")).collect();
    let r = ci.resolve_from(
        ip("10.0.0.1"),
        &headers(&[("x-forwarded-for", &all.join(","))]),
    );
    assert_eq!(
        (r.ip(), r.basis(), r.hops_examined()),
        (ip("10.0.1.0"), Basis::AllTrusted, 32)
    );
    // A smaller cap.
    let small = ClientIp::builder()
        .trusted_proxies(TRUSTED)
        .max_hops(2)
        .build()
        .unwrap();
    let r = small.resolve_from(
        ip("10.0.0.1"),
        &headers(&[("x-forwarded-for", "198.51.100.7, 10.0.0.3, 10.0.0.2")]),
    );
    assert_eq!(
        (r.ip(), r.basis(), r.hops_examined()),
        (ip("10.0.0.3"), Basis::HopLimit, 2)
    );
}

// ---------------------------------------------------------------------------------------------
// Forwarded (RFC 7239)
// ---------------------------------------------------------------------------------------------

#[test]
fn forwarded_table() {
    let ci = client_ip(ProxyHeader::Forwarded);
    use Basis::*;
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("untrusted peer, spoofed Forwarded ignored", "203.0.113.9", &[("forwarded", "for=198.51.100.7")], "203.0.113.9", UntrustedPeer),
        ("one trusted hop", "10.0.0.1", &[("forwarded", "for=198.51.100.7")], "198.51.100.7", Header),
        ("parameters around for", "10.0.0.1", &[("forwarded", "proto=https;for=198.51.100.7;by=10.0.0.1;host=example.com")], "198.51.100.7", Header),
        ("case-insensitive parameter name", "10.0.0.1", &[("forwarded", "For=198.51.100.7"), ("forwarded", "FOR=10.0.0.2")], "198.51.100.7", Header),
        ("several elements", "10.0.0.1", &[("forwarded", "for=6.6.6.6, for=198.51.100.7;proto=https, for=10.0.0.2")], "198.51.100.7", Header),
        ("several lines", "10.0.0.1", &[("forwarded", "for=6.6.6.6"), ("forwarded", "for=198.51.100.7"), ("forwarded", "for=10.0.0.2;proto=https")], "198.51.100.7", Header),
        ("quoted IPv6 with port", "10.0.0.1", &[("forwarded", "for=\"[2001:db8:cafe::17]:4711\", for=10.0.0.2")], "2001:db8:cafe::17", Header),
        ("quoted IPv6 without port", "10.0.0.1", &[("forwarded", "for=\"[2001:db8:cafe::17]\"")], "2001:db8:cafe::17", Header),
        ("quoted trusted IPv6 hop", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=\"[2001:db8:ffff::2]:80\"")], "198.51.100.7", Header),
        ("quoted IPv4 with port", "10.0.0.1", &[("forwarded", "for=\"198.51.100.7:4711\"")], "198.51.100.7", Header),
        ("IPv4 with obfuscated port", "10.0.0.1", &[("forwarded", "for=\"198.51.100.7:_p1\"")], "198.51.100.7", Header),
        ("quoted commas left of the client", "10.0.0.1", &[("forwarded", "for=\"6.6.6.6, for=10.0.0.9\", for=198.51.100.7")], "198.51.100.7", Header),
        ("quoted commas in a trusted hop's element", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=10.0.0.2;ext=\"a, b\";proto=https")], "198.51.100.7", Header),
        ("escaped quote in a trusted hop's element", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=10.0.0.2;ext=\"a\\\", b\"")], "198.51.100.7", Header),
        ("unbalanced quote left of the client", "10.0.0.1", &[("forwarded", "for=\"6.6.6.6, for=198.51.100.7")], "198.51.100.7", Header),
        ("spoofed leftmost trusted-looking", "10.0.0.1", &[("forwarded", "for=10.1.1.1, for=198.51.100.7, for=10.0.0.2")], "198.51.100.7", Header),
        ("unknown: the last trusted hop", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=unknown, for=10.0.0.2")], "10.0.0.2", Unidentified),
        ("unknown rightmost: the peer", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=unknown")], "10.0.0.1", Unidentified),
        ("obfuscated: the last trusted hop", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=_hidden, for=10.0.0.2")], "10.0.0.2", Unidentified),
        ("quoted obfuscated", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=\"_gazonk:_p\"")], "10.0.0.1", Unidentified),
        ("obfuscated left of the client: not reached", "10.0.0.1", &[("forwarded", "for=_hidden, for=198.51.100.7")], "198.51.100.7", Header),
        ("element without for", "10.0.0.1", &[("forwarded", "for=198.51.100.7, proto=https;by=10.0.0.1")], "10.0.0.1", Unidentified),
        ("for twice in one element", "10.0.0.1", &[("forwarded", "for=198.51.100.7;for=10.0.0.2")], "10.0.0.1", Malformed),
        ("unquoted garbage", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=10.0.0.2, nonsense")], "10.0.0.1", Malformed),
        ("malformed after a trusted hop", "10.0.0.1", &[("forwarded", "for=198.51.100.7, for=\"[2001:db8::1\", for=10.0.0.2")], "10.0.0.2", Malformed),
        ("every hop trusted", "10.0.0.1", &[("forwarded", "for=10.0.0.3, for=10.0.0.2")], "10.0.0.3", AllTrusted),
        ("no header", "10.0.0.1", &[], "10.0.0.1", NoHeader),
        ("mixed: XFF ignored when Forwarded is read", "10.0.0.1", &[("x-forwarded-for", "6.6.6.6"), ("forwarded", "for=198.51.100.7")], "198.51.100.7", Header),
        ("mixed: only XFF, Forwarded read", "10.0.0.1", &[("x-forwarded-for", "6.6.6.6")], "10.0.0.1", NoHeader),
    ];
    for (case, peer, list, want, basis) in cases {
        check(&ci, case, peer, list, want, *basis);
    }
}

// ---------------------------------------------------------------------------------------------
// Single-value headers
// ---------------------------------------------------------------------------------------------

#[test]
fn single_value_header_table() {
    let ci = client_ip(ProxyHeader::single("x-real-ip").unwrap());
    use Basis::*;
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("untrusted peer ignored", "203.0.113.9", &[("x-real-ip", "198.51.100.7")], "203.0.113.9", UntrustedPeer),
        ("trusted peer", "10.0.0.1", &[("x-real-ip", "198.51.100.7")], "198.51.100.7", Header),
        ("with a port", "10.0.0.1", &[("x-real-ip", "[2001:db8:1::7]:443")], "2001:db8:1::7", Header),
        ("XFF ignored", "10.0.0.1", &[("x-forwarded-for", "6.6.6.6")], "10.0.0.1", NoHeader),
        ("twice: ambiguous, the peer", "10.0.0.1", &[("x-real-ip", "6.6.6.6"), ("x-real-ip", "198.51.100.7")], "10.0.0.1", Malformed),
        ("a list: the peer", "10.0.0.1", &[("x-real-ip", "6.6.6.6, 198.51.100.7")], "10.0.0.1", Malformed),
        ("unknown: the peer", "10.0.0.1", &[("x-real-ip", "unknown")], "10.0.0.1", Unidentified),
    ];
    for (case, peer, list, want, basis) in cases {
        check(&ci, case, peer, list, want, *basis);
    }
    assert!(ProxyHeader::single("x-forwarded-for").is_err());
    assert!(ProxyHeader::single("Forwarded").is_err());
    assert!(ProxyHeader::single("bad header").is_err());
    assert_eq!(
        ProxyHeader::single("CF-Connecting-IP").unwrap(),
        ProxyHeader::Single(HeaderName::from_static("cf-connecting-ip"))
    );
}

// ---------------------------------------------------------------------------------------------
// Addresses: IPv4-mapped IPv6 and IPv6 grouping, in ClientIp and PeerIp
// ---------------------------------------------------------------------------------------------

#[test]
fn ipv6_grouping_and_mapped_addresses() {
    let by64 = client_ip(ProxyHeader::XForwardedFor);
    let by56 = ClientIp::builder()
        .trusted_proxies(TRUSTED)
        .ipv6_prefix(56)
        .build()
        .unwrap();
    let by128 = ClientIp::builder()
        .trusted_proxies(TRUSTED)
        .ipv6_prefix(128)
        .build()
        .unwrap();
    let xff = |client: &str| vec![("x-forwarded-for", client.to_owned())];
    let via = |extractor: &ClientIp, client: &str| {
        let list = xff(client);
        let list: Vec<(&str, &str)> = list.iter().map(|(n, v)| (*n, v.as_str())).collect();
        key_of(extractor, "10.0.0.1", &list)
    };
    let peer64 = |client: &str| key_of(&PeerIp::new(), client, &[]);
    let peer56 = |client: &str| key_of(&PeerIp::new().ipv6_prefix(56), client, &[]);
    let peer128 = |client: &str| key_of(&PeerIp::new().ipv6_prefix(128), client, &[]);
    let untrusted64 = |client: &str| key_of(&by64, client, &[("x-forwarded-for", "6.6.6.6")]);

    #[rustfmt::skip]
    let cases: &[(&str, &str, &str, &str)] = &[
        // client, key under /64, under /56, under /128
        ("2001:db8::1", "2001:db8::", "2001:db8::", "2001:db8::1"),
        ("2001:db8::ffff", "2001:db8::", "2001:db8::", "2001:db8::ffff"),
        ("2001:db8:0:0:ffff:ffff:ffff:ffff", "2001:db8::", "2001:db8::", "2001:db8::ffff:ffff:ffff:ffff"),
        ("2001:db8:0:1::1", "2001:db8:0:1::", "2001:db8::", "2001:db8:0:1::1"),
        ("2001:db8:0:ff::1", "2001:db8:0:ff::", "2001:db8::", "2001:db8:0:ff::1"),
        ("2001:db8:0:100::1", "2001:db8:0:100::", "2001:db8:0:100::", "2001:db8:0:100::1"),
        ("::ffff:1.2.3.4", "1.2.3.4", "1.2.3.4", "1.2.3.4"),
        ("::ffff:0102:0304", "1.2.3.4", "1.2.3.4", "1.2.3.4"),
        ("1.2.3.4", "1.2.3.4", "1.2.3.4", "1.2.3.4"),
        // An IPv4 suffix on an ordinary IPv6 address is not a mapped address.
        ("2001:db8::1.2.3.4", "2001:db8::", "2001:db8::", "2001:db8::102:304"),
        ("::1.2.3.4", "::", "::", "::102:304"),
    ];
    for (client, k64, k56, k128) in cases {
        for (name, got, want) in [
            ("ClientIp /64", via(&by64, client), k64),
            ("ClientIp /56", via(&by56, client), k56),
            ("ClientIp /128", via(&by128, client), k128),
            ("ClientIp untrusted peer /64", untrusted64(client), k64),
            ("PeerIp /64", peer64(client), k64),
            ("PeerIp /56", peer56(client), k56),
            ("PeerIp /128", peer128(client), k128),
        ] {
            assert_eq!(got, Key::from(ip(want)), "{name}: {client}");
        }
    }
    // The point of grouping: two addresses of one /64 are one bucket; of two /64s, two.
    assert_eq!(via(&by64, "2001:db8::1"), via(&by64, "2001:db8::ffff"));
    assert_ne!(via(&by64, "2001:db8::1"), via(&by64, "2001:db8:0:1::1"));
    assert_eq!(via(&by56, "2001:db8::1"), via(&by56, "2001:db8:0:ff::1"));
    assert_ne!(
        via(&by64, "::ffff:1.2.3.4"),
        via(&by64, "2001:db8::1.2.3.4")
    );
}

// `PeerIp` stays usable in `const` items.
const _PEER: PeerIp = PeerIp::new().ipv6_prefix(48);

#[test]
fn configuration_mistakes_are_errors_not_panics() {
    for bad in [
        "10.0.0.0/33",
        "10.0.0.1/8",
        "",
        "proxy.internal",
        "2001:db8::/200",
        "10.0.0.0/8,",
    ] {
        let err = ClientIp::new([bad]).unwrap_err().to_string();
        assert!(err.contains("trusted proxies"), "{bad}: {err}");
    }
    assert!(ClientIp::new(["10.0.0.0/8", "oops"]).is_err());
    assert!(ClientIp::builder().ipv6_prefix(129).build().is_err());
    assert!(ClientIp::builder().max_hops(0).build().is_err());
    let ci = ClientIp::new(["10.0.0.0/8", " 2001:db8::/32 ", "192.0.2.1"]).unwrap();
    assert_eq!(ci.trusted_proxies().len(), 3);
    assert!(ci.is_trusted(ip("::ffff:10.1.2.3")));
    assert!(!ci.is_trusted(ip("192.0.2.2")));
    assert_eq!(ci.ipv6_prefix_len(), 64);
    assert_eq!(ci.header(), &ProxyHeader::XForwardedFor);
    // An empty list trusts no one: the peer is the client, like PeerIp.
    let nobody = ClientIp::new(Vec::<String>::new()).unwrap();
    let r = nobody.resolve_from(
        ip("10.0.0.1"),
        &headers(&[("x-forwarded-for", "198.51.100.7")]),
    );
    assert_eq!((r.ip(), r.basis()), (ip("10.0.0.1"), Basis::UntrustedPeer));
}

#[test]
fn a_request_without_a_peer_address_is_a_server_error() {
    let ci = client_ip(ProxyHeader::XForwardedFor);
    let req = Request::new(());
    let err = ci.extract(&RequestRef::new(&req)).unwrap_err();
    assert_eq!(
        (err.status(), err.code()),
        (StatusCode::INTERNAL_SERVER_ERROR, "no_peer_address")
    );
}

// ---------------------------------------------------------------------------------------------
// Bounded parsing
// ---------------------------------------------------------------------------------------------

fn resolve_xff(ci: &ClientIp, lines: &[String]) -> Resolution {
    let mut map = HeaderMap::new();
    for line in lines {
        map.append("x-forwarded-for", HeaderValue::from_str(line).unwrap());
    }
    ci.resolve_from(ip("10.0.0.1"), &map)
}

#[test]
fn huge_headers_cost_what_the_trusted_hops_cost() {
    let ci = client_ip(ProxyHeader::XForwardedFor);
    let tail = "198.51.100.7, 10.0.0.3, 10.0.0.2";
    let tiny = resolve_xff(&ci, &[format!("6.6.6.6, {tail}")]);
    assert_eq!((tiny.ip(), tiny.hops_examined()), (ip("198.51.100.7"), 3));

    // A 400 KB header of spoofed entries, then the real chain.
    let spoofed = "6.6.6.6, ".repeat(400_000 / 9);
    let huge = resolve_xff(&ci, &[format!("{spoofed}{tail}")]);
    assert!(spoofed.len() + tail.len() >= 400_000);
    assert_eq!(
        huge, tiny,
        "same address, hops and bytes examined as the tiny header"
    );

    // Ten thousand hops in one line, and ten thousand header lines.
    let hops: Vec<String> = (0..10_000)
        .map(|i| format!("6.6.{}.{}", i / 256, i % 256))
        .collect();
    let one_line = resolve_xff(&ci, &[format!("{}, {tail}", hops.join(", "))]);
    assert_eq!(one_line, tiny);
    let mut lines = hops.clone();
    lines.extend(tail.split(", ").map(str::to_owned));
    let many_lines = resolve_xff(&ci, &lines);
    assert_eq!(
        (many_lines.ip(), many_lines.hops_examined()),
        (ip("198.51.100.7"), 3)
    );
    assert!(many_lines.bytes_examined() <= tiny.bytes_examined());

    // 400 KB of trusted hops: the cap stops the walk.
    let trusted = "10.0.0.9, ".repeat(40_000) + "10.0.0.2";
    let capped = resolve_xff(&ci, &[trusted]);
    assert_eq!(
        (capped.basis(), capped.hops_examined()),
        (Basis::HopLimit, 32)
    );
    assert!(
        capped.bytes_examined() <= 33 * 10,
        "{}",
        capped.bytes_examined()
    );

    // One 400 KB element: malformed after at most 129 bytes.
    let blob = resolve_xff(&ci, &["1".repeat(400_000)]);
    assert_eq!(
        (blob.ip(), blob.basis(), blob.hops_examined()),
        (ip("10.0.0.1"), Basis::Malformed, 1)
    );
    assert!(blob.bytes_examined() <= 129, "{}", blob.bytes_examined());

    // A 400 KB single-value header.
    let real_ip = client_ip(ProxyHeader::single("x-real-ip").unwrap());
    let padded = format!("{}198.51.100.7", " ".repeat(400_000));
    let r = real_ip.resolve_from(ip("10.0.0.1"), &headers(&[("x-real-ip", &padded)]));
    assert_eq!((r.ip(), r.basis()), (ip("10.0.0.1"), Basis::Malformed));
    assert!(r.bytes_examined() <= 129, "{}", r.bytes_examined());

    // Forwarded: a 400 KB quoted string, and 10,000 elements.
    let fwd = client_ip(ProxyHeader::Forwarded);
    let quoted = format!("for=\"{}", "a,".repeat(200_000));
    let mut map = HeaderMap::new();
    map.append("forwarded", HeaderValue::from_str(&quoted).unwrap());
    map.append(
        "forwarded",
        HeaderValue::from_static("for=198.51.100.7, for=10.0.0.2"),
    );
    let r = fwd.resolve_from(ip("10.0.0.1"), &map);
    assert_eq!((r.ip(), r.hops_examined()), (ip("198.51.100.7"), 2));
    assert!(r.bytes_examined() < 64, "{}", r.bytes_examined());
    let mut map = HeaderMap::new();
    map.append(
        "forwarded",
        HeaderValue::from_str(&format!("\"{}\"", "\\\"".repeat(200_000))).unwrap(),
    );
    let r = fwd.resolve_from(ip("10.0.0.1"), &map);
    assert_eq!((r.basis(), r.hops_examined()), (Basis::Malformed, 1));
    assert!(r.bytes_examined() <= 2 * 1025 + 2, "{}", r.bytes_examined());
    let elements: Vec<String> = (0..10_000)
        .map(|i| format!("for=6.6.{}.{}", i / 256, i % 256))
        .collect();
    let mut map = HeaderMap::new();
    let value = format!(
        "{}, for=198.51.100.7;proto=https, for=10.0.0.2",
        elements.join(", ")
    );
    map.append("forwarded", HeaderValue::from_str(&value).unwrap());
    let r = fwd.resolve_from(ip("10.0.0.1"), &map);
    assert_eq!((r.ip(), r.hops_examined()), (ip("198.51.100.7"), 2));
    assert!(r.bytes_examined() < 64, "{}", r.bytes_examined());
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

/// Bytes a header value may hold, biased towards the parsers' special characters.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    let special =
        prop::sample::select(b",;=\"\\[]:_ \t.0123456789abcdefABCDEFforunknwFOR".to_vec());
    let any_valid = (0x20u8..=0xff).prop_filter("not DEL", |b| *b != 0x7f);
    prop::collection::vec(prop_oneof![3 => special, 1 => any_valid], 0..200)
}

fn untrusted_v4() -> impl Strategy<Value = IpAddr> {
    any::<u32>()
        .prop_map(|n| IpAddr::from(std::net::Ipv4Addr::from(n)))
        .prop_filter("untrusted", |a| {
            !ClientIp::new(TRUSTED).unwrap().is_trusted(*a)
        })
}

fn untrusted_v6() -> impl Strategy<Value = IpAddr> {
    any::<u128>()
        .prop_map(|n| IpAddr::from(std::net::Ipv6Addr::from(n)))
        .prop_filter("untrusted, not mapped", |a| {
            !ClientIp::new(TRUSTED).unwrap().is_trusted(*a) && a.to_canonical() == *a
        })
}

fn trusted_addr() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 3]>().prop_map(|[a, b, c]| ip(&format!("10.{a}.{b}.{c}"))),
        any::<u64>().prop_map(|n| ip(&format!("2001:db8:ffff::{:x}", n & 0xffff))),
        Just(ip("192.0.2.1")),
    ]
}

fn xff_node(addr: IpAddr, port: Option<u16>) -> String {
    match (addr, port) {
        (IpAddr::V4(a), Some(p)) => format!("{a}:{p}"),
        (IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
        (a, None) => a.to_string(),
    }
}

fn forwarded_element(addr: IpAddr, port: Option<u16>) -> String {
    match (addr, port) {
        (IpAddr::V4(a), None) => format!("for={a}"),
        (IpAddr::V4(a), Some(p)) => format!("for=\"{a}:{p}\";proto=https"),
        (IpAddr::V6(a), None) => format!("For=\"[{a}]\""),
        (IpAddr::V6(a), Some(p)) => format!("by=_lb;for=\"[{a}]:{p}\""),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Whatever bytes arrive, from a trusted or an untrusted peer, nothing panics, the walk
    /// stays within the cap, and the address is the peer, an address in the header, or a
    /// trusted one.
    #[test]
    fn arbitrary_header_bytes_never_panic(
        lines in prop::collection::vec(header_bytes(), 0..4),
        trusted_peer in any::<bool>(),
    ) {
        let peer = if trusted_peer { ip("10.0.0.1") } else { ip("203.0.113.9") };
        for header in [ProxyHeader::XForwardedFor, ProxyHeader::Forwarded, ProxyHeader::single("x-real-ip").unwrap()] {
            let name = match &header {
                ProxyHeader::XForwardedFor => "x-forwarded-for",
                ProxyHeader::Forwarded => "forwarded",
                _ => "x-real-ip",
            };
            let ci = client_ip(header);
            let mut map = HeaderMap::new();
            for line in &lines {
                map.append(name, HeaderValue::from_bytes(line).unwrap());
            }
            let r = ci.resolve_from(peer, &map);
            prop_assert!(r.hops_examined() <= 32);
            if !trusted_peer {
                prop_assert_eq!((r.ip(), r.basis()), (peer, Basis::UntrustedPeer));
            } else if r.basis().is_fallback() || r.basis() == Basis::AllTrusted {
                prop_assert!(ci.is_trusted(r.ip()), "a fallback is a trusted hop");
            }
        }
    }

    /// A client that writes anything it likes in front of what the trusted proxies append is
    /// keyed on the address the first proxy saw, never on anything it wrote.
    #[test]
    fn the_client_cannot_choose_its_address(
        spoofed in prop::collection::vec(prop_oneof![
            header_bytes(),
            trusted_addr().prop_map(|a| a.to_string().into_bytes()),
            untrusted_v4().prop_map(|a| a.to_string().into_bytes()),
            untrusted_v6().prop_map(|a| format!("for=\"[{a}]:1\"").into_bytes()),
        ], 0..6),
        client in prop_oneof![untrusted_v4(), untrusted_v6()],
        client_port in prop::option::of(any::<u16>()),
        hops in prop::collection::vec((trusted_addr(), prop::option::of(any::<u16>())), 0..20),
        new_lines in prop::collection::vec(any::<bool>(), 21),
        forwarded in any::<bool>(),
    ) {
        let (name, header) = if forwarded {
            ("forwarded", ProxyHeader::Forwarded)
        } else {
            ("x-forwarded-for", ProxyHeader::XForwardedFor)
        };
        let node = |addr, port| if forwarded { forwarded_element(addr, port) } else { xff_node(addr, port) };
        // What the client sent: one header line of arbitrary bytes, or nothing.
        let mut lines: Vec<Vec<u8>> = Vec::new();
        if !spoofed.is_empty() {
            lines.push(spoofed.join(&b", "[..]));
        }
        // Each proxy appends its client's address, to the last line or on a new line.
        let mut appended = vec![(client, client_port)];
        appended.extend(hops.iter().copied());
        for (i, (addr, port)) in appended.into_iter().enumerate() {
            let element = node(addr, port).into_bytes();
            match lines.last_mut() {
                Some(line) if !new_lines[i] => {
                    line.extend_from_slice(b", ");
                    line.extend_from_slice(&element);
                }
                _ => lines.push(element),
            }
        }
        let ci = client_ip(header);
        let mut map = HeaderMap::new();
        for line in &lines {
            map.append(name, HeaderValue::from_bytes(line).unwrap());
        }
        let r = ci.resolve_from(ip("10.0.0.1"), &map);
        prop_assert_eq!((r.ip(), r.basis(), r.hops_examined()), (client, Basis::Header, hops.len() + 1));
    }
}

// ---------------------------------------------------------------------------------------------
// One-time warnings
// ---------------------------------------------------------------------------------------------

/// A tracing subscriber that records WARN events' fields.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut text = String::new();
            event.record(&mut Fields(&mut text));
            self.0.lock().unwrap().push(text);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn misconfiguration_warns_once_per_extractor_without_addresses() {
    let warnings = Warnings::default();
    let seen = warnings.0.clone();
    tracing::subscriber::with_default(warnings, || {
        let ci = client_ip(ProxyHeader::XForwardedFor);
        let count = || seen.lock().unwrap().len();
        // Correct use: no warning.
        for _ in 0..3 {
            ci.resolve_from(
                ip("10.0.0.1"),
                &headers(&[("x-forwarded-for", "198.51.100.7")]),
            );
            ci.resolve_from(ip("203.0.113.9"), &headers(&[]));
        }
        assert_eq!(count(), 0);
        // Forwarding headers from an untrusted peer: once, for this extractor and its clones.
        for peer in ["203.0.113.9", "203.0.113.10", "198.51.100.200"] {
            ci.resolve_from(ip(peer), &headers(&[("forwarded", "for=198.51.100.7")]));
            ci.clone()
                .resolve_from(ip(peer), &headers(&[("x-forwarded-for", "198.51.100.7")]));
        }
        assert_eq!(count(), 1);
        assert!(
            seen.lock().unwrap()[0].contains("untrusted")
                || seen.lock().unwrap()[0].contains("outside the trusted")
        );
        // A trusted proxy without the header: every client would share its bucket. Once.
        for _ in 0..3 {
            ci.resolve_from(ip("10.0.0.1"), &headers(&[]));
            ci.resolve_from(ip("10.0.0.1"), &headers(&[("x-forwarded-for", "garbage")]));
        }
        assert_eq!(count(), 2);
        assert!(
            seen.lock().unwrap()[1].contains("no forwarding header"),
            "{:?}",
            seen.lock().unwrap()
        );
        // A second extractor has its own flags.
        let other = client_ip(ProxyHeader::XForwardedFor);
        other.resolve_from(ip("10.0.0.1"), &headers(&[("x-forwarded-for", "unknown")]));
        assert_eq!(count(), 3);
        assert!(seen.lock().unwrap()[2].contains("unknown or obfuscated"));
        // No address ever reaches the log.
        for text in seen.lock().unwrap().iter() {
            for needle in ["198.51", "203.0", "10.0.0", "garbage"] {
                assert!(!text.contains(needle), "{needle} logged in {text}");
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The other keys in an axum app
// ---------------------------------------------------------------------------------------------

/// Sends `req` and returns the status.
async fn status(app: &Router, req: Request<Body>) -> StatusCode {
    app.clone().oneshot(req).await.unwrap().status()
}

fn get_with(path: &str, list: &[(&str, &str)]) -> Request<Body> {
    let mut req = Request::get(path).body(Body::empty()).unwrap();
    *req.headers_mut() = headers(list);
    req
}

/// An app limited to 2 requests per key (fixed window on a clock that never moves).
fn app(key: impl KeyExtractor, peer: &str) -> Router {
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("2/h"))
        .key(key)
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/users/{id}",
            get(|| async { "user" }).post(|| async { "created" }),
        )
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::new(ip(peer), 5555)))
}

async fn statuses(app: &Router, reqs: impl IntoIterator<Item = Request<Body>>) -> Vec<u16> {
    let mut out = Vec::new();
    for req in reqs {
        out.push(status(app, req).await.as_u16());
    }
    out
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_real_client_has_its_own_bucket() {
    let app = app(ClientIp::new(["10.0.0.1"]).unwrap(), "10.0.0.1");
    let alice = || get_with("/", &[("x-forwarded-for", "198.51.100.1")]);
    let bob = || get_with("/", &[("x-forwarded-for", "198.51.100.2")]);
    assert_eq!(
        statuses(&app, [alice(), alice(), alice()]).await,
        [200, 200, 429]
    );
    assert_eq!(statuses(&app, [bob(), bob()]).await, [200, 200]);
    // Alice cannot escape by writing a new leftmost entry: the proxy still appends her address.
    let spoofs = (0..5).map(|i| {
        get_with(
            "/",
            &[("x-forwarded-for", &format!("203.0.113.{i}, 198.51.100.1"))],
        )
    });
    assert_eq!(statuses(&app, spoofs).await, [429; 5]);
    // Nor by claiming to be a trusted proxy's client: 10.0.0.1 is trusted, so Bob is still found.
    let spoof_bob = get_with("/", &[("x-forwarded-for", "198.51.100.2, 10.0.0.1")]);
    assert_eq!(status(&app, spoof_bob).await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_direct_client_rotating_fake_forwarding_headers_stays_in_one_bucket() {
    let app = app(ClientIp::new(["10.0.0.0/8"]).unwrap(), "203.0.113.5");
    let rotating = (0..6).map(|i| {
        get_with(
            "/",
            &[
                ("x-forwarded-for", &format!("198.51.100.{i}")),
                ("forwarded", &format!("for=198.51.100.{i}")),
                ("x-real-ip", &format!("198.51.100.{i}")),
            ],
        )
    });
    assert_eq!(
        statuses(&app, rotating).await,
        [200, 200, 429, 429, 429, 429]
    );
}

#[tokio::test]
async fn ipv6_clients_rotating_within_their_64_stay_in_one_bucket() {
    let app = app(ClientIp::new(["10.0.0.1"]).unwrap(), "10.0.0.1");
    let from = |a: &str| get_with("/", &[("x-forwarded-for", a)]);
    let rotating = [
        "2001:db8::1",
        "2001:db8::2",
        "2001:db8::dead:beef",
        "2001:db8::ffff",
    ]
    .map(from);
    assert_eq!(statuses(&app, rotating).await, [200, 200, 429, 429]);
    assert_eq!(statuses(&app, [from("2001:db8:0:1::1")]).await, [200]);
}

#[tokio::test]
async fn matched_route_gives_each_route_its_own_bucket() {
    let app = app(key::matched_route(MatchedPath::as_str), "203.0.113.5");
    let user = |id: u32| {
        Request::get(format!("/users/{id}"))
            .body(Body::empty())
            .unwrap()
    };
    // Different ids are one route: the raw path is not the key.
    assert_eq!(
        statuses(&app, [user(1), user(2), user(3)]).await,
        [200, 200, 429]
    );
    // Another method on the route, and another route, have their own buckets.
    let post = Request::post("/users/1").body(Body::empty()).unwrap();
    assert_eq!(status(&app, post).await, StatusCode::OK);
    assert_eq!(status(&app, get_with("/", &[])).await, StatusCode::OK);
    // An unmatched path under Router::layer has no route: 404, never a bucket of its own.
    let response = app.clone().oneshot(get_with("/nope", &[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&body).contains("no_matched_route"),
        "{body:?}"
    );
    // Per route and client.
    let app = app_per_route_and_client();
    let from = |a: &str| get_with("/users/7", &[("x-forwarded-for", a)]);
    assert_eq!(
        statuses(
            &app,
            [
                from("198.51.100.1"),
                from("198.51.100.1"),
                from("198.51.100.1"),
                from("198.51.100.2")
            ]
        )
        .await,
        [200, 200, 429, 200]
    );
}

fn app_per_route_and_client() -> Router {
    app(
        key::all((
            key::matched_route(MatchedPath::as_str),
            ClientIp::new(["10.0.0.1"]).unwrap(),
        )),
        "10.0.0.1",
    )
}

#[derive(Clone)]
struct UserId(u64);

#[tokio::test]
async fn signed_in_users_by_id_everyone_else_by_client_ip() {
    // Stands in for an authentication layer: a valid `x-user` header becomes a UserId.
    let auth = axum::middleware::map_request(|mut req: Request<Body>| async move {
        if let Some(id) = req
            .headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok()?.parse().ok())
        {
            req.extensions_mut().insert(UserId(id));
        }
        req
    });
    let key =
        key::extension_with(|u: &UserId| Key::from(u.0)).or(ClientIp::new(["10.0.0.1"]).unwrap());
    let app = app(key, "10.0.0.1").layer(auth);
    let user = |id: &str, from: &str| get_with("/", &[("x-user", id), ("x-forwarded-for", from)]);
    let anon = |from: &str| get_with("/", &[("x-forwarded-for", from)]);
    // User 1 from two addresses: one bucket.
    assert_eq!(
        statuses(
            &app,
            [
                user("1", "198.51.100.1"),
                user("1", "198.51.100.2"),
                user("1", "198.51.100.3")
            ]
        )
        .await,
        [200, 200, 429]
    );
    // User 2, and anonymous clients, have their own.
    assert_eq!(statuses(&app, [user("2", "198.51.100.1")]).await, [200]);
    assert_eq!(
        statuses(
            &app,
            [
                anon("198.51.100.1"),
                anon("198.51.100.1"),
                anon("198.51.100.1"),
                anon("198.51.100.9")
            ]
        )
        .await,
        [200, 200, 429, 200]
    );
}

#[tokio::test]
async fn api_keys_have_their_own_buckets_and_are_stored_hashed() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("1/h"))
        .key(ApiKey::bearer())
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let bearer = |t: &str| get_with("/", &[("authorization", &format!("Bearer {t}"))]);
    assert_eq!(
        statuses(&app, [bearer("k1"), bearer("k1"), bearer("k2")]).await,
        [200, 429, 200]
    );
    assert_eq!(statuses(&app, [get_with("/", &[])]).await, [400]);
    // The key is the token's hash, never the token.
    assert_eq!(
        ApiKey::key_for(b"k1"),
        key_of(
            &ApiKey::bearer(),
            "203.0.113.5",
            &[("authorization", "bearer k1")]
        )
    );
    assert!(!format!("{:?}", ApiKey::key_for(b"k1")).contains("k1"));
}

// ---------------------------------------------------------------------------------------------
// The demo server
// ---------------------------------------------------------------------------------------------

/// GET / with an X-Forwarded-For header; the status.
fn get_from(server: &DemoServer, xff: &str) -> u16 {
    server.get("/", &[("X-Forwarded-For", xff)]).0
}

#[test]
fn demo_server_behind_a_trusted_proxy_limits_per_real_client() {
    // The test connects from 127.0.0.1, which plays the proxy.
    let server = DemoServer::start(&[
        ("KEY", "client_ip"),
        ("TRUSTED_PROXIES", "10.0.0.0/8, 127.0.0.1"),
        // A proxy on this machine: the admin routes need a token.
        ("ADMIN_TOKEN", "0123456789abcdef-admin"),
        ("RATE_LIMIT", "2/h"),
    ]);
    assert!(
        server
            .first_line
            .contains("KEY=client_ip TRUSTED_PROXIES=10.0.0.0/8,127.0.0.1/32"),
        "{}",
        server.first_line
    );
    let alice: Vec<u16> = (0..3).map(|_| get_from(&server, "198.51.100.1")).collect();
    assert_eq!(alice, [200, 200, 429]);
    assert_eq!(
        get_from(&server, "198.51.100.2"),
        200,
        "another client, another bucket"
    );
    assert_eq!(
        get_from(&server, "203.0.113.77, 198.51.100.1"),
        429,
        "a spoofed leftmost entry changes nothing"
    );
    assert_eq!(
        get_from(&server, "198.51.100.1, 10.0.0.2"),
        429,
        "trusted hops are skipped"
    );
}

#[test]
fn demo_server_ignores_forwarding_headers_from_untrusted_clients() {
    let server = DemoServer::start(&[("KEY", "client_ip"), ("RATE_LIMIT", "2/h")]);
    let statuses: Vec<u16> = (0..5)
        .map(|i| get_from(&server, &format!("198.51.100.{i}")))
        .collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
}

#[test]
fn demo_server_rejects_bad_trusted_proxies_with_the_variable_named() {
    for (env, expect) in [
        (
            &[("KEY", "client_ip"), ("TRUSTED_PROXIES", "10.0.0.0/33")][..],
            "error: TRUSTED_PROXIES:",
        ),
        (
            &[
                ("KEY", "client_ip"),
                ("TRUSTED_PROXIES", "10.0.0.0/8,proxy.internal"),
            ][..],
            "error: TRUSTED_PROXIES:",
        ),
        (
            &[("KEY", "ip"), ("TRUSTED_PROXIES", "10.0.0.0/8")][..],
            "error: TRUSTED_PROXIES:",
        ),
        (&[("KEY", "client-ip")][..], "error: KEY:"),
    ] {
        let err = support::demo::start_error(env);
        assert!(err.starts_with(expect), "{env:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    let help = Command::new(server_binary())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(
        help.contains("TRUSTED_PROXIES") && help.contains("client_ip"),
        "{help}"
    );
}

// ---------------------------------------------------------------------------------------------
// PeerIp
// ---------------------------------------------------------------------------------------------

/// Reports the remaining count of the decision that let the request through.
async fn remaining(decision: Decision) -> String {
    decision.tightest().remaining().to_string()
}

#[tokio::test]
async fn mock_connect_info_keys_each_peer_separately() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let limited = Router::new().route("/", get(remaining)).layer(
        RateLimitLayer::builder()
            .policy(Policy::fixed_window("2/s"))
            .key(PeerIp::new())
            .store(store.clone())
            .build()
            .unwrap(),
    );
    let as_peer = |peer: &str| {
        limited
            .clone()
            .layer(MockConnectInfo(peer.parse::<SocketAddr>().unwrap()))
    };
    let a = as_peer("192.0.2.1:1111");
    let b = as_peer("192.0.2.2:1111");

    assert_eq!(get_path(&a, "/").await.body, "1");
    assert_eq!(get_path(&a, "/").await.body, "0");
    assert_eq!(
        get_path(&a, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    let r = get_path(&b, "/").await;
    assert_eq!(r.status, StatusCode::OK, "another peer has its own bucket");
    assert_eq!(r.body, "1");

    // An IPv4-mapped IPv6 peer is the same client as the IPv4 address.
    let v4 = as_peer("1.2.3.4:5000");
    let mapped = as_peer("[::ffff:1.2.3.4]:6000");
    let other_v6 = as_peer("[::ffff:1.2.3.5]:6000");
    assert_eq!(get_path(&mapped, "/").await.body, "1");
    assert_eq!(get_path(&v4, "/").await.body, "0");
    assert_eq!(
        get_path(&mapped, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get_path(&v4, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get_path(&other_v6, "/").await.body, "1");

    assert_eq!(store.len(), 4, "four distinct clients");
}

#[tokio::test]
async fn without_connect_info_peer_ip_answers_500() {
    let app = Router::new().route("/", get(remaining)).layer(
        RateLimitLayer::builder()
            .policy(Policy::gcra("2/s"))
            .build()
            .unwrap(),
    );
    let r = get_path(&app, "/").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.body.contains(r#""code":"no_peer_address""#), "{}", r.body);
    assert!(
        r.body.contains("into_make_service_with_connect_info"),
        "the message says how to fix it: {}",
        r.body
    );
}

#[tokio::test]
async fn peer_ip_without_an_address_is_a_500() {
    let clock = ManualClock::new();
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::builder()
                .policy(Policy::fixed_window("2/s"))
                .key(PeerIp::new())
                .store(MemoryStore::with_clock(clock.clone()))
                .build()
                .unwrap(),
        )
        .service(inner(&seen));

    let r = support::http::get(&svc).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.header(CONTENT_TYPE), Some(PROBLEM_JSON));
    assert!(r.body.contains(r#""code":"no_peer_address""#), "{}", r.body);
    assert!(r.body.contains(r#""status":500"#), "{}", r.body);
    assert_eq!(seen.calls(), 0);
}

#[tokio::test]
async fn peer_ip_reads_a_socket_addr_extension() {
    let clock = ManualClock::new();
    let seen = Seen::default();
    // PeerIp is the default key.
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::builder()
                .policy(Policy::fixed_window("2/s"))
                .store(MemoryStore::with_clock(clock.clone()))
                .build()
                .unwrap(),
        )
        .service(inner(&seen));

    // Ports do not matter; the IPv4-mapped IPv6 form is the same client.
    for peer in ["10.0.0.1:1000", "[::ffff:10.0.0.1]:2000"] {
        assert_eq!(
            send(&svc, with_peer(peer)).await.status,
            StatusCode::OK,
            "{peer}"
        );
    }
    let r = send(&svc, with_peer("10.0.0.1:3000")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);

    // Another address has its own bucket.
    for peer in ["10.0.0.2:1000", "[2001:db8::1]:443"] {
        let r = send(&svc, with_peer(peer)).await;
        assert_eq!(r.status, StatusCode::OK, "{peer}");
        assert_eq!(r.num(X_RATELIMIT_REMAINING), Some(1), "{peer}");
    }
    assert_eq!(seen.calls(), 4);
}

// ---------------------------------------------------------------------------------------------
// HeaderKey and rejected keys
// ---------------------------------------------------------------------------------------------

fn api_key_layer(clock: &ManualClock) -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window("2/s"))
        .key(HeaderKey::new(HeaderName::from_static("x-api-key")))
        .store(MemoryStore::with_clock(clock.clone()))
}

#[tokio::test]
async fn header_key_rejections_are_400_problem_json_and_never_reach_the_service() {
    let clock = ManualClock::new();
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(api_key_layer(&clock).build().unwrap())
        .service(inner(&seen));

    let cases = [
        (with_header("x-api-key", &[]), "missing_header"),
        (with_header("x-api-key", &["a", "b"]), "ambiguous_header"),
        (with_header("x-api-key", &[""]), "empty_header"),
        (with_header("x-other", &["a"]), "missing_header"),
    ];
    for (req, code) in cases {
        let r = send(&svc, req).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{code}");
        assert_eq!(r.header(CONTENT_TYPE), Some(PROBLEM_JSON));
        assert!(
            r.body.contains(&format!(r#""code":"{code}""#)),
            "{}",
            r.body
        );
        assert!(r.body.contains(r#""status":400"#), "{}", r.body);
        assert!(
            r.body.contains("x-api-key"),
            "the message names the header: {}",
            r.body
        );
        assert_eq!(
            r.rate_headers(),
            (None, None, None, None),
            "a request without a key was not counted"
        );
    }
    assert_eq!(seen.calls(), 0, "rejected requests never reach the service");

    // Rejected requests were not charged to anyone, and each key has its own bucket.
    for key in ["alice", "bob"] {
        for remaining in [1, 0] {
            let r = send(&svc, with_header("x-api-key", &[key])).await;
            assert_eq!(r.status, StatusCode::OK, "{key}");
            assert_eq!(r.num(X_RATELIMIT_REMAINING), Some(remaining), "{key}");
        }
        let r = send(&svc, with_header("x-api-key", &[key])).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{key}");
    }
    assert_eq!(seen.calls(), 4);
}

#[tokio::test]
async fn on_key_rejected_writes_the_response() {
    let clock = ManualClock::new();
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(
            api_key_layer(&clock)
                .on_key_rejected(|rejection| {
                    let mut r = Response::new(Bytes::from(format!(
                        "no key ({}, default {})",
                        rejection.code(),
                        rejection.status().as_u16()
                    )));
                    *r.status_mut() = StatusCode::UNAUTHORIZED;
                    r
                })
                .build()
                .unwrap(),
        )
        .service(inner(&seen));

    let r = support::http::get(&svc).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.body, "no key (missing_header, default 400)");
    assert_eq!(r.header(CONTENT_TYPE), None);
    let r = send(&svc, with_header("x-api-key", &["a", "b"])).await;
    assert_eq!(r.body, "no key (ambiguous_header, default 400)");
    assert_eq!(seen.calls(), 0);
}
