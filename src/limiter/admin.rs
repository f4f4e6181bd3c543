//! What the layer's administrative operations ask the engine: a key's decision without a
//! request (check, peek, refund, penalize, block, reset), and the keys each policy denied most.

use std::future::Ready;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use super::Limiter;
use super::route::Lane;
use crate::decision::{Decision, PolicyOutcome};
use crate::error::{LimitError, StoreError};
use crate::key::Key;
use crate::policy::{CompiledPolicy, Tier};
use crate::quota::Quota;
use crate::store::{Check, Checks, Enforced, Op, Store, TOGETHER};
use crate::top::{LimitedKey, TopLimitedService, TopReport};
use smallvec::SmallVec;

impl<St: Store> Limiter<St> {
    /// The `n` keys `policy` denied most (none when the layer keeps no summary).
    pub(crate) fn top_limited(&self, policy: &str, n: usize) -> Vec<LimitedKey> {
        let Some(top) = &self.top else {
            return Vec::new();
        };
        top.top(policy, n, self.clock.now_micros()).into_keys()
    }

    /// [`Limiter::top_limited`] of every policy, with how many requests each denied.
    pub(crate) fn top_limited_reports(&self, n: usize) -> Vec<TopReport> {
        match &self.top {
            Some(top) => top.top_all(n, self.clock.now_micros()),
            None => Vec::new(),
        }
    }

    /// The JSON admin route of the summary.
    pub(crate) fn top_limited_service(&self) -> TopLimitedService {
        TopLimitedService::new(self.top.clone(), self.clock.clone())
    }

    /// Counts each policy that denied the request (shadow or not) in its summary of the keys
    /// denied, when the layer keeps one.
    #[inline]
    pub(super) fn record_limited(&self, decision: &Decision, keys: Option<&[Check]>) {
        if let (Some(top), Some(keys)) = (&self.top, keys) {
            let mut now = None;
            for o in decision.outcomes().iter().filter(|o| !o.is_allowed()) {
                if let Some(key) = Check::key_of(keys, o.tier().id()) {
                    let now = *now.get_or_insert_with(|| self.clock.now_micros());
                    top.record(o.policy(), key, now);
                }
            }
        }
    }

    /// Every policy's check for `key` without a request (in the tier the key is put in), making
    /// the operation given or the policy's own, of the units `units` gives for the tier: the
    /// administrative operations.
    ///
    /// Not an `async fn`: a store that decides at once (the memory store) answers with a
    /// ready value, and no state machine carries the decision.
    pub(crate) fn key_decision(
        &self,
        key: &Key,
        op: Option<Op>,
        units: impl Fn(&Tier) -> u64,
    ) -> Answer<St::Future> {
        if key.is_long() {
            return self.long_key_decision(key, op, units);
        }
        let policies = self.policies.load();
        // A request's own operation goes the set's lane; any other goes as checks.
        match (op, policies.lane()) {
            (None, Lane::Alone) => {
                let tier = policies[0].tier_of_key(key);
                if let Some((verdict, own)) = self.store.check_alone(tier, key, None, units(tier)) {
                    let outcome = PolicyOutcome::new(own.as_ref().unwrap_or(tier), false, verdict);
                    return Answer::Now(std::future::ready(Ok(Decision::one(outcome))));
                }
            }
            (None, Lane::Together { packed }) => {
                let mut together: SmallVec<[Enforced<'_>; TOGETHER]> = SmallVec::new();
                for p in policies.iter() {
                    let tier = p.tier_of_key(key);
                    together.push((tier, key, units(tier)));
                }
                if let Some(decision) = self.store.check_together(&together, packed) {
                    return Answer::Now(std::future::ready(Ok(decision)));
                }
            }
            _ => {}
        }
        self.checks_decision(&policies, key, op, units)
    }

    /// [`key_decision`](Self::key_decision) the general way: one check per policy. Kept out
    /// of line, so that the lanes' way, inlined, stays small (a `check` otherwise costs about
    /// 50 instructions more).
    #[inline(never)]
    fn checks_decision(
        &self,
        policies: &[CompiledPolicy],
        key: &Key,
        op: Option<Op>,
        units: impl Fn(&Tier) -> u64,
    ) -> Answer<St::Future> {
        // Pushed one by one: `collect` into a SmallVec goes through its generic `extend`, which
        // costs a `check` about 100 instructions more.
        let mut checks = Checks::new();
        if op == Some(Op::Reset) {
            self.forget_denials(key);
        }
        for p in policies {
            let tier = p.tier_of_key(key);
            if let (Some(leases), Some(Op::Reset | Op::Block { .. })) = (self.leases(), op) {
                // The administrator's word is seen here at once, elsewhere by the leases' end.
                leases.forget(tier.id(), key);
            }
            let op = op.unwrap_or(tier.part().op());
            checks.push(Check::new(tier.clone(), key.clone(), units(tier), op));
        }
        self.store_decision(checks)
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
        let policies = self.policies.load();
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
            if let Some(leases) = self.leases() {
                leases.forget(tier.id(), &key);
            }
            self.forget_denial(tier.id(), &key);
            checks.push(Check::new(tier.clone(), key, 0, op));
        }
        drop(policies);
        Ok(self.store_decision(checks))
    }

    /// [`key_decision`](Self::key_decision) of a key longer than
    /// [`LONGEST`](crate::key::LONGEST), as the layer keeps it: its hash.
    #[cold]
    #[inline(never)]
    fn long_key_decision(
        &self,
        key: &Key,
        op: Option<Op>,
        units: impl Fn(&Tier) -> u64,
    ) -> Answer<St::Future> {
        self.key_decision(&key.clone().compact(), op, units)
    }

    /// Forgets the deny cache's denials of `key` in every tier: a reset or an allow entry is
    /// obeyed by this instance at once (others' caches answer to their denials' end).
    pub(crate) fn forget_denials(&self, key: &Key) {
        if self.deny_cache.is_none() && self.remembered.is_none() {
            return;
        }
        for tier in self.policies.load().iter().flat_map(|p| p.tiers()) {
            self.forget_denial(tier.id(), key);
        }
    }

    /// Forgets what the deny cache and the denials remembered know of `key` in the tier `id`.
    fn forget_denial(&self, id: u32, key: &Key) {
        if let Some(cache) = &self.deny_cache {
            cache.forget(id, key);
        }
        if let Some(remembered) = &self.remembered {
            remembered.forget(id, key);
        }
    }

    /// The limit of the layer's tier `id` as configured (not a key's own), if it has one.
    pub(crate) fn configured_limit(&self, id: u32) -> Option<u64> {
        let policies = self.policies.load();
        let mut tiers = policies.iter().flat_map(|p| p.tiers());
        tiers.find(|t| t.id() == id).map(|t| t.limit())
    }

    /// The layer's present, in microseconds since 1970.
    pub(crate) fn now_us(&self) -> u64 {
        self.clock.now_micros()
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
        let now = self.clock.now_micros();
        if us <= now {
            return Err(LimitError::Until(format!(
                "{until:?} is not after the present ({now} microseconds since 1970)"
            )));
        }
        Ok((us, now))
    }

    /// `checks` decided by the store: at once where it can, else its future.
    pub(super) fn store_decision(&self, checks: Checks) -> Answer<St::Future> {
        match self.store.check_now(&checks) {
            Some(decision) => Answer::Now(std::future::ready(Ok(decision))),
            None => Answer::Later(self.store.check(checks)),
        }
    }
}

/// The answer of [`Limiter::key_decision`]: the decision made at once, or the store's future.
pub(crate) enum Answer<F> {
    Now(Ready<Result<Decision, StoreError>>),
    Later(F),
}

impl<F> Future for Answer<F>
where
    F: Future<Output = Result<Decision, StoreError>> + Unpin,
{
    type Output = Result<Decision, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Answer::Now(ready) => Pin::new(ready).poll(cx),
            Answer::Later(future) => Pin::new(future).poll(cx),
        }
    }
}
