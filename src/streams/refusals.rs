//! A connection's refusals kept where it is: a message over its limit with a retry time makes
//! the next ones going its way refused without a store call until that time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use http::StatusCode;

use super::limited::Limited;
use super::message::Direction;

/// The refusals a connection answers its messages with itself, without a store call, until
/// their time: a message refused over a limit with a retry time (`429`, once its wait, if any,
/// is not enough) makes every message going its way refused the same way until then, so that
/// a client sending on past its limit (an error answer leaves the socket open) costs nothing
/// per message. A smaller message its policy would have let through sooner is refused too; a
/// reload of the layer's policies forgets them.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    /// Until when, for each direction, in microseconds on the layer's clock (0: none).
    until_us: [AtomicU64; 2],
    /// What refused each direction last, and the policy set it was refused by: a reload
    /// forgets it.
    limited: Mutex<[Option<(Limited, usize)>; 2]>,
}

impl Refusals {
    fn slot(direction: Direction) -> usize {
        match direction {
            Direction::Inbound => 0,
            Direction::Outbound => 1,
        }
    }

    /// The refusal a message going `direction` gets at once, if its time has not come
    /// (`now_us`, read only when there is one).
    #[inline]
    pub(super) fn local(
        &self,
        direction: Direction,
        now_us: impl FnOnce() -> u64,
        policies: impl FnOnce() -> usize,
    ) -> Option<Limited> {
        let until_us = &self.until_us[Self::slot(direction)];
        let until = until_us.load(Ordering::Acquire);
        if until == 0 {
            return None;
        }
        let now = now_us();
        let held = self.limited.lock().unwrap_or_else(PoisonError::into_inner);
        let (limited, held_by) = held[Self::slot(direction)].as_ref()?;
        if now >= until || *held_by != policies() {
            // A later refusal written meanwhile stays.
            let _ = until_us.compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed);
            return None;
        }
        let mut limited = limited.clone();
        limited.retry_after = Some(Duration::from_micros(until - now));
        Some(limited)
    }

    /// Keeps `limited`, given at `now_us` by the policy set `policies`, when it is over a
    /// limit with a retry time.
    pub(super) fn remember(&self, limited: &Limited, now_us: u64, policies: usize) {
        let Some(after) = limited.retry_after else {
            return;
        };
        if limited.status != StatusCode::TOO_MANY_REQUESTS || after.is_zero() {
            return;
        }
        let slot = Self::slot(limited.direction);
        let mut held = self.limited.lock().unwrap_or_else(PoisonError::into_inner);
        held[slot] = Some((limited.clone(), policies));
        let until = now_us.saturating_add(after.as_micros().min(u64::MAX as u128) as u64);
        self.until_us[slot].store(until, Ordering::Release);
    }
}
