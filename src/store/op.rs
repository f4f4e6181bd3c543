//! What a store is asked: one [`Check`] per policy that applies to a request, each making one
//! typed [`Op`], decided together.
//!
//! An operation's facts (does it decide the request, is it charged, what it adds to a script
//! call, how wide its reply is, how a charge it made is undone) are written once, here. The
//! memory store reads them; the Redis script's prelude gets them as tables generated from
//! [`Op::KINDS`] (see `store/redis/script.rs`), and a test holds `decide.lua`'s branches to
//! them. What an operation does to a state (its own arm) is written once per store: in
//! `store/memory/shard.rs` and in `decide.lua`.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::key::Key;
use crate::policy::{Part, Tier};

/// One operation on one key of one policy tier, with its own payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Decides the request; charged only if every check that decides admits it.
    Enforce,
    /// A shadow policy: reported, never decides; charged if it admits and the request goes on.
    Shadow,
    /// Decides the request but is never charged here: the charge comes after the response
    /// ([`Policy::charge_if`](crate::Policy::charge_if)).
    ChargeLater,
    /// Decides and charges like [`Op::Enforce`]; the units charged are a concurrency limit's
    /// slots, held until the request ends and then given back with [`Op::Release`] of the
    /// time they were charged at, which the store reports as the outcome's grant.
    Hold,
    /// Decides like [`Op::Enforce`]; a request denied now that the policy admits within
    /// `max_wait_us` is admitted instead, its units charged at that slot, later.
    Reserve {
        /// The longest wait, in microseconds.
        max_wait_us: u64,
    },
    /// Decides like [`Op::Enforce`], on the state as strict as a lease could make it; when
    /// the request is admitted, charges a lease of what is left instead of the cost (at least
    /// the cost, at most `want`), to be spent by the caller until it ends (the tier's lease
    /// says for how long at most).
    Lease {
        /// The units wanted, the cost among them.
        want: u64,
    },
    /// Gives the check's units back; then reports like a look at cost 0.
    Refund,
    /// Forgets the key and its block; then reports like a look at cost 0.
    Reset,
    /// Charges the check's units whatever the state; then reports like a look at cost 0.
    Penalize,
    /// Denies the key for the next `us` microseconds; then reports like a look at cost 0.
    Block {
        /// How long the block lasts.
        us: u64,
    },
    /// Gives back the check's units of the lease that ended at `end` (store time); then
    /// reports like a look at cost 0.
    GiveBack {
        /// The lease's end.
        end: u64,
    },
    /// Gives back the check's units that a request took at `slot` (store time: reserved for
    /// it, or the slots of a concurrency limit) and will not spend; then reports like a look
    /// at cost 0.
    Release {
        /// When the units were charged.
        slot: u64,
    },
}

/// When a check is charged, if the request is admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Charge {
    /// Never (after the response, or an operation that acts on its own).
    Never,
    /// When its own verdict admits it too (a shadow policy).
    IfAllowed,
    /// Always.
    Always,
}

impl Op {
    /// The operation a request's check makes on a tier that takes part `part` way (a lease is
    /// asked for by the leases' own planning, when a key is busy: see `lease.rs`).
    pub(crate) fn of(part: &Part) -> Op {
        match part {
            Part::Enforce | Part::Lease(_) => Op::Enforce,
            Part::Shadow => Op::Shadow,
            Part::ChargeLater(_) => Op::ChargeLater,
            Part::Reserve { max_wait_us } => Op::Reserve {
                max_wait_us: *max_wait_us,
            },
            Part::Hold => Op::Hold,
        }
    }

    /// One operation of each kind (payloads 0), in the order of their ids.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const KINDS: [Op; 12] = [
        Op::Enforce,
        Op::Shadow,
        Op::ChargeLater,
        Op::Hold,
        Op::Reserve { max_wait_us: 0 },
        Op::Lease { want: 0 },
        Op::Refund,
        Op::Reset,
        Op::Penalize,
        Op::Block { us: 0 },
        Op::GiveBack { end: 0 },
        Op::Release { slot: 0 },
    ];

    /// The operation's id in the Redis script: its place in [`Op::KINDS`], from 1 (Lua's
    /// tables count from 1).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn id(self) -> u8 {
        match self {
            Op::Enforce => 1,
            Op::Shadow => 2,
            Op::ChargeLater => 3,
            Op::Hold => 4,
            Op::Reserve { .. } => 5,
            Op::Lease { .. } => 6,
            Op::Refund => 7,
            Op::Reset => 8,
            Op::Penalize => 9,
            Op::Block { .. } => 10,
            Op::GiveBack { .. } => 11,
            Op::Release { .. } => 12,
        }
    }

    /// The name of the operation's constant in the Redis script.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn lua_name(self) -> &'static str {
        match self {
            Op::Enforce => "ENFORCE",
            Op::Shadow => "SHADOW",
            Op::ChargeLater => "CHARGE_LATER",
            Op::Hold => "HOLD",
            Op::Reserve { .. } => "RESERVE",
            Op::Lease { .. } => "LEASE",
            Op::Refund => "REFUND",
            Op::Reset => "RESET",
            Op::Penalize => "PENALIZE",
            Op::Block { .. } => "BLOCK",
            Op::GiveBack { .. } => "GIVE_BACK",
            Op::Release { .. } => "RELEASE",
        }
    }

    /// Whether a denial by this check denies the request.
    pub(crate) const fn decides(self) -> bool {
        matches!(
            self,
            Op::Enforce | Op::ChargeLater | Op::Hold | Op::Reserve { .. } | Op::Lease { .. }
        )
    }

    /// When this check is charged, if the request is admitted.
    pub(crate) const fn charge(self) -> Charge {
        match self {
            Op::Enforce | Op::Hold | Op::Reserve { .. } | Op::Lease { .. } => Charge::Always,
            Op::Shadow => Charge::IfAllowed,
            _ => Charge::Never,
        }
    }

    /// Whether the check is charged when the request is admitted, given its own verdict.
    pub(crate) const fn charged(self, allowed: bool) -> bool {
        match self.charge() {
            Charge::Always => true,
            Charge::IfAllowed => allowed,
            Charge::Never => false,
        }
    }

    /// Whether the operation changes the state on its own before the look at cost 0 that
    /// reports it (an administrative change, or units given back).
    pub(crate) const fn acts(self) -> bool {
        matches!(
            self,
            Op::Refund
                | Op::Reset
                | Op::Penalize
                | Op::Block { .. }
                | Op::GiveBack { .. }
                | Op::Release { .. }
        )
    }

    /// The integers the operation adds to a script call after the cost: its payload, and
    /// for a lease, its longest life (`lease_ttl_us`, the tier's).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn args(self, lease_ttl_us: u64) -> SmallVec<[u64; 2]> {
        let mut args = SmallVec::new();
        match self {
            Op::Reserve { max_wait_us: x }
            | Op::Block { us: x }
            | Op::GiveBack { end: x }
            | Op::Release { slot: x } => args.push(x),
            Op::Lease { want } => args.extend([lease_ttl_us, want]),
            _ => {}
        }
        args
    }

    /// How many integers [`Op::args`] adds.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn arg_count(self) -> usize {
        self.args(0).len()
    }

    /// Whether the store reports a grant with the outcome: a lease's units, the slot a
    /// request reserved, the slots a concurrency limit gave it (a `Grant`, in `decision.rs`). Its reply then has
    /// [`Op::REPLY_GRANT`] more integers.
    pub(crate) const fn grants(self) -> bool {
        matches!(self, Op::Hold | Op::Reserve { .. } | Op::Lease { .. })
    }

    /// Whether the units it charges are slots the request gives back when it ends or goes
    /// away ([`Op::Release`]): a concurrency limit's, or a reserved slot.
    pub(crate) const fn takes_slots(self) -> bool {
        matches!(self, Op::Hold | Op::Reserve { .. })
    }

    /// Integers in every check's reply: the verdict, remaining and reset.
    pub(crate) const REPLY: usize = 3;
    /// Integers a granting check's reply has after those: units, end, microseconds to it.
    pub(crate) const REPLY_GRANT: usize = 3;

    /// How wide the check's reply is.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn reply_width(self) -> usize {
        if self.grants() {
            Op::REPLY + Op::REPLY_GRANT
        } else {
            Op::REPLY
        }
    }

    /// The operation that undoes what this one charged, when the request turns out denied
    /// after all (a cluster decides a request's keys in several calls): a grant's units are
    /// released or given back as a lease's (`granted`: the grant's end), a charge is refunded.
    /// `None` when nothing was charged.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn undo(self, allowed: bool, units: u64, granted: Option<u64>) -> Option<Op> {
        match (self, granted) {
            (op, Some(end)) if op.takes_slots() => Some(Op::Release { slot: end }),
            (_, Some(end)) => Some(Op::GiveBack { end }),
            (op, None) => (op.charged(allowed) && units > 0).then_some(Op::Refund),
        }
    }
}

/// The checks of one decision, one per policy that applies (two are kept without allocating).
pub(crate) type Checks = SmallVec<[Check; 2]>;

/// One operation on one tier of one policy, for one key, of some units.
#[derive(Debug)]
pub(crate) struct Check {
    tier: Arc<Tier>,
    key: Key,
    cost: u64,
    op: Op,
}

impl Check {
    pub(crate) fn new(tier: Arc<Tier>, key: Key, cost: u64, op: Op) -> Self {
        Check {
            tier,
            key,
            cost,
            op,
        }
    }

    /// The same check asking for a lease of `want` units (the cost among them).
    pub(crate) fn leasing(&self, want: u64) -> Self {
        self.with_op(Op::Lease {
            want: want.max(self.cost),
        })
    }

    /// The policy tier decided.
    pub(crate) fn tier(&self) -> &Arc<Tier> {
        &self.tier
    }

    /// The caller's key.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// The units charged, looked at, or given back.
    pub(crate) fn cost(&self) -> u64 {
        self.cost
    }

    pub(crate) fn op(&self) -> Op {
        self.op
    }

    /// The same check making another operation.
    pub(crate) fn with_op(&self, op: Op) -> Check {
        Check {
            tier: self.tier.clone(),
            key: self.key.clone(),
            cost: self.cost,
            op,
        }
    }
}
