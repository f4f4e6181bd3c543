//! The responses the limiter writes itself: 429, rejected keys, unavailable store.
//!
//! By default they are small `application/problem+json` documents (RFC 9457) that say what
//! happened in a machine-readable way. A limited request gets the problem type that
//! draft-ietf-httpapi-ratelimit-headers defines for an exceeded quota, with its
//! `violated-policies` member (the policies' names, as in the headers), and two members of our
//! own: `violated` (the same names) and `retry_after` (the `Retry-After` seconds, `null` when
//! the request can never be admitted):
//!
//! ```json
//! {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//!  "title":"Quota exceeded","status":429,"detail":"rate limit exceeded",
//!  "violated-policies":["gcra:10/s"],"violated":["gcra:10/s"],"retry_after":1}
//! ```
//!
//! When the store fails under [`FailurePolicy::Closed`](crate::FailurePolicy::Closed), the
//! `503` uses the draft's `temporary-reduced-capacity` type. A rejected key (no client
//! address, a malformed header) gets `about:blank` with its status and a `code` member.
//!
//! The status of a limited response and the whole response can be changed on the builder.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::decision::Decision;
use crate::error::KeyRejection;
use crate::grpc::ResponseStyle;
use crate::headers::RateLimitHeaders;
use crate::refusal::{CallOver, Refusal};

pub(crate) type LimitedHook = Arc<dyn Fn(&Decision) -> Response<Bytes> + Send + Sync>;
pub(crate) type RejectedHook = Arc<dyn Fn(&KeyRejection) -> Response<Bytes> + Send + Sync>;

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The problem type of an exceeded quota (draft-ietf-httpapi-ratelimit-headers).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The problem type of a request refused by a deny list
/// ([`Lists`](crate::lists::Lists)), answered `403 Forbidden`. Its `detail` says whether the
/// client's network or its key is on the list: `"the client's network is on the deny list"`
/// or `"the client's key is on the deny list"`; nothing names the entry.
pub const DENIED: &str =
    "https://docs.rs/tower-ratelimit/latest/tower_ratelimit/response/constant.DENIED.html";

/// The problem type of a service that cannot serve at its full capacity for a while
/// (draft-ietf-httpapi-ratelimit-headers): the limiter's store failed.
pub const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// How the limiter answers when it does not forward a request.
#[derive(Clone)]
pub(crate) struct Responses {
    pub(crate) status: StatusCode,
    pub(crate) style: ResponseStyle,
    pub(crate) on_limited: Option<LimitedHook>,
    pub(crate) on_rejected: Option<RejectedHook>,
}

impl std::fmt::Debug for Responses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responses")
            .field("status", &self.status)
            .field("style", &self.style)
            .field("on_limited", &self.on_limited.as_ref().map(|_| "custom"))
            .field("on_rejected", &self.on_rejected.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl Default for Responses {
    fn default() -> Self {
        Responses {
            status: StatusCode::TOO_MANY_REQUESTS,
            style: ResponseStyle::Auto,
            on_limited: None,
            on_rejected: None,
        }
    }
}

impl Responses {
    /// The HTTP answer of `refusal`, in gRPC's form when `grpc`; `calls` names the calls that
    /// were over in the problem document of a denied batch. Its extensions carry what it says
    /// of the refusal (`Refused`), and a denial's [`Decision`] or a rejected key's
    /// [`KeyRejection`].
    pub(crate) fn render(
        &self,
        refusal: Refusal,
        grpc: bool,
        calls: Option<Vec<CallOver>>,
    ) -> Response<Bytes> {
        let refused = refusal.refused(self.status);
        let mut response = match refusal {
            Refusal::Limited { decision, headers } => {
                let mut response = self.limited(&decision, &headers);
                if let Some(calls) = calls.filter(|_| !grpc) {
                    response = with_calls(response, &calls);
                }
                response.extensions_mut().insert(decision);
                response
            }
            Refusal::Denied(why) => self.denied(why.detail()),
            Refusal::Shed(policy) => self.shed(&policy),
            Refusal::Rejected(rejection) => self.rejected(&rejection),
            Refusal::Unavailable => self.unavailable(),
        };
        response.extensions_mut().insert(refused);
        match grpc {
            true => crate::grpc::answer(response),
            false => response,
        }
    }

    /// The response to a denied request, with the rate-limit headers and `Retry-After`.
    pub(crate) fn limited(
        &self,
        decision: &Decision,
        headers: &RateLimitHeaders,
    ) -> Response<Bytes> {
        let mut response = match &self.on_limited {
            Some(hook) => hook(decision),
            None => {
                let mut body = problem(
                    QUOTA_EXCEEDED,
                    "Quota exceeded",
                    self.status,
                    "rate limit exceeded",
                );
                for member in ["violated-policies", "violated"] {
                    write!(body, ",\"{member}\":[").unwrap();
                    for (i, o) in decision.violated().enumerate() {
                        if i > 0 {
                            body.push(',');
                        }
                        push_json_str(&mut body, o.policy());
                    }
                    body.push(']');
                }
                match headers.retry_after() {
                    Some(s) => write!(body, ",\"retry_after\":{s}").unwrap(),
                    None => body.push_str(",\"retry_after\":null"),
                }
                body.push('}');
                let mut r = Response::new(Bytes::from(body));
                *r.status_mut() = self.status;
                r.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
                r
            }
        };
        headers.apply(response.headers_mut());
        response
    }

    /// The response to a request without a key, with the rejection in its extensions (the
    /// gRPC form reads it).
    pub(crate) fn rejected(&self, rejection: &KeyRejection) -> Response<Bytes> {
        let mut r = self.rejected_response(rejection);
        r.extensions_mut().insert(rejection.clone());
        r
    }

    fn rejected_response(&self, rejection: &KeyRejection) -> Response<Bytes> {
        if let Some(hook) = &self.on_rejected {
            return hook(rejection);
        }
        let status = rejection.status();
        let title = status.canonical_reason().unwrap_or("Error");
        let mut body = problem("about:blank", title, status, rejection.message());
        body.push_str(",\"code\":");
        push_json_str(&mut body, rejection.code());
        body.push('}');
        let mut r = Response::new(Bytes::from(body));
        *r.status_mut() = rejection.status();
        r.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
        r
    }

    /// The response when the store failed and the failure policy is closed.
    pub(crate) fn unavailable(&self) -> Response<Bytes> {
        Self::reduced("the rate limiter is unavailable")
    }

    /// The `403` of a request on a deny list, saying `detail`.
    pub(crate) fn denied(&self, detail: &str) -> Response<Bytes> {
        let status = StatusCode::FORBIDDEN;
        let mut body = problem(DENIED, "Forbidden", status, detail);
        body.push('}');
        let mut r = Response::new(Bytes::from(body));
        *r.status_mut() = status;
        r.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
        r
    }

    /// The response to a request over the adaptive concurrency limit of `policy`.
    pub(crate) fn shed(&self, policy: &str) -> Response<Bytes> {
        Self::reduced(&format!(
            "the service is at its capacity: the adaptive concurrency limit of {policy} is reached"
        ))
    }

    /// A `503` of the problem type `temporary-reduced-capacity`, saying `detail`.
    fn reduced(detail: &str) -> Response<Bytes> {
        let status = StatusCode::SERVICE_UNAVAILABLE;
        let mut body = problem(
            TEMPORARY_REDUCED_CAPACITY,
            "Temporary reduced capacity",
            status,
            detail,
        );
        body.push('}');
        let mut r = Response::new(Bytes::from(body));
        *r.status_mut() = status;
        r.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u32));
        r
    }
}

/// `response`, a denial of a JSON-RPC batch, naming in its problem document (`calls`) each
/// call that was over; a body that is no JSON object (a hook's) is left as it is.
fn with_calls(response: Response<Bytes>, calls: &[CallOver]) -> Response<Bytes> {
    let body = response.body();
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace());
    let Some(end) = end.filter(|&end| is_object(body) && body[end] == b'}') else {
        return response;
    };
    let mut written = String::from_utf8_lossy(&body[..end]).into_owned();
    let empty = written.trim_end().ends_with('{');
    written.push_str(if empty { "\"calls\":[" } else { ",\"calls\":[" });
    for (n, call) in calls.iter().enumerate() {
        if n > 0 {
            written.push(',');
        }
        written.push_str(call.json());
    }
    written.push_str("]}");
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(http::header::CONTENT_LENGTH);
    Response::from_parts(parts, Bytes::from(written))
}

/// Whether `body` is a JSON object.
fn is_object(body: &[u8]) -> bool {
    #[cfg(feature = "json")]
    return matches!(
        serde_json::from_slice::<serde_json::Value>(body),
        Ok(serde_json::Value::Object(_))
    );
    #[cfg(not(feature = "json"))]
    {
        let _ = body;
        false
    }
}

/// The common members of a problem document, without the closing brace.
fn problem(kind: &str, title: &str, status: StatusCode, detail: &str) -> String {
    let mut s = String::with_capacity(192);
    s.push_str("{\"type\":");
    push_json_str(&mut s, kind);
    s.push_str(",\"title\":");
    push_json_str(&mut s, title);
    write!(s, ",\"status\":{},\"detail\":", status.as_u16()).unwrap();
    push_json_str(&mut s, detail);
    s
}

/// Appends `value` as a JSON string literal.
pub(crate) fn push_json_str(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).unwrap(),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        let mut s = String::new();
        push_json_str(&mut s, "a\"b\\c\n\u{1}é");
        assert_eq!(s, r#""a\"b\\c\n\u0001é""#);
    }
}
