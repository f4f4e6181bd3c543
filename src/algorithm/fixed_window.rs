//! Fixed window.
//!
//! Time is cut into windows of the quota's length, aligned to the clock's epoch (so every key
//! shares the same boundaries), and each key counts the units it spends in the current window.
//! **Limit**: units per window. **Burst**: none; a fresh window allows the whole limit at once.
//! **Remaining**: limit minus the units spent in the current window. **Reset**: the time until
//! the current window ends (zero for a key with nothing spent). **Retry after**: the same time,
//! since the next window starts empty; a request whose cost exceeds the limit is never admitted.
//! Across a boundary a client can spend the limit at the end of one window and again at the start
//! of the next: up to **twice the limit** in any window-long span. Memory per key: two integers
//! (window start, count); in the memory store, the window's end and the count, beside each other
//! in the key's row (no allocation), decided under the shard's shared lock.
//!
//! With a calendar ([`Periods`]), the windows are its periods (a day, a week or a month in a
//! time zone) rather than equal lengths from the epoch: every other rule is the same.

use std::sync::Arc;

use super::{LuaParams, Options, Packed, Kernel, Verdict};
use crate::calendar::Periods;
use crate::error::ConfigError;
use crate::quota::Quota;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    limit: u64,
    window: u64,
    /// The calendar periods counted instead of windows of `window`.
    periods: Option<Arc<Periods>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FixedWindowState {
    start: u64,
    count: u64,
}

impl FixedWindow {
    pub(crate) fn new(quota: Quota) -> Self {
        FixedWindow {
            limit: quota.limit() as u64,
            window: quota.window_us(),
            periods: None,
        }
    }

    /// The same limit counted over calendar periods.
    pub(crate) fn with_periods(mut self, periods: Arc<Periods>) -> Self {
        self.periods = Some(periods);
        self
    }

    /// The calendar periods counted, if any, shared.
    pub(crate) fn shared_periods(&self) -> Option<&Arc<Periods>> {
        self.periods.as_ref()
    }

    /// The calendar periods counted, if any.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn periods(&self) -> Option<&Periods> {
        self.periods.as_deref()
    }

    /// Whether a key's own limit, `own`, still applies under this definition: one of
    /// calendar periods ends when the policy no longer counts the same periods (twin of
    /// `keeps` in the Lua twin).
    pub(crate) fn still_applies(&self, own: &FixedWindow) -> bool {
        match (&own.periods, &self.periods) {
            (None, _) => true,
            (Some(own), Some(present)) => own == present,
            (Some(_), None) => false,
        }
    }

        /// The start and end of the window holding `t`.
    fn bounds(&self, t: u64) -> (u64, u64) {
        match &self.periods {
            None => {
                let start = t - t % self.window;
                (start, start + self.window)
            }
            Some(periods) => periods.window(t),
        }
    }

    /// The current window's start, end and count. A state from a later window (the clock went
    /// back) is kept as the current one.
    fn current(&self, state: Option<&FixedWindowState>, now: u64) -> (u64, u64, u64) {
        let (start, end) = self.bounds(now);
        match state {
            Some(s) if s.start == start => (start, end, s.count),
            Some(s) if s.start > start => (s.start, self.bounds(s.start).1, s.count),
            _ => (start, end, 0),
        }
    }
}

impl Kernel for FixedWindow {
    type State = FixedWindowState;
    #[cfg(test)]
    const GUARANTEE: super::Guarantee = super::Guarantee::AlignedWindows;
    const PACKS: bool = true;
    const PACKS_COUNT: bool = true;

    /// Windows of one length (a calendar's periods do not follow from their end). A count
    /// charged is at most the limit, a `u32`: it fits the packed count.
    fn packs(&self) -> bool {
        self.periods.is_none()
    }

    /// The window's end (when the state expires) and its count.
    #[inline]
    fn pack(&self, state: &FixedWindowState) -> Option<Packed> {
        if !self.packs() {
            return None;
        }
        Some(Packed::new(state.start + self.window, u32::try_from(state.count).ok()?))
    }

    #[inline]
    fn unpack(&self, packed: Packed) -> Option<FixedWindowState> {
        (packed.word() > 0).then(|| FixedWindowState {
            start: packed.word() - self.window,
            count: u64::from(packed.count()),
        })
    }

    fn compile(quota: Quota, _: Options) -> Result<Self, ConfigError> {
        Ok(Self::new(quota))
    }

    fn window_us(&self) -> u64 {
        match &self.periods {
            None => self.window,
            Some(periods) => periods.length(),
        }
    }

    fn reported_limit(&self) -> u64 {
        self.limit
    }

    /// With a calendar, the window is 0 and the calendar's id follows; each call carries the
    /// periods' boundaries after the tag (see `Tier::tag`).
    fn lua_params(&self) -> LuaParams {
        match &self.periods {
            None => smallvec::smallvec![self.limit, self.window],
            Some(periods) => smallvec::smallvec![self.limit, 0, periods.id()],
        }
    }

    /// A state from a later window (a booked time, or the clock went back) starts there.
    fn own_time(&self, state: &FixedWindowState) -> u64 {
        state.start
    }

    /// The count of the window still running carries over into the new window that holds the
    /// present (or the state's later window): with the window unchanged, 5 used of 10 are 5
    /// used of 20. A window that has ended carries nothing (a calendar period has ended when
    /// the present definition's window holding the present starts after it); a longer window starts from the
    /// count of the old window that was running (the windows before it are forgotten), a
    /// shorter one keeps that count until it ends.
    fn convert(&self, from: &Self, state: &mut Option<FixedWindowState>, now: u64, _: u64) -> u64 {
        let Some(s) = state.as_ref() else {
            return now;
        };
        // A calendar's window ended when the present definition's window holding `now`
        // starts after it (the script has the present calendar's boundaries only).
        let ended = match from.periods {
            None => s.start + from.window <= now,
            Some(_) => s.start < self.bounds(now).0,
        };
        if ended {
            *state = None;
            return now;
        }
        let (start, end) = self.bounds(s.start.max(now));
        *state = Some(FixedWindowState {
            start,
            count: s.count,
        });
        end
    }

    fn evaluate(&self, state: Option<&FixedWindowState>, now: u64, cost: u64) -> Verdict {
        let (start, end, count) = self.current(state, now);
        // As of the state's own time when it is ahead (see `own_time`).
        let window_left = end - now.max(start);
        let remaining = self.limit.saturating_sub(count);
        if cost > self.limit {
            return Verdict::deny(remaining, reset(count, window_left), None);
        }
        if count + cost <= self.limit {
            Verdict::allow(remaining - cost, reset(count + cost, window_left))
        } else {
            Verdict::deny(remaining, reset(count, window_left), Some(window_left))
        }
    }

    /// Gives back up to `units` of the current window's count.
    fn refund(&self, state: &mut Option<FixedWindowState>, now: u64, units: u64) -> Option<u64> {
        state.as_ref()?;
        let (start, end, count) = self.current(state.as_ref(), now);
        *state = Some(FixedWindowState {
            start,
            count: count - count.min(units),
        });
        Some(end)
    }

    /// A lease ends with the window its units are counted in.
    fn lease_end(&self, state: Option<&FixedWindowState>, now: u64, ttl: u64) -> u64 {
        let (start, end, _) = self.current(state, now);
        (now.max(start) + ttl).min(end - 1)
    }

    /// Gives back to the lease's window only: once another has begun, the units went with it.
    fn give_back(
        &self,
        state: &mut Option<FixedWindowState>,
        now: u64,
        end: u64,
        units: u64,
    ) -> Option<u64> {
        let (start, _, _) = self.current(state.as_ref(), now);
        if start != self.bounds(end).0 {
            return None;
        }
        self.refund(state, now, units)
    }

    fn commit(&self, state: &mut Option<FixedWindowState>, now: u64, cost: u64) -> u64 {
        let (start, end, count) = self.current(state.as_ref(), now);
        *state = Some(FixedWindowState {
            start,
            count: count + cost,
        });
        end
    }
}

fn reset(count: u64, window_left: u64) -> u64 {
    if count == 0 { 0 } else { window_left }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Compiled, TableRow, run_table};

    fn fw(limit: u32, window_us: u64) -> FixedWindow {
        FixedWindow::new(Quota::new(limit, std::time::Duration::from_micros(window_us)).unwrap())
    }

    /// (time, cost) -> (allowed, remaining, reset, retry)
    #[test]
    fn table() {
        let a = fw(3, 1000);
        let cases: &[TableRow] = &[
            (10_000, 1, true, 2, 1000, None),
            (10_100, 1, true, 1, 900, None),
            (10_500, 1, true, 0, 500, None),
            (10_999, 1, false, 0, 1, Some(1)),
            (11_000, 2, true, 1, 1000, None),
            (11_001, 2, false, 1, 999, Some(999)),
            (11_001, 4, false, 1, 999, None),
            (11_002, 0, true, 1, 998, None),
            (13_500, 3, true, 0, 500, None),
        ];
        run_table(&Compiled::FixedWindow(a), cases);
    }

    #[test]
    fn clock_going_back_keeps_the_later_window() {
        let a = fw(1, 1000);
        let mut st = None;
        a.commit(&mut st, 5_500, 1);
        assert!(!a.evaluate(st.as_ref(), 4_900, 1).allowed);
    }
}
