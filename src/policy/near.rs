//! [`Policy::near_limit`]: a warning when a key nears its limit.

use super::builder::Policy;
use crate::error::ConfigError;
use crate::store::Op;

impl Policy {
    /// Warns when a key has used `percent` of its limit (1 to 99; say 80): the first request
    /// admitted at or past it in a window (for a bucket, until the key is fresh again) counts
    /// in `ratelimit_near_limit_total{policy}`, emits a `tracing` event at `INFO`, is handed to
    /// the layer's [`on_near_limit`](crate::RateLimitLayerBuilder::on_near_limit) hook, and
    /// lists the key among those near their limit beside the
    /// [top limited keys](crate::RateLimitLayerBuilder::top_limited). Once per key and window
    /// on each instance: each instance warns of what it decides.
    ///
    /// For an enforced or shadow policy; the layer then decides its requests the general way.
    #[must_use]
    pub fn near_limit(mut self, percent: u8) -> Self {
        self.near_limit = Some(percent);
        self
    }

    /// What a policy warning near its limit cannot have, checked.
    pub(super) fn check_near(&self) -> Result<(), ConfigError> {
        let Some(percent) = self.near_limit else {
            return Ok(());
        };
        if !(1..=99).contains(&percent) {
            return Err(ConfigError::new(format!(
                "near_limit is a percentage of the limit from 1 to 99, not {percent}"
            )));
        }
        match &self.takes {
            Ok(Op::Enforce | Op::Shadow) | Err(_) => Ok(()),
            Ok(op) => Err(ConfigError::new(format!(
                "a policy that warns near its limit (near_limit) is enforced or a shadow, and this one {}",
                self.what(*op)
            ))),
        }
    }

    /// Whether the policy warns near its limit.
    pub(crate) fn warns_near(&self) -> bool {
        self.near_limit.is_some()
    }
}
