//! The engine's compiled policies and the lane their requests take: read in place until a
//! reload replaces both.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::{ArcSwap, Guard};

use crate::policy::CompiledPolicy;
use crate::store::TOGETHER;

/// The way every request of a policy set reaches the store, chosen once for the set (when the
/// layer is built, and at each reload) and kept with it. A request's `call`, `check`, `peek`
/// and every administrative operation go the set's way; the store does not choose again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// One policy enforced up front, on a store that decides at once, with nothing around it
    /// (no deny cache, no local fallback): decided on the borrowed tier and key, its verdict
    /// alone (`Sealed::check_alone`).
    Alone,
    /// Two to [`TOGETHER`] such policies: decided together on the borrowed tiers and keys
    /// (`Sealed::check_together`).
    Together,
    /// Anything else: one `Check` per policy, through the deny cache, the leases held here, the
    /// breaker and the store's `check`.
    Checks,
}

impl Lane {
    /// The lane of `policies` on a store that decides at once or not (`at_once`), in a layer
    /// with nothing between a request and the store but its policies or not (`plain`).
    pub(crate) fn of(policies: &[CompiledPolicy], at_once: bool, plain: bool) -> Lane {
        if !(at_once && plain && policies.iter().all(CompiledPolicy::up_front)) {
            return Lane::Checks;
        }
        match policies.len() {
            1 => Lane::Alone,
            n if n <= TOGETHER => Lane::Together,
            _ => Lane::Checks,
        }
    }
}

/// Compiled policies with their lane.
pub(crate) struct Policies {
    lane: Lane,
    list: Box<[CompiledPolicy]>,
}

impl Policies {
    pub(crate) fn new(list: Box<[CompiledPolicy]>, lane: Lane) -> Self {
        Policies { lane, list }
    }

    /// The way their requests take.
    #[inline(always)]
    pub(crate) fn lane(&self) -> Lane {
        self.lane
    }
}

impl Deref for Policies {
    type Target = [CompiledPolicy];

    #[inline(always)]
    fn deref(&self) -> &[CompiledPolicy] {
        &self.list
    }
}

/// The engine's present policies, compiled. Until the first reload they are the set the layer
/// was built with, read in place: most layers are never reloaded, and their requests then touch
/// no reference count (an `ArcSwap` load is two locked operations). A reload swaps a new set in
/// whole, lane included: a request plans with the set it loads, and keeps the tiers it planned
/// with until it is done.
pub(crate) struct PolicySet {
    first: Policies,
    /// The set of the last reload, once `reloaded` is (an empty set before).
    latest: ArcSwap<Policies>,
    reloaded: AtomicBool,
}

/// A policy set as one request reads it.
pub(crate) enum Loaded<'a> {
    First(&'a Policies),
    Reloaded(Guard<Arc<Policies>>),
}

impl Deref for Loaded<'_> {
    type Target = Policies;

    #[inline]
    fn deref(&self) -> &Policies {
        match self {
            Loaded::First(set) => set,
            Loaded::Reloaded(guard) => guard,
        }
    }
}

impl PolicySet {
    pub(crate) fn new(first: Policies) -> Self {
        PolicySet {
            first,
            latest: ArcSwap::from_pointee(Policies::new(Box::default(), Lane::Checks)),
            reloaded: AtomicBool::new(false),
        }
    }

    /// The present set.
    #[inline]
    pub(crate) fn load(&self) -> Loaded<'_> {
        // The set is stored before the flag (both under the reload's lock): a request that
        // sees the flag finds the set.
        if self.reloaded.load(Ordering::Acquire) {
            Loaded::Reloaded(self.latest.load())
        } else {
            Loaded::First(&self.first)
        }
    }

    /// Makes `set` the present set, for every request planned from now on.
    pub(crate) fn replace(&self, set: Policies) {
        self.latest.store(Arc::new(set));
        self.reloaded.store(true, Ordering::Release);
    }
}

impl fmt::Debug for PolicySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.load().iter()).finish()
    }
}
