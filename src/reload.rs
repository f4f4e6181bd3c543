//! What a reload changed: [`ReloadReport`].

use std::fmt;
use std::sync::Arc;

use crate::algorithm::Compiled;

/// One policy tier as a reload compares it: its name, its definition, and a few words saying
/// what it is.
#[derive(Clone, Debug)]
pub(crate) struct TierSummary {
    name: Arc<str>,
    algorithm: Compiled,
    about: String,
}

impl TierSummary {
    pub(crate) fn new(name: Arc<str>, algorithm: Compiled, about: String) -> Self {
        TierSummary {
            name,
            algorithm,
            about,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// What [`RateLimitControl::reload`](crate::RateLimitControl::reload) changed, policy tier by
/// policy tier (a policy's own quota is the tier named after the policy; a named tier is
/// `POLICY:TIER`). Its `Display` is one line for a log.
///
/// Only what a store counts is compared: the algorithm and its quota, burst and buckets. A
/// reload that changes nothing else of a policy (its routes, its key, its cost) reports it
/// unchanged, and applies the change all the same.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadReport {
    /// Tiers that were not there before, with what each is (e.g. `gcra 10/s`).
    pub added: Vec<(String, String)>,
    /// Tiers whose quota changed: name, before, after. Their keys keep their usage.
    pub changed: Vec<(String, String, String)>,
    /// Tiers that are gone, with what each was. Their keys are no longer read, and expire in
    /// the store on their own.
    pub removed: Vec<(String, String)>,
    /// How many tiers stayed as they were.
    pub unchanged: usize,
}

impl ReloadReport {
    /// The report of a change from `old` to `new`.
    pub(crate) fn between(old: &[TierSummary], new: &[TierSummary]) -> Self {
        let mut report = ReloadReport::default();
        for n in new {
            match old.iter().find(|o| o.name == n.name) {
                None => report.added.push((n.name.to_string(), n.about.clone())),
                Some(o) if o.algorithm == n.algorithm => report.unchanged += 1,
                Some(o) => {
                    report
                        .changed
                        .push((n.name.to_string(), o.about.clone(), n.about.clone()))
                }
            }
        }
        for o in old {
            if !new.iter().any(|n| n.name == o.name) {
                report.removed.push((o.name.to_string(), o.about.clone()));
            }
        }
        report
    }

    /// Whether the tier named `name` stayed as it was.
    pub(crate) fn kept(&self, name: &str) -> bool {
        !self.changed.iter().any(|(n, _, _)| n == name)
            && !self.removed.iter().any(|(n, _)| n == name)
    }

    /// Whether nothing a store counts changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

impl fmt::Display for ReloadReport {
    /// E.g. `changed "api": gcra 10/s -> gcra 20/s; added "search" (sliding_log 5/s); 1 unchanged`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (name, before, after) in &self.changed {
            parts.push(format!("changed {name:?}: {before} -> {after}"));
        }
        for (name, about) in &self.added {
            parts.push(format!("added {name:?} ({about})"));
        }
        for (name, about) in &self.removed {
            parts.push(format!("removed {name:?} ({about})"));
        }
        parts.push(format!("{} unchanged", self.unchanged));
        f.write_str(&parts.join("; "))
    }
}
