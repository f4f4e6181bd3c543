//! What a store is asked: one [`Check`] per policy that applies to a request, each making one
//! [`Op`], decided together.

use std::sync::Arc;

use smallvec::SmallVec;

use super::Op;
use crate::key::Key;
use crate::policy::Tier;

/// What is kept of a request's check once it is sent: its tier's id, its key and its cost
/// (for the deny cache, the top limited keys, the IETF `pk` and the slots to give back).
#[derive(Clone, Debug)]
pub(crate) struct Keyed {
    tier: u32,
    key: Key,
    cost: u64,
}

impl Keyed {
    pub(crate) fn new(tier: u32, key: Key, cost: u64) -> Keyed {
        Keyed { tier, key, cost }
    }

    /// What is kept of `check`.
    pub(crate) fn of(check: &Check) -> Keyed {
        Keyed::new(check.tier().id(), check.key().clone(), check.cost())
    }

    /// The check's tier id.
    pub(crate) fn tier(&self) -> u32 {
        self.tier
    }

    /// The check's key.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// The check's cost.
    pub(crate) fn cost(&self) -> u64 {
        self.cost
    }

    /// The key of the tier `tier` among `kept`.
    pub(crate) fn key_of(kept: &[Keyed], tier: u32) -> Option<&Key> {
        kept.iter().find(|k| k.tier == tier).map(|k| &k.key)
    }
}

/// The checks of one decision, one per policy that applies (two are kept without allocating).
pub(crate) type Checks = SmallVec<[Check; 2]>;

/// One enforced policy of several decided together on borrowed values (see
/// `Sealed::check_together`): its tier, the key and the cost.
pub(crate) type Enforced<'a> = (&'a Arc<Tier>, &'a Key, u64);

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

    /// The same check of `cost` units.
    pub(crate) fn with_cost(self, cost: u64) -> Check {
        Check { cost, ..self }
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
