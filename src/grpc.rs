//! gRPC: the limiter's own answers in the form gRPC clients understand.
//!
//! A gRPC client reads the outcome of a call from its `grpc-status`, not from the HTTP status,
//! and treats a `429` or a JSON body as a broken transport. So a gRPC request the limiter does
//! not forward is answered with HTTP `200` and a *trailers-only* response: one header block,
//! no body, carrying
//!
//! - `grpc-status: 8` (`RESOURCE_EXHAUSTED`) for a limited request, `14` (`UNAVAILABLE`) when the
//!   store failed under [`FailurePolicy::Closed`](crate::FailurePolicy::Closed), and for a
//!   rejected key the code of its HTTP status (`400` → `INVALID_ARGUMENT`, `401` →
//!   `UNAUTHENTICATED`, `403` → `PERMISSION_DENIED`, `404` → `UNIMPLEMENTED`, `500` →
//!   `INTERNAL`);
//! - `grpc-message`: what happened, e.g. `rate limit exceeded (gcra:10/s)`;
//! - `grpc-status-details-bin`: a `google.rpc.Status` holding a `google.rpc.RetryInfo` (the exact
//!   delay until the request would be admitted) and, for a limited request, a
//!   `google.rpc.QuotaFailure` naming each violated policy. gRPC libraries decode it for you
//!   (`tonic_types::StatusExt`, `grpc-status-details` in grpc-java and grpc-go);
//! - the rate-limit headers and `retry-after`, as metadata.
//!
//! Which requests get this answer is the layer's [`ResponseStyle`]; by default, every request
//! whose `content-type` is `application/grpc` (or `application/grpc+proto`, …), so one layer
//! in front of a router that serves both HTTP and gRPC answers each in its own form.
//!
//! ```
//! use tower_ratelimit::{Policy, RateLimitLayer, grpc::ResponseStyle, key::GrpcMethod};
//!
//! // Each gRPC method its own bucket, answered the gRPC way whatever the content type.
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::gcra("100/s"))
//!     .key(GrpcMethod::new())
//!     .response_style(ResponseStyle::Grpc)
//!     .build()?;
//! # let _ = layer;
//! # Ok::<(), tower_ratelimit::ConfigError>(())
//! ```

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::decision::Decision;
use crate::error::KeyRejection;

/// How the layer answers the requests it does not forward: chosen with
/// [`RateLimitLayerBuilder::response_style`](crate::RateLimitLayerBuilder::response_style).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseStyle {
    /// gRPC requests (`content-type: application/grpc…`) get gRPC answers, the others HTTP
    /// answers (the default).
    #[default]
    Auto,
    /// Always HTTP answers: a status such as `429` and a problem+json body.
    Http,
    /// Always gRPC answers: HTTP `200`, trailers-only, with a `grpc-status`.
    Grpc,
}

impl ResponseStyle {
    /// Whether a request of these `headers` gets a gRPC answer.
    pub(crate) fn is_grpc(self, headers: &HeaderMap) -> bool {
        match self {
            ResponseStyle::Http => false,
            ResponseStyle::Grpc => true,
            ResponseStyle::Auto => is_grpc(headers),
        }
    }
}

/// Whether the headers say gRPC: `application/grpc`, alone or with a `+format` or parameters.
fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.len() >= 16
            && v[..16].eq_ignore_ascii_case(b"application/grpc")
            && matches!(v.get(16), None | Some(b'+' | b';'))
    })
}

/// gRPC status codes the limiter answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Code {
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    fn of_status(status: StatusCode) -> Code {
        match status {
            StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
            StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
            StatusCode::BAD_REQUEST => Code::InvalidArgument,
            StatusCode::REQUEST_TIMEOUT => Code::DeadlineExceeded,
            StatusCode::UNAUTHORIZED => Code::Unauthenticated,
            StatusCode::FORBIDDEN => Code::PermissionDenied,
            StatusCode::NOT_FOUND => Code::Unimplemented,
            StatusCode::INTERNAL_SERVER_ERROR => Code::Internal,
            _ => Code::Unknown,
        }
    }
}

const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The gRPC form of one of the limiter's own responses: HTTP `200`, trailers-only, the code
/// and message of what happened, the retry delay in the status details, and the response's
/// headers (rate-limit headers, `retry-after`) kept as metadata. A response that already
/// carries a `grpc-status` (written by a hook) is left as it is.
pub(crate) fn answer(response: Response<Bytes>) -> Response<Bytes> {
    if response.headers().contains_key(GRPC_STATUS) {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let decision = parts
        .extensions
        .get::<Decision>()
        .filter(|d| !d.is_allowed());
    let rejection = parts.extensions.get::<KeyRejection>();
    let (code, message, delay) = status_of(decision, rejection, parts.status);
    // Without an exact delay, the `retry-after` seconds.
    let delay = delay.or_else(|| retry_after_seconds(&parts.headers));
    let violated = decision.map(|d| d.violated().map(|o| o.policy()));
    let details = status_details(code, &message, delay, violated);
    let headers = &mut parts.headers;
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONTENT_TYPE, GRPC);
    headers.insert(GRPC_STATUS, HeaderValue::from(code as u16));
    if let Ok(value) = HeaderValue::from_maybe_shared(percent_encode(&message)) {
        headers.insert(GRPC_MESSAGE, value);
    }
    let details = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details);
    if let Ok(value) = HeaderValue::try_from(details) {
        headers.insert(GRPC_DETAILS, value);
    }
    parts.status = StatusCode::OK;
    Response::from_parts(parts, Bytes::new())
}

/// The gRPC code, message and retry delay of the limiter's own response: a denial (naming the
/// policies violated), a rejected key, or what its HTTP `status` says.
fn status_of(
    decision: Option<&Decision>,
    rejection: Option<&KeyRejection>,
    status: StatusCode,
) -> (Code, String, Option<Duration>) {
    match (decision, rejection) {
        (Some(decision), _) => {
            let mut message = String::from("rate limit exceeded (");
            for (i, o) in decision.violated().enumerate() {
                if i > 0 {
                    message.push_str(", ");
                }
                message.push_str(o.policy());
            }
            message.push(')');
            (Code::ResourceExhausted, message, decision.retry_after())
        }
        (None, Some(rejection)) => (
            Code::of_status(rejection.status()),
            rejection.message().to_owned(),
            None,
        ),
        (None, None) => {
            let code = Code::of_status(status);
            let message = match code {
                Code::Unavailable => "the rate limiter is unavailable".to_owned(),
                _ => status
                    .canonical_reason()
                    .unwrap_or("rate limiter")
                    .to_owned(),
            };
            (code, message, None)
        }
    }
}

/// `grpc-message` as the gRPC protocol encodes it: bytes outside printable ASCII, and `%`,
/// percent-encoded.
fn percent_encode(message: &str) -> Bytes {
    let mut out = Vec::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    Bytes::from(out)
}

/// The delay a `retry-after` of seconds in `headers` says, if it says one.
pub(crate) fn retry_after_seconds(headers: &HeaderMap) -> Option<Duration> {
    let seconds = headers.get(RETRY_AFTER)?.to_str().ok()?.parse().ok()?;
    Some(Duration::from_secs(seconds))
}

/// A `google.rpc.Status` with a `RetryInfo` (when there is a delay) and a `QuotaFailure`
/// (when policies were violated, `violated` naming them), in protobuf's wire format.
fn status_details<'a>(
    code: Code,
    message: &str,
    delay: Option<Duration>,
    violated: Option<impl Iterator<Item = &'a str>>,
) -> Vec<u8> {
    let mut status = Vec::with_capacity(128);
    proto::varint_field(&mut status, 1, code as u64);
    proto::bytes_field(&mut status, 2, message.as_bytes());
    if let Some(delay) = delay {
        // google.protobuf.Duration { seconds = 1; nanos = 2 }, in RetryInfo { retry_delay = 1 }.
        let mut duration = Vec::new();
        proto::varint_field(&mut duration, 1, delay.as_secs());
        proto::varint_field(&mut duration, 2, u64::from(delay.subsec_nanos()));
        let mut retry_info = Vec::new();
        proto::bytes_field(&mut retry_info, 1, &duration);
        proto::any_field(&mut status, 3, "google.rpc.RetryInfo", &retry_info);
    }
    if let Some(violated) = violated {
        // QuotaFailure { repeated Violation violations = 1 }, Violation { subject = 1;
        // description = 2 }.
        let mut failure = Vec::new();
        for policy in violated {
            let mut violation = Vec::new();
            proto::bytes_field(&mut violation, 1, policy.as_bytes());
            proto::bytes_field(&mut violation, 2, b"rate limit exceeded");
            proto::bytes_field(&mut failure, 1, &violation);
        }
        proto::any_field(&mut status, 3, "google.rpc.QuotaFailure", &failure);
    }
    status
}

/// The gRPC status of a message refused inside a stream ([`Limited`](crate::streams::Limited)):
/// its code, message and details, as the layer answers a call.
pub(crate) fn message_status(
    status: StatusCode,
    policy: &str,
    delay: Option<Duration>,
) -> (i32, String, Bytes) {
    let code = Code::of_status(status);
    let message = match code {
        Code::ResourceExhausted => format!("rate limit exceeded ({policy})"),
        Code::Unavailable => "the rate limiter is unavailable".to_owned(),
        _ => status
            .canonical_reason()
            .unwrap_or("rate limiter")
            .to_owned(),
    };
    let violated = (code == Code::ResourceExhausted).then(|| std::iter::once(policy));
    let details = status_details(code, &message, delay, violated);
    (code as i32, message, Bytes::from(details))
}

/// The few pieces of protobuf's wire format the status details need.
mod proto {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A varint field; zero, the default, is left out as protobuf does.
    pub(super) fn varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
        if v != 0 {
            varint(out, field << 3);
            varint(out, v);
        }
    }

    /// A length-delimited field: a string, bytes, or an embedded message.
    pub(super) fn bytes_field(out: &mut Vec<u8>, field: u64, v: &[u8]) {
        varint(out, (field << 3) | 2);
        varint(out, v.len() as u64);
        out.extend_from_slice(v);
    }

    /// A `google.protobuf.Any` field holding the message `value` of type `name`.
    pub(super) fn any_field(out: &mut Vec<u8>, field: u64, name: &str, value: &[u8]) {
        let mut any = Vec::with_capacity(value.len() + 48);
        bytes_field(
            &mut any,
            1,
            format!("type.googleapis.com/{name}").as_bytes(),
        );
        bytes_field(&mut any, 2, value);
        bytes_field(out, field, &any);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types() {
        let grpc = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            is_grpc(&h)
        };
        assert!(grpc("application/grpc"));
        assert!(grpc("application/grpc+proto"));
        assert!(grpc("Application/GRPC;charset=utf-8"));
        assert!(!grpc("application/grpcx"));
        assert!(!grpc("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(&percent_encode("50% of é")[..], b"50%25 of %C3%A9");
    }

    #[test]
    fn varints() {
        let mut out = Vec::new();
        proto::varint_field(&mut out, 1, 300);
        assert_eq!(out, [0x08, 0xac, 0x02]);
    }
}
