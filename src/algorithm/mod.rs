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
//!
//! Each algorithm implements [`Kernel`] in its own file, with its Lua twin beside it in `lua/`
//! (which defines `ALG[<NAME>]`, built only when a decision uses it), and is registered by one entry in `with_algorithms!` below. That
//! entry makes the public [`Algorithm`] variant and its name, the compiled form, the state,
//! the dispatch, and puts the twin in the Redis script, whose prelude binds `<NAME>` to the
//! id Rust gives it. Adding an algorithm touches those three places and nothing else (then the
//! property tests run it by construction, one test per entry in each property module, and the
//! differential and per-algorithm tests as they run every `Algorithm::ALL`).

/// The algorithms, written once: one entry each, with the public variant's documentation, its
/// name (the module's), and the type implementing [`Kernel`]. `with_algorithms!(m! { args })`
/// calls `m! { args <the entries> }`: `algorithms!` makes the enum, its facts and
/// the dispatch from them, and the property tests (`properties.rs`) one test per entry, so
/// an entry added here reaches every one of them without a test file changed.
macro_rules! with_algorithms {
    ($callback:ident ! { $($args:tt)* }) => {
        $callback! {
            $($args)*
            /// Counts units in windows aligned to the clock's epoch; the count resets at each
            /// boundary. See the `fixed_window` module docs in the source for exact semantics.
            FixedWindow => fixed_window::FixedWindow,
            /// Counts units in sub-window buckets and weighs the oldest bucket by how much of
            /// it is still inside the window (the "sliding window counter").
            SlidingWindow => sliding_window::SlidingWindow,
            /// Remembers the time of every admitted unit: exact, at a memory cost proportional
            /// to the limit.
            SlidingLog => sliding_log::SlidingLog,
            /// A bucket of `burst` tokens refilled at `limit` per window; a request takes
            /// `cost` tokens.
            TokenBucket => token_bucket::TokenBucket,
            /// A bucket of capacity `burst` that drains at `limit` per window; a request pours
            /// `cost` units in (the leaky bucket as a meter).
            LeakyBucket => leaky_bucket::LeakyBucket,
            /// The generic cell rate algorithm: one "theoretical arrival time" per key.
            Gcra => gcra::Gcra,
        }
    };
}

#[cfg(test)]
mod properties;
mod compact;
mod kernel;

pub(crate) use compact::compact;
#[cfg(test)]
pub(crate) use kernel::Guarantee;
pub(crate) use kernel::{Kernel, Lease, LuaParams, Options, Packed, Verdict};
use kernel::{booking, evaluate_with_lag, judge_packed_as, lease_verdict, take_lease};

use std::fmt;
use std::str::FromStr;

use crate::calendar::Periods;
use crate::error::ConfigError;
use crate::quota::Quota;

/// Largest integer all algorithm arithmetic may reach (exact in an IEEE double, as in Lua).
pub(crate) const MAX_EXACT: u64 = 1 << 53;

impl Algorithm {
    /// The algorithm's id in the Redis script: its place in [`Algorithm::ALL`], from 1. The
    /// script's prelude is generated from the same numbers, so they are written nowhere else.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn lua_id(self) -> u8 {
        self as u8 + 1
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
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                ConfigError::new(format!(
                    "unknown algorithm {s:?}; expected one of {}",
                    names.join(", ")
                ))
            })
    }
}

/// The state of the algorithm `$variant` in `$state` (an `Option<State>` or an
/// `Option<&State>`): another algorithm's state counts as none.
macro_rules! own_state {
    ($state:expr, $variant:ident) => {
        match $state {
            Some(State::$variant(s)) => Some(s),
            _ => None,
        }
    };
}

/// Takes the state of `$variant` out of `$state` as `$own` (another algorithm's is dropped),
/// evaluates `$body`, which may change it, and puts it back.
macro_rules! with_own_state {
    ($state:ident, $variant:ident, |$own:ident| $body:expr) => {{
        let mut $own = own_state!($state.take(), $variant);
        let out = $body;
        *$state = $own.map(State::$variant);
        out
    }};
}

/// Registers the algorithms: one entry each, with the public variant's documentation, its
/// name, and the type implementing [`Kernel`]. Generates the public [`Algorithm`] with its names,
/// the compiled form ([`Compiled`]), the state of any algorithm ([`State`]), the one dispatch
/// from one to the other, and the list of Lua twins.
macro_rules! algorithms {
    ($($(#[doc = $doc:literal])* $variant:ident => $module:ident :: $ty:ident,)*) => {
        $(pub(crate) mod $module;)*

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
            $($(#[doc = $doc])* $variant,)*
        }

        impl Algorithm {
            /// Every algorithm, in documentation order.
            pub const ALL: [Algorithm; [$(Algorithm::$variant),*].len()] = [$(Algorithm::$variant),*];

            /// The snake_case name, as accepted by [`FromStr`].
            pub const fn name(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => stringify!($module),)*
                }
            }

            /// Whether the algorithm takes a burst different from its limit.
            pub const fn has_burst(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$ty as Kernel>::HAS_BURST,)*
                }
            }

            /// See [`Kernel::GUARANTEE`].
            #[cfg(test)]
            pub(crate) const fn guarantee(self) -> Guarantee {
                match self {
                    $(Algorithm::$variant => <$module::$ty as Kernel>::GUARANTEE,)*
                }
            }
        }

        /// A policy's algorithm with its parameters checked and precomputed.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub(crate) enum Compiled {
            $($variant($module::$ty),)*
        }

        /// Per-key state of any algorithm.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub(crate) enum State {
            $($variant(<$module::$ty as Kernel>::State),)*
        }

        impl Compiled {
            /// Checks `quota` for `algorithm` and precomputes its constants.
            fn compile(algorithm: Algorithm, quota: Quota, options: Options) -> Result<Self, ConfigError> {
                match algorithm {
                    $(Algorithm::$variant => <$module::$ty as Kernel>::compile(quota, options).map(Compiled::$variant),)*
                }
            }

            /// Which algorithm this is.
            pub(crate) fn algorithm(&self) -> Algorithm {
                match self {
                    $(Compiled::$variant(_) => Algorithm::$variant,)*
                }
            }

            /// Phase one: decide without changing anything. A state of another algorithm
            /// counts as none.
            pub(crate) fn evaluate(&self, state: Option<&State>, now: u64, cost: u64) -> Verdict {
                match self {
                    $(Compiled::$variant(a) => evaluate_with_lag(a, own_state!(state, $variant), now, cost),)*
                }
            }

            /// Phase two: charge an admitted request. Returns when the state expires.
            pub(crate) fn commit(&self, state: &mut Option<State>, now: u64, cost: u64) -> u64 {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.commit(&mut own, now, cost)),)*
                }
            }

            /// Charges `units` whatever the state, past the limit if need be (see
            /// [`Kernel::debit`]). Returns when the state expires.
            pub(crate) fn debit(&self, state: &mut Option<State>, now: u64, units: u64) -> u64 {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.debit(&mut own, now, units)),)*
                }
            }

            /// Gives back `units`: the inverse of a charge, never past a fresh state. Returns
            /// the new expiry, or `None` when there was no state to change.
            pub(crate) fn refund(&self, state: &mut Option<State>, now: u64, units: u64) -> Option<u64> {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.refund(&mut own, now, units)),)*
                }
            }

            /// A lease's verdict for `cost` (see [`Lease`]) and the lease's end, without
            /// changing anything.
            pub(crate) fn lease_verdict(&self, state: Option<&State>, now: u64, ttl: u64, cost: u64) -> (Verdict, u64) {
                match self {
                    $(Compiled::$variant(a) => lease_verdict(a, own_state!(state, $variant), now, ttl, cost),)*
                }
            }

            /// Charges a lease of at least `cost` and at most `want` units lasting at most
            /// `ttl` (see [`Lease`]); the request's verdict for `cost` must have admitted it.
            pub(crate) fn take_lease(&self, state: &mut Option<State>, now: u64, ttl: u64, cost: u64, want: u64) -> Lease {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| take_lease(a, &mut own, now, ttl, cost, want)),)*
                }
            }

            /// For a request denied now with `verdict`: the wait until the time that admits
            /// it, when it is at most `max_wait` (see [`booking`]).
            pub(crate) fn booking(&self, state: Option<&State>, now: u64, cost: u64, verdict: &Verdict, max_wait: u64) -> Option<u64> {
                match self {
                    $(Compiled::$variant(a) => booking(a, own_state!(state, $variant), now, cost, verdict, max_wait),)*
                }
            }

            /// Charges a request that booked the time `at`. Returns when the state expires.
            pub(crate) fn book_commit(&self, state: &mut Option<State>, now: u64, at: u64, cost: u64) -> u64 {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.book_commit(&mut own, now, at, cost)),)*
                }
            }

            /// See [`Kernel::give_back`].
            pub(crate) fn give_back(&self, state: &mut Option<State>, now: u64, end: u64, units: u64) -> Option<u64> {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.give_back(&mut own, now, end, units)),)*
                }
            }

            /// See [`Kernel::release`].
            pub(crate) fn release(&self, state: &mut Option<State>, now: u64, at: u64, units: u64) -> Option<u64> {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.release(&mut own, now, at, units)),)*
                }
            }

            /// Re-expresses a state written under `from` under `self` (see [`Kernel::convert`]);
            /// a state of another algorithm becomes `None`. Returns when the state expires.
            pub(crate) fn convert(&self, from: &Compiled, state: &mut Option<State>, now: u64, expires_at: u64) -> u64 {
                match (self, from) {
                    $((Compiled::$variant(a), Compiled::$variant(old)) => with_own_state!(state, $variant, |own| a.convert(old, &mut own, now, expires_at)),)*
                    _ => {
                        *state = None;
                        now
                    }
                }
            }

            /// Whether this policy's states pack (see [`Kernel::packs`]); the lanes ask
            /// `Policy::packs_up_front`, before anything is compiled.
            #[cfg(test)]
            pub(crate) fn packs(&self) -> bool {
                match self {
                    $(Compiled::$variant(a) => a.packs(),)*
                }
            }

            /// Whether a packed state uses its count (see [`Kernel::PACKS_COUNT`]).
            #[inline]
            pub(crate) fn packs_count(&self) -> bool {
                match self {
                    $(Compiled::$variant(_) => <$module::$ty as Kernel>::PACKS_COUNT,)*
                }
            }

            /// `state` packed (see [`Kernel::pack`]; no state is a word of 0), if it packs.
            pub(crate) fn pack(&self, state: Option<&State>) -> Option<Packed> {
                match self {
                    $(Compiled::$variant(a) => match own_state!(state, $variant) {
                        Some(own) => a.pack(own),
                        None => a.packs().then_some(Packed::default()),
                    },)*
                }
            }

            /// The state `packed` holds (see [`Kernel::unpack`]).
            pub(crate) fn unpack(&self, packed: Packed) -> Option<State> {
                match self {
                    $(Compiled::$variant(a) => a.unpack(packed).map(State::$variant),)*
                }
            }

            /// One request on a packed state: its verdict and the state it leaves (see
            /// [`judge_packed_as`]). Only the algorithms that pack have a state to decide here
            /// (the others have code for none).
            #[inline]
            pub(crate) fn judge_packed(&self, packed: Packed, now: u64, cost: u64) -> (Verdict, Packed) {
                match self {
                    $(Compiled::$variant(a) if <$module::$ty as Kernel>::PACKS => judge_packed_as(a, packed, now, cost),)*
                    _ => {
                        debug_assert!(false, "no packed state of {self:?}");
                        (Verdict::default(), packed)
                    }
                }
            }

            /// See [`Kernel::window_us`].
            pub(crate) fn window_us(&self) -> u64 {
                match self {
                    $(Compiled::$variant(a) => a.window_us(),)*
                }
            }

            /// See [`Kernel::reported_limit`].
            pub(crate) fn reported_limit(&self) -> u64 {
                match self {
                    $(Compiled::$variant(a) => a.reported_limit(),)*
                }
            }

            /// See [`Kernel::lua_params`].
            pub(crate) fn lua_params(&self) -> LuaParams {
                match self {
                    $(Compiled::$variant(a) => a.lua_params(),)*
                }
            }
        }

        /// The Lua twin of every algorithm (`lua/<module>.lua`), with the algorithm it is the
        /// twin of: it defines `ALG[<NAME>]`, a function that builds the algorithm's table of
        /// functions (`load`, `evaluate`, `commit`, `refund`, maybe `lag`), where `<NAME>` is
        /// the algorithm's upper-case name, replaced by its id when the script is generated
        /// (the generator, which runs in tests, is the only reader).
        #[cfg(all(test, feature = "redis"))]
        pub(crate) const LUA_TWINS: &[(Algorithm, &str)] = &[
            $((Algorithm::$variant, include_str!(concat!("lua/", stringify!($module), ".lua"))),)*
        ];
    };
}

/// The helpers every Lua twin uses (integer division, state parsing, writes with a TTL).
#[cfg(all(test, feature = "redis"))]
pub(crate) const LUA_HELPERS: &str = include_str!("lua/helpers.lua");

with_algorithms!(algorithms! {});

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
        Self::compile(algorithm, quota, options)
    }

    /// The algorithm's id in the Lua script and its parameters.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn lua_args(&self) -> (u8, LuaParams) {
        (self.algorithm().lua_id(), self.lua_params())
    }
}

impl Compiled {
    /// The same algorithm, with the same options (a sliding window's buckets, a fixed
    /// window's calendar), of `quota`: a key's own limit. A calendar's key keeps its period.
    pub(crate) fn relimited(&self, quota: Quota) -> Result<Compiled, ConfigError> {
        let options = Options {
            buckets: match self {
                Compiled::SlidingWindow(w) => Some(w.buckets()),
                _ => None,
            },
        };
        let compiled = Compiled::new(self.algorithm(), quota, options)?;
        match (self, compiled) {
            (Compiled::FixedWindow(own), Compiled::FixedWindow(window)) => {
                match own.shared_periods() {
                    None if quota.is_monthly() => Err(ConfigError::new(
                        "a month is a calendar period: this policy counts windows; give the key a quota of a window",
                    )),
                    None => Ok(Compiled::FixedWindow(window)),
                    Some(periods) => {
                        periods.check_same(quota)?;
                        Ok(Compiled::FixedWindow(window.with_periods(periods.clone())))
                    }
                }
            }
            (_, compiled) if quota.is_monthly() => Err(ConfigError::new(format!(
                "a month is a calendar period, counted by the fixed window, not {}",
                compiled.algorithm()
            ))),
            (_, compiled) => Ok(compiled),
        }
    }

    /// Whether a key's own limit, `own` (made by [`relimited`](Self::relimited) from another
    /// definition of this policy), still applies under this one (see `FixedWindow::still_applies`).
    pub(crate) fn still_applies(&self, own: &Compiled) -> bool {
        match (self, own) {
            (Compiled::FixedWindow(present), Compiled::FixedWindow(own)) => {
                present.still_applies(own)
            }
            _ => true,
        }
    }

    /// The calendar periods counted instead of windows (a fixed window's), if any.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn periods(&self) -> Option<&Periods> {
        match self {
            Compiled::FixedWindow(window) => window.periods(),
            _ => None,
        }
    }
}

/// A row of an algorithm's table test: time, cost, then the expected allowed, remaining,
/// reset and retry-after.
#[cfg(test)]
pub(crate) type TableRow = (u64, u64, bool, u64, u64, Option<u64>);

/// Runs a table test: each row is evaluated, checked, and committed when allowed.
#[cfg(test)]
pub(crate) fn run_table(algorithm: &Compiled, rows: &[TableRow]) {
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
/// arm of `judge` in `decide.lua`.
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

/// `amount`, counted in `from` per unit, counted in `to` per unit instead: what a state's
/// usage becomes when a reload changes the size of its unit (a GCRA emission interval, a
/// bucket's scaled unit). Whole units convert exactly; the part of a unit is converted in
/// IEEE double arithmetic and rounded up, the same operations as the Lua twin (`rescale` in
/// `helpers.lua`), so both stores agree to the microsecond. Nothing is capped: a usage above
/// the new capacity stays above it (and converts back whole), except that the result stays
/// below 2<sup>53</sup>, where the arithmetic is exact.
pub(crate) fn rescale(amount: u64, from: u64, to: u64) -> u64 {
    let most = MAX_EXACT / to - 1;
    let whole = amount / from;
    if whole >= most {
        return most * to;
    }
    let part = amount % from;
    let part = if part == 0 {
        0
    } else {
        // Below `to` (a fraction of it), and at least 1.
        ((part as f64 / from as f64) * to as f64).ceil() as u64
    };
    whole * to + part
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
