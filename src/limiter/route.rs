//! The route: a policy set compiled with its way through the engine (the steps before the
//! decision, the lane, the steps of an admitted decision), read in place until a reload
//! replaces it whole.
//!
//! A step is one variant of [`Before`] (run before the policies are planned, in the route's
//! order: it goes on, or answers, which may be a wait) or of [`Admitted`] (run on a decision
//! that admitted the request: it goes on, or makes the request wait). Which steps a route has is
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

use crate::adaptive::{AdaptivePermit, Permits};
use crate::body::BodyGuard;
use crate::key::Key;
use crate::policy::{CompiledPolicy, Policy};
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

/// A policy set compiled with its way through the engine: the steps before the decision, the
/// lane, and the steps of an admitted decision. Built when the layer is, and at each reload; a
/// request plans with the route it loads, and its ticket carries the route's [`Steps`] to the
/// end (a copy: no reference count).
pub(crate) struct Route {
    lane: Lane,
    list: Box<[CompiledPolicy]>,
    before: Box<[Before]>,
    steps: Steps,
}

impl Route {
    /// The route of `list`, taking `lane`, with the steps `before` its decision and the
    /// `steps` of its admitted decisions.
    pub(crate) fn new(
        list: Box<[CompiledPolicy]>,
        lane: Lane,
        before: Box<[Before]>,
        steps: Steps,
    ) -> Self {
        Route {
            lane,
            list,
            before,
            steps,
        }
    }

    /// The way their requests take.
    #[inline(always)]
    pub(crate) fn lane(&self) -> Lane {
        self.lane
    }

    /// The steps before the decision, in order.
    #[inline(always)]
    pub(crate) fn before(&self) -> &[Before] {
        &self.before
    }

    /// The steps of an admitted decision, and whether its checks are kept.
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
                Box::default(),
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

/// A step before the decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Before {
    /// The allow and deny lists: they answer, or (on a store that does not decide at once)
    /// name the key whose runtime entries the decision's store call reads.
    Lists,
    /// The adaptive concurrency limits: each that applies admits the request (a permit held
    /// until its response body ends), queues it, or sheds it.
    Adaptive,
}

/// What the steps before the decision hand the plan: the key whose runtime list entries the
/// store call reads, and the permits of the adaptive limits that admitted the request.
#[derive(Default)]
pub(crate) struct Carried {
    listed: Option<Key>,
    permits: Permits,
}

impl Carried {
    /// Where the lists' step puts the key whose runtime entries the store call reads.
    pub(crate) fn listed(&mut self) -> &mut Option<Key> {
        &mut self.listed
    }

    /// Where the adaptive limits' step puts its permits.
    pub(crate) fn permits(&mut self) -> &mut Permits {
        &mut self.permits
    }

    /// What the response body of an admitted request holds: `held`, and the permits.
    #[inline(always)]
    pub(crate) fn into_held(self, held: Option<BodyGuard>) -> Option<BodyGuard> {
        if self.permits.is_empty() {
            return held;
        }
        Some(BodyGuard::holding(held, self.permits))
    }
}

/// A step before the decision that waits (a place in an adaptive limit's queue): once what it
/// waits for comes, the steps run again with what it gave in the request's [`Carried`].
pub(crate) struct Pending(Pin<Box<dyn Future<Output = Resumed> + Send>>);

/// What a step that waited gives.
pub(crate) enum Resumed {
    /// A place in an adaptive limit.
    Permit(AdaptivePermit),
    /// Nothing: the wait in the queue of the adaptive policy named ran out.
    Shed(Box<str>),
}

impl Pending {
    /// A step waiting for `wait`.
    pub(crate) fn new(wait: impl Future<Output = Resumed> + Send + 'static) -> Self {
        Pending(Box::pin(wait))
    }

    /// Polls the wait.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Resumed> {
        self.0.as_mut().poll(cx)
    }
}

/// A step of an admitted decision, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Warn of the keys near their limit (`Policy::near_limit`).
    Warn,
    /// Hold the slots of the concurrency limits until the response body ends.
    Slots,
    /// Wait for the time reserved for the request (`Policy::wait`).
    Reserved,
}

impl Admitted {
    const ALL: [Admitted; 3] = [Admitted::Warn, Admitted::Slots, Admitted::Reserved];

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The [`Admitted`] steps of a route, and whether its requests' checks are kept after the
/// decision (for those steps, the deny cache, the top limited keys, the IETF `pk` or the denials
/// held through an outage): small enough to copy into every ticket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Steps(u8);

impl Steps {
    const KEYS: u8 = 1 << 7;

    /// With `step` too.
    fn with(self, step: Admitted) -> Self {
        Steps(self.0 | step.bit())
    }

    /// Whether `step` is one of them.
    #[inline(always)]
    pub(crate) fn has(self, step: Admitted) -> bool {
        self.0 & step.bit() != 0
    }

    /// Whether a request's checks are kept after its decision.
    #[inline(always)]
    pub(crate) fn keeps_keys(self) -> bool {
        self.0 != 0
    }

    /// Whether an admitted decision may hold something the request gives back when it goes
    /// away: slots, or a reserved time.
    #[inline(always)]
    pub(crate) fn gives_back(self) -> bool {
        self.has(Admitted::Slots) || self.has(Admitted::Reserved)
    }

    /// The steps, in order.
    #[inline(always)]
    pub(crate) fn iter(self) -> impl Iterator<Item = Admitted> {
        Admitted::ALL.into_iter().filter(move |s| self.has(*s))
    }
}

impl Route {
    /// The route of `list` (compiled from `policies`), on a store that decides at once or not
    /// (`at_once`), in a layer with nothing between a request and the store but its policies
    /// or not (`plain`), with `lists` or not, keeping its requests' checks for the layer or
    /// not (`keys`). One line per step.
    pub(crate) fn compile(
        list: Box<[CompiledPolicy]>,
        policies: &[Policy],
        at_once: bool,
        plain: bool,
        lists: bool,
        keys: bool,
    ) -> Route {
        let lane = Lane::of(&list, at_once, plain);
        let any = |f: fn(&Policy) -> bool| policies.iter().any(f);
        let before = [
            (Before::Lists, lists),
            (Before::Adaptive, any(Policy::adapts)),
        ];
        let admitted = [
            (Admitted::Warn, any(Policy::warns_near)),
            (Admitted::Slots, any(Policy::limits_in_flight)),
            (Admitted::Reserved, any(Policy::waits)),
        ];
        let before = before.into_iter().filter(|(_, on)| *on).map(|(s, _)| s);
        let mut steps = Steps(if keys { Steps::KEYS } else { 0 });
        for (step, _) in admitted.into_iter().filter(|(_, on)| *on) {
            steps = steps.with(step);
        }
        Route::new(list, lane, before.collect(), steps)
    }
}
