//! Time, injected.
//!
//! Stores ask a [`Clock`] for the time of each decision, so tests can drive every algorithm
//! with a [`ManualClock`] and never sleep:
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::{Clock, ManualClock};
//!
//! let clock = ManualClock::new();
//! let t0 = clock.now_micros();
//! clock.advance(Duration::from_millis(250));
//! assert_eq!(clock.now_micros() - t0, 250_000);
//! ```

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of time for rate-limit decisions, in whole microseconds.
///
/// The value only has to be monotonic and shared by every process that shares a store; the
/// Redis store reads Redis `TIME` instead unless a clock is injected.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current time in microseconds since the clock's epoch.
    fn now_micros(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_micros(&self) -> u64 {
        (**self).now_micros()
    }
}

/// The real clock: microseconds since the Unix epoch, read at start and advanced monotonically.
///
/// A wall-clock step backwards (NTP) does not make time run backwards for the limiter. Time
/// advances by the processor's time-stamp counter where it is invariant (through `quanta`,
/// calibrated once per process against the monotonic clock), which costs a few nanoseconds
/// where a system clock read costs 20 to 30; elsewhere by the monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    start_raw: u64,
    start_unix_us: u64,
}

/// The process's counter clock, calibrated on first use.
fn counter() -> &'static quanta::Clock {
    static COUNTER: OnceLock<quanta::Clock> = OnceLock::new();
    COUNTER.get_or_init(quanta::Clock::new)
}

impl SystemClock {
    /// A clock anchored to the current wall-clock time.
    pub fn new() -> Self {
        let start_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        SystemClock {
            start_raw: counter().raw(),
            start_unix_us,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        let counter = counter();
        self.start_unix_us + counter.delta_as_nanos(self.start_raw, counter.raw()) / 1_000
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at a fixed instant that starts a UTC day (2001-09-08T00:00:00Z, 999,993,600
    /// seconds after the Unix epoch): every second, minute, hour and day window starts there,
    /// and it is far from zero.
    pub fn new() -> Self {
        Self::starting_at(999_993_600_000_000)
    }

    /// A clock at `micros` microseconds.
    pub fn starting_at(micros: u64) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    /// Moves the clock forward by `micros` microseconds.
    pub fn advance_micros(&self, micros: u64) {
        self.now.fetch_add(micros, Ordering::SeqCst);
    }

    /// Sets the clock to `micros`. Moving it backwards is allowed; a key updated at a later
    /// time admits nothing until that time comes again.
    pub fn set_micros(&self, micros: u64) {
        self.now.store(micros, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
