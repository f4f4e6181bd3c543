//! What the engine says a request does next ([`Next`]), what answering its checks needs once
//! they are sent ([`Ticket`]), and the charges that wait for its response ([`AfterResponse`]).

use std::sync::Arc;
use std::time::Instant;

use tracing::Span;

use super::route::{Pending, Steps};
use crate::body::BodyGuard;
use crate::decision::Decision;
use crate::error::KeyRejection;
use crate::headers::RateLimitHeaders;
use crate::lease::Asking;
use crate::policy::StatusFn;
use crate::refusal::Refusal;
use crate::resilience::Gate;
use crate::settle::Settle;
use crate::store::{Check, Checks};

/// What a request does next, as the engine says: when it begins, and again each time what it
/// waited for came.
// The store's variant is the common one of those that wait, and they are moved once, into the
// response future's boxed waiting state; the lease's is rare and boxed.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Next<F> {
    /// Call the inner service (see [`Go`]).
    Call(Go),
    /// End the request with this refusal, which the adapter renders.
    Refuse(Refusal),
    /// Wait until the times booked for the request come (`wait` from now), then go on
    /// (`then`); `release` gives the booked units back if it never does.
    Wait {
        wait: std::time::Duration,
        release: Option<BodyGuard>,
        then: Box<Go>,
    },
    /// Wait for the store's answer (`F`), then [`Limiter::answered`] with the ticket.
    Store(F, Ticket),
    /// Wait (for a place in an adaptive limit's queue, for the answer to another request's
    /// asking for the lease this one needs), then run the steps and the plan again
    /// ([`Limiter::resumed`]) with what it gave.
    Pending(Pending),
}

/// A request let through: call the inner service, with the decision (if any) in the
/// request's extensions; add these headers (none when no policy applies, or the limiter
/// failed open) to its response, let its body hold the slots of the concurrency limits it
/// holds, and make the charges `after` its response once it is known.
pub(crate) struct Go {
    pub(super) headers: Option<RateLimitHeaders>,
    pub(super) decision: Option<Decision>,
    pub(super) held: Option<BodyGuard>,
    pub(super) after: Vec<AfterResponse>,
}

impl Go {
    /// Its parts: the headers, the decision, the slots held, the charges after.
    #[inline(always)]
    pub(crate) fn into_parts(self) -> GoParts {
        (self.headers, self.decision, self.held, self.after)
    }

    /// Whether it makes charges after the response.
    pub(crate) fn charges_after(&self) -> bool {
        !self.after.is_empty()
    }

    /// Nothing added: no headers, no decision, no slots held, no charges after (no policy
    /// applies, or the limiter failed open).
    pub(crate) fn nothing() -> Self {
        Go {
            headers: None,
            decision: None,
            held: None,
            after: Vec::new(),
        }
    }
}

impl<F> Next<F> {
    /// Call the inner service with nothing added (see [`Go::nothing`]).
    pub(crate) fn nothing() -> Self {
        Next::Call(Go::nothing())
    }

    /// The request's answer when it waits for nothing, else the step itself.
    // Either is moved once, into the request's answer or its wait.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub(crate) fn settled(self) -> Result<Result<Go, Refusal>, Self> {
        match self {
            Next::Call(go) => Ok(Ok(go)),
            Next::Refuse(refusal) => Ok(Err(refusal)),
            next => Err(next),
        }
    }
}

/// A [`Go`]'s parts.
pub(crate) type GoParts = (
    Option<RateLimitHeaders>,
    Option<Decision>,
    Option<BodyGuard>,
    Vec<AfterResponse>,
);

/// What answering a request's checks needs, from when they are planned until the store's
/// answer comes: the breaker's gate (taken when they are sent), the local fallback's checks,
/// the request's keys (for the deny cache and the IETF `pk`), when the store was asked, and
/// the charges that wait for the response.
pub(crate) struct Ticket {
    pub(super) gate: Gate,
    /// The checks asking for a lease (boxed: most decisions ask for none, and the ticket is
    /// moved along with every one).
    pub(super) asking: Option<Box<Asking>>,
    pub(super) fallback: Option<Checks>,
    /// The request's own checks, kept when the deny cache or the IETF `pk` needs them.
    pub(super) keys: Option<Vec<Check>>,
    /// When the store was asked, for `ratelimit_store_duration_seconds` (not timed for a
    /// store that decides synchronously).
    pub(super) started: Option<Instant>,
    /// Whether the decision may take slots (of a concurrency limit, or booked) that must
    /// be given back should the request go away before the decision comes.
    pub(super) gives_back_later: bool,
    pub(super) after: Vec<AfterResponse>,
    /// The decision's `debug` span, disabled unless a subscriber wants it.
    pub(super) span: Span,
    /// Whether the checks end with the looks at the key's list entries.
    pub(super) lists: bool,
    /// The steps of the route the request was planned on.
    pub(super) steps: Steps,
    /// The refusal of the request's body, when the checks are its charge to the head's keys
    /// (the answer is then this, or `429`).
    pub(super) rejected: Option<Box<KeyRejection>>,
}

impl Ticket {
    /// The ticket of checks just planned, with the local fallback's checks and the charges
    /// after the response: the rest is filled in as they are sent.
    pub(super) fn planned(
        fallback: Option<Checks>,
        after: Vec<AfterResponse>,
        span: Span,
        steps: Steps,
    ) -> Self {
        Ticket {
            gate: Gate::Call,
            asking: None,
            fallback,
            keys: None,
            started: None,
            gives_back_later: false,
            after,
            span,
            lists: false,
            steps,
            rejected: None,
        }
    }
}

/// A request's checks as they are planned: the store's, the local fallback's, and the charges
/// after the response.
pub(super) type Planned<'a> = (
    &'a mut Checks,
    &'a mut Option<Checks>,
    &'a mut Vec<AfterResponse>,
);

/// A charge or refund that depends on the response: its status, or its real cost.
pub(crate) enum AfterResponse {
    /// The check to send when the response's status is accepted by `accepts` (`charge_if`,
    /// `refund_if`); `lease_end`: the end of the lease the request's units came from, if they
    /// came from one (a refund goes back to it).
    Status {
        check: Check,
        accepts: StatusFn,
        lease_end: Option<u64>,
    },
    /// Always, at the units the response really cost (`Op::Settle`): read from the head, or
    /// counted from the body and sent when it ends.
    Cost { check: Check, settle: Arc<Settle> },
}
