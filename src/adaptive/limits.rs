//! The adaptive limits of one policy's keys in this process ([`AdaptiveLimits`]): a key's
//! requests in flight against its limit, the requests queued for it, and what it learnt. A
//! request admitted holds an [`AdaptivePermit`] until its response body ends; told how the
//! response went, the permit is a sample when it is dropped.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::Adaptive;
use super::learn::{Learner, Sample};
use crate::clock::Clock;
use crate::key::Key;

/// Shards of the keys' map.
const SHARDS: usize = 16;

/// Keys a shard holds before it forgets those with nothing in flight or queued.
const KEYS_PER_SHARD: usize = 4_096;

/// Gradient2's windows: at least a second, and 10 samples (as Netflix's concurrency-limits).
const WINDOW: (u64, u32) = (1_000_000, 10);

/// One key's limit in this process.
struct State {
    in_flight: AtomicU32,
    limit: AtomicU32,
    queued: AtomicU32,
    /// Woken once for each request that ends.
    freed: Notify,
    learner: Mutex<Learner>,
}

/// Some of a policy's keys and their states.
type Shard = HashMap<Key, Arc<State>>;

/// What the limits of a policy share with their permits.
struct Shared {
    adaptive: Adaptive,
    /// The policy's name, as the metrics' label.
    label: metrics::SharedString,
}

/// The adaptive limits of one policy's keys in this process.
pub(crate) struct AdaptiveLimits {
    shared: Arc<Shared>,
    hasher: RandomState,
    keys: Box<[RwLock<Shard>]>,
}

impl std::fmt::Debug for AdaptiveLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdaptiveLimits")
            .field("adaptive", &self.shared.adaptive)
            .finish_non_exhaustive()
    }
}

/// What the limit says of a request.
pub(crate) enum Admission {
    /// In: it holds a permit.
    Admitted(AdaptivePermit),
    /// It waits for a request in flight to end: a permit, or `None` when its wait ran out.
    Queued(Pin<Box<dyn Future<Output = Option<AdaptivePermit>> + Send>>),
    /// Over the limit, and no room to wait.
    Shed,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl AdaptiveLimits {
    /// The limits of `adaptive` (checked) for the policy named `name`.
    pub(crate) fn new(adaptive: Adaptive, name: &str) -> Self {
        let label = metrics::SharedString::from(name.to_owned());
        metrics::gauge!("ratelimit_adaptive_limit", "policy" => label.clone())
            .set(f64::from(adaptive.start()));
        AdaptiveLimits {
            shared: Arc::new(Shared { adaptive, label }),
            hasher: RandomState::new(),
            keys: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }

    /// `key`'s state, made when it has none.
    fn state(&self, key: &Key) -> Arc<State> {
        let shard = &self.keys[self.hasher.hash_one(key) as usize % SHARDS];
        // A key seen before is found under the shared lock: requests of one key (a whole
        // route's limit) do not wait for each other here.
        if let Some(state) = read(shard).get(key) {
            return state.clone();
        }
        let mut keys = write(shard);
        if let Some(state) = keys.get(key) {
            return state.clone();
        }
        if keys.len() >= KEYS_PER_SHARD {
            keys.retain(|_, s| {
                s.in_flight.load(Ordering::Relaxed) > 0 || s.queued.load(Ordering::Relaxed) > 0
            });
        }
        let a = &self.shared.adaptive;
        let state = Arc::new(State {
            in_flight: AtomicU32::new(0),
            limit: AtomicU32::new(a.start()),
            queued: AtomicU32::new(0),
            freed: Notify::new(),
            learner: Mutex::new(Learner::new(a.rule, a.start(), a.min, a.max, WINDOW)),
        });
        keys.insert(key.clone(), state.clone());
        state
    }

    /// A request of `key`, timed on `clock`: admitted, queued or shed.
    pub(crate) fn admit(&self, key: &Key, clock: &Arc<dyn Clock>) -> Admission {
        let state = self.state(key);
        let ctx = (self.shared.clone(), clock.clone());
        if let Some(permit) = permit(&state, &ctx) {
            return Admission::Admitted(permit);
        }
        let shed = || {
            metrics::counter!("ratelimit_adaptive_shed_total", "policy" => self.shared.label.clone())
                .increment(1);
            Admission::Shed
        };
        let Some((size, max_wait)) = self.shared.adaptive.queue else {
            return shed();
        };
        let queued = state.queued.fetch_add(1, Ordering::AcqRel);
        if queued >= size {
            state.queued.fetch_sub(1, Ordering::AcqRel);
            return shed();
        }
        Admission::Queued(Box::pin(async move {
            // Out of the queue however the wait ends, the request gone away included.
            let _leaves = Leaves(&state.queued);
            let permit = wait(&state, &ctx, max_wait).await;
            if permit.is_none() {
                metrics::counter!("ratelimit_adaptive_shed_total", "policy" => ctx.0.label.clone())
                    .increment(1);
            }
            permit
        }))
    }

    /// Whether `permit` is one of these limits'.
    pub(crate) fn issued(&self, permit: &AdaptivePermit) -> bool {
        Arc::ptr_eq(&permit.shared, &self.shared)
    }
}

/// Takes one off a queue's count when dropped.
struct Leaves<'a>(&'a AtomicU32);

impl Drop for Leaves<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The limits' shared part, and the clock a permit is timed on.
type Ctx = (Arc<Shared>, Arc<dyn Clock>);

/// A permit of `state`, if a request in flight more stays within its limit.
fn permit(state: &Arc<State>, ctx: &Ctx) -> Option<AdaptivePermit> {
    let limit = state.limit.load(Ordering::Acquire);
    let mut n = state.in_flight.load(Ordering::Acquire);
    loop {
        if n >= limit {
            return None;
        }
        match (state.in_flight).compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(now) => n = now,
        }
    }
    Some(AdaptivePermit {
        state: state.clone(),
        shared: ctx.0.clone(),
        started: ctx.1.now_micros(),
        clock: ctx.1.clone(),
        in_flight: n + 1,
        failed: None,
    })
}

/// Waits up to `max_wait` for a request of `state` to end and leave room: a permit, or
/// `None`.
async fn wait(state: &Arc<State>, ctx: &Ctx, max_wait: Duration) -> Option<AdaptivePermit> {
    let deadline = tokio::time::Instant::now() + max_wait;
    loop {
        let freed = state.freed.notified();
        tokio::pin!(freed);
        // Registered before looking, so an end between the look and the wait is not missed.
        freed.as_mut().enable();
        if let Some(permit) = permit(state, ctx) {
            return Some(permit);
        }
        if tokio::time::timeout_at(deadline, freed).await.is_err() {
            return permit(state, ctx);
        }
    }
}

/// A request in flight, admitted by its key's adaptive limit. Dropped (when its response body
/// ends, or the request goes away), it leaves room for another; told how its response went
/// ([`responded`](Self::responded)), it is a sample of the round trip first.
pub(crate) struct AdaptivePermit {
    state: Arc<State>,
    shared: Arc<Shared>,
    /// When it was admitted (microseconds, on `clock`, the layer's).
    started: u64,
    clock: Arc<dyn Clock>,
    /// The requests in flight once it was admitted.
    in_flight: u32,
    /// Whether its response failed, once known.
    failed: Option<bool>,
}

impl AdaptivePermit {
    /// Its response came: a failure when `failed` (a `5xx`, or the service's error).
    pub(crate) fn responded(&mut self, failed: bool) {
        self.failed = Some(failed);
    }
}

impl Drop for AdaptivePermit {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Some(failed) = self.failed {
            let now = self.clock.now_micros();
            let sample = Sample {
                rtt_us: now.saturating_sub(self.started),
                in_flight: self.in_flight,
                failed,
            };
            let limit = lock(&self.state.learner).learn(now, sample);
            if self.state.limit.swap(limit, Ordering::AcqRel) != limit {
                let label = self.shared.label.clone();
                metrics::gauge!("ratelimit_adaptive_limit", "policy" => label)
                    .set(f64::from(limit));
            }
            let label = self.shared.label.clone();
            metrics::histogram!("ratelimit_adaptive_rtt_seconds", "policy" => label)
                .record(sample.rtt_us as f64 / 1e6);
        }
        self.state.freed.notify_one();
    }
}
