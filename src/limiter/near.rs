//! A step after the decision: the warnings of keys near their limit
//! ([`Policy::near_limit`](crate::Policy::near_limit), `near.rs`).

use super::Limiter;
use crate::decision::Decision;
use crate::near::NearLimit;
use crate::store::{Check, Store};

impl<St: Store> Limiter<St> {
    /// Warns of each key of an admitted `decision` that has used its policy's share of its
    /// limit, once per key and window: counted, traced, listed beside the top limited keys,
    /// and handed to the hook.
    pub(super) fn warn_near(&self, decision: &Decision, keys: Option<&[Check]>) {
        let Some(keys) = keys else {
            return;
        };
        let mut now = None;
        for o in decision.outcomes() {
            let tier = o.tier();
            if !o.is_allowed() || !tier.is_near(o.remaining(), o.limit()) {
                continue;
            }
            let Some(key) = Check::key_of(keys, tier.id()) else {
                continue;
            };
            let now = *now.get_or_insert_with(|| self.clock.now_micros());
            let until = now.saturating_add(o.reset_after().as_micros().max(1) as u64);
            if !self.near.first(tier.id(), key, now, until) {
                continue;
            }
            metrics::counter!("ratelimit_near_limit_total", "policy" => tier.label()).increment(1);
            tracing::info!(
                policy = o.policy(),
                key = ?key,
                remaining = o.remaining(),
                limit = o.limit(),
                "rate-limit key near its limit"
            );
            if let Some(top) = &self.top {
                top.record_near(o.policy(), key, now);
            }
            self.near.hand(
                || tier.label(),
                || NearLimit {
                    policy: o.policy().to_owned(),
                    key: key.clone(),
                    limit: o.limit(),
                    remaining: o.remaining(),
                    reset_after: o.reset_after(),
                },
            );
        }
    }
}
