//! Token bucket.
//!
//! Each key has a bucket holding up to `burst` tokens (default: the limit), refilled
//! continuously at `limit` tokens per window; a request takes `cost` tokens and is admitted when
//! the bucket holds that many. Tokens are counted exactly, in fractions of `1/(window/gcd)`, so
//! `3/s` refills exactly three tokens per second with no rounding drift.
//! **Limit** reported to clients: the capacity (burst). **Burst**: the capacity; a full bucket
//! admits that many units at once. **Remaining**: whole tokens left. **Reset**: the time until the
//! bucket is full again. **Retry after**: the time until enough tokens have dripped in for this
//! request; a request whose cost exceeds the capacity is never admitted.
//! Memory per key: two integers (tokens, last update).

use super::{Algorithm, LuaParams, Options, Kernel, Verdict, check_exact, gcd, rescale};
use crate::error::ConfigError;
use crate::quota::Quota;

/// Shared by the token and leaky buckets: capacity and rate in exact scaled units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Scaled {
    /// Capacity in tokens.
    pub(crate) capacity: u64,
    /// Scaled units per token (`window / gcd(limit, window)`).
    pub(crate) unit: u64,
    /// Scaled units added per microsecond (`limit / gcd(limit, window)`).
    pub(crate) rate: u64,
    /// `capacity · unit`.
    pub(crate) full: u64,
    /// The quota's window in microseconds (the time in which `limit` tokens refill).
    pub(crate) window: u64,
}

impl Scaled {
    pub(crate) fn new(quota: Quota, algorithm: Algorithm) -> Result<Self, ConfigError> {
        let limit = quota.limit() as u64;
        let window = quota.window_us();
        let g = gcd(limit, window);
        let unit = window / g;
        let rate = limit / g;
        let capacity = quota.burst_or_limit() as u64;
        check_exact(
            capacity as u128 * unit as u128,
            algorithm,
            "capacity × window",
        )?;
        Ok(Scaled {
            capacity,
            unit,
            rate,
            full: capacity * unit,
            window,
        })
    }

    /// `amount` after `elapsed` microseconds of flow at `rate`, capped at `full`.
    pub(crate) fn fill(&self, amount: u64, elapsed: u64) -> u64 {
        let missing = self.full - amount.min(self.full);
        if elapsed >= missing.div_ceil(self.rate) {
            self.full
        } else {
            amount + elapsed * self.rate
        }
    }

    /// `amount` (of `from`'s scaled units) in this bucket's scaled units (see [`rescale`]).
    pub(crate) fn rescaled(&self, from: &Scaled, amount: u64) -> u64 {
        rescale(amount, from.unit, self.unit)
    }

    /// The time in which the whole capacity flows, the window reported with it.
    pub(crate) fn window_us(&self) -> u64 {
        self.full.div_ceil(self.rate)
    }

    /// The parameters of both buckets' Lua twins: capacity, unit, rate, full.
    pub(crate) fn lua_params(&self) -> LuaParams {
        smallvec::smallvec![self.capacity, self.unit, self.rate, self.full]
    }

    /// `amount` after `elapsed` microseconds of draining at `rate`, floored at zero.
    pub(crate) fn drain(&self, amount: u64, elapsed: u64) -> u64 {
        if elapsed >= amount.div_ceil(self.rate) {
            0
        } else {
            amount - elapsed * self.rate
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TokenBucket {
    scaled: Scaled,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TokenBucketState {
    /// Tokens, in scaled units.
    tokens: u64,
    /// Time of the last update.
    last: u64,
}

impl TokenBucket {
    pub(crate) fn new(quota: Quota) -> Result<Self, ConfigError> {
        Ok(TokenBucket {
            scaled: Scaled::new(quota, Algorithm::TokenBucket)?,
        })
    }

    fn tokens(&self, state: Option<&TokenBucketState>, now: u64) -> u64 {
        match state {
            None => self.scaled.full,
            Some(s) => self.scaled.fill(s.tokens, now.saturating_sub(s.last)),
        }
    }
}

impl Kernel for TokenBucket {
    type State = TokenBucketState;
    #[cfg(test)]
    const GUARANTEE: super::Guarantee = super::Guarantee::BurstAndRate;
    const HAS_BURST: bool = true;

    fn compile(quota: Quota, _: Options) -> Result<Self, ConfigError> {
        Self::new(quota)
    }

    fn window_us(&self) -> u64 {
        self.scaled.window_us()
    }

    fn reported_limit(&self) -> u64 {
        self.scaled.capacity
    }

    fn lua_params(&self) -> LuaParams {
        self.scaled.lua_params()
    }

    fn own_time(&self, state: &TokenBucketState) -> u64 {
        state.last
    }

    /// The tokens missing now (used, not yet refilled; a state ahead of now owes the refill
    /// up to its time as well) are re-counted in the new unit: 5 tokens used of 10 are 5 used
    /// of 20, and 15 are left. More missing than the new capacity is an empty bucket that
    /// starts refilling only once the rest has refilled (its time ahead of now), so that
    /// converting it back gives the same usage.
    fn convert(&self, from: &Self, state: &mut Option<TokenBucketState>, now: u64, _: u64) -> u64 {
        let Some(s) = state.as_ref() else {
            return now;
        };
        let old = &from.scaled;
        let missing = if s.last > now {
            old.full - s.tokens.min(old.full) + (s.last - now) * old.rate
        } else {
            old.full - from.tokens(Some(s), now).min(old.full)
        };
        if missing == 0 {
            *state = None;
            return now;
        }
        let new = &self.scaled;
        let missing = new.rescaled(old, missing);
        let (tokens, last) = match missing.checked_sub(new.full) {
            Some(owed) if owed > 0 => (0, now + owed.div_ceil(new.rate)),
            _ => (new.full - missing, now),
        };
        *state = Some(TokenBucketState { tokens, last });
        last + (new.full - tokens).div_ceil(new.rate)
    }

    fn evaluate(&self, state: Option<&TokenBucketState>, now: u64, cost: u64) -> Verdict {
        let s = &self.scaled;
        let tokens = self.tokens(state, now);
        let refill_time = |t: u64| (s.full - t).div_ceil(s.rate);
        if cost > self.scaled.capacity {
            return Verdict::deny(tokens / s.unit, refill_time(tokens), None);
        }
        let need = cost * s.unit;
        if tokens >= need {
            let left = tokens - need;
            Verdict::allow(left / s.unit, refill_time(left))
        } else {
            Verdict::deny(
                tokens / s.unit,
                refill_time(tokens),
                Some((need - tokens).div_ceil(s.rate)),
            )
        }
    }

    /// Puts back up to `units` tokens, never above the capacity.
    fn refund(&self, state: &mut Option<TokenBucketState>, now: u64, units: u64) -> Option<u64> {
        let last = state.as_ref()?.last.max(now);
        let s = &self.scaled;
        let tokens = self.tokens(state.as_ref(), now);
        let tokens = if units >= s.capacity {
            s.full
        } else {
            (tokens + units * s.unit).min(s.full)
        };
        *state = Some(TokenBucketState { tokens, last });
        Some(last + (s.full - tokens).div_ceil(s.rate))
    }

    /// Gives back the latest booked time only: the bucket was last updated there.
    fn release(&self, state: &mut Option<TokenBucketState>, now: u64, at: u64, units: u64) -> Option<u64> {
        if state.as_ref()?.last != at {
            return None;
        }
        self.refund(state, now, units)
    }

    /// No more tokens than a bucket that still has room for the refill until the lease's end:
    /// a refill the lease's units could make overflow the bucket is not counted.
    fn lease_state(&self, state: Option<&TokenBucketState>, now: u64, end: u64) -> Option<TokenBucketState> {
        let s = &self.scaled;
        let tokens = self
            .tokens(state, now)
            .min(s.full - s.fill(0, end.saturating_sub(now)));
        let last = state.map_or(now, |st| st.last.max(now));
        Some(TokenBucketState { tokens, last })
    }

    /// A charge that empties the bucket and owes the rest: the bucket then stays empty until
    /// the refill has paid it (its `last` moved on by the time that takes, as `convert` keeps
    /// a debt).
    fn debit(&self, state: &mut Option<TokenBucketState>, now: u64, units: u64) -> u64 {
        let s = &self.scaled;
        let need = units.saturating_mul(s.unit);
        let have = self.tokens(state.as_ref(), now);
        let mut last = state.as_ref().map_or(now, |st| st.last.max(now));
        let tokens = match have.checked_sub(need) {
            Some(left) => left,
            None => {
                last += (need - have).div_ceil(s.rate);
                0
            }
        };
        *state = Some(TokenBucketState { tokens, last });
        last + (s.full - tokens).div_ceil(s.rate)
    }

    fn commit(&self, state: &mut Option<TokenBucketState>, now: u64, cost: u64) -> u64 {
        let tokens = self
            .tokens(state.as_ref(), now)
            .saturating_sub(cost * self.scaled.unit);
        let last = state.as_ref().map_or(now, |s| s.last.max(now));
        *state = Some(TokenBucketState { tokens, last });
        last + (self.scaled.full - tokens).div_ceil(self.scaled.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Compiled, TableRow, run_table};
    use std::time::Duration;

    #[test]
    fn table() {
        // 3 per 1000us, capacity 3: unit = 1000, rate = 3 per us; a token every 333.33us.
        let a = TokenBucket::new(Quota::new(3, Duration::from_micros(1000)).unwrap()).unwrap();
        let cases: &[TableRow] = &[
            (10_000, 3, true, 0, 1000, None),
            (10_000, 1, false, 0, 1000, Some(334)),
            (10_333, 1, false, 0, 667, Some(1)),
            (10_334, 1, true, 0, 1000, None),
            (10_334, 4, false, 0, 1000, None),
            (11_000, 0, true, 2, 334, None),
            (20_000, 2, true, 1, 667, None),
        ];
        run_table(&Compiled::TokenBucket(a), cases);
    }

    #[test]
    fn exact_arithmetic_bound_is_checked() {
        let q = Quota::new(999_983, Duration::from_secs(366 * 86_400)).unwrap();
        assert!(TokenBucket::new(q).is_err());
    }
}
