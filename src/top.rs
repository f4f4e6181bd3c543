//! Who is being limited right now: a summary of the keys each policy denied, in fixed memory.
//!
//! A per-key metric label would give a metrics backend one series per client, and a flood of
//! made-up keys would bring it down. Instead the layer can keep, per policy, a *heavy-hitters*
//! summary of the keys it denied over a sliding period
//! ([`RateLimitLayerBuilder::top_limited`](crate::RateLimitLayerBuilder::top_limited)), and
//! report the heaviest on demand: [`RateLimitControl::top_limited`](crate::RateLimitControl::top_limited)
//! in code, [`TopLimitedService`] as a JSON admin route.
//!
//! ```
//! use tower_ratelimit::{Policy, RateLimitLayer, key::PeerIp, top::TopLimited};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! let layer = RateLimitLayer::builder()
//!     .key(PeerIp::new())
//!     .policy(Policy::gcra("10/s").name("per-ip"))
//!     // The 256 heaviest denied keys of each policy over the last minute.
//!     .top_limited(TopLimited::new())
//!     .build()?;
//! for limited in layer.control().top_limited("per-ip", 10) {
//!     println!("{}: {} requests denied", limited.text(), limited.count());
//! }
//! # Ok(()) }
//! ```
//!
//! # How it counts
//!
//! The summary is the *space-saving* algorithm (Metwally, Agrawal and El Abbadi, 2005): it
//! holds at most `keys` counters per policy; a denied key without a counter takes the one of
//! the key with the smallest count, and starts from that count. So whatever the flood of
//! distinct keys, the memory is fixed, allocated whole when the layer is built (or reloaded
//! with a new policy), and:
//!
//! * a reported [`count`](LimitedKey::count) is never below the key's true number of denials,
//!   and [`count`](LimitedKey::count) minus [`error`](LimitedKey::error) is never above it;
//! * every key denied more than `total / keys` times in the period is reported, `total`
//!   being all the policy's denials in it ([`TopReport::limited`]): the error of any count is
//!   at most that. (The summary is four shards by key hash, each with a quarter of the
//!   counters, so the bound holds per shard: overall as stated when the denials spread over
//!   the shards, as a flood of distinct keys does.)
//!
//! A key denied steadily while a flood of others churns through the summary keeps its counter
//! and a small error; the error is large only for keys barely above the churn, whose rank
//! among themselves is then uncertain. The summary counts requests denied, one per request,
//! whatever its cost; a shadow policy's summary holds the keys it *would* have denied.
//!
//! The period slides in four steps: a report covers the last `period`, give or take a
//! quarter of it. The summary is this instance's: with several instances behind a load
//! balancer, ask each (a key limited everywhere is at the top everywhere).
//!
//! # Which text a key is reported as
//!
//! A key is reported as its text ([`LimitedKey::text`]): an IP address as written, the global
//! key as `global`, a text key as itself, and bytes that are not printable UTF-8 in hex after
//! `0x`. [`ApiKey`](crate::key::ApiKey) keys are the SHA-256 of the token, so they show as
//! that hash, never the secret; compare with [`ApiKey::key_for`](crate::key::ApiKey::key_for).
//! Where even the key text must stay private (user ids, addresses),
//! [`TopLimited::hashed`] reports each key as its IETF partition key instead: the `pk` the
//! client itself sees in its `RateLimit` header (an HMAC under the secret of
//! [`partition_keys`](crate::RateLimitLayerBuilder::partition_keys)).

use std::fmt::{self, Write as _};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::ConfigError;
use crate::headers::PartitionKeys;
use crate::key::{Key, KeyParts};
use crate::store::lock;

/// Shards of a summary, each behind its own lock: a key always goes to the same one, so a
/// report is the union of the shards, and denials of different keys rarely wait for each
/// other.
const SHARDS: usize = 4;
/// The steps a period slides in.
const STEPS: u64 = 4;
/// The most keys a summary may hold per policy.
pub const MAX_KEYS: usize = 65_536;

/// What [`RateLimitLayerBuilder::top_limited`](crate::RateLimitLayerBuilder::top_limited)
/// keeps: how many keys per policy, over which period, reported how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopLimited {
    keys: usize,
    period: Duration,
    hashed: bool,
}

impl Default for TopLimited {
    fn default() -> Self {
        Self::new()
    }
}

impl TopLimited {
    /// 256 keys per policy over the last 60 seconds, reported as their text: 86 KiB per
    /// policy.
    pub fn new() -> Self {
        TopLimited {
            keys: 256,
            period: Duration::from_secs(60),
            hashed: false,
        }
    }

    /// How many keys each policy's summary holds (1 to [`MAX_KEYS`]): the more, the smaller
    /// the error under a flood of distinct keys (at most `denials / keys`), at about 350
    /// bytes a key.
    pub fn keys(mut self, keys: usize) -> Self {
        self.keys = keys;
        self
    }

    /// The period a report covers (1 second to 1 day), sliding in steps of a quarter of it.
    pub fn period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Reports each key as its IETF partition key (`pk`) instead of its text; the layer must
    /// have a [`partition_keys`](crate::RateLimitLayerBuilder::partition_keys) secret.
    pub fn hashed(mut self) -> Self {
        self.hashed = true;
        self
    }

    fn validate(&self, partition: Option<&PartitionKeys>) -> Result<(), ConfigError> {
        if !(1..=MAX_KEYS).contains(&self.keys) {
            return Err(ConfigError::new(format!(
                "top_limited: {} keys per policy; it takes 1 to {MAX_KEYS}",
                self.keys
            )));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&self.period) {
            return Err(ConfigError::new(format!(
                "top_limited: a period of {:?}; it takes 1 second to 1 day",
                self.period
            )));
        }
        if self.hashed && partition.is_none() {
            return Err(ConfigError::new(
                "top_limited: hashed() reports keys as their partition key, so the layer needs \
                 partition_keys(secret) too",
            ));
        }
        Ok(())
    }
}

/// One of the keys a policy denied most, as [`RateLimitControl::top_limited`](crate::RateLimitControl::top_limited)
/// reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitedKey {
    key: Option<Key>,
    text: String,
    count: u64,
    error: u64,
}

impl LimitedKey {
    /// The key, unless the summary reports keys [`hashed`](TopLimited::hashed).
    pub fn key(&self) -> Option<&Key> {
        self.key.as_ref()
    }

    /// The key as text, or its partition key when [`hashed`](TopLimited::hashed) (see the
    /// [module docs](self)).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How many requests of this key the policy denied in the period: never fewer than it
    /// did, at most [`error`](Self::error) more.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// How much [`count`](Self::count) may overstate (0: it is exact).
    pub fn error(&self) -> u64 {
        self.error
    }
}

/// A policy's heaviest denied keys, with how many requests it denied in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopReport {
    policy: String,
    limited: u64,
    keys: Vec<LimitedKey>,
    near_limit: u64,
    near_keys: Vec<LimitedKey>,
}

impl TopReport {
    /// The policy's name.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// How many requests the policy denied in the period (exactly).
    pub fn limited(&self) -> u64 {
        self.limited
    }

    /// The heaviest keys, the heaviest first.
    pub fn keys(&self) -> &[LimitedKey] {
        &self.keys
    }

    /// How many warnings of keys near their limit the policy gave in the period
    /// ([`Policy::near_limit`](crate::Policy::near_limit): at most one per key and window).
    pub fn near_limit(&self) -> u64 {
        self.near_limit
    }

    /// The keys the policy warned of most, near their limit, the most first (a key's
    /// [`count`](LimitedKey::count) is its warnings: its windows that reached the share).
    pub fn near_keys(&self) -> &[LimitedKey] {
        &self.near_keys
    }

    pub(crate) fn into_keys(self) -> Vec<LimitedKey> {
        self.keys
    }
}

/// One policy's summaries in one shard: one per step of the period.
struct Steps {
    policy: Box<str>,
    steps: Box<[Summary]>,
    /// The same, of the keys warned of near their limit
    /// ([`Policy::near_limit`](crate::Policy::near_limit)), made at the first.
    near: Option<Box<[Summary]>>,
}

/// The heavy-hitters summaries of a layer: per policy, per shard, per step.
pub(crate) struct Tracker {
    shards: [Mutex<Vec<Steps>>; SHARDS],
    /// Entries per summary.
    capacity: usize,
    /// The length of a step, in microseconds.
    step: u64,
    period: Duration,
    partition: Option<PartitionKeys>,
    hasher: RandomState,
}

impl fmt::Debug for Tracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracker")
            .field("capacity", &(self.capacity * SHARDS))
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

impl Tracker {
    /// A tracker as `config` says, for the policies named; `partition` is the layer's
    /// partition keys, if any.
    pub(crate) fn new<'a>(
        config: &TopLimited,
        partition: Option<&PartitionKeys>,
        policies: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, ConfigError> {
        config.validate(partition)?;
        let micros = u64::try_from(config.period.as_micros()).unwrap_or(u64::MAX);
        let tracker = Tracker {
            shards: Default::default(),
            capacity: config.keys.div_ceil(SHARDS),
            step: (micros / STEPS).max(1),
            period: config.period,
            partition: config.hashed.then(|| partition.cloned()).flatten(),
            hasher: RandomState::new(),
        };
        tracker.set_policies(policies);
        Ok(tracker)
    }

    /// The policies are now these, in this order: the summaries of the others are dropped,
    /// and those of new ones made (all the memory a policy's summary will ever take).
    pub(crate) fn set_policies<'a>(&self, policies: impl IntoIterator<Item = &'a str>) {
        let policies: Vec<&str> = policies.into_iter().collect();
        for shard in &self.shards {
            let mut shard = lock(shard);
            let mut old = std::mem::take(&mut *shard);
            *shard = policies
                .iter()
                .map(|&name| match old.iter().position(|s| *s.policy == *name) {
                    Some(at) => old.swap_remove(at),
                    None => Steps {
                        policy: name.into(),
                        steps: self.summaries(),
                        near: None,
                    },
                })
                .collect();
        }
    }

    /// A summary per step.
    fn summaries(&self) -> Box<[Summary]> {
        (0..STEPS).map(|_| Summary::new(self.capacity)).collect()
    }

    /// The present policies' names, in order (every shard holds them all).
    fn policies(&self) -> Vec<Box<str>> {
        lock(&self.shards[0])
            .iter()
            .map(|s| s.policy.clone())
            .collect()
    }

    /// Counts a request of `key` that `policy` denied at `now` (microseconds); nothing when
    /// the policy is no longer present (a request planned before a reload).
    pub(crate) fn record(&self, policy: &str, key: &Key, now: u64) {
        self.count(policy, key, now, false);
    }

    /// Counts a warning of `key` near its limit in `policy` at `now`.
    pub(crate) fn record_near(&self, policy: &str, key: &Key, now: u64) {
        self.count(policy, key, now, true);
    }

    /// Counts `key` in `policy`'s summaries of denials, or of warnings (`near`).
    fn count(&self, policy: &str, key: &Key, now: u64, near: bool) {
        let hash = self.hasher.hash_one(key);
        // The low bits pick the shard; the table uses the high ones.
        let mut shard = lock(&self.shards[hash as usize % SHARDS]);
        let Some(steps) = shard.iter_mut().find(|s| *s.policy == *policy) else {
            return;
        };
        let steps = match near {
            false => &mut steps.steps,
            true => steps.near.get_or_insert_with(|| self.summaries()),
        };
        let step = now / self.step;
        let summary = &mut steps[(step % STEPS) as usize];
        if summary.step < step || summary.total == 0 {
            summary.clear(step);
        }
        summary.add(key, hash, 1);
    }

    /// The `n` keys `policy` denied most in the period up to `now`, and the `n` it warned of
    /// most.
    pub(crate) fn top(&self, policy: &str, n: usize, now: u64) -> TopReport {
        let (limited, keys) = self.heaviest(policy, n, now, |s| Some(&s.steps));
        let (near_limit, near_keys) = self.heaviest(policy, n, now, |s| s.near.as_ref());
        TopReport {
            policy: policy.to_owned(),
            limited,
            keys,
            near_limit,
            near_keys,
        }
    }

    /// The `n` heaviest keys of `policy`'s summaries that `pick` picks, and their total.
    fn heaviest(
        &self,
        policy: &str,
        n: usize,
        now: u64,
        pick: impl Fn(&Steps) -> Option<&Box<[Summary]>>,
    ) -> (u64, Vec<LimitedKey>) {
        let step = now / self.step;
        let live = |s: &&Summary| s.total > 0 && s.step <= step && step - s.step < STEPS;
        let mut limited = 0;
        let mut found: Vec<(String, Key, u64, u64)> = Vec::new();
        for shard in &self.shards {
            let shard = lock(shard);
            let Some(steps) = shard.iter().find(|s| *s.policy == *policy).and_then(&pick) else {
                continue;
            };
            let live: Vec<&Summary> = steps.iter().filter(live).collect();
            for (at, summary) in live.iter().enumerate() {
                limited += summary.total;
                for e in &summary.heap {
                    // Each key once: from the first live step that holds it.
                    if live[..at].iter().any(|s| s.find(&e.key, e.hash).is_some()) {
                        continue;
                    }
                    let (count, error) = summed(&live, &e.key, e.hash);
                    found.push((text_of(&e.key), e.key.clone(), count, error));
                }
            }
        }
        // The heaviest first; the surest of equal counts, then by text.
        found.sort_by(|a, b| b.2.cmp(&a.2).then(a.3.cmp(&b.3)).then(a.0.cmp(&b.0)));
        found.truncate(n);
        let keys = found
            .into_iter()
            .map(|(text, key, count, error)| match &self.partition {
                Some(partition) => LimitedKey {
                    text: partition.of(&key),
                    key: None,
                    count,
                    error,
                },
                None => LimitedKey {
                    text,
                    key: Some(key),
                    count,
                    error,
                },
            })
            .collect();
        (limited, keys)
    }

    /// [`Tracker::top`] of every present policy.
    pub(crate) fn top_all(&self, n: usize, now: u64) -> Vec<TopReport> {
        let policies = self.policies();
        policies.iter().map(|p| self.top(p, n, now)).collect()
    }

    /// The bytes the summaries hold.
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> usize {
        let shards = self.shards.iter().map(|shard| {
            let shard = lock(shard);
            let summaries = shard.iter().flat_map(|s| s.steps.iter());
            summaries.map(Summary::footprint).sum::<usize>()
        });
        shards.sum()
    }
}

/// A key's count and error over the `live` steps of its policy: its own where a step holds
/// it, else that step's floor (what it may have had without being kept).
fn summed(live: &[&Summary], key: &Key, hash: u64) -> (u64, u64) {
    let (mut count, mut error) = (0, 0);
    for s in live {
        match s.find(key, hash) {
            Some(held) => {
                count += held.count;
                error += held.error;
            }
            None => {
                count += s.floor();
                error += s.floor();
            }
        }
    }
    (count, error)
}

/// A key's text: see the [module docs](self).
fn text_of(key: &Key) -> String {
    let hex = |prefix: &str, bytes: &[u8]| {
        let mut hex = String::with_capacity(prefix.len() + 2 * bytes.len());
        hex.push_str(prefix);
        for b in bytes {
            let _ = write!(hex, "{b:02x}");
        }
        hex
    };
    match key.parts() {
        KeyParts::Global => "global".into(),
        KeyParts::Ip(ip) => ip.to_string(),
        KeyParts::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) if !text.is_empty() && !text.chars().any(char::is_control) => text.into(),
            _ => hex("0x", bytes),
        },
        // A key longer than 64 bytes, kept as the first half of its SHA-256.
        KeyParts::Hashed(digest) => hex("sha256/128:", digest),
    }
}

mod service;
mod summary;

use summary::Summary;

pub use service::TopLimitedService;

#[cfg(test)]
mod tests;
