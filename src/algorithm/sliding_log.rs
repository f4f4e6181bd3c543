//! Sliding log.
//!
//! Each key keeps the time and cost of every request it was admitted for in the last window,
//! and a request is admitted when the units inside the window `(now − window, now]` plus its cost
//! stay within the limit. This is the only exact window algorithm: in **every** window-long span
//! at most `limit` units are admitted. Entries newer than `now` (a lease's units, logged at the
//! lease's end; or any, after the clock went back) count in full until a window after their
//! own time.
//! **Limit**: units per window. **Burst**: none; an idle key may spend the whole limit at once.
//! **Remaining**: limit minus the units inside the window. **Reset**: the time until the newest
//! logged request leaves the window. **Retry after**: the time until enough of the oldest logged
//! requests have left the window for this request to fit; a request whose cost exceeds the limit
//! is never admitted.
//! Memory per key: one entry (time and cost, 16 bytes) per admitted request in the window, so up
//! to `limit` entries; limits above [`MAX_LIMIT`] are refused when the policy is built.

use std::collections::VecDeque;

use super::{LuaParams, Options, Kernel, Verdict};
use crate::error::ConfigError;
use crate::quota::Quota;

/// The largest limit a sliding log accepts: the log holds up to one entry per unit.
pub(crate) const MAX_LIMIT: u64 = 10_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlidingLog {
    limit: u64,
    window: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlidingLogState {
    /// `(time, cost)` of admitted requests, oldest first; may include expired entries until
    /// the next commit prunes them.
    ///
    /// Boxed: the state of every algorithm is stored in one enum, which the queue inline would
    /// make 48 bytes wide for all of them (the memory store keeps one per key).
    #[expect(clippy::box_collection, reason = "keeps every algorithm's state 16 bytes wide")]
    entries: Box<VecDeque<(u64, u32)>>,
    /// Sum of the costs in `entries`.
    total: u64,
}

impl SlidingLog {
    pub(crate) fn new(quota: Quota) -> Result<Self, ConfigError> {
        let limit = quota.limit() as u64;
        if limit > MAX_LIMIT {
            return Err(ConfigError::new(format!(
                "sliding_log keeps one entry per admitted request, so its limit is capped at {MAX_LIMIT} (got {limit}); use sliding_window for large limits"
            )));
        }
        Ok(SlidingLog {
            limit,
            window: quota.window_us(),
        })
    }

    /// Logs `cost` units at `at`, keeping the entries in time order (an entry may be newer
    /// than the present: a lease's units are logged at its end).
    fn log(state: &mut SlidingLogState, at: u64, cost: u64) {
        let cost = cost.min(u64::from(u32::MAX)) as u32;
        match state.entries.back_mut() {
            Some((t, c)) if *t == at => *c = c.saturating_add(cost),
            Some(&mut (t, _)) if t > at => {
                let i = state.entries.partition_point(|e| e.0 < at);
                match state.entries.get_mut(i) {
                    Some((t, c)) if *t == at => *c = c.saturating_add(cost),
                    _ => state.entries.insert(i, (at, cost)),
                }
            }
            _ => state.entries.push_back((at, cost)),
        }
        state.total += cost as u64;
    }

    /// Forgets up to `units` of the entry at `i`, removing it once empty; returns the units
    /// forgotten.
    fn forget(state: &mut SlidingLogState, i: usize, units: u64) -> u64 {
        let entry = &mut state.entries[i];
        let take = units.min(entry.1 as u64);
        entry.1 -= take as u32;
        state.total -= take;
        if entry.1 == 0 {
            state.entries.remove(i);
        }
        take
    }

    /// Drops the entries out of the window at `now`; returns when the newest leaves it.
    fn prune(&self, state: &mut SlidingLogState, now: u64) -> u64 {
        let (first, used) = self.live(state, now);
        state.entries.drain(..first);
        state.total = used;
        self.expiry(state, now)
    }

    /// When the newest entry leaves the window (`now` for an empty log).
    fn expiry(&self, state: &SlidingLogState, now: u64) -> u64 {
        state.entries.back().map_or(now, |&(t, _)| t + self.window)
    }

    /// Index of the first live entry and the units still inside the window.
    fn live(&self, state: &SlidingLogState, now: u64) -> (usize, u64) {
        let mut used = state.total;
        let mut first = 0;
        for &(t, c) in state.entries.iter() {
            if t + self.window > now {
                break;
            }
            used -= c as u64;
            first += 1;
        }
        (first, used)
    }
}

impl Kernel for SlidingLog {
    type State = SlidingLogState;
    #[cfg(test)]
    const GUARANTEE: super::Guarantee = super::Guarantee::AnyWindow;

    fn compile(quota: Quota, _: Options) -> Result<Self, ConfigError> {
        Self::new(quota)
    }

    fn window_us(&self) -> u64 {
        self.window
    }

    fn reported_limit(&self) -> u64 {
        self.limit
    }

    fn lua_params(&self) -> LuaParams {
        smallvec::smallvec![self.limit, self.window]
    }

    fn evaluate(&self, state: Option<&SlidingLogState>, now: u64, cost: u64) -> Verdict {
        let Some(state) = state else {
            return if cost > self.limit {
                Verdict::deny(self.limit, 0, None)
            } else {
                Verdict::allow(self.limit - cost, if cost > 0 { self.window } else { 0 })
            };
        };
        let (first, used) = self.live(state, now);
        let newest_left = match state.entries.back() {
            Some(&(t, _)) if used > 0 => t + self.window - now,
            _ => 0,
        };
        if cost > self.limit {
            return Verdict::deny(self.limit.saturating_sub(used), newest_left, None);
        }
        if used + cost <= self.limit {
            let reset = if cost > 0 { self.window } else { newest_left };
            return Verdict::allow(self.limit - used - cost, reset);
        }
        let need = used + cost - self.limit;
        let mut freed = 0;
        let mut retry = None;
        for &(t, c) in state.entries.iter().skip(first) {
            freed += c as u64;
            if freed >= need {
                retry = Some(t + self.window - now);
                break;
            }
        }
        Verdict::deny(self.limit.saturating_sub(used), newest_left, retry)
    }

    /// Forgets up to `units` of the newest units logged at or before `now` (those logged
    /// later are a lease's, which gives back its own).
    fn refund(&self, state: &mut Option<SlidingLogState>, now: u64, units: u64) -> Option<u64> {
        let st = state.as_mut()?;
        let mut left = units;
        let mut i = st.entries.partition_point(|e| e.0 <= now);
        while left > 0 && i > 0 {
            i -= 1;
            left -= Self::forget(st, i, left);
        }
        Some(self.expiry(st, now))
    }

    fn commit(&self, state: &mut Option<SlidingLogState>, now: u64, cost: u64) -> u64 {
        self.lease_commit(state, now, now, cost)
    }

    /// The entries mean the same under any quota: a new limit counts them as they are, a new
    /// window counts those inside it, of the entries the store still holds (a log keeps its
    /// entries for the old window at least, and until the key expires).
    fn convert(&self, _: &Self, state: &mut Option<SlidingLogState>, now: u64, expires_at: u64) -> u64 {
        state
            .as_ref()
            .map_or(expires_at, |s| expires_at.max(self.expiry(s, now)))
    }

    /// Logs the lease's units at its end: each counts until a window after the latest moment
    /// it may be spent. (A charge is the same, logged at `now`.)
    fn lease_commit(&self, state: &mut Option<SlidingLogState>, now: u64, end: u64, units: u64) -> u64 {
        let st = state.get_or_insert_with(SlidingLogState::default);
        if units > 0 {
            Self::log(st, end, units);
        }
        self.prune(st, now)
    }

    /// Logs a booked request's units at its booked time, as a lease's at its end.
    fn book_commit(&self, state: &mut Option<SlidingLogState>, now: u64, at: u64, cost: u64) -> u64 {
        self.lease_commit(state, now, at, cost)
    }

    /// Forgets up to `units` of those logged at the lease's end.
    fn give_back(
        &self,
        state: &mut Option<SlidingLogState>,
        now: u64,
        end: u64,
        units: u64,
    ) -> Option<u64> {
        let st = state.as_mut()?;
        let i = st.entries.partition_point(|e| e.0 < end);
        st.entries.get(i).filter(|e| e.0 == end)?;
        Self::forget(st, i, units);
        Some(self.expiry(st, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Compiled, TableRow, run_table};
    use std::time::Duration;

    #[test]
    fn table() {
        let a = SlidingLog::new(Quota::new(3, Duration::from_micros(1000)).unwrap()).unwrap();
        let cases: &[TableRow] = &[
            (10_000, 1, true, 2, 1000, None),
            (10_400, 2, true, 0, 1000, None),
            (10_900, 1, false, 0, 500, Some(100)),
            (10_999, 2, false, 0, 401, Some(401)),
            (11_000, 1, true, 0, 1000, None),
            (11_000, 4, false, 0, 1000, None),
            (11_400, 1, true, 1, 1000, None),
            (12_400, 0, true, 3, 0, None),
        ];
        run_table(&Compiled::SlidingLog(a), cases);
    }

    #[test]
    fn limit_is_capped() {
        let q = Quota::new(10_001, Duration::from_secs(1)).unwrap();
        assert!(
            SlidingLog::new(q)
                .unwrap_err()
                .to_string()
                .contains("sliding_window")
        );
    }
}
