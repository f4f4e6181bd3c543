//! Staying up when the store is down: the circuit breaker and the deny cache.

mod breaker;
mod deny_cache;

pub use breaker::CircuitBreaker;
pub(crate) use breaker::{Breaker, Permit};
pub(crate) use deny_cache::DenyCache;
