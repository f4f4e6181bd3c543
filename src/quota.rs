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

    const fn from_micros(limit: NonZeroU32, window_us: u64) -> Self {
        Quota {
            limit,
            window_us,
            burst: None,
        }
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
        let q = Quota::new((self.limit() / d).max(1), self.window())?;
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
    /// `s`/`sec`/`second`, `m`/`min`/`minute`, `h`/`hour`, `d`/`day` (plurals accepted).
    /// Spaces around the parts are ignored. Examples: `10/s`, `100/min`, `5000/h`, `20/10s`,
    /// `1/500ms`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &'static str| QuotaError::Syntax {
            input: truncate(s),
            reason,
        };
        let (limit, window) = s
            .split_once('/')
            .ok_or_else(|| bad("expected LIMIT/WINDOW, e.g. 10/s or 20/10s"))?;
        let limit = limit.trim();
        if limit.is_empty() || !limit.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the limit must be a whole number"));
        }
        let limit: u32 = limit
            .parse()
            .map_err(|_| bad("the limit does not fit in 32 bits"))?;
        let window = window.trim();
        let digits = window.bytes().take_while(|b| b.is_ascii_digit()).count();
        let (count, unit) = window.split_at(digits);
        let count: u64 = if count.is_empty() {
            1
        } else {
            count
                .parse()
                .map_err(|_| bad("the window count is too large"))?
        };
        let unit_us: u64 = match unit.trim() {
            "us" | "µs" => 1,
            "ms" => 1_000,
            "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
            "h" | "hr" | "hour" | "hours" => 3_600_000_000,
            "d" | "day" | "days" => 86_400_000_000,
            "" => return Err(bad("the window needs a unit: us, ms, s, min, h or d")),
            _ => return Err(bad("unknown window unit; use us, ms, s, min, h or d")),
        };
        if count == 0 {
            return Err(QuotaError::ZeroWindow);
        }
        let window_us = count
            .checked_mul(unit_us)
            .ok_or(QuotaError::WindowTooLong(MAX_WINDOW))?;
        Quota::new(limit, Duration::from_micros(window_us))
    }
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
