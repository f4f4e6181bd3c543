//! The demo server's abuse controls, from outside: `DENY`, `ALLOW` and `NEAR_LIMIT`; the
//! admin routes `/admin/deny/{key}` and `/admin/allow/{key}` (keys and networks) on one of
//! two servers sharing a Redis, obeyed by the other; the networks against spoofed forwarding headers.

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use support::RedisServer;
use support::demo::{DemoServer, fetch, request, request_with, start_error};

/// Asserts a `403` of the lists' problem type.
fn assert_denied((status, response): (u16, String), what: &str) {
    assert_eq!(status, 403, "{what}: {response}");
    assert!(response.contains("application/problem+json"), "{response}");
    assert!(
        response.contains("constant.denied.html"),
        "{what}: the problem type: {response}"
    );
}

/// Keys given in `DENY` and `ALLOW`, keys added and removed on the admin address of one
/// server and obeyed by the other at once, the warning near the limit on `/metrics` and
/// `/admin/top`, and the admin routes' errors.
#[test]
fn lists_and_warnings_on_two_instances() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "4/h"),
        ("POLICY_NAME", "api"),
        ("KEY", "header:x-api-key"),
        ("PREFIX", "e2ea:"),
        ("STORE_TIMEOUT_MS", "10000"),
        ("ADMIN_BIND", "127.0.0.1:0"),
        ("DENY", "scraper"),
        ("ALLOW", "monitor"),
        ("NEAR_LIMIT", "50"),
    ];
    let (a, b) = (DemoServer::start(&env), DemoServer::start(&env));
    let key = |k: &'static str| [("x-api-key", k)];
    assert_denied(b.get("/", &key("scraper")), "DENY");
    for _ in 0..6 {
        let (status, response) = b.get("/", &key("monitor"));
        assert_eq!(status, 200);
        assert!(!response.contains("x-ratelimit"), "allowed: no headers");
    }
    // Added on a, obeyed by b; taken off.
    let admin = a.admin_addr();
    assert_eq!(request(admin, "PUT", "/admin/deny/acme").0, 204);
    assert_denied(b.get("/", &key("acme")), "added at runtime");
    assert_eq!(request(admin, "DELETE", "/admin/deny/acme").0, 204);
    assert_eq!(b.get("/", &key("acme")).0, 200);
    let tomorrow = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 86_400;
    let path = format!("/admin/allow/bob?until={tomorrow}");
    assert_eq!(request(admin, "PUT", &path).0, 204);
    for _ in 0..6 {
        assert_eq!(b.get("/", &key("bob")).0, 200);
    }
    assert_eq!(request(admin, "DELETE", "/admin/allow/bob").0, 204);
    assert!(
        b.get("/", &key("bob"))
            .1
            .contains("x-ratelimit-remaining: 3")
    );
    // Warned at 50% of 4: at the second request, once.
    for _ in 0..3 {
        assert_eq!(b.get("/", &key("carol")).0, 200);
    }
    let (_, metrics) = fetch(b.admin_addr(), "/metrics", &[]);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("ratelimit_near_limit_total{"))
        .unwrap_or_else(|| panic!("no near-limit count: {metrics}"));
    assert!(
        line.contains("policy=\"api\"") && line.ends_with(" 1"),
        "{line}"
    );
    let (_, top) = fetch(b.admin_addr(), "/admin/top", &[]);
    let top: serde_json::Value = serde_json::from_str(&top).unwrap();
    let near: Vec<&str> = top["policies"][0]["near_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(near, ["carol"], "{top}");
    // Bad parameters: 400 naming them; never on the public address.
    for (method, path, parameter) in [
        ("PUT", "/admin/deny/acme?until=soon", "until"),
        ("PUT", "/admin/deny/acme?until=1", "until"),
        ("PUT", "/admin/deny/acme?until=-5", "until"),
        // 2^63 and 2^64: out of range, never a panic.
        ("PUT", "/admin/deny/acme?until=9223372036854775808", "until"),
        (
            "PUT",
            "/admin/allow/acme?until=18446744073709551616",
            "until",
        ),
        ("PUT", "/admin/deny/acme?until=99999999999", "until"),
        (
            "PUT",
            "/admin/limits/api/acme?quota=5/h&until=9223372036854775808",
            "until",
        ),
        ("PUT", "/admin/limits/api/acme?quota=5/h&until=1", "until"),
        ("PUT", "/admin/limits/api/acme?quota=5/h&until=-1", "until"),
        ("PUT", "/admin/allow/acme?for=ever", "for"),
    ] {
        let (status, response) = request(admin, method, path);
        assert_eq!(status, 400, "{path}: {response}");
        let name = format!("\"invalid-params\":[{{\"name\":\"{parameter}\"");
        assert!(response.contains(&name), "{path}: {response}");
    }
    assert_eq!(request(a.addr, "PUT", "/admin/deny/acme").0, 404);
}

/// `DENY` networks are matched against the client's address as `TRUSTED_PROXIES` find it:
/// through the trusted proxy (here the test itself, 127.0.0.1) the forwarded address counts;
/// from anyone else a forwarding header is not believed.
#[test]
fn networks_are_matched_behind_trusted_proxies_only() {
    let behind = DemoServer::start(&[
        ("KEY", "client_ip"),
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("ADMIN_TOKEN", "0123456789abcdef-admin"),
        ("DENY", "203.0.113.0/24,2001:db8:bad::/48"),
        ("ALLOW", "198.51.100.0/24"),
        ("RATE_LIMIT", "1/h"),
    ]);
    let xff = |ip: &'static str| [("x-forwarded-for", ip)];
    assert_denied(behind.get("/", &xff("203.0.113.5")), "denied network");
    assert_denied(
        behind.get("/", &xff("2001:db8:bad::1")),
        "denied IPv6 network",
    );
    for _ in 0..3 {
        assert_eq!(behind.get("/", &xff("198.51.100.7")).0, 200, "allowed");
    }
    assert_eq!(behind.get("/", &xff("192.0.2.1")).0, 200);
    assert_eq!(behind.get("/", &xff("192.0.2.1")).0, 429);
    // No proxy trusted: the header is the client's own, and the peer is matched.
    let direct = DemoServer::start(&[
        ("DENY", "127.0.0.0/8"),
        ("ALLOW", "198.51.100.0/24"),
        ("TRUSTED_PROXIES", ""),
    ]);
    assert_denied(direct.get("/", &xff("198.51.100.7")), "spoofed");
    let open = DemoServer::start(&[("DENY", "203.0.113.0/24")]);
    assert_eq!(open.get("/", &xff("203.0.113.5")).0, 200, "spoofed");
}

/// `BLOCK_FOR`: a key denied on one server is blocked for an hour, on the other too, and
/// `/metrics` counts the block with its level.
#[test]
fn a_key_denied_is_blocked_on_every_instance() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "2/s"),
        ("POLICY_NAME", "api"),
        ("KEY", "header:x-api-key"),
        ("PREFIX", "e2eb:"),
        ("STORE_TIMEOUT_MS", "10000"),
        ("BLOCK_FOR", "1h"),
        ("BLOCK_MAX", "1d"),
    ];
    let (a, b) = (DemoServer::start(&env), DemoServer::start(&env));
    let key = [("x-api-key", "scraper")];
    assert_eq!(a.get("/", &key).0, 200);
    assert_eq!(a.get("/", &key).0, 200);
    let (status, response) = a.get("/", &key);
    assert_eq!(status, 429);
    assert!(response.contains("retry-after: 3600"), "{response}");
    let (status, response) = b.get("/", &key);
    assert_eq!(status, 429, "the other instance");
    let retry: u64 = response
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((3500..=3600).contains(&retry), "{response}");
    assert_eq!(b.get("/", &[("x-api-key", "other")]).0, 200);
    let (_, metrics) = fetch(a.addr, "/metrics", &[]);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("ratelimit_blocks_total{"))
        .unwrap_or_else(|| panic!("no block counted: {metrics}"));
    assert!(
        line.contains("level=\"1\"") && line.ends_with(" 1"),
        "{line}"
    );
}

/// The admin routes answer the holder of `ADMIN_TOKEN` only, or without it loopback clients
/// naming a loopback `Host`; the server refuses to serve them unguarded on a public address.
#[test]
fn the_admin_routes_are_guarded() {
    for env in [
        vec![("BIND", "0.0.0.0:0")],
        vec![("ADMIN_BIND", "0.0.0.0:0")],
        vec![("BIND", "0.0.0.0:0"), ("ADMIN_BIND", "[::]:0")],
    ] {
        let err = start_error(&env);
        assert!(err.starts_with("error: ADMIN_TOKEN:"), "{env:?}: {err}");
        assert!(err.contains("ADMIN_BIND"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let err = start_error(&[("ADMIN_TOKEN", "short")]);
    assert!(err.starts_with("error: ADMIN_TOKEN:"), "{err}");

    // Served on every address, with a token: nothing without it.
    let token = "0123456789abcdef-admin";
    let server = DemoServer::start(&[
        ("BIND", "0.0.0.0:0"),
        ("ADMIN_TOKEN", token),
        ("RATE_LIMIT", "2/h"),
    ]);
    let at = server.addr;
    let bearer = format!("Bearer {token}");
    let allow_me = "/admin/allow/127.0.0.1";
    let (status, response) = request(at, "PUT", allow_me);
    assert_eq!(status, 401, "{response}");
    assert!(response.contains("application/problem+json"), "{response}");
    assert!(
        response.contains("WWW-Authenticate: Bearer")
            || response.contains("www-authenticate: Bearer"),
        "{response}"
    );
    let wrong = [("authorization", "Bearer 0123456789abcdef-admiN")];
    assert_eq!(request_with(at, "PUT", allow_me, &wrong).0, 401);
    assert_eq!(request_with(at, "GET", "/admin/top", &[]).0, 401);
    for _ in 0..4 {
        server.get("/", &[]);
    }
    assert_eq!(server.get("/", &[]).0, 429, "the allow entry was refused");
    // Metrics stay open; the token opens the rest.
    assert_eq!(fetch(at, "/metrics", &[]).0, 200);
    let right = [("authorization", bearer.as_str())];
    assert_eq!(request_with(at, "GET", "/admin/top", &right).0, 200);
    assert_eq!(request_with(at, "PUT", allow_me, &right).0, 204);
    assert_eq!(server.get("/", &[]).0, 200);

    // Without a token, on loopback: a rebound name is refused, an address answered.
    let local = DemoServer::start(&[("RATE_LIMIT", "2/h")]);
    for host in [
        "evil.example",
        "evil.example:3000",
        "localhost.evil.example",
    ] {
        let (status, response) = request_with(
            local.addr,
            "PUT",
            "/admin/deny/192.0.2.1",
            &[("host", host)],
        );
        assert_eq!(status, 403, "{host}: {response}");
    }
    for host in ["localhost:3000", "127.0.0.1"] {
        let path = "/admin/deny/192.0.2.1";
        assert_eq!(
            request_with(local.addr, "PUT", path, &[("host", host)]).0,
            204
        );
    }
    assert_eq!(fetch(local.addr, "/admin/top", &[]).0, 200);
}

/// Without a token, the admin routes answer no request a proxy on this machine could have
/// passed on: a `Host` that is not a loopback name or address (a client that named the
/// machine by its address), or a request carrying a forwarding header; and the server will
/// not start trusting a proxy on a loopback address without a token.
#[test]
fn the_admin_routes_answer_no_proxy_on_the_same_machine() {
    let local = DemoServer::start(&[("RATE_LIMIT", "2/h")]);
    let path = "/admin/allow/127.0.0.1";
    for host in [
        "10.0.0.1",
        "10.0.0.1:3000",
        "192.0.2.7",
        "[2001:db8::1]:80",
        "[::]",
    ] {
        let (status, response) = request_with(local.addr, "PUT", path, &[("host", host)]);
        assert_eq!(status, 403, "{host}: {response}");
        assert!(response.contains("application/problem+json"), "{response}");
        assert!(response.contains("loopback"), "{host}: {response}");
    }
    for header in ["x-forwarded-for", "forwarded", "x-real-ip"] {
        let value = match header {
            "forwarded" => "for=203.0.113.9",
            _ => "203.0.113.9",
        };
        let (status, response) = request_with(local.addr, "PUT", path, &[(header, value)]);
        assert_eq!(status, 403, "{header}: {response}");
        assert!(response.contains("application/problem+json"), "{response}");
        assert!(response.contains("forwarded"), "{header}: {response}");
    }
    for host in [
        "127.0.0.1",
        "127.1.2.3:80",
        "localhost",
        "app.localhost:3000",
        "[::1]",
    ] {
        let (status, response) = request_with(local.addr, "PUT", path, &[("host", host)]);
        assert_eq!(status, 204, "{host}: {response}");
    }
    for proxies in [
        "127.0.0.1",
        "10.0.0.0/8,::1",
        "127.8.0.0/16",
        "0.0.0.0/0",
        "::/0",
    ] {
        let err = start_error(&[("KEY", "client_ip"), ("TRUSTED_PROXIES", proxies)]);
        assert!(err.starts_with("error: ADMIN_TOKEN:"), "{proxies}: {err}");
        assert!(err.contains("TRUSTED_PROXIES"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let token = "0123456789abcdef-admin";
    let proxied = DemoServer::start(&[
        ("KEY", "client_ip"),
        ("TRUSTED_PROXIES", "127.0.0.1"),
        ("ADMIN_TOKEN", token),
    ]);
    let bearer = format!("Bearer {token}");
    let (status, response) = request_with(proxied.addr, "PUT", path, &[("authorization", &bearer)]);
    assert_eq!(status, 204, "{response}");
    let remote = DemoServer::start(&[("KEY", "client_ip"), ("TRUSTED_PROXIES", "10.0.0.0/8")]);
    assert_eq!(request(remote.addr, "PUT", path).0, 204);
}

/// Every form of an address reaches its client on `/admin/deny`, `/admin/allow` and
/// `/admin/limits`; what no client's key can be is a 400 naming `key`, and a `DENY` entry
/// that no key is stops the server naming `DENY`.
#[test]
fn admin_entries_reach_the_client_they_name() {
    let v6 = DemoServer::start(&[("BIND", "[::1]:0"), ("KEY", "ip"), ("RATE_LIMIT", "2/h")]);
    let at = v6.addr;
    assert!(at.is_ipv6(), "{at}");
    assert_eq!(request(at, "PUT", "/admin/deny/0:0:0:0:0:0:0:1").0, 204);
    assert_denied(v6.get("/", &[]), "the long form");
    assert_eq!(request(at, "DELETE", "/admin/deny/::1").0, 204);
    assert_eq!(v6.get("/", &[]).0, 200);

    let v4 = DemoServer::start(&[("KEY", "ip"), ("RATE_LIMIT", "2/h"), ("POLICY_NAME", "api")]);
    let at = v4.addr;
    assert_eq!(request(at, "PUT", "/admin/allow/::ffff:127.0.0.1").0, 204);
    for _ in 0..4 {
        let (status, response) = v4.get("/", &[]);
        assert_eq!(status, 200, "allowed: {response}");
    }
    assert_eq!(
        request(at, "DELETE", "/admin/allow/::ffff:127.0.0.1").0,
        204
    );
    let path = "/admin/limits/api/::ffff:127.0.0.1?quota=100/h";
    let (status, response) = request(at, "PUT", path);
    assert_eq!(status, 204, "{response}");
    let (status, response) = v4.get("/", &[]);
    assert_eq!(status, 200, "{response}");
    assert!(response.contains("x-ratelimit-limit: 100"), "{response}");
    for path in ["/admin/deny/alice", "/admin/allow/127.0.0.01"] {
        let (status, response) = request(at, "PUT", path);
        assert_eq!(status, 400, "{path}: {response}");
        assert!(response.contains(r#""name":"key""#), "{path}: {response}");
    }
    let err = start_error(&[("KEY", "ip"), ("DENY", "127.0.0.01")]);
    assert!(err.starts_with("error: DENY:"), "{err}");
    assert!(err.contains("127.0.0.01"), "{err}");
}

/// A network put on the deny list of one of two servers sharing a Redis denies its clients on
/// both (on the other within a second or so); `DELETE` lifts it on both; a malformed network
/// is a 400 naming `network`.
#[test]
fn a_network_denied_at_runtime_is_denied_on_every_instance() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "100/s"),
        ("KEY", "ip"),
        ("PREFIX", "nets:"),
        ("STORE_TIMEOUT_MS", "10000"),
    ];
    let (a, b) = (DemoServer::start(&env), DemoServer::start(&env));
    assert_eq!(b.get("/", &[]).0, 200);
    let (status, response) = request(a.addr, "PUT", "/admin/deny/127.0.0.0%2F24");
    assert_eq!(status, 204, "{response}");
    assert_denied(a.get("/", &[]), "this instance, at once");
    let status = |server: &DemoServer| server.get("/", &[]).0;
    let within = std::time::Duration::from_secs(10);
    support::wait_until(within, "the other instance denies", || status(&b) == 403);
    assert_denied(b.get("/", &[]), "the other instance");
    let (status_of_delete, response) = request(a.addr, "DELETE", "/admin/deny/127.0.0.0%2F24");
    assert_eq!(status_of_delete, 204, "{response}");
    assert_eq!(status(&a), 200, "lifted on this instance at once");
    support::wait_until(within, "the other instance lifts it", || status(&b) == 200);
    for path in ["/admin/deny/127.0.0.1%2F24", "/admin/allow/10.0.0.0%2F33"] {
        let (status, response) = request(a.addr, "PUT", path);
        assert_eq!(status, 400, "{path}: {response}");
        assert!(
            response.contains(r#""name":"network""#),
            "{path}: {response}"
        );
    }
}

/// With `CONFIG`, the admin's key entries follow the file's `lists_key` (else its `key`): a key
/// the lists' key never makes is a 400 saying which key they follow; with `lists_key` set to a
/// policy's own key, an entry denies that key's requests.
#[test]
fn config_entries_follow_the_lists_key() {
    let dir = std::env::temp_dir().join(format!("tower-ratelimit-{}-lists", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = "[[policy]]\nname = \"reports\"\nquota = \"100/h\"\nkey = \"header:x-user\"\n";
    let file = |name: &str, head: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("key = \"ip\"\n{head}{policy}")).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let by_ip = file("ip.toml", "");
    let server = DemoServer::start(&[("CONFIG", by_ip.as_str())]);
    let (status, response) = request(server.addr, "PUT", "/admin/deny/alice");
    assert_eq!(status, 400, "{response}");
    assert!(response.contains(r#""name":"key""#), "{response}");
    assert!(
        response.contains(r#"lists_key = \"header:x-user\""#),
        "says which key the policy has: {response}"
    );
    let by_user = file("user.toml", "lists_key = \"header:x-user\"\n");
    let server = DemoServer::start(&[("CONFIG", by_user.as_str())]);
    let (status, response) = request(server.addr, "PUT", "/admin/deny/alice");
    assert_eq!(status, 204, "{response}");
    assert_denied(server.get("/", &[("x-user", "alice")]), "alice");
    assert_eq!(server.get("/", &[("x-user", "bob")]).0, 200);
    let _ = std::fs::remove_dir_all(&dir);
}
