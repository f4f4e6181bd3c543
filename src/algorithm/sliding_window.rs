//! Sliding window counter.
//!
//! The window is cut into `buckets` sub-windows (default [`DEFAULT_BUCKETS`]), aligned to the
//! clock's epoch, and each key counts the units spent in each. The units spent in the last
//! window are estimated as the sum of the buckets wholly inside it plus the oldest bucket weighted
//! by the share of it still inside the window (rounded up), and a request is admitted when that
//! estimate plus its cost stays within the limit. Any span of `window − window/buckets` admits at
//! most `limit` units; a full window-long span can exceed it only by what the oldest bucket held,
//! and only if its requests came at the bucket's end, so more buckets mean a tighter bound.
//! **Limit**: units per window. **Burst**: none. **Remaining**: limit minus the estimate.
//! **Reset**: the time until the newest non-empty bucket has slid out of the window. **Retry
//! after**: the exact time at which the estimate will have fallen enough for this request; a
//! request whose cost exceeds the limit is never admitted.
//! Memory per key: one 32-bit counter per bucket, plus one, and the index of the newest bucket.

use super::{Algorithm, LuaParams, Options, Kernel, Verdict, check_exact};
use crate::error::ConfigError;
use crate::quota::Quota;

/// Sub-window buckets per window when none is configured.
pub(crate) const DEFAULT_BUCKETS: u32 = 10;
/// The most buckets a window may be cut into.
pub(crate) const MAX_BUCKETS: u32 = 1_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlidingWindow {
    limit: u64,
    /// Number of buckets wholly inside a window.
    buckets: u64,
    /// Length of one bucket in microseconds.
    bucket: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlidingWindowState {
    /// The absolute index of the newest bucket written (its first two words, low word
    /// first), then the counters for buckets `head − buckets ..= head`, indexed by
    /// `index % (buckets + 1)`: one allocation, so that the state is 16 bytes wide, as the
    /// other algorithms' are (the memory store keeps one per key, in an entry that then takes
    /// a 48-byte allocation instead of a 64-byte one).
    words: Box<[u32]>,
}

impl SlidingWindowState {
    /// A state of `cells` empty counters whose newest bucket is `head`.
    fn new(head: u64, cells: u64) -> Self {
        let mut state = SlidingWindowState {
            words: vec![0; cells as usize + 2].into_boxed_slice(),
        };
        state.set_head(head);
        state
    }

    /// The absolute index of the newest bucket written.
    fn head(&self) -> u64 {
        u64::from(self.words[0]) | u64::from(self.words[1]) << 32
    }

    fn set_head(&mut self, head: u64) {
        self.words[0] = head as u32;
        self.words[1] = (head >> 32) as u32;
    }

    fn counts(&self) -> &[u32] {
        &self.words[2..]
    }

    fn counts_mut(&mut self) -> &mut [u32] {
        &mut self.words[2..]
    }
}

impl SlidingWindow {
    /// Its number of buckets.
    pub(crate) fn buckets(&self) -> u32 {
        self.buckets as u32
    }

    pub(crate) fn new(quota: Quota, buckets: Option<u32>) -> Result<Self, ConfigError> {
        let n = buckets.unwrap_or(DEFAULT_BUCKETS);
        if n == 0 || n > MAX_BUCKETS {
            return Err(ConfigError::new(format!(
                "sliding_window buckets must be between 1 and {MAX_BUCKETS} (got {n})"
            )));
        }
        let window = quota.window_us();
        if !window.is_multiple_of(n as u64) {
            return Err(ConfigError::new(format!(
                "sliding_window: a window of {window}us cannot be cut into {n} equal buckets of whole microseconds"
            )));
        }
        let bucket = window / n as u64;
        let limit = quota.limit() as u64;
        check_exact(
            limit as u128 * bucket as u128,
            Algorithm::SlidingWindow,
            "limit × bucket length",
        )?;
        Ok(SlidingWindow {
            limit,
            buckets: n as u64,
            bucket,
        })
    }

    fn cells(&self) -> u64 {
        self.buckets + 1
    }

    /// The current bucket index and offset into it; never before the state's head.
    fn position(&self, state: Option<&SlidingWindowState>, now: u64) -> (u64, u64) {
        let c = now / self.bucket;
        match state {
            Some(s) if s.head() > c => (s.head(), 0),
            _ => (c, now % self.bucket),
        }
    }

    fn count(&self, state: Option<&SlidingWindowState>, index: u64) -> u64 {
        match state {
            Some(s) if index <= s.head() && index + self.buckets >= s.head() => {
                s.counts()[(index % self.cells()) as usize] as u64
            }
            _ => 0,
        }
    }

    /// The estimate at bucket `c`, offset `x`: whole buckets plus the weighted oldest one.
    fn estimate(&self, state: Option<&SlidingWindowState>, c: u64, x: u64) -> u64 {
        let whole: u64 = ((c + 1).saturating_sub(self.buckets)..=c)
            .map(|i| self.count(state, i))
            .sum();
        let oldest = c
            .checked_sub(self.buckets)
            .map_or(0, |i| self.count(state, i));
        whole + (oldest * (self.bucket - x)).div_ceil(self.bucket)
    }

    /// Time until the newest non-empty bucket stops counting.
    fn reset(&self, state: Option<&SlidingWindowState>, c: u64, x: u64) -> u64 {
        let now = c * self.bucket + x;
        (c.saturating_sub(self.buckets)..=c)
            .rev()
            .find(|&i| self.count(state, i) > 0)
            .map_or(0, |j| (j + self.buckets + 1) * self.bucket - now)
    }
}

impl Kernel for SlidingWindow {
    type State = SlidingWindowState;
    #[cfg(test)]
    const GUARANTEE: super::Guarantee = super::Guarantee::WindowLessABucket;

    fn compile(quota: Quota, options: Options) -> Result<Self, ConfigError> {
        Self::new(quota, options.buckets)
    }


    fn window_us(&self) -> u64 {
        self.buckets * self.bucket
    }

    fn reported_limit(&self) -> u64 {
        self.limit
    }

    fn lua_params(&self) -> LuaParams {
        smallvec::smallvec![self.limit, self.buckets, self.bucket]
    }

    fn own_time(&self, state: &SlidingWindowState) -> u64 {
        state.head() * self.bucket
    }

    /// Each old bucket moves, with its count, to the new bucket that holds its last
    /// microsecond (the present's bucket for the bucket the present is in, so that nothing
    /// moves ahead of the present; the oldest bucket the new ring holds for one older than
    /// that), and is kept if the new window counts it there: the units used stay used, and
    /// leave the window no sooner than they would have. With the window unchanged, 5 used of
    /// 10 are 5 used of 20. (As the sliding log's entries, a longer window counts the buckets
    /// the store still holds.)
    fn convert(&self, from: &Self, state: &mut Option<SlidingWindowState>, now: u64, _: u64) -> u64 {
        let Some(old) = state.take() else {
            return now;
        };
        let present = now / self.bucket;
        let mut moved: Vec<(u64, u64)> = Vec::new();
        for i in old.head().saturating_sub(from.buckets)..=old.head() {
            let count = from.count(Some(&old), i);
            let first = i * from.bucket / self.bucket;
            let last = ((i + 1) * from.bucket - 1) / self.bucket;
            let j = last.min(first.max(present));
            // Kept while the new window counts it (a round trip through a shorter window
            // keeps what the longer one counts).
            if count > 0 && (j + self.buckets + 1) * self.bucket > now {
                moved.push((j, count));
            }
        }
        let Some(head) = moved.iter().map(|&(j, _)| j).max() else {
            return now;
        };
        let cells = self.cells();
        let mut new = SlidingWindowState::new(head, cells);
        for (j, count) in moved {
            // A bucket older than the new ring holds goes to its oldest: later, never lost.
            let j = j.max(head.saturating_sub(self.buckets));
            let c = &mut new.counts_mut()[(j % cells) as usize];
            *c = c.saturating_add(u32::try_from(count).unwrap_or(u32::MAX));
        }
        *state = Some(new);
        (head + self.buckets + 1) * self.bucket
    }

    fn evaluate(&self, state: Option<&SlidingWindowState>, now: u64, cost: u64) -> Verdict {
        let (c, x) = self.position(state, now);
        let used = self.estimate(state, c, x);
        let remaining = self.limit.saturating_sub(used);
        let reset_now = self.reset(state, c, x);
        if cost > self.limit {
            return Verdict::deny(remaining, reset_now, None);
        }
        if used + cost <= self.limit {
            let reset = if cost > 0 {
                (self.buckets + 1) * self.bucket - x
            } else {
                reset_now
            };
            return Verdict::allow(remaining - cost, reset);
        }
        // Find the first instant at which the estimate leaves room for `cost`.
        let now_abs = c * self.bucket + x;
        for k in 0..=self.buckets + 1 {
            let p = c + k;
            let whole: u64 = ((p + 1).saturating_sub(self.buckets)..=p)
                .map(|i| if i <= c { self.count(state, i) } else { 0 })
                .sum();
            let Some(avail) = self.limit.checked_sub(cost + whole) else {
                continue;
            };
            let oldest = match p.checked_sub(self.buckets) {
                Some(i) if i <= c => self.count(state, i),
                _ => 0,
            };
            let x0 = if k == 0 { x } else { 0 };
            let xmin = match (avail * self.bucket).checked_div(oldest) {
                None => x0,
                Some(share) => x0.max(self.bucket.saturating_sub(share)),
            };
            if xmin < self.bucket {
                let retry = p * self.bucket + xmin - now_abs;
                return Verdict::deny(remaining, reset_now, Some(retry));
            }
        }
        unreachable!("an empty window always admits a request within the limit")
    }

    /// Gives back up to `units` from the newest buckets first.
    fn refund(&self, state: &mut Option<SlidingWindowState>, now: u64, units: u64) -> Option<u64> {
        let (c, _) = self.position(state.as_ref(), now);
        let cells = self.cells();
        let st = state.as_mut()?;
        let mut left = units;
        let oldest = c
            .saturating_sub(self.buckets)
            .max(st.head().saturating_sub(self.buckets));
        let mut i = st.head().min(c);
        while left > 0 && i >= oldest {
            let count = &mut st.counts_mut()[(i % cells) as usize];
            let take = left.min(*count as u64);
            *count -= take as u32;
            left -= take;
            if i == 0 {
                break;
            }
            i -= 1;
        }
        Some((st.head() + self.buckets + 1) * self.bucket)
    }

    /// A lease ends with the bucket its units are counted in.
    fn lease_end(&self, state: Option<&SlidingWindowState>, now: u64, ttl: u64) -> u64 {
        let (c, _) = self.position(state, now);
        (now.max(c * self.bucket) + ttl).min((c + 1) * self.bucket - 1)
    }

    /// Gives back to the lease's bucket, while the state still counts it.
    fn give_back(
        &self,
        state: &mut Option<SlidingWindowState>,
        _now: u64,
        end: u64,
        units: u64,
    ) -> Option<u64> {
        let st = state.as_mut()?;
        let b = end / self.bucket;
        if b > st.head() || b + self.buckets < st.head() {
            return None;
        }
        let count = &mut st.counts_mut()[(b % self.cells()) as usize];
        *count -= units.min(*count as u64) as u32;
        Some((st.head() + self.buckets + 1) * self.bucket)
    }

    fn commit(&self, state: &mut Option<SlidingWindowState>, now: u64, cost: u64) -> u64 {
        let (c, _) = self.position(state.as_ref(), now);
        if cost > 0 {
            let cells = self.cells();
            let st = state.get_or_insert_with(|| SlidingWindowState::new(c, cells));
            if c > st.head() {
                let stale = (c - st.head()).min(cells);
                for i in 0..stale {
                    st.counts_mut()[((c - i) % cells) as usize] = 0;
                }
                st.set_head(c);
            }
            let count = &mut st.counts_mut()[(c % cells) as usize];
            *count = count.saturating_add(cost.min(u64::from(u32::MAX)) as u32);
        }
        match state {
            Some(s) => (s.head() + self.buckets + 1) * self.bucket,
            None => now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Compiled, TableRow, run_table};
    use std::time::Duration;

    #[test]
    fn table() {
        // 4 per 1000us in 2 buckets of 500us.
        let a = SlidingWindow::new(Quota::new(4, Duration::from_micros(1000)).unwrap(), Some(2))
            .unwrap();
        let cases: &[TableRow] = &[
            // bucket 20 (10_000..10_500)
            (10_000, 2, true, 2, 1500, None),
            (10_400, 2, true, 0, 1100, None),
            (10_499, 1, false, 0, 1001, Some(626)),
            // bucket 21: estimate = 4 (bucket 20 whole).
            (10_600, 1, false, 0, 900, Some(525)),
            // bucket 22: bucket 20 is the oldest, weighted (500 - x)/500.
            // at x = 250: ceil(4 * 250 / 500) = 2, so 2 left.
            (11_250, 2, true, 0, 1250, None),
            // at 11_300: oldest 20 → ceil(4*200/500) = 2, bucket 22 = 2 → 4. Need 1: when
            // ceil(4*(500-x)/500) <= 1 → x >= 375 → t = 11_375.
            (11_300, 1, false, 0, 1200, Some(75)),
            (11_375, 1, true, 0, 1125, None),
            (11_375, 5, false, 0, 1125, None),
        ];
        run_table(&Compiled::SlidingWindow(a), cases);
    }

    #[test]
    fn window_must_split_evenly() {
        let q = Quota::new(4, Duration::from_micros(1001)).unwrap();
        assert!(SlidingWindow::new(q, Some(2)).is_err());
        assert!(SlidingWindow::new(q, Some(0)).is_err());
        assert!(SlidingWindow::new(q, Some(7)).is_ok());
    }
}
