//! The middleware as a plain tower service: statuses, headers, bodies, responses,
//! configuration, sharing between clones, several policies, and readiness (keys: `keys.rs`).
//!
//! Time only moves through a `ManualClock`; nothing sleeps.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Service, ServiceBuilder, service_fn};
use tower_ratelimit::headers::HeaderStyle;
use tower_ratelimit::headers::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
use tower_ratelimit::key::GlobalKey;
use tower_ratelimit::{
    Algorithm, ConfigError, Decision, FailurePolicy, ManualClock, MemoryStore, Policy,
    RateLimitLayer, RateLimitLayerBuilder, body::ResponseBody,
};

mod support;

use support::http::{PROBLEM_JSON, Seen, get, inner};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A builder with one policy, the global key, and a memory store on `clock`.
fn builder(policy: Policy, clock: &ManualClock) -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .policy(policy)
        .key(GlobalKey)
        .store(MemoryStore::with_clock(clock.clone()))
}

fn layer(policy: Policy, clock: &ManualClock) -> RateLimitLayer {
    builder(policy, clock).build().unwrap()
}

fn build_err(builder: RateLimitLayerBuilder) -> String {
    let err: ConfigError = builder.build().unwrap_err();
    err.to_string()
}

// ---------------------------------------------------------------------------------------------
// Statuses and headers
// ---------------------------------------------------------------------------------------------

/// `(X-RateLimit-Reset of requests 1..=4, Retry-After of request 4)` for a fresh "3/s" key, all
/// four requests at one instant on a second (and 100 ms) boundary.
///
/// * fixed window: 1 s to the end of the window; retry at the next window.
/// * sliding window (10 buckets of 100 ms): the newest bucket slides out after 1.1 s (→ 2);
///   the estimate leaves room after 1.033334 s (→ 2).
/// * sliding log: 1 s until the logged requests leave the window.
/// * token / leaky bucket: refill or drain of the used units at 3/s (⅓ s, ⅔ s, 1 s → 1);
///   one unit back after 333 334 µs (→ 1).
/// * GCRA: the emission interval is rounded up to 333 334 µs, so after 3 units the key is
///   rested only after 1.000002 s (→ 2).
fn expected_3_per_s(alg: Algorithm) -> ([u64; 4], u64) {
    match alg {
        Algorithm::FixedWindow => ([1, 1, 1, 1], 1),
        Algorithm::SlidingWindow => ([2, 2, 2, 2], 2),
        Algorithm::SlidingLog => ([1, 1, 1, 1], 1),
        Algorithm::TokenBucket => ([1, 1, 1, 1], 1),
        Algorithm::LeakyBucket => ([1, 1, 1, 1], 1),
        Algorithm::Gcra => ([1, 1, 2, 2], 1),
        other => panic!("no expectation for {other}"),
    }
}

#[tokio::test]
async fn allowed_then_limited_with_exact_headers_for_every_algorithm() {
    for alg in Algorithm::ALL {
        let clock = ManualClock::new();
        let seen = Seen::default();
        let svc = ServiceBuilder::new()
            .layer(layer(Policy::new(alg, "3/s"), &clock))
            .service(inner(&seen));
        let (resets, retry) = expected_3_per_s(alg);

        for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
            let r = get(&svc).await;
            assert_eq!(r.status, StatusCode::OK, "{alg}: request {}", i + 1);
            assert_eq!(
                r.rate_headers(),
                (Some(3), Some(remaining), Some(resets[i]), None),
                "{alg}: headers of request {}",
                i + 1
            );
            assert_eq!(r.body, "ok");
        }
        for _ in 0..3 {
            let r = get(&svc).await;
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{alg}");
            assert_eq!(
                r.rate_headers(),
                (Some(3), Some(0), Some(resets[3]), Some(retry)),
                "{alg}: headers of the 429"
            );
        }
        assert_eq!(
            seen.calls(),
            3,
            "{alg}: denied requests never reach the service"
        );
    }
}

/// A request of one policy is decided on a shortcut (no checks, no ticket, and no `Decision`
/// when nothing but the `X-RateLimit-*` headers reads one), unless something else has a say: a
/// layer with a local fallback goes the general way. All answer alike, request after request,
/// for every algorithm.
#[tokio::test]
async fn the_one_policy_shortcut_answers_as_the_general_path() {
    for alg in Algorithm::ALL {
        let clock = ManualClock::new();
        let seen: [Seen; 4] = Default::default();
        let svc = |builder: RateLimitLayerBuilder, seen: &Seen| {
            ServiceBuilder::new()
                .layer(builder.build().unwrap())
                .service(inner(seen))
        };
        let policy = || builder(Policy::new(alg, "5/s").name("p"), &clock);
        let general = svc(
            policy().on_store_error(FailurePolicy::Local { divisor: 1 }),
            &seen[0],
        );
        let short = svc(policy(), &seen[1]);
        let headers_only = svc(policy().decision_extension(false), &seen[2]);
        let quiet = policy().headers(HeaderStyle::None);
        let quiet = svc(quiet.decision_extension(false), &seen[3]);
        let mut limited = 0;
        for step in 0..60 {
            let g = get(&general).await;
            let (s, h, q) = (
                get(&short).await,
                get(&headers_only).await,
                get(&quiet).await,
            );
            let at = format!("{alg}, request {step}");
            assert_eq!(s.status, g.status, "{at}");
            assert_eq!(s.headers, g.headers, "{at}");
            assert_eq!(s.decision, g.decision, "{at}: the 429's decision");
            assert_eq!(h.status, g.status, "{at}");
            assert_eq!(
                h.headers, g.headers,
                "{at}: the same headers without a Decision"
            );
            assert_eq!(q.status, g.status, "{at}: the quiet layer admits the same");
            assert_eq!(q.header(X_RATELIMIT_REMAINING), None, "{at}: no headers");
            assert_eq!(q.header(RETRY_AFTER), g.header(RETRY_AFTER), "{at}");
            if g.status == StatusCode::OK {
                assert_eq!(seen[1].last_decision(), seen[0].last_decision(), "{at}");
            } else {
                limited += 1;
            }
            // Bursts of requests 10 ms apart, with a rest every 20.
            clock.advance(Duration::from_millis(if step % 20 == 19 {
                1_000
            } else {
                10
            }));
        }
        assert!(
            limited >= 20,
            "{alg}: the limit was reached ({limited} limited)"
        );
        for s in &seen {
            assert_eq!(
                s.calls(),
                60 - limited,
                "{alg}: every layer admitted the same"
            );
        }
    }
}

#[tokio::test]
async fn retry_after_is_whole_seconds_rounded_up_and_never_zero() {
    // 10/s: a denied request waits at most 1 s (1.01 s for the sliding window, whose
    // estimate still counts the whole oldest 100 ms bucket at exactly 1 s).
    for alg in Algorithm::ALL {
        let clock = ManualClock::new();
        let svc = ServiceBuilder::new()
            .layer(layer(Policy::new(alg, "10/s"), &clock))
            .service(inner(&Seen::default()));
        for _ in 0..10 {
            assert_eq!(get(&svc).await.status, StatusCode::OK, "{alg}");
        }
        let r = get(&svc).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{alg}");
        let expected = if alg == Algorithm::SlidingWindow {
            2
        } else {
            1
        };
        assert_eq!(r.retry_after(), expected, "{alg}");
    }

    // A wait of a few microseconds is still announced as 1 second, not 0.
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ] {
        let clock = ManualClock::new();
        let svc = ServiceBuilder::new()
            .layer(layer(Policy::new(alg, "10/s"), &clock))
            .service(inner(&Seen::default()));
        for _ in 0..10 {
            get(&svc).await;
        }
        clock.advance(Duration::from_micros(99_990));
        let r = get(&svc).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{alg}");
        assert_eq!(r.retry_after(), 1, "{alg}: 10 µs rounds up to 1 s");
        clock.advance(Duration::from_micros(10));
        assert_eq!(get(&svc).await.status, StatusCode::OK, "{alg}");
    }
}

#[tokio::test]
async fn waiting_retry_after_seconds_is_always_enough() {
    // From several phases relative to window boundaries, a client that waits exactly the
    // announced Retry-After is admitted, round after round.
    for alg in Algorithm::ALL {
        for offset_us in [0, 1, 250_000, 333_333, 999_999] {
            let clock = ManualClock::new();
            clock.advance_micros(offset_us);
            let svc = ServiceBuilder::new()
                .layer(layer(Policy::new(alg, "3/s"), &clock))
                .service(inner(&Seen::default()));
            for round in 0..6 {
                let mut admitted = 0;
                let denied = loop {
                    let r = get(&svc).await;
                    if r.status == StatusCode::OK {
                        assert!(
                            r.header(RETRY_AFTER).is_none(),
                            "{alg}: no Retry-After on 200"
                        );
                        admitted += 1;
                        assert!(admitted <= 3, "{alg}: more than the limit at once");
                    } else {
                        break r;
                    }
                };
                assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
                let wait = denied.retry_after();
                assert!(wait >= 1, "{alg}: Retry-After is never 0");
                clock.advance(Duration::from_secs(wait));
                let r = get(&svc).await;
                assert_eq!(
                    r.status,
                    StatusCode::OK,
                    "{alg}, offset {offset_us} µs, round {round}: denied after waiting Retry-After: {wait}"
                );
            }
        }
    }
}

#[tokio::test]
async fn decision_retry_after_is_exact_to_the_microsecond() {
    // The decision of a denied request (seen through an `on_limited` hook) says how long until
    // the same request is admitted: one microsecond earlier it is still denied.
    for alg in Algorithm::ALL {
        for offset_us in [0, 123_457, 999_999] {
            let clock = ManualClock::new();
            clock.advance_micros(offset_us);
            let denied: Arc<Mutex<Vec<Decision>>> = Arc::default();
            let log = denied.clone();
            let limiter = builder(Policy::new(alg, "3/s"), &clock)
                .on_limited(move |d| {
                    log.lock().unwrap().push(d.clone());
                    let mut r = Response::new(Bytes::from_static(b"limited"));
                    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    r
                })
                .build()
                .unwrap();
            let svc = ServiceBuilder::new()
                .layer(limiter)
                .service(inner(&Seen::default()));
            for round in 0..5 {
                while get(&svc).await.status == StatusCode::OK {}
                let d = denied.lock().unwrap().last().cloned().unwrap();
                assert!(!d.is_allowed());
                let wait = d.retry_after().expect("a denied request can be retried");
                let wait_us = wait.as_micros() as u64;
                assert!(wait_us > 0, "{alg}: zero retry_after on a denial");
                clock.advance_micros(wait_us - 1);
                assert_eq!(
                    get(&svc).await.status,
                    StatusCode::TOO_MANY_REQUESTS,
                    "{alg}, offset {offset_us}, round {round}: admitted 1 µs before retry_after {wait:?}"
                );
                clock.advance_micros(1);
                assert_eq!(
                    get(&svc).await.status,
                    StatusCode::OK,
                    "{alg}, offset {offset_us}, round {round}: denied at retry_after {wait:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn limited_body_is_problem_json_naming_the_policy() {
    for alg in Algorithm::ALL {
        let clock = ManualClock::new();
        let svc = ServiceBuilder::new()
            .layer(layer(Policy::new(alg, "1/s"), &clock))
            .service(inner(&Seen::default()));
        let ok = get(&svc).await;
        assert_ne!(ok.header(CONTENT_TYPE), Some(PROBLEM_JSON));

        let r = get(&svc).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.header(CONTENT_TYPE), Some(PROBLEM_JSON));
        let body = &r.body;
        assert!(body.starts_with('{') && body.ends_with('}'), "{body}");
        assert!(body.contains(r#""status":429"#), "{body}");
        assert!(body.contains(r#""title":"Quota exceeded""#), "{body}");
        assert!(
            body.contains(&format!(r#""violated":["{alg}:1/s"]"#)),
            "{alg}: {body}"
        );
        assert!(
            body.contains(&format!(r#""retry_after":{}"#, r.retry_after())),
            "{alg}: the body's retry_after matches the header: {body}"
        );
    }

    // A custom name is what the body reports.
    let clock = ManualClock::new();
    let svc = ServiceBuilder::new()
        .layer(layer(Policy::gcra("1/min").name("login.attempts"), &clock))
        .service(inner(&Seen::default()));
    get(&svc).await;
    let r = get(&svc).await;
    assert!(
        r.body.contains(r#""violated":["login.attempts"]"#),
        "{}",
        r.body
    );
    assert!(r.body.contains(r#""retry_after":60"#), "{}", r.body);
}

#[tokio::test]
async fn the_inner_service_sees_the_decision() {
    let clock = ManualClock::new();
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(layer(Policy::fixed_window("3/s").name("api"), &clock))
        .service(inner(&seen));

    for remaining in [2, 1, 0] {
        assert_eq!(get(&svc).await.status, StatusCode::OK);
        let d = seen.last_decision();
        assert!(d.is_allowed());
        assert_eq!(d.outcomes().len(), 1);
        let o = d.tightest();
        assert_eq!(o.policy(), "api");
        assert!(o.is_allowed());
        assert_eq!(o.limit(), 3);
        assert_eq!(o.remaining(), remaining);
        assert_eq!(o.retry_after(), None);
        assert_eq!(d.retry_after(), None);
    }
    assert_eq!(get(&svc).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(seen.calls(), 3);

    clock.advance(Duration::from_secs(1));
    assert_eq!(get(&svc).await.status, StatusCode::OK);
    assert_eq!(seen.last_decision().tightest().remaining(), 2);
}

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Customized responses
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn on_limited_writes_the_response_and_gets_the_rate_limit_headers() {
    let clock = ManualClock::new();
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(
            builder(Policy::token_bucket("2/10s").name("uploads"), &clock)
                .on_limited(|decision| {
                    let names: Vec<_> = decision.violated().map(|o| o.policy()).collect();
                    let mut r =
                        Response::new(Bytes::from(format!("slow down: {}", names.join(","))));
                    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    r.headers_mut()
                        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                    r
                })
                .build()
                .unwrap(),
        )
        .service(inner(&seen));

    get(&svc).await;
    get(&svc).await;
    let r = get(&svc).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body, "slow down: uploads");
    assert_eq!(r.header(CONTENT_TYPE), Some("text/plain"));
    // Two tokens per 10 s: one is back after 5 s, the bucket is full after 10 s.
    assert_eq!(r.rate_headers(), (Some(2), Some(0), Some(10), Some(5)));
    assert_eq!(seen.calls(), 2);
}

#[tokio::test]
async fn on_limited_headers_it_sets_itself_are_kept() {
    let clock = ManualClock::new();
    let svc = ServiceBuilder::new()
        .layer(
            builder(Policy::fixed_window("1/s"), &clock)
                .on_limited(|_| {
                    let mut r = Response::new(Bytes::new());
                    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    r.headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(120u32));
                    r.headers_mut()
                        .insert(X_RATELIMIT_LIMIT, HeaderValue::from_static("custom"));
                    r
                })
                .build()
                .unwrap(),
        )
        .service(inner(&Seen::default()));
    get(&svc).await;
    let r = get(&svc).await;
    assert_eq!(r.header(RETRY_AFTER), Some("120"));
    assert_eq!(r.header(X_RATELIMIT_LIMIT), Some("custom"));
    assert_eq!(
        r.num(X_RATELIMIT_REMAINING),
        Some(0),
        "missing headers are still added"
    );
    assert_eq!(r.body, "");
}

#[tokio::test]
async fn limited_status_is_honoured() {
    let clock = ManualClock::new();
    let svc = ServiceBuilder::new()
        .layer(
            builder(Policy::fixed_window("1/s"), &clock)
                .limited_status(StatusCode::SERVICE_UNAVAILABLE)
                .build()
                .unwrap(),
        )
        .service(inner(&Seen::default()));
    assert_eq!(get(&svc).await.status, StatusCode::OK);
    let r = get(&svc).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.header(CONTENT_TYPE), Some(PROBLEM_JSON));
    assert!(r.body.contains(r#""status":503"#), "{}", r.body);
    assert!(r.body.contains(r#""title":"Quota exceeded""#), "{}", r.body);
    assert_eq!(r.rate_headers(), (Some(1), Some(0), Some(1), Some(1)));
}

// ---------------------------------------------------------------------------------------------
// Configuration errors
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn unix_time_reset_reads_the_layers_clock() {
    let clock = ManualClock::starting_at(1_700_000_000_250_000); // .25 s into a second
    let layer = builder(Policy::fixed_window("2/min"), &clock)
        .reset_format(tower_ratelimit::headers::ResetFormat::UnixTime)
        .clock(clock.clone())
        .build()
        .unwrap();
    let svc = wrap(&layer);
    let r = get(&svc).await;
    // The window ends at 1_700_000_040 (minutes are aligned to the epoch): 39.75 s away,
    // rounded up to 40, added to the clock's time rounded up.
    assert_eq!(r.num(X_RATELIMIT_RESET), Some(1_700_000_001 + 40));
    clock.advance(Duration::from_secs(10));
    let r = get(&svc).await;
    assert_eq!(r.num(X_RATELIMIT_RESET), Some(1_700_000_011 + 30));
}

#[tokio::test]
async fn new_is_one_policy_and_a_key_in_memory() {
    let layer = RateLimitLayer::new(
        Policy::fixed_window(tower_ratelimit::quota!("2/min")),
        GlobalKey,
    );
    let svc = wrap(&layer);
    let statuses = [get(&svc).await, get(&svc).await, get(&svc).await].map(|r| r.status);
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let shared = MemoryStore::new();
    let a = RateLimitLayer::with_store(shared.clone(), Policy::gcra("1/h").name("one"), GlobalKey);
    let b = RateLimitLayer::with_store(shared, Policy::gcra("1/h").name("one"), GlobalKey);
    let key = tower_ratelimit::key::Key::from("k");
    assert!(a.check(&key, 1).await.unwrap().is_allowed());
    assert!(
        !b.check(&key, 1).await.unwrap().is_allowed(),
        "one store, one bucket"
    );
}

#[test]
fn new_panics_naming_the_policy_and_the_mistake() {
    let message = |f: fn()| {
        let err = std::panic::catch_unwind(f).expect_err("a panic");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let msg = message(|| {
        RateLimitLayer::new(Policy::gcra("10/fortnight").name("api"), GlobalKey);
    });
    assert!(
        msg.contains("policy \"api\"") && msg.contains("unknown window unit"),
        "{msg}"
    );
    let msg = message(|| {
        RateLimitLayer::new(Policy::fixed_window("10/s").burst(20), GlobalKey);
    });
    assert!(
        msg.contains("fixed_window") && msg.contains("no burst"),
        "{msg}"
    );
}

#[test]
fn configuration_errors_are_reported_at_build_time() {
    let clock = ManualClock::new();
    let err = |policy: Policy| build_err(builder(policy, &clock));
    let contains = |msg: String, parts: &[&str]| {
        for p in parts {
            assert!(msg.contains(p), "{msg:?} does not mention {p:?}");
        }
    };

    contains(
        build_err(RateLimitLayer::builder()),
        &["no policy", ".policy("],
    );
    contains(err(Policy::gcra("0/s")), &["gcra policy", "limit is zero"]);
    contains(
        err(Policy::fixed_window("10/0s")),
        &["fixed_window policy", "window is zero"],
    );
    contains(
        err(Policy::token_bucket("abc").name("api")),
        &["policy \"api\"", "invalid quota \"abc\"", "LIMIT/WINDOW"],
    );
    contains(err(Policy::gcra("10/fortnight")), &["unknown window unit"]);
    contains(
        err(Policy::fixed_window("10/s").burst(20)),
        &["fixed_window has no burst", "token_bucket"],
    );
    contains(
        err(Policy::sliding_log("10/s").burst(20)),
        &["sliding_log has no burst"],
    );
    contains(err(Policy::gcra("10/s").burst(0)), &["burst is zero"]);
    // 1 s is not a whole number of microseconds when cut in 7.
    contains(
        err(Policy::sliding_window("10/s").buckets(7)),
        &["sliding_window", "7 equal buckets"],
    );
    contains(
        err(Policy::sliding_window("10/s").buckets(0)),
        &["buckets must be between 1 and"],
    );
    contains(
        err(Policy::fixed_window("10/s").buckets(10)),
        &["only apply to sliding_window"],
    );
    contains(
        err(Policy::sliding_log("10001/s")),
        &["sliding_log", "capped at 10000", "sliding_window"],
    );
    contains(
        err(Policy::gcra("10/s").name("bad name!")),
        &["policy name"],
    );
    contains(err(Policy::gcra("10/400d")), &["too long"]);

    // Two policies with one name in one layer, even if identical.
    contains(
        build_err(
            builder(Policy::fixed_window("10/s").name("api"), &clock)
                .policy(Policy::gcra("100/min").name("api")),
        ),
        &["two policies are named \"api\""],
    );
    contains(
        build_err(builder(Policy::gcra("10/s"), &clock).policy(Policy::gcra("10/s"))),
        &["two policies are named \"gcra:10/s\""],
    );

    // What is valid builds.
    assert!(
        builder(Policy::sliding_window("10/s").buckets(8), &clock)
            .build()
            .is_ok()
    );
    assert!(
        builder(Policy::sliding_log("10000/s"), &clock)
            .build()
            .is_ok()
    );
    assert!(
        builder(Policy::leaky_bucket("10/s").burst(50), &clock)
            .build()
            .is_ok()
    );
}

#[test]
fn one_name_one_definition_per_shared_store() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let first = RateLimitLayer::builder()
        .policy(Policy::fixed_window("10/s").name("api"))
        .store(store.clone())
        .build();
    assert!(first.is_ok());

    for (policy, what) in [
        (Policy::fixed_window("20/s").name("api"), "another quota"),
        (Policy::sliding_log("10/s").name("api"), "another algorithm"),
    ] {
        let msg = build_err(
            RateLimitLayer::builder()
                .policy(policy)
                .store(store.clone()),
        );
        assert!(
            msg.contains("\"api\"") && msg.contains("already used in this store"),
            "{what}: {msg}"
        );
    }

    // The same definition under the same name is fine (it shares the buckets, see below), and
    // so is the same definition under another name.
    let same = RateLimitLayer::builder()
        .policy(Policy::fixed_window("10/s").name("api"))
        .store(store.clone())
        .build();
    assert!(same.is_ok());
    let other = RateLimitLayer::builder()
        .policy(Policy::fixed_window("20/s").name("api-2"))
        .store(store)
        .build();
    assert!(other.is_ok());
}

// ---------------------------------------------------------------------------------------------
// Sharing
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn clones_of_the_layer_and_the_service_share_one_limiter() {
    let clock = ManualClock::new();
    let limiter = layer(Policy::fixed_window("4/s"), &clock);
    let a = ServiceBuilder::new()
        .layer(limiter.clone())
        .service(inner(&Seen::default()));
    let b = ServiceBuilder::new()
        .layer(limiter.clone())
        .service(inner(&Seen::default()));
    let a2 = a.clone();

    assert_eq!(get(&a).await.num(X_RATELIMIT_REMAINING), Some(3));
    assert_eq!(get(&b).await.num(X_RATELIMIT_REMAINING), Some(2));
    assert_eq!(get(&a2).await.num(X_RATELIMIT_REMAINING), Some(1));
    assert_eq!(
        get(&wrap(&limiter)).await.num(X_RATELIMIT_REMAINING),
        Some(0)
    );
    for svc in [&a, &b, &a2] {
        assert_eq!(get(svc).await.status, StatusCode::TOO_MANY_REQUESTS);
    }
    // One store, one entry.
    assert_eq!(limiter.store().len(), 1);
}

/// `layer` around a fresh inner service.
fn wrap(
    layer: &RateLimitLayer,
) -> impl Service<Request<()>, Response = Response<ResponseBody<Full<Bytes>>>, Error = Infallible>
+ Clone
+ use<> {
    ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&Seen::default()))
}

#[tokio::test]
async fn layers_on_one_store_share_buckets_by_policy_name() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let make = |name: &str| {
        let layer = RateLimitLayer::builder()
            .policy(Policy::fixed_window("2/s").name(name))
            .key(GlobalKey)
            .store(store.clone())
            .build()
            .unwrap();
        wrap(&layer)
    };
    let (a1, a2, b) = (make("a"), make("a"), make("b"));
    assert_eq!(get(&a1).await.status, StatusCode::OK);
    assert_eq!(get(&a2).await.status, StatusCode::OK);
    assert_eq!(get(&a1).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get(&a2).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get(&b).await.num(X_RATELIMIT_REMAINING), Some(1));
}

// ---------------------------------------------------------------------------------------------
// Several policies
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn several_policies_charge_all_or_nothing() {
    // per-sec: a sliding log, so that its window is not aligned to the minute and a request it
    // was (wrongly) charged for would still count after the minute rolls over.
    // per-min: a fixed window, aligned to the minute.
    let minute = 60_000_000;
    let m = 16_666_667 * minute; // a minute boundary
    let clock = ManualClock::starting_at(m + 58_000_000);
    let seen = Seen::default();
    let svc = ServiceBuilder::new()
        .layer(
            builder(Policy::sliding_log("2/s").name("per-sec"), &clock)
                .policy(Policy::fixed_window("3/min").name("per-min"))
                .build()
                .unwrap(),
        )
        .service(inner(&seen));
    let remaining = |d: &Decision| -> Vec<(String, u64)> {
        d.outcomes()
            .iter()
            .map(|o| (o.policy().to_owned(), o.remaining()))
            .collect()
    };
    let pair = |s: u64, m: u64| vec![("per-sec".to_owned(), s), ("per-min".to_owned(), m)];

    // 58.0 s: two requests use up the second.
    assert_eq!(get(&svc).await.status, StatusCode::OK);
    assert_eq!(remaining(&seen.last_decision()), pair(1, 2));
    assert_eq!(get(&svc).await.status, StatusCode::OK);
    assert_eq!(remaining(&seen.last_decision()), pair(0, 1));

    // Denied by per-sec only: per-min is not charged.
    for _ in 0..3 {
        let r = get(&svc).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(r.body.contains(r#""violated":["per-sec"]"#), "{}", r.body);
        assert!(!r.body.contains("per-min"), "{}", r.body);
        // The headers describe the violated policy.
        assert_eq!(r.rate_headers(), (Some(2), Some(0), Some(1), Some(1)));
    }

    // 59.2 s: per-min has exactly one unit left, so none of the three denials was charged.
    clock.set_micros(m + 59_200_000);
    assert_eq!(get(&svc).await.status, StatusCode::OK);
    assert_eq!(remaining(&seen.last_decision()), pair(1, 0));

    // 59.5 s: denied by per-min only, while per-sec would still admit one.
    clock.set_micros(m + 59_500_000);
    for _ in 0..3 {
        let r = get(&svc).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(r.body.contains(r#""violated":["per-min"]"#), "{}", r.body);
        assert!(!r.body.contains("per-sec"), "{}", r.body);
        // per-min's window ends in 0.5 s.
        assert_eq!(r.rate_headers(), (Some(3), Some(0), Some(1), Some(1)));
    }

    // 60.0 s: a new minute. The 59.2 s request is still in per-sec's window; had the 59.5 s
    // denials been charged to per-sec, it would now be full.
    clock.set_micros(m + minute);
    assert_eq!(get(&svc).await.status, StatusCode::OK);
    assert_eq!(remaining(&seen.last_decision()), pair(0, 2));
    assert_eq!(seen.calls(), 4);

    // And per-sec, now full, denies again without touching per-min.
    let r = get(&svc).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.body.contains(r#""violated":["per-sec"]"#), "{}", r.body);
}

#[tokio::test]
async fn when_every_policy_is_violated_the_body_names_each_and_headers_the_longest_wait() {
    let clock = ManualClock::starting_at(16_666_667 * 60_000_000);
    let svc = ServiceBuilder::new()
        .layer(
            builder(Policy::fixed_window("1/s").name("per-sec"), &clock)
                .policy(Policy::fixed_window("1/min").name("per-min"))
                .build()
                .unwrap(),
        )
        .service(inner(&Seen::default()));
    assert_eq!(get(&svc).await.status, StatusCode::OK);
    let r = get(&svc).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.body.contains(r#""violated":["per-sec","per-min"]"#),
        "{}",
        r.body
    );
    assert!(r.body.contains(r#""retry_after":60"#), "{}", r.body);
    assert_eq!(r.rate_headers(), (Some(1), Some(0), Some(60), Some(60)));
}

// ---------------------------------------------------------------------------------------------
// Readiness
// ---------------------------------------------------------------------------------------------

/// An inner service whose readiness the test controls.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<AtomicBool>,
    broken: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Service<Request<()>> for Gate {
    type Response = Response<Full<Bytes>>;
    type Error = &'static str;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.broken.load(Ordering::SeqCst) {
            Poll::Ready(Err("broken"))
        } else if self.open.load(Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new(Full::new(Bytes::new()))))
    }
}

#[tokio::test]
async fn poll_ready_forwards_the_inner_readiness() {
    let clock = ManualClock::new();
    let gate = Gate::default();
    let limiter = layer(Policy::fixed_window("1/s"), &clock);
    let mut svc = ServiceBuilder::new()
        .layer(limiter.clone())
        .service(gate.clone());
    let mut cx = Context::from_waker(Waker::noop());

    assert!(svc.poll_ready(&mut cx).is_pending());
    assert!(svc.poll_ready(&mut cx).is_pending());
    assert_eq!(
        limiter.store().len(),
        0,
        "waiting for readiness charges nothing"
    );

    gate.open.store(true, Ordering::SeqCst);
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let response = svc.call(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(gate.calls.load(Ordering::SeqCst), 1);

    // Being over the limit is not back-pressure: still ready, and the call answers 429.
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let response = svc.call(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);

    gate.broken.store(true, Ordering::SeqCst);
    assert!(matches!(
        svc.poll_ready(&mut cx),
        Poll::Ready(Err("broken"))
    ));
}

#[tokio::test]
async fn poll_ready_with_a_concurrency_limit() {
    let clock = ManualClock::new();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = Arc::new(tokio::sync::Mutex::new(Some(released)));
    let slow = service_fn(move |_: Request<()>| {
        let released = released.clone();
        async move {
            if let Some(rx) = released.lock().await.take() {
                rx.await.unwrap();
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let mut a = ServiceBuilder::new()
        .layer(layer(Policy::fixed_window("10/s"), &clock))
        .concurrency_limit(1)
        .service(slow);
    let mut b = a.clone();
    let mut cx = Context::from_waker(Waker::noop());

    assert!(matches!(a.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    assert!(
        b.poll_ready(&mut cx).is_pending(),
        "the only permit is held by a"
    );
    let in_flight = tokio::spawn(a.call(Request::new(())));
    assert!(
        b.poll_ready(&mut cx).is_pending(),
        "the permit moved into the call"
    );
    release.send(()).unwrap();
    let response = in_flight.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[X_RATELIMIT_REMAINING], "9");
    assert!(matches!(b.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let response = b.call(Request::new(())).await.unwrap();
    assert_eq!(response.headers()[X_RATELIMIT_REMAINING], "8");
}
