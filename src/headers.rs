//! Rate-limit response headers.
//!
//! Every response that went through the limiter carries, for the binding policy (see
//! [`Decision::binding`](crate::Decision::binding)):
//!
//! | header | value |
//! |---|---|
//! | `X-RateLimit-Limit` | the policy's limit (the burst for bucket algorithms) |
//! | `X-RateLimit-Remaining` | units left |
//! | `X-RateLimit-Reset` | seconds until the key is fully reset, rounded up |
//! | `Retry-After` | on a 429 only: seconds until the request would be admitted, rounded up, at least 1 |
//!
//! Seconds are always rounded **up**: a client told to wait 1 second after a 300 ms wait is
//! admitted when it comes back, and `Retry-After: 0` is never sent to a client that is still
//! limited. A request whose cost exceeds a policy's capacity can never be admitted and gets no
//! `Retry-After`.
//!
//! Rounding up has visible effects worth knowing: GCRA's emission interval is rounded up to a
//! whole microsecond, so after three requests a `3/s` key reports `X-RateLimit-Reset: 2` (its
//! exact reset is 1.000002 s); and a sliding window counter reports the exact time at which its
//! weighted estimate leaves room, which can be more than one window-length-divided-by-limit
//! away (a `10/s` key may be told `Retry-After: 2`).

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::decision::Decision;

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The header values of a decision, computed once and cheap to apply.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RateLimitHeaders {
    limit: u64,
    remaining: u64,
    reset: u64,
    retry_after: Option<u64>,
}

impl RateLimitHeaders {
    pub(crate) fn new(decision: &Decision) -> Self {
        let binding = decision.binding();
        RateLimitHeaders {
            limit: binding.limit(),
            remaining: binding.remaining(),
            reset: ceil_secs(binding.reset_after()),
            retry_after: decision.retry_after().map(|d| ceil_secs(d).max(1)),
        }
    }

    /// Adds the headers that are not already there (an inner, more specific limiter wins).
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        let mut set = |name: HeaderName, value: u64| {
            if !headers.contains_key(&name) {
                headers.insert(name, HeaderValue::from(value));
            }
        };
        set(X_RATELIMIT_LIMIT, self.limit);
        set(X_RATELIMIT_REMAINING, self.remaining);
        set(X_RATELIMIT_RESET, self.reset);
        if let Some(retry) = self.retry_after {
            set(RETRY_AFTER, retry);
        }
    }

    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
    }
}
