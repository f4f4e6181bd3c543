//! The algorithms and the contract they share.
//!
//! Every algorithm is written once as two pure functions over a per-key state:
//!
//! * `evaluate(state, now, cost) -> Verdict` decides without changing anything: allowed or not,
//!   what remains, when the key is fully reset, and when a denied request would be admitted;
//! * `commit(state, now, cost) -> expires_at` charges an admitted request and tells when the
//!   state becomes indistinguishable from a fresh key, so the store can drop it then.
//!
//! Splitting the two lets a request subject to several policies be decided atomically: every
//! policy is evaluated first, and only when all of them admit the request is any of them
//! charged. The memory store runs these Rust functions; the Redis store runs their Lua twins
//! with the same integer arithmetic, so both give identical answers for the same sequence of
//! `(time, cost)`.
//!
//! Time is an integer number of microseconds. All arithmetic is on integers that stay below
//! 2<sup>53</sup> (checked when a policy is built), so that the Lua twins, which compute with
//! doubles, are exact too.

pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod leaky_bucket;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod token_bucket;

#[cfg(test)]
mod properties;

use std::fmt;
use std::str::FromStr;

use crate::error::ConfigError;
use crate::quota::Quota;

/// Largest integer all algorithm arithmetic may reach (exact in an IEEE double, as in Lua).
pub(crate) const MAX_EXACT: u64 = 1 << 53;

/// The rate-limiting algorithms, by the names users know them by.
///
/// | algorithm | exact? | burst | state per key |
/// |---|---|---|---|
/// | [`FixedWindow`](Algorithm::FixedWindow) | per aligned window; up to 2× the limit across a boundary | no | 2 integers |
/// | [`SlidingWindow`](Algorithm::SlidingWindow) | approximate (weighted sub-window buckets) | no | one counter per bucket |
/// | [`SlidingLog`](Algorithm::SlidingLog) | exact in every window | no | one entry per admitted request |
/// | [`TokenBucket`](Algorithm::TokenBucket) | exact rate, bursts up to capacity | yes | 2 integers |
/// | [`LeakyBucket`](Algorithm::LeakyBucket) | exact rate, bursts up to capacity | yes | 2 integers |
/// | [`Gcra`](Algorithm::Gcra) | exact rate, bursts up to burst | yes | 1 integer |
///
/// Names parse from and print as `fixed_window`, `sliding_window`, `sliding_log`,
/// `token_bucket`, `leaky_bucket` and `gcra`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Counts units in windows aligned to the clock's epoch; the count resets at each boundary.
    /// See the `fixed_window` module docs in the source for exact semantics.
    FixedWindow,
    /// Counts units in sub-window buckets and weighs the oldest bucket by how much of it is
    /// still inside the window (the "sliding window counter").
    SlidingWindow,
    /// Remembers the time of every admitted unit: exact, at a memory cost proportional to the
    /// limit.
    SlidingLog,
    /// A bucket of `burst` tokens refilled at `limit` per window; a request takes `cost` tokens.
    TokenBucket,
    /// A bucket of capacity `burst` that drains at `limit` per window; a request pours `cost`
    /// units in (the leaky bucket as a meter).
    LeakyBucket,
    /// The generic cell rate algorithm: one "theoretical arrival time" per key.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in documentation order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The snake_case name, as accepted by [`FromStr`].
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether the algorithm takes a burst different from its limit.
    pub const fn has_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('-', "_");
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == norm)
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "unknown algorithm {s:?}; expected one of gcra, token_bucket, leaky_bucket, fixed_window, sliding_window, sliding_log"
                ))
            })
    }
}

/// What an algorithm says about one request, before anything is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Whether the request may go on.
    pub(crate) allowed: bool,
    /// Units left after this request (if allowed) or now (if denied).
    pub(crate) remaining: u64,
    /// Microseconds until the key is back to a fresh state (if this request is charged, when
    /// allowed).
    pub(crate) reset_after_us: u64,
    /// For a denied request: microseconds until the same request would be admitted, or `None`
    /// when it never can be (its cost exceeds the capacity). `None` when allowed.
    pub(crate) retry_after_us: Option<u64>,
}

impl Verdict {
    pub(crate) fn allow(remaining: u64, reset_after_us: u64) -> Self {
        Verdict {
            allowed: true,
            remaining,
            reset_after_us,
            retry_after_us: None,
        }
    }

    pub(crate) fn deny(remaining: u64, reset_after_us: u64, retry_after_us: Option<u64>) -> Self {
        Verdict {
            allowed: false,
            remaining,
            reset_after_us,
            retry_after_us,
        }
    }
}

/// A policy's algorithm with its parameters checked and precomputed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Compiled {
    FixedWindow(fixed_window::FixedWindow),
    SlidingWindow(sliding_window::SlidingWindow),
    SlidingLog(sliding_log::SlidingLog),
    TokenBucket(token_bucket::TokenBucket),
    LeakyBucket(leaky_bucket::LeakyBucket),
    Gcra(gcra::Gcra),
}

/// Per-key state of any algorithm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    FixedWindow(fixed_window::State),
    SlidingWindow(sliding_window::State),
    SlidingLog(sliding_log::State),
    TokenBucket(token_bucket::State),
    LeakyBucket(leaky_bucket::State),
    Gcra(gcra::State),
}

/// Options that only some algorithms take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Options {
    /// Number of sub-window buckets of the sliding window counter.
    pub(crate) buckets: Option<u32>,
}

/// Runs `$body` with the algorithm `$alg` and its own state type `$st` taken out of `$slot`
/// (a state of another algorithm counts as none), then puts the state back.
macro_rules! on_state {
    ($self:expr, $slot:expr, $alg:ident, $st:ident => $body:expr) => {{
        macro_rules! arm {
            ($variant:ident, $a:ident) => {{
                let mut $st = match $slot.take() {
                    Some(State::$variant(s)) => Some(s),
                    _ => None,
                };
                let $alg = $a;
                let result = $body;
                *$slot = $st.map(State::$variant);
                result
            }};
        }
        match $self {
            Compiled::FixedWindow(a) => arm!(FixedWindow, a),
            Compiled::SlidingWindow(a) => arm!(SlidingWindow, a),
            Compiled::SlidingLog(a) => arm!(SlidingLog, a),
            Compiled::TokenBucket(a) => arm!(TokenBucket, a),
            Compiled::LeakyBucket(a) => arm!(LeakyBucket, a),
            Compiled::Gcra(a) => arm!(Gcra, a),
        }
    }};
}

impl Compiled {
    /// Checks `quota` for `algorithm` and precomputes its constants.
    pub(crate) fn new(
        algorithm: Algorithm,
        quota: Quota,
        options: Options,
    ) -> Result<Self, ConfigError> {
        if options.buckets.is_some() && algorithm != Algorithm::SlidingWindow {
            return Err(ConfigError::new(format!(
                "sub-window buckets only apply to sliding_window, not {algorithm}"
            )));
        }
        if quota.burst().is_some() && !algorithm.has_burst() {
            return Err(ConfigError::new(format!(
                "{algorithm} has no burst; use token_bucket, leaky_bucket or gcra for a burst different from the limit"
            )));
        }
        Ok(match algorithm {
            Algorithm::FixedWindow => Compiled::FixedWindow(fixed_window::FixedWindow::new(quota)),
            Algorithm::SlidingWindow => {
                Compiled::SlidingWindow(sliding_window::SlidingWindow::new(quota, options.buckets)?)
            }
            Algorithm::SlidingLog => Compiled::SlidingLog(sliding_log::SlidingLog::new(quota)?),
            Algorithm::TokenBucket => Compiled::TokenBucket(token_bucket::TokenBucket::new(quota)?),
            Algorithm::LeakyBucket => Compiled::LeakyBucket(leaky_bucket::LeakyBucket::new(quota)?),
            Algorithm::Gcra => Compiled::Gcra(gcra::Gcra::new(quota)?),
        })
    }

    /// The window reported with the limit, in microseconds: the quota's window for window
    /// algorithms; for bucket algorithms the time in which the reported limit (the burst)
    /// refills, so that limit and window together state the real rate.
    pub(crate) fn window_us(&self) -> u64 {
        match self {
            Compiled::FixedWindow(a) => a.window,
            Compiled::SlidingWindow(a) => a.buckets * a.bucket,
            Compiled::SlidingLog(a) => a.window,
            Compiled::TokenBucket(a) => a.scaled.full.div_ceil(a.scaled.rate),
            Compiled::LeakyBucket(a) => a.scaled.full.div_ceil(a.scaled.rate),
            Compiled::Gcra(a) => a.tolerance,
        }
    }

    /// The limit reported to clients (`X-RateLimit-Limit`): the burst for bucket algorithms,
    /// the per-window limit for window algorithms.
    pub(crate) fn reported_limit(&self) -> u64 {
        match self {
            Compiled::FixedWindow(a) => a.limit,
            Compiled::SlidingWindow(a) => a.limit,
            Compiled::SlidingLog(a) => a.limit,
            Compiled::TokenBucket(a) => a.capacity,
            Compiled::LeakyBucket(a) => a.capacity,
            Compiled::Gcra(a) => a.burst,
        }
    }

    /// The algorithm's number and its four parameters, as the Lua twin takes them.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn lua_args(&self) -> (u8, [u64; 4]) {
        match self {
            Compiled::FixedWindow(a) => (1, [a.limit, a.window, 0, 0]),
            Compiled::SlidingWindow(a) => (2, [a.limit, a.buckets, a.bucket, 0]),
            Compiled::SlidingLog(a) => (3, [a.limit, a.window, 0, 0]),
            Compiled::TokenBucket(a) => {
                (4, [a.capacity, a.scaled.unit, a.scaled.rate, a.scaled.full])
            }
            Compiled::LeakyBucket(a) => {
                (5, [a.capacity, a.scaled.unit, a.scaled.rate, a.scaled.full])
            }
            Compiled::Gcra(a) => (6, [a.interval, a.burst, a.tolerance, 0]),
        }
    }

    /// The Lua twin of every algorithm and the script that decides with them, as one script.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const LUA: &'static str = concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/fixed_window.lua"),
        include_str!("lua/sliding_window.lua"),
        include_str!("lua/sliding_log.lua"),
        include_str!("lua/token_bucket.lua"),
        include_str!("lua/leaky_bucket.lua"),
        include_str!("lua/gcra.lua"),
        include_str!("lua/decide.lua"),
    );

    /// Phase one: decide without changing anything.
    pub(crate) fn evaluate(&self, state: Option<&State>, now: u64, cost: u64) -> Verdict {
        let mut verdict = self.evaluate_at_own_time(state, now, cost);
        // An algorithm whose state is newer than `now` (the clock went back, e.g. after a Redis
        // failover) decides as of its last update; its times are moved to be from `now`.
        let lag = self.lag(state, now);
        if lag > 0 {
            if verdict.reset_after_us > 0 {
                verdict.reset_after_us += lag;
            }
            if let Some(retry) = &mut verdict.retry_after_us {
                *retry += lag;
            }
        }
        verdict
    }

    /// How far the state's own notion of the present is ahead of `now`.
    fn lag(&self, state: Option<&State>, now: u64) -> u64 {
        let own = match (self, state) {
            (Compiled::SlidingWindow(a), Some(State::SlidingWindow(s))) => s.head * a.bucket,
            (Compiled::SlidingLog(_), Some(State::SlidingLog(s))) => {
                s.entries.back().map_or(0, |e| e.0)
            }
            (Compiled::TokenBucket(_), Some(State::TokenBucket(s))) => s.last,
            (Compiled::LeakyBucket(_), Some(State::LeakyBucket(s))) => s.last,
            _ => 0,
        };
        own.saturating_sub(now)
    }

    fn evaluate_at_own_time(&self, state: Option<&State>, now: u64, cost: u64) -> Verdict {
        match (self, state) {
            (Compiled::FixedWindow(a), Some(State::FixedWindow(s))) => {
                a.evaluate(Some(s), now, cost)
            }
            (Compiled::FixedWindow(a), _) => a.evaluate(None, now, cost),
            (Compiled::SlidingWindow(a), Some(State::SlidingWindow(s))) => {
                a.evaluate(Some(s), now, cost)
            }
            (Compiled::SlidingWindow(a), _) => a.evaluate(None, now, cost),
            (Compiled::SlidingLog(a), Some(State::SlidingLog(s))) => a.evaluate(Some(s), now, cost),
            (Compiled::SlidingLog(a), _) => a.evaluate(None, now, cost),
            (Compiled::TokenBucket(a), Some(State::TokenBucket(s))) => {
                a.evaluate(Some(s), now, cost)
            }
            (Compiled::TokenBucket(a), _) => a.evaluate(None, now, cost),
            (Compiled::LeakyBucket(a), Some(State::LeakyBucket(s))) => {
                a.evaluate(Some(s), now, cost)
            }
            (Compiled::LeakyBucket(a), _) => a.evaluate(None, now, cost),
            (Compiled::Gcra(a), Some(State::Gcra(s))) => a.evaluate(Some(s), now, cost),
            (Compiled::Gcra(a), _) => a.evaluate(None, now, cost),
        }
    }

    /// Gives back `units` (a refund, or a reward): the inverse of a charge, never past a fresh
    /// state. Returns the new expiry, or `None` when there was no state to change.
    pub(crate) fn refund(&self, slot: &mut Option<State>, now: u64, units: u64) -> Option<u64> {
        on_state!(self, slot, a, st => a.refund(&mut st, now, units))
    }

    /// Phase two: charge an admitted request. Returns when the state expires (becomes the same
    /// as a fresh key), in microseconds on the same clock as `now`.
    pub(crate) fn commit(&self, slot: &mut Option<State>, now: u64, cost: u64) -> u64 {
        on_state!(self, slot, a, st => a.commit(&mut st, now, cost))
    }
}

/// A row of an algorithm's table test: time, cost, then the expected allowed, remaining,
/// reset and retry-after.
#[cfg(test)]
pub(crate) type Row = (u64, u64, bool, u64, u64, Option<u64>);

/// Runs a table test: each row is evaluated, checked, and committed when allowed.
#[cfg(test)]
pub(crate) fn run_table(algorithm: &Compiled, rows: &[Row]) {
    let mut state = None;
    for &(t, cost, allowed, remaining, reset, retry) in rows {
        let v = algorithm.evaluate(state.as_ref(), t, cost);
        let expected = Verdict {
            allowed,
            remaining,
            reset_after_us: reset,
            retry_after_us: retry,
        };
        assert_eq!(v, expected, "at t={t} cost={cost}");
        if v.allowed {
            algorithm.commit(&mut state, t, cost);
        }
    }
}

/// A blocked key is denied until the block ends (`until`, on the store's clock), whatever its
/// state; a request that could never be admitted still gets no retry time. Twin of the block
/// step in `decide.lua`.
pub(crate) fn apply_block(verdict: &mut Verdict, until: u64, now: u64) {
    if until <= now {
        return;
    }
    let wait = until - now;
    if verdict.allowed || verdict.retry_after_us.is_some() {
        verdict.retry_after_us = Some(verdict.retry_after_us.unwrap_or(0).max(wait));
    }
    verdict.allowed = false;
    verdict.remaining = 0;
    verdict.reset_after_us = verdict.reset_after_us.max(wait);
}

/// Greatest common divisor.
pub(crate) const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

/// Fails with a helpful message when `value` exceeds the exact-arithmetic bound.
pub(crate) fn check_exact(
    value: u128,
    algorithm: Algorithm,
    what: &str,
) -> Result<(), ConfigError> {
    if value > MAX_EXACT as u128 {
        Err(ConfigError::new(format!(
            "{algorithm}: {what} is too large for exact arithmetic (over 2^53); use a smaller burst, a smaller limit, or a window that shares more factors with the limit"
        )))
    } else {
        Ok(())
    }
}
