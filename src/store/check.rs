//! What a store is asked: one [`Check`] per policy that applies to a request, each making one
//! [`Op`], decided together.

use std::sync::Arc;

use smallvec::SmallVec;

use super::Op;
use crate::key::Key;
use crate::policy::Tier;

/// The checks of one decision, one per policy that applies (two are kept without allocating).
pub(crate) type Checks = SmallVec<[Check; 2]>;

/// One enforced policy of several decided together on borrowed values (see
/// `Sealed::check_together`): its tier, the key and the cost.
pub(crate) type Enforced<'a> = (&'a Arc<Tier>, &'a Key, u64);

/// One operation on one tier of one policy, for one key, of some units. A request keeps a
/// clone of its checks once they are sent when the deny cache, the top limited keys, the IETF
/// `pk` or what to give back need them.
#[derive(Clone, Debug)]
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

    /// The key of the tier `tier` among `kept`.
    pub(crate) fn key_of(kept: &[Check], tier: u32) -> Option<&Key> {
        kept.iter().find(|c| c.tier.id() == tier).map(|c| &c.key)
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
