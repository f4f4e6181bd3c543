//! The route: a policy set compiled with its way through the engine (the steps before the
//! decision, the lane, the steps of an admitted decision), read in place until a reload
//! replaces it whole.
//!
//! A step is one variant of [`Before`] (run before the policies are planned, in the route's
//! order: it goes on, or answers, which may be a wait) or of [`After`] (run on the decision,
//! before it is answered: it goes on, or makes an admitted request wait). Which steps a route has is
//! decided once, in [`Route::compile`], one line per kind; the engine (`steps.rs`) loops over
//! them. Adding a kind is a variant here, its line in `compile`, and its arm in `steps.rs`.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::{ArcSwap, Guard};

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::adaptive::AdaptivePermit;
use crate::policy::{CompiledPolicy, Policy};
use crate::store::Store;
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
    /// (`Sealed::check_together`); `packed` when every one packs its state and takes the
    /// layer's key (then the memory store decides them under the shared lock).
    Together { packed: bool },
    /// Anything else: one `Check` per policy, through the deny cache, the leases held here, the
    /// breaker and the store's `check`.
    Checks,
}

impl Lane {
    /// The lane of `list` (compiled from `policies`, with the route's `steps`) on a store
    /// that decides at once or not (`at_once`), in a layer with nothing between a request and
    /// the store but its policies or not (`plain`). A faster lane takes policies decided and
    /// charged up front whose route has no step but the lists, none reading the body (a batch
    /// makes several checks of one policy, which only the general way plans).
    pub(crate) fn of(
        list: &[CompiledPolicy],
        policies: &[Policy],
        steps: Steps,
        at_once: bool,
        plain: bool,
    ) -> Lane {
        let up_front = (list.iter()).all(|p| p.up_front() && !p.reads_body()) && steps.only_lists();
        if !(at_once && plain && up_front) {
            return Lane::Checks;
        }
        match list.len() {
            1 => Lane::Alone,
            n if n <= TOGETHER => Lane::Together {
                packed: Self::packed(policies),
            },
            _ => Lane::Checks,
        }
    }

    /// Whether every request of `policies` is decided on packed states under the shared lock
    /// (one GCRA, or the packed policies of [`Lane::Together`]): chosen before anything is
    /// registered in the store, for its locks.
    pub(crate) fn shared(policies: &[Policy]) -> bool {
        if !Steps::of(policies, false, false).only_lists() {
            return false;
        }
        match policies {
            [p] => p.is_gcra_up_front(),
            ps => Self::packed(ps),
        }
    }

    /// Two to [`TOGETHER`] policies that pack their state, enforced up front on the layer's
    /// key.
    fn packed(policies: &[Policy]) -> bool {
        (2..=TOGETHER).contains(&policies.len()) && policies.iter().all(Policy::packs_up_front)
    }
}

/// A policy set compiled with its way through the engine: the steps before the decision, the
/// lane, and the steps of an admitted decision. Built when the layer is, and at each reload; a
/// request plans with the route it loads, and its ticket carries the route's [`Steps`] to the
/// end (a copy: no reference count).
pub(crate) struct Route {
    lane: Lane,
    list: Box<[CompiledPolicy]>,
    steps: Steps,
    /// A policy reads the request body.
    reads_body: bool,
}

impl Route {
    /// The route of `list`, taking `lane`, with its `steps`.
    pub(crate) fn new(list: Box<[CompiledPolicy]>, lane: Lane, steps: Steps) -> Self {
        let reads_body = list.iter().any(CompiledPolicy::reads_body);
        Route {
            lane,
            list,
            steps,
            reads_body,
        }
    }

    /// Whether a policy reads the request body.
    #[inline]
    pub(crate) fn reads_body(&self) -> bool {
        self.reads_body
    }

    /// The way their requests take.
    #[inline(always)]
    pub(crate) fn lane(&self) -> Lane {
        self.lane
    }

    /// Its steps, before the decision and of an admitted decision, and whether its requests'
    /// checks are kept.
    #[inline(always)]
    pub(crate) fn steps(&self) -> Steps {
        self.steps
    }
}

impl Deref for Route {
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
    first: Route,
    /// The set of the last reload, once `reloaded` is (an empty set before).
    latest: ArcSwap<Route>,
    reloaded: AtomicBool,
}

/// A policy set as one request reads it.
pub(crate) enum Loaded<'a> {
    First(&'a Route),
    Reloaded(Guard<Arc<Route>>),
}

impl Deref for Loaded<'_> {
    type Target = Route;

    #[inline]
    fn deref(&self) -> &Route {
        match self {
            Loaded::First(set) => set,
            Loaded::Reloaded(guard) => guard,
        }
    }
}

impl PolicySet {
    pub(crate) fn new(first: Route) -> Self {
        PolicySet {
            first,
            latest: ArcSwap::from_pointee(Route::new(
                Box::default(),
                Lane::Checks,
                Steps::default(),
            )),
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
    pub(crate) fn replace(&self, set: Route) {
        self.latest.store(Arc::new(set));
        self.reloaded.store(true, Ordering::Release);
    }
}

impl fmt::Debug for PolicySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.load().iter()).finish()
    }
}

/// Declares a kind of step: the enum, and its variants in order (`ALL`) with the bit of each in
/// [`Steps`] from `first`, so that a variant is written in one place.
macro_rules! kind_of_step {
    ($(#[$doc:meta])* $name:ident from bit $first:literal {
        $($(#[$vdoc:meta])* $variant:ident,)*
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            const ALL: &'static [$name] = &[$($name::$variant,)*];

            fn bit(self) -> u16 {
                1 << ($first + self as u16)
            }
        }
    };
}

kind_of_step! {
    /// A step before the decision.
    Before from bit 8 {
        /// The allow and deny lists: they answer, or (on a store that does not decide at
        /// once) name the key whose runtime entries the decision's store call reads.
        Lists,
        /// The adaptive concurrency limits: each that applies admits the request (a permit
        /// held until its response body ends), queues it, or sheds it.
        Adaptive,
    }
}

/// A wait before the request is planned (a place in an adaptive limit's queue; the answer to
/// another request's asking for the lease this one needs): once it ends, the steps run again,
/// then the plan, with what it gave: `Ok(Some(permit))` a place in an adaptive limit (kept
/// with the request's permits), `Ok(None)` nothing, or `Err(policy)` the name of the
/// adaptive policy whose queue's wait ran out (the request is shed).
pub(crate) struct Pending(Pin<Box<dyn Future<Output = Given> + Send>>);

/// What a [`Pending`] wait gives.
pub(crate) type Given = Result<Option<AdaptivePermit>, Box<str>>;

impl Pending {
    /// A step waiting for `wait`.
    pub(crate) fn new(wait: impl Future<Output = Given> + Send + 'static) -> Self {
        Pending(Box::pin(wait))
    }

    /// Polls the wait.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Given> {
        self.0.as_mut().poll(cx)
    }
}

kind_of_step! {
    /// A step after the decision, in the order they run: on every decision, before it is
    /// answered or the request goes on.
    After from bit 0 {
        /// Warn of the keys near their limit (`Policy::near_limit`).
        Warn,
        /// Hold the slots of the concurrency limits until the response body ends.
        Slots,
        /// Wait for the time booked for the request (`Policy::wait`).
        Booked,
    }
}

/// The steps of a route ([`Before`] and [`After`]), and whether its requests' checks are
/// kept after the decision (for those steps, the deny cache, the top limited keys, the IETF
/// `pk` or the denials remembered through an outage): small enough to copy into every ticket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Steps(u16);

impl Steps {
    const KEYS: u16 = 1 << 15;

    const BEFORE: u16 = 0x7f << 8;

    /// The steps before the decision, in order.
    #[inline(always)]
    pub(crate) fn before(self) -> impl Iterator<Item = Before> {
        let any = self.0 & Self::BEFORE != 0;
        let all = if any { Before::ALL } else { &[] };
        all.iter().copied().filter(move |s| self.0 & s.bit() != 0)
    }

    /// Whether `step` is one of them.
    #[inline(always)]
    pub(crate) fn has(self, step: After) -> bool {
        self.0 & step.bit() != 0
    }

    /// Whether a request's checks are kept after its decision.
    #[inline(always)]
    pub(crate) fn keeps_checks(self) -> bool {
        self.0 & !Self::BEFORE != 0
    }

    /// Whether an admitted decision may hold something the request gives back when it goes
    /// away: slots, or a booked time.
    #[inline(always)]
    pub(crate) fn gives_back(self) -> bool {
        self.has(After::Slots) || self.has(After::Booked)
    }

    /// The steps after the decision, in order.
    #[inline(always)]
    pub(crate) fn after(self) -> impl Iterator<Item = After> {
        After::ALL.iter().copied().filter(move |s| self.has(*s))
    }
}

/// What stands around a layer's policies, for their route.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Around {
    /// The store decides at once.
    at_once: bool,
    /// Nothing stands between a request and the store but its policies.
    plain: bool,
    /// The layer has lists.
    lists: bool,
    /// The layer keeps a request's checks after its decision, whatever its steps.
    keys: bool,
}

impl Around {
    /// Around the policies of a layer on the store `St` with what it has (a deny cache, a
    /// local fallback, the top limited keys, the IETF `pk`, lists). Plain: no deny cache or
    /// local fallback (the breaker does not count: a store that decides at once never fails,
    /// so it never opens one). Checks kept: for the deny cache, the top limited keys, the
    /// IETF `pk`, and on a store that may fail, the denials remembered through an outage.
    pub(crate) fn new<St: Store>(
        deny_cache: bool,
        fallback: bool,
        top: bool,
        partition: bool,
        lists: bool,
    ) -> Self {
        let at_once = St::DECIDES_ALONE;
        Around {
            at_once,
            plain: !deny_cache && !fallback,
            lists,
            keys: deny_cache || top || partition || !at_once,
        }
    }

    /// Whether nothing stands between a request and the store but its policies.
    pub(crate) fn plain(self) -> bool {
        self.plain
    }
}

impl Route {
    /// The route of `list` (compiled from `policies`) with what stands `around` it.
    pub(crate) fn compile(
        list: Box<[CompiledPolicy]>,
        policies: &[Policy],
        around: Around,
    ) -> Route {
        let steps = Steps::of(policies, around.lists, around.keys);
        let lane = Lane::of(&list, policies, steps, around.at_once, around.plain);
        Route::new(list, lane, steps)
    }
}

impl Steps {
    /// The steps of `policies`, with the lists or not, their checks kept or not (`keys`):
    /// one line per step, saying which policies call for it.
    fn of(policies: &[Policy], lists: bool, keys: bool) -> Steps {
        let any = |f: fn(&Policy) -> bool| policies.iter().any(f);
        let steps = [
            (Before::Lists.bit(), lists),
            (Before::Adaptive.bit(), any(Policy::adapts)),
            (After::Warn.bit(), any(Policy::warns_near)),
            (After::Slots.bit(), any(Policy::limits_in_flight)),
            (After::Booked.bit(), any(Policy::waits)),
        ];
        let keys = if keys { Steps::KEYS } else { 0 };
        let bits = (steps.into_iter().filter(|(_, on)| *on)).fold(keys, |all, (bit, _)| all | bit);
        Steps(bits)
    }

    /// Whether the lists are the only step (or there is none).
    fn only_lists(self) -> bool {
        self.0 & !(Steps::KEYS | Before::Lists.bit()) == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Lane;
    use crate::policy::Escalation;
    use crate::{MemoryStore, Policy, RateLimitLayer};

    /// The lane a layer of `policies` on the memory store takes.
    fn lane(policies: Vec<Policy>) -> Lane {
        let mut builder = RateLimitLayer::builder().store(MemoryStore::new());
        for p in policies {
            builder = builder.policy(p);
        }
        builder
            .build()
            .expect("a valid layer")
            .limiter()
            .policies
            .load()
            .lane()
    }

    #[test]
    fn a_strike_is_the_rules_and_takes_every_lane() {
        let blocks =
            || Policy::gcra("2/s").block_on_violation(Escalation::new(Duration::from_secs(10)));
        assert_eq!(lane(vec![blocks()]), Lane::Alone);
        assert_eq!(
            lane(vec![blocks(), Policy::fixed_window("100/min")]),
            Lane::Together { packed: true }
        );
        // A step after the decision is the route's: the general way.
        let warns = Policy::gcra("2/s").near_limit(80);
        assert_eq!(lane(vec![warns]), Lane::Checks);
    }
}
