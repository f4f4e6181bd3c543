//! Allow and deny lists (`tower_ratelimit::lists`): networks and keys given to the layer,
//! matched against the address the trusted-proxy rules find (a spoofed forwarding header
//! matches nothing); entries added at runtime kept in the store, obeyed by another instance
//! sharing it from its next request and ending at their time (an injected clock), on both
//! stores and the cluster; a network match costs no store call; reloaded lists.

#[macro_use]
mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Request, StatusCode};
use support::http::{App, PROBLEM_JSON, Reply, Seen, send};
use support::{RedisCluster, RedisServer};
use tower_ratelimit::key::{Cidr, ClientIp, HeaderKey, Key};
use tower_ratelimit::lists::{Entry, Lists};
use tower_ratelimit::response::DENIED;
use tower_ratelimit::{
    Clock, LimitError, ManualClock, MemoryStore, Policy, RateLimitLayer, RedisStore, Store,
};

/// The oldest networks listed at runtime a request is decided on (read again from Redis
/// before a request that finds them older).
const READ_EVERY: Duration = Duration::from_secs(1);

/// The lists of these tests: networks and keys on both, behind the proxy 10.0.0.1.
fn lists() -> Lists {
    Lists::new()
        .deny(["203.0.113.0/24", "2001:db8:bad::/48", "scraper"])
        .allow(["198.51.100.0/24", "monitor"])
        .client_ip(ClientIp::new(["10.0.0.1"]).unwrap())
}

/// 3 requests an hour per `x-key`, with `lists`, on `store` (the layer's clock `clock`, which
/// an entry's end is read on).
fn layer<St: Store>(store: St, lists: Lists, clock: &ManualClock) -> RateLimitLayer<St> {
    RateLimitLayer::builder()
        .clock(clock.clone())
        .policy(Policy::gcra("3/h").name("per-key"))
        .key(HeaderKey::try_new("x-key").unwrap())
        .lists(lists)
        .store(store)
        .build()
        .unwrap()
}

fn app<St: Store>(layer: &RateLimitLayer<St>) -> App {
    support::http::app(layer, &Seen::default())
}

/// A request of `key` from `peer`, with an `X-Forwarded-For` when `xff` is not empty.
async fn ask(app: &App, key: &str, peer: &str, xff: &str) -> Reply {
    let mut request = Request::builder().header("x-key", key);
    if !xff.is_empty() {
        request = request.header("x-forwarded-for", xff);
    }
    let mut request = request.body(()).unwrap();
    let peer = std::net::SocketAddr::new(peer.parse().unwrap(), 40000);
    request.extensions_mut().insert(peer);
    send(app, request).await
}

/// Asserts a `403` of the lists' problem type, saying `detail`.
fn assert_denied(reply: &Reply, detail: &str) {
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some(PROBLEM_JSON));
    let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["type"], DENIED);
    assert_eq!(body["status"], 403);
    assert_eq!(body["detail"], detail);
    assert!(reply.header("retry-after").is_none());
}

const NETWORK: &str = "the client's network is on the deny list";
const KEY: &str = "the client's key is on the deny list";

/// What the lists given to the layer decide, on `store`.
async fn given_lists<St: Store>(store: St) {
    let layer = layer(store, lists(), &ManualClock::new());
    let app = app(&layer);
    // A denied network, from the client itself or through the trusted proxy; IPv6 too.
    assert_denied(&ask(&app, "a", "203.0.113.9", "").await, NETWORK);
    assert_denied(&ask(&app, "a", "10.0.0.1", "203.0.113.5").await, NETWORK);
    assert_denied(&ask(&app, "a", "2001:db8:bad::7", "").await, NETWORK);
    // A denied key, from anywhere.
    assert_denied(&ask(&app, "scraper", "192.0.2.1", "").await, KEY);
    // An allowed network through the proxy: never limited, no headers.
    for _ in 0..10 {
        let reply = ask(&app, "b", "10.0.0.1", "198.51.100.7").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.remaining().is_none());
    }
    // ... and not counted: key b has its 3 requests.
    let peek = layer.control().peek(&Key::from("b")).await.unwrap();
    assert_eq!(peek.outcomes()[0].remaining(), 3);
    // The same address in a header a client wrote itself is not believed.
    for expected in [StatusCode::OK, StatusCode::OK, StatusCode::OK] {
        assert_eq!(
            ask(&app, "c", "192.0.2.1", "198.51.100.7").await.status,
            expected
        );
    }
    assert_eq!(
        ask(&app, "c", "192.0.2.1", "198.51.100.7").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Nor is a spoofed denied address: the client's own address is matched.
    assert_eq!(
        ask(&app, "d", "192.0.2.1", "203.0.113.5").await.status,
        StatusCode::OK
    );
    // An allowed key; a key on both lists is denied.
    for _ in 0..5 {
        assert_eq!(
            ask(&app, "monitor", "192.0.2.1", "").await.status,
            StatusCode::OK
        );
    }
    assert_denied(&ask(&app, "monitor", "203.0.113.9", "").await, NETWORK);
    // Reloaded: the new lists count, the old ones no more.
    layer
        .control()
        .reload_lists(
            &Lists::new()
                .deny(["d"])
                .client_ip(ClientIp::new(["10.0.0.1"]).unwrap()),
        )
        .unwrap();
    assert_denied(&ask(&app, "d", "192.0.2.1", "").await, KEY);
    assert_eq!(
        ask(&app, "e", "203.0.113.9", "").await.status,
        StatusCode::OK
    );
    let bad = layer
        .control()
        .reload_lists(&Lists::new().deny(["10.0.0.0/33"]));
    assert!(bad.unwrap_err().to_string().contains("deny list"));
    assert_denied(&ask(&app, "d", "192.0.2.1", "").await, KEY);
}

#[tokio::test]
async fn given_lists_in_memory() {
    given_lists(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_lists_on_redis_a_network_costs_no_store_call() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .prefix("given:")
        .build()
        .await
        .unwrap();
    given_lists(store.clone()).await;
    let layer = layer(store, lists(), &ManualClock::new());
    let app = app(&layer);
    let calls = server.calls("fcall") + server.calls("evalsha");
    for _ in 0..5 {
        assert_denied(&ask(&app, "f", "203.0.113.9", "").await, NETWORK);
        ask(&app, "g", "10.0.0.1", "198.51.100.7").await;
    }
    assert_eq!(server.calls("fcall") + server.calls("evalsha"), calls);
    support::assert_no_key_without_ttl(&server, "given:");
}

/// The time `after` from `clock`'s present, as a `SystemTime`.
fn at(clock: &ManualClock, after: Duration) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(clock.now_micros()) + after
}

/// Entries added at runtime on `one`, obeyed by `two` (another layer on the same store) from
/// its next request, and ending at their time on `clock`.
async fn runtime_entries<St: Store>(one: St, two: St, clock: ManualClock) {
    let plain = || Lists::new();
    let (one, two) = (layer(one, plain(), &clock), layer(two, plain(), &clock));
    let app = app(&two);
    let k = |name: &str| Key::from(name);
    // Denied for 10 s: refused at once by the other instance, again after 9.9 s, not at 10 s.
    one.control()
        .deny_key(&k("x"), Some(at(&clock, Duration::from_secs(10))))
        .await
        .unwrap();
    assert_denied(&ask(&app, "x", "192.0.2.1", "").await, KEY);
    assert_eq!(ask(&app, "y", "192.0.2.1", "").await.status, StatusCode::OK);
    clock.advance(Duration::from_millis(9_900));
    assert_denied(&ask(&app, "x", "192.0.2.1", "").await, KEY);
    clock.advance(Duration::from_millis(100));
    let reply = ask(&app, "x", "192.0.2.1", "").await;
    assert_eq!(reply.status, StatusCode::OK);
    // The denied requests were not counted.
    assert_eq!(reply.remaining(), Some(2));
    // Denied for good, then taken off.
    one.control().deny_key(&k("x"), None).await.unwrap();
    clock.advance(Duration::from_secs(30 * 86_400));
    assert_denied(&ask(&app, "x", "192.0.2.1", "").await, KEY);
    one.control().remove_denied(&k("x")).await.unwrap();
    assert_eq!(ask(&app, "x", "192.0.2.1", "").await.status, StatusCode::OK);
    // Allowed for a minute: never limited, not counted, then limited again from 3.
    one.control()
        .allow_key(&k("z"), Some(at(&clock, Duration::from_secs(60))))
        .await
        .unwrap();
    for _ in 0..10 {
        let reply = ask(&app, "z", "192.0.2.1", "").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(
            reply.remaining().is_none(),
            "an allowed request has no headers"
        );
    }
    clock.advance(Duration::from_secs(60));
    assert_eq!(ask(&app, "z", "192.0.2.1", "").await.remaining(), Some(2));
    // On both lists: denied.
    one.control().allow_key(&k("w"), None).await.unwrap();
    one.control().deny_key(&k("w"), None).await.unwrap();
    assert_denied(&ask(&app, "w", "192.0.2.1", "").await, KEY);
    one.control().remove_denied(&k("w")).await.unwrap();
    assert!(ask(&app, "w", "192.0.2.1", "").await.remaining().is_none());
    one.control().remove_allowed(&k("w")).await.unwrap();
    assert_eq!(ask(&app, "w", "192.0.2.1", "").await.remaining(), Some(2));
    // An end that is not after the present is an error, and the entry stays: a PUT is never
    // a removal (the end at the layer's present included).
    one.control().deny_key(&k("v"), None).await.unwrap();
    for until in [UNIX_EPOCH, at(&clock, Duration::ZERO)] {
        let refused = one.control().deny_key(&k("v"), Some(until)).await;
        assert!(matches!(refused, Err(LimitError::Until(_))), "{refused:?}");
        let refused = one.control().allow_key(&k("v"), Some(until)).await;
        assert!(matches!(refused, Err(LimitError::Until(_))), "{refused:?}");
    }
    let far = UNIX_EPOCH + Duration::from_secs(1 << 40);
    let refused = one.control().deny_key(&k("v"), Some(far)).await;
    assert!(matches!(refused, Err(LimitError::Until(_))), "{refused:?}");
    assert_denied(&ask(&app, "v", "192.0.2.1", "").await, KEY);
    // A key's own limit: the same.
    let refused = one
        .control()
        .set_limit("per-key", &k("v"), "5/h", Some(UNIX_EPOCH))
        .await;
    assert!(matches!(refused, Err(LimitError::Until(_))), "{refused:?}");
}

/// The deny cache forgets a key that is reset, allowed, or given a limit of its own: the
/// administrator's word is obeyed at once by the instance that gave it.
async fn the_deny_cache_obeys_the_administrator<St: Store>(store: St, clock: ManualClock) {
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .policy(Policy::gcra("3/h").name("cached"))
        .key(HeaderKey::try_new("x-key").unwrap())
        .lists(Lists::new())
        .deny_cache(1000)
        .store(store)
        .build()
        .unwrap();
    let app = app(&layer);
    let k = Key::from("c");
    let limited = || async {
        for _ in 0..3 {
            ask(&app, "c", "192.0.2.1", "").await;
        }
        assert_eq!(
            ask(&app, "c", "192.0.2.1", "").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    };
    limited().await;
    layer.control().reset(&k).await.unwrap();
    assert_eq!(
        ask(&app, "c", "192.0.2.1", "").await.status,
        StatusCode::OK,
        "reset"
    );
    limited().await;
    layer.control().allow_key(&k, None).await.unwrap();
    assert_eq!(
        ask(&app, "c", "192.0.2.1", "").await.status,
        StatusCode::OK,
        "allowed"
    );
    layer.control().remove_allowed(&k).await.unwrap();
    assert_eq!(
        ask(&app, "c", "192.0.2.1", "").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    layer
        .control()
        .set_limit("cached", &k, "100/h", None)
        .await
        .unwrap();
    assert_eq!(
        ask(&app, "c", "192.0.2.1", "").await.status,
        StatusCode::OK,
        "a new limit"
    );
}

#[tokio::test]
async fn the_deny_cache_obeys_the_administrator_in_memory() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    the_deny_cache_obeys_the_administrator(store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_obeys_the_administrator_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = server.store("cached:", &clock).await;
    the_deny_cache_obeys_the_administrator(store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_obeys_the_administrator_on_the_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let store = cluster.store("cached:", &clock).await;
    the_deny_cache_obeys_the_administrator(store, clock).await;
}

on_two_of_each_store!(
    runtime_entries,
    "lists:",
    runtime_entries_in_memory,
    runtime_entries_on_two_instances_of_one_redis,
    runtime_entries_on_the_cluster
);

/// On Redis, a key with no runtime entry costs its lists one `GET` of its record, in the
/// policy's own call (the script then decides the policy alone); once an entry is there, the
/// record is read in the same call, and its end is obeyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_entries_costs_its_lists_one_get_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let without = RateLimitLayer::builder()
        .clock(clock.clone())
        .policy(Policy::gcra("3/h").name("per-key"))
        .key(HeaderKey::try_new("x-key").unwrap())
        .store(server.store("alone:", &clock).await)
        .build()
        .unwrap();
    let gets = server.calls("get");
    assert_eq!(
        ask(&app(&without), "a", "192.0.2.1", "").await.remaining(),
        Some(2)
    );
    let policy_alone = server.calls("get") - gets;
    let layer = layer(server.store("looks:", &clock).await, Lists::new(), &clock);
    let app = app(&layer);
    // The first request has the networks listed at runtime read (a `GET` of their own, once
    // a second), which is let pass first.
    let gets = server.calls("get");
    ask(&app, "w", "192.0.2.1", "").await;
    let read = gets + policy_alone + 2;
    support::wait_until(Duration::from_secs(10), "the networks read", || {
        server.calls("get") >= read
    });
    let gets = server.calls("get");
    let reply = ask(&app, "a", "192.0.2.1", "").await;
    assert_eq!(reply.remaining(), Some(2));
    assert_eq!(server.calls("get"), gets + policy_alone + 1);
    assert_eq!(server.calls("exists"), 0);
    layer
        .control()
        .deny_key(&Key::from("a"), Some(at(&clock, Duration::from_secs(5))))
        .await
        .unwrap();
    let gets = server.calls("get");
    assert_denied(&ask(&app, "a", "192.0.2.1", "").await, KEY);
    assert!(server.calls("get") > gets, "the record is read");
    clock.advance(Duration::from_secs(5));
    let reply = ask(&app, "a", "192.0.2.1", "").await;
    assert_eq!((reply.status, reply.remaining()), (StatusCode::OK, Some(1)));
    support::assert_no_key_without_ttl(&server, "looks:");
}

/// A key's entries beside policies keyed otherwise (per user, and a global policy): the
/// record is the lists' key's, read before any policy (on the cluster in a slot of its own,
/// read first), and a listed key charges none of them.
async fn entries_beside_other_keys<St: Store>(one: St, two: St, clock: ManualClock) {
    let layer = |store: St| {
        RateLimitLayer::builder()
            .clock(clock.clone())
            .policy(
                Policy::gcra("3/h")
                    .name("per-user")
                    .key(HeaderKey::try_new("x-user").unwrap()),
            )
            .policy(
                Policy::fixed_window("100/h")
                    .name("all")
                    .key(tower_ratelimit::key::GlobalKey),
            )
            .key(HeaderKey::try_new("x-key").unwrap())
            .lists(Lists::new())
            .store(store)
            .build()
            .unwrap()
    };
    let (one, two) = (layer(one), layer(two));
    let app = app(&two);
    let ask = async |key: &str| {
        let request = Request::builder()
            .header("x-key", key)
            .header("x-user", "u");
        let mut request = request.body(()).unwrap();
        let peer = std::net::SocketAddr::new("192.0.2.1".parse().unwrap(), 40000);
        request.extensions_mut().insert(peer);
        send(&app, request).await
    };
    assert_eq!(ask("a").await.remaining(), Some(2));
    one.control().deny_key(&Key::from("a"), None).await.unwrap();
    assert_denied(&ask("a").await, KEY);
    one.control()
        .allow_key(&Key::from("b"), None)
        .await
        .unwrap();
    for _ in 0..5 {
        assert!(ask("b").await.remaining().is_none(), "allowed: not counted");
    }
    // Neither the denied nor the allowed requests were counted by either policy.
    assert_eq!(ask("c").await.remaining(), Some(1));
    one.control().remove_denied(&Key::from("a")).await.unwrap();
    assert_eq!(ask("a").await.remaining(), Some(0));
}

on_two_of_each_store!(
    entries_beside_other_keys,
    "beside:",
    entries_beside_other_keys_in_memory,
    entries_beside_other_keys_on_two_instances_of_one_redis,
    entries_beside_other_keys_on_the_cluster
);

/// Networks put on the lists at runtime on `one`: obeyed by `one` at once and by `two`
/// (another layer on the same store; in Redis, another instance) within its next read, ending
/// at their time on `clock`, lifted by a removal, refused past their number.
async fn runtime_networks<St: Store>(one: St, two: St, clock: ManualClock) {
    let plain = || Lists::new().client_ip(ClientIp::new(["10.0.0.1"]).unwrap());
    let (one, two) = (layer(one, plain(), &clock), layer(two, plain(), &clock));
    let (app_one, app_two) = (app(&one), app(&two));
    let net = |text: &str| text.parse::<Cidr>().unwrap();
    one.control()
        .deny_network(net("192.0.2.0/24"), None)
        .await
        .unwrap();
    assert_denied(&ask(&app_one, "a", "192.0.2.7", "").await, NETWORK);
    assert_denied(&ask(&app_one, "a", "::ffff:192.0.2.7", "").await, NETWORK);
    // The address behind the trusted proxy, not the proxy's.
    assert_denied(&ask(&app_one, "a", "10.0.0.1", "192.0.2.9").await, NETWORK);
    assert_eq!(
        ask(&app_one, "a", "10.0.0.1", "198.51.100.1").await.status,
        StatusCode::OK
    );
    // The other instance's next request after the interval reads the networks first.
    clock.advance(READ_EVERY);
    assert_denied(&ask(&app_two, "b", "192.0.2.8", "").await, NETWORK);
    // Allowed for ten seconds: neither limited nor counted, on both, then counted again.
    let until = at(&clock, Duration::from_secs(10));
    one.control()
        .allow_network(net("2001:db8::/32"), Some(until))
        .await
        .unwrap();
    clock.advance(READ_EVERY);
    for app in [&app_one, &app_two] {
        for _ in 0..5 {
            let reply = ask(app, "c", "2001:db8::1", "").await;
            assert_eq!(reply.status, StatusCode::OK);
            assert!(reply.remaining().is_none(), "allowed: not counted");
        }
    }
    // A denial wins over an allowed network.
    one.control()
        .deny_network(net("2001:db8:bad::/48"), None)
        .await
        .unwrap();
    assert_denied(&ask(&app_one, "c", "2001:db8:bad::1", "").await, NETWORK);
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        ask(&app_one, "c", "2001:db8::1", "").await.remaining(),
        Some(2)
    );
    assert_eq!(
        ask(&app_two, "c", "2001:db8::1", "").await.remaining(),
        Some(1)
    );
    // Taken off: lifted on this instance at once, on the other within its next read.
    one.control()
        .remove_denied_network(net("192.0.2.0/24"))
        .await
        .unwrap();
    assert_eq!(
        ask(&app_one, "d", "192.0.2.7", "").await.status,
        StatusCode::OK
    );
    clock.advance(READ_EVERY);
    assert_eq!(
        ask(&app_two, "e", "192.0.2.8", "").await.status,
        StatusCode::OK
    );
    // An end already past is refused, and the entry stays.
    let refused = one
        .control()
        .deny_network(net("2001:db8:bad::/48"), Some(UNIX_EPOCH))
        .await;
    assert!(matches!(refused, Err(LimitError::Until(_))), "{refused:?}");
    assert_denied(&ask(&app_one, "c", "2001:db8:bad::1", "").await, NETWORK);
    // At most a thousand.
    for i in 0..999u32 {
        let network = Cidr::host(std::net::Ipv4Addr::from(0x0a00_0000 + i).into());
        one.control().deny_network(network, None).await.unwrap();
    }
    let refused = one.control().deny_network(net("198.18.0.0/15"), None).await;
    assert!(
        matches!(refused, Err(LimitError::Network(_))),
        "{refused:?}"
    );
    one.control()
        .remove_denied_network(net("2001:db8:bad::/48"))
        .await
        .unwrap();
    one.control()
        .deny_network(net("198.18.0.0/15"), None)
        .await
        .unwrap();
}

/// An instance idle past the interval reads the networks before it decides its next request:
/// a network denied on `one` while `two` was idle denies `two`'s next request, and lifted,
/// lets its next one through, however long it was idle (on Redis it went on what it had read
/// before: within the interval, what it read is what it obeys).
async fn an_idle_instance_obeys_the_networks_at_its_next_request<St: Store>(
    one: St,
    two: St,
    clock: ManualClock,
) {
    let (one, two) = (
        layer(one, Lists::new(), &clock),
        layer(two, Lists::new(), &clock),
    );
    let app_two = app(&two);
    let net: Cidr = "192.0.2.0/24".parse().unwrap();
    assert_eq!(
        ask(&app_two, "a", "192.0.2.7", "").await.status,
        StatusCode::OK
    );
    one.control().deny_network(net, None).await.unwrap();
    clock.advance(READ_EVERY);
    assert_denied(&ask(&app_two, "b", "192.0.2.7", "").await, NETWORK);
    one.control().remove_denied_network(net).await.unwrap();
    clock.advance(READ_EVERY + Duration::from_millis(1));
    assert_eq!(
        ask(&app_two, "c", "192.0.2.7", "").await.status,
        StatusCode::OK
    );
    // Idle an hour: its first request is decided on what is stored then.
    one.control().deny_network(net, None).await.unwrap();
    clock.advance(Duration::from_secs(3600));
    assert_denied(&ask(&app_two, "d", "192.0.2.7", "").await, NETWORK);
}

on_two_of_each_store!(
    an_idle_instance_obeys_the_networks_at_its_next_request,
    "nets-idle:",
    an_idle_instance_obeys_the_networks_at_its_next_request_in_memory,
    an_idle_instance_obeys_the_networks_at_its_next_request_on_two_instances_of_one_redis,
    an_idle_instance_obeys_the_networks_at_its_next_request_on_the_cluster
);

/// The runtime operations take the entries `Lists::deny` and `Lists::allow` take, meaning the
/// same: text parsed as an `Entry` (a network or an address: the client's address; anything
/// else: a key), put on `one` and obeyed by `two`, then taken off.
async fn entries_as_the_lists_take_them<St: Store>(one: St, two: St, clock: ManualClock) {
    let plain = || Lists::new().client_ip(ClientIp::new(["10.0.0.1"]).unwrap());
    let (one, two) = (layer(one, plain(), &clock), layer(two, plain(), &clock));
    let app_two = app(&two);
    let entry = |text: &str| text.parse::<Entry>().unwrap();
    assert!(matches!(entry("192.0.2.0/24"), Entry::Network(_)));
    assert!(matches!(entry("198.51.100.7"), Entry::Network(_)));
    assert!(matches!(entry("scraper"), Entry::Key(_)));
    for bad in ["", " ", "10.0.0.0/33", "scraper/7"] {
        assert!(bad.parse::<Entry>().is_err(), "{bad:?} is no entry");
    }
    // A key: refused by the other instance from its next request.
    one.control().deny(entry("scraper"), None).await.unwrap();
    assert_denied(&ask(&app_two, "scraper", "192.0.2.200", "").await, KEY);
    // A network, and an address: the client's address, within the other's next read.
    one.control()
        .deny(entry("192.0.2.0/24"), None)
        .await
        .unwrap();
    one.control()
        .deny(entry("198.51.100.7"), None)
        .await
        .unwrap();
    clock.advance(READ_EVERY);
    for peer in ["192.0.2.9", "198.51.100.7"] {
        assert_denied(&ask(&app_two, "a", peer, "").await, NETWORK);
    }
    // The address alone: its neighbour is not denied.
    assert_eq!(
        ask(&app_two, "c", "198.51.100.8", "").await.status,
        StatusCode::OK
    );
    // Allowed: neither limited nor counted.
    one.control().allow(entry("monitor"), None).await.unwrap();
    for _ in 0..5 {
        let reply = ask(&app_two, "monitor", "203.0.113.1", "").await;
        assert!(reply.remaining().is_none(), "allowed: not counted");
    }
    // Taken off, each as it was put on (a `&Key` is an entry too).
    one.control()
        .remove_denied(&Key::from("scraper"))
        .await
        .unwrap();
    one.control()
        .remove_denied(entry("192.0.2.0/24"))
        .await
        .unwrap();
    one.control()
        .remove_denied(entry("198.51.100.7"))
        .await
        .unwrap();
    one.control()
        .remove_allowed(entry("monitor"))
        .await
        .unwrap();
    assert_eq!(
        ask(&app_two, "scraper", "203.0.113.1", "")
            .await
            .remaining(),
        Some(2)
    );
    assert_eq!(
        ask(&app_two, "monitor", "203.0.113.1", "")
            .await
            .remaining(),
        Some(2)
    );
    clock.advance(READ_EVERY);
    for peer in ["192.0.2.9", "198.51.100.7"] {
        assert_eq!(ask(&app_two, "b", peer, "").await.status, StatusCode::OK);
    }
}

on_two_of_each_store!(
    entries_as_the_lists_take_them,
    "entries-text:",
    entries_as_the_lists_take_them_in_memory,
    entries_as_the_lists_take_them_on_two_instances_of_one_redis,
    entries_as_the_lists_take_them_on_the_cluster
);

on_two_of_each_store!(
    runtime_networks,
    "nets:",
    runtime_networks_in_memory,
    runtime_networks_on_two_instances_of_one_redis,
    runtime_networks_on_the_cluster
);

/// A layer without lists kept in the store lists no network.
#[tokio::test]
async fn a_network_needs_lists_kept_in_the_store() {
    let clock = ManualClock::new();
    let kept = Lists::new().kept_in_store(false);
    let net: Cidr = "192.0.2.0/24".parse().unwrap();
    let refused = layer(MemoryStore::new(), kept, &clock)
        .control()
        .deny_network(net, None)
        .await;
    assert!(matches!(refused, Err(LimitError::NoLists)), "{refused:?}");
}

#[tokio::test]
async fn mistakes_are_errors() {
    let build = |lists: Lists| {
        RateLimitLayer::builder()
            .policy(Policy::gcra("1/s"))
            .lists(lists)
            .build()
            .map(drop)
            .unwrap_err()
            .to_string()
    };
    assert!(build(Lists::new().deny(["10.0.0.0/33"])).contains("deny list"));
    assert!(build(Lists::new().allow(["2001:db8::/abc"])).contains("allow list"));
    assert!(build(Lists::new().allow([" "])).contains("empty entry"));
    // Runtime entries need lists kept in the store.
    let without = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s"))
        .build()
        .unwrap();
    let error = without
        .control()
        .deny_key(&Key::from("k"), None)
        .await
        .unwrap_err();
    assert!(matches!(error, LimitError::NoLists), "{error}");
    let static_only = layer(
        MemoryStore::new(),
        Lists::new().kept_in_store(false),
        &ManualClock::new(),
    );
    let error = static_only
        .control()
        .allow_key(&Key::from("k"), None)
        .await
        .unwrap_err();
    assert!(matches!(error, LimitError::NoLists), "{error}");
    assert!(without.control().reload_lists(&Lists::new()).is_err());
}

#[cfg(feature = "toml")]
#[test]
fn lists_from_the_configuration_file() {
    let limits = tower_ratelimit::config::Limits::from_toml(
        r#"
        trusted_proxies = ["10.0.0.1"]
        key = "header:x-key"
        deny = ["203.0.113.0/24", "scraper"]
        allow = ["monitor"]
        [[policy]]
        quota = "3/h"
        "#,
    )
    .unwrap();
    assert!(limits.has_lists());
    let lists = limits.lists().unwrap();
    assert!(format!("{lists:?}").contains("scraper"));
    let bad = tower_ratelimit::config::Limits::from_toml(
        "deny = [\"10.0.0.0/40\"]\n[[policy]]\nquota = \"1/s\"\n",
    )
    .unwrap();
    assert!(bad.lists().unwrap_err().to_string().contains("deny list"));
    // A key entry where the file's keys are addresses: refused, naming it.
    let never = tower_ratelimit::config::Limits::from_toml(
        "deny = [\"scraper\"]\n[[policy]]\nquota = \"1/s\"\n",
    )
    .unwrap();
    let error = never.lists().unwrap_err().to_string();
    assert!(
        error.contains("\"scraper\"") && error.contains("IP address"),
        "{error}"
    );
}

/// The file's lists follow its `key`, or `lists_key`: an entry the key never makes says which
/// key the lists follow and which policy has another; with `lists_key` set to that policy's
/// key, its entries deny its requests.
#[cfg(feature = "toml")]
#[tokio::test]
async fn the_files_entries_follow_the_lists_key() {
    let file = |lists_key: &str| {
        let text = format!(
            "key = \"ip\"\n{lists_key}deny = [\"alice\"]\n[[policy]]\nname = \"reports\"\nquota = \"3/h\"\nkey = \"header:x-key\"\n"
        );
        tower_ratelimit::config::Limits::from_toml(&text).unwrap()
    };
    let error = file("").lists().unwrap_err().to_string();
    assert!(
        error.contains(r#"the lists' keys are made by key = "ip""#)
            && error
                .contains(r#"policy "reports" has a key of its own: lists_key = "header:x-key""#),
        "{error}"
    );
    let limits = file("lists_key = \"header:x-key\"\n");
    assert!(
        limits
            .lists_follow()
            .contains(r#"lists_key = "header:x-key""#)
    );
    let layer = RateLimitLayer::builder()
        .policies(limits.policies().unwrap())
        .lists(limits.lists().unwrap())
        .build()
        .unwrap();
    let app = app(&layer);
    assert_denied(&ask(&app, "alice", "192.0.2.1", "").await, KEY);
    assert_eq!(
        ask(&app, "bob", "192.0.2.1", "").await.status,
        StatusCode::OK
    );
    layer
        .control()
        .deny_key(&Key::from("bob"), None)
        .await
        .unwrap();
    assert_denied(&ask(&app, "bob", "192.0.2.1", "").await, KEY);
}

/// A request from `peer` with an optional bearer token and `X-Forwarded-For`.
async fn from(app: &App, peer: &str, token: Option<&str>, xff: &str) -> Reply {
    let mut request = Request::builder();
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if !xff.is_empty() {
        request = request.header("x-forwarded-for", xff);
    }
    let mut request = request.body(()).unwrap();
    let peer = std::net::SocketAddr::new(peer.parse().unwrap(), 40000);
    request.extensions_mut().insert(peer);
    send(app, request).await
}

/// Entries name requests as the layer's key makes keys of them: an address in any form,
/// grouped as the key groups (IPv6 by /64), a token hashed; what no request can have is
/// refused. On two instances of `store` (`one` adds, `two` answers).
async fn entries_match<St: Store>(one: St, two: St, clock: ManualClock) {
    let by_address = |store: St| {
        RateLimitLayer::builder()
            .clock(clock.clone())
            .policy(Policy::gcra("3/h").name("per-ip"))
            .key(tower_ratelimit::key::PeerIp::new())
            .lists(Lists::new())
            .store(store)
            .build()
            .unwrap()
    };
    let (admin, served) = (by_address(one.clone()), by_address(two.clone()));
    let served = app(&served);
    // ::1 in its long form, an address of a /64 by another, a mapped IPv4 address.
    admin
        .control()
        .deny_key(&Key::from("0:0:0:0:0:0:0:1"), None)
        .await
        .unwrap();
    assert_denied(&from(&served, "::1", None, "").await, KEY);
    let v6: std::net::IpAddr = "2001:db8:1:2::7".parse().unwrap();
    admin
        .control()
        .deny_key(&Key::from(v6), None)
        .await
        .unwrap();
    assert_denied(&from(&served, "2001:db8:1:2::99", None, "").await, KEY);
    assert_eq!(
        from(&served, "2001:db8:1:3::7", None, "").await.status,
        StatusCode::OK
    );
    admin
        .control()
        .allow_key(&Key::from("::ffff:127.0.0.1"), None)
        .await
        .unwrap();
    for _ in 0..5 {
        let reply = from(&served, "127.0.0.1", None, "").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.remaining().is_none(), "allowed");
    }
    admin
        .control()
        .set_limit("per-ip", &Key::from("[::ffff:127.0.0.2]"), "100/h", None)
        .await
        .unwrap();
    let reply = from(&served, "127.0.0.2", None, "").await;
    assert_eq!(reply.remaining(), Some(99), "its own limit");
    // What no request has: refused, naming why.
    for refused in ["alice", "127.0.0.01", "203.0.113.0/24", ""] {
        let denied = admin.control().deny_key(&Key::from(refused), None).await;
        assert!(
            matches!(denied, Err(LimitError::Entry(_))),
            "{refused}: {denied:?}"
        );
        let limited = admin
            .control()
            .set_limit("per-ip", &Key::from(refused), "5/h", None)
            .await;
        assert!(
            matches!(limited, Err(LimitError::Entry(_))),
            "{refused}: {limited:?}"
        );
    }
    admin
        .control()
        .remove_denied(&Key::from("::1"))
        .await
        .unwrap();
    assert_eq!(from(&served, "::1", None, "").await.status, StatusCode::OK);

    // An API key, or else the client's address behind a trusted proxy: an entry names the
    // part that makes it, and the networks are matched against the address the key finds.
    let either = |store: St| {
        let client = ClientIp::new(["10.0.0.1"]).unwrap();
        RateLimitLayer::builder()
            .clock(clock.clone())
            .policy(Policy::gcra("3/h").name("either"))
            .key(tower_ratelimit::key::KeyExtractor::or(
                tower_ratelimit::key::ApiKey::bearer(),
                client,
            ))
            .lists(Lists::new().deny(["198.51.100.0/24"]))
            .store(store)
            .build()
            .unwrap()
    };
    let (admin, served) = (either(one), either(two));
    let served = app(&served);
    admin
        .control()
        .deny_key(&Key::from(v6), None)
        .await
        .unwrap();
    assert_denied(&from(&served, "2001:db8:1:2::1", None, "").await, KEY);
    admin
        .control()
        .deny_key(&Key::from("s3cret-t0ken"), None)
        .await
        .unwrap();
    assert_denied(
        &from(&served, "192.0.2.9", Some("s3cret-t0ken"), "").await,
        KEY,
    );
    assert_eq!(
        from(&served, "192.0.2.9", Some("another"), "").await.status,
        StatusCode::OK
    );
    assert_denied(
        &from(&served, "10.0.0.1", Some("another"), "198.51.100.7").await,
        NETWORK,
    );
}

#[tokio::test]
async fn entries_match_in_memory() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    entries_match(store.clone(), store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_match_on_two_instances_of_one_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = || server.store("entries:", &clock);
    entries_match(store().await, store().await, clock.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_match_on_the_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let one = cluster.store("entries:", &clock).await;
    let two = cluster.store("entries:", &clock).await;
    entries_match(one, two, clock).await;
}

/// The lists given to the layer refuse at build an entry the key never makes.
#[test]
fn given_entries_the_key_never_makes_are_errors() {
    let build = |lists: Lists| {
        RateLimitLayer::builder()
            .policy(Policy::gcra("3/h"))
            .key(tower_ratelimit::key::PeerIp::new())
            .lists(lists)
            .build()
            .map(drop)
    };
    let error = build(Lists::new().deny(["alice"])).unwrap_err().to_string();
    assert!(error.contains("\"alice\""), "{error}");
    let error = build(Lists::new().allow(["127.0.0.01"]))
        .unwrap_err()
        .to_string();
    assert!(error.contains("allow list"), "{error}");
    build(Lists::new().deny(["::1", "10.0.0.0/8"])).unwrap();
}

/// Leases spend units without asking the store, and entries kept in the store are read in
/// the store's call: together every request would ask the store, so `build()` and a reload
/// refuse them; lists of given entries only go with leases, as do a configuration file's
/// (its lists then keep nothing in the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_entries_kept_in_the_store_are_refused_together() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let leased = || Policy::gcra("100/s").name("leased").lease(10);
    let build = |lists: Lists, store: RedisStore| {
        RateLimitLayer::builder()
            .policy(leased())
            .lists(lists)
            .store(store)
            .build()
    };
    let error = build(Lists::new(), server.store("leased:", &clock).await)
        .unwrap_err()
        .to_string();
    assert!(error.contains("kept_in_store(false)"), "{error}");
    let given = build(
        Lists::new().deny(["203.0.113.0/24"]).kept_in_store(false),
        server.store("leased:", &clock).await,
    )
    .unwrap();
    assert!(
        given.control().reload_lists(&Lists::new()).is_err(),
        "a reload keeping entries in the store"
    );
    // Without leases first, then a reload that adds them.
    let plain = RateLimitLayer::builder()
        .policy(Policy::gcra("100/s").name("leased"))
        .lists(Lists::new())
        .store(server.store("leased:", &clock).await)
        .build()
        .unwrap();
    assert!(plain.control().reload(vec![leased()]).is_err());
    #[cfg(feature = "toml")]
    {
        let limits = tower_ratelimit::config::Limits::from_toml(
            "deny = [\"203.0.113.0/24\"]\n[[policy]]\nquota = \"100/s\"\nlease = 10\n",
        )
        .unwrap();
        let layer = RateLimitLayer::builder()
            .policies(limits.policies().unwrap())
            .lists(limits.lists().unwrap())
            .store(server.store("leased:", &clock).await)
            .build();
        assert!(layer.is_ok(), "{:?}", layer.err());
    }
}
