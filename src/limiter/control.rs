//! The administration of a layer ([`Control`]): what an operator does to the engine while it
//! serves, apart from its requests; the keys each policy denied most, a key's own limit, and
//! the make-up of the policy set (`control/reload.rs`: a reload; `control/lists.rs`: the
//! lists' runtime entries). The request path's type, [`Limiter`], holds none of it.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::Limiter;
use super::admin::Answer;
use crate::error::LimitError;
use crate::key::Key;
use crate::policy::CostFn;
use crate::quota::Quota;
use crate::reload::TierSummary;
use crate::store::{Check, Checks, Op, Store};
use crate::top::{LimitedKey, TopLimitedService, TopReport};

mod lists;
mod reload;

/// The engine, with what only its administration needs.
pub(crate) struct Control<St> {
    engine: Arc<Limiter<St>>,
    /// What each tier of the present policies is, by name; held by a reload while it runs,
    /// so that reloads run one at a time.
    summary: Mutex<Vec<TierSummary>>,
    /// The layer's cost, for the policies of a reload without their own.
    cost: Option<CostFn>,
}

impl<St> Control<St> {
    /// The administration of `engine`, whose policies' tiers are `summary`, made with `cost`.
    pub(super) fn new(
        engine: Arc<Limiter<St>>,
        summary: Vec<TierSummary>,
        cost: Option<CostFn>,
    ) -> Self {
        Control {
            engine,
            summary: Mutex::new(summary),
            cost,
        }
    }

    /// The engine it administers.
    pub(crate) fn engine(&self) -> &Arc<Limiter<St>> {
        &self.engine
    }

    /// The policies' names, in order.
    pub(crate) fn policy_names(&self) -> Vec<String> {
        let policies = self.engine.policies.load();
        policies.iter().map(|p| p.name().to_owned()).collect()
    }

    /// The shortest time a slot of its concurrency policies is held in the store, if it has
    /// any.
    pub(crate) fn slots_held_at_most(&self) -> Option<std::time::Duration> {
        let policies = self.engine.policies.load();
        let tiers = policies.iter().flat_map(|p| p.tiers());
        let held = tiers
            .filter(|t| t.limits_in_flight())
            .map(|t| t.window_us());
        held.min().map(std::time::Duration::from_micros)
    }
}

impl<St: Store> Control<St> {
    /// The `n` keys `policy` denied most (none when the layer keeps no summary).
    pub(crate) fn top_limited(&self, policy: &str, n: usize) -> Vec<LimitedKey> {
        let Some(top) = &self.engine.top else {
            return Vec::new();
        };
        top.top(policy, n, self.engine.clock.now_micros())
            .into_keys()
    }

    /// [`Limiter::top_limited`] of every policy, with how many requests each denied.
    pub(crate) fn top_limited_reports(&self, n: usize) -> Vec<TopReport> {
        match &self.engine.top {
            Some(top) => top.top_all(n, self.engine.clock.now_micros()),
            None => Vec::new(),
        }
    }

    /// The JSON admin route of the summary.
    pub(crate) fn top_limited_service(&self) -> TopLimitedService {
        TopLimitedService::new(self.engine.top.clone(), self.engine.clock.clone())
    }

    /// Puts `key` under a limit of its own in the tier named `name` (`quota`, until `until_us`
    /// on the store's clock; 0 for the longest, [`MAX_WINDOW`](crate::MAX_WINDOW) from the
    /// store's present), or back under the tier's own quota (`quota` `None`). Its leases here
    /// are forgotten, as a block forgets them.
    pub(crate) fn limit_key(
        &self,
        name: &str,
        key: &Key,
        quota: Option<Quota>,
        until_us: u64,
    ) -> Result<Answer<St::Future>, LimitError> {
        let policies = self.engine.policies.load();
        let (policy, tier) = policies
            .iter()
            .find_map(|p| p.tier_named(name).map(|t| (p, t)))
            .ok_or_else(|| LimitError::UnknownPolicy(name.to_owned()))?;
        let keys = policy.entry_keys(key).map_err(LimitError::Entry)?;
        let (tier, op) = match quota {
            Some(quota) => {
                let own = tier.relimited(quota).map_err(LimitError::Quota)?;
                (Arc::new(own), Op::Limit { until: until_us })
            }
            None => (tier.clone(), Op::Unlimit),
        };
        let mut checks = Checks::new();
        for key in keys {
            if let Some(leases) = self.engine.leases() {
                leases.forget(tier.id(), &key);
            }
            self.engine.forget_denial(tier.id(), &key);
            checks.push(Check::new(tier.clone(), key, 0, op));
        }
        drop(policies);
        Ok(self.engine.store_decision(checks))
    }

    /// The limit of the layer's tier `id` as configured (not a key's own), if it has one.
    pub(crate) fn configured_limit(&self, id: u32) -> Option<u64> {
        let policies = self.engine.policies.load();
        let mut tiers = policies.iter().flat_map(|p| p.tiers());
        tiers.find(|t| t.id() == id).map(|t| t.limit())
    }

    /// `until` in microseconds since 1970, and the layer's present: an end that is not after
    /// the present, or that microseconds cannot count exactly, is an error naming `until`.
    pub(crate) fn until_us(&self, until: SystemTime) -> Result<(u64, u64), LimitError> {
        let us = until
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .and_then(|d| u64::try_from(d.as_micros()).ok())
            .filter(|us| *us <= crate::algorithm::MAX_EXACT)
            .ok_or_else(|| {
                LimitError::Until(format!(
                    "{until:?} is not a time from 1970 to 2255 (2^53 microseconds)"
                ))
            })?;
        let now = self.engine.clock.now_micros();
        if us <= now {
            return Err(LimitError::Until(format!(
                "{until:?} is not after the present ({now} microseconds since 1970)"
            )));
        }
        Ok((us, now))
    }
}
