//! [`CompiledPolicy`]: a policy ready to run, as the engine plans a request with it.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::builder::{CostFn, RequestFn, StatusFn, TierFn};
use super::route::Route;
use super::tier::Tier;
use crate::adaptive::AdaptiveLimits;
use crate::error::KeyRejection;
use crate::key::{Key, KeyExtractor, RequestRef};
use crate::settle::Settle;

/// A policy ready to run: its tiers (the policy's own quota first), the same tiers divided in
/// the local fallback store, and its options.
pub(crate) struct CompiledPolicy {
    pub(super) tiers: Box<[Striped]>,
    pub(super) fallback: Option<Box<[Striped]>>,
    pub(super) tier_names: HashMap<String, usize>,
    pub(super) tier_of: Option<TierFn>,
    pub(super) tier_overrides: HashMap<Key, usize>,
    pub(super) key: Arc<dyn KeyExtractor>,
    pub(super) cost: Option<CostFn>,
    /// Where the body states the cost, if it does.
    pub(super) body_cost: Option<super::body_cost::BodyCost>,
    /// The least a cost read from the body counts.
    pub(super) body_floor: u64,
    /// Its key or its cost reads the request body.
    pub(super) reads_body: bool,
    pub(super) refund_if: Option<StatusFn>,
    /// Where the real cost of a response comes from, for a policy that settles it.
    pub(super) settle: Option<Arc<Settle>>,
    pub(super) routes: Vec<Route>,
    pub(super) exempt: Option<RequestFn>,
    /// Every tier decided and charged up front, nothing given back after the response.
    pub(super) up_front: bool,
    /// The adaptive limits of its keys, for an adaptive concurrency policy.
    pub(super) adaptive: Option<AdaptiveLimits>,
}

impl fmt::Debug for CompiledPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("key", &self.key)
            .field("part", self.tier(0).part())
            .finish_non_exhaustive()
    }
}

impl CompiledPolicy {
    /// The tier named `name`, if it is one of this policy's.
    pub(crate) fn tier_named(&self, name: &str) -> Option<&Arc<Tier>> {
        self.tiers().find(|t| t.name() == name)
    }

    /// The policy's name (its own quota's tier).
    pub(crate) fn name(&self) -> &str {
        self.tiers[0].get().name()
    }

    /// Whether the policy applies to `request` (its routes match and it is not exempt).
    #[inline]
    pub(crate) fn applies(&self, request: &RequestRef<'_>) -> bool {
        (self.routes.is_empty() || self.routes.iter().any(|r| r.matches(request)))
            && !self.exempt.as_ref().is_some_and(|f| f(request))
    }

    /// The keys this policy's key makes of the requests `entry` names.
    pub(crate) fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, crate::EntryError> {
        crate::key::kept_entry_keys(&*self.key, entry)
    }

    /// The key `request` is charged to.
    #[inline]
    pub(crate) fn key(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        self.key.extract(request).map(Key::compact)
    }

    /// The index of the tier for this request and key.
    #[inline]
    pub(crate) fn tier_index(&self, request: &RequestRef<'_>, key: &Key) -> usize {
        if self.tiers.len() == 1 {
            return 0;
        }
        self.tier_chosen(request, key)
    }

    /// [`tier_index`](Self::tier_index) of a policy of several tiers.
    fn tier_chosen(&self, request: &RequestRef<'_>, key: &Key) -> usize {
        self.tier_overrides
            .get(key)
            .copied()
            .or_else(|| {
                let tier = self.tier_of.as_ref()?(request)?;
                self.tier_names.get(&tier).copied()
            })
            .unwrap_or(0)
    }

    /// The tier `key` is in without a request: the one [`Policy::tier_for_key`] puts it in,
    /// else the policy's own quota.
    #[inline]
    pub(crate) fn tier_of_key(&self, key: &Key) -> &Arc<Tier> {
        // No key hashed for an empty map (the common case, inlined).
        let index = if self.tier_overrides.is_empty() {
            0
        } else {
            self.override_of(key)
        };
        self.tiers[index].get()
    }

    /// The tier [`Policy::tier_for_key`] puts `key` in, else 0.
    #[inline(never)]
    fn override_of(&self, key: &Key) -> usize {
        self.tier_overrides.get(key).copied().unwrap_or(0)
    }

    /// The policy's tiers, its own quota first.
    pub(crate) fn tiers(&self) -> impl Iterator<Item = &Arc<Tier>> {
        self.tiers.iter().map(Striped::get)
    }

    /// The tier at `index`.
    #[inline]
    pub(crate) fn tier(&self, index: usize) -> &Arc<Tier> {
        self.tiers[index].get()
    }

    /// The tier at `index` in the local fallback store, if there is one.
    pub(crate) fn fallback_tier(&self, index: usize) -> Option<&Arc<Tier>> {
        self.fallback.as_ref().map(|tiers| tiers[index].get())
    }

    /// The units `request` costs, or why its body states no cost.
    #[inline]
    pub(crate) fn cost(&self, request: &RequestRef<'_>) -> Result<u64, KeyRejection> {
        if let Some(cost) = &self.body_cost {
            return cost.of(request).map(|units| units.max(self.body_floor));
        }
        Ok(self.cost.as_ref().map_or(1, |f| u64::from(f(request))))
    }

    /// The units `request` costs as far as its head says: a cost read from the body counts
    /// its floor.
    pub(crate) fn head_cost(&self, request: &RequestRef<'_>) -> u64 {
        match &self.body_cost {
            Some(_) => self.body_floor,
            None => self.cost.as_ref().map_or(1, |f| u64::from(f(request))),
        }
    }

    /// Whether its key reads the request body (a key not known before the body is read).
    pub(crate) fn keyed_by_body(&self) -> bool {
        self.key.reads_body()
    }

    /// Whether its key or its cost reads the request body.
    #[inline]
    pub(crate) fn reads_body(&self) -> bool {
        self.reads_body
    }

    /// Whether every tier is decided and charged up front ([`Op::Enforce`](crate::store::Op),
    /// no lease) and nothing is given back after the response: a request of this policy alone needs nothing but its decision.
    #[inline]
    pub(crate) fn up_front(&self) -> bool {
        self.up_front
    }

    /// The adaptive limits of its keys, for an adaptive concurrency policy (decided here, not
    /// in the store).
    #[inline]
    pub(crate) fn adaptive(&self) -> Option<&AdaptiveLimits> {
        self.adaptive.as_ref()
    }

    /// Give the cost back after responses whose status matches.
    pub(crate) fn refund_if(&self) -> Option<&StatusFn> {
        self.refund_if.as_ref()
    }

    /// Where the real cost of a response comes from, for a policy that settles it.
    pub(crate) fn settle(&self) -> Option<&Arc<Settle>> {
        self.settle.as_ref()
    }
}

/// How many copies of each tier a policy keeps (see [`Striped`]).
const STRIPES: usize = 8;

/// A tier as [`STRIPES`] equal copies, each behind its own `Arc`: every decision clones a
/// tier's `Arc` (its checks and its outcomes hold one), and threads that cloned the same one
/// would fight over its reference count's cache line (measured: the largest cost of two
/// threads deciding at once). Each thread takes the copy of its own stripe.
pub(crate) struct Striped(Box<[Arc<Tier>]>);

impl Striped {
    pub(super) fn new(make: impl Fn() -> Tier) -> Self {
        Striped((0..STRIPES).map(|_| Arc::new(make())).collect())
    }

    /// This thread's copy.
    #[inline]
    pub(crate) fn get(&self) -> &Arc<Tier> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            // Const-initialized (no lazy-init check on each read); `STRIPES` until chosen.
            static STRIPE: Cell<usize> = const { Cell::new(STRIPES) };
        }
        let mut stripe = STRIPE.get();
        if stripe == STRIPES {
            stripe = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
            STRIPE.set(stripe);
        }
        &self.0[stripe]
    }
}

impl fmt::Debug for Striped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0[0].fmt(f)
    }
}
