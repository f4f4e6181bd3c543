//! The compiled policies an engine decides with: read in place until a reload replaces them.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::{ArcSwapOption, Guard};

use super::CompiledPolicy;

/// The engine's present policies, compiled. Until the first reload they are the set the layer
/// was built with, read in place: most layers are never reloaded, and their requests then touch
/// no reference count (an `ArcSwap` load is two locked operations). A reload swaps a new set in
/// whole: a request plans with the set it loads, and keeps the tiers it planned with until it is
/// done.
pub(crate) struct PolicySet {
    first: Box<[CompiledPolicy]>,
    /// The set of the last reload; `Some` once `reloaded` is.
    latest: ArcSwapOption<Box<[CompiledPolicy]>>,
    reloaded: AtomicBool,
}

/// A policy set as one request reads it.
pub(crate) enum Loaded<'a> {
    First(&'a [CompiledPolicy]),
    Reloaded(Guard<Option<Arc<Box<[CompiledPolicy]>>>>),
}

impl Deref for Loaded<'_> {
    type Target = [CompiledPolicy];

    #[inline]
    fn deref(&self) -> &[CompiledPolicy] {
        match self {
            Loaded::First(set) => set,
            Loaded::Reloaded(guard) => guard.as_deref().map_or(&[], |set| &set[..]),
        }
    }
}

impl PolicySet {
    pub(crate) fn new(first: Box<[CompiledPolicy]>) -> Self {
        PolicySet {
            first,
            latest: ArcSwapOption::empty(),
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
    pub(crate) fn replace(&self, set: Box<[CompiledPolicy]>) {
        self.latest.store(Some(Arc::new(set)));
        self.reloaded.store(true, Ordering::Release);
    }
}

impl fmt::Debug for PolicySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.load().iter()).finish()
    }
}
