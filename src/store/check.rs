//! What a store is asked: one [`Check`] per policy that applies to a request, each with its
//! [`Mode`], decided together.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::key::Key;
use crate::policy::Tier;

/// How a check takes part in a decision. The Redis script's prelude gets these numbers from
/// [`Mode::ALL`], under the names of [`Mode::lua_name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Decides the request; charged only if every check that decides admits it.
    Enforce = 0,
    /// A shadow policy: reported, never decides; charged if it admits and the request goes on.
    Shadow = 1,
    /// Decides the request but is never charged here: the charge comes after the response
    /// ([`Policy::charge_if`](crate::Policy::charge_if)).
    ChargeLater = 2,
    /// Gives `cost` units back; then reports like a look at cost 0.
    Refund = 3,
    /// Forgets the key; then reports like a look at cost 0.
    Reset = 4,
    /// Charges `cost` units whatever the state; then reports like a look at cost 0.
    Penalize = 5,
    /// Denies the key for the next `cost` microseconds; then reports like a look at cost 0.
    Block = 6,
    /// Decides like [`Mode::Enforce`], on the state as strict as a lease could make it; when
    /// the request is admitted, charges a lease of what is left instead of the cost (at least
    /// the cost, at most the units wanted), to be spent by the caller until it ends.
    Lease = 7,
    /// Gives back `cost` units of the lease that ended at [`Check::lease_end`]; then reports
    /// like a look at cost 0.
    GiveBack = 8,
    /// Decides like [`Mode::Enforce`]; a request denied now that the policy admits within its
    /// tier's longest wait is admitted instead, its units charged at that slot, later.
    Reserve = 9,
    /// Gives back `cost` units a request reserved at the slot [`Check::lease_end`] and will not
    /// spend; then reports like a look at cost 0.
    Release = 10,
    /// Decides and charges like [`Mode::Enforce`]; the units charged are a concurrency
    /// limit's slots, held until the request ends and then given back with [`Mode::Release`]
    /// of the time they were charged at, which the store reports with the decision.
    Hold = 11,
}

impl Mode {
    /// Every mode, in the order of its number.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const ALL: [Mode; 12] = [
        Mode::Enforce,
        Mode::Shadow,
        Mode::ChargeLater,
        Mode::Refund,
        Mode::Reset,
        Mode::Penalize,
        Mode::Block,
        Mode::Lease,
        Mode::GiveBack,
        Mode::Reserve,
        Mode::Release,
        Mode::Hold,
    ];

    /// The name of the mode's constant in the Redis script.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn lua_name(self) -> &'static str {
        match self {
            Mode::Enforce => "ENFORCE",
            Mode::Shadow => "SHADOW",
            Mode::ChargeLater => "CHARGE_LATER",
            Mode::Refund => "REFUND",
            Mode::Reset => "RESET",
            Mode::Penalize => "PENALIZE",
            Mode::Block => "BLOCK",
            Mode::Lease => "LEASE",
            Mode::GiveBack => "GIVE_BACK",
            Mode::Reserve => "RESERVE",
            Mode::Release => "RELEASE",
            Mode::Hold => "HOLD",
        }
    }

    /// Whether a denial by this check denies the request.
    pub(crate) fn decides(self) -> bool {
        matches!(
            self,
            Mode::Enforce | Mode::ChargeLater | Mode::Lease | Mode::Reserve | Mode::Hold
        )
    }

    /// Whether this check is charged when the request is admitted, given its own verdict.
    pub(crate) fn charged(self, allowed: bool) -> bool {
        match self {
            Mode::Enforce | Mode::Lease | Mode::Reserve | Mode::Hold => true,
            Mode::Shadow => allowed,
            Mode::ChargeLater
            | Mode::Refund
            | Mode::Reset
            | Mode::Penalize
            | Mode::Block
            | Mode::GiveBack
            | Mode::Release => false,
        }
    }

    /// An administrative change made before the look at cost 0.
    pub(crate) fn is_admin(self) -> bool {
        matches!(
            self,
            Mode::Refund
                | Mode::Reset
                | Mode::Penalize
                | Mode::Block
                | Mode::GiveBack
                | Mode::Release
        )
    }
}

/// The checks of one decision, one per policy that applies (one is kept without allocating).
pub(crate) type Checks = SmallVec<[Check; 1]>;

/// One tier of one policy to decide for one key at some cost.
#[derive(Debug)]
pub(crate) struct Check {
    tier: Arc<Tier>,
    key: Key,
    cost: u64,
    mode: Mode,
    /// For [`Mode::GiveBack`], the end of the lease whose units come back (store time); for
    /// [`Mode::Release`], the slot given back; for
    /// [`Mode::Lease`], the units wanted.
    arg: u64,
}

impl Check {
    pub(crate) fn new(tier: Arc<Tier>, key: Key, cost: u64, mode: Mode) -> Self {
        Check {
            tier,
            key,
            cost,
            mode,
            arg: 0,
        }
    }

    /// Gives back `units` of the lease on `key` that ended at `lease_end` (store time).
    pub(crate) fn give_back(tier: Arc<Tier>, key: Key, units: u64, lease_end: u64) -> Self {
        Check {
            arg: lease_end,
            ..Check::new(tier, key, units, Mode::GiveBack)
        }
    }

    /// Gives back `units` reserved on `key` at `slot` (store time), not to be spent.
    pub(crate) fn release(tier: Arc<Tier>, key: Key, units: u64, slot: u64) -> Self {
        Check {
            arg: slot,
            ..Check::new(tier, key, units, Mode::Release)
        }
    }

    /// The same check asking for a lease of `want` units (the cost among them).
    pub(crate) fn leasing(&self, want: u64) -> Self {
        Check {
            arg: want.max(self.cost),
            ..self.with_mode(Mode::Lease)
        }
    }

    /// For [`Mode::GiveBack`], the end of the lease whose units come back; for
    /// [`Mode::Release`], the slot.
    pub(crate) fn lease_end(&self) -> u64 {
        self.arg
    }

    /// For [`Mode::Lease`], the units wanted (the cost among them) and the lease's longest
    /// life in microseconds (a tier without a lease lives for no time).
    pub(crate) fn lease(&self) -> (u64, u64) {
        (self.arg, self.tier.lease().map_or(0, |l| l.ttl_us()))
    }

    /// The policy tier decided.
    pub(crate) fn tier(&self) -> &Arc<Tier> {
        &self.tier
    }

    /// The caller's key.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// Units charged (or, for [`Mode::Block`], microseconds blocked).
    pub(crate) fn cost(&self) -> u64 {
        self.cost
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// The same check in another mode.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_mode(&self, mode: Mode) -> Check {
        Check {
            tier: self.tier.clone(),
            key: self.key.clone(),
            cost: self.cost,
            mode,
            arg: self.arg,
        }
    }
}
