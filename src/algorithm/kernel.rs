//! What every algorithm is: a [`Kernel`] (how it judges, charges and gives back on its own
//! state), the [`Verdict`] it gives, and what the stores build on it (the lag when a state
//! runs ahead of the clock, packed states, booked times, leases).

use crate::error::ConfigError;
use crate::quota::Quota;

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
pub(crate) trait Kernel: Sized {
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
    /// of `now` (the clock went back), as of the state's own time ([`Kernel::own_time`]).
    fn evaluate(&self, state: Option<&Self::State>, now: u64, cost: u64) -> Verdict;

    /// Phase two: charges an admitted request. Returns when the state expires (becomes the same
    /// as a fresh key), in microseconds on the same clock as `now`.
    fn commit(&self, state: &mut Option<Self::State>, now: u64, cost: u64) -> u64;

    /// Charges `units` whatever the state, past the limit if need be: what a request turned
    /// out to cost beyond what was charged up front (`Op::Settle`). The key then owes the
    /// units, and is denied until time pays them back: a window counts past its limit until
    /// it ends or slides on, GCRA moves its TAT on, a leaky bucket fills past its brim. By
    /// default a charge ([`Kernel::commit`], which none of those bounds); an algorithm whose
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

    /// Charges a lease of `units` ending at `end` (on the state [`Kernel::lease_state`] gave):
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

    /// Gives back `units` a request booked at `at` and will not spend (its client went
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

    /// Charges a request that booked the time `at` (later than `now`): a charge made at
    /// `at` (the state then counts from its booked time: a later window, a bucket's update time),
    /// except for the sliding log, which logs the units at `at` and keeps, at `now`, the
    /// entries still inside the present's window. Returns when the state expires.
    fn book_commit(&self, state: &mut Option<Self::State>, now: u64, at: u64, cost: u64) -> u64 {
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

    /// Whether the state may pack (see [`pack`](Kernel::pack)).
    const PACKS: bool = false;

    /// Whether a packed state uses its count ([`Packed::count`]): then a decision on it alone
    /// claims its word rather than swapping it (the word and the count change together).
    const PACKS_COUNT: bool = false;

    /// Whether this policy's states pack (the type's [`PACKS`](Kernel::PACKS) unless its
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

    /// The state that [`pack`](Kernel::pack) made `packed` of (`None` for a word of 0).
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
/// booked a later time) decides as of its own time, its times moved to be from `now`, and
/// admits no cost before that time (nothing remains until then): a request it would admit
/// then waits until then. Admitting
/// it now would spend, before they exist, units the state counts as there only from its own
/// time (the refill of a bucket, the room of a later window).
#[inline]
pub(super) fn evaluate_with_lag<A: Kernel>(
    a: &A,
    state: Option<&A::State>,
    now: u64,
    cost: u64,
) -> Verdict {
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

/// A state packed for the memory store's shared path (see [`Kernel::pack`]).
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

/// One request of `cost` on the packed state `packed` (see [`Kernel::pack`]): the verdict, and
/// the state the charge leaves when it is admitted and charged (`packed` when nothing is).
#[inline(always)]
pub(super) fn judge_packed_as<A: Kernel>(
    a: &A,
    packed: Packed,
    now: u64,
    cost: u64,
) -> (Verdict, Packed) {
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
/// request (of a cost above 0: a look books nothing) is admitted then on the state as it
/// is (twin of `booking` in `decide.lua`).
pub(super) fn booking<A: Kernel>(
    a: &A,
    state: Option<&A::State>,
    now: u64,
    cost: u64,
    verdict: &Verdict,
    max_wait: u64,
) -> Option<u64> {
    if cost == 0 {
        // A look books nothing.
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
/// of a request that asks for a lease, on the state [`Kernel::lease_state`] makes (twin of the
/// `LEASE` arm of `evaluate` in `decide.lua`).
pub(super) fn lease_verdict<A: Kernel>(
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
pub(super) fn take_lease<A: Kernel>(
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

/// What an algorithm admits at most over time ([`Kernel::GUARANTEE`]), in units of a quota of
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

/// Options that only some algorithms take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Options {
    /// Number of sub-window buckets of the sliding window counter.
    pub(crate) buckets: Option<u32>,
}
