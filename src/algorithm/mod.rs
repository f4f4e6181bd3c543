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
//! Each algorithm implements [`Step`] in its own file, with its Lua twin beside it in `lua/`
//! (which defines `ALG[<NAME>]`, built only when a decision uses it), and is registered by one entry in `with_algorithms!` below. That
//! entry makes the public [`Algorithm`] variant and its name, the compiled form, the state,
//! the dispatch, and puts the twin in the Redis script, whose prelude binds `<NAME>` to the
//! id Rust gives it. Adding an algorithm touches those three places and nothing else (then the
//! property tests run it by construction, one test per entry in each property module, and the
//! differential and per-algorithm tests as they run every `Algorithm::ALL`).

/// The algorithms, written once: one entry each, with the public variant's documentation, its
/// name (the module's), and the type implementing [`Step`]. `with_algorithms!(m! { args })`
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

pub(crate) use compact::compact;

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

/// What an algorithm says about one request, before anything is charged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    /// This policy's admission of a request that another policy denied, so not charged: what
    /// is left and when it resets become those of the state as it stays (`stays`, a look).
    pub(crate) fn uncharged(&mut self, stays: Verdict) {
        self.remaining = stays.remaining;
        self.reset_after_us = stays.reset_after_us;
    }

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

/// The contract every algorithm implements: its parameters (`Self`, checked and precomputed from
/// a quota) and its per-key state, with the two phases of a decision. Each implementation has a
/// Lua twin beside it (`lua/<name>.lua`) that computes the same integers.
pub(crate) trait Step: Sized {
    /// Per-key state.
    type State: Clone;
    /// Whether the algorithm takes a burst different from its limit.
    const HAS_BURST: bool = false;
    /// What it admits at most over time: the bound its property tests hold it to.
    #[cfg(test)]
    const GUARANTEE: Guarantee;

    /// Checks `quota` (and `options`) for this algorithm and precomputes its constants.
    fn compile(quota: Quota, options: Options) -> Result<Self, ConfigError>;

    /// Phase one: decides without changing anything, as of `now` or, when the state is ahead
    /// of `now` (the clock went back), as of the state's own time ([`Step::own_time`]).
    fn evaluate(&self, state: Option<&Self::State>, now: u64, cost: u64) -> Verdict;

    /// Phase two: charges an admitted request. Returns when the state expires (becomes the same
    /// as a fresh key), in microseconds on the same clock as `now`.
    fn commit(&self, state: &mut Option<Self::State>, now: u64, cost: u64) -> u64;

    /// Charges `units` whatever the state, past the limit if need be: what a request turned
    /// out to cost beyond what was charged up front (`Op::Settle`). The key then owes the
    /// units, and is denied until time pays them back: a window counts past its limit until
    /// it ends or slides on, GCRA moves its TAT on, a leaky bucket fills past its brim. By
    /// default a charge ([`Step::commit`], which none of those bounds); an algorithm whose
    /// charge stops at empty (the token bucket) keeps the debt its own way. Returns when the
    /// state expires.
    fn debit(&self, state: &mut Option<Self::State>, now: u64, units: u64) -> u64 {
        self.commit(state, now, units)
    }

    /// Gives back `units` (a refund, or a reward): the inverse of a charge, never past a fresh
    /// state. Returns the new expiry, or `None` when there was no state to change.
    fn refund(&self, state: &mut Option<Self::State>, now: u64, units: u64) -> Option<u64>;

    /// The last moment a lease taken at `now` for `ttl` microseconds may spend its units:
    /// `now + ttl`, or sooner where the algorithm counts units per period (the fixed window's
    /// window, the sliding window's bucket), so that a lease never outlives the period its
    /// units are counted in.
    fn lease_end(&self, state: Option<&Self::State>, now: u64, ttl: u64) -> u64 {
        let _ = state;
        now + ttl
    }

    /// The state a lease ending at `end` is decided and charged on: `state` made as strict as
    /// the units could make it if each were spent at the worst moment up to `end` (GCRA: its
    /// TAT no earlier than `end`; the buckets: no refill or drain the lease's time could waste).
    /// Deciding and charging the lease on it is never more generous than deciding each unit
    /// when it is spent.
    fn lease_state(&self, state: Option<&Self::State>, now: u64, end: u64) -> Option<Self::State> {
        let _ = (now, end);
        state.cloned()
    }

    /// Charges a lease of `units` ending at `end` (on the state [`Step::lease_state`] gave):
    /// a charge at `now`, except for the sliding log, which logs the units at `end`. Returns
    /// when the state expires.
    fn lease_commit(&self, state: &mut Option<Self::State>, now: u64, end: u64, units: u64) -> u64 {
        let _ = end;
        self.commit(state, now, units)
    }

    /// Gives back `units` a lease ending at `end` did not spend. By default a refund, made
    /// only until the lease ends: a refund is the inverse of a charge only while nothing has
    /// absorbed the charge since (a bucket that refilled to the brim, a TAT the present caught
    /// up with), and until its end a lease's own charge keeps that from happening; later, the
    /// units stay spent. The algorithms that count units per period (the lease's period only)
    /// or per entry (the sliding log forgets the entries logged at `end`) give back at any
    /// time. Returns the new expiry, or `None` when nothing changed.
    fn give_back(
        &self,
        state: &mut Option<Self::State>,
        now: u64,
        end: u64,
        units: u64,
    ) -> Option<u64> {
        if now > end {
            return None;
        }
        self.refund(state, now, units)
    }

    /// Gives back `units` a request reserved at `at` and will not spend (its client went
    /// away while it waited, or its concurrency slots are freed). By default as a lease's
    /// units are given back: the algorithms whose state is a record of what went on (the
    /// windows and the log) forget the units counted at that time, and the requests queued
    /// behind it keep their times. GCRA and the buckets keep a summary instead (a TAT, a level
    /// and its time), from which the units of one time cannot be taken out while later ones
    /// are booked on top of it without moving those: they give back only the latest, else
    /// nothing (its time stays empty). Returns
    /// the new expiry, or `None` when nothing changed.
    fn release(
        &self,
        state: &mut Option<Self::State>,
        now: u64,
        at: u64,
        units: u64,
    ) -> Option<u64> {
        self.give_back(state, now, at, units)
    }

    /// Charges a request that reserved the time `at` (later than `now`): a charge made at
    /// `at` (the state then counts from its reserved time: a later window, a bucket's update time),
    /// except for the sliding log, which logs the units at `at` and keeps, at `now`, the
    /// entries still inside the present's window. Returns when the state expires.
    fn reserve_commit(&self, state: &mut Option<Self::State>, now: u64, at: u64, cost: u64) -> u64 {
        let _ = now;
        self.commit(state, at, cost)
    }

    /// Re-expresses a state written under `from` (the same algorithm with other parameters,
    /// before a reload) under `self`, so that a key keeps its usage: the units it has used as
    /// of `now` (as of its own time when that is ahead) count against the new quota (see the
    /// algorithm's file for what "the same usage" means when the window changes). `expires_at`
    /// is when the state expired under `from`; returns when it expires now. A state with
    /// nothing used becomes `None`. By default the state is kept as it is (the sliding log,
    /// whose entries mean the same under any quota).
    fn convert(
        &self,
        from: &Self,
        state: &mut Option<Self::State>,
        now: u64,
        expires_at: u64,
    ) -> u64 {
        let _ = (from, state, now);
        expires_at
    }

    /// Whether the state may pack (see [`pack`](Step::pack)).
    const PACKS: bool = false;

    /// Whether a packed state uses its count ([`Packed::count`]): then a decision on it alone
    /// claims its word rather than swapping it (the word and the count change together).
    const PACKS_COUNT: bool = false;

    /// Whether this policy's states pack (the type's [`PACKS`](Step::PACKS) unless its
    /// configuration keeps them from it).
    fn packs(&self) -> bool {
        Self::PACKS
    }

    /// The state as a word and a count, for an algorithm whose state fits in them, the word
    /// then being the time the state expires (GCRA's TAT; a fixed window's end, its count
    /// beside it): the memory store keeps such a state in atomics and decides on it under the
    /// shard's shared lock. `None` (the default): the state does not pack, or not this one.
    /// A packed word of 0 is no state. A state that packs still packs once an admitted
    /// request is charged to it (the memory store's shared path relies on it).
    fn pack(&self, state: &Self::State) -> Option<Packed> {
        let _ = state;
        None
    }

    /// The state that [`pack`](Step::pack) made `packed` of (`None` for a word of 0).
    fn unpack(&self, packed: Packed) -> Option<Self::State> {
        let _ = packed;
        None
    }

    /// The state's own notion of the present, for algorithms that never move it back (0: none).
    fn own_time(&self, state: &Self::State) -> u64 {
        let _ = state;
        0
    }

    /// The window reported with the limit, in microseconds: the quota's window for window
    /// algorithms; for bucket algorithms the time in which the reported limit (the burst)
    /// refills, so that limit and window together state the real rate.
    fn window_us(&self) -> u64;

    /// The limit reported to clients (`X-RateLimit-Limit`): the burst for bucket algorithms,
    /// the per-window limit for window algorithms.
    fn reported_limit(&self) -> u64;

    /// The parameters the Lua twin takes, in its order.
    fn lua_params(&self) -> LuaParams;
}

/// Phase one with the clock-lag adjustment (the one place it is written in Rust; its Lua twin
/// is `shift` in `helpers.lua`): a state newer than `now` (the clock went back, or a request
/// reserved a later slot) decides as of its own time, its times moved to be from `now`, and
/// admits no cost before that time (nothing remains until then): a request it would admit
/// then waits until then. Admitting
/// it now would spend, before they exist, units the state counts as there only from its own
/// time (the refill of a bucket, the room of a later window).
#[inline]
fn evaluate_with_lag<A: Step>(a: &A, state: Option<&A::State>, now: u64, cost: u64) -> Verdict {
    let mut verdict = a.evaluate(state, now, cost);
    let lag = state.map_or(0, |s| a.own_time(s).saturating_sub(now));
    if lag > 0 {
        // Not a fresh key before its own time, even with nothing counted there.
        verdict.reset_after_us += lag;
        if let Some(retry) = &mut verdict.retry_after_us {
            *retry += lag;
        }
        verdict.remaining = 0;
        if verdict.allowed && cost > 0 {
            verdict = Verdict::deny(0, verdict.reset_after_us.max(lag), Some(lag));
        }
    }
    verdict
}

/// A state packed for the memory store's shared path (see [`Step::pack`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Packed {
    word: u64,
    count: u32,
}

impl Packed {
    /// `word`, when the state expires (0: no state), and `count`, a second number for the
    /// states that need one (a fixed window's count; else 0).
    #[inline]
    pub(crate) const fn new(word: u64, count: u32) -> Self {
        Packed { word, count }
    }

    /// When the state expires; 0 for no state.
    #[inline]
    pub(crate) const fn word(self) -> u64 {
        self.word
    }

    /// The second number, 0 for states that need none.
    #[inline]
    pub(crate) const fn count(self) -> u32 {
        self.count
    }
}

/// One request of `cost` on the packed state `packed` (see [`Step::pack`]): the verdict, and
/// the state the charge leaves when it is admitted and charged (`packed` when nothing is).
#[inline(always)]
fn judge_packed_as<A: Step>(a: &A, packed: Packed, now: u64, cost: u64) -> (Verdict, Packed) {
    let mut state = a.unpack(packed);
    let verdict = evaluate_with_lag(a, state.as_ref(), now, cost);
    if !verdict.allowed || cost == 0 {
        return (verdict, packed);
    }
    a.commit(&mut state, now, cost);
    let next = state.as_ref().and_then(|s| a.pack(s));
    debug_assert!(next.is_some(), "a charged state that packed packs");
    (verdict, next.unwrap_or_default())
}

/// When a request denied now with `verdict` is admitted instead by reserving its time: the
/// microseconds until then (its retry-after), when that is at most `max_wait` and the
/// request (of a cost above 0: a look reserves nothing) is admitted then on the state as it
/// is (twin of `reservation` in `decide.lua`).
fn reservation<A: Step>(
    a: &A,
    state: Option<&A::State>,
    now: u64,
    cost: u64,
    verdict: &Verdict,
    max_wait: u64,
) -> Option<u64> {
    if cost == 0 {
        // A look reserves nothing.
        return None;
    }
    let wait = verdict.retry_after_us.filter(|&r| r <= max_wait)?;
    evaluate_with_lag(a, state, now + wait, cost)
        .allowed
        .then_some(wait)
}

/// What a store grants a request that asks for a lease: the request's verdict, now counting
/// the whole lease as spent; the units leased (the request's cost included; 0 when none);
/// the lease's end, and when the key's state expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) verdict: Verdict,
    pub(crate) units: u64,
    pub(crate) end: u64,
    pub(crate) expires_at: Option<u64>,
}

/// The verdict on `cost` of a lease taken at `now` for `ttl`, and the lease's end: phase one
/// of a request that asks for a lease, on the state [`Step::lease_state`] makes (twin of the
/// `LEASE` step of `evaluate` in `decide.lua`).
fn lease_verdict<A: Step>(
    a: &A,
    state: Option<&A::State>,
    now: u64,
    ttl: u64,
    cost: u64,
) -> (Verdict, u64) {
    let end = a.lease_end(state, now, ttl);
    let worst = a.lease_state(state, now, end);
    (evaluate_with_lag(a, worst.as_ref(), now, cost), end)
}

/// Phase two of a request that asks for a lease and was admitted: leases what is left now, at
/// least `cost` and at most `want` units (twin of `take_lease` in `decide.lua`).
fn take_lease<A: Step>(
    a: &A,
    state: &mut Option<A::State>,
    now: u64,
    ttl: u64,
    cost: u64,
    want: u64,
) -> Lease {
    let end = a.lease_end(state.as_ref(), now, ttl);
    let mut worst = a.lease_state(state.as_ref(), now, end);
    let left = evaluate_with_lag(a, worst.as_ref(), now, 0).remaining;
    let mut units = left.min(want).max(cost);
    let mut verdict = evaluate_with_lag(a, worst.as_ref(), now, units);
    if !verdict.allowed && units > cost {
        units = cost;
        verdict = evaluate_with_lag(a, worst.as_ref(), now, cost);
    }
    let mut expires_at = None;
    if units > 0 {
        expires_at = Some(a.lease_commit(&mut worst, now, end, units));
        *state = worst;
    }
    Lease {
        verdict,
        units,
        end,
        expires_at,
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

/// Takes the state of `$variant` out of `$slot` as `$own` (another algorithm's is dropped),
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
/// name, and the type implementing [`Step`]. Generates the public [`Algorithm`] with its names,
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
                    $(Algorithm::$variant => <$module::$ty as Step>::HAS_BURST,)*
                }
            }

            /// See [`Step::GUARANTEE`].
            #[cfg(test)]
            pub(crate) const fn guarantee(self) -> Guarantee {
                match self {
                    $(Algorithm::$variant => <$module::$ty as Step>::GUARANTEE,)*
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
            $($variant(<$module::$ty as Step>::State),)*
        }

        impl Compiled {
            /// Checks `quota` for `algorithm` and precomputes its constants.
            fn compile(algorithm: Algorithm, quota: Quota, options: Options) -> Result<Self, ConfigError> {
                match algorithm {
                    $(Algorithm::$variant => <$module::$ty as Step>::compile(quota, options).map(Compiled::$variant),)*
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
            /// [`Step::debit`]). Returns when the state expires.
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
            /// it, when it is at most `max_wait` (see [`reservation`]).
            pub(crate) fn reservation(&self, state: Option<&State>, now: u64, cost: u64, verdict: &Verdict, max_wait: u64) -> Option<u64> {
                match self {
                    $(Compiled::$variant(a) => reservation(a, own_state!(state, $variant), now, cost, verdict, max_wait),)*
                }
            }

            /// Charges a request that reserved the time `at`. Returns when the state expires.
            pub(crate) fn reserve_commit(&self, state: &mut Option<State>, now: u64, at: u64, cost: u64) -> u64 {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.reserve_commit(&mut own, now, at, cost)),)*
                }
            }

            /// See [`Step::give_back`].
            pub(crate) fn give_back(&self, state: &mut Option<State>, now: u64, end: u64, units: u64) -> Option<u64> {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.give_back(&mut own, now, end, units)),)*
                }
            }

            /// See [`Step::release`].
            pub(crate) fn release(&self, state: &mut Option<State>, now: u64, at: u64, units: u64) -> Option<u64> {
                match self {
                    $(Compiled::$variant(a) => with_own_state!(state, $variant, |own| a.release(&mut own, now, at, units)),)*
                }
            }

            /// Re-expresses a state written under `from` under `self` (see [`Step::convert`]);
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

            /// Whether this policy's states pack (see [`Step::packs`]).
            pub(crate) fn packs(&self) -> bool {
                match self {
                    $(Compiled::$variant(a) => a.packs(),)*
                }
            }

            /// Whether a packed state uses its count (see [`Step::PACKS_COUNT`]).
            #[inline]
            pub(crate) fn packs_count(&self) -> bool {
                match self {
                    $(Compiled::$variant(_) => <$module::$ty as Step>::PACKS_COUNT,)*
                }
            }

            /// `state` packed (see [`Step::pack`]; no state is a word of 0), if it packs.
            pub(crate) fn pack(&self, state: Option<&State>) -> Option<Packed> {
                match self {
                    $(Compiled::$variant(a) => match own_state!(state, $variant) {
                        Some(own) => a.pack(own),
                        None => a.packs().then_some(Packed::default()),
                    },)*
                }
            }

            /// The state `packed` holds (see [`Step::unpack`]).
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
                    $(Compiled::$variant(a) if <$module::$ty as Step>::PACKS => judge_packed_as(a, packed, now, cost),)*
                    _ => {
                        debug_assert!(false, "no packed state of {self:?}");
                        (Verdict::default(), packed)
                    }
                }
            }

            /// See [`Step::window_us`].
            pub(crate) fn window_us(&self) -> u64 {
                match self {
                    $(Compiled::$variant(a) => a.window_us(),)*
                }
            }

            /// See [`Step::reported_limit`].
            pub(crate) fn reported_limit(&self) -> u64 {
                match self {
                    $(Compiled::$variant(a) => a.reported_limit(),)*
                }
            }

            /// See [`Step::lua_params`].
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

/// What an algorithm admits at most over time ([`Step::GUARANTEE`]), in units of a quota of
/// `limit` per `window`.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Guarantee {
    /// The limit in any window (the sliding log).
    AnyWindow,
    /// The limit in each window aligned to the clock's epoch (the fixed window).
    AlignedWindows,
    /// The limit in any span of the window less one bucket (the sliding window counter).
    WindowLessABucket,
    /// The burst, plus the limit for each window of time (the buckets, GCRA).
    BurstAndRate,
}

/// The parameters of an algorithm's Lua twin: at most four, sent as they are.
pub(crate) type LuaParams = smallvec::SmallVec<[u64; 4]>;

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
    /// definition of this policy), still applies under this one (see `FixedWindow::keeps`).
    pub(crate) fn keeps(&self, own: &Compiled) -> bool {
        match (self, own) {
            (Compiled::FixedWindow(present), Compiled::FixedWindow(own)) => present.keeps(own),
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

/// Options that only some algorithms take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Options {
    /// Number of sub-window buckets of the sliding window counter.
    pub(crate) buckets: Option<u32>,
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
/// step of `judge` in `decide.lua`.
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
