//! The engine's policy set: checked, registered in the store (and the local fallback) all or
//! none, compiled; and replaced whole by a reload, keeping every key's usage.

use std::sync::Arc;

use super::Limiter;
use super::route::Route;
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::lease::Leases;
use crate::lists::LayerLists;
use crate::policy::{CompiledPolicy, CostFn, Policy};
use crate::reload::{ReloadReport, TierSummary};
use crate::store::private::Sealed as _;
use crate::store::{MemoryStore, Store, lock};

/// Policies checked and compiled, with their tiers registered.
pub(super) struct CompiledSet {
    pub(super) policies: Box<[CompiledPolicy]>,
    /// What each tier is, by name, for a reload's report.
    pub(super) summary: Vec<TierSummary>,
    pub(super) leases: bool,
}

impl<St: Store> Limiter<St> {
    /// Checks `policies`, registers their tiers in `store` (and `fallback`) all or none, the names
    /// `replacing` accepts taking new definitions, and compiles them.
    pub(super) fn compile(
        policies: &[Policy],
        store: &St,
        fallback: Option<&MemoryStore>,
        divisor: Option<u32>,
        key: &Arc<dyn KeyExtractor>,
        cost: &Option<CostFn>,
        replacing: &dyn Fn(&str) -> bool,
    ) -> Result<CompiledSet, ConfigError> {
        if policies.is_empty() {
            return Err(ConfigError::new(
                "no policy: add one with .policy(Policy::gcra(\"10/s\")) or similar",
            ));
        }
        // Check everything before registering anything in the (maybe shared) store.
        let mut prepared = Vec::with_capacity(policies.len());
        let mut names: Vec<Arc<str>> = Vec::new();
        for policy in policies {
            let p = policy.prepare(divisor)?;
            for name in p.names() {
                if names.contains(name) {
                    return Err(ConfigError::new(format!(
                        "two policies are named {name:?}; give each its own name"
                    )));
                }
                names.push(name.clone());
            }
            prepared.push(p);
        }
        let tiers: Vec<_> = prepared.iter().flat_map(|p| p.tiers()).collect();
        let summary = prepared.iter().flat_map(|p| p.summary()).collect();
        let mut in_store = store.register(&tiers, replacing)?.into_iter();
        let mut in_fallback = match fallback {
            Some(local) => {
                let tiers: Vec<_> = prepared.iter().flat_map(|p| p.fallback_tiers()).collect();
                local.register(&tiers, replacing)?
            }
            None => Vec::new(),
        }
        .into_iter();
        let compiled = prepared
            .into_iter()
            .map(|p| p.build(key, cost, &mut in_store, &mut in_fallback))
            .collect();
        Ok(CompiledSet {
            policies: compiled,
            summary,
            leases: policies.iter().any(Policy::takes_leases),
        })
    }

    /// Replaces every policy with `policies`, at once for every request planned after it: see
    /// [`RateLimitLayer::reload`](crate::RateLimitLayer::reload). Fails, changing nothing, on
    /// any error a build would report, and when a policy would change its algorithm.
    pub(crate) fn reload(&self, policies: &[Policy]) -> Result<ReloadReport, ConfigError> {
        let mut summary = lock(&self.summary);
        let old = self.policies.load();
        let owned = |name: &str| summary.iter().any(|t| t.name() == name);
        super::bodies::check_bodies(policies, &self.key, self.bodies)?;
        let set = Self::compile(
            policies,
            &self.store,
            self.fallback.as_ref(),
            self.failure.divisor(),
            &self.key,
            &self.cost,
            &owned,
        )?;
        let in_store = self.lists.as_ref().is_some_and(LayerLists::in_store);
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
        if let Some(leases) = self.leases() {
            leases.forget_tiers(&stale);
        }
        if set.leases {
            self.leases.get_or_init(Leases::new);
        }
        if let Some(top) = &self.top {
            top.set_policies(set.policies.iter().map(|p| p.name()));
        }
        let route = Route::compile(set.policies, policies, self.around());
        self.policies.replace(route);
        *summary = set.summary;
        Ok(report)
    }
}
