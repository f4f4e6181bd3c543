//! Entry points of the fuzz targets (`fuzz/`) into what no public API reaches. Compiled only
//! with `--cfg fuzzing` (as `scripts/fuzz.sh` and `cargo fuzz` build the targets): not part
//! of the crate's API.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use smallvec::smallvec;

use crate::algorithm::{Algorithm, Verdict};
use crate::calendar::{Calendar, Period, Periods};
use crate::decision::{Decision, PolicyOutcome};
use crate::headers::{HeaderConfig, HeaderStyle, PartitionKeys, RateLimitHeaders, ResetFormat};
use crate::key::Key;
use crate::policy::Tier;
use crate::quota::Quota;
use crate::store::Op;

/// What the settle reader makes of a reported cost's header value: `Cost(n)`, `Negative` or
/// `Invalid`.
pub fn reported_cost(value: &HeaderValue) -> String {
    format!("{:?}", crate::settle::Reading::of(Some(value)))
}

/// The start and end of the period of `calendar` (a day, a week or a month, as `period`
/// picks) holding `t`, in Unix microseconds; an error where `build()` refuses the calendar.
pub fn calendar_window(calendar: Calendar, period: u8, t: u64) -> Result<(u64, u64), String> {
    calendar.validate().map_err(|e| e.to_string())?;
    let period = match period % 3 {
        0 => Period::Day,
        1 => Period::Week,
        _ => Period::Month,
    };
    Ok(Periods::new(calendar, period).window(t))
}

/// One policy of a decision: its name, algorithm (an index), quota and verdict.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub name: String,
    pub algorithm: u8,
    pub quota: Quota,
    pub allowed: bool,
    pub remaining: u64,
    pub reset_after_us: u64,
    pub retry_after_us: Option<u64>,
}

/// A policy tier as a layer registers it: `name`, `algorithm` (an index), `quota`, and the
/// operation its checks make. An error where `build()` would refuse it.
fn tier(name: &str, algorithm: u8, quota: Quota, op: Op) -> Result<Arc<Tier>, String> {
    crate::policy::validate_name(name).map_err(|e| e.to_string())?;
    let algorithm = Algorithm::ALL[usize::from(algorithm) % Algorithm::ALL.len()];
    Tier::alone(name, 0, algorithm, quota, op).map_err(|e| e.to_string())
}

/// The response headers, both styles with the IETF `pk` of `key`, of a decision of
/// `outcomes`; an error where a policy would not build.
pub fn headers(outcomes: &[Outcome], key: &[u8]) -> Result<HeaderMap, String> {
    let mut decided = smallvec![];
    for o in outcomes {
        let tier = tier(&o.name, o.algorithm, o.quota, Op::Enforce)?;
        let verdict = Verdict {
            allowed: o.allowed,
            remaining: o.remaining,
            reset_after_us: o.reset_after_us,
            retry_after_us: o.retry_after_us,
        };
        decided.push(PolicyOutcome::new(&tier, false, verdict));
    }
    if outcomes.is_empty() {
        return Err("no policy".into());
    }
    Ok(headers_of(&Decision::new(decided), &Key::from(key)))
}

/// The headers of `decision`, both styles, with the IETF `pk` of `key`.
fn headers_of(decision: &Decision, key: &Key) -> HeaderMap {
    let config = HeaderConfig {
        style: HeaderStyle::Both,
        reset: ResetFormat::UnixTime,
        jitter: Duration::ZERO,
        partition: Some(PartitionKeys::new(&[7; 16]).expect("a long enough secret")),
    };
    let written = RateLimitHeaders::new(decision, &config, || 1_700_000_000_000_000, |_| Some(key));
    let mut headers = HeaderMap::new();
    written.apply(&mut headers);
    headers
}

/// The Redis store reading a decision's reply, `resp` (the bytes Redis would send), for
/// checks of the operations `ops` picks (two bytes each, at most eight: the kind, among every
/// operation, and its payload; the algorithm and a tier tag from them); then the decision's
/// headers; an odd number of bytes in `ops` adds the key's record of list entries last (whose
/// reply may say the key is listed). `None` when the reply is refused (as the store refuses
/// it: a clear error) or decides no policy (a listed key, answered without headers).
#[cfg(feature = "redis")]
pub fn read_reply(resp: &[u8], ops: &[u8]) -> Option<HeaderMap> {
    let value = redis::parse_redis_value(resp).ok()?;
    let reply: Vec<i64> = redis::FromRedisValue::from_redis_value(value).ok()?;
    let quota = Quota::new(10, Duration::from_secs(1)).expect("a quota");
    let mut checks = crate::store::Checks::new();
    for pair in ops.chunks_exact(2).take(8) {
        let (kind, payload) = (pair[0], u64::from(pair[1]));
        let op = Op::KINDS[usize::from(kind) % Op::KINDS.len()].with_payload(payload * 1_000);
        // The tier as a policy taking part by the operation would have it, else enforced.
        let tier = tier("fuzz", kind / 32, quota, op)
            .or_else(|_| tier("fuzz", kind / 32, quota, Op::Enforce))
            .ok()?;
        checks.push(crate::store::Check::new(tier, Key::from("k"), 1, op));
    }
    if ops.len() % 2 == 1 {
        // The call carries the key's record of list entries last, as a layer with lists does.
        let algorithm = crate::Algorithm::Gcra;
        let records = Tier::alone(crate::lists::RECORDS, 0, algorithm, quota, Op::ChargeIf).ok()?;
        checks.push(crate::store::Check::new(
            records,
            Key::from("k"),
            0,
            Op::ChargeIf,
        ));
    }
    if checks.is_empty() {
        return None;
    }
    let decision = crate::store::redis_decision(&checks, &reply).ok()?;
    if decision.outcomes().is_empty() {
        // A listed key (or a call of the record alone): the engine answers it without
        // headers (`unlisted`), as the lists' step.
        return None;
    }
    Some(headers_of(&decision, &Key::from("k")))
}

/// An administrator's entry, `text` (and the same bytes as a key), made the keys of each
/// extractor (an address key, a client address behind a proxy, an API key, a header, the
/// global key, and an API key or else the address), every key kept as the layer keeps it;
/// and `secs` as an entry's end (`until`) given to a layer's deny and allow lists and to a
/// key's own limit; `text` as a list entry (`lists::Entry`) put on the deny list and taken
/// off: every mistake an error, never a panic.
pub fn entry(text: &str, bytes: &[u8], secs: u64) {
    use crate::key::{ApiKey, ClientIp, GlobalKey, HeaderKey, KeyExtractor, PeerIp};
    let extractors: Vec<Box<dyn KeyExtractor>> = vec![
        Box::new(PeerIp::new()),
        Box::new(ClientIp::new(["10.0.0.0/8"]).expect("a network")),
        Box::new(ApiKey::bearer()),
        Box::new(HeaderKey::try_new("x-key").expect("a header name")),
        Box::new(GlobalKey),
        Box::new(ApiKey::bearer().or(PeerIp::new())),
    ];
    for entry in [Key::from(text), Key::from(bytes)] {
        for extractor in &extractors {
            if let Ok(keys) = extractor.entry_keys(&entry) {
                for key in keys {
                    let _ = key.compact();
                }
            }
        }
    }
    let layer = crate::RateLimitLayer::builder()
        .policy(crate::Policy::gcra("10/s").name("fuzz"))
        .key(HeaderKey::try_new("x-key").expect("a header name"))
        .lists(crate::lists::Lists::new().deny([text]))
        .build();
    let Ok(layer) = layer else { return };
    let until = std::time::UNIX_EPOCH.checked_add(Duration::from_secs(secs));
    let key = Key::from(text);
    // The memory store answers at once: one poll decides.
    let poll = |future: std::pin::Pin<&mut dyn std::future::Future<Output = ()>>| {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let _ = future.poll(&mut cx);
    };
    poll(std::pin::pin!(async {
        let _ = layer.control().deny_key(&key, until).await;
    }));
    poll(std::pin::pin!(async {
        let _ = layer.control().allow_key(&key, until).await;
    }));
    // The same text as a list entry, put on and taken off as the runtime operations take it.
    if let Ok(entry) = text.parse::<crate::lists::Entry>() {
        poll(std::pin::pin!(async {
            let _ = layer.control().deny(entry.clone(), until).await;
            let _ = layer.control().remove_denied(entry).await;
        }));
    }
    poll(std::pin::pin!(async {
        let _ = layer.control().set_limit("fuzz", &key, "5/s", until).await;
    }));
}

/// What the settle reader reads at `/usage/total_tokens` of a response body `body` (a stream
/// of server-sent events when `events`): given whole, and cut in two at `cut`. The two are
/// the same however the body is cut.
#[cfg(feature = "json")]
pub fn json_cost(body: &[u8], events: bool, cut: usize) -> (String, String) {
    let read = |chunks: &[&[u8]]| {
        let mut cost = crate::settle::JsonCost::new("/usage/total_tokens".into(), events);
        for chunk in chunks {
            cost.observe(chunk);
        }
        format!("{:?}", cost.finish())
    };
    let (a, b) = body.split_at(cut.min(body.len()));
    (read(&[body]), read(&[a, b]))
}

/// What the settle reader reads at `/usage/total_tokens` of a stream of server-sent events
/// `body`: given whole, and cut in pieces of the lengths `cuts` names in turn (each from 1 to
/// 256 bytes, round and round; the rest whole once they are spent). The two are the same
/// however the stream is cut.
#[cfg(feature = "json")]
pub fn events_cost(body: &[u8], cuts: &[u8]) -> (String, String) {
    fn read<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> String {
        let mut cost = crate::settle::JsonCost::new("/usage/total_tokens".into(), true);
        for chunk in chunks {
            cost.observe(chunk);
        }
        format!("{:?}", cost.finish())
    }
    let mut pieces = Vec::new();
    let mut rest = body;
    for &cut in cuts.iter().cycle().take(body.len()) {
        if rest.is_empty() {
            break;
        }
        let (piece, after) = rest.split_at((usize::from(cut) + 1).min(rest.len()));
        pieces.push(piece);
        rest = after;
    }
    pieces.push(rest);
    (read([body]), read(pieces))
}

/// The pause an upstream's answer of `status` with `headers` asks for, at `now_secs` (Unix
/// seconds), in microseconds; `None` for none. Never zero. The remaining counts the headers
/// report are read too (for a panic, not a value).
pub fn upstream_pause(status: u16, headers: &[(String, Vec<u8>)], now_secs: u64) -> Option<u64> {
    let status = http::StatusCode::from_u16(status).ok()?;
    let mut map = http::HeaderMap::new();
    for (name, value) in headers {
        let (Ok(name), Ok(value)) = (
            http::HeaderName::try_from(name.as_str()),
            http::HeaderValue::from_bytes(value),
        ) else {
            continue;
        };
        map.append(name, value);
    }
    // The counts it reports are read from the same headers.
    let counts = crate::egress::counts::counts(&map);
    std::hint::black_box(counts);
    let now = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(now_secs))?;
    let (pause, _) = crate::egress::upstream::pause(status, &map, now)?;
    Some(u64::try_from(pause.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(feature = "graphql")]
mod bodies;
#[cfg(feature = "graphql")]
pub use bodies::{body_after_exhausted, body_status};
