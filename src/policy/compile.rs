//! A [`Policy`] checked and compiled: its tiers named, their algorithms precomputed, how they
//! take part in a decision ([`Part`]), ready to register in a store and to build into a
//! [`CompiledPolicy`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::builder::{CostFn, Policy};
use super::compiled::{CompiledPolicy, Striped};
use super::tier::{LeaseSpec, Part, Registered, Tier};
use crate::adaptive::AdaptiveLimits;
use crate::algorithm::{Algorithm, Compiled};
use crate::calendar::{Calendar, Period, Periods};
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::quota::{Quota, QuotaUnit};
use crate::reload::TierSummary;
use crate::store::Op;

impl Policy {
    /// Whether the policy is a GCRA enforced up front, nothing given back after the
    /// response: on the memory store, a request of it alone is one compare-and-swap.
    pub(crate) fn is_gcra_up_front(&self) -> bool {
        self.algorithm == Algorithm::Gcra && self.up_front()
    }

    /// Whether the policy's state packs in the memory store's rows (a GCRA, or a fixed window
    /// of one length) and it is enforced up front on the layer's key: several of them are
    /// decided together under the shard's shared lock.
    pub(crate) fn packs_up_front(&self) -> bool {
        let packs = match self.algorithm {
            Algorithm::Gcra => true,
            Algorithm::FixedWindow => self.calendar.is_none(),
            _ => false,
        };
        packs && self.up_front() && self.key.is_none()
    }

    /// Decided and charged when the request comes in (enforced, no lease, no reserve),
    /// nothing given back after the response. What runs around the decision (the steps of
    /// its route) is the route's to say.
    fn up_front(&self) -> bool {
        matches!(self.takes, Ok(Op::Enforce))
            && self.lease.is_none()
            && self.reserve.is_none()
            && self.refund_if.is_none()
            && self.settle.is_none()
    }

    /// Whether the policy limits requests in flight.
    pub(crate) fn limits_in_flight(&self) -> bool {
        matches!(self.takes, Ok(Op::Concurrency))
    }

    /// Whether the policy is an adaptive concurrency limit.
    pub(crate) fn adapts(&self) -> bool {
        self.adaptive.is_some()
    }

    /// Whether requests may wait for a booked time.
    pub(crate) fn waits(&self) -> bool {
        matches!(self.takes, Ok(Op::Wait { .. }))
    }

    /// Whether the policy takes leases.
    pub(crate) fn takes_leases(&self) -> bool {
        self.lease.is_some()
    }

    /// How a tier of the policy with `quota` and `compiled` takes part in a decision, checked.
    fn part(&self, quota: &Quota, compiled: &Compiled) -> Result<Part, ConfigError> {
        let op = self.takes.clone()?;
        let lease = match self.lease {
            Some((units, ttl)) => Some(lease(units, ttl, quota, compiled)?),
            None => None,
        };
        Ok(Part::new(op)
            .charged_if(self.charge_if.clone())
            .leasing(lease))
    }

    /// What a policy limiting requests in flight cannot have, checked; a rate policy cannot
    /// count requests in flight.
    fn check_unit(&self) -> Result<(), ConfigError> {
        if !self.limits_in_flight() {
            if self.unit == QuotaUnit::ConcurrentRequests {
                return Err(ConfigError::new(
                    "a rate policy counts requests over time, not requests in flight; \
                     use another unit than QuotaUnit::ConcurrentRequests",
                ));
            }
            return Ok(());
        }
        let conflict = if self.refund_if.is_some() {
            Some("refund_if")
        } else if !self.tiers.is_empty() {
            Some("tiers")
        } else if self.burst.is_some() {
            Some("a burst")
        } else if self.unit != QuotaUnit::ConcurrentRequests {
            Some("another unit than concurrent requests")
        } else {
            None
        };
        match conflict {
            Some(what) => Err(ConfigError::new(format!(
                "a concurrency policy counts requests in flight; it takes no {what}"
            ))),
            None => Ok(()),
        }
    }

    /// What a policy that settles its cost after the response cannot have, checked: it is
    /// enforced, and the real cost is what it gives back.
    fn check_settle(&self) -> Result<(), ConfigError> {
        let Some(settle) = &self.settle else {
            return Ok(());
        };
        settle.validate()?;
        if self.refund_if.is_some() {
            return Err(ConfigError::new(
                "a policy that settles its cost gives back what a response did not use; \
                 it takes no refund_if",
            ));
        }
        match &self.takes {
            Ok(Op::Enforce) if self.lease.is_none() => Ok(()),
            Err(_) => Ok(()),
            Ok(op) => Err(ConfigError::new(format!(
                "a policy that settles its cost after the response is enforced, and this one {}",
                self.what(*op)
            ))),
        }
    }

    /// The same policy with every limit and burst divided by `divisor` (never below 1), for
    /// the local fallback of [`FailurePolicy::Local`](crate::FailurePolicy::Local), which
    /// takes no leases.
    fn divided(&self, divisor: u32) -> Policy {
        let d = divisor.max(1);
        let divide = |q: &Result<Quota, ConfigError>| q.clone().and_then(|q| Ok(q.divided(d)?));
        let mut p = self.clone();
        p.lease = None;
        p.quota = divide(&self.quota);
        p.burst = self.burst.map(|b| (b / d).max(1));
        p.tiers = self
            .tiers
            .iter()
            .map(|(name, q)| (name.clone(), divide(q)))
            .collect();
        p
    }

    /// Validates everything and precomputes the algorithm's constants, registering nothing:
    /// the policy's own quota first, then one entry per tier; and the same, divided by
    /// `fallback_divisor`, for the local fallback store.
    pub(crate) fn prepare(
        &self,
        fallback_divisor: Option<u32>,
    ) -> Result<Prepared<'_>, ConfigError> {
        let fallback = match fallback_divisor {
            Some(divisor) => Some(self.divided(divisor).tiers_compiled()?),
            None => None,
        };
        Ok(Prepared {
            policy: self,
            tiers: self.tiers_compiled()?,
            fallback,
        })
    }

    /// The policy, for people: `policy "name"`, or `gcra policy` when it has no name.
    pub(crate) fn described(&self) -> String {
        match &self.name {
            Some(n) => format!("policy {n:?}"),
            None => format!("{} policy", self.algorithm),
        }
    }

    /// Whether its key (its own, else the layer's `key`) or its cost reads the request body.
    pub(crate) fn reads_body(&self, key: &Arc<dyn KeyExtractor>) -> bool {
        self.body_cost.is_some() || self.key.as_ref().unwrap_or(key).reads_body()
    }

    /// The policy's own quota and each tier, named and compiled.
    fn tiers_compiled(&self) -> Result<Vec<CompiledTier>, ConfigError> {
        let described = self.described();
        let context = |e: ConfigError| e.context(&described);
        self.takes.as_ref().map_err(|e| context(e.clone()))?;
        self.check_unit().map_err(context)?;
        self.check_settle().map_err(context)?;
        self.check_reserve().map_err(context)?;
        self.check_adaptive().map_err(context)?;
        self.check_near().map_err(context)?;
        self.check_escalation().map_err(context)?;
        if let Some(Err(e)) = &self.body_cost {
            return Err(context(e.clone()));
        }
        if !self.tiers.is_empty() && self.name.is_none() {
            return Err(context(ConfigError::new(
                "a policy with tiers needs a name",
            )));
        }
        let quota = self.quota.clone().map_err(context)?;
        let base = match &self.name {
            Some(n) => {
                validate_name(n).map_err(context)?;
                n.clone()
            }
            None => self.default_name(&quota),
        };
        let mut out = vec![self.tier_compiled(Arc::from(base.as_str()), quota, &described)?];
        for (tier, quota) in &self.tiers {
            let described = format!("{described}, tier {tier:?}");
            let name = format!("{base}:{tier}");
            validate_name(&name).map_err(|e| e.context(&described))?;
            if out.iter().any(|t| *t.name == *name) {
                return Err(ConfigError::new("two tiers share a name").context(&described));
            }
            let quota = quota.clone().map_err(|e| e.context(&described))?;
            out.push(self.tier_compiled(Arc::from(name), quota, &described)?);
        }
        for (_, tier) in &self.tier_overrides {
            if !self.tiers.iter().any(|(t, _)| t == tier) {
                return Err(context(ConfigError::new(format!(
                    "tier_for_key names the tier {tier:?}, which was not added with .tier()"
                ))));
            }
        }
        Ok(out)
    }

    /// The name of a policy without one: what it is, with the parameters that change it, so
    /// that two different policies never share one by accident.
    fn default_name(&self, quota: &Quota) -> String {
        if self.adaptive.is_some() {
            return "adaptive_concurrency".to_owned();
        }
        if self.limits_in_flight() {
            return format!("concurrency:{}", quota.limit());
        }
        let mut name = format!("{}:{quota}", self.algorithm);
        if let Some(burst) = self.burst {
            name.push_str(&format!(":burst{burst}"));
        }
        if let Some(buckets) = self.options.buckets {
            name.push_str(&format!(":buckets{buckets}"));
        }
        if let Some(calendar) = &self.calendar {
            name.push_str(&calendar.describe(":"));
        }
        name
    }

    /// One tier of the policy, with `quota`, compiled under `name`.
    fn tier_compiled(
        &self,
        name: Arc<str>,
        quota: Quota,
        described: &str,
    ) -> Result<CompiledTier, ConfigError> {
        let algorithm = self.compile_quota(quota, described)?;
        if let Some(reserve) = &self.reserve {
            (reserve.check_capacity(algorithm.reported_limit()))
                .map_err(|e| e.context(described))?;
        }
        let part = self
            .part(&quota, &algorithm)
            .map_err(|e| e.context(described))?;
        Ok(CompiledTier {
            name,
            algorithm,
            part,
            about: self.about(&quota),
        })
    }

    /// What a tier of the policy with `quota` is, in a few words (e.g. `gcra 10/s burst 20`),
    /// for the report of a reload.
    fn about(&self, quota: &Quota) -> String {
        let mut about = match self.limits_in_flight() {
            true => format!(
                "concurrency {}, held at most {:?}",
                quota.limit(),
                Duration::from_micros(quota.window_us())
            ),
            false => format!("{} {quota}", self.algorithm),
        };
        if let Some(burst) = self.burst {
            about.push_str(&format!(" burst {burst}"));
        }
        if let Some(buckets) = self.options.buckets {
            about.push_str(&format!(" buckets {buckets}"));
        }
        if let Some(calendar) = &self.calendar {
            about.push_str(&calendar.describe(" "));
        }
        about
    }

    fn compile_quota(&self, mut quota: Quota, described: &str) -> Result<Compiled, ConfigError> {
        if let Some(burst) = self.burst {
            if !self.algorithm.has_burst() {
                return Err(ConfigError::new(format!(
                    "{} has no burst; use token_bucket, leaky_bucket or gcra for a burst different from the limit",
                    self.algorithm
                ))
                .context(described));
            }
            quota = quota
                .try_with_burst(burst)
                .map_err(|e| ConfigError::from(e).context(described))?;
        }
        let compiled =
            Compiled::new(self.algorithm, quota, self.options).map_err(|e| e.context(described))?;
        self.with_calendar(compiled, &quota)
            .map_err(|e| e.context(described))
    }

    /// `compiled` counting calendar periods when the policy has a calendar or a monthly quota
    /// (UTC then), checked: a fixed window of one day, one week or one month.
    fn with_calendar(&self, compiled: Compiled, quota: &Quota) -> Result<Compiled, ConfigError> {
        let calendar = match &self.calendar {
            Some(calendar) => calendar.clone(),
            None if quota.is_monthly() => Calendar::utc(),
            None => return Ok(compiled),
        };
        calendar.validate()?;
        let Compiled::FixedWindow(window) = compiled else {
            return Err(ConfigError::new(format!(
                "calendar periods are counted by the fixed window, not {}; use Algorithm::FixedWindow for {quota}",
                self.algorithm
            )));
        };
        let period = Period::of(quota.window_us(), quota.is_monthly()).ok_or_else(|| {
            ConfigError::new(format!(
                "a calendar period is one day, one week or one month (got {quota})"
            ))
        })?;
        Ok(Compiled::FixedWindow(
            window.with_periods(Arc::new(Periods::new(calendar, period))),
        ))
    }
}

/// The lease of `units` living at most `ttl` of a tier with `quota` and `compiled`, checked.
fn lease(
    units: u32,
    ttl: Option<Duration>,
    quota: &Quota,
    compiled: &Compiled,
) -> Result<LeaseSpec, ConfigError> {
    let capacity = compiled.reported_limit();
    if units == 0 || u64::from(units) > capacity {
        return Err(ConfigError::new(format!(
            "a lease must be between 1 unit and the policy's limit of {capacity} (got {units})"
        )));
    }
    let window = quota.window_us();
    let ttl_us = match ttl {
        Some(ttl) => {
            let us = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX);
            if us == 0 || us > window {
                return Err(ConfigError::new(format!(
                    "lease_ttl must be between 1 microsecond and the quota's window of {window}us (got {us}us)"
                )));
            }
            us
        }
        None => (window / 10).clamp(1, 1_000_000),
    };
    Ok(LeaseSpec::new(u64::from(units), ttl_us))
}

pub(crate) fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:/".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok_char) {
        return Err(ConfigError::new(
            "a policy name must be 1 to 64 characters of letters, digits and -_.:/",
        ));
    }
    Ok(())
}

/// A tier of a policy compiled: its name, algorithm, how it takes part in a decision, and
/// what it is in a few words.
struct CompiledTier {
    name: Arc<str>,
    algorithm: Compiled,
    part: Part,
    about: String,
}

/// A policy validated and precomputed, not yet registered in a store.
pub(crate) struct Prepared<'p> {
    policy: &'p Policy,
    tiers: Vec<CompiledTier>,
    fallback: Option<Vec<CompiledTier>>,
}

impl Prepared<'_> {
    /// The names of the policy's tiers, its own quota first.
    pub(crate) fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.tiers.iter().map(|t| &t.name)
    }

    /// The tiers to register in the store, by name.
    pub(crate) fn tiers(&self) -> impl Iterator<Item = (Arc<str>, Compiled)> + '_ {
        self.tiers
            .iter()
            .map(|t| (t.name.clone(), t.algorithm.clone()))
    }

    /// What each tier is, by name, for the report of a reload.
    pub(crate) fn summary(&self) -> impl Iterator<Item = TierSummary> + '_ {
        self.tiers
            .iter()
            .map(|t| TierSummary::new(t.name.clone(), t.algorithm.clone(), t.about.clone()))
    }

    /// The tiers to register in the local fallback store, by name (none without one).
    pub(crate) fn fallback_tiers(&self) -> impl Iterator<Item = (Arc<str>, Compiled)> + '_ {
        self.fallback
            .iter()
            .flatten()
            .map(|t| (t.name.clone(), t.algorithm.clone()))
    }

    /// Compiles the policy into its runtime form, its tiers registered as `store` (and
    /// `fallback`) say, in the order of [`tiers`](Self::tiers) (and of
    /// [`fallback_tiers`](Self::fallback_tiers)); `key` and `cost` are the layer's, for a
    /// policy without its own.
    pub(crate) fn build(
        self,
        key: &Arc<dyn KeyExtractor>,
        cost: &Option<CostFn>,
        store: &mut dyn Iterator<Item = Registered>,
        fallback: &mut dyn Iterator<Item = Registered>,
    ) -> CompiledPolicy {
        let p = self.policy;
        let build = |at: &mut dyn Iterator<Item = Registered>, tiers: Vec<CompiledTier>| {
            tiers
                .into_iter()
                .map(|t| {
                    let at = at.next().expect("one registration per tier");
                    Striped::new(|| {
                        Tier::new(t.name.clone(), at, t.algorithm.clone(), t.part.clone())
                            .with_unit(p.unit)
                            .warning_near(p.near_limit.unwrap_or(0))
                            .escalating(p.escalation)
                            .reserving(p.reserve.as_ref())
                    })
                })
                .collect::<Box<[_]>>()
        };
        let tiers = build(store, self.tiers);
        let fallback = self.fallback.map(|tiers| build(fallback, tiers));
        let tier_names: HashMap<String, usize> = p
            .tiers
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (t.clone(), i + 1))
            .collect();
        let tier_overrides = p
            .tier_overrides
            .iter()
            .map(|(k, t)| (k.clone().compact(), tier_names[t]))
            .collect();
        let up_front = p.up_front()
            && tiers
                .iter()
                .all(|t| t.get().part().op() == Op::Enforce && t.get().lease().is_none());
        let adaptive = (p.adaptive).map(|a| AdaptiveLimits::new(a, tiers[0].get().name()));
        CompiledPolicy {
            up_front,
            adaptive,
            tiers,
            fallback,
            tier_names,
            tier_of: p.tier_of.clone(),
            tier_overrides,
            key: p.key.clone().unwrap_or_else(|| key.clone()),
            cost: p.cost.clone().or_else(|| cost.clone()),
            body_cost: p.body_cost.clone().and_then(Result::ok),
            body_floor: u64::from(p.body_floor),
            reads_body: p.reads_body(key),
            refund_if: p.refund_if.clone(),
            settle: p.settle.clone().map(Arc::new),
            routes: p.routes.clone(),
            exempt: p.exempt.clone(),
        }
    }
}
