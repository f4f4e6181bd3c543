//! The engine's policy set: checked, registered in the store (and the local fallback) all or
//! none, compiled (at build, and by a reload: `control/reload.rs`).

use std::sync::Arc;

use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::policy::{CompiledPolicy, CostFn, Policy};
use crate::reload::TierSummary;
use crate::store::private::Sealed as _;
use crate::store::{MemoryStore, Store};

/// Policies checked and compiled, with their tiers registered.
pub(super) struct CompiledSet {
    pub(super) policies: Box<[CompiledPolicy]>,
    /// What each tier is, by name, for a reload's report.
    pub(super) summary: Vec<TierSummary>,
    pub(super) leases: bool,
}

/// Checks `policies`, registers their tiers in `store` (and `fallback`) all or none, the names
/// `replacing` accepts taking new definitions, and compiles them.
pub(super) fn compile<St: Store>(
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
