//! Warnings before the limit ([`Policy::near_limit`](crate::Policy::near_limit)): which keys
//! this instance has warned of in their present window, and the hook a warning is handed to.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::key::Key;
use crate::store::lock;

/// A key that reached the share of its limit its policy warns at, handed to the hook of
/// [`on_near_limit`](crate::RateLimitLayerBuilder::on_near_limit).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NearLimit {
    /// The policy (or policy tier) named.
    pub policy: String,
    /// The key.
    pub key: Key,
    /// The limit the key is under.
    pub limit: u64,
    /// What the key has left.
    pub remaining: u64,
    /// When the key is fresh again: no warning of it until then.
    pub reset_after: Duration,
}

/// The hook a warning is handed to, off the request's path.
pub(crate) type NearHook =
    Arc<dyn Fn(NearLimit) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Shards of the warned keys (a key's shard from its hash).
const SHARDS: usize = 16;
/// Keys held per shard before those whose window ended are forgotten; past it again, the
/// shard is emptied (a key may then be warned of twice in a window, never missed).
const PER_SHARD: usize = 4096;

/// Hooks running at once, at most: past it a warning is counted
/// (`ratelimit_near_limit_hook_dropped_total`), not queued, so a hook slower than the
/// warnings come cannot grow the tasks without bound.
pub(crate) const HOOKS_IN_FLIGHT: usize = 256;

/// The keys warned of, each until its window ends: (tier id, key) to the end, on the
/// layer's clock.
pub(crate) struct Warned {
    shards: [Mutex<HashMap<(u32, Key), u64>>; SHARDS],
    hasher: std::hash::RandomState,
    hook: Option<NearHook>,
    /// Hooks running now.
    in_flight: Arc<AtomicUsize>,
}

/// A hook's place among [`HOOKS_IN_FLIGHT`], given back when its task ends or is dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Warned {
    pub(crate) fn new(hook: Option<NearHook>) -> Self {
        Warned {
            shards: Default::default(),
            hasher: Default::default(),
            hook,
            in_flight: Arc::default(),
        }
    }

    /// Whether `key` of the tier `id` is warned of now (`now`), not yet in its window,
    /// which ends at `until`.
    pub(crate) fn first(&self, id: u32, key: &Key, now: u64, until: u64) -> bool {
        let hash = self.hasher.hash_one((id, key)) as usize;
        let mut shard = lock(&self.shards[hash % SHARDS]);
        if shard.len() >= PER_SHARD {
            shard.retain(|_, end| *end > now);
            if shard.len() >= PER_SHARD {
                shard.clear();
            }
        }
        let end = shard.entry((id, key.clone())).or_insert(0);
        if *end > now {
            return false;
        }
        *end = until;
        true
    }

    /// Hands `warning` to the hook, if there is one, on a task of its own; counted under
    /// `policy` instead when [`HOOKS_IN_FLIGHT`] hooks are running.
    pub(crate) fn hand(
        &self,
        policy: impl FnOnce() -> metrics::SharedString,
        warning: impl FnOnce() -> NearLimit,
    ) {
        if let Some(hook) = &self.hook
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            if self.in_flight.fetch_add(1, Ordering::Relaxed) >= HOOKS_IN_FLIGHT {
                self.in_flight.fetch_sub(1, Ordering::Relaxed);
                let name = "ratelimit_near_limit_hook_dropped_total";
                metrics::counter!(name, "policy" => policy()).increment(1);
                return;
            }
            let place = InFlight(self.in_flight.clone());
            let future = hook(warning());
            runtime.spawn(async move {
                let _place = place;
                future.await;
            });
        }
    }
}

impl fmt::Debug for Warned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Warned")
            .field("hook", &self.hook.is_some())
            .finish_non_exhaustive()
    }
}
