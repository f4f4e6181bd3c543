//! Policies: an algorithm, a quota and a name ([`Policy`], the public builder), how each takes
//! part in a decision (the operation its checks make, a [`Part`] per tier), and their compiled
//! forms: [`CompiledPolicy`] as
//! the engine plans a request with it, [`Tier`] as stores and decisions know each quota.

mod adaptive;
mod builder;
mod compile;
mod compiled;
mod escalation;
mod near;
mod priority;
mod reserve;
mod route;
mod tiers;
mod tier;
mod violation;

pub(crate) use builder::{CostFn, RequestFn, StatusFn};
pub use builder::{DEFAULT_MAX_DURATION, Policy};
#[cfg(fuzzing)]
pub(crate) use compile::validate_name;
pub(crate) use compiled::CompiledPolicy;
pub use escalation::Escalation;
pub use reserve::Reserve;
pub(crate) use tier::{LeaseSpec, Part, Registered, Tier};
