//! Leaky bucket, as a meter.
//!
//! Each key has a bucket of capacity `burst` (default: the limit) that leaks continuously at
//! `limit` units per window; a request pours `cost` units in and is admitted when they fit
//! without overflowing. Requests are never queued or delayed: this is the "leaky bucket as a
//! meter", which admits exactly what a token bucket of the same capacity and rate admits; the
//! state counts what is in the bucket instead of what is left. Levels are exact, in the same
//! scaled units as the token bucket.
//! **Limit** reported to clients: the capacity. **Burst**: the capacity; an empty bucket takes
//! that many units at once. **Remaining**: whole units of free space. **Reset**: the time until the
//! bucket has drained empty. **Retry after**: the time until enough has leaked out for this
//! request to fit; a request whose cost exceeds the capacity is never admitted.
//! Memory per key: two integers (level, last update).

use super::Algorithm;
use super::{LuaParams, Options, Kernel, Verdict, token_bucket::Scaled};
use crate::error::ConfigError;
use crate::quota::Quota;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeakyBucket {
    scaled: Scaled,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeakyBucketState {
    /// Water level, in scaled units.
    level: u64,
    /// Time of the last update.
    last: u64,
}

impl LeakyBucket {
    pub(crate) fn new(quota: Quota) -> Result<Self, ConfigError> {
        Ok(LeakyBucket {
            scaled: Scaled::new(quota, Algorithm::LeakyBucket)?,
        })
    }

    fn level(&self, state: Option<&LeakyBucketState>, now: u64) -> u64 {
        match state {
            None => 0,
            Some(s) => self.scaled.drain(s.level, now.saturating_sub(s.last)),
        }
    }
}

impl Kernel for LeakyBucket {
    type State = LeakyBucketState;
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

    fn own_time(&self, state: &LeakyBucketState) -> u64 {
        state.last
    }

    /// The level now (units poured in, not yet drained; a state ahead of now counts the drain
    /// up to its time as well) is re-counted in the new unit: 5 units in a bucket of 10 are 5
    /// in a bucket of 20, and 5 in a bucket of 3 overflow it until 3 have drained.
    fn convert(&self, from: &Self, state: &mut Option<LeakyBucketState>, now: u64, _: u64) -> u64 {
        let Some(s) = state.as_ref() else {
            return now;
        };
        let level = if s.last > now {
            s.level + (s.last - now) * from.scaled.rate
        } else {
            from.level(Some(s), now)
        };
        if level == 0 {
            *state = None;
            return now;
        }
        let level = self.scaled.rescaled(&from.scaled, level);
        *state = Some(LeakyBucketState { level, last: now });
        now + level.div_ceil(self.scaled.rate)
    }

    fn evaluate(&self, state: Option<&LeakyBucketState>, now: u64, cost: u64) -> Verdict {
        let s = &self.scaled;
        let level = self.level(state, now);
        let drain_time = |l: u64| l.div_ceil(s.rate);
        if cost > self.scaled.capacity {
            return Verdict::deny(
                s.full.saturating_sub(level) / s.unit,
                drain_time(level),
                None,
            );
        }
        let after = level + cost * s.unit;
        if after <= s.full {
            Verdict::allow((s.full - after) / s.unit, drain_time(after))
        } else {
            Verdict::deny(
                s.full.saturating_sub(level) / s.unit,
                drain_time(level),
                Some((after - s.full).div_ceil(s.rate)),
            )
        }
    }

    /// Gives back the latest booked time only: the bucket was last updated there.
    fn release(&self, state: &mut Option<LeakyBucketState>, now: u64, at: u64, units: u64) -> Option<u64> {
        if state.as_ref()?.last != at {
            return None;
        }
        self.refund(state, now, units)
    }

    /// Takes back up to `units` from the bucket, never below empty.
    fn refund(&self, state: &mut Option<LeakyBucketState>, now: u64, units: u64) -> Option<u64> {
        let last = state.as_ref()?.last.max(now);
        let level = self.level(state.as_ref(), now);
        let s = &self.scaled;
        let level = if units >= s.capacity {
            0
        } else {
            level - level.min(units * s.unit)
        };
        *state = Some(LeakyBucketState { level, last });
        Some(last + level.div_ceil(s.rate))
    }

    /// A level no lower than what drains until the lease's end: a drain the lease's units
    /// could find the bucket empty for is not counted.
    fn lease_state(&self, state: Option<&LeakyBucketState>, now: u64, end: u64) -> Option<LeakyBucketState> {
        let level = self
            .level(state, now)
            .max(self.scaled.fill(0, end.saturating_sub(now)));
        let last = state.map_or(now, |st| st.last.max(now));
        Some(LeakyBucketState { level, last })
    }

    fn commit(&self, state: &mut Option<LeakyBucketState>, now: u64, cost: u64) -> u64 {
        let level = self.level(state.as_ref(), now) + cost * self.scaled.unit;
        let last = state.as_ref().map_or(now, |s| s.last.max(now));
        *state = Some(LeakyBucketState { level, last });
        last + level.div_ceil(self.scaled.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Compiled, TableRow, run_table};
    use std::time::Duration;

    #[test]
    fn table() {
        // 2 per 1000us, capacity 4: unit = 500, rate = 1 per us; a unit leaks every 500us.
        let q = Quota::new(2, Duration::from_micros(1000))
            .unwrap()
            .try_with_burst(4)
            .unwrap();
        let a = LeakyBucket::new(q).unwrap();
        let cases: &[TableRow] = &[
            (10_000, 3, true, 1, 1500, None),
            (10_000, 2, false, 1, 1500, Some(500)),
            (10_250, 2, false, 1, 1250, Some(250)),
            (10_500, 2, true, 0, 2000, None),
            (10_500, 5, false, 0, 2000, None),
            (12_600, 0, true, 4, 0, None),
        ];
        run_table(&Compiled::LeakyBucket(a), cases);
    }
}
