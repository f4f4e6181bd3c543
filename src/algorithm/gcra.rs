//! GCRA, the generic cell rate algorithm.
//!
//! Each key stores one number, its theoretical arrival time (TAT): when the key would be fully
//! rested if it spent at exactly the quota's rate. A unit costs one emission interval
//! `T = window / limit`, rounded **up** to a whole microsecond so the rate never exceeds the
//! quota. A request of `cost` units is admitted when `max(TAT, now) + cost·T − now ≤ burst·T`.
//! **Limit** reported to clients: the burst (default: the limit). **Burst**: how many units a
//! rested key may spend at once. **Remaining**: how many more units could be spent right now.
//! **Reset**: the time until the key is fully rested (`TAT − now`). **Retry after**: the time
//! until the request fits in the tolerance; a request whose cost exceeds the burst is never
//! admitted. It admits exactly what a token bucket of the same burst and rate admits, with one
//! integer of state. Memory per key: one integer.

use super::{Algorithm, LuaParams, Options, Packed, Kernel, Verdict, check_exact, rescale};
use crate::error::ConfigError;
use crate::quota::Quota;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// Emission interval in microseconds.
    interval: u64,
    burst: u64,
    /// `burst · interval`.
    tolerance: u64,
    /// The quota's window in microseconds.
    window: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GcraState {
    tat: u64,
}

impl Gcra {
    pub(crate) fn new(quota: Quota) -> Result<Self, ConfigError> {
        let interval = quota.window_us().div_ceil(quota.limit() as u64);
        let burst = quota.burst_or_limit() as u64;
        check_exact(
            burst as u128 * interval as u128,
            Algorithm::Gcra,
            "burst × emission interval",
        )?;
        Ok(Gcra {
            interval,
            burst,
            tolerance: burst * interval,
            window: quota.window_us(),
        })
    }
}

impl Kernel for Gcra {
    type State = GcraState;
    #[cfg(test)]
    const GUARANTEE: super::Guarantee = super::Guarantee::BurstAndRate;
    const HAS_BURST: bool = true;
    const PACKS: bool = true;

    fn compile(quota: Quota, _: Options) -> Result<Self, ConfigError> {
        Self::new(quota)
    }

    /// The TAT, which is when the state expires.
    #[inline]
    fn pack(&self, state: &GcraState) -> Option<Packed> {
        Some(Packed::new(state.tat, 0))
    }

    #[inline]
    fn unpack(&self, packed: Packed) -> Option<GcraState> {
        (packed.word() > 0).then_some(GcraState { tat: packed.word() })
    }

    fn window_us(&self) -> u64 {
        self.tolerance
    }

    fn reported_limit(&self) -> u64 {
        self.burst
    }

    fn lua_params(&self) -> LuaParams {
        smallvec::smallvec![self.interval, self.tolerance]
    }

    #[inline]
    fn evaluate(&self, state: Option<&GcraState>, now: u64, cost: u64) -> Verdict {
        let tat = state.map_or(now, |s| s.tat.max(now));
        let backlog = tat - now;
        // Divisions cost tens of cycles: an admitted request makes one.
        let remaining_now = || (self.tolerance - backlog.min(self.tolerance)) / self.interval;
        if cost > self.burst {
            return Verdict::deny(remaining_now(), backlog, None);
        }
        let new_backlog = backlog + cost * self.interval;
        if new_backlog <= self.tolerance {
            Verdict::allow((self.tolerance - new_backlog) / self.interval, new_backlog)
        } else {
            Verdict::deny(remaining_now(), backlog, Some(new_backlog - self.tolerance))
        }
    }

    /// Gives back up to `units` emission intervals, never before `now`.
    fn refund(&self, state: &mut Option<GcraState>, now: u64, units: u64) -> Option<u64> {
        let tat = state.as_ref()?.tat.max(now);
        let tat = tat.saturating_sub(units * self.interval).max(now);
        *state = Some(GcraState { tat });
        Some(tat)
    }

    /// Gives back the latest booked time only: its charge put the TAT at `at + tolerance`.
    fn release(&self, state: &mut Option<GcraState>, now: u64, at: u64, units: u64) -> Option<u64> {
        if state.as_ref()?.tat != at + self.tolerance {
            return None;
        }
        self.refund(state, now, units)
    }

    /// The backlog (`TAT − now`, a time) is re-counted in the new emission interval: 5 units
    /// used of `10/min` are 5 units used of `20/min`, and 5 used of `3/min` are 2 more than
    /// the burst, which the key waits for.
    fn convert(&self, from: &Self, state: &mut Option<GcraState>, now: u64, _: u64) -> u64 {
        let backlog = state.as_ref().map_or(0, |s| s.tat.saturating_sub(now));
        if backlog == 0 {
            *state = None;
            return now;
        }
        let tat = now + rescale(backlog, from.interval, self.interval);
        *state = Some(GcraState { tat });
        tat
    }

    /// The TAT no earlier than the lease's end: the units are charged as if spent then.
    fn lease_state(&self, state: Option<&GcraState>, now: u64, end: u64) -> Option<GcraState> {
        let tat = state.map_or(now, |s| s.tat.max(now)).max(end);
        Some(GcraState { tat })
    }

    #[inline]
    fn commit(&self, state: &mut Option<GcraState>, now: u64, cost: u64) -> u64 {
        let tat = state.as_ref().map_or(now, |s| s.tat.max(now)) + cost * self.interval;
        *state = Some(GcraState { tat });
        tat
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Compiled, TableRow, run_table};
    use std::time::Duration;

    #[test]
    fn table() {
        // 2 per 1000us, burst 3: interval 500, tolerance 1500.
        let q = Quota::new(2, Duration::from_micros(1000))
            .unwrap()
            .try_with_burst(3)
            .unwrap();
        let a = Gcra::new(q).unwrap();
        let cases: &[TableRow] = &[
            (10_000, 1, true, 2, 500, None),
            (10_000, 2, true, 0, 1500, None),
            (10_000, 1, false, 0, 1500, Some(500)),
            (10_500, 1, true, 0, 1500, None),
            (10_600, 1, false, 0, 1400, Some(400)),
            (10_600, 4, false, 0, 1400, None),
            (11_000, 1, true, 0, 1500, None),
            (14_000, 0, true, 3, 0, None),
        ];
        run_table(&Compiled::Gcra(a), cases);
    }

    #[test]
    fn interval_rounds_up() {
        let a = Gcra::new(Quota::new(3, Duration::from_secs(1)).unwrap()).unwrap();
        assert_eq!(a.interval, 333_334);
    }
}
