//! The optional parts of draft-ietf-httpapi-ratelimit-headers-11, on both stores: the `qu` and
//! `pk` parameters, jitter on the times a response tells, and the problem types of the
//! responses the limiter writes itself. Every field is read back with an RFC 8941/9651 parser
//! (`sfv`), never by hand. Time only moves through a `ManualClock`.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use support::RedisServer;
use support::http::{Reply, send};
use tower::{Layer, service_fn};
use tower_ratelimit::headers::{HeaderStyle, RATELIMIT, RATELIMIT_POLICY};
use tower_ratelimit::key::HeaderKey;
use tower_ratelimit::{
    ManualClock, MemoryStore, Policy, QuotaUnit, RateLimitLayer, RateLimitLayerBuilder, RedisStore,
    Store,
};

const SECRET: &[u8] = b"a secret of at least sixteen bytes";

/// A store and the manual clock it decides on.
struct Env<St> {
    store: St,
    clock: ManualClock,
    name: &'static str,
}

impl<St: Store> Env<St> {
    fn builder(&self) -> RateLimitLayerBuilder<St> {
        RateLimitLayer::builder()
            .store(self.store.clone())
            .clock(self.clock.clone())
            .key(HeaderKey::try_new("x-user").unwrap())
            .headers(HeaderStyle::Both)
    }
}

fn memory() -> Env<MemoryStore> {
    let clock = ManualClock::new();
    Env {
        store: MemoryStore::with_clock(clock.clone()),
        clock,
        name: "memory",
    }
}

async fn redis() -> (Env<RedisStore>, RedisServer) {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = server.store("ietf:", &clock).await;
    let env = Env {
        store,
        clock,
        name: "redis",
    };
    (env, server)
}

fn ok(_: Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>> {
    std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
}

async fn call<St: Store>(layer: &RateLimitLayer<St>, user: &str, bytes: u32) -> Reply {
    let svc = layer.layer(service_fn(
        ok as fn(Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>>,
    ));
    let request = Request::builder()
        .uri("/")
        .header("x-user", user)
        .header("x-bytes", bytes.to_string())
        .body(())
        .unwrap();
    send(&svc, request).await
}

/// One item of `RateLimit-Policy` or `RateLimit`: the policy's name and its parameters.
#[derive(Debug)]
struct Item {
    name: String,
    params: BTreeMap<String, sfv::BareItem>,
}

impl Item {
    fn int(&self, key: &str) -> i64 {
        match self.params.get(key) {
            Some(sfv::BareItem::Integer(n)) => i64::from(*n),
            other => panic!("{}: {key} is {other:?}, not an integer", self.name),
        }
    }

    fn pk(&self) -> Option<Vec<u8>> {
        match self.params.get("pk")? {
            sfv::BareItem::ByteSequence(bytes) => Some(bytes.clone()),
            other => panic!("{}: pk is {other:?}, not a byte sequence", self.name),
        }
    }

    fn qu(&self) -> Option<String> {
        match self.params.get("qu")? {
            sfv::BareItem::String(s) => Some(s.as_str().to_owned()),
            other => panic!("{}: qu is {other:?}, not a string", self.name),
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.params.keys().map(String::as_str).collect()
    }
}

/// A field parsed as an RFC 8941 list of sf-string items.
fn items(reply: &Reply, field: http::HeaderName) -> Vec<Item> {
    let value = reply
        .header(&field)
        .unwrap_or_else(|| panic!("no {field}: {:?}", reply.headers));
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{field}: {value:?} is not a structured-field list: {e}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{field}: an inner list in {value:?}");
            };
            let sfv::BareItem::String(name) = &item.bare_item else {
                panic!("{field}: {:?} is not an sf-string", item.bare_item);
            };
            Item {
                name: name.as_str().to_owned(),
                params: item
                    .params
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                    .collect(),
            }
        })
        .collect()
}

/// Both fields, item by item.
fn fields(reply: &Reply) -> Vec<(Item, Item)> {
    let policies = items(reply, RATELIMIT_POLICY);
    let states = items(reply, RATELIMIT);
    assert_eq!(policies.len(), states.len(), "one item per policy in both");
    policies.into_iter().zip(states).collect()
}

/// Two policies, one counting bytes: `qu` says so for that one only, and `pk` names each
/// key's partition: the same in both fields and for every request and instance with the same
/// secret, different for another key or another secret, and never the key itself.
async fn units_and_partition_keys<St: Store>(env: Env<St>) {
    let n = env.name;
    let build = |secret: &[u8]| {
        env.builder()
            .policy(Policy::gcra("10/s").name("per-user"))
            .policy(
                Policy::token_bucket("1000/min")
                    .name("upload")
                    .unit(QuotaUnit::ContentBytes)
                    .cost(|r| {
                        r.headers()
                            .get("x-bytes")
                            .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
                    }),
            )
            .partition_keys(secret)
            .build()
            .unwrap()
    };
    let layer = build(SECRET);
    let other_instance = build(SECRET);
    let other_secret = build(b"another secret, sixteen bytes or more");

    let r = call(&layer, "alice", 300).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    let alice = fields(&r);
    let names: Vec<&str> = alice.iter().map(|(p, _)| p.name.as_str()).collect();
    assert_eq!(names, ["per-user", "upload"], "{n}");
    for (policy, state) in &alice {
        assert_eq!(
            policy.name, state.name,
            "{n}: the same policies in the same order"
        );
        let mut expected = vec!["pk", "q", "w"];
        if policy.name == "upload" {
            expected.push("qu");
            expected.sort_unstable();
            assert_eq!(policy.qu().as_deref(), Some("content-bytes"), "{n}");
        } else {
            assert_eq!(
                policy.qu(),
                None,
                "{n}: requests are the default, not written"
            );
        }
        assert_eq!(policy.keys(), expected, "{n}: {policy:?}");
        assert_eq!(state.keys(), ["pk", "r", "t"], "{n}: {state:?}");
        let pk = policy.pk().unwrap();
        assert_eq!(pk.len(), 16, "{n}: 128 bits of the HMAC");
        assert_eq!(
            state.pk(),
            Some(pk.clone()),
            "{n}: one pk per item in both fields"
        );
        assert!(
            !pk.windows(5).any(|w| w == b"alice"),
            "{n}: the key never appears"
        );
    }
    let (upload_policy, upload_state) = &alice[1];
    assert_eq!(upload_policy.int("q"), 1000, "{n}");
    assert_eq!(upload_state.int("r"), 700, "{n}: 300 bytes spent");
    let pk_of = |f: &[(Item, Item)]| f[0].0.pk().unwrap();

    let again = fields(&call(&layer, "alice", 1).await);
    assert_eq!(pk_of(&again), pk_of(&alice), "{n}: stable across requests");
    let elsewhere = fields(&call(&other_instance, "alice", 1).await);
    assert_eq!(
        pk_of(&elsewhere),
        pk_of(&alice),
        "{n}: every instance with the secret agrees"
    );
    let bob = fields(&call(&layer, "bob", 1).await);
    assert_ne!(pk_of(&bob), pk_of(&alice), "{n}: another key, another pk");
    let rekeyed = fields(&call(&other_secret, "alice", 1).await);
    assert_ne!(
        pk_of(&rekeyed),
        pk_of(&alice),
        "{n}: another secret, another pk"
    );

    // Without partition keys, no pk.
    let plain = env
        .builder()
        .policy(Policy::gcra("10/s").name("per-user"))
        .build()
        .unwrap();
    for (policy, state) in fields(&call(&plain, "alice", 1).await) {
        assert_eq!(policy.keys(), ["q", "w"], "{n}");
        assert_eq!(state.keys(), ["r", "t"], "{n}");
    }
}

/// With jitter, every limited response's `Retry-After`, `t` and `X-RateLimit-Reset` are its
/// true values delayed by one draw in `[0, max]`: never earlier, never later than the maximum,
/// the same delay for every field of a response, and not the same for every response.
async fn jitter_only_ever_delays<St: Store>(env: Env<St>) {
    let n = env.name;
    let layer = env
        .builder()
        .policy(Policy::fixed_window("2/10s").name("slow"))
        .jitter(Duration::from_secs(5))
        .build()
        .unwrap();
    // A window boundary 2.5 s away: the true Retry-After is 3 (2.5 s rounded up).
    env.clock.advance(Duration::from_millis(7_500));
    for _ in 0..2 {
        assert_eq!(call(&layer, "u", 1).await.status, StatusCode::OK, "{n}");
    }
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..60 {
        let r = call(&layer, "u", 1).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}: {i}");
        let retry = r.num(http::header::RETRY_AFTER).unwrap();
        assert!(
            (3..=8).contains(&retry),
            "{n}: Retry-After {retry} outside the true 3 s plus up to 5 s"
        );
        let (_, state) = &fields(&r)[0];
        assert_eq!(
            state.int("t") as u64,
            retry,
            "{n}: t and Retry-After move together"
        );
        let reset = r.num("x-ratelimit-reset").unwrap();
        assert_eq!(reset, retry, "{n}: the legacy reset too");
        seen.insert(retry);
    }
    assert!(
        seen.len() >= 2,
        "{n}: one delay for every response: {seen:?}"
    );

    // Without jitter, exactly the truth, every time.
    let exact = env
        .builder()
        .policy(Policy::fixed_window("2/10s").name("exact"))
        .build()
        .unwrap();
    for _ in 0..2 {
        call(&exact, "u", 1).await;
    }
    for _ in 0..5 {
        let r = call(&exact, "u", 1).await;
        assert_eq!(r.num(http::header::RETRY_AFTER), Some(3), "{n}");
    }
}

/// A limited request's body is the draft's `quota-exceeded` problem, naming the violated
/// policies as the headers do.
async fn quota_exceeded_problem<St: Store>(env: Env<St>) {
    let n = env.name;
    let layer = env
        .builder()
        .policy(Policy::gcra("1/min").name("per-minute"))
        .policy(Policy::gcra("100/day").name("daily"))
        .build()
        .unwrap();
    assert_eq!(call(&layer, "u", 1).await.status, StatusCode::OK, "{n}");
    let r = call(&layer, "u", 1).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(
        r.header(http::header::CONTENT_TYPE),
        Some("application/problem+json"),
        "{n}"
    );
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        doc["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "{n}: {doc}"
    );
    assert_eq!(doc["status"], 429, "{n}");
    assert_eq!(
        doc["violated-policies"],
        serde_json::json!(["per-minute"]),
        "{n}"
    );
    assert_eq!(doc["retry_after"], 60, "{n}: our own member is kept");
    let violated: Vec<String> = fields(&r)
        .into_iter()
        .filter(|(_, state)| state.int("r") == 0)
        .map(|(p, _)| p.name)
        .collect();
    assert_eq!(violated, ["per-minute"], "{n}: the names the headers use");
}

#[test]
fn configuration_mistakes_fail_the_build() {
    let short = RateLimitLayer::builder()
        .policy(Policy::gcra("10/s"))
        .partition_keys(b"too short")
        .build()
        .unwrap_err();
    assert!(short.to_string().contains("at least 16"), "{short}");

    let concurrent = RateLimitLayer::builder()
        .policy(Policy::gcra("10/s").unit(QuotaUnit::ConcurrentRequests))
        .build()
        .unwrap_err();
    assert!(concurrent.to_string().contains("in flight"), "{concurrent}");
    assert_eq!(
        "content-bytes".parse::<QuotaUnit>().unwrap(),
        QuotaUnit::ContentBytes
    );
    assert!("bytes".parse::<QuotaUnit>().is_err());
}

macro_rules! on_each_store {
    ($($test:ident,)*) => {
        mod in_memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(memory()).await;
                }
            )*
        }

        mod on_redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $test() {
                    let (env, _server) = redis().await;
                    super::$test(env).await;
                }
            )*
        }
    };
}

on_each_store! {
    units_and_partition_keys,
    jitter_only_ever_delays,
    quota_exceeded_problem,
}
