//! What the layer's administrative operations ask the engine: a key's decision without a
//! request (check, peek, refund, penalize, block, reset), and the keys each policy denied most.

use std::future::Ready;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::Limiter;
use super::route::Lane;
use crate::decision::{Decision, PolicyOutcome};
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::{CompiledPolicy, Tier};
use crate::store::{Check, Checks, Enforced, Op, Store, TOGETHER};
use smallvec::SmallVec;

impl<St: Store> Limiter<St> {
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
    pub(super) fn forget_denial(&self, id: u32, key: &Key) {
        if let Some(cache) = &self.deny_cache {
            cache.forget(id, key);
        }
        if let Some(remembered) = &self.remembered {
            remembered.forget(id, key);
        }
    }

    /// The layer's present, in microseconds since 1970.
    pub(crate) fn now_us(&self) -> u64 {
        self.clock.now_micros()
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
