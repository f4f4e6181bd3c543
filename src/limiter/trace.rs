//! Store failures, logged at `warn` at most once a second.

use std::sync::atomic::Ordering;

use super::Limiter;
use crate::error::StoreError;

impl<St> Limiter<St> {
    /// Logs a decision the store failed: at `warn` at most once a second (with how many
    /// failed since), else at `debug`, so that an outage does not log every request.
    pub(super) fn store_failed(&self, error: &StoreError, then: &str) {
        let now = self.clock.now_micros();
        let last = self.warned.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= 1_000_000;
        if due
            && self
                .warned
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let since = self.unwarned.swap(0, Ordering::Relaxed);
            tracing::warn!(%error, more_since_last = since, "rate-limit store failed; {then}");
        } else {
            self.unwarned.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%error, "rate-limit store failed; {then}");
        }
    }
}
