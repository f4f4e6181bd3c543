//! Several policies per layer, on both stores: atomic multi-policy decisions, header syntax
//! (parsed back as RFC 8941 structured fields), cost, refunds and charges after the response,
//! shadow mode, exemptions, tiers and per-route policies.
//!
//! Every scenario is an async function generic over the store, run once on a `MemoryStore` and
//! once on a `RedisStore` backed by a real redis-server the test starts. Time only moves
//! through a `ManualClock`; nothing sleeps.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use support::RedisServer;
use tower::{Service, ServiceBuilder, service_fn};
use tower_ratelimit::headers::{
    HeaderStyle, RATELIMIT, RATELIMIT_POLICY, ResetFormat, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use tower_ratelimit::key::{HeaderKey, Key, RequestRef};
use tower_ratelimit::{
    Decision, ManualClock, MemoryStore, Policy, PolicyOutcome, RateLimitLayer,
    RateLimitLayerBuilder, RedisStore, Store, body::ResponseBody,
};

// ---------------------------------------------------------------------------------------------
// Stores
// ---------------------------------------------------------------------------------------------

/// A store and the manual clock it decides on.
struct Env<St> {
    store: St,
    clock: ManualClock,
    /// `memory` or `redis`, for assertion messages.
    name: &'static str,
}

impl<St: Store> Env<St> {
    fn builder(&self) -> RateLimitLayerBuilder<St> {
        RateLimitLayer::builder().store(self.store.clone())
    }
}

/// A memory store on a fresh manual clock at the start of a UTC day.
fn memory() -> Env<MemoryStore> {
    let clock = ManualClock::new();
    Env {
        store: MemoryStore::with_clock(clock.clone()),
        clock,
        name: "memory",
    }
}

/// A Redis store on a redis-server of its own, on a fresh manual clock at the start of a UTC
/// day. Keep the server alive while the store is used.
async fn redis() -> (Env<RedisStore>, RedisServer) {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = RedisStore::builder(&server.url())
        .deadline(std::time::Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .await
        .expect("connect to the test redis-server");
    let env = Env {
        store,
        clock,
        name: "redis",
    };
    (env, server)
}

// ---------------------------------------------------------------------------------------------
// Requests and replies
// ---------------------------------------------------------------------------------------------

fn header_key(name: &str) -> HeaderKey {
    HeaderKey::try_new(name).unwrap()
}

fn has_header(req: &RequestRef<'_>, name: &str) -> bool {
    req.headers().contains_key(name)
}

fn header_u32(req: &RequestRef<'_>, name: &str) -> Option<u32> {
    req.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().parse().unwrap())
}

/// `GET /` with these headers.
fn request(headers: &[(&str, &str)]) -> Request<()> {
    let mut builder = Request::builder().uri("/");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap()
}

/// The inner service: answers with the status in `x-status` (default 200), and copies the
/// request's `Decision` into the response's extensions so the test can read it.
async fn handler(req: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    let status = req
        .headers()
        .get("x-status")
        .map_or(200, |v| v.to_str().unwrap().parse().unwrap());
    let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    if let Some(decision) = req.extensions().get::<Decision>() {
        response.extensions_mut().insert(decision.clone());
    }
    Ok(response)
}

fn service<St: Store>(
    layer: RateLimitLayer<St>,
) -> impl Service<Request<()>, Response = Response<ResponseBody<Full<Bytes>>>, Error = Infallible> + Clone
{
    ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(handler))
}

/// A response with its body read, and the decision it carries: the middleware puts it in the
/// extensions of a limited response, the handler copies it into the others. The shared reply,
/// with what these tests read of it.
#[derive(Debug)]
struct Reply(support::http::Reply);

impl std::ops::Deref for Reply {
    type Target = support::http::Reply;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

async fn send<S, ReqB, B>(svc: &S, req: Request<ReqB>) -> Reply
where
    S: Service<Request<ReqB>, Response = Response<B>> + Clone,
    S::Error: Debug,
    B: http_body::Body,
    B::Error: Debug,
{
    Reply(support::http::send(svc, req).await)
}

/// One policy as the IETF fields describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ietf {
    policy: String,
    q: i64,
    w: i64,
    r: i64,
    t: i64,
}

fn ietf(policy: &str, q: i64, w: i64, r: i64, t: i64) -> Ietf {
    Ietf {
        policy: policy.to_owned(),
        q,
        w,
        r,
        t,
    }
}

impl Reply {
    fn retry_after(&self) -> Option<u64> {
        self.num(RETRY_AFTER)
    }

    /// `(X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset)`.
    fn legacy(&self) -> (Option<u64>, Option<u64>, Option<u64>) {
        (
            self.num(X_RATELIMIT_LIMIT),
            self.num(X_RATELIMIT_REMAINING),
            self.num(X_RATELIMIT_RESET),
        )
    }

    fn has_ietf(&self) -> bool {
        self.headers.contains_key(RATELIMIT) || self.headers.contains_key(RATELIMIT_POLICY)
    }

    fn has_legacy(&self) -> bool {
        [X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET]
            .iter()
            .any(|h| self.headers.contains_key(h))
    }

    /// No rate-limit header of any style, and no `Retry-After`.
    fn has_no_rate_limit_headers(&self) -> bool {
        !self.has_ietf() && !self.has_legacy() && !self.headers.contains_key(RETRY_AFTER)
    }

    fn decision(&self) -> &Decision {
        self.decision
            .as_ref()
            .expect("the response carries a Decision")
    }

    fn outcome(&self, policy: &str) -> &PolicyOutcome {
        self.decision()
            .outcomes()
            .iter()
            .find(|o| o.policy() == policy)
            .unwrap_or_else(|| panic!("no outcome for {policy}"))
    }

    /// Each policy's remaining units, as the decision says.
    fn remaining(&self) -> BTreeMap<String, u64> {
        self.decision()
            .outcomes()
            .iter()
            .map(|o| (o.policy().to_owned(), o.remaining()))
            .collect()
    }

    /// The policies named in the problem+json body's `violated-policies` array (the IETF
    /// draft's member), after checking the document's type and that our own `violated` member
    /// names the same.
    fn violated_in_body(&self) -> Vec<String> {
        let doc: serde_json::Value = serde_json::from_str(&self.body).expect("a JSON body");
        assert_eq!(
            doc["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "{doc}"
        );
        assert_eq!(doc["status"], 429, "{doc}");
        assert_eq!(doc["violated-policies"], doc["violated"], "{doc}");
        let names = doc["violated-policies"]
            .as_array()
            .expect("violated-policies");
        names
            .iter()
            .map(|n| n.as_str().expect("a policy name").to_owned())
            .collect()
    }

    /// `RateLimit-Policy` and `RateLimit` parsed as structured-field lists, joined per policy:
    /// both list the same policies in the same order, `RateLimit-Policy` with exactly the
    /// parameters `q` and `w`, `RateLimit` with exactly `r` and `t`.
    fn ietf(&self) -> Vec<Ietf> {
        let field = |name| {
            let value = self
                .header(&name)
                .unwrap_or_else(|| panic!("no {name} header"));
            parse_sf_list(value).unwrap_or_else(|e| panic!("{name}: {value:?}: {e}"))
        };
        let policies = field(RATELIMIT_POLICY);
        let states = field(RATELIMIT);
        assert_eq!(policies.len(), states.len(), "one item per policy in both");
        policies
            .into_iter()
            .zip(states)
            .map(|((name, policy), (state_name, state))| {
                assert_eq!(name, state_name, "the same policies in the same order");
                let param = |params: &[(String, i64)], key: &str| {
                    params
                        .iter()
                        .find(|(k, _)| k == key)
                        .unwrap_or_else(|| panic!("{name}: no parameter {key}"))
                        .1
                };
                let mut policy_keys: Vec<&str> = policy.iter().map(|(k, _)| k.as_str()).collect();
                policy_keys.sort_unstable();
                assert_eq!(
                    policy_keys,
                    ["q", "w"],
                    "{name}: RateLimit-Policy parameters"
                );
                let mut state_keys: Vec<&str> = state.iter().map(|(k, _)| k.as_str()).collect();
                state_keys.sort_unstable();
                assert_eq!(state_keys, ["r", "t"], "{name}: RateLimit parameters");
                let item = Ietf {
                    q: param(&policy, "q"),
                    w: param(&policy, "w"),
                    r: param(&state, "r"),
                    t: param(&state, "t"),
                    policy: name.clone(),
                };
                assert!(item.q > 0 && item.w > 0, "{item:?}");
                assert!(item.r >= 0 && item.t >= 0, "{item:?}");
                item
            })
            .collect()
    }

    fn ietf_of(&self, policy: &str) -> Ietf {
        self.ietf()
            .into_iter()
            .find(|i| i.policy == policy)
            .unwrap_or_else(|| panic!("no IETF item for {policy}"))
    }

    fn ietf_names(&self) -> Vec<String> {
        self.ietf().into_iter().map(|i| i.policy).collect()
    }

    /// On a limited response: `Retry-After` is the tightest policy's `t`, and no violated
    /// policy's `t` is later than it.
    fn assert_retry_after_covers_every_t(&self, ctx: &str) {
        let retry = self.retry_after().expect("a Retry-After header") as i64;
        let decision = self.decision();
        assert!(
            decision.violated().next().is_some(),
            "{ctx}: a violated policy"
        );
        for o in decision.violated() {
            let t = self.ietf_of(o.policy()).t;
            assert!(
                t <= retry,
                "{ctx}: t={t} of {} > Retry-After {retry}",
                o.policy()
            );
        }
        assert_eq!(
            self.ietf_of(decision.tightest().policy()).t,
            retry,
            "{ctx}: Retry-After is the tightest policy's t"
        );
    }
}

fn names<'a>(outcomes: impl Iterator<Item = &'a PolicyOutcome>) -> Vec<&'a str> {
    outcomes.map(|o| o.policy()).collect()
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect()
}

/// Each policy's remaining units for `key` right now (a check at cost 0, which charges
/// nothing), in each policy's own quota.
async fn left<St: Store>(layer: &RateLimitLayer<St>, key: &str) -> BTreeMap<String, u64> {
    let decision = layer.check(&Key::from(key), 0).await.unwrap();
    decision
        .outcomes()
        .iter()
        .map(|o| (o.policy().to_owned(), o.remaining()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The structured fields the IETF draft uses, read with an RFC 8941/9651 parser (`sfv`)
// ---------------------------------------------------------------------------------------------

/// An RFC 8941 list whose members are all items with an sf-string value and integer
/// parameters: `[(string, [(key, integer)])]`. Anything else (tokens, inner lists, booleans,
/// decimals, strings as parameters, a field that does not parse) is an error.
type SfList = Vec<(String, Vec<(String, i64)>)>;

fn parse_sf_list(input: &str) -> Result<SfList, String> {
    let list: sfv::List = sfv::Parser::new(input)
        .parse()
        .map_err(|e| format!("not an RFC 8941 list: {e}"))?;
    if list.is_empty() {
        return Err("an empty list".into());
    }
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                return Err("an inner list, not an item".to_owned());
            };
            let sfv::BareItem::String(value) = &item.bare_item else {
                return Err(format!("{:?} is not an sf-string", item.bare_item));
            };
            let params = item
                .params
                .iter()
                .map(|(key, value)| match value {
                    sfv::BareItem::Integer(n) => Ok((key.as_str().to_owned(), i64::from(*n))),
                    other => Err(format!(
                        "the parameter {} is {other:?}, not an integer",
                        key.as_str()
                    )),
                })
                .collect::<Result<_, _>>()?;
            Ok((value.as_str().to_owned(), params))
        })
        .collect()
}

#[test]
fn sf_lists_are_read_strictly() {
    let ok = parse_sf_list(r#" "a";q=10;w=1,  "b:c/d";q=-3, "e\"\\";r=0 "#).unwrap();
    assert_eq!(
        ok,
        vec![
            (
                "a".to_owned(),
                vec![("q".to_owned(), 10), ("w".to_owned(), 1)]
            ),
            ("b:c/d".to_owned(), vec![("q".to_owned(), -3)]),
            ("e\"\\".to_owned(), vec![("r".to_owned(), 0)]),
        ]
    );
    assert_eq!(
        parse_sf_list(r#""a""#).unwrap(),
        vec![("a".to_owned(), vec![])]
    );
    // (A repeated parameter is valid RFC 8941, the last value winning; the headers under test
    // are checked for exactly the parameters they must have.)
    for bad in [
        "",
        "a;q=1",
        "(\"a\");q=1",
        "\"a\";q",
        "\"a\";q=1.5",
        "\"a\";q=\"1\"",
        "\"a\";Q=1",
        "\"a\";q=1234567890123456",
        "\"a\";q=1,",
        "\"a\";q=1 \"b\";q=2",
        "\"a\";q=1,,\"b\"",
        "\"a\\x\";q=1",
        "\"a;q=1",
        "\"a\" ;q=1",
        "\"é\";q=1",
    ] {
        assert!(parse_sf_list(bad).is_err(), "accepted {bad:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Several policies, different keys, one atomic decision
// ---------------------------------------------------------------------------------------------

async fn multi_policy_atomicity<St: Store>(env: Env<St>) {
    let n = env.name;
    // 600.5 s into an hour: the hourly fixed window has 2,999.5 s left.
    env.clock.advance(Duration::from_micros(600_500_000));
    let hour_left = Duration::from_micros(2_999_500_000);
    let layer = env
        .builder()
        .key(header_key("x-user"))
        .headers(HeaderStyle::Both)
        .policy(Policy::gcra("10/s").name("per-ip").key(header_key("x-ip")))
        .policy(Policy::sliding_window("1000/h").name("per-user"))
        .policy(Policy::fixed_window("3/h").name("hourly"))
        .build()
        .unwrap();
    let svc = service(layer.clone());
    let from = |ip: &str, user: &str| request(&[("x-ip", ip), ("x-user", user)]);

    for i in 1..=3 {
        let r = send(&svc, from("a", "u")).await;
        assert_eq!(r.status, StatusCode::OK, "{n}: request {i}");
        assert_eq!(
            r.remaining(),
            counts(&[
                ("per-ip", 10 - i),
                ("per-user", 1000 - i),
                ("hourly", 3 - i)
            ]),
            "{n}: request {i} charged every policy"
        );
    }

    // The hourly quota is used up: denied, again and again, by it alone. Were the per-second
    // counter charged by these denials, it would be exhausted by the eighth and show up in
    // the violated list.
    for attempt in 1..=8 {
        let r = send(&svc, from("a", "u")).await;
        let ctx = format!("{n}: denial {attempt}");
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{ctx}");
        assert_eq!(
            r.header(CONTENT_TYPE),
            Some("application/problem+json"),
            "{ctx}"
        );
        assert_eq!(
            r.body,
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota exceeded","status":429,"detail":"rate limit exceeded","violated-policies":["hourly"],"violated":["hourly"],"retry_after":3000}"#,
            "{ctx}"
        );
        let d = r.decision();
        assert_eq!(names(d.violated()), ["hourly"], "{ctx}");
        assert_eq!(d.tightest().policy(), "hourly", "{ctx}");
        assert_eq!(d.retry_after(), Some(hour_left), "{ctx}: the exact wait");
        assert_eq!(r.retry_after(), Some(3000), "{ctx}: 2,999.5 s rounded up");
        assert_eq!(r.legacy(), (Some(3), Some(0), Some(3000)), "{ctx}");
        r.assert_retry_after_covers_every_t(&ctx);
    }

    // The same address, another user: the address has 7 units left before it, so none of the
    // eight denials took one.
    let r = send(&svc, from("a", "v")).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(
        r.remaining(),
        counts(&[("per-ip", 6), ("per-user", 999), ("hourly", 2)]),
        "{n}: denied requests charged no policy"
    );
    // And u's own counters are where three requests left them (per-ip is keyed by address,
    // so the key "u" has a fresh per-ip bucket).
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("per-ip", 10), ("per-user", 997), ("hourly", 0)]),
        "{n}"
    );

    // Two policies violated at once: address b spends its 10 on ten users, then u comes.
    for i in 0..10 {
        let r = send(&svc, from("b", &format!("b{i}"))).await;
        assert_eq!(r.status, StatusCode::OK, "{n}: b{i}");
        assert_eq!(r.outcome("per-ip").remaining(), 9 - i, "{n}: b{i}");
    }
    let r = send(&svc, from("b", "u")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    let d = r.decision();
    assert_eq!(names(d.violated()), ["per-ip", "hourly"], "{n}");
    assert_eq!(r.violated_in_body(), ["per-ip", "hourly"], "{n}");
    assert_eq!(
        r.outcome("per-ip").retry_after(),
        Some(Duration::from_millis(100)),
        "{n}: one GCRA emission interval"
    );
    assert_eq!(
        d.tightest().policy(),
        "hourly",
        "{n}: the longest wait binds"
    );
    assert_eq!(d.retry_after(), Some(hour_left), "{n}: until both admit");
    assert_eq!(r.retry_after(), Some(3000), "{n}");
    assert_eq!(r.ietf_of("per-ip").t, 1, "{n}");
    assert_eq!(r.ietf_of("hourly").t, 3000, "{n}");
    r.assert_retry_after_covers_every_t(&format!("{n}: two violated"));

    // Only the per-second policy violated: a fresh user w from address b.
    let r = send(&svc, from("b", "w")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(names(r.decision().violated()), ["per-ip"], "{n}");
    assert_eq!(r.violated_in_body(), ["per-ip"], "{n}");
    assert_eq!(
        r.decision().retry_after(),
        Some(Duration::from_millis(100)),
        "{n}"
    );
    assert_eq!(r.retry_after(), Some(1), "{n}: 100 ms rounded up");
    assert_eq!(r.legacy(), (Some(10), Some(0), Some(1)), "{n}");
    r.assert_retry_after_covers_every_t(&format!("{n}: per-ip violated"));

    // The wait is exact: one microsecond early is still too early.
    env.clock.advance(Duration::from_micros(99_999));
    let r = send(&svc, from("b", "w")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(
        r.decision().retry_after(),
        Some(Duration::from_micros(1)),
        "{n}"
    );
    assert_eq!(r.retry_after(), Some(1), "{n}: never 0");
    env.clock.advance(Duration::from_micros(1));
    let r = send(&svc, from("b", "w")).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(
        r.remaining(),
        counts(&[("per-ip", 0), ("per-user", 999), ("hourly", 2)]),
        "{n}: w's first charge, so its two denials charged nothing"
    );

    // The same two limits configured the other way round: the wait is still the longest one,
    // not the last policy's (above, the longest wait was the last violated policy's).
    let reversed = env
        .builder()
        .key(header_key("x-user"))
        .headers(HeaderStyle::Ietf)
        .policy(Policy::fixed_window("3/h").name("r-hourly"))
        .policy(
            Policy::gcra("10/s")
                .name("r-per-ip")
                .key(header_key("x-ip")),
        )
        .build()
        .unwrap();
    let svc = service(reversed);
    for i in 0..10 {
        let user = if i < 3 {
            "z".to_owned()
        } else {
            format!("c{i}")
        };
        let r = send(&svc, from("c", &user)).await;
        assert_eq!(r.status, StatusCode::OK, "{n}: {user}");
    }
    let r = send(&svc, from("c", "z")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(r.violated_in_body(), ["r-hourly", "r-per-ip"], "{n}");
    assert_eq!(
        r.decision().retry_after(),
        Some(hour_left - Duration::from_millis(100)),
        "{n}: the longest wait, configured first"
    );
    assert_eq!(r.retry_after(), Some(3000), "{n}");
    r.assert_retry_after_covers_every_t(&format!("{n}: reversed"));
}

// ---------------------------------------------------------------------------------------------
// 2. Header styles and syntax
// ---------------------------------------------------------------------------------------------

async fn header_styles<St: Store>(env: Env<St>) {
    let n = env.name;
    // 15 s into an hour.
    env.clock.advance(Duration::from_secs(15));
    // A token bucket of 4 refilled at 10/min (one token every 6 s) and 100 per hour. A bucket
    // reports its burst as q and the time to refill it as w (4 tokens in 24 s: 10/min).
    let layer = |style: HeaderStyle, reset: ResetFormat, prefix: &str| {
        env.builder()
            .key(header_key("x-user"))
            .headers(style)
            .reset_format(reset)
            .policy(
                Policy::token_bucket("10/min")
                    .burst(4)
                    .name(format!("{prefix}-tb")),
            )
            .policy(Policy::fixed_window("100/h").name(format!("{prefix}-hourly")))
            .build()
            .unwrap()
    };
    let user = || request(&[("x-user", "u")]);

    for (style, p) in [(HeaderStyle::Ietf, "ietf"), (HeaderStyle::Both, "both")] {
        let svc = service(layer(style, ResetFormat::DeltaSeconds, p));
        let (tb, hourly) = (format!("{p}-tb"), format!("{p}-hourly"));
        for (i, (r_tb, t_tb)) in [(3, 6), (2, 12), (1, 18), (0, 24)].into_iter().enumerate() {
            let r = send(&svc, user()).await;
            let ctx = format!("{n}, {p}: request {}", i + 1);
            assert_eq!(r.status, StatusCode::OK, "{ctx}");
            assert_eq!(
                r.ietf(),
                [
                    ietf(&tb, 4, 24, r_tb, t_tb),
                    ietf(&hourly, 100, 3600, 99 - i as i64, 3585),
                ],
                "{ctx}"
            );
            assert_eq!(r.retry_after(), None, "{ctx}");
            if style == HeaderStyle::Both {
                // The tightest policy: the one with the fewest units left.
                let legacy = (Some(4), Some(r_tb as u64), Some(t_tb as u64));
                assert_eq!(r.legacy(), legacy, "{ctx}");
            } else {
                assert!(!r.has_legacy(), "{ctx}: {:?}", r.headers);
            }
        }
        let r = send(&svc, user()).await;
        let ctx = format!("{n}, {p}: denied");
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{ctx}");
        let items = r.ietf();
        assert_eq!(
            items[0],
            ietf(&tb, 4, 24, 0, 6),
            "{ctx}: t is the wait for one token"
        );
        assert_eq!(
            (&*items[1].policy, items[1].q, items[1].w, items[1].t),
            (&*hourly, 100, 3600, 3585),
            "{ctx}"
        );
        assert_eq!(r.retry_after(), Some(6), "{ctx}");
        r.assert_retry_after_covers_every_t(&ctx);
        if style == HeaderStyle::Both {
            assert_eq!(r.legacy(), (Some(4), Some(0), Some(24)), "{ctx}");
        } else {
            assert!(!r.has_legacy(), "{ctx}");
        }
    }

    // Legacy: only the X-RateLimit fields, for the tightest policy.
    let svc = service(layer(
        HeaderStyle::Legacy,
        ResetFormat::DeltaSeconds,
        "legacy",
    ));
    for (remaining, reset) in [(3, 6), (2, 12), (1, 18), (0, 24)] {
        let r = send(&svc, user()).await;
        assert_eq!(r.status, StatusCode::OK, "{n}");
        assert_eq!(r.legacy(), (Some(4), Some(remaining), Some(reset)), "{n}");
        assert!(!r.has_ietf(), "{n}: {:?}", r.headers);
        assert_eq!(r.retry_after(), None, "{n}");
    }
    let r = send(&svc, user()).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(r.legacy(), (Some(4), Some(0), Some(24)), "{n}");
    assert_eq!(r.retry_after(), Some(6), "{n}");
    assert!(!r.has_ietf(), "{n}");

    // None: nothing but Retry-After on a 429.
    let svc = service(layer(HeaderStyle::None, ResetFormat::DeltaSeconds, "none"));
    for _ in 0..4 {
        let r = send(&svc, user()).await;
        assert_eq!(r.status, StatusCode::OK, "{n}");
        assert!(r.has_no_rate_limit_headers(), "{n}: {:?}", r.headers);
    }
    let r = send(&svc, user()).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(r.retry_after(), Some(6), "{n}");
    assert!(!r.has_ietf() && !r.has_legacy(), "{n}: {:?}", r.headers);
    assert_eq!(r.violated_in_body(), ["none-tb"], "{n}");

    // Unix time: the wall clock (not the manual one) plus the tightest policy's reset.
    let svc = service(layer(HeaderStyle::Legacy, ResetFormat::UnixTime, "unix"));
    let wall = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let before = wall();
    let r = send(&svc, user()).await;
    let after = wall();
    let reset = r.num(X_RATELIMIT_RESET).unwrap();
    assert!(
        (before + 6..=after + 7).contains(&reset),
        "{n}: X-RateLimit-Reset {reset} is not now ({before}..={after}) + 6 s"
    );
    assert_eq!(r.legacy().0, Some(4), "{n}");
}

// ---------------------------------------------------------------------------------------------
// 3. Cost
// ---------------------------------------------------------------------------------------------

async fn cost<St: Store>(env: Env<St>) {
    let n = env.name;
    // 15 s into a minute: the fixed window has 45 s left.
    env.clock.advance(Duration::from_secs(15));
    let layer = env
        .builder()
        .key(header_key("x-user"))
        // Every policy without a cost of its own costs 3.
        .cost(|_| 3)
        .policy(
            Policy::fixed_window("10/min")
                .name("units")
                .cost(|req| header_u32(req, "x-cost").unwrap_or(1)),
        )
        .policy(Policy::gcra("100/min").name("plain"))
        .build()
        .unwrap();
    let svc = service(layer.clone());
    let costing = |units: &str| request(&[("x-user", "u"), ("x-cost", units)]);

    let r = send(&svc, costing("4")).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(
        r.remaining(),
        counts(&[("units", 6), ("plain", 97)]),
        "{n}: 4 units from its own cost, 3 from the layer's"
    );

    // More than the capacity: denied, and never admissible, so no Retry-After.
    let r = send(&svc, costing("11")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(r.retry_after(), None, "{n}: {:?}", r.headers);
    assert_eq!(r.decision().retry_after(), None, "{n}");
    assert_eq!(r.outcome("units").retry_after(), None, "{n}");
    assert_eq!(names(r.decision().violated()), ["units"], "{n}");
    assert!(
        r.body
            .ends_with(r#""violated":["units"],"retry_after":null}"#),
        "{n}: {}",
        r.body
    );
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("units", 6), ("plain", 97)]),
        "{n}: nothing charged"
    );

    let r = send(&svc, costing("6")).await;
    assert_eq!(r.status, StatusCode::OK, "{n}: exactly the units left");
    assert_eq!(r.remaining(), counts(&[("units", 0), ("plain", 94)]), "{n}");

    let r = send(&svc, costing("1")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(r.retry_after(), Some(45), "{n}: until the next window");
    assert_eq!(
        r.decision().retry_after(),
        Some(Duration::from_secs(45)),
        "{n}"
    );

    // A cost of 0 only looks at "units" (still admitted, nothing left); "plain" costs 3.
    let r = send(&svc, costing("0")).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(r.remaining(), counts(&[("units", 0), ("plain", 91)]), "{n}");

    env.clock.advance(Duration::from_secs(45));
    let r = send(&svc, costing("10")).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{n}: a whole window's worth at once"
    );
    assert_eq!(r.outcome("units").remaining(), 0, "{n}");
}

// ---------------------------------------------------------------------------------------------
// 4. Refunds after the response
// ---------------------------------------------------------------------------------------------

async fn refund_server_errors<St: Store>(env: Env<St>) {
    let n = env.name;
    let server_error = |s: StatusCode| s.is_server_error();
    let layer = env
        .builder()
        .key(header_key("x-user"))
        .policy(
            Policy::fixed_window("5/min")
                .name("api")
                .refund_if(server_error),
        )
        .policy(
            Policy::token_bucket("20/min")
                .name("heavy")
                .cost(|_| 2)
                .refund_if(server_error),
        )
        // Without a refund: charged whatever the status.
        .policy(Policy::gcra("100/min").name("strict"))
        .build()
        .unwrap();
    let svc = service(layer.clone());
    let with_status = |status: &str| request(&[("x-user", "u"), ("x-status", status)]);

    let r = send(&svc, with_status("200")).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("api", 4), ("heavy", 18), ("strict", 99)]),
        "{n}: a 2xx is kept"
    );

    let r = send(&svc, with_status("500")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{n}");
    assert_eq!(
        r.remaining(),
        counts(&[("api", 3), ("heavy", 16), ("strict", 98)]),
        "{n}: decided (and charged) before the response"
    );
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("api", 4), ("heavy", 18), ("strict", 98)]),
        "{n}: the 500's cost given back where refund_if says so"
    );

    let r = send(&svc, with_status("404")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{n}");
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("api", 3), ("heavy", 16), ("strict", 97)]),
        "{n}: a 4xx is kept"
    );

    // Server errors never use up the quota.
    for i in 0..10 {
        let r = send(&svc, with_status("503")).await;
        assert_eq!(
            r.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{n}: 503 number {i}"
        );
    }
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("api", 3), ("heavy", 16), ("strict", 87)]),
        "{n}"
    );

    for i in 0..3 {
        assert_eq!(
            send(&svc, with_status("200")).await.status,
            StatusCode::OK,
            "{n}: {i}"
        );
    }
    let r = send(&svc, with_status("200")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(names(r.decision().violated()), ["api"], "{n}");
}

// ---------------------------------------------------------------------------------------------
// 5. Charges after the response
// ---------------------------------------------------------------------------------------------

async fn charge_failures<St: Store>(env: Env<St>) {
    let n = env.name;
    let layer = env
        .builder()
        .key(header_key("x-user"))
        .policy(
            Policy::sliding_log("3/min")
                .name("failed-logins")
                .charge_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        // Charged up front for every admitted request.
        .policy(Policy::fixed_window("100/h").name("api"))
        .build()
        .unwrap();
    let svc = service(layer.clone());
    let login = |user: &str, status: &str| request(&[("x-user", user), ("x-status", status)]);

    for i in 0..5 {
        let r = send(&svc, login("u", "200")).await;
        assert_eq!(r.status, StatusCode::OK, "{n}: success {i}");
    }
    let r = send(&svc, login("u", "500")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{n}");
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("failed-logins", 3), ("api", 94)]),
        "{n}: no failure charged"
    );

    for (i, expected) in [2, 1, 0].into_iter().enumerate() {
        if i > 0 {
            env.clock.advance(Duration::from_secs(10));
        }
        let r = send(&svc, login("u", "401")).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{n}: failure {i}");
        assert_eq!(
            left(&layer, "u").await,
            counts(&[("failed-logins", expected), ("api", 93 - i as u64)]),
            "{n}: failure {i} charged after the response"
        );
    }

    // 30 s after the first failure: even a request that would succeed is refused, until the
    // first failure leaves the window.
    env.clock.advance(Duration::from_secs(10));
    for status in ["200", "401"] {
        let r = send(&svc, login("u", status)).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}: {status}");
        assert_eq!(names(r.decision().violated()), ["failed-logins"], "{n}");
        assert_eq!(r.retry_after(), Some(30), "{n}");
        assert_eq!(
            r.decision().retry_after(),
            Some(Duration::from_secs(30)),
            "{n}"
        );
    }
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("failed-logins", 0), ("api", 91)]),
        "{n}: denied by failed-logins, so api was not charged either"
    );
    let r = send(&svc, login("v", "200")).await;
    assert_eq!(r.status, StatusCode::OK, "{n}: other users are unaffected");

    env.clock.advance(Duration::from_secs(30));
    let r = send(&svc, login("u", "200")).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{n}: the first failure left the window"
    );
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("failed-logins", 1), ("api", 90)]),
        "{n}: and the success was free"
    );
    let r = send(&svc, login("u", "401")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{n}");
    let r = send(&svc, login("u", "200")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(
        r.retry_after(),
        Some(10),
        "{n}: the second failure leaves next"
    );
}

/// A response charged after it (its status) reports what is left after its charge: successive
/// 401s of a policy of 5 show 4, 3, 2, 1, 0 left and a reset in the future from the first;
/// a response that is not charged shows what its look saw.
async fn charged_headers<St: Store>(env: Env<St>) {
    let n = env.name;
    let layer = env
        .builder()
        .key(header_key("x-user"))
        .policy(
            Policy::gcra("5/min")
                .name("failed-logins")
                .charge_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let svc = service(layer.clone());
    let login = |status: &str| request(&[("x-user", "w"), ("x-status", status)]);
    let r = send(&svc, login("200")).await;
    assert_eq!(
        (r.status, r.header("x-ratelimit-remaining")),
        (StatusCode::OK, Some("5")),
        "{n}"
    );
    for left in [4, 3, 2, 1, 0] {
        let r = send(&svc, login("401")).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{n}");
        let shown = r
            .header("x-ratelimit-remaining")
            .map(|v| v.parse::<u64>().unwrap());
        assert_eq!(shown, Some(left), "{n}: left after this 401 charge");
        let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
        assert!(reset > 0, "{n}: a used policy resets later: {reset}");
    }
    assert_eq!(
        send(&svc, login("401")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Shadow mode
// ---------------------------------------------------------------------------------------------

async fn shadow<St: Store>(env: Env<St>) {
    let n = env.name;
    // 20 s into a minute: the fixed windows have 40 s left. The GCRA shadow admits one
    // request per minute.
    env.clock.advance(Duration::from_secs(20));
    let layer = env
        .builder()
        .key(header_key("x-user"))
        .headers(HeaderStyle::Both)
        .policy(Policy::fixed_window("3/min").name("enforced"))
        .policy(Policy::gcra("1/min").name("strict-new").shadow())
        .policy(Policy::fixed_window("10/min").name("loose-new").shadow())
        .build()
        .unwrap();
    let svc = service(layer.clone());
    let user = || request(&[("x-user", "u")]);

    let r = send(&svc, user()).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(
        names(r.decision().shadow_violated()),
        Vec::<&str>::new(),
        "{n}"
    );
    assert_eq!(
        r.remaining(),
        counts(&[("enforced", 2), ("strict-new", 0), ("loose-new", 9)]),
        "{n}: shadow policies are charged when they admit"
    );

    for i in 2..=3 {
        let r = send(&svc, user()).await;
        let ctx = format!("{n}: request {i}");
        assert_eq!(r.status, StatusCode::OK, "{ctx}: a shadow never rejects");
        let d = r.decision();
        assert!(d.is_allowed(), "{ctx}");
        assert_eq!(names(d.violated()), Vec::<&str>::new(), "{ctx}");
        assert_eq!(names(d.shadow_violated()), ["strict-new"], "{ctx}");
        assert!(r.outcome("strict-new").is_shadow(), "{ctx}");
        assert_eq!(
            r.ietf_of("strict-new"),
            ietf("strict-new", 1, 60, 0, 60),
            "{ctx}: reported in the IETF headers, t the full interval: a violated shadow \
             is not charged"
        );
        // The legacy headers follow the enforced policy, not the violated shadow.
        assert_eq!(r.legacy(), (Some(3), Some(3 - i), Some(40)), "{ctx}");
        assert_eq!(r.retry_after(), None, "{ctx}");
    }

    // The enforced policy rejects; only it is named.
    let r = send(&svc, user()).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(names(r.decision().violated()), ["enforced"], "{n}");
    assert_eq!(r.violated_in_body(), ["enforced"], "{n}");
    assert_eq!(names(r.decision().shadow_violated()), ["strict-new"], "{n}");
    assert_eq!(r.ietf_of("strict-new").t, 60, "{n}");
    assert_eq!(r.retry_after(), Some(40), "{n}");
    r.assert_retry_after_covers_every_t(n);
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("enforced", 0), ("strict-new", 0), ("loose-new", 7)]),
        "{n}: the rejected request charged no shadow policy"
    );

    // A shadow policy and an after-response charge do not mix.
    let err = env
        .builder()
        .policy(
            Policy::fixed_window("1/min")
                .name("bad")
                .shadow()
                .charge_if(|s| s.is_client_error()),
        )
        .build()
        .expect_err("a shadow policy with charge_if is refused");
    assert!(err.to_string().contains("shadow"), "{n}: {err}");
}

// ---------------------------------------------------------------------------------------------
// 7. Exemptions
// ---------------------------------------------------------------------------------------------

async fn exemptions<St: Store>(env: Env<St>) {
    let n = env.name;
    let layer = env
        .builder()
        .key(header_key("x-user"))
        .headers(HeaderStyle::Both)
        .exempt_if(|req| has_header(req, "x-internal"))
        .policy(
            Policy::fixed_window("2/min")
                .name("a")
                .exempt_if(|req| has_header(req, "x-trusted")),
        )
        .policy(
            Policy::fixed_window("5/min")
                .name("b")
                .exempt_if(|req| has_header(req, "x-trusted") || has_header(req, "x-partner")),
        )
        .build()
        .unwrap();
    let svc = service(layer.clone());
    let fresh = || counts(&[("a", 2), ("b", 5)]);

    // Exempt from the layer: no key needed, nothing counted, no headers.
    for headers in [
        &[("x-internal", "1")][..],
        &[("x-internal", "1"), ("x-user", "u")][..],
    ] {
        for i in 0..10 {
            let r = send(&svc, request(headers)).await;
            assert_eq!(r.status, StatusCode::OK, "{n}: {headers:?} {i}");
            assert!(r.has_no_rate_limit_headers(), "{n}: {:?}", r.headers);
            assert!(r.decision.is_none(), "{n}: no decision was made");
        }
    }
    assert_eq!(left(&layer, "u").await, fresh(), "{n}");

    // Exempt from every policy: the same.
    for i in 0..10 {
        let r = send(&svc, request(&[("x-trusted", "1"), ("x-user", "u")])).await;
        assert_eq!(r.status, StatusCode::OK, "{n}: {i}");
        assert!(r.has_no_rate_limit_headers(), "{n}: {:?}", r.headers);
        assert!(r.decision.is_none(), "{n}");
    }
    assert_eq!(left(&layer, "u").await, fresh(), "{n}");

    // Exempt from "b" only: "a" is decided and reported alone.
    let r = send(&svc, request(&[("x-partner", "1"), ("x-user", "u")])).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(r.remaining(), counts(&[("a", 1)]), "{n}");
    assert_eq!(r.ietf_names(), ["a"], "{n}");
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("a", 1), ("b", 5)]),
        "{n}"
    );

    let r = send(&svc, request(&[("x-user", "u")])).await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(r.ietf_names(), ["a", "b"], "{n}");
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("a", 0), ("b", 4)]),
        "{n}"
    );

    let r = send(&svc, request(&[("x-user", "u")])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    let r = send(&svc, request(&[("x-partner", "1"), ("x-user", "u")])).await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{n}: a still applies"
    );
    for headers in [
        &[("x-internal", "1"), ("x-user", "u")][..],
        &[("x-trusted", "1"), ("x-user", "u")][..],
    ] {
        let r = send(&svc, request(headers)).await;
        assert_eq!(r.status, StatusCode::OK, "{n}: {headers:?} passes anyway");
        assert!(r.has_no_rate_limit_headers(), "{n}: {:?}", r.headers);
    }
    assert_eq!(
        left(&layer, "u").await,
        counts(&[("a", 0), ("b", 4)]),
        "{n}"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Tiers
// ---------------------------------------------------------------------------------------------

async fn tiers<St: Store>(env: Env<St>) {
    let n = env.name;
    let layer = env
        .builder()
        .key(header_key("x-user"))
        .headers(HeaderStyle::Both)
        .policy(
            Policy::gcra("2/h")
                .name("plan")
                .tier("pro", "5/h")
                .select_tier(|req| {
                    req.headers()
                        .get("x-plan")
                        .map(|v| v.to_str().unwrap().to_owned())
                })
                .tier_for_key(Key::from("vip"), "pro"),
        )
        .build()
        .unwrap();
    let svc = service(layer.clone());
    let send_as = |user: &str, plan: Option<&str>| {
        let mut headers = vec![("x-user", user)];
        headers.extend(plan.map(|p| ("x-plan", p)));
        send(&svc, request(&headers))
    };

    // (tier name, limit, seconds per unit)
    let free = ("plan", 2, 1800);
    let pro = ("plan:pro", 5, 720);
    let exhaust =
        async |user: &str, plans: &[Option<&str>], (tier, limit, interval): (&str, u64, u64)| {
            for i in 0..limit {
                let plan = plans[i as usize % plans.len()];
                let r = send_as(user, plan).await;
                let ctx = format!("{n}: {user} ({plan:?}) request {}", i + 1);
                assert_eq!(r.status, StatusCode::OK, "{ctx}");
                assert_eq!(r.outcome(tier).remaining(), limit - i - 1, "{ctx}");
                assert_eq!(r.ietf_of(tier).q, limit as i64, "{ctx}");
                assert_eq!(r.legacy().0, Some(limit), "{ctx}");
            }
            let plan = plans[limit as usize % plans.len()];
            let r = send_as(user, plan).await;
            let ctx = format!("{n}: {user} ({plan:?}) over {limit}");
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{ctx}");
            assert_eq!(r.violated_in_body(), [tier], "{ctx}");
            assert_eq!(r.retry_after(), Some(interval), "{ctx}");
        };

    exhaust("f", &[None], free).await;
    // Not a tier: the policy's own quota, whose state f has used up.
    let r = send_as("f", Some("enterprise")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(r.violated_in_body(), ["plan"], "{n}");

    exhaust("p", &[Some("pro")], pro).await;
    // The override wins over whatever the request says.
    exhaust(
        "vip",
        &[None, Some("free"), Some("pro"), Some("enterprise")],
        pro,
    )
    .await;

    // Each tier has its own state: s uses up its free quota, then has all of pro's, and the
    // free quota is still used up afterwards; p, whose pro quota is gone, has all of free's.
    exhaust("s", &[None], free).await;
    exhaust("s", &[Some("pro")], pro).await;
    let r = send_as("s", None).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    exhaust("p", &[None], free).await;
    // vip always went to pro, and `check` follows the per-key override: vip's pro quota is
    // used up.
    assert_eq!(left(&layer, "vip").await, counts(&[("plan:pro", 0)]), "{n}");
    assert_eq!(left(&layer, "s").await, counts(&[("plan", 0)]), "{n}");
}

// ---------------------------------------------------------------------------------------------
// 9. Per-route policies in one layer
// ---------------------------------------------------------------------------------------------

async fn routes<St: Store>(env: Env<St>) {
    let n = env.name;
    let layer = env
        .builder()
        .key(header_key("x-ip"))
        .headers(HeaderStyle::Ietf)
        .policy(Policy::fixed_window("100/min").name("general"))
        .policy(
            Policy::fixed_window("2/min")
                .name("login")
                .route(Some(Method::POST), "/login"),
        )
        .policy(
            Policy::fixed_window("3/min")
                .name("user-read")
                .route(Some(Method::GET), "/users/{id}"),
        )
        .build()
        .unwrap();
    async fn ok() -> &'static str {
        "ok"
    }
    let app = Router::new()
        .route("/login", get(ok).post(ok))
        .route("/users/{id}", get(ok).delete(ok))
        .layer(layer.clone());
    let call = |method: Method, path: &str, ip: &str| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("x-ip", ip)
            .body(Body::empty())
            .unwrap();
        send(&app, req)
    };

    for r_login in [1, 0] {
        let r = call(Method::POST, "/login", "a").await;
        assert_eq!(r.status, StatusCode::OK, "{n}");
        assert_eq!(r.ietf_names(), ["general", "login"], "{n}");
        assert_eq!(r.ietf_of("login").r, r_login, "{n}");
    }
    let r = call(Method::POST, "/login", "a").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(r.violated_in_body(), ["login"], "{n}");

    // Other methods on /login, and other routes, are not subject to the login limit.
    for _ in 0..3 {
        let r = call(Method::GET, "/login", "a").await;
        assert_eq!(r.status, StatusCode::OK, "{n}: GET /login");
        assert_eq!(r.ietf_names(), ["general"], "{n}");
    }

    // One pattern, any id: one bucket.
    for (path, r_read) in [("/users/1", 2), ("/users/2", 1), ("/users/abc", 0)] {
        let r = call(Method::GET, path, "a").await;
        assert_eq!(r.status, StatusCode::OK, "{n}: {path}");
        assert_eq!(r.ietf_names(), ["general", "user-read"], "{n}: {path}");
        assert_eq!(r.ietf_of("user-read").r, r_read, "{n}: {path}");
    }
    let r = call(Method::GET, "/users/zzz", "a").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
    assert_eq!(r.violated_in_body(), ["user-read"], "{n}");
    let r = call(Method::DELETE, "/users/1", "a").await;
    assert_eq!(r.status, StatusCode::OK, "{n}: another method");
    assert_eq!(r.ietf_names(), ["general"], "{n}");

    // An unmatched path goes through the layer (Router::layer) under the general limit only.
    let r = call(Method::POST, "/nope", "a").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{n}");
    assert_eq!(r.ietf_names(), ["general"], "{n}");

    // Per address: b still has its login quota.
    let r = call(Method::POST, "/login", "b").await;
    assert_eq!(r.status, StatusCode::OK, "{n}");
    assert_eq!(r.ietf_of("login").r, 1, "{n}");

    // a: 2 logins + 3 GET /login + 3 user reads + 1 DELETE + 1 404 = 10 admitted requests.
    assert_eq!(
        left(&layer, "a").await,
        counts(&[("general", 90), ("login", 0), ("user-read", 0)]),
        "{n}"
    );
}

// ---------------------------------------------------------------------------------------------
// Every scenario, as two tests: on the memory store (no Redis needed) and on Redis
// ---------------------------------------------------------------------------------------------

/// Runs each scenario as `in_memory::<test>` and `on_redis::<test>`, so a Redis problem never
/// hides a memory result, and the memory tests run where no `redis-server` is installed.
macro_rules! on_each_store {
    ($($test:ident => $scenario:ident,)*) => {
        mod in_memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $test() {
                    $scenario(memory()).await;
                }
            )*
        }

        mod on_redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $test() {
                    let (env, _server) = redis().await;
                    $scenario(env).await;
                }
            )*
        }
    };
}

on_each_store! {
    multi_policy_decisions_are_atomic_and_exact => multi_policy_atomicity,
    headers_of_every_style_parse_and_match_the_decision => header_styles,
    cost_per_policy_and_per_layer => cost,
    refund_if_gives_server_errors_back => refund_server_errors,
    charge_if_counts_only_failed_requests => charge_failures,
    a_response_charged_after_it_tells_what_is_left => charged_headers,
    shadow_policies_report_but_never_reject => shadow,
    exemptions_consume_nothing_and_carry_no_headers => exemptions,
    tiers_pick_the_quota_per_request_and_per_key => tiers,
    route_policies_apply_to_their_matched_route_only => routes,
}

/// `Policy::path` limits one path pattern whatever the method, and no other path.
#[tokio::test]
async fn a_path_policy_takes_every_method_of_its_path() {
    // A clock that stands still: no window ends between the calls.
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .key(header_key("x-ip"))
        .policy(Policy::fixed_window("2/min").name("login").path("/login"))
        .store(MemoryStore::builder().clock(clock.clone()).build())
        .clock(clock)
        .build()
        .unwrap();
    async fn ok() -> &'static str {
        "ok"
    }
    let app = Router::new()
        .route("/login", get(ok).post(ok))
        .route("/other", get(ok))
        .layer(layer);
    let call = |method: Method, path: &str| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("x-ip", "a")
            .body(Body::empty())
            .unwrap();
        send(&app, req)
    };
    assert_eq!(call(Method::POST, "/login").await.status, StatusCode::OK);
    assert_eq!(call(Method::GET, "/login").await.status, StatusCode::OK);
    let r = call(Method::GET, "/login").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "both methods counted"
    );
    assert_eq!(call(Method::GET, "/other").await.status, StatusCode::OK);
}
