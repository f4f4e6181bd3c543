//! What an upstream's response says about its own limit: how long its callers should pause.
//!
//! Three forms are read, the first found wins:
//!
//! * `Retry-After` (seconds, or an HTTP date) on a `429` or a `503`, or a gRPC answer of
//!   `RESOURCE_EXHAUSTED` or `UNAVAILABLE`, whose time may also be gRPC's server pushback
//!   (`grpc-retry-pushback-ms`);
//! * the IETF fields, `RateLimit: "default";r=0;t=30` (a policy with no units left for `t`
//!   seconds; the longest of those exhausted), and the older dictionary form of the drafts,
//!   `RateLimit: limit=100, remaining=0, reset=30`;
//! * `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset` (seconds to wait, or the Unix time
//!   of the reset when it is one: GitHub's form) or `X-RateLimit-Reset-After` (seconds);
//!   OpenAI's `x-ratelimit-remaining-requests: 0` (or `-tokens`) with
//!   `x-ratelimit-reset-requests: 6m0s` (a duration); Anthropic's
//!   `anthropic-ratelimit-requests-remaining: 0` (or `-tokens`, `-input-tokens`,
//!   `-output-tokens`) with `anthropic-ratelimit-requests-reset` (an RFC 3339 time). Of
//!   several exhausted, the longest.
//!
//! A value that cannot be read is ignored, never an error: an upstream's headers are input.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, StatusCode};

/// Where an upstream asked for a pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    RetryAfter,
    Pushback,
    RateLimit,
    XRateLimit,
}

impl Source {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Source::RetryAfter => "retry-after",
            Source::Pushback => "grpc-retry-pushback",
            Source::RateLimit => "ratelimit",
            Source::XRateLimit => "x-ratelimit",
        }
    }
}

/// Whether an answer of `status` with `headers` is an upstream's refusal for its limit (or
/// its load): the metric label of it (`429`, `503`, or a gRPC trailers-only answer's
/// `grpc-8`, `RESOURCE_EXHAUSTED`, and `grpc-14`, `UNAVAILABLE`).
pub(crate) fn refusal(status: StatusCode, headers: &HeaderMap) -> Option<&'static str> {
    match status {
        StatusCode::TOO_MANY_REQUESTS => return Some("429"),
        StatusCode::SERVICE_UNAVAILABLE => return Some("503"),
        _ => {}
    }
    const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
    match headers.get(GRPC_STATUS)?.as_bytes() {
        b"8" => Some("grpc-8"),
        b"14" => Some("grpc-14"),
        _ => None,
    }
}

/// Whether `headers` hold a field of a rate-limit family: one look at each field's name, so
/// that an answer saying nothing of the upstream's limit (the usual one, when it is not a
/// refusal) is not searched for each field by name.
pub(crate) fn names_a_limit(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| {
        let name = name.as_str();
        name.starts_with("ratelimit")
            || name.starts_with("x-ratelimit")
            || name.starts_with("anthropic-ratelimit")
    })
}

/// Whether an answer of `status` with `headers` is a refusal (see [`refusal`]).
pub(crate) fn refused(status: StatusCode, headers: &HeaderMap) -> bool {
    refusal(status, headers).is_some()
}

/// How long the upstream that answered `status` with `headers` at `now` asks to be left alone,
/// and where it said so; `None` when it asks for nothing (or for no time at all).
pub(crate) fn pause(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<(Duration, Source)> {
    let retry_after = || {
        let after = retry_after(headers, now).map(|d| (d, Source::RetryAfter));
        after.or_else(|| pushback(headers).map(|d| (d, Source::Pushback)))
    };
    let found = refused(status, headers)
        .then(retry_after)
        .flatten()
        .or_else(|| ietf(headers).map(|d| (d, Source::RateLimit)))
        .or_else(|| legacy(headers, now).map(|d| (d, Source::XRateLimit)));
    found.filter(|(d, _)| !d.is_zero())
}

/// `Retry-After`: delay-seconds (a fraction tolerated) or an HTTP date.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    seconds(value).or_else(|| {
        let date = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
        let secs = u64::try_from(date.as_second()).ok()?;
        Some(until(
            UNIX_EPOCH.checked_add(Duration::from_secs(secs))?,
            now,
        ))
    })
}

/// gRPC's server pushback (`grpc-retry-pushback-ms`, in a trailers-only answer): a
/// non-negative number of milliseconds (a negative one says not to retry: no time named).
fn pushback(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-retry-pushback-ms")?.to_str().ok()?;
    value.trim().parse().ok().map(Duration::from_millis)
}

/// Non-negative seconds, a fraction tolerated.
pub(super) fn seconds(value: &str) -> Option<Duration> {
    let value = value.trim();
    if !value.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let s: f64 = value.parse().ok()?;
    (s.is_finite() && s >= 0.0).then(|| Duration::try_from_secs_f64(s).ok())?
}

/// The time from `now` to `then` (zero when it is past).
fn until(then: SystemTime, now: SystemTime) -> Duration {
    then.duration_since(now).unwrap_or_default()
}

/// The IETF `RateLimit` field: the longest reset of the policies with nothing left.
fn ietf(headers: &HeaderMap) -> Option<Duration> {
    let mut longest: Option<Duration> = None;
    for value in headers.get_all("ratelimit") {
        let Ok(value) = value.to_str() else { continue };
        for (remaining, reset) in ietf_items(value) {
            if remaining == Some(0)
                && let Some(reset) = reset
            {
                longest = Some(longest.map_or(reset, |l| l.max(reset)));
            }
        }
    }
    longest
}

/// Each policy of a `RateLimit` field's value: what it has left and when it resets. The
/// older dictionary form (`limit=…, remaining=…, reset=…`) is one policy.
fn ietf_items(value: &str) -> Vec<(Option<u64>, Option<Duration>)> {
    let members = split_outside_quotes(value, ',');
    let dictionary = members
        .iter()
        .all(|m| !m.trim_start().starts_with('"') && m.contains('=') && !m.contains(';'));
    if dictionary {
        let (mut remaining, mut reset) = (None, None);
        for member in &members {
            match member.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                Some(("remaining", v)) => remaining = v.parse().ok(),
                Some(("reset", v)) => reset = seconds(v),
                _ => {}
            }
        }
        return vec![(remaining, reset)];
    }
    let params = |member: &str| {
        let (mut remaining, mut reset) = (None, None);
        for param in split_outside_quotes(member, ';').into_iter().skip(1) {
            match param.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                Some(("r", v)) => remaining = v.parse().ok(),
                Some(("t", v)) => reset = seconds(v),
                _ => {}
            }
        }
        (remaining, reset)
    };
    members.iter().map(|m| params(m)).collect()
}

/// `value` split at each `separator` outside a quoted string.
pub(super) fn split_outside_quotes(value: &str, separator: char) -> Vec<&str> {
    let (mut parts, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                parts.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&value[start..]);
    parts
}

/// OpenAI's remaining and reset fields, of requests and of tokens.
const OPENAI: [(&str, &str); 2] = [
    (
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
];

/// Anthropic's remaining and reset fields.
const ANTHROPIC: [(&str, &str); 4] = [
    (
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
    ),
    (
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    ),
    (
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
    ),
    (
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
    ),
];

/// The longest reset of the `X-RateLimit-*` families with nothing left.
fn legacy(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    let exhausted = |name: &str| text(name).and_then(|r| r.parse::<u64>().ok()) == Some(0);
    let mut longest = plain(headers, now);
    let mut longer = |reset: Option<Duration>| {
        if let Some(reset) = reset {
            longest = Some(longest.map_or(reset, |l| l.max(reset)));
        }
    };
    for (remaining, reset) in OPENAI {
        if exhausted(remaining) {
            longer(text(reset).and_then(go_duration));
        }
    }
    for (remaining, reset) in ANTHROPIC {
        if exhausted(remaining) {
            let at = text(reset);
            let at = at.and_then(|t| t.parse::<jiff::Timestamp>().ok());
            let ms = at.and_then(|t| u64::try_from(t.as_millisecond()).ok());
            let at = ms.and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)));
            longer(at.map(|at| until(at, now)));
        }
    }
    longest
}

/// A duration as Go writes it (OpenAI's resets): `6m0s`, `1.5s`, `20ms`, `1h2m3s`.
fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let value: f64 = rest[..number].parse().ok()?;
        rest = &rest[number..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit..];
    }
    Duration::try_from_secs_f64(total).ok()
}

/// `X-RateLimit-Remaining: 0` with its reset, as seconds or as a Unix time.
fn plain(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    if text("x-ratelimit-remaining")?.parse::<u64>().ok()? != 0 {
        return None;
    }
    if let Some(after) = text("x-ratelimit-reset-after").and_then(seconds) {
        return Some(after);
    }
    let reset = seconds(text("x-ratelimit-reset")?)?;
    // A value past the year 2001 in seconds is a time, not a delay (no upstream asks for a
    // pause of 31 years); past it in milliseconds, a time in milliseconds.
    const A_TIME: u64 = 1_000_000_000;
    Some(match reset.as_secs() {
        s if s >= A_TIME * 1000 => until(UNIX_EPOCH.checked_add(Duration::from_millis(s))?, now),
        s if s >= A_TIME => until(UNIX_EPOCH.checked_add(reset)?, now),
        _ => reset,
    })
}

/// A header map of `pairs`, for the tests of the upstream's parsers.
#[cfg(test)]
pub(super) fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, value.parse().unwrap());
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn at(pairs: &[(&'static str, &str)], status: u16) -> Option<(Duration, Source)> {
        let status = StatusCode::from_u16(status).unwrap();
        pause(
            status,
            &headers(pairs),
            UNIX_EPOCH + Duration::from_secs(NOW),
        )
    }

    #[test]
    fn a_grpc_refusal_is_read_from_its_status_with_retry_after_or_pushback() {
        let exhausted = [("grpc-status", "8"), ("retry-after", "2")];
        assert_eq!(
            at(&exhausted, 200),
            Some((Duration::from_secs(2), Source::RetryAfter))
        );
        let pushback = [("grpc-status", "14"), ("grpc-retry-pushback-ms", "1500")];
        assert_eq!(
            at(&pushback, 200),
            Some((Duration::from_millis(1500), Source::Pushback))
        );
        // A success, or a pushback saying not to retry: no pause.
        assert_eq!(at(&[("grpc-status", "0"), ("retry-after", "2")], 200), None);
        assert_eq!(
            at(
                &[("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")],
                200
            ),
            None
        );
        let status = StatusCode::OK;
        assert_eq!(
            refusal(status, &headers(&[("grpc-status", "8")])),
            Some("grpc-8")
        );
        assert_eq!(refusal(status, &headers(&[("grpc-status", "5")])), None);
    }

    #[test]
    fn retry_after_is_read_on_a_refusal_in_seconds_or_as_a_date() {
        let secs = |s| Some((Duration::from_secs(s), Source::RetryAfter));
        assert_eq!(at(&[("retry-after", "2")], 429), secs(2));
        assert_eq!(at(&[("retry-after", " 120 ")], 503), secs(120));
        assert_eq!(
            at(&[("retry-after", "1.5")], 429),
            Some((Duration::from_millis(1500), Source::RetryAfter))
        );
        // 1,800,000,000 s is 2027-01-15T08:00:00Z.
        assert_eq!(
            at(&[("retry-after", "Fri, 15 Jan 2027 08:00:30 GMT")], 429),
            secs(30)
        );
        // Past, zero, nonsense or on a success: no pause.
        assert_eq!(
            at(&[("retry-after", "Fri, 15 Jan 2027 07:00:00 GMT")], 429),
            None
        );
        assert_eq!(at(&[("retry-after", "0")], 429), None);
        assert_eq!(at(&[("retry-after", "-3")], 429), None);
        assert_eq!(at(&[("retry-after", "soon")], 429), None);
        assert_eq!(at(&[("retry-after", "NaN")], 429), None);
        assert_eq!(at(&[("retry-after", "2")], 200), None);
        assert_eq!(at(&[], 429), None);
    }

    #[test]
    fn the_ietf_field_pauses_for_the_longest_exhausted_policy() {
        let secs = |s| Some((Duration::from_secs(s), Source::RateLimit));
        assert_eq!(at(&[("ratelimit", "\"default\";r=0;t=2")], 429), secs(2));
        // On any status: the upstream says nothing is left.
        assert_eq!(at(&[("ratelimit", "\"default\";r=0;t=2")], 200), secs(2));
        assert_eq!(at(&[("ratelimit", "\"default\";r=5;t=2")], 429), None);
        let two = "\"burst\";r=0;t=1, \"day\";r=0;t=3600, \"min\";r=4;t=50";
        assert_eq!(at(&[("ratelimit", two)], 429), secs(3600));
        // A policy name with a comma and a semicolon in its quotes; a token name.
        assert_eq!(at(&[("ratelimit", "\"a,b;c\";t=7;r=0")], 429), secs(7));
        assert_eq!(at(&[("ratelimit", "day;r=0;t=9")], 429), secs(9));
        // The drafts' dictionary.
        assert_eq!(
            at(&[("ratelimit", "limit=10, remaining=0, reset=5")], 429),
            secs(5)
        );
        assert_eq!(
            at(&[("ratelimit", "limit=10, remaining=3, reset=5")], 429),
            None
        );
        // Retry-After comes first on a refusal.
        let both = [("retry-after", "4"), ("ratelimit", "\"d\";r=0;t=9")];
        assert_eq!(
            at(&both, 429),
            Some((Duration::from_secs(4), Source::RetryAfter))
        );
        assert_eq!(at(&[("ratelimit", "\"d\";r=zero;t=9,,;;")], 429), None);
    }

    #[test]
    fn the_x_ratelimit_fields_pause_until_their_reset() {
        let secs = |s| Some((Duration::from_secs(s), Source::XRateLimit));
        let reset = |r: &str| {
            at(
                &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", r)],
                200,
            )
        };
        assert_eq!(reset("30"), secs(30));
        assert_eq!(reset(&(NOW + 45).to_string()), secs(45));
        assert_eq!(reset(&((NOW + 45) * 1000).to_string()), secs(45));
        assert_eq!(reset(&(NOW - 45).to_string()), None);
        // Times past what the clock can hold are no pause, not a panic.
        assert_eq!(reset("18446744073709551615"), None);
        assert_eq!(reset("1e300"), None);
        let after = [
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset-after", "2.5"),
        ];
        assert_eq!(
            at(&after, 429),
            Some((Duration::from_millis(2500), Source::XRateLimit))
        );
        let left = [("x-ratelimit-remaining", "1"), ("x-ratelimit-reset", "30")];
        assert_eq!(at(&left, 429), None);
    }

    #[test]
    fn the_llm_providers_fields_pause_for_their_longest_exhausted_limit() {
        let secs = |s| Some((Duration::from_secs(s), Source::XRateLimit));
        let openai = [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1m30s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ];
        assert_eq!(at(&openai, 200), secs(360));
        let tokens_left = [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1.5s"),
            ("x-ratelimit-remaining-tokens", "900"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ];
        assert_eq!(
            at(&tokens_left, 200),
            Some((Duration::from_millis(1500), Source::XRateLimit))
        );
        assert_eq!(
            at(
                &[
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "20ms")
                ],
                200
            ),
            Some((Duration::from_millis(20), Source::XRateLimit))
        );
        assert_eq!(
            at(
                &[
                    ("x-ratelimit-remaining-tokens", "0"),
                    ("x-ratelimit-reset-tokens", "6 minutes")
                ],
                200
            ),
            None
        );
        // 1,800,000,000 s is 2027-01-15T08:00:00Z.
        let anthropic = [
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2027-01-15T08:00:42Z",
            ),
            ("anthropic-ratelimit-requests-remaining", "12"),
            ("anthropic-ratelimit-requests-reset", "2027-01-15T08:10:00Z"),
        ];
        assert_eq!(at(&anthropic, 200), secs(42));
        assert_eq!(go_duration("1h2m3s"), Some(Duration::from_secs(3723)));
        for bad in ["", "s", "5", "1x", "m5", "-1s"] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
    }
}
