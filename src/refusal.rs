//! Why the engine did not let a request go on: its typed answer ([`Refusal`]), which each
//! adapter renders its own way (the HTTP service as a response, `response.rs`; a connection's
//! messages as a refused message; an outbound call as an error), and the few facts of it
//! every rendering shares ([`Refused`]).

use std::time::Duration;

use http::StatusCode;

use crate::decision::Decision;
use crate::error::KeyRejection;
use crate::headers::RateLimitHeaders;
use crate::lists::Why;

/// How the engine ends a request it does not let go on.
pub(crate) enum Refusal {
    /// Over the limit of a policy: the decision, and the headers it gives.
    Limited {
        decision: Decision,
        headers: RateLimitHeaders,
    },
    /// On a deny list.
    Denied(Why),
    /// Shed by the adaptive concurrency limit of the policy named.
    Shed(Box<str>),
    /// No key or cost could be made of it (or its body could not be read as its policies
    /// need).
    Rejected(KeyRejection),
    /// The store failed, and the layer fails closed.
    Unavailable,
}

/// The kind of a [`Refusal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Limited,
    Denied,
    Shed,
    Rejected,
    Unavailable,
}

/// What every rendering of a refusal says: its kind, the policy that refused (empty when
/// none did: the lists, the key, the store), when the same request would go on, and the
/// status an HTTP answer has. The HTTP answer carries it in its extensions, for the adapters
/// that stand outside the HTTP service (the connections' layer, outbound calls).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    kind: Kind,
    policy: String,
    retry_after: Option<Duration>,
    status: StatusCode,
}

impl Refused {
    /// The refusal's kind.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// The policy that refused; empty when none did.
    pub(crate) fn policy(&self) -> &str {
        &self.policy
    }

    /// When the same request would go on, if known.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The status of its HTTP answer.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }
}

/// A call of a denied batch that was over, as the JSON object that names it: its place in
/// the batch (`index`), its `id`, and the policies it was over (`policies`).
#[derive(Debug)]
pub(crate) struct CallOver(String);

impl CallOver {
    /// The call named by `json`, a JSON object.
    #[cfg_attr(not(feature = "json"), allow(dead_code))]
    pub(crate) fn new(json: String) -> Self {
        CallOver(json)
    }

    /// Its JSON object.
    pub(crate) fn json(&self) -> &str {
        &self.0
    }
}

/// The wait a `503` asks for (its `Retry-After`): a second.
pub(crate) const UNAVAILABLE_RETRY: Duration = Duration::from_secs(1);

impl Refusal {
    /// Its kind.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Refusal::Limited { .. } => Kind::Limited,
            Refusal::Denied(_) => Kind::Denied,
            Refusal::Shed(_) => Kind::Shed,
            Refusal::Rejected(_) => Kind::Rejected,
            Refusal::Unavailable => Kind::Unavailable,
        }
    }

    /// The decision of a request over a limit.
    #[cfg_attr(not(feature = "json"), allow(dead_code))]
    pub(crate) fn decision(&self) -> Option<&Decision> {
        match self {
            Refusal::Limited { decision, .. } => Some(decision),
            _ => None,
        }
    }

    /// What every rendering says of it; `limited` is the status of a request over a limit.
    pub(crate) fn refused(&self, limited: StatusCode) -> Refused {
        let (policy, retry_after, status) = match self {
            Refusal::Limited { decision, .. } => {
                let policy = decision.tightest().policy().to_owned();
                (policy, decision.retry_after(), limited)
            }
            Refusal::Denied(_) => (String::new(), None, StatusCode::FORBIDDEN),
            Refusal::Shed(policy) => {
                let status = StatusCode::SERVICE_UNAVAILABLE;
                (policy.to_string(), Some(UNAVAILABLE_RETRY), status)
            }
            Refusal::Rejected(rejection) => (String::new(), None, rejection.status()),
            Refusal::Unavailable => {
                let status = StatusCode::SERVICE_UNAVAILABLE;
                (String::new(), Some(UNAVAILABLE_RETRY), status)
            }
        };
        Refused {
            kind: self.kind(),
            policy,
            retry_after,
            status,
        }
    }
}
