//! [`Escalation`]: how [`Policy::block_on_violation`](crate::Policy::block_on_violation)
//! blocks a key that keeps being denied.

use std::time::Duration;

use crate::algorithm::compact;
use crate::error::ConfigError;
use crate::quota::MAX_WINDOW;

/// How a policy blocks a key that keeps being denied
/// ([`Policy::block_on_violation`](crate::Policy::block_on_violation)): after `denials` denials within a span, the key is denied
/// whatever its state for a duration, `first` for its first block, multiplied by `factor` for
/// each new block that comes within `forget_after` of the last one, up to `at_most`.
///
/// With the defaults, `Escalation::new(Duration::from_secs(10))` blocks a key at its first
/// denial for 10 s, then 20 s, 40 s, ... at most an hour, and forgets the level after a day
/// without a block.
///
/// The level (the `level` label of `ratelimit_blocks_total`) stops at the first whose block
/// is `at_most` long: 10 s doubling to an hour has levels 1 to 10, and a factor of 1 has level
/// 1 only, however long a key keeps being blocked.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::{policy::Escalation, Policy};
///
/// // Blocked after 5 denials within a minute: 1 min, then 2, 4, ... at most a day.
/// let policy = Policy::gcra("10/s").block_on_violation(
///     Escalation::new(Duration::from_secs(60))
///         .after(5, Duration::from_secs(60))
///         .at_most(Duration::from_secs(86_400)),
/// );
/// # let _ = policy;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Escalation {
    first: Duration,
    denials: u32,
    within: Duration,
    factor: u32,
    at_most: Duration,
    forget_after: Duration,
}

impl Escalation {
    /// Blocks of `first` at first, at the first denial, doubling, at most an hour, forgotten
    /// after a day without a block.
    pub fn new(first: Duration) -> Self {
        Escalation {
            first,
            denials: 1,
            within: Duration::from_secs(60),
            factor: 2,
            at_most: Duration::from_secs(3600),
            forget_after: Duration::from_secs(86_400),
        }
    }

    /// Blocks after `denials` denials of the key within `within` (counted from the first
    /// of them), not at the first.
    #[must_use]
    pub fn after(mut self, denials: u32, within: Duration) -> Self {
        self.denials = denials;
        self.within = within;
        self
    }

    /// What each new block's duration is multiplied by (default 2; 1 to 16).
    #[must_use]
    pub fn factor(mut self, factor: u32) -> Self {
        self.factor = factor;
        self
    }

    /// The longest block (default an hour).
    #[must_use]
    pub fn at_most(mut self, at_most: Duration) -> Self {
        self.at_most = at_most;
        self
    }

    /// How long after its last block a key's level is forgotten, its next block the first
    /// again (default a day).
    #[must_use]
    pub fn forget_after(mut self, forget_after: Duration) -> Self {
        self.forget_after = forget_after;
        self
    }

    /// Whether every setting is in its range.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let in_range = |name: &str, d: Duration| {
            if d < Duration::from_millis(1) || d > MAX_WINDOW {
                return Err(ConfigError::new(format!(
                    "block_on_violation: {name} is {d:?}; it must be from 1 ms to {} days",
                    MAX_WINDOW.as_secs() / 86_400
                )));
            }
            Ok(())
        };
        in_range("the first block", self.first)?;
        in_range("the longest block (at_most)", self.at_most)?;
        in_range("the span of the denials (after)", self.within)?;
        in_range("forget_after", self.forget_after)?;
        if self.at_most < self.first {
            return Err(ConfigError::new(
                "block_on_violation: the longest block (at_most) is shorter than the first",
            ));
        }
        if self.denials == 0 || !(1..=16).contains(&self.factor) {
            return Err(ConfigError::new(format!(
                "block_on_violation: {} denials and a factor of {}; a block needs at least 1 denial, and a factor from 1 to 16",
                self.denials, self.factor
            )));
        }
        Ok(())
    }

    /// The duration of a block of `level` (from 1), in microseconds.
    pub(crate) fn block_us(&self, level: u32) -> u64 {
        let (first, most) = (micros(self.first), micros(self.at_most));
        let mut us = first;
        for _ in 1..level {
            us = us.saturating_mul(u64::from(self.factor));
            if us >= most {
                return most;
            }
        }
        us.min(most)
    }

    /// The highest level: the first whose block is `at_most` long (1 with a factor of 1).
    pub(crate) fn top_level(&self) -> u32 {
        let (mut us, most) = (micros(self.first), micros(self.at_most));
        let mut level = 1;
        while us < most && self.factor > 1 {
            us = us.saturating_mul(u64::from(self.factor));
            level += 1;
        }
        level
    }

    /// The denials that block, and the span they are counted in (microseconds).
    pub(crate) fn denials(&self) -> (u32, u64) {
        (self.denials, micros(self.within))
    }

    /// How long a level is remembered after its block, in microseconds.
    pub(crate) fn forget_us(&self) -> u64 {
        micros(self.forget_after)
    }

    /// What the Redis script is told of it, after the tier's tag: `!` and the denials, their
    /// span, the first block, the longest, how long a level is remembered and the factor.
    pub(crate) fn lua_suffix(&self) -> String {
        let numbers = [
            u64::from(self.denials),
            micros(self.within),
            micros(self.first),
            micros(self.at_most),
            micros(self.forget_after),
            u64::from(self.factor),
        ];
        format!("!{}", numbers.map(compact).join(","))
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
