//! Policies: an algorithm, a quota and a name.

use std::fmt;
use std::sync::Arc;

use crate::algorithm::{Algorithm, Compiled, Options};
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::quota::Quota;

/// One rate limit: an [`Algorithm`] applied to a [`Quota`], under a name.
///
/// Mistakes (a quota string that does not parse, a burst on an algorithm without one, numbers
/// too large) are kept and reported by
/// [`RateLimitLayerBuilder::build`](crate::RateLimitLayerBuilder::build), so a whole
/// configuration can be written without a `?` on every line:
///
/// ```
/// use tower_ratelimit::{Algorithm, Policy, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::token_bucket("100/min").burst(20).name("api"))
///     .build();
/// assert!(layer.is_ok());
///
/// let err = RateLimitLayer::builder()
///     .policy(Policy::new(Algorithm::FixedWindow, "100/fortnight"))
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("unit"));
/// ```
///
/// The name appears in response bodies, in the [`Decision`](crate::Decision) and in store keys;
/// two policies with the same name in one store share their buckets. It defaults to
/// `ALGORITHM:QUOTA`, e.g. `gcra:10/s`, followed by the burst and the number of buckets when
/// they are set, e.g. `token_bucket:100/min:burst20`.
#[derive(Clone)]
pub struct Policy {
    pub(crate) algorithm: Algorithm,
    pub(crate) quota: Result<Quota, ConfigError>,
    pub(crate) name: Option<String>,
    pub(crate) burst: Option<u32>,
    pub(crate) options: Options,
    pub(crate) key: Option<Arc<dyn KeyExtractor>>,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("algorithm", &self.algorithm)
            .field("quota", &self.quota)
            .field("name", &self.name)
            .field("burst", &self.burst)
            .field("key", &self.key)
            .finish()
    }
}

impl Policy {
    /// A policy applying `algorithm` to `quota` (a [`Quota`] or a string such as `"10/s"`).
    pub fn new<Q>(algorithm: Algorithm, quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Policy {
            algorithm,
            quota: quota.try_into().map_err(Into::into),
            name: None,
            burst: None,
            options: Options::default(),
            key: None,
        }
    }

    /// A [fixed window](Algorithm::FixedWindow) policy.
    pub fn fixed_window<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::FixedWindow, quota)
    }

    /// A [sliding window counter](Algorithm::SlidingWindow) policy.
    pub fn sliding_window<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::SlidingWindow, quota)
    }

    /// A [sliding log](Algorithm::SlidingLog) policy.
    pub fn sliding_log<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::SlidingLog, quota)
    }

    /// A [token bucket](Algorithm::TokenBucket) policy.
    pub fn token_bucket<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::TokenBucket, quota)
    }

    /// A [leaky bucket](Algorithm::LeakyBucket) policy.
    pub fn leaky_bucket<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::LeakyBucket, quota)
    }

    /// A [GCRA](Algorithm::Gcra) policy.
    pub fn gcra<Q>(quota: Q) -> Self
    where
        Q: TryInto<Quota>,
        Q::Error: Into<ConfigError>,
    {
        Self::new(Algorithm::Gcra, quota)
    }

    /// Names the policy (1 to 64 characters: letters, digits and `-_.:/`).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the burst of a bucket algorithm (token bucket, leaky bucket, GCRA): how many units a
    /// rested key may spend at once. Defaults to the limit.
    #[must_use]
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Sets the number of sub-window buckets of a sliding window counter (default 10). More
    /// buckets approximate the exact sliding window more closely, at 4 bytes each per key.
    #[must_use]
    pub fn buckets(mut self, buckets: u32) -> Self {
        self.options.buckets = Some(buckets);
        self
    }

    /// Charges this policy to a different key than the layer's.
    #[must_use]
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Validates everything and precomputes the algorithm's constants.
    pub(crate) fn compile(&self) -> Result<(Arc<str>, Compiled), ConfigError> {
        let described = match &self.name {
            Some(n) => format!("policy {n:?}"),
            None => format!("{} policy", self.algorithm),
        };
        let mut quota = self.quota.clone().map_err(|e| e.context(&described))?;
        if let Some(burst) = self.burst {
            if !self.algorithm.has_burst() {
                return Err(ConfigError::new(format!(
                    "{} has no burst; use token_bucket, leaky_bucket or gcra for a burst different from the limit",
                    self.algorithm
                ))
                .context(&described));
            }
            quota = quota
                .try_with_burst(burst)
                .map_err(|e| ConfigError::from(e).context(&described))?;
        }
        let compiled = Compiled::new(self.algorithm, quota, self.options)
            .map_err(|e| e.context(&described))?;
        let name = match &self.name {
            Some(n) => {
                validate_name(n).map_err(|e| e.context(&described))?;
                n.clone()
            }
            None => {
                // Parameters that change the policy are part of its default name, so two
                // different policies never share one by accident.
                let mut name = format!("{}:{quota}", self.algorithm);
                if let Some(burst) = self.burst {
                    name.push_str(&format!(":burst{burst}"));
                }
                if let Some(buckets) = self.options.buckets {
                    name.push_str(&format!(":buckets{buckets}"));
                }
                name
            }
        };
        Ok((Arc::from(name), compiled))
    }
}

fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:/".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok_char) {
        return Err(ConfigError::new(
            "a policy name must be 1 to 64 characters of letters, digits and -_.:/",
        ));
    }
    Ok(())
}
