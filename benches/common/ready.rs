//! Polling the memory store's decisions without a runtime (shared by the benches that compare
//! it with governor; included by path, as the rest of `common` needs the `redis` feature).

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Polls a future that is ready at once.
pub(crate) fn now<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => unreachable!("the memory store decides at once"),
    }
}
