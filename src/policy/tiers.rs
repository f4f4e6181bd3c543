//! A policy's tiers: the same algorithm with other quotas, each with its own state, chosen per
//! request or per key.

use std::sync::Arc;

use super::builder::Policy;
use crate::error::ConfigError;
use crate::key::{Key, RequestRef};
use crate::quota::Quota;

impl Policy {
    /// Adds a tier: the same algorithm with another quota, chosen per request by
    /// [`select_tier`](Self::select_tier) or per key by [`tier_for_key`](Self::tier_for_key).
    /// Each tier keeps its own state, named `POLICY:TIER`.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, key::Key};
    ///
    /// #[derive(Clone)]
    /// enum Plan { Free, Pro }
    ///
    /// // Free users 100 per hour, pro users 10,000; the plan comes from an auth layer.
    /// let plans = Policy::gcra("100/h")
    ///     .name("plan")
    ///     .tier("pro", "10000/h")
    ///     .select_tier(|req| match req.extensions().get::<Plan>() {
    ///         Some(Plan::Pro) => Some("pro".to_owned()),
    ///         _ => None, // the policy's own quota
    ///     })
    ///     .tier_for_key(Key::from("partner-42"), "pro");
    /// # let _ = plans;
    /// ```
    #[must_use]
    pub fn tier<Q>(mut self, name: impl Into<String>, quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        self.tiers
            .push((name.into(), quota.try_into().map_err(Into::into)));
        self
    }

    /// Chooses a tier per request; `None`, or a name that is not a tier, means the policy's
    /// own quota.
    #[must_use]
    pub fn select_tier<F>(mut self, select: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> Option<String> + Send + Sync + 'static,
    {
        self.tier_of = Some(Arc::new(select));
        self
    }

    /// Puts one key in a tier, whatever [`select_tier`](Self::select_tier) says.
    #[must_use]
    pub fn tier_for_key(mut self, key: impl Into<Key>, tier: impl Into<String>) -> Self {
        self.tier_overrides.push((key.into(), tier.into()));
        self
    }
}
