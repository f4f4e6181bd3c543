//! Why an outbound call failed: the limiter did not send it, or the upstream's service failed.

use std::fmt;
use std::time::Duration;

use crate::refusal::{Kind, Refused};

/// Why the limiter did not send a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// A policy would admit it only after the longest wait (or never: its cost is more than
    /// the policy ever admits), or the upstream asked for a pause that runs past it.
    Limited,
    /// The call's key could not be made (the call names no upstream).
    KeyRejected,
    /// The store could not decide and the layer fails closed
    /// ([`FailurePolicy`](crate::FailurePolicy)).
    StoreUnavailable,
}

impl Reason {
    /// The metric label.
    pub(super) fn label(self) -> &'static str {
        match self {
            Reason::Limited => "limited",
            Reason::KeyRejected => "key_rejected",
            Reason::StoreUnavailable => "store_unavailable",
        }
    }
}

/// An outbound call the limiter did not send: match on it (or [`EgressError::GaveUp`]) to
/// retry later, queue the work, or tell the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaveUp {
    pub(super) reason: Reason,
    pub(super) policy: String,
    pub(super) retry_after: Option<Duration>,
}

impl GaveUp {
    /// Why it was not sent.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The policy that refused it (empty when none did: a rejected key, a failed store).
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// When the same call would be sent, if the policy says (a call past the longest wait).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// What the engine's refusal means for a call.
    pub(super) fn of(refused: &Refused) -> GaveUp {
        let reason = match refused.kind() {
            Kind::Unavailable => Reason::StoreUnavailable,
            Kind::Limited | Kind::Denied | Kind::Shed => Reason::Limited,
            Kind::Rejected => Reason::KeyRejected,
        };
        GaveUp {
            reason,
            policy: refused.policy().to_owned(),
            retry_after: refused.retry_after(),
        }
    }

    /// A call the engine answered with no refusal of its own (a hook's response).
    pub(super) fn unknown() -> GaveUp {
        GaveUp {
            reason: Reason::Limited,
            policy: String::new(),
            retry_after: None,
        }
    }
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            Reason::Limited => write!(f, "outbound call not sent: limited by {:?}", self.policy)?,
            Reason::KeyRejected => f.write_str("outbound call not sent: it has no key")?,
            Reason::StoreUnavailable => {
                f.write_str("outbound call not sent: the rate-limit store is unavailable")?
            }
        }
        if let Some(after) = self.retry_after {
            write!(f, " (retry after {} ms)", after.as_millis())?;
        }
        Ok(())
    }
}

impl std::error::Error for GaveUp {}

/// The error of an [`Egress`](super::Egress) service: the limiter gave the call up, or the
/// service it wraps failed.
#[derive(Debug)]
pub enum EgressError<E> {
    /// Not sent (see [`GaveUp`]).
    GaveUp(GaveUp),
    /// The wrapped service's own error, as it came.
    Upstream(E),
}

impl<E> EgressError<E> {
    /// The refusal, when the limiter gave the call up.
    pub fn gave_up(&self) -> Option<&GaveUp> {
        match self {
            EgressError::GaveUp(g) => Some(g),
            EgressError::Upstream(_) => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for EgressError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EgressError::GaveUp(g) => g.fmt(f),
            EgressError::Upstream(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for EgressError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EgressError::GaveUp(g) => Some(g),
            EgressError::Upstream(e) => Some(e),
        }
    }
}
