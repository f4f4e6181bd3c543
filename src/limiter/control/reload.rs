//! A reload: every policy replaced at once, keeping every key's usage.

use super::super::policies::compile;
use super::super::route::Route;
use super::Control;
use crate::error::ConfigError;
use crate::lease::Leases;
use crate::lists::LayerLists;
use crate::policy::Policy;
use crate::reload::ReloadReport;
use crate::store::{Store, lock};

impl<St: Store> Control<St> {
    /// Replaces every policy with `policies`, at once for every request planned after it: see
    /// [`RateLimitControl::reload`](crate::RateLimitControl::reload). Fails, changing nothing, on
    /// any error a build would report, and when a policy would change its algorithm.
    pub(crate) fn reload(&self, policies: &[Policy]) -> Result<ReloadReport, ConfigError> {
        let mut summary = lock(&self.summary);
        let old = self.engine.policies.load();
        let owned = |name: &str| summary.iter().any(|t| t.name() == name);
        super::super::bodies::check_bodies(policies, &self.engine.key, self.engine.bodies)?;
        let set = compile(
            policies,
            &self.engine.store,
            self.engine.fallback.as_ref(),
            self.engine.failure.divisor(),
            &self.engine.key,
            &self.cost,
            &owned,
        )?;
        let in_store = self.engine.lists.as_ref().is_some_and(LayerLists::in_store);
        crate::lists::leases_with_lists::<St>(set.leases, in_store)?;
        let report = ReloadReport::between(&summary, &set.summary);
        // The leases this instance holds of a tier whose definition changed, or that is gone,
        // are forgotten (the units stay counted in the store, as spent, until the leases end).
        // The deny cache forgets a denial made under another definition when it finds it.
        let stale: Vec<u32> = old
            .iter()
            .flat_map(|p| p.tiers())
            .filter(|tier| !report.kept(tier.name()))
            .map(|tier| tier.id())
            .collect();
        if let Some(leases) = self.engine.leases() {
            leases.forget_tiers(&stale);
        }
        if set.leases {
            self.engine.leases.get_or_init(Leases::new);
        }
        if let Some(top) = &self.engine.top {
            top.set_policies(set.policies.iter().map(|p| p.name()));
        }
        let route = Route::compile(set.policies, policies, self.engine.around());
        self.engine.policies.replace(route);
        *summary = set.summary;
        Ok(report)
    }
}
