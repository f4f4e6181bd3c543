//! Rate-limit response headers.
//!
//! Which headers responses carry is chosen with [`HeaderStyle`]. By default
//! ([`HeaderStyle::Legacy`]) every response that went through the limiter carries, for the
//! tightest policy (see [`Decision::tightest`](crate::Decision::tightest)):
//!
//! | header | value |
//! |---|---|
//! | `X-RateLimit-Limit` | the policy's limit (the burst for bucket algorithms) |
//! | `X-RateLimit-Remaining` | units left |
//! | `X-RateLimit-Reset` | seconds until the key is fully reset, rounded up |
//! | `Retry-After` | on a 429 only: seconds until the request would be admitted, rounded up, at least 1 |
//!
//! With [`HeaderStyle::Ietf`] (or [`HeaderStyle::Both`]) it carries the fields of the IETF
//! draft `draft-ietf-httpapi-ratelimit-headers`, with one list item per policy, shadow policies
//! included:
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=10;w=1, "per-user";q=1000;w=3600
//! RateLimit: "per-ip";r=7;t=1, "per-user";r=998;t=3600
//! ```
//!
//! `q` is the policy's limit, `w` its window in seconds, `r` the units remaining and `t` the
//! seconds until the key is fully reset, or, for a violated policy, until it admits the request
//! again; `Retry-After` is never earlier than the `t` of any violated policy.
//!
//! Three optional parts of the draft are available on the builder:
//!
//! - a policy whose units are not requests says so with `qu` ([`Policy::unit`](crate::Policy::unit)):
//!   `"upload";q=10000000;qu="content-bytes";w=60`;
//! - [`partition_keys`](crate::RateLimitLayerBuilder::partition_keys) adds `pk`, a byte
//!   sequence identifying the key the policy counted the request against: the first 16 bytes
//!   of an HMAC-SHA-256 of the key under a secret of yours, never the key itself. Every
//!   instance configured with the same secret sends the same `pk` for the same key;
//! - [`jitter`](crate::RateLimitLayerBuilder::jitter) adds one random delay, drawn afresh for
//!   each response, to every time the response tells (`t`, `Retry-After`,
//!   `X-RateLimit-Reset`), so that clients limited together do not all come back in the same
//!   second. The values are only ever made later, never earlier than the truth.
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

pub(crate) mod value;

use std::fmt::{self, Write as _};
use std::hash::BuildHasher as _;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac as _};
use http::header::Entry;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

use self::value::{ceil_secs, number};
use crate::decision::{Decision, PolicyOutcome};
use crate::error::ConfigError;
use crate::key::Key;
use crate::quota::QuotaUnit;

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which rate-limit headers responses carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` for the tightest
    /// policy (the default).
    #[default]
    Legacy,
    /// The IETF draft fields `RateLimit-Policy` and `RateLimit`
    /// (draft-ietf-httpapi-ratelimit-headers), one list item per policy.
    Ietf,
    /// Both.
    Both,
    /// No rate-limit headers (`Retry-After` is still sent on a 429).
    None,
}

impl std::str::FromStr for HeaderStyle {
    type Err = crate::ConfigError;

    /// Parses `legacy`, `ietf`, `both` or `none`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "legacy" => Ok(HeaderStyle::Legacy),
            "ietf" => Ok(HeaderStyle::Ietf),
            "both" => Ok(HeaderStyle::Both),
            "none" => Ok(HeaderStyle::None),
            _ => Err(crate::ConfigError::new(format!(
                "unknown header style {s:?}; expected legacy, ietf, both or none"
            ))),
        }
    }
}

/// How `X-RateLimit-Reset` is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Seconds from now until the key is fully reset, rounded up (the default).
    #[default]
    DeltaSeconds,
    /// The Unix time (seconds) at which the key is fully reset, rounded up.
    UnixTime,
}

/// Header configuration of a layer.
#[derive(Clone, Debug, Default)]
pub(crate) struct HeaderConfig {
    pub(crate) style: HeaderStyle,
    pub(crate) reset: ResetFormat,
    /// The most one response's times are delayed by (zero: no jitter).
    pub(crate) jitter: Duration,
    /// The secret of the IETF `pk` parameter, if it is sent.
    pub(crate) partition: Option<PartitionKeys>,
}

/// The shortest secret [`PartitionKeys`] accept: 128 bits.
const MIN_SECRET: usize = 16;

/// How many bytes of the HMAC a `pk` carries.
const PK_BYTES: usize = 16;

/// Makes the IETF `pk` parameter of a key: an HMAC-SHA-256 of the key's binary form under a
/// secret, cut to [`PK_BYTES`].
#[derive(Clone)]
pub(crate) struct PartitionKeys(Arc<Hmac<sha2::Sha256>>);

impl fmt::Debug for PartitionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PartitionKeys(<secret>)")
    }
}

impl PartitionKeys {
    /// Keys under `secret`, which must be at least 16 bytes long.
    pub(crate) fn new(secret: &[u8]) -> Result<Self, ConfigError> {
        if secret.len() < MIN_SECRET {
            return Err(ConfigError::new(format!(
                "the partition key secret is {} bytes long; it needs at least {MIN_SECRET} \
                 (random bytes, the same on every instance)",
                secret.len()
            )));
        }
        let mac = Hmac::<sha2::Sha256>::new_from_slice(secret)
            .map_err(|e| ConfigError::new(format!("partition key secret: {e}")))?;
        Ok(PartitionKeys(Arc::new(mac)))
    }

    /// `key`'s `pk`, as the structured-field byte sequence `:BASE64:`.
    pub(crate) fn of(&self, key: &Key) -> String {
        let mut bytes = Vec::with_capacity(48);
        key.encode(&mut bytes);
        let mut mac = (*self.0).clone();
        mac.update(&bytes);
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(2 + 4 * PK_BYTES.div_ceil(3));
        out.push(':');
        base64::engine::general_purpose::STANDARD.encode_string(&digest[..PK_BYTES], &mut out);
        out.push(':');
        out
    }
}

impl HeaderConfig {
    /// Checks what the builder was given; `secret` is the partition key secret, if any.
    pub(crate) fn with_partition(mut self, secret: Option<&[u8]>) -> Result<Self, ConfigError> {
        self.partition = secret.map(PartitionKeys::new).transpose()?;
        Ok(self)
    }

    /// Whether the IETF fields are written (every policy's outcome goes into them).
    pub(crate) fn writes_ietf(&self) -> bool {
        matches!(self.style, HeaderStyle::Ietf | HeaderStyle::Both)
    }

    /// This response's delay: uniform in `[0, jitter]`, drawn from the standard library's
    /// per-process random keys, which change with every draw.
    #[inline]
    fn draw_jitter(&self) -> Duration {
        if self.jitter.is_zero() {
            return Duration::ZERO;
        }
        self.draw_nonzero_jitter()
    }

    #[cold]
    fn draw_nonzero_jitter(&self) -> Duration {
        let span = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
        Duration::from_nanos(random % span.saturating_add(1))
    }
}

/// `RateLimit-Policy` (IETF draft).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The headers of a decision, computed once and applied to the response; small, because it
/// waits in the response future beside the inner service's future.
#[derive(Clone, Debug)]
pub(crate) struct RateLimitHeaders {
    /// What the tightest policy has left, and how many policies decided.
    remaining: u64,
    policies: usize,
    /// `X-RateLimit-Limit` (the policy's, formatted once), `-Remaining` and `-Reset`.
    legacy: Option<(HeaderValue, u64, u64)>,
    /// `RateLimit-Policy` and `RateLimit`.
    ietf: Option<Box<[HeaderValue; 2]>>,
    retry_after: Option<u64>,
}

impl RateLimitHeaders {
    /// The headers of `decision`; `now_us` (the layer's clock, Unix microseconds) is read only
    /// for [`ResetFormat::UnixTime`], and `key_of` (the key a policy tier counted the request
    /// against, by tier id) only for `pk`.
    pub(crate) fn new<'k>(
        decision: &Decision,
        config: &HeaderConfig,
        now_us: impl FnOnce() -> u64,
        key_of: impl Fn(u32) -> Option<&'k Key>,
    ) -> Self {
        let jitter = config.draw_jitter();
        let secs = |d: Duration| ceil_secs(d.saturating_add(jitter));
        let tightest = decision.tightest();
        let mut headers = Self::legacy(
            config,
            jitter,
            now_us,
            (tightest.tier().limit_header(), tightest.remaining()),
            tightest.reset_after(),
        );
        headers.policies = decision.outcomes().len();
        headers.retry_after = decision.retry_after().map(|d| secs(d).max(1));
        headers.ietf = config
            .writes_ietf()
            .then(|| {
                let pk = |o: &PolicyOutcome| {
                    let partition = config.partition.as_ref()?;
                    Some(partition.of(key_of(o.tier().id())?))
                };
                ietf_fields(decision, secs, pk).map(Box::new)
            })
            .flatten();
        headers
    }

    /// The headers of a request admitted by its one policy, whose limit header is `limit`,
    /// with `remaining` units left and fully reset after `reset_after_us`, under a
    /// configuration without IETF fields (see [`HeaderConfig::writes_ietf`]): what
    /// [`RateLimitHeaders::new`] makes of its decision, without one.
    pub(crate) fn admitted_one(
        config: &HeaderConfig,
        now_us: impl FnOnce() -> u64,
        limit: &HeaderValue,
        remaining: u64,
        reset_after_us: u64,
    ) -> Self {
        let reset = Duration::from_micros(reset_after_us);
        Self::legacy(
            config,
            config.draw_jitter(),
            now_us,
            (limit, remaining),
            reset,
        )
    }

    /// The `X-RateLimit-*` headers of the tightest policy, `(limit header, remaining)`, fully
    /// reset after `reset`, if `config` writes them; no other header yet.
    #[inline]
    fn legacy(
        config: &HeaderConfig,
        jitter: Duration,
        now_us: impl FnOnce() -> u64,
        (limit, remaining): (&HeaderValue, u64),
        reset: Duration,
    ) -> Self {
        let legacy = matches!(config.style, HeaderStyle::Legacy | HeaderStyle::Both).then(|| {
            let reset = ceil_secs(reset.saturating_add(jitter));
            let reset = match config.reset {
                ResetFormat::DeltaSeconds => reset,
                ResetFormat::UnixTime => now_us().div_ceil(1_000_000) + reset,
            };
            (limit.clone(), remaining, reset)
        });
        RateLimitHeaders {
            remaining,
            policies: 1,
            legacy,
            ietf: None,
            retry_after: None,
        }
    }

    /// The headers a response charged after it gets: `after`'s (those of the charges'
    /// decision) when they cover every policy these cover, or leave less than these say;
    /// else these (another policy binds).
    pub(crate) fn after_charges(self, after: RateLimitHeaders) -> RateLimitHeaders {
        if after.policies >= self.policies || after.remaining < self.remaining {
            after
        } else {
            self
        }
    }

    /// Adds the headers that are not already there (an inner, more specific limiter wins).
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        fn put(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
            if let Entry::Vacant(vacant) = headers.entry(name) {
                vacant.insert(value);
            }
        }
        if let Some((policy, remaining, reset)) = &self.legacy {
            put(headers, X_RATELIMIT_LIMIT, policy.clone());
            put(headers, X_RATELIMIT_REMAINING, number(*remaining));
            put(headers, X_RATELIMIT_RESET, number(*reset));
        }
        if let Some(ietf) = &self.ietf {
            let [policy, state] = &**ietf;
            put(headers, RATELIMIT_POLICY, policy.clone());
            put(headers, RATELIMIT, state.clone());
        }
        if let Some(retry) = self.retry_after {
            put(headers, RETRY_AFTER, number(retry));
        }
    }

    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

/// One outcome per policy (tier) name of `decision`, in the order the names come: a batch
/// checks a policy once per key of its calls, and its fields describe each policy by its
/// tightest key (denied before admitted; the longest wait among denials, the fewest units left
/// among admissions), so that they are of one size whatever the batch.
fn per_policy(decision: &Decision) -> SmallVec<[&PolicyOutcome; 4]> {
    let mut each: SmallVec<[&PolicyOutcome; 4]> = SmallVec::new();
    let tighter =
        |o: &PolicyOutcome, than: &PolicyOutcome| match (o.is_allowed(), than.is_allowed()) {
            (false, true) => true,
            (true, false) => false,
            (false, false) => {
                let wait = |o: &PolicyOutcome| o.retry_after().unwrap_or(Duration::MAX);
                wait(o) > wait(than)
            }
            (true, true) => o.remaining() < than.remaining(),
        };
    for o in decision.outcomes() {
        match each.iter_mut().find(|e| e.policy() == o.policy()) {
            Some(e) if tighter(o, e) => *e = o,
            Some(_) => {}
            None => each.push(o),
        }
    }
    each
}

/// `RateLimit-Policy` and `RateLimit`: one list item per policy, shadow policies included;
/// `secs` writes a time in seconds (rounded up, jitter added), `pk` gives a policy's `pk`.
/// The largest integer a structured field carries (RFC 9651, 15 digits): a larger number (a
/// reply from a store behind a faulty proxy) is written as this.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

fn ietf_fields(
    decision: &Decision,
    secs: impl Fn(Duration) -> u64,
    pk: impl Fn(&PolicyOutcome) -> Option<String>,
) -> Option<[HeaderValue; 2]> {
    let mut policy = String::new();
    let mut state = String::new();
    for (i, o) in per_policy(decision).into_iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        // Policy names are restricted to characters that need no escaping in an sf-string
        // (letters, digits and -_.:/).
        let _ = write!(policy, "\"{}\";q={}", o.policy(), o.limit());
        let unit = o.tier().unit();
        if unit != QuotaUnit::Requests {
            let _ = write!(policy, ";qu=\"{unit}\"");
        }
        let remaining = o.remaining().min(SF_INTEGER_MAX);
        let _ = write!(state, "\"{}\";r={remaining}", o.policy());
        // A concurrency limit has no window, and no time at which it resets: its slots free
        // when requests end. Its item leaves `w` and `t` out (both optional).
        if !o.tier().limits_in_flight() {
            let w = ceil_secs(o.window()).clamp(1, SF_INTEGER_MAX);
            let _ = write!(policy, ";w={w}");
            // For a violated policy, `t` is when it admits the request again, which
            // Retry-After never precedes; otherwise when its key is fully reset.
            let t = match o.retry_after() {
                Some(retry) if !o.is_allowed() => secs(retry).max(1),
                _ => secs(o.reset_after()),
            };
            let _ = write!(state, ";t={}", t.min(SF_INTEGER_MAX));
        }
        if let Some(pk) = pk(o) {
            let _ = write!(policy, ";pk={pk}");
            let _ = write!(state, ";pk={pk}");
        }
    }
    Some([
        HeaderValue::try_from(policy).ok()?,
        HeaderValue::try_from(state).ok()?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Verdict};
    use crate::policy::Tier;
    use crate::store::Op;
    use smallvec::smallvec;

    /// Found by the `reply` and `ietf` fuzz targets: a reply from a store behind a faulty
    /// proxy said 2^63 - 1 units remain, and `r=` was longer than a structured field's 15
    /// digits, so clients' parsers refused the whole field.
    #[test]
    fn numbers_past_what_a_field_carries_are_its_largest() {
        let quota = "10/s".parse().unwrap();
        let tier = Tier::alone("g", 0, Algorithm::Gcra, quota, Op::Enforce).unwrap();
        let verdict = Verdict {
            allowed: false,
            remaining: i64::MAX as u64,
            reset_after_us: u64::MAX,
            retry_after_us: Some(u64::MAX),
        };
        let decision = Decision::new(smallvec![PolicyOutcome::new(&tier, false, verdict)]);
        let [policy, state] = ietf_fields(&decision, ceil_secs, |_| None).unwrap();
        for field in [policy, state] {
            let text = field.to_str().unwrap();
            let list: Result<sfv::List, _> = sfv::Parser::new(text).parse_list();
            assert!(list.is_ok(), "{text}");
        }
    }
}
