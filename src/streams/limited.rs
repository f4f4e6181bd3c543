//! What a message is to its policies, what it gets over the limit, and why it was refused.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

use super::frame::CloseCode;
use super::message::Direction;
use crate::key::RequestRef;
use crate::refusal::Refused;

/// The longest wait an answer may give a message: an hour.
pub(super) const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// A message's cost in bytes (at least one, so that an empty message is not free), for
/// [`Policy::cost`](crate::Policy::cost): `Policy::gcra("64KiB/s").cost(message_bytes)`. A
/// request that is no message costs one.
pub fn message_bytes(request: &RequestRef<'_>) -> u32 {
    (request.message()).map_or(1, |m| m.bytes.clamp(1, u32::MAX as usize) as u32)
}

/// What a connection does with a message over the limit; see the [module](super).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimit {
    /// The longest wait (zero: none).
    pub(super) wait: Duration,
    /// The answer when waiting is not enough.
    pub(super) then: Answer,
}

/// The answer given to a message over the limit, once waiting is not enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The connection is closed with this code and a reason naming the policy.
    Close(CloseCode),
    /// The message is dropped and the client gets an error message.
    Error,
}

impl OverLimit {
    /// Closes the connection, with `code` (a WebSocket's [`CloseCode::POLICY_VIOLATION`] or
    /// [`CloseCode::TRY_AGAIN_LATER`]) and a reason naming the policy.
    pub fn close(code: CloseCode) -> Self {
        OverLimit {
            wait: Duration::ZERO,
            then: Answer::Close(code),
        }
    }

    /// Drops the message and sends the client an error message
    /// ([`StreamLimiterBuilder::error_message`](super::StreamLimiterBuilder::error_message)); the connection stays open.
    /// Until the time the refusal gave (its [`retry_after`](Limited::retry_after)), the
    /// connection refuses its next messages going the same way itself, without a store call,
    /// with the time left (a smaller message the policy would have let through sooner too).
    pub fn error() -> Self {
        OverLimit {
            wait: Duration::ZERO,
            then: Answer::Error,
        }
    }

    /// Waits until the budget allows the message, at most `longest` (at most an hour), reading
    /// nothing more meanwhile; a message that would wait longer is closed with `1013`, unless
    /// [`then`](Self::then) says otherwise.
    pub fn wait(longest: Duration) -> Self {
        OverLimit {
            wait: longest,
            then: Answer::Close(CloseCode::TRY_AGAIN_LATER),
        }
    }

    /// The answer after a wait that is not enough: `next`'s (whose own wait is not used).
    #[must_use]
    pub fn then(mut self, next: OverLimit) -> Self {
        self.then = next.then;
        self
    }

    /// The longest wait (zero: none).
    pub fn longest_wait(&self) -> Duration {
        self.wait
    }

    /// The answer when waiting is not enough.
    pub fn answer(&self) -> Answer {
        self.then
    }
}

impl Default for OverLimit {
    /// Closes with `1008`.
    fn default() -> Self {
        OverLimit::close(CloseCode::POLICY_VIOLATION)
    }
}

/// The answer each policy's messages get over its limit.
#[derive(Debug)]
pub(super) struct Answers {
    /// The answer of a policy not in `by_policy`.
    pub(super) over: OverLimit,
    pub(super) by_policy: std::collections::HashMap<String, OverLimit>,
}

impl Answers {
    /// The answer to a message `policy` denied.
    pub(super) fn of(&self, policy: &str) -> OverLimit {
        self.by_policy.get(policy).map_or(self.over, |o| *o)
    }
}

/// A message refused: the policy over its limit (or why else), how long until it would be
/// admitted, and the answer the connection gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    pub(super) policy: String,
    pub(super) retry_after: Option<Duration>,
    pub(super) status: StatusCode,
    pub(super) answer: Answer,
    pub(super) direction: Direction,
}

impl Limited {
    /// A message the engine refused, going `direction`.
    pub(super) fn of(refused: &Refused, direction: Direction) -> Limited {
        Limited {
            policy: refused.policy().to_owned(),
            retry_after: refused.retry_after(),
            status: refused.status(),
            answer: Answer::Error,
            direction,
        }
    }

    /// The violated policy's name (with several, the one with the longest wait); empty when
    /// no policy denied it (the key is denied by the lists, the store failed and the layer
    /// fails closed, or no key could be made of the connection's request).
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// How long until the message would be admitted, when known.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The status the layer would have answered a request with: `429` over a limit, `403`
    /// denied by the lists, `503` the store unavailable, `400` no key; `408` at the end of
    /// the connection's lifetime ([`max_lifetime`](super::StreamLimiterBuilder::max_lifetime)).
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The answer the connection gives.
    pub fn answer(&self) -> Answer {
        self.answer
    }

    /// The message's direction.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// The default error message: `{"error":"rate_limited","retry_after_ms":N,"policy":"…"}`
    /// (`retry_after_ms` is `null` when unknown; `error` is `forbidden`, `unavailable` or
    /// `bad_request` for the other statuses).
    pub fn to_json(&self) -> String {
        let error = match self.status {
            StatusCode::TOO_MANY_REQUESTS => "rate_limited",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            StatusCode::REQUEST_TIMEOUT => "lifetime_ended",
            _ => "bad_request",
        };
        let retry = self
            .retry_after
            .map_or("null".to_owned(), |d| d.as_millis().to_string());
        let mut policy = String::with_capacity(self.policy.len() + 2);
        crate::response::push_json_str(&mut policy, &self.policy);
        format!(r#"{{"error":"{error}","retry_after_ms":{retry},"policy":{policy}}}"#)
    }

    /// The gRPC status a stream answers it with, as the layer answers a limited call: the code
    /// (`8`, `RESOURCE_EXHAUSTED`, over a limit; `7`, `14` or `3` for the other statuses), the
    /// message (`rate limit exceeded (<policy>)`), and the details, a `google.rpc.Status`
    /// with a `RetryInfo` and a `QuotaFailure` naming the policy, for tonic's
    /// `Status::with_details(code.into(), message, details)`.
    pub fn grpc_status(&self) -> (i32, String, bytes::Bytes) {
        crate::grpc::message_status(self.status, &self.policy, self.retry_after)
    }

    /// The reason a close frame gives: `rate limited: <policy>`, at most 123 bytes (a close
    /// frame's bound), cut at a character's boundary.
    pub fn close_reason(&self) -> String {
        let mut reason = match self.status {
            StatusCode::TOO_MANY_REQUESTS => format!("rate limited: {}", self.policy),
            StatusCode::FORBIDDEN => "denied".to_owned(),
            StatusCode::SERVICE_UNAVAILABLE => "rate limiter unavailable".to_owned(),
            StatusCode::REQUEST_TIMEOUT => "connection lifetime ended".to_owned(),
            _ => "no key".to_owned(),
        };
        let mut end = reason.len().min(123);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason
    }
}

impl Limited {
    /// The end of a connection's lifetime: closed with `1013`.
    pub(super) fn lifetime_ended() -> Self {
        Limited {
            policy: String::new(),
            retry_after: None,
            status: StatusCode::REQUEST_TIMEOUT,
            answer: Answer::Close(CloseCode::TRY_AGAIN_LATER),
            direction: Direction::Inbound,
        }
    }
}

impl fmt::Display for Limited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.retry_after {
            Some(after) => write!(f, "{}; retry after {after:?}", self.close_reason()),
            None => f.write_str(&self.close_reason()),
        }
    }
}

impl std::error::Error for Limited {}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(policy: &str, status: StatusCode) -> Limited {
        Limited {
            policy: policy.to_owned(),
            retry_after: Some(Duration::from_millis(1500)),
            status,
            answer: Answer::Error,
            direction: Direction::Inbound,
        }
    }

    #[test]
    fn the_error_message_and_the_close_reason() {
        let over = limited("per \"user\"", StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            over.to_json(),
            r#"{"error":"rate_limited","retry_after_ms":1500,"policy":"per \"user\""}"#
        );
        assert_eq!(over.close_reason(), "rate limited: per \"user\"");
        let long = limited(&"é".repeat(100), StatusCode::TOO_MANY_REQUESTS);
        assert!(long.close_reason().len() <= 123);
        assert!(long.close_reason().ends_with('é'));
        let denied = limited("", StatusCode::FORBIDDEN);
        assert!(denied.to_json().starts_with(r#"{"error":"forbidden""#));
    }

    #[test]
    fn a_wait_then_another_answer() {
        let over = OverLimit::wait(Duration::from_secs(2)).then(OverLimit::error());
        assert_eq!(over.longest_wait(), Duration::from_secs(2));
        assert_eq!(over.answer(), Answer::Error);
        assert_eq!(
            OverLimit::default().answer(),
            Answer::Close(CloseCode::POLICY_VIOLATION)
        );
    }
}
