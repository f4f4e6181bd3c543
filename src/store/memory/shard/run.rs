//! One check's way through a decision under the exclusive lock.

use std::sync::Arc;

use crate::algorithm::{Packed, Verdict};
use crate::decision::Grant;
use crate::policy::Tier;

/// One check's way through a decision under the exclusive lock: where its row is, what phase
/// one found, and what phase two granted.
#[derive(Clone, Default)]
pub(crate) struct Run {
    /// The hash of the check's (policy, key).
    pub(super) hash: u64,
    /// The check's shard: its index, then its place among the locked guards.
    pub(super) guard: usize,
    /// The row's place in the table when phase one found one (`None`: a new key).
    pub(super) bucket: Option<usize>,
    pub(super) verdict: Verdict,
    /// For a check denied now that waits: the wait until the time that admits it.
    pub(super) wait: Option<u64>,
    /// For a packed state judged for an enforced check: the state, and as its charge leaves it.
    pub(super) packed: Option<(Packed, Packed)>,
    /// The units granted (a lease, a booked time, concurrency slots).
    pub(super) grant: Option<Grant>,
    /// The key's own limit's tier, when it has one (the outcome reports it).
    pub(super) own: Option<Arc<Tier>>,
    /// A new key charged: inserted once every found row is written (an insert moves rows).
    pub(super) deferred: bool,
}

impl Run {
    pub(crate) fn new(hash: u64, shard: usize) -> Self {
        Run {
            hash,
            guard: shard,
            ..Run::default()
        }
    }

    /// Whether the check, denied now, waits for a later time that admits it.
    pub(crate) fn is_waiting(&self) -> bool {
        self.wait.is_some()
    }

    /// The hash of the check's (policy, key).
    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    /// The check's shard: its index, then its place among the locked guards.
    pub(crate) fn guard(&self) -> usize {
        self.guard
    }

    /// Names the check's shard by its place among the locked guards.
    pub(crate) fn set_guard(&mut self, place: usize) {
        self.guard = place;
    }

    pub(crate) fn verdict(&self) -> Verdict {
        self.verdict
    }

    pub(crate) fn verdict_mut(&mut self) -> &mut Verdict {
        &mut self.verdict
    }

    /// The units the check was granted.
    pub(crate) fn grant(&self) -> Option<Grant> {
        self.grant
    }

    /// The tier of the key's own limit, when it has one (taken: the outcome reports it).
    pub(crate) fn take_own(&mut self) -> Option<Arc<Tier>> {
        self.own.take()
    }

    /// A new key charged: inserted once every found row is written.
    pub(crate) fn defer(&mut self) {
        self.deferred = true;
    }

    /// Whether its charge waits for [`defer`](Self::defer)'s reason.
    pub(crate) fn is_deferred(&self) -> bool {
        self.deferred
    }

    /// Whether phase one found the check's row.
    pub(crate) fn found(&self) -> bool {
        self.bucket.is_some()
    }
}
