//! Staying up when the store is down: the circuit breaker, the deny cache, and the denials
//! remembered through an outage.

mod breaker;
mod deny_cache;
mod remembered;

pub use breaker::CircuitBreaker;
pub(crate) use breaker::{Breaker, Gate};
pub(crate) use deny_cache::DenyCache;
pub(crate) use remembered::Remembered;
