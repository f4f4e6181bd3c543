//! Costs known only once the response is done (an LLM's tokens, the bytes a download sent):
//! where a policy reads a response's real cost ([`Settle`]), and what a handler reports it
//! with ([`ActualCost`]); a body that is counted is counted as it streams.
//!
//! A request is admitted against an estimate (the policy's [`cost`](crate::Policy::cost)),
//! charged up front as any other. Once the real cost is known the difference is settled in
//! the store, atomically, by one operation (`Op::Settle`): given back when the real cost is
//! lower, charged when it is higher, past the limit if need be. A key that owes units is
//! denied until time has paid them back, and `Retry-After` says when.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Extensions;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;

use crate::error::ConfigError;

#[cfg(feature = "json")]
mod json;
#[cfg(all(fuzzing, feature = "json"))]
pub(crate) use json::JsonCost;
pub(crate) mod meter;

/// The real cost of a response, in the policy's units, set by the handler in the response's
/// extensions for a policy that settles from them ([`Settle::extension`]).
///
/// ```
/// use http::Response;
/// use tower_ratelimit::settle::ActualCost;
///
/// let mut response = Response::new("a completion of 1,234 tokens");
/// response.extensions_mut().insert(ActualCost(1_234));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActualCost(pub u64);

/// Where a policy reads what a response really cost ([`Policy::settle`](crate::Policy::settle)):
/// from the response head (an [extension](Settle::extension) the handler sets, a
/// [header](Settle::header)), or from its body as it streams (its [bytes](Settle::body_bytes),
/// a [function of its frames](Settle::body), a [trailer](Settle::trailer)), settled when the
/// body ends, fails, or is dropped.
///
/// A reported cost is clamped to [`at_most`](Settle::at_most) times the policy's limit; one
/// that is missing or not a number leaves the estimate charged. Each case is counted in
/// `ratelimit_costs_clamped_total`.
///
/// ```
/// use tower_ratelimit::{Policy, settle::Settle};
///
/// // 100,000 tokens a minute per key: admitted on the request's `max_tokens` (parsed by the
/// // application into a header here), settled on what the response says it used.
/// let tokens = Policy::token_bucket("100000/min")
///     .name("tokens")
///     .cost(|r| {
///         r.headers()
///             .get("x-max-tokens")
///             .and_then(|v| v.to_str().ok()?.parse().ok())
///             .unwrap_or(1_000)
///     })
///     .settle(Settle::header("x-tokens-used").at_most(5));
/// # let _ = tokens;
/// ```
#[derive(Clone)]
pub struct Settle {
    source: CostSource,
    at_most: u32,
    /// The longest time a settled cost may leave the key owing (microseconds), if bounded:
    /// an egress layer's `max_pause`.
    owing_at_most_us: Option<u64>,
}

/// Where the real cost is read.
#[derive(Clone)]
enum CostSource {
    Extension,
    Header(Result<HeaderName, String>),
    Trailer(Result<HeaderName, String>),
    BodyBytes,
    Body(FrameFn),
    /// A JSON pointer into the body's JSON (or its last server-sent event's), or the text
    /// that is none.
    #[cfg(feature = "json")]
    Json(Result<Arc<str>, String>),
}

type FrameFn = Arc<dyn Fn(&Frame<Bytes>) -> u64 + Send + Sync>;

/// How many times the policy's limit a reported cost may be by default
/// ([`Settle::at_most`]).
pub const DEFAULT_AT_MOST: u32 = 10;

/// The largest [`Settle::at_most`]: a debt of a thousand times the limit keeps every
/// algorithm's arithmetic exact, in Rust and in the Redis script.
pub const MAX_AT_MOST: u32 = 1_000;

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            CostSource::Extension => "extension".to_owned(),
            CostSource::Header(name) => format!("header {}", display(name)),
            CostSource::Trailer(name) => format!("trailer {}", display(name)),
            CostSource::BodyBytes => "body bytes".to_owned(),
            CostSource::Body(_) => "body frames".to_owned(),
            #[cfg(feature = "json")]
            CostSource::Json(pointer) => format!("body json {}", display(pointer)),
        };
        f.debug_struct("Settle")
            .field("source", &source)
            .field("at_most", &self.at_most)
            .field("owing_at_most_us", &self.owing_at_most_us)
            .finish()
    }
}

fn display<T: AsRef<str>>(name: &Result<T, String>) -> &str {
    match name {
        Ok(name) => name.as_ref(),
        Err(raw) => raw,
    }
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| name.to_owned())
}

impl Settle {
    fn new(source: CostSource) -> Self {
        Settle {
            source,
            at_most: DEFAULT_AT_MOST,
            owing_at_most_us: None,
        }
    }

    /// The cost the handler sets in the response's extensions as an [`ActualCost`].
    pub fn extension() -> Self {
        Settle::new(CostSource::Extension)
    }

    /// The cost in the response header `name` (a decimal integer), e.g. the tokens an LLM
    /// proxy reports. A name that is not a valid header name is an error of
    /// [`build`](crate::RateLimitLayerBuilder::build).
    pub fn header(name: &str) -> Self {
        Settle::new(CostSource::Header(header_name(name)))
    }

    /// The cost in the trailer `name` (a decimal integer) of a response whose body ends with
    /// trailers (gRPC, HTTP/2 streams), settled when the body ends.
    pub fn trailer(name: &str) -> Self {
        Settle::new(CostSource::Trailer(header_name(name)))
    }

    /// The bytes of the response body's data frames, counted as it streams and settled when
    /// it ends, fails, or is dropped (then what was sent so far).
    pub fn body_bytes() -> Self {
        Settle::new(CostSource::BodyBytes)
    }

    /// The number at `pointer` (RFC 6901, `/usage/total_tokens`) of the response body's JSON,
    /// as LLM APIs report what a completion cost; when the response is a stream of
    /// server-sent events (`text/event-stream`), of the last event whose JSON `data` has it,
    /// as they send it when streaming. Settled when the body ends (a body or an event over
    /// 1 MiB, or one without the number, settles nothing: the estimate stays). A pointer that
    /// is none is an error of [`build`](crate::RateLimitLayerBuilder::build).
    ///
    /// ```
    /// use tower_ratelimit::{Policy, QuotaUnit, settle::Settle};
    ///
    /// // 100,000 tokens a minute, each call charged its max_tokens, then what it used.
    /// let tokens = Policy::token_bucket("100000/min")
    ///     .unit(QuotaUnit::Tokens)
    ///     .cost_json("/max_tokens")
    ///     .settle(Settle::json("/usage/total_tokens"));
    /// # let _ = tokens;
    /// ```
    #[cfg(feature = "json")]
    pub fn json(pointer: &str) -> Self {
        let checked = crate::key::check_pointer(pointer).map(|()| Arc::from(pointer));
        Settle::new(CostSource::Json(checked.map_err(|_| pointer.to_owned())))
    }

    /// The sum of `count` over the response body's frames (data and trailers), e.g. the
    /// tokens of a stream of server-sent events, settled as [`body_bytes`](Self::body_bytes)
    /// is.
    pub fn body<F>(count: F) -> Self
    where
        F: Fn(&Frame<Bytes>) -> u64 + Send + Sync + 'static,
    {
        Settle::new(CostSource::Body(Arc::new(count)))
    }

    /// Clamps a reported cost to `times` the policy's limit (the burst of a bucket algorithm),
    /// [`DEFAULT_AT_MOST`] unless set: a cost above is taken as that bound, and counted. From
    /// 1 to [`MAX_AT_MOST`].
    #[must_use]
    pub fn at_most(mut self, times: u32) -> Self {
        self.at_most = times;
        self
    }

    /// The same, a settled cost charging no more past the estimate than the policy's rate
    /// pays back in `pause`: the debt one call leaves pauses its key `pause` at most.
    pub(crate) fn owing_at_most(mut self, pause: std::time::Duration) -> Self {
        self.owing_at_most_us = Some(u64::try_from(pause.as_micros()).unwrap_or(u64::MAX));
        self
    }

    /// The mistakes of this setting, if any.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_AT_MOST).contains(&self.at_most) {
            return Err(ConfigError::new(format!(
                "settle(...).at_most({}) is out of range: a reported cost is clamped to 1 to \
                 {MAX_AT_MOST} times the policy's limit",
                self.at_most
            )));
        }
        match &self.source {
            CostSource::Header(Err(name)) | CostSource::Trailer(Err(name)) => Err(
                ConfigError::new(format!("settle: {name:?} is not a valid header name")),
            ),
            #[cfg(feature = "json")]
            CostSource::Json(Err(pointer)) => {
                crate::key::check_pointer(pointer).map_err(|e| e.context("settle"))
            }
            _ => Ok(()),
        }
    }

    /// Whether the cost is read from the body (settled when it ends), not the head.
    pub(crate) fn reads_body(&self) -> bool {
        matches!(
            &self.source,
            CostSource::Trailer(_) | CostSource::BodyBytes | CostSource::Body(_)
        ) || self.reads_json()
    }

    /// Whether it reads the body's JSON.
    fn reads_json(&self) -> bool {
        #[cfg(feature = "json")]
        if let CostSource::Json(_) = self.source {
            return true;
        }
        false
    }

    /// The cost a response head reports, for a cost read from the head.
    fn read_head(&self, headers: &HeaderMap, extensions: &Extensions) -> Reading {
        match &self.source {
            CostSource::Extension => extensions
                .get::<ActualCost>()
                .map_or(Reading::Missing, |c| Reading::Cost(c.0)),
            CostSource::Header(Ok(name)) => Reading::of(headers.get(name)),
            _ => Reading::Missing,
        }
    }
}

/// A reported cost, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reading {
    Cost(u64),
    Negative,
    Invalid,
    Missing,
}

impl Reading {
    /// A header's value: a decimal integer (surrounding spaces allowed); larger than any
    /// bound when it overflows.
    pub(crate) fn of(value: Option<&HeaderValue>) -> Reading {
        let Some(value) = value else {
            return Reading::Missing;
        };
        let text = value.as_bytes().trim_ascii();
        let (negative, digits) = match text.strip_prefix(b"-") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Reading::Invalid;
        }
        if negative {
            return match digits.iter().all(|&d| d == b'0') {
                true => Reading::Cost(0),
                false => Reading::Negative,
            };
        }
        let cost = digits.iter().fold(0u64, |n, &d| {
            n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
        });
        Reading::Cost(cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(value: &str) -> Reading {
        Reading::of(Some(&HeaderValue::from_str(value).unwrap()))
    }

    #[test]
    fn a_reported_cost_is_read_as_a_decimal_integer() {
        assert_eq!(read("1234"), Reading::Cost(1234));
        assert_eq!(read(" 42 "), Reading::Cost(42));
        assert_eq!(read("0"), Reading::Cost(0));
        assert_eq!(read("-0"), Reading::Cost(0));
        assert_eq!(read("-5"), Reading::Negative);
        assert_eq!(read("12.5"), Reading::Invalid);
        assert_eq!(read("ten"), Reading::Invalid);
        assert_eq!(read(""), Reading::Invalid);
        assert_eq!(read("-"), Reading::Invalid);
        assert_eq!(read("99999999999999999999999"), Reading::Cost(u64::MAX));
        assert_eq!(Reading::of(None), Reading::Missing);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(Settle::header("x-tokens").validate().is_ok());
        let bad = Settle::header("not a name").validate().unwrap_err();
        assert!(bad.to_string().contains("not a valid header name"), "{bad}");
        assert!(Settle::trailer("").validate().is_err());
        let zero = Settle::body_bytes().at_most(0).validate().unwrap_err();
        assert!(zero.to_string().contains("at_most(0)"), "{zero}");
        assert!(Settle::body_bytes().at_most(MAX_AT_MOST).validate().is_ok());
        assert!(
            Settle::extension()
                .at_most(MAX_AT_MOST + 1)
                .validate()
                .is_err()
        );
    }
}
