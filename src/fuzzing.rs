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
/// checks of the operations `ops` picks (one byte each, at most eight); then the decision's
/// headers. `None` when the reply is refused (as the store refuses it: a clear error).
#[cfg(feature = "redis")]
pub fn read_reply(resp: &[u8], ops: &[u8]) -> Option<HeaderMap> {
    let value = redis::parse_redis_value(resp).ok()?;
    let reply: Vec<i64> = redis::FromRedisValue::from_redis_value(value).ok()?;
    let quota = Quota::new(10, Duration::from_secs(1)).expect("a quota");
    let checks: crate::store::Checks = (ops.iter().take(8))
        .map(|&b| {
            let op = match b % 6 {
                0 => Op::Enforce,
                1 => Op::Shadow,
                2 => Op::Concurrency,
                3 => Op::Wait {
                    max_wait_us: 1_000_000,
                },
                4 => Op::Lease { want: 5 },
                _ => Op::ChargeIf,
            };
            let tier = tier("fuzz", b / 6, quota, op).expect("a valid tier");
            crate::store::Check::new(tier, Key::from("k"), 1, op)
        })
        .collect();
    if checks.is_empty() {
        return None;
    }
    let decision = crate::store::redis_decision(&checks, &reply).ok()?;
    Some(headers_of(&decision, &Key::from("k")))
}
