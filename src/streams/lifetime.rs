//! [`Lifetime`]: the end of a connection's lifetime, as its wrappers watch it.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;

use super::limiter::Connection;

/// The end of a connection's lifetime. Its timer is polled (the task's waker registered with
/// it) on the first look and whenever the connection has nothing to read; a message read
/// between only looks whether it fired, which costs no registration.
pub(super) struct Lifetime {
    sleep: Pin<Box<tokio::time::Sleep>>,
    armed: bool,
}

impl Lifetime {
    /// The lifetime of `connection`, if it has one.
    pub(super) fn of(connection: &Connection) -> Option<Self> {
        (connection.ends_at()).map(|at| Lifetime {
            sleep: Box::pin(tokio::time::sleep_until(at)),
            armed: false,
        })
    }

    /// Whether the lifetime has ended; `idle`: the task is about to wait, so the timer must
    /// wake it.
    pub(super) fn ended(&mut self, cx: &mut Context<'_>, idle: bool) -> bool {
        if self.armed && !idle {
            return self.sleep.is_elapsed();
        }
        self.armed = true;
        self.sleep.as_mut().poll(cx).is_ready()
    }
}
