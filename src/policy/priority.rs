//! [`Policy::reserve`]: capacity kept for priority on one policy ([`Reserve`]).

use super::builder::Policy;
use super::reserve::Reserve;
use crate::error::ConfigError;
use crate::store::Op;

impl Policy {
    /// Keeps part of the policy's capacity for requests of a higher priority: a request may
    /// use only the share of the capacity its priority gets (see [`Reserve`]). For an
    /// enforced rate policy, of any algorithm; with leases, waits, a shadow, `charge_if` or a
    /// concurrency limit it is an error of [`build`](crate::RateLimitLayerBuilder::build).
    #[must_use]
    pub fn reserve(mut self, reserve: Reserve) -> Self {
        self.reserve = Some(reserve);
        self
    }

    /// What a policy keeping capacity for priority cannot have, checked.
    pub(super) fn check_reserve(&self) -> Result<(), ConfigError> {
        let Some(reserve) = &self.reserve else {
            return Ok(());
        };
        reserve.validate()?;
        match &self.takes {
            Ok(Op::Enforce) if self.lease.is_none() => Ok(()),
            Err(_) => Ok(()),
            Ok(op) => Err(ConfigError::new(format!(
                "a policy that keeps capacity for priority (reserve) is enforced, and this one {}",
                self.what(*op)
            ))),
        }
    }
}
