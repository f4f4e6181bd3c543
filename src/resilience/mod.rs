//! Staying up when the store is down: the circuit breaker, the deny cache, and the denials
//! held through an outage.

mod breaker;
mod deny_cache;
mod held;

pub use breaker::CircuitBreaker;
pub(crate) use breaker::{Breaker, Permit};
pub(crate) use deny_cache::DenyCache;
pub(crate) use held::Held;
