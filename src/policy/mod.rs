//! [`Policy`], what a layer enforces (an algorithm, a quota and a name), and the options its
//! methods take: [`Reserve`] (capacity kept for priority), [`Escalation`] (a block on
//! violation), [`Adaptive`] (an adaptive concurrency limit), and [`NearLimit`], what the hook
//! of a warning near the limit is handed.
//!
//! ```
//! use tower_ratelimit::Policy;
//! use tower_ratelimit::policy::{Escalation, Reserve};
//! use std::time::Duration;
//!
//! let login = Policy::gcra("5/min")
//!     .name("login")
//!     .block_on_violation(Escalation::new(Duration::from_secs(60)));
//! let api = Policy::token_bucket("100/s").reserve(Reserve::header("x-priority").share("critical", 20));
//! # let _ = (login, api);
//! ```

mod adaptive;
mod body_cost;
mod body_costs;
mod builder;
mod compile;
mod compiled;
mod escalation;
mod leases;
mod near;
mod per_route;
mod priority;
mod reserve;
mod route;
mod tiers;
mod tier;
mod violation;

pub use crate::adaptive::Adaptive;
pub use crate::near::NearLimit;
pub(crate) use builder::{CostFn, RequestFn, StatusFn};
pub use builder::{DEFAULT_MAX_DURATION, Policy};
#[cfg(fuzzing)]
pub(crate) use compile::validate_name;
pub(crate) use compiled::CompiledPolicy;
pub use escalation::Escalation;
pub use reserve::Reserve;
pub(crate) use tier::{LeaseSpec, Part, Registered, Tier};
