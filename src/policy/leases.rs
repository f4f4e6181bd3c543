//! Leases: [`Policy::lease`] and [`Policy::lease_ttl`], a share of a key's limit an instance
//! takes from the store and spends locally (kept in `lease.rs` at the crate's root).

use std::time::Duration;

use super::Policy;
use crate::error::ConfigError;
use crate::store::Op;

impl Policy {
    /// Lets each instance take up to `units` units of a key's limit from the store at once,
    /// and admit the key's requests from them locally, without a store call, until they are
    /// spent or the lease ends ([`lease_ttl`](Self::lease_ttl)); units left are given back.
    ///
    /// A lease turns a hot key's store calls from one per request into about one per `units`
    /// requests, and a lease in hand keeps admitting while the store is down, until it ends.
    /// The limit still holds across every instance: the store counts a lease's units as
    /// spent at the worst moment the lease allows, so no interleaving of instances admits
    /// more than the algorithm would. What it trades is the other way: units in another
    /// instance's lease are not available here, so up to `instances × units` units may go
    /// unused until the leases end, and the headers of a request admitted from a lease
    /// describe the key as of the lease's grant. Sizes start small and grow while the key is
    /// busy: a key seen once is decided as without a lease. See the crate docs' section on
    /// leases.
    ///
    /// The units are capped by the policy's limit (burst for the bucket algorithms): a lease
    /// of 0 units, or of more than that, is a configuration error. A lease cannot be combined
    /// with [`shadow`](Self::shadow) or [`charge_if`](Self::charge_if), which never charge
    /// up front. On a [`MemoryStore`](crate::MemoryStore) a lease works the same but saves
    /// nothing: the store is already in the process.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::Policy;
    ///
    /// // A global budget of 10,000 requests a minute, taken 50 at a time per instance.
    /// let global = Policy::gcra("10000/min")
    ///     .name("global")
    ///     .lease(50)
    ///     .lease_ttl(Duration::from_millis(500));
    /// # let _ = global;
    /// ```
    #[must_use]
    pub fn lease(mut self, units: u32) -> Self {
        match self.takes {
            // An enforced policy takes leases: the units of the leases' own `Op::Lease`.
            Ok(Op::Enforce) => self.lease = Some((units, self.lease.and_then(|(_, ttl)| ttl))),
            Ok(old) => self.takes = Err(self.two_ways(old, Op::Lease { want: 0 }.what())),
            Err(_) => {}
        }
        self
    }

    /// How long a lease lives at most: its units are spent within this time of being taken,
    /// or given back. Default: the smaller of one second and a tenth of the quota's window.
    /// A fixed-window lease also ends with its window, a sliding-window lease with its
    /// sub-window bucket. Shorter leases bring unused units back sooner; longer ones let a
    /// quiet key keep its lease. Call it after [`lease`](Self::lease).
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        match (&self.takes, self.lease) {
            (Ok(_), Some((units, _))) => self.lease = Some((units, Some(ttl))),
            (Ok(_), None) => {
                self.takes = Err(ConfigError::new(
                    "lease_ttl without a lease; add .lease(units) before .lease_ttl()",
                ));
            }
            (Err(_), _) => {}
        }
        self
    }
}
