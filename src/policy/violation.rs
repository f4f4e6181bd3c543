//! [`Policy::block_on_violation`]: blocks that escalate for a key that keeps being denied.

use super::builder::Policy;
use super::escalation::Escalation;
use crate::error::ConfigError;
use crate::store::Op;

impl Policy {
    /// Blocks a key that keeps being denied, for longer each time it comes back (see
    /// [`Escalation`]): a rate limit alone admits a scraper again at every refill. The block
    /// is kept in the store beside the key's state and decided in the decision's one call, so
    /// every instance sees it; `Retry-After` and the headers count to its end, the deny cache
    /// remembers it, and `ratelimit_blocks_total{policy, level}` counts each block.
    /// [`RateLimitControl::reset`](crate::RateLimitControl::reset) lifts the block and forgets
    /// the level. See the [abusive clients guide](crate::guide::abuse).
    ///
    /// For an enforced policy without leases; with another way of taking part it is an error
    /// of [`build`](crate::RateLimitLayerBuilder::build).
    #[must_use]
    pub fn block_on_violation(mut self, escalation: Escalation) -> Self {
        self.escalation = Some(escalation);
        self
    }

    /// What a policy that blocks on violation cannot have, checked.
    pub(super) fn check_escalation(&self) -> Result<(), ConfigError> {
        let Some(escalation) = &self.escalation else {
            return Ok(());
        };
        escalation.validate()?;
        match &self.takes {
            Ok(Op::Enforce) if self.lease.is_none() && self.reserve.is_none() => Ok(()),
            Err(_) => Ok(()),
            Ok(op) => Err(ConfigError::new(format!(
                "a policy that blocks on violation (block_on_violation) is enforced, without \
                 leases or a reserve, and this one {}",
                match op {
                    Op::Enforce => "takes leases or keeps a reserve",
                    op => self.what(*op),
                }
            ))),
        }
    }
}
