//! Calendar quotas (`Policy::calendar`, `"N/month"`) through the layer, on both stores: month
//! ends of 28 to 31 days and a leap year, both daylight-saving changes, a zone 30 minutes off
//! the hour, weeks from Monday and from Sunday; the headers telling the real time to the next
//! period; Redis keys living as long as their period; two instances on one Redis, on the
//! cluster, and on Redis's own clock.
//!
//! Time is a `ManualClock` set to fixed dates, except in the one test of Redis's own clock.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Request, StatusCode};
use support::{RedisCluster, RedisServer, build_error, global_layer, keys_with_ttl};
use tower::{Service, ServiceExt, service_fn};
use tower_ratelimit::key::{GlobalKey, Key};
use tower_ratelimit::{
    Algorithm, ManualClock, MemoryStore, Policy, RateLimitLayer, Store, calendar::Calendar,
    calendar::Weekday, headers::HeaderStyle,
};

const S: u64 = 1_000_000;
const H: u64 = 3_600 * S;
const DAY: u64 = 24 * H;

/// The microseconds since the epoch of `y-m-d h:min` as the clocks of `zone` show it.
fn at(zone: &str, (y, m, d): (i16, i8, i8), h: i8, min: i8) -> u64 {
    let tz = jiff::tz::TimeZone::get(zone).unwrap();
    let zoned = jiff::civil::date(y, m, d)
        .at(h, min, 0, 0)
        .to_zoned_datetime(tz)
        .unwrap();
    zoned.timestamp().as_microsecond() as u64
}

fn zone(name: &str) -> Calendar {
    Calendar::in_zone(name).unwrap()
}

/// A fixed window of `quota` counting the periods of `calendar`, named `name`.
fn plan(name: &str, quota: &str, calendar: Calendar) -> Policy {
    Policy::new(Algorithm::FixedWindow, quota)
        .name(name)
        .calendar(calendar)
}

/// One check of `layer`'s one policy: (allowed, remaining, reset, retry after, window) in µs.
async fn check<St: Store>(layer: &RateLimitLayer<St>) -> (bool, u64, u64, Option<u64>, u64) {
    let decision = layer.check(&Key::from("k"), 1).await.unwrap();
    let o = &decision.outcomes()[0];
    let us = |d: Duration| d.as_micros() as u64;
    (
        o.is_allowed(),
        o.remaining(),
        us(o.reset_after()),
        o.retry_after().map(us),
        us(o.window()),
    )
}

/// A period of a plan: its policy, a time inside it, and where it starts and ends.
struct Case {
    what: &'static str,
    quota: &'static str,
    calendar: Calendar,
    now: u64,
    start: u64,
    end: u64,
}

fn cases() -> Vec<Case> {
    let utc = |date, h| at("UTC", date, h, 0);
    let paris = |date, h, min| at("Europe/Paris", date, h, min);
    let new_york = |date, h| at("America/New_York", date, h, 0);
    vec![
        Case {
            what: "February, 28 days",
            quota: "3/month",
            calendar: Calendar::utc(),
            now: utc((2026, 2, 27), 12),
            start: utc((2026, 2, 1), 0),
            end: utc((2026, 3, 1), 0),
        },
        Case {
            what: "February of a leap year, 29 days",
            quota: "3/month",
            calendar: Calendar::utc(),
            now: utc((2028, 2, 28), 12),
            start: utc((2028, 2, 1), 0),
            end: utc((2028, 3, 1), 0),
        },
        Case {
            what: "April, 30 days",
            quota: "3/month",
            calendar: Calendar::utc(),
            now: utc((2026, 4, 30), 23),
            start: utc((2026, 4, 1), 0),
            end: utc((2026, 5, 1), 0),
        },
        Case {
            what: "months from the 31st: to the last day of February",
            quota: "3/month",
            calendar: Calendar::utc().month_starts_on(31),
            now: utc((2026, 2, 10), 0),
            start: utc((2026, 1, 31), 0),
            end: utc((2026, 2, 28), 0),
        },
        Case {
            what: "March in Paris, 31 days less the hour of summer time",
            quota: "3/month",
            calendar: zone("Europe/Paris"),
            now: paris((2026, 3, 31), 22, 0),
            start: paris((2026, 3, 1), 0, 0),
            end: paris((2026, 4, 1), 0, 0),
        },
        Case {
            what: "the day summer time starts in Paris, 23 hours",
            quota: "3/day",
            calendar: zone("Europe/Paris"),
            now: paris((2026, 3, 29), 0, 30),
            start: paris((2026, 3, 29), 0, 0),
            end: paris((2026, 3, 30), 0, 0),
        },
        Case {
            what: "the day summer time ends in Paris, 25 hours",
            quota: "3/day",
            calendar: zone("Europe/Paris"),
            now: paris((2026, 10, 25), 0, 30),
            start: paris((2026, 10, 25), 0, 0),
            end: paris((2026, 10, 26), 0, 0),
        },
        Case {
            what: "a day in Kolkata, from 18:30 UTC",
            quota: "3/day",
            calendar: zone("Asia/Kolkata"),
            now: utc((2026, 6, 1), 18),
            start: at("UTC", (2026, 5, 31), 18, 30),
            end: at("UTC", (2026, 6, 1), 18, 30),
        },
        Case {
            what: "a week from Monday",
            quota: "3/week",
            calendar: Calendar::utc(),
            now: utc((2026, 11, 26), 12),
            start: utc((2026, 11, 23), 0),
            end: utc((2026, 11, 30), 0),
        },
        Case {
            what: "a week from Sunday in New York",
            quota: "3/week",
            calendar: zone("America/New_York").week_starts_on(Weekday::Sunday),
            now: new_york((2026, 11, 26), 12),
            start: new_york((2026, 11, 22), 0),
            end: new_york((2026, 11, 29), 0),
        },
    ]
}

/// Every case on `store`: three admitted, the fourth told the time to the period's end, denied
/// up to its last microsecond, and the next period admitting.
async fn periods_end_where_the_calendar_says<St: Store + Clone>(store: St, clock: &ManualClock) {
    for (i, case) in cases().into_iter().enumerate() {
        let what = case.what;
        let layer = global_layer(
            store.clone(),
            plan(&format!("p{i}"), case.quota, case.calendar),
            clock,
        );
        clock.set_micros(case.now);
        let left = case.end - case.now;
        let window = case.end - case.start;
        assert_eq!(check(&layer).await, (true, 2, left, None, window), "{what}");
        check(&layer).await;
        check(&layer).await;
        assert_eq!(
            check(&layer).await,
            (false, 0, left, Some(left), window),
            "{what}"
        );
        clock.set_micros(case.end - 1);
        assert_eq!(check(&layer).await.3, Some(1), "{what}: denied to the end");
        clock.set_micros(case.end);
        let (allowed, remaining, ..) = check(&layer).await;
        assert_eq!((allowed, remaining), (true, 2), "{what}: the next period");
    }
}

#[tokio::test]
async fn periods_end_where_the_calendar_says_in_memory() {
    let clock = ManualClock::new();
    periods_end_where_the_calendar_says(MemoryStore::with_clock(clock.clone()), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periods_end_where_the_calendar_says_in_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    periods_end_where_the_calendar_says(server.store("cal:", &clock).await, &clock).await;
    // Each key lives until its period ends: it was last written at the start of the period
    // after the case's, and lives to that one's end (an injected clock adds a minute).
    let ttls = keys_with_ttl(&server, "cal:");
    assert_eq!(ttls.len(), cases().len());
    for (key, ttl_ms) in ttls {
        let i: usize = key["cal:p".len()..]
            .split(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let case = &cases()[i];
        let expected_ms = ((next_period_end(case).await - case.end) / 1_000) as i64 + 60_000;
        assert!(
            (expected_ms - 10_000..=expected_ms).contains(&ttl_ms),
            "{}: {key} lives {ttl_ms} ms, expected {expected_ms}",
            case.what
        );
    }
}

/// Where the period after `case`'s ends, found by a memory store's decision.
async fn next_period_end(case: &Case) -> u64 {
    let clock = ManualClock::starting_at(case.end);
    let layer = global_layer(
        MemoryStore::with_clock(clock.clone()),
        plan("next", case.quota, case.calendar.clone()),
        &clock,
    );
    case.end + check(&layer).await.2
}

/// Sends one request through `layer` (IETF and X-RateLimit headers) and returns its status and
/// the headers named.
async fn send<St: Store>(
    layer: &RateLimitLayer<St>,
    names: &[&str],
) -> (StatusCode, Vec<Option<String>>) {
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }));
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    let values = names
        .iter()
        .map(|n| {
            let value = response.headers().get(*n)?;
            Some(value.to_str().unwrap().to_owned())
        })
        .collect();
    (response.status(), values)
}

/// The headers of a response tell the real time to the month's end, and its real length.
async fn headers_tell_the_periods_end<St: Store>(store: St, clock: &ManualClock) {
    let layer = RateLimitLayer::builder()
        .store(store)
        .key(GlobalKey)
        .headers(HeaderStyle::Both)
        .policy(Policy::new(Algorithm::FixedWindow, "2/month").name("monthly"))
        .build()
        .unwrap();
    // 36 hours before March in UTC; February is 28 days.
    clock.set_micros(at("UTC", (2026, 2, 27), 12, 0));
    let names = [
        "retry-after",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
    ];
    let (status, got) = send(&layer, &names).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got[1].as_deref(), Some("129600"));
    assert_eq!(
        got[3].as_deref(),
        Some("\"monthly\";q=2;w=2419200"),
        "the month's real length"
    );
    send(&layer, &names).await;
    let (status, got) = send(&layer, &names).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(got[0].as_deref(), Some("129600"));
    assert_eq!(got[2].as_deref(), Some("\"monthly\";r=0;t=129600"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_tell_the_periods_end_on_both_stores() {
    let clock = ManualClock::new();
    headers_tell_the_periods_end(MemoryStore::with_clock(clock.clone()), &clock).await;
    let server = RedisServer::start();
    headers_tell_the_periods_end(server.store("hdr:", &clock).await, &clock).await;
}

/// Two instances on one store count one period: 4 a day in Paris, spent through both, denied
/// on both, renewed on both at midnight in Paris.
async fn two_instances_share_a_period<St: Store>(a: St, b: St, clock: &ManualClock) {
    let policy = || plan("shared", "4/day", zone("Europe/Paris"));
    let (a, b) = (
        global_layer(a, policy(), clock),
        global_layer(b, policy(), clock),
    );
    clock.set_micros(at("Europe/Paris", (2026, 3, 28), 23, 0));
    for i in 0..4 {
        let on = if i % 2 == 0 { &a } else { &b };
        assert!(check(on).await.0, "request {i}");
    }
    // The night summer time starts: an hour to midnight.
    assert_eq!(check(&a).await.3, Some(H));
    assert_eq!(check(&b).await.3, Some(H));
    clock.set_micros(at("Europe/Paris", (2026, 3, 29), 0, 0));
    assert!(check(&b).await.0);
    assert_eq!(check(&a).await.1, 2, "one period on both");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_a_period() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let (a, b) = (
        server.store("two:", &clock).await,
        server.store("two:", &clock).await,
    );
    two_instances_share_a_period(a, b, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_the_cluster_share_a_period() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let store = async || cluster.store("two:", &clock).await;
    two_instances_share_a_period(store().await, store().await, &clock).await;
    // And the month ends of every case on the cluster.
    periods_end_where_the_calendar_says(store().await, &clock).await;
}

/// On Redis's own clock (no injected one): a day in UTC ends at the next midnight UTC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_time_a_day_ends_at_midnight() {
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    // Not within a minute of midnight: wait for the next day then.
    let to_midnight = DAY - now() % DAY;
    if to_midnight < 60 * S {
        tokio::time::sleep(Duration::from_micros(to_midnight + S)).await;
    }
    let server = RedisServer::start();
    let store = server.store_calling("real:", None, true).await;
    let on_redis_time = |store| {
        RateLimitLayer::builder()
            .store(store)
            .key(GlobalKey)
            .policy(plan("daily", "2/day", Calendar::utc()))
            .build()
            .unwrap()
    };
    let (a, b) = (on_redis_time(store.clone()), on_redis_time(store));
    assert!(check(&a).await.0 && check(&b).await.0);
    let (allowed, _, _, retry, window) = check(&a).await;
    let expected = DAY - now() % DAY;
    let retry = retry.expect("denied until midnight");
    assert!(!allowed && window == DAY);
    assert!(
        retry <= expected + S && retry + 10 * S >= expected,
        "retry after {retry} µs, midnight in {expected} µs"
    );
}

#[test]
fn calendar_mistakes_are_build_errors() {
    let cases = [
        (
            Policy::gcra("10/day").calendar(Calendar::utc()),
            "counted by the fixed window",
        ),
        (
            Policy::token_bucket("10000/month"),
            "counted by the fixed window",
        ),
        (
            Policy::fixed_window("10/h").calendar(Calendar::utc()),
            "one day, one week or one month",
        ),
        (
            Policy::fixed_window("10/2d").calendar(Calendar::utc()),
            "one day, one week or one month",
        ),
        (
            Policy::fixed_window("10/day").calendar(Calendar::utc().month_starts_on(0)),
            "1 to 31",
        ),
    ];
    for (policy, expected) in cases {
        let error = build_error(policy);
        assert!(error.contains(expected), "{error}");
    }
    let error = Calendar::in_zone("Europe/Atlantis")
        .unwrap_err()
        .to_string();
    assert!(error.contains("unknown time zone"), "{error}");
}

/// A reload keeps the period's usage: 3 a month becomes 5, two used stay used, on both stores.
async fn a_reload_keeps_the_periods_usage<St: Store>(store: St, clock: &ManualClock) {
    let layer = global_layer(
        store,
        plan("reloaded", "3/month", zone("Asia/Kolkata")),
        clock,
    );
    clock.set_micros(at("Asia/Kolkata", (2026, 5, 20), 10, 0));
    check(&layer).await;
    check(&layer).await;
    layer
        .control()
        .reload([plan("reloaded", "5/month", zone("Asia/Kolkata"))])
        .unwrap();
    assert_eq!(check(&layer).await.1, 2, "two of five were used");
    let end = at("Asia/Kolkata", (2026, 6, 1), 0, 0);
    clock.set_micros(end);
    assert_eq!(check(&layer).await.1, 4, "June starts afresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_periods_usage_on_both_stores() {
    let clock = ManualClock::new();
    a_reload_keeps_the_periods_usage(MemoryStore::with_clock(clock.clone()), &clock).await;
    let server = RedisServer::start();
    a_reload_keeps_the_periods_usage(server.store("reload:", &clock).await, &clock).await;
}
