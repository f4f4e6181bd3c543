//! How each field of a policy as written makes the policy: the [`RawPolicy`] methods that
//! [`PolicyConfig::try_from`](super::PolicyConfig) calls in turn.

use super::RawPolicy;
use super::text::{BodyMeasure, DurationText, HeaderNameText, Text, statuses};
use crate::adaptive::Adaptive;
use crate::algorithm::Algorithm;
use crate::calendar::Calendar;
use crate::error::ConfigError;
use crate::policy::{Escalation, Policy, Reserve};
use crate::settle::Settle;

impl RawPolicy {
    /// The policy the entry's `concurrency`, `quota` and `algorithm` make (the last two taken).
    pub(super) fn base(&mut self) -> Result<Policy, ConfigError> {
        if let Some(rule) = self.adaptive.take() {
            return self.adaptive(&rule);
        }
        if self.adaptive_min.is_some() || self.adaptive_max.is_some() {
            return Err(ConfigError::new(
                "adaptive_min and adaptive_max bound an adaptive limit; set adaptive too",
            ));
        }
        let policy = match (self.concurrency, self.quota.take(), self.algorithm.take()) {
            (Some(_), Some(_), _) => {
                return Err(ConfigError::new(
                    "a concurrency policy takes no quota (its limit is `concurrency`)",
                ));
            }
            (Some(_), None, Some(_)) => {
                return Err(ConfigError::new(
                    "a concurrency policy takes no algorithm (it counts requests in flight)",
                ));
            }
            (Some(n), None, None) => Policy::concurrency(n),
            (None, None, _) => {
                return Err(ConfigError::new(
                    "missing field `quota` (e.g. quota = \"10/s\"), or `concurrency`",
                ));
            }
            (None, Some(Text(quota)), algorithm) => {
                Policy::new(algorithm.map_or(Algorithm::Gcra, |a| a.0), quota)
            }
        };
        Ok(policy)
    }
}

impl RawPolicy {
    /// The adaptive concurrency policy of `rule` (`gradient2` or `aimd`), with its bounds.
    fn adaptive(&mut self, rule: &str) -> Result<Policy, ConfigError> {
        if self.quota.is_some() || self.algorithm.is_some() || self.concurrency.is_some() {
            return Err(ConfigError::new(
                "an adaptive concurrency policy takes no quota, algorithm or concurrency \
                 (its limit moves by itself)",
            ));
        }
        let mut adaptive = match rule {
            "gradient2" => Adaptive::gradient2(),
            "aimd" => Adaptive::aimd(),
            other => {
                return Err(ConfigError::new(format!(
                    "adaptive: {other:?} is neither \"gradient2\" nor \"aimd\""
                )));
            }
        };
        if let Some(n) = self.adaptive_min {
            adaptive = adaptive.min(n);
        }
        if let Some(n) = self.adaptive_max {
            adaptive = adaptive.max(n);
        }
        Ok(Policy::adaptive_concurrency(adaptive))
    }

    /// Where the policy reads a response's real cost, if it settles it.
    pub(super) fn settle(&self) -> Result<Option<Settle>, ConfigError> {
        let settle = match (&self.settle_header, &self.settle_trailer, &self.settle_body) {
            (None, None, None) => {
                if self.settle_at_most.is_some() {
                    return Err(ConfigError::new(
                        "settle_at_most bounds a settled cost; set settle_header, \
                         settle_trailer or settle_body too",
                    ));
                }
                return Ok(None);
            }
            (Some(Text(HeaderNameText(name))), None, None) => Settle::header(name.as_str()),
            (None, Some(Text(HeaderNameText(name))), None) => Settle::trailer(name.as_str()),
            (None, None, Some(Text(measure))) => match measure {
                BodyMeasure::Bytes => Settle::body_bytes(),
                #[cfg(feature = "json")]
                BodyMeasure::Json(pointer) => Settle::json(pointer),
            },
            _ => {
                return Err(ConfigError::new(
                    "a policy settles its cost from one place: settle_header, settle_trailer \
                     or settle_body",
                ));
            }
        };
        Ok(Some(match self.settle_at_most {
            Some(n) => settle.at_most(n),
            None => settle,
        }))
    }
}

impl RawPolicy {
    /// The calendar its periods are counted in, if it names one (UTC when only a week or
    /// month start is given).
    pub(super) fn calendar(&mut self) -> Option<Calendar> {
        if self.time_zone.is_none() && self.week_starts.is_none() && self.month_starts.is_none() {
            return None;
        }
        let mut calendar = self
            .time_zone
            .take()
            .map_or_else(Calendar::utc, |Text(c)| c);
        if let Some(Text(day)) = self.week_starts.take() {
            calendar = calendar.week_starts_on(day);
        }
        if let Some(day) = self.month_starts {
            calendar = calendar.month_starts_on(day);
        }
        Some(calendar)
    }
}

impl RawPolicy {
    /// `policy` with the tiers the file gives it (their quotas, unit, and how a request's
    /// tier is chosen).
    pub(super) fn tiered(&mut self, mut policy: Policy) -> Policy {
        if let Some(Text(unit)) = self.unit.take() {
            policy = policy.unit(unit);
        }
        for (tier, Text(quota)) in std::mem::take(&mut self.tiers) {
            policy = policy.tier(tier, quota);
        }
        if let Some(Text(HeaderNameText(name))) = self.tier_header.take() {
            policy = policy
                .select_tier(move |req| Some(req.headers().get(&name)?.to_str().ok()?.to_owned()));
        }
        for (key, tier) in std::mem::take(&mut self.tier_keys) {
            policy = policy.tier_for_key(key, tier);
        }
        policy
    }

    /// `policy` taking part as the file says (shadow, charged or refunded by status, leases,
    /// waits, concurrency).
    pub(super) fn taking(&mut self, mut policy: Policy) -> Policy {
        if self.shadow {
            policy = policy.shadow();
        }
        if !self.charge_if_status.is_empty() {
            let codes = statuses(&self.charge_if_status);
            policy = policy.charge_if(move |s| codes.contains(&s));
        }
        if !self.refund_if_status.is_empty() {
            let codes = statuses(&self.refund_if_status);
            policy = policy.refund_if(move |s| codes.contains(&s));
        }
        if let Some(units) = self.lease {
            policy = policy.lease(units);
        }
        if let Some(Text(DurationText(ttl))) = self.lease_ttl.take() {
            policy = policy.lease_ttl(ttl);
        }
        if let Some(Text(DurationText(wait))) = self.wait.take() {
            policy = policy.wait_up_to(wait);
        }
        if let Some(Text(DurationText(max))) = self.max_duration.take() {
            policy = policy.max_duration(max);
        }
        policy
    }

    /// `policy` keeping capacity for priority, if the file says so.
    pub(super) fn reserving(&mut self, policy: Policy) -> Result<Policy, ConfigError> {
        let shares = std::mem::take(&mut self.reserve_shares);
        let Some(Text(HeaderNameText(name))) = self.reserve_header.take() else {
            if shares.is_empty() && self.reserve_others.is_none() {
                return Ok(policy);
            }
            return Err(ConfigError::new(
                "reserve_shares and reserve_others need reserve_header: the header naming a \
                 request's priority",
            ));
        };
        let mut reserve = Reserve::header(name.as_str());
        for (priority, percent) in shares {
            reserve = reserve.share(priority, percent);
        }
        if let Some(percent) = self.reserve_others {
            reserve = reserve.others(percent);
        }
        Ok(policy.reserve(reserve))
    }
}

impl RawPolicy {
    /// `policy` blocking on violation, if the file says so.
    pub(super) fn blocking(&mut self, policy: Policy) -> Result<Policy, ConfigError> {
        let Some(Text(DurationText(first))) = self.block_for.take() else {
            let others = self.block_after.is_some()
                || self.block_within.is_some()
                || self.block_max.is_some()
                || self.block_factor.is_some()
                || self.block_forget_after.is_some();
            if others {
                return Err(ConfigError::new(
                    "block_after, block_within, block_max, block_factor and block_forget_after \
                     need block_for: the first block's duration",
                ));
            }
            return Ok(policy);
        };
        let mut escalation = Escalation::new(first);
        let within = self.block_within.take().map(|Text(DurationText(d))| d);
        if self.block_after.is_some() || within.is_some() {
            let within = within.unwrap_or(std::time::Duration::from_secs(60));
            escalation = escalation.after(self.block_after.unwrap_or(1), within);
        }
        if let Some(Text(DurationText(max))) = self.block_max.take() {
            escalation = escalation.at_most(max);
        }
        if let Some(factor) = self.block_factor {
            escalation = escalation.factor(factor);
        }
        if let Some(Text(DurationText(forget))) = self.block_forget_after.take() {
            escalation = escalation.forget_after(forget);
        }
        Ok(policy.block_on_violation(escalation))
    }
}
