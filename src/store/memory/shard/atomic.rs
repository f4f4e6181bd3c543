//! The atomics of a packed state: std's, or loom's when the lock-free parts are model-checked
//! (`cfg(loom)`, `scripts/loom.sh`).

#[cfg(loom)]
pub(super) use loom::sync::atomic::{AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(super) use std::sync::atomic::{AtomicU32, AtomicU64};
