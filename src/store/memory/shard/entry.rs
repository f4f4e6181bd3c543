//! A key's state in its row: packed in the row itself (`Cell::Packed`) or boxed (`Unpacked`), with
//! what an administrator set on the key (`Marks`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::atomic::{AtomicU32, AtomicU64};

use crate::algorithm::{Compiled, Packed, State};
use crate::policy::Tier;

/// Where a row keeps its state.
pub(super) enum Cell {
    /// A state that packs ([`Kernel::pack`](crate::algorithm::Kernel::pack)) in a word, which is
    /// also when it expires, and a count, and no block: the common case, decided under the
    /// shared lock. The count sits beside the enum's tag: the cell stays 16 bytes.
    Packed { count: AtomicU32, word: AtomicU64 },
    /// Anything else: the state of an algorithm that does not pack, or a blocked key.
    Full(Box<Unpacked>),
}

/// A key's state as the exclusive path reads and changes it.
pub(super) struct Unpacked {
    pub(super) state: Option<State>,
    pub(super) expires_at: u64,
    /// A block or a limit of the key's own, if it ever had one (boxed: most keys never do,
    /// and an entry stays within a 48-byte allocation).
    pub(super) marks: Option<Box<Marks>>,
}

/// What an administrator set on a key.
#[derive(Clone, Debug, Default)]
pub(super) struct Marks {
    /// Denied whatever the state until then (0: not blocked).
    pub(super) blocked_until: u64,
    /// The key's own limit, if one is set: its state is written under it.
    pub(super) limit: Option<Arc<Limit>>,
    /// Its denials and blocks, under a policy that blocks on violation.
    pub(super) strikes: Strikes,
}

/// A key's denials and blocks under a policy that blocks on violation
/// ([`Escalation`](crate::policy::Escalation)), all on the store's clock: the twin of the record
/// `<key>!` of the Redis script.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Strikes {
    /// Denials counted since `first`.
    pub(super) denials: u32,
    pub(super) first: u64,
    /// The level of the last block, when it started, and when it ends.
    pub(super) level: u32,
    pub(super) last: u64,
    pub(super) until: u64,
}

impl Marks {
    /// Whether nothing is marked.
    pub(super) fn is_empty(&self) -> bool {
        self.blocked_until == 0 && self.limit.is_none() && self.strikes == Strikes::default()
    }
}

/// A key's own limit (`RateLimitControl::set_limit`): its policy's tier with the key's quota
/// (which the key's outcomes report), until `until`.
#[derive(Debug)]
pub(super) struct Limit {
    pub(super) tier: Arc<Tier>,
    pub(super) until: u64,
}

impl Unpacked {
    /// What the `packed` state of `algorithm` holds.
    pub(super) fn packed(algorithm: &Compiled, packed: Packed) -> Self {
        Unpacked::unblocked(algorithm.unpack(packed), packed.word())
    }

    /// A state that expires at `expires_at`, not blocked.
    pub(super) fn unblocked(state: Option<State>, expires_at: u64) -> Self {
        Unpacked {
            state,
            expires_at,
            marks: None,
        }
    }

    /// Denied whatever the state until then (0: not blocked).
    pub(super) fn blocked_until(&self) -> u64 {
        self.marks.as_ref().map_or(0, |m| m.blocked_until)
    }

    /// The key's own limit, if one is set.
    pub(super) fn limit(&self) -> Option<&Arc<Limit>> {
        self.marks.as_ref()?.limit.as_ref()
    }

    /// The marks, made when the key has none.
    pub(super) fn marks_mut(&mut self) -> &mut Marks {
        self.marks.get_or_insert_with(Default::default)
    }

    /// The same entry (the state cloned).
    pub(super) fn copy(&self) -> Unpacked {
        Unpacked {
            state: self.state.clone(),
            expires_at: self.expires_at,
            marks: self.marks.clone(),
        }
    }

    /// The algorithm the state is written under: the key's own limit's, else `tier`'s.
    pub(super) fn algorithm<'a>(&'a self, tier: &'a Compiled) -> &'a Compiled {
        self.limit().map_or(tier, |l| l.tier.algorithm())
    }

    /// Changes the state with the algorithm it is written under (see
    /// [`algorithm`](Self::algorithm)); `change` returns the state's new expiry (`None`:
    /// unchanged), which the key's own limit may only make later, and what it made.
    #[inline]
    pub(super) fn change<R>(
        &mut self,
        tier: &Compiled,
        change: impl FnOnce(&Compiled, &mut Option<State>) -> (Option<u64>, R),
    ) -> R {
        let limit = self.limit().cloned();
        let algorithm = limit.as_deref().map_or(tier, |l| l.tier.algorithm());
        let (expires_at, out) = change(algorithm, &mut self.state);
        if let Some(expires_at) = expires_at {
            self.expires_at = expires_at.max(limit.map_or(0, |l| l.until));
        }
        out
    }

    /// The state, unless it has expired (then the key is as good as fresh).
    pub(super) fn live(&self, now: u64) -> Option<&State> {
        if self.expires_at <= now {
            None
        } else {
            self.state.as_ref()
        }
    }
}

impl Cell {
    /// The cell that holds `entry` of `algorithm`: packed when it can be.
    pub(super) fn new(algorithm: &Compiled, entry: Unpacked) -> Self {
        match Cell::packing(algorithm, &entry) {
            Some(packed) => Cell::packed(packed),
            None => Cell::Full(Box::new(entry)),
        }
    }

    /// A packed cell holding `packed`.
    pub(super) fn packed(packed: Packed) -> Self {
        Cell::Packed {
            count: AtomicU32::new(packed.count()),
            word: AtomicU64::new(packed.word()),
        }
    }

    /// Writes `packed` in a packed cell, under the exclusive lock (no decision holds its word).
    pub(super) fn set(count: &mut AtomicU32, word: &mut AtomicU64, packed: Packed) {
        word.store(packed.word(), Ordering::Relaxed);
        count.store(packed.count(), Ordering::Relaxed);
    }

    /// A packed cell's state, read where no decision can hold its word (see `claim.rs`).
    pub(super) fn load(count: &AtomicU32, word: &AtomicU64) -> Packed {
        Packed::new(word.load(Ordering::Relaxed), count.load(Ordering::Relaxed))
    }

    /// What `entry` packs in, if it does: its algorithm packs, it was never blocked (a
    /// block is kept once it ends, as the Redis store keeps it, for a clock that goes back),
    /// and it expires when its state says.
    pub(super) fn packing(algorithm: &Compiled, entry: &Unpacked) -> Option<Packed> {
        if entry.marks.is_some() {
            return None;
        }
        let packed = algorithm.pack(entry.state.as_ref())?;
        (packed.word() == entry.expires_at || entry.state.is_none()).then_some(packed)
    }
}
