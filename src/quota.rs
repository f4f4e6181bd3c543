//! Quotas: how many units a key may spend per window, and how much burst it may take at once.
//!
//! A [`Quota`] is a value type that cannot hold a zero limit, a zero window or a zero burst:
//! the `const` constructors take [`NonZeroU32`] and the fallible ones return a [`QuotaError`]
//! that says what is wrong. Quotas also parse from the short strings people write in config
//! files:
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::Quota;
//!
//! let q: Quota = "100/min".parse().unwrap();
//! assert_eq!(q.limit(), 100);
//! assert_eq!(q.window(), Duration::from_secs(60));
//!
//! // Any window: 20 requests per 10 seconds.
//! let q: Quota = "20/10s".parse().unwrap();
//! assert_eq!(q.window(), Duration::from_secs(10));
//!
//! // Zero is rejected with a message, never a panic later.
//! let err = "0/s".parse::<Quota>().unwrap_err();
//! assert!(err.to_string().contains("zero"));
//! ```

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

/// The longest window a quota may have: 366 days.
///
/// Longer windows gain nothing for rate limiting and would push the integer arithmetic shared
/// with the Redis scripts towards its bounds.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// A rate: `limit` units per `window`, with an optional `burst` for the algorithms that have one.
///
/// Time is kept in whole microseconds (the resolution shared with Redis `TIME`), so a window must
/// be at least one microsecond and at most [`MAX_WINDOW`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: NonZeroU32,
    window_us: u64,
    burst: Option<NonZeroU32>,
    /// A calendar month (its `window_us` is the longest, 31 days).
    monthly: bool,
}

impl Quota {
    /// `limit` per second.
    pub const fn per_second(limit: NonZeroU32) -> Self {
        Self::from_micros(limit, 1_000_000)
    }

    /// `limit` per minute.
    pub const fn per_minute(limit: NonZeroU32) -> Self {
        Self::from_micros(limit, 60_000_000)
    }

    /// `limit` per hour.
    pub const fn per_hour(limit: NonZeroU32) -> Self {
        Self::from_micros(limit, 3_600_000_000)
    }

    /// `limit` per day.
    pub const fn per_day(limit: NonZeroU32) -> Self {
        Self::from_micros(limit, 86_400_000_000)
    }

    /// `limit` per week (seven days; with a [`Calendar`](crate::calendar::Calendar), from the day weeks
    /// start on).
    pub const fn per_week(limit: NonZeroU32) -> Self {
        Self::from_micros(limit, 7 * 86_400_000_000)
    }

    /// `limit` per calendar month: counted by a fixed window with a
    /// [`Calendar`](crate::calendar::Calendar) (UTC, from the 1st, when the policy names none), each
    /// month from its first day to the next one's, 28 to 31 days. Its [`window`](Self::window)
    /// is the longest month, 31 days.
    pub const fn per_month(limit: NonZeroU32) -> Self {
        let mut q = Self::from_micros(limit, 31 * 86_400_000_000);
        q.monthly = true;
        q
    }

    const fn from_micros(limit: NonZeroU32, window_us: u64) -> Self {
        Quota {
            limit,
            window_us,
            burst: None,
            monthly: false,
        }
    }

    /// Whether the quota counts calendar months.
    pub const fn is_monthly(&self) -> bool {
        self.monthly
    }

    /// `limit` per any `window`.
    ///
    /// Fails when `limit` is zero, or when `window` is shorter than one microsecond or longer
    /// than [`MAX_WINDOW`].
    pub fn new(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        let limit = NonZeroU32::new(limit).ok_or(QuotaError::ZeroLimit)?;
        if window > MAX_WINDOW {
            return Err(QuotaError::WindowTooLong(window));
        }
        let window_us = window.as_micros() as u64;
        if window_us == 0 {
            return Err(QuotaError::ZeroWindow);
        }
        Ok(Self::from_micros(limit, window_us))
    }

    /// Sets the burst: how many units a fresh key may spend at once.
    ///
    /// Only the bucket algorithms (token bucket, leaky bucket, GCRA) have a burst; it defaults to
    /// the limit. The window algorithms reject a quota with a burst when the layer is built.
    pub const fn with_burst(mut self, burst: NonZeroU32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Like [`Quota::with_burst`], for a plain integer: fails when `burst` is zero.
    pub fn try_with_burst(self, burst: u32) -> Result<Self, QuotaError> {
        let burst = NonZeroU32::new(burst).ok_or(QuotaError::ZeroBurst)?;
        Ok(self.with_burst(burst))
    }

    /// The quota with its limit and burst divided by `divisor`, rounded down but never below 1.
    pub(crate) fn divided(self, divisor: u32) -> Result<Self, QuotaError> {
        let d = divisor.max(1);
        let mut q = Quota::new((self.limit() / d).max(1), self.window())?;
        q.monthly = self.monthly;
        match self.burst() {
            Some(b) => q.try_with_burst((b / d).max(1)),
            None => Ok(q),
        }
    }

    /// Units allowed per window.
    pub const fn limit(&self) -> u32 {
        self.limit.get()
    }

    /// The window length.
    pub const fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// The window in microseconds.
    pub(crate) const fn window_us(&self) -> u64 {
        self.window_us
    }

    /// The burst, if one was set.
    pub const fn burst(&self) -> Option<u32> {
        match self.burst {
            Some(b) => Some(b.get()),
            None => None,
        }
    }

    /// The burst if set, else the limit.
    pub(crate) const fn burst_or_limit(&self) -> u32 {
        match self.burst {
            Some(b) => b.get(),
            None => self.limit.get(),
        }
    }
}

impl fmt::Display for Quota {
    /// Formats as the same short syntax [`FromStr`] accepts, e.g. `10/s`, `20/10s`, `5000/h`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.limit)?;
        if self.monthly {
            return f.write_str("month");
        }
        let us = self.window_us;
        const UNITS: [(u64, &str); 6] = [
            (86_400_000_000, "d"),
            (3_600_000_000, "h"),
            (60_000_000, "min"),
            (1_000_000, "s"),
            (1_000, "ms"),
            (1, "us"),
        ];
        for (size, name) in UNITS {
            if us.is_multiple_of(size) {
                let n = us / size;
                return if n == 1 {
                    write!(f, "{name}")
                } else {
                    write!(f, "{n}{name}")
                };
            }
        }
        unreachable!("every window is a whole number of microseconds")
    }
}

impl FromStr for Quota {
    type Err = QuotaError;

    /// Parses `LIMIT/WINDOW`, where `WINDOW` is an optional count and a unit: `us`, `ms`,
    /// `s`/`sec`/`second`, `m`/`min`/`minute`, `h`/`hour`, `d`/`day`, `w`/`week` (plurals
    /// accepted), or `month` alone (one calendar month, see [`Quota::per_month`]). Spaces
    /// around the parts are ignored. Examples: `10/s`, `100/min`, `5000/h`, `20/10s`,
    /// `1/500ms`, `10000/month`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quota::parse(s).map_err(|e| match e {
            ParseError::Syntax(reason) => QuotaError::Syntax {
                input: truncate(s),
                reason,
            },
            ParseError::ZeroLimit => QuotaError::ZeroLimit,
            ParseError::ZeroWindow => QuotaError::ZeroWindow,
            ParseError::WindowTooLong(us) => QuotaError::WindowTooLong(Duration::from_micros(us)),
        })
    }
}

/// Why [`Quota::parse`] failed, without allocating (it runs at compile time too).
enum ParseError {
    Syntax(&'static str),
    ZeroLimit,
    ZeroWindow,
    /// The window, in microseconds (saturated).
    WindowTooLong(u64),
}

impl ParseError {
    /// The message of a compile-time failure.
    const fn message(&self) -> &'static str {
        match self {
            ParseError::Syntax(reason) => reason,
            ParseError::ZeroLimit => "quota limit is zero; it must be at least 1",
            ParseError::ZeroWindow => "quota window is zero",
            ParseError::WindowTooLong(_) => "quota window is too long; the maximum is 366 days",
        }
    }
}

/// The decimal number `digits` (ASCII digits only, checked by the caller), or `None` when it
/// does not fit.
const fn number(digits: &[u8]) -> Option<u64> {
    match core::str::from_utf8(digits) {
        Ok(text) => match u64::from_str_radix(text, 10) {
            Ok(n) => Some(n),
            Err(_) => None,
        },
        Err(_) => None,
    }
}

/// Microseconds in one window unit (0 for a calendar month, which `counted`, a count other
/// than one before it, makes an error).
const fn unit_us(unit: &[u8], counted: bool) -> Result<u64, ParseError> {
    match unit {
        b"us" | b"\xc2\xb5s" => Ok(1), // "µs" in UTF-8
        b"ms" => Ok(1_000),
        b"s" | b"sec" | b"secs" | b"second" | b"seconds" => Ok(1_000_000),
        b"m" | b"min" | b"mins" | b"minute" | b"minutes" => Ok(60_000_000),
        b"h" | b"hr" | b"hour" | b"hours" => Ok(3_600_000_000),
        b"d" | b"day" | b"days" => Ok(86_400_000_000),
        b"w" | b"week" | b"weeks" => Ok(7 * 86_400_000_000),
        b"mo" | b"month" | b"months" if counted => Err(ParseError::Syntax(
            "a monthly quota counts one calendar month, e.g. 10000/month",
        )),
        b"mo" | b"month" | b"months" => Ok(0),
        b"" => Err(ParseError::Syntax(
            "the window needs a unit: us, ms, s, min, h, d, w or month",
        )),
        _ => Err(ParseError::Syntax(
            "unknown window unit; use us, ms, s, min, h, d, w or month",
        )),
    }
}

impl Quota {
    /// The one parser of the quota syntax, for [`FromStr`] and, at compile time, for
    /// [`quota!`](crate::quota!).
    const fn parse(s: &str) -> Result<Quota, ParseError> {
        let s = s.as_bytes();
        let mut slash = 0;
        while slash < s.len() && s[slash] != b'/' {
            slash += 1;
        }
        if slash == s.len() {
            return Err(ParseError::Syntax(
                "expected LIMIT/WINDOW, e.g. 10/s or 20/10s",
            ));
        }
        let (limit, window) = s.split_at(slash);
        let limit = match Quota::parse_limit(limit) {
            Ok(limit) => limit,
            Err(e) => return Err(e),
        };
        let window = window.split_at(1).1.trim_ascii();
        let mut digits = 0;
        while digits < window.len() && window[digits].is_ascii_digit() {
            digits += 1;
        }
        let (count, unit) = window.split_at(digits);
        let count = if count.is_empty() {
            1
        } else {
            match number(count) {
                Some(n) => n,
                None => return Err(ParseError::Syntax("the window count is too large")),
            }
        };
        let unit_us = match unit_us(unit.trim_ascii(), digits > 0 && count != 1) {
            Ok(us) => us,
            Err(e) => return Err(e),
        };
        if count == 0 {
            return Err(ParseError::ZeroWindow);
        }
        if unit_us == 0 {
            return match NonZeroU32::new(limit as u32) {
                Some(limit) => Ok(Quota::per_month(limit)),
                None => Err(ParseError::ZeroLimit),
            };
        }
        let Some(window_us) = count.checked_mul(unit_us) else {
            return Err(ParseError::WindowTooLong(MAX_WINDOW.as_micros() as u64));
        };
        let Some(limit) = NonZeroU32::new(limit as u32) else {
            return Err(ParseError::ZeroLimit);
        };
        if window_us > MAX_WINDOW.as_micros() as u64 {
            return Err(ParseError::WindowTooLong(window_us));
        }
        Ok(Quota::from_micros(limit, window_us))
    }

    /// The limit of a quota (before the `/`): a whole number that fits in 32 bits.
    const fn parse_limit(limit: &[u8]) -> Result<u64, ParseError> {
        let limit = limit.trim_ascii();
        let mut i = 0;
        while i < limit.len() && limit[i].is_ascii_digit() {
            i += 1;
        }
        if limit.is_empty() || i < limit.len() {
            return Err(ParseError::Syntax("the limit must be a whole number"));
        }
        match number(limit) {
            Some(n) if n <= u32::MAX as u64 => Ok(n),
            _ => Err(ParseError::Syntax("the limit does not fit in 32 bits")),
        }
    }

    /// Parses a quota at compile time; a mistake is a compile error. Use it through
    /// [`quota!`](crate::quota!).
    #[doc(hidden)]
    pub const fn parse_or_panic(s: &str) -> Quota {
        match Quota::parse(s) {
            Ok(q) => q,
            Err(e) => panic!("{}", e.message()),
        }
    }
}

/// A [`Quota`] from a literal such as `"10/s"`, checked at compile time: a quota that does not
/// parse, a zero limit or window, or a window over [`MAX_WINDOW`] does not compile.
///
/// ```
/// use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp, quota};
///
/// let layer = RateLimitLayer::new(Policy::gcra(quota!("10/s")), PeerIp::new());
/// # let _ = layer;
/// ```
///
/// ```compile_fail
/// let q = tower_ratelimit::quota!("0/s"); // error: quota limit is zero
/// ```
#[macro_export]
macro_rules! quota {
    ($quota:literal) => {
        const { $crate::Quota::parse_or_panic($quota) }
    };
}

impl TryFrom<&str> for Quota {
    type Error = QuotaError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl TryFrom<String> for Quota {
    type Error = QuotaError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

fn truncate(s: &str) -> String {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Why a [`Quota`] could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit was zero: a quota must allow at least one unit per window.
    ZeroLimit,
    /// The window was zero (or shorter than one microsecond).
    ZeroWindow,
    /// The burst was zero.
    ZeroBurst,
    /// The window was longer than [`MAX_WINDOW`].
    WindowTooLong(Duration),
    /// The string did not parse.
    Syntax {
        /// The input (cut to 64 bytes).
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::ZeroLimit => f.write_str("quota limit is zero; it must be at least 1"),
            QuotaError::ZeroWindow => {
                f.write_str("quota window is zero; it must be at least one microsecond")
            }
            QuotaError::ZeroBurst => f.write_str("quota burst is zero; it must be at least 1"),
            QuotaError::WindowTooLong(w) => write!(
                f,
                "quota window of {w:?} is too long; the maximum is {} days",
                MAX_WINDOW.as_secs() / 86_400
            ),
            QuotaError::Syntax { input, reason } => {
                write!(f, "invalid quota {input:?}: {reason}")
            }
        }
    }
}

impl std::error::Error for QuotaError {}

/// What a policy's units are, as the IETF `qu` parameter says it
/// ([`Policy::unit`](crate::Policy::unit)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QuotaUnit {
    /// Requests (the default: `qu` is not sent).
    #[default]
    Requests,
    /// Bytes of content, e.g. with a cost function that charges a request's
    /// `Content-Length`: `qu="content-bytes"`.
    ContentBytes,
    /// Requests in flight at once: `qu="concurrent-requests"`.
    ConcurrentRequests,
    /// Tokens of a language model, e.g. with a cost settled at what a completion used
    /// ([`Policy::settle`](crate::Policy::settle)): `qu="tokens"`. Draft-11 names no such
    /// unit; the draft lets a policy name its own, and a client that does not know it reads
    /// the quota as a number of units.
    Tokens,
}

impl QuotaUnit {
    /// The unit's name in the `qu` parameter.
    pub const fn as_str(self) -> &'static str {
        match self {
            QuotaUnit::Requests => "requests",
            QuotaUnit::ContentBytes => "content-bytes",
            QuotaUnit::ConcurrentRequests => "concurrent-requests",
            QuotaUnit::Tokens => "tokens",
        }
    }
}

impl fmt::Display for QuotaUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for QuotaUnit {
    type Err = QuotaError;

    /// Parses `requests`, `content-bytes`, `concurrent-requests` or `tokens`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            QuotaUnit::Requests,
            QuotaUnit::ContentBytes,
            QuotaUnit::ConcurrentRequests,
            QuotaUnit::Tokens,
        ]
        .into_iter()
        .find(|u| u.as_str() == s.trim())
        .ok_or_else(|| QuotaError::Syntax {
            input: s.chars().take(64).collect(),
            reason: "unknown quota unit; expected requests, content-bytes or concurrent-requests",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT_COMPILE_TIME: Quota = crate::quota!("20/10s");

    #[test]
    fn parses_every_unit_and_count() {
        let cases = [
            ("10/s", 10, 1_000_000),
            (" 10 / second ", 10, 1_000_000),
            ("100/min", 100, 60_000_000),
            ("5/m", 5, 60_000_000),
            ("5000/h", 5000, 3_600_000_000),
            ("1/d", 1, 86_400_000_000),
            ("1/500ms", 1, 500_000),
            ("3/250us", 3, 250),
            ("3/250µs", 3, 250),
            ("20/10s", 20, 10_000_000),
            ("4294967295/366d", u32::MAX, MAX_WINDOW.as_micros() as u64),
            ("2000/week", 2000, 7 * 86_400_000_000),
            ("2000/2w", 2000, 14 * 86_400_000_000),
            ("10000/month", 10000, 31 * 86_400_000_000),
            ("10000 / 1 months", 10000, 31 * 86_400_000_000),
        ];
        for (text, limit, window_us) in cases {
            let q: Quota = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((q.limit(), q.window_us()), (limit, window_us), "{text}");
            assert_eq!(
                q.to_string().parse::<Quota>().unwrap(),
                q,
                "{text} round trip"
            );
        }
        assert_eq!(AT_COMPILE_TIME, "20/10s".parse().unwrap());
        let month: Quota = "10000/mo".parse().unwrap();
        assert!(month.is_monthly() && !"10000/31d".parse::<Quota>().unwrap().is_monthly());
        assert_eq!(month.to_string(), "10000/month");
        assert_eq!(month, Quota::per_month(NonZeroU32::new(10000).unwrap()));
    }

    #[test]
    fn says_what_is_wrong() {
        let cases = [
            ("10", "expected LIMIT/WINDOW"),
            ("ten/s", "whole number"),
            ("/s", "whole number"),
            ("4294967296/s", "32 bits"),
            ("10/", "needs a unit"),
            ("10/5", "needs a unit"),
            ("10/fortnight", "unknown window unit"),
            ("10/99999999999999999999s", "window count is too large"),
            ("0/s", "limit is zero"),
            ("10/0s", "window is zero"),
            ("10/367d", "too long"),
            ("10/9999999999999d", "too long"),
            ("10/2months", "one calendar month"),
        ];
        for (text, expected) in cases {
            let err = text.parse::<Quota>().unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}
