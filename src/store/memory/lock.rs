//! The lock of a shard: one read-write lock, or one reader lock per thread group
//! ([`MemoryStoreBuilder::per_thread_reads`](super::MemoryStoreBuilder::per_thread_reads)).
//!
//! Both are taken poisoned or not (see [`crate::store::lock`]).

use std::ops::{Deref, DerefMut};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
// Under the model checker (`cfg(loom)`), the one lock is loom's; the eight reader locks are
// crossbeam's, which loom cannot see, so a store there always has the one lock.
#[cfg(loom)]
use loom::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(loom))]
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Takes the shared lock of `l`, poisoned or not.
fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Takes the exclusive lock of `l`, poisoned or not.
fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// A shard's lock.
pub(super) enum ShardLock<T> {
    /// One lock word: every reader writes it, so threads reading the same shard (one hot
    /// key) pass its cache line between them on each decision.
    One(RwLock<T>),
    /// Eight reader locks, each on its own cache line, a thread taking the one of its group:
    /// readers on different threads touch no common line but the state they read. A writer
    /// takes all eight.
    PerThread(ShardedLock<T>),
}

/// A shared guard of a [`ShardLock`].
pub(super) enum Read<'a, T> {
    One(RwLockReadGuard<'a, T>),
    PerThread(ShardedLockReadGuard<'a, T>),
}

/// An exclusive guard of a [`ShardLock`].
pub(super) enum Write<'a, T> {
    One(RwLockWriteGuard<'a, T>),
    PerThread(ShardedLockWriteGuard<'a, T>),
}

impl<T> ShardLock<T> {
    pub(super) fn new(value: T, per_thread: bool) -> Self {
        if per_thread && !cfg!(loom) {
            ShardLock::PerThread(ShardedLock::new(value))
        } else {
            ShardLock::One(RwLock::new(value))
        }
    }

    /// The shared lock.
    #[inline]
    pub(super) fn read(&self) -> Read<'_, T> {
        match self {
            ShardLock::One(l) => Read::One(read(l)),
            ShardLock::PerThread(l) => Read::PerThread(l.read().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// The exclusive lock.
    pub(super) fn write(&self) -> Write<'_, T> {
        match self {
            ShardLock::One(l) => Write::One(write(l)),
            ShardLock::PerThread(l) => {
                Write::PerThread(l.write().unwrap_or_else(|e| e.into_inner()))
            }
        }
    }
}

impl<T> Deref for Read<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            Read::One(g) => g,
            Read::PerThread(g) => g,
        }
    }
}

impl<T> Deref for Write<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            Write::One(g) => g,
            Write::PerThread(g) => g,
        }
    }
}

impl<T> DerefMut for Write<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        match self {
            Write::One(g) => g,
            Write::PerThread(g) => g,
        }
    }
}
