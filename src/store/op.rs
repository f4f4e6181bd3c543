//! The operations a store is asked to make ([`Op`]), one per policy of a request (its
//! [`Check`](super::Check)), decided together. An operation is also how a policy takes part
//! in a decision: a policy tier makes one operation (see `policy::Part`).
//!
//! The operations are one declaration (`operations!`): each one's variant, its name in the
//! Lua sources and its facts (does it decide the request, when is it charged, does it act on
//! its own, does it grant, does it take slots), so a new operation states every fact or does
//! not compile. What follows from the facts (what it adds to a script call, how wide its reply
//! is, how a charge it made is undone) is written once, here, in `match`es with no catch-all
//! arm. The memory store reads them; the Redis script's prelude has them as tables generated
//! from [`Op::KINDS`] (see `store/redis/script.rs`), and a test holds the script's branches
//! to them. What an operation does to a state (its own arm) is written once per store: in
//! `store/memory/shard.rs` and in `act.lua` (or `decide.lua`'s phases).

use smallvec::SmallVec;

/// What an operation is, one row of [`operations!`]: every fact a new operation must state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Facts {
    /// A denial by its check denies the request.
    decides: bool,
    /// When its check is charged, if the request is admitted.
    charge: Charge,
    /// It changes the state on its own before the look at cost 0 that reports it.
    acts: bool,
    /// The store reports a grant with its outcome.
    grants: bool,
    /// The units it charges are slots the request gives back when it ends or goes away.
    gives_back_later: bool,
    /// It changes what the key's state is written under (a key's own limit): its arm is
    /// given the state as written, and what it was written under, not the state converted.
    relimits: bool,
    /// It is judged as if its integer more units were asked for, and charged its cost alone
    /// (units kept for higher priorities).
    keeps: bool,
}

/// The operations, one declaration: each one's variant (with its payload, at most one
/// integer), its name in the Redis script's sources, what a policy making it does (for
/// messages), and its [`Facts`]. The enum, its ids
/// (the place in this list, from 1), [`Op::KINDS`] and every fact follow from it.
macro_rules! operations {
    ($(
        $(#[$doc:meta])*
        $variant:ident $({ $(#[$fdoc:meta])* $field:ident })?
            => $lua:literal, $what:literal, $facts:expr;
    )*) => {
        /// One operation on one key of one policy tier, with its own payload.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Op {
            $($(#[$doc])* $variant $({ $(#[$fdoc])* $field: u64 })?,)*
        }

        impl Op {
            /// One operation of each kind (payloads 0), in the order of their ids.
            #[cfg_attr(not(feature = "redis"), allow(dead_code))]
            pub(crate) const KINDS: &[Op] = &[$(Op::$variant $({ $field: 0 })?,)*];

            /// The operation of this kind with `payload` in its field, if it has one.
            #[cfg(fuzzing)]
            pub(crate) const fn with_payload(self, payload: u64) -> Op {
                match self {
                    $(Op::$variant { .. } => Op::$variant $({ $field: payload })?,)*
                }
            }

            /// The operation's id in the Redis script: its place in [`Op::KINDS`], from 1
            /// (Lua's tables count from 1).
            #[cfg_attr(not(feature = "redis"), allow(dead_code))]
            pub(crate) const fn id(self) -> u8 {
                let mut id = 0;
                $(
                    id += 1;
                    if let Op::$variant { .. } = self {
                        return id;
                    }
                )*
                unreachable!()
            }

            /// The name of the operation's constant in the Redis script's sources.
            #[cfg(all(test, feature = "redis"))]
            pub(crate) const fn lua_name(self) -> &'static str {
                match self {
                    $(Op::$variant { .. } => $lua,)*
                }
            }

            #[inline(always)]
            const fn facts(self) -> Facts {
                match self {
                    $(Op::$variant { .. } => $facts,)*
                }
            }

            /// What a policy whose checks make this operation does, for messages ("is
            /// enforced", "takes leases (lease)").
            pub(crate) const fn what(self) -> &'static str {
                match self {
                    $(Op::$variant { .. } => $what,)*
                }
            }

            /// The integers the operation adds to a script call after the cost: its payload,
            /// and for a lease, its longest life first (`lease_ttl_us`, the tier's).
            #[cfg_attr(not(feature = "redis"), allow(dead_code))]
            pub(crate) fn args(self, lease_ttl_us: u64) -> SmallVec<[u64; 2]> {
                let mut args = SmallVec::new();
                if let Op::Lease { .. } = self {
                    args.push(lease_ttl_us);
                }
                match self {
                    $(Op::$variant $({ $field })? => { $(args.push($field);)? })*
                }
                args
            }
        }
    };
}

/// The facts of an operation that decides the request and is charged always.
const DECIDES_CHARGED: Facts = Facts {
    decides: true,
    charge: Charge::Always,
    acts: false,
    grants: false,
    gives_back_later: false,
    relimits: false,
    keeps: false,
};

/// The facts of an operation that acts on its own, never decides and is never charged.
const ACTS: Facts = Facts {
    decides: false,
    charge: Charge::Never,
    acts: true,
    grants: false,
    gives_back_later: false,
    relimits: false,
    keeps: false,
};

/// The facts of an operation that changes what a key is decided under.
const RELIMITS: Facts = Facts {
    relimits: true,
    ..ACTS
};

operations! {
    /// Decides the request; charged only if every check that decides admits it.
    Enforce => "ENFORCE", "is enforced", DECIDES_CHARGED;
    /// A shadow policy: reported, never decides; charged if it admits and the request goes on.
    Shadow => "SHADOW", "runs in shadow (shadow())",
        Facts { decides: false, charge: Charge::IfAllowed, ..DECIDES_CHARGED };
    /// Decides the request but is never charged here: the charge comes after the response
    /// ([`Policy::charge_if`](crate::Policy::charge_if)).
    ChargeIf => "CHARGE_IF", "charges after the response (charge_if)",
        Facts { charge: Charge::Never, ..DECIDES_CHARGED };
    /// Decides and charges like [`Op::Enforce`]; the units charged are a concurrency limit's
    /// slots, held until the request ends and then given back with [`Op::Release`] of the
    /// time they were charged at, which the store reports as the outcome's grant.
    Concurrency => "CONCURRENCY", "limits requests in flight (concurrency)",
        Facts { grants: true, gives_back_later: true, ..DECIDES_CHARGED };
    /// Decides like [`Op::Enforce`]; a request denied now that the policy admits within
    /// `max_wait_us` is admitted instead, its units charged at that time, later.
    Wait {
        /// The longest wait, in microseconds.
        max_wait_us
    } => "WAIT", "makes requests wait (wait_up_to)",
        Facts { grants: true, gives_back_later: true, ..DECIDES_CHARGED };
    /// Decides like [`Op::Enforce`], on the state as strict as a lease could make it; when
    /// the request is admitted, charges a lease of what is left instead of the cost (at least
    /// the cost, at most `want`), to be spent by the caller until it ends (the tier's lease
    /// says for how long at most).
    Lease {
        /// The units wanted, the cost among them.
        want
    } => "LEASE", "takes leases (lease)", Facts { grants: true, ..DECIDES_CHARGED };
    /// Gives the check's units back; then reports like a look at cost 0.
    Refund => "REFUND", "gives units back", ACTS;
    /// Forgets the key and its block; then reports like a look at cost 0.
    Reset => "RESET", "forgets the key", ACTS;
    /// Charges the check's units whatever the state; then reports like a look at cost 0.
    Penalize => "PENALIZE", "charges units whatever the state", ACTS;
    /// Denies the key for the next `us` microseconds; then reports like a look at cost 0.
    Block {
        /// How long the block lasts.
        us
    } => "BLOCK", "blocks the key", ACTS;
    /// Gives back the check's units of the lease that ended at `end` (store time); then
    /// reports like a look at cost 0.
    GiveBack {
        /// The lease's end.
        end
    } => "GIVE_BACK", "gives a lease's units back", ACTS;
    /// Gives back the check's units that a request took at `at` (store time: the time
    /// booked for it, or when the slots of a concurrency limit were charged) and will not
    /// spend; then reports like a look at cost 0.
    Release {
        /// When the units were charged.
        at
    } => "RELEASE", "gives back units it will not spend", ACTS;
    /// Settles a request charged `estimate` units up front at its real cost, the check's
    /// units: gives the difference back when they are fewer, charges it when they are more,
    /// past the limit if need be (the key then owes them, and is denied until time pays them
    /// back: `Kernel::debit`); then reports like a look at cost 0.
    Settle {
        /// The units charged up front.
        estimate
    } => "SETTLE", "settles the real cost", ACTS;
    /// Puts the key under a limit of its own until `until` (on the store's clock): the
    /// check's tier is the policy's with the key's own quota. Its usage is kept, converted as
    /// a reload converts it; then reports like a look at cost 0.
    Limit {
        /// When the key's own limit ends.
        until
    } => "LIMIT", "puts the key under a limit of its own", RELIMITS;
    /// Puts the key back under its policy's own quota, its usage kept; then reports like a
    /// look at cost 0.
    Unlimit => "UNLIMIT", "puts the key back under its policy's quota", RELIMITS;
    /// Decides like [`Op::Enforce`] as if `keep` more units were asked for, and charges the
    /// cost alone: the request may use all of the policy's capacity but `keep` units, kept
    /// for requests of a higher priority on the one state they share
    /// ([`Policy::reserve`](crate::Policy::reserve)).
    Reserve {
        /// The units kept for higher priorities.
        keep
    } => "RESERVE", "keeps capacity for priority (reserve)",
        Facts { keeps: true, ..DECIDES_CHARGED };
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
    /// Whether a denial by this check denies the request.
    #[inline(always)]
    pub(crate) const fn decides(self) -> bool {
        self.facts().decides
    }

    /// When this check is charged, if the request is admitted.
    #[inline(always)]
    pub(crate) const fn charge(self) -> Charge {
        self.facts().charge
    }

    /// Whether the check is charged when the request is admitted, given its own verdict.
    #[inline(always)]
    pub(crate) const fn charged(self, allowed: bool) -> bool {
        match self.charge() {
            Charge::Always => true,
            Charge::IfAllowed => allowed,
            Charge::Never => false,
        }
    }

    /// Whether it is judged as if its integer more units were asked for, and charged its cost
    /// alone ([`Op::judged`]).
    #[cfg(all(test, feature = "redis"))]
    pub(crate) const fn keeps(self) -> bool {
        self.facts().keeps
    }

    /// The units a check of this operation is judged at, for its cost: none for an operation
    /// that acts on its own (judged as a look at cost 0), the cost and the units kept for a
    /// [`Op::Reserve`], else the cost.
    #[inline(always)]
    pub(crate) const fn judged(self, cost: u64) -> u64 {
        match self {
            Op::Reserve { keep } => cost.saturating_add(keep),
            op if op.acts() => 0,
            _ => cost,
        }
    }

    /// Whether the operation changes the state on its own before the look at cost 0 that
    /// reports it (an administrative change, or units given back).
    #[inline(always)]
    pub(crate) const fn acts(self) -> bool {
        self.facts().acts
    }

    /// Whether it changes what the key's state is written under (see [`Facts::relimits`]).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn relimits(self) -> bool {
        self.facts().relimits
    }

    /// How many integers [`Op::args`] adds.
    #[cfg(all(test, feature = "redis"))]
    pub(crate) fn arg_count(self) -> usize {
        self.args(0).len()
    }

    /// Whether the store reports a grant with the outcome: a lease's units, the time a
    /// request booked, the slots a concurrency limit gave it (a `Grant`, in `decision.rs`). Its reply then has
    /// [`Op::REPLY_GRANT`] more integers.
    pub(crate) const fn grants(self) -> bool {
        self.facts().grants
    }

    /// Whether the units it charges are given back when the request ends or goes away
    /// ([`Op::Release`]): a concurrency limit's slots, or the units of a booked time.
    pub(crate) const fn gives_back_later(self) -> bool {
        self.facts().gives_back_later
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
            (op, Some(end)) if op.gives_back_later() => Some(Op::Release { at: end }),
            (_, Some(end)) => Some(Op::GiveBack { end }),
            (op, None) => (op.charged(allowed) && units > 0).then_some(Op::Refund),
        }
    }
}
