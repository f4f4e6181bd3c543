//! An adaptive rate for an upstream that refuses calls without saying when or how much
//! (a `429` and no header): the key's limits lowered on each such refusal (multiplicative
//! decrease), raised back a step at a time while calls are answered (additive increase), as
//! a key's own limit in the store, so that every instance sends at the rate learned.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{ConfigError, LimitError};
use crate::key::Key;
use crate::layer::RateLimitLayer;
use crate::policy::{Policy, Tier};
use crate::quota::Quota;
use crate::store::Store;

/// How an egress layer finds the rate of an upstream that refuses without saying when
/// ([`EgressLayerBuilder::adaptive`](super::EgressLayerBuilder::adaptive)).
///
/// A call refused with `429` or `503` and no time or count to learn from lowers each of the
/// key's policies to [`decrease`](Self::decrease) times the limit that admitted it (never
/// below [`floor`](Self::floor) of the configured limit). While calls are answered, the
/// limit goes back up by [`increase`](Self::increase) of the configured limit at most once
/// every [`raise_every`](Self::raise_every), for every instance together, up to the
/// configured limit. A lowered limit is a key's own limit in the store
/// ([`RateLimitControl::set_limit`](crate::RateLimitControl::set_limit)): every instance sends at it, and it ends
/// [`forget_after`](Self::forget_after) its last change without news.
///
/// Refusals of calls admitted under the same limit all lower it to the same value: a burst
/// of refusals halves the rate once, not once per call.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveRate {
    decrease: f64,
    increase: f64,
    floor: f64,
    raise_every: Duration,
    forget_after: Duration,
}

impl Default for AdaptiveRate {
    fn default() -> Self {
        AdaptiveRate::new()
    }
}

impl AdaptiveRate {
    /// Halves on a refusal, raises by a tenth of the configured limit every 5 s, never below
    /// a tenth, forgets after 10 minutes.
    pub fn new() -> Self {
        AdaptiveRate {
            decrease: 0.5,
            increase: 0.1,
            floor: 0.1,
            raise_every: Duration::from_secs(5),
            forget_after: Duration::from_secs(600),
        }
    }

    /// What a refusal multiplies the limit by (above 0, below 1; default 0.5).
    pub fn decrease(mut self, factor: f64) -> Self {
        self.decrease = factor;
        self
    }

    /// The share of the configured limit a raise adds (above 0, at most 1; default 0.1), at
    /// least one unit.
    pub fn increase(mut self, share: f64) -> Self {
        self.increase = share;
        self
    }

    /// The lowest limit, as a share of the configured one (above 0, at most 1; default 0.1),
    /// at least one unit.
    pub fn floor(mut self, share: f64) -> Self {
        self.floor = share;
        self
    }

    /// The time between two raises of a key's limit, across instances (default 5 s).
    pub fn raise_every(mut self, every: Duration) -> Self {
        self.raise_every = every;
        self
    }

    /// How long a lowered limit lasts after its last change (default 10 minutes): an
    /// upstream not called for that long is tried at the configured limit again.
    pub fn forget_after(mut self, after: Duration) -> Self {
        self.forget_after = after;
        self
    }

    /// The mistakes, as the layer's build reports them.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let share = |x: f64| x > 0.0 && x <= 1.0;
        if !(self.decrease > 0.0 && self.decrease < 1.0) {
            return Err(ConfigError::new(
                "an adaptive rate's decrease must be above 0 and below 1",
            ));
        }
        if !share(self.increase) || !share(self.floor) {
            return Err(ConfigError::new(
                "an adaptive rate's increase and floor must be above 0 and at most 1",
            ));
        }
        let window = |d: Duration| !d.is_zero() && d <= crate::MAX_WINDOW;
        if !window(self.raise_every) || !window(self.forget_after) {
            return Err(ConfigError::new(
                "an adaptive rate's raise_every and forget_after must be above zero and at most MAX_WINDOW",
            ));
        }
        Ok(())
    }
}

/// An egress layer's adaptive rate at work: its settings, the gate that lets one raise of a
/// key through every `raise_every` across instances (charged by a lowering too), and this instance's next try of the gate
/// by key (so that a call answered does not ask the store each time).
pub(super) struct Adapt<St> {
    rate: AdaptiveRate,
    gate: RateLimitLayer<St>,
    next_try: Mutex<HashMap<Key, u64>>,
}

/// A change of a key's limit in one policy: its tier, and the limit (`None`: the configured).
pub(super) type Change = (Arc<Tier>, Option<u64>);

impl<St: Store> Adapt<St> {
    pub(super) fn new(
        rate: AdaptiveRate,
        store: St,
        clock: Option<Arc<dyn crate::Clock>>,
    ) -> Result<Self, ConfigError> {
        rate.check()?;
        let every = Quota::new(1, rate.raise_every).map_err(ConfigError::from)?;
        let mut builder = RateLimitLayer::builder()
            .store(store)
            .policy(Policy::gcra(every).name("egress_raise"));
        if let Some(clock) = clock {
            builder = builder.clock(clock);
        }
        Ok(Adapt {
            rate,
            gate: builder.build()?,
            next_try: Mutex::new(HashMap::new()),
        })
    }

    /// The lower limits of the policies (`seen`: each tier, with the limit that admitted the
    /// call) after a refusal.
    pub(super) fn lowered<'t>(
        &self,
        seen: impl Iterator<Item = (&'t Arc<Tier>, u64)>,
        configured: impl Fn(&Tier) -> u64,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        for (tier, limit) in seen {
            let floor = ((configured(tier) as f64 * self.rate.floor).ceil() as u64).max(1);
            let lower = ((limit as f64 * self.rate.decrease).floor() as u64).max(floor);
            if lower < limit {
                changes.push((tier.clone(), Some(lower)));
            }
        }
        changes
    }

    /// The higher limits of the policies lowered before (`None` when none is), if this
    /// instance may try to raise them now.
    pub(super) fn raised<'t>(
        &self,
        key: &Key,
        now_us: u64,
        seen: impl Iterator<Item = (&'t Arc<Tier>, u64)>,
        configured: impl Fn(&Tier) -> u64,
    ) -> Option<Vec<Change>> {
        let mut changes = Vec::new();
        // Only a key under a limit of its own (a lowered one) is raised: a policy's share of
        // a reserve reports less than its quota, and is not lowered.
        for (tier, limit) in seen.filter(|(t, _)| t.own_quota().is_some()) {
            let full = configured(tier);
            if limit < full {
                let step = ((full as f64 * self.rate.increase).round() as u64).max(1);
                let higher = limit.saturating_add(step);
                changes.push((tier.clone(), (higher < full).then_some(higher)));
            }
        }
        if changes.is_empty() {
            return None;
        }
        let mut next_try = self.next_try.lock().unwrap_or_else(|e| e.into_inner());
        if next_try.get(key).is_some_and(|&next| now_us < next) {
            return None;
        }
        let every = self.rate.raise_every.as_micros() as u64;
        remember(&mut next_try, key, now_us, now_us.saturating_add(every));
        Some(changes)
    }

    /// Holds the raises of `key` back for `raise_every` from now: a limit just lowered is not
    /// raised by the next answer.
    pub(super) async fn hold_raises(&self, key: &Key, now_us: u64) {
        let every = self.rate.raise_every.as_micros() as u64;
        {
            let mut next_try = self.next_try.lock().unwrap_or_else(|e| e.into_inner());
            remember(&mut next_try, key, now_us, now_us.saturating_add(every));
        }
        if let Err(error) = self
            .gate
            .control()
            .block_for(key, self.rate.raise_every)
            .await
        {
            tracing::warn!(%error, "an adaptive limit's next raise could not be kept in the store");
        }
    }

    /// Whether the gate lets a raise of `key` through now (one every `raise_every` across
    /// instances); a store that cannot answer lets none.
    pub(super) async fn may_raise(&self, key: &Key) -> bool {
        matches!(self.gate.check(key, 1).await, Ok(d) if d.is_allowed())
    }

    /// Until when (the layer's microseconds) a limit set at `now_us` lasts.
    pub(super) fn until(&self, now_us: u64) -> u64 {
        now_us.saturating_add(self.rate.forget_after.as_micros() as u64)
    }
}

/// The most keys an instance remembers the next try of a raise for.
const MOST_TRIES: usize = 10_000;

/// Remembers `key`'s next try at `next` (it is `now_us`), within [`MOST_TRIES`] keys: when
/// they are all there, the tries past are forgotten, else the earliest (a key forgotten is
/// let try the gate, which holds it across instances).
fn remember(next_try: &mut HashMap<Key, u64>, key: &Key, now_us: u64, next: u64) {
    if next_try.len() >= MOST_TRIES && !next_try.contains_key(key) {
        next_try.retain(|_, &mut at| at > now_us);
        if next_try.len() >= MOST_TRIES {
            let earliest = (next_try.iter())
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone());
            if let Some(earliest) = earliest {
                next_try.remove(&earliest);
            }
        }
    }
    next_try.insert(key.clone(), next);
}

/// Sets `changes` of `key`'s limits in `layer`, lasting until `until_us`; counted.
pub(super) async fn apply<St: Store>(
    layer: &RateLimitLayer<St>,
    key: &Key,
    changes: &[Change],
    until_us: u64,
    direction: &'static str,
) {
    for (tier, limit) in changes {
        let window = Duration::from_micros(tier.window_us());
        let quota = match limit {
            Some(limit) => match u32::try_from(*limit).ok().map(|l| Quota::new(l, window)) {
                Some(Ok(quota)) => Some(quota),
                _ => continue,
            },
            None => None,
        };
        let changed = match layer
            .controls()
            .limit_key(tier.name(), key, quota, until_us)
        {
            Ok(answer) => answer.await.map_err(LimitError::Store),
            Err(error) => Err(error),
        };
        match changed {
            Ok(_) => {
                let policy = tier.label();
                metrics::counter!("ratelimit_egress_adapted_total", "policy" => policy, "direction" => direction)
                    .increment(1);
            }
            Err(error) => {
                tracing::warn!(%error, "an adaptive limit could not be kept in the store")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Adapt, AdaptiveRate, MOST_TRIES};
    use crate::key::Key;
    use crate::store::MemoryStore;

    #[tokio::test]
    async fn the_next_tries_remembered_are_bounded() {
        let adapt = Adapt::new(AdaptiveRate::new(), MemoryStore::new(), None).unwrap();
        let tries = || adapt.next_try.lock().unwrap().len();
        // Lowerings hold the raises of more keys than are remembered, all in the future.
        for k in 0..MOST_TRIES as u64 + 50 {
            adapt.hold_raises(&Key::from(k), 1_000 + k).await;
            assert!(tries() <= MOST_TRIES, "{} after {k}", tries());
        }
        assert_eq!(tries(), MOST_TRIES);
        // The earliest was forgotten; a key held later is remembered.
        let next = |k: u64| adapt.next_try.lock().unwrap().get(&Key::from(k)).copied();
        assert_eq!(next(0), None);
        assert!(next(MOST_TRIES as u64 + 49).is_some());
        // Once their tries are past, they make room at once.
        let later = 100_000_000;
        adapt.hold_raises(&Key::from("late"), later).await;
        assert_eq!(tries(), 1);
    }
}
