//! What an upstream's response says it has left: a limit (with its window, when named) and
//! the units remaining under it, which correct the layer's policy of the same limit.
//!
//! Read from, each found counted:
//!
//! * the IETF fields: `RateLimit-Policy: "default";q=100;w=60` joined by policy name with
//!   `RateLimit: "default";r=40;t=30`, and the drafts' older forms, the dictionary
//!   `RateLimit: limit=100, remaining=40, reset=30` and the three fields `RateLimit-Limit`
//!   (`100`, or `100, 100;w=60`), `RateLimit-Remaining` and `RateLimit-Reset`;
//! * `X-RateLimit-Limit` (a number, or that same list) with `X-RateLimit-Remaining`;
//! * OpenAI's `x-ratelimit-limit-requests` with `x-ratelimit-remaining-requests` (and of
//!   tokens), Anthropic's `anthropic-ratelimit-requests-limit` with
//!   `anthropic-ratelimit-requests-remaining` (and of tokens, input and output tokens).
//!
//! A value that cannot be read is ignored: an upstream's headers are input.

use std::time::Duration;

use http::HeaderMap;
use smallvec::SmallVec;

#[cfg(test)]
use super::upstream::headers;
use super::upstream::{seconds, split_outside_quotes};

/// One limit an upstream reports: its units, its window when it names one, and what is left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Count {
    limit: u64,
    window: Option<Duration>,
    remaining: u64,
}

impl Count {
    /// The units left.
    pub(crate) fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Whether this is the limit of a policy of `limit` units a `window`.
    pub(crate) fn is_of(&self, limit: u64, window: Duration) -> bool {
        self.limit == limit && self.window.is_none_or(|w| w == window)
    }
}

/// The fields of a limit and its remaining units, in the families that name them so.
const PAIRS: [(&str, &str); 8] = [
    ("ratelimit-limit", "ratelimit-remaining"),
    ("x-ratelimit-limit", "x-ratelimit-remaining"),
    (
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
    ),
    ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens"),
    (
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
    ),
    (
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
    ),
    (
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
    ),
    (
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
    ),
];

/// Every limit `headers` report with what is left of it.
pub(crate) fn counts(headers: &HeaderMap) -> SmallVec<[Count; 2]> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    let mut counts = ietf(headers);
    for (limit, remaining) in PAIRS {
        let Some(remaining) = text(remaining).and_then(|r| r.parse().ok()) else {
            continue;
        };
        if let Some((limit, window)) = text(limit).and_then(limit_list) {
            counts.push(Count {
                limit,
                window,
                remaining,
            });
        }
    }
    counts
}

/// A limit field's value: `100`, or `100, 100;w=60` (the drafts' list; the window of the
/// item that names one).
fn limit_list(value: &str) -> Option<(u64, Option<Duration>)> {
    let items = split_outside_quotes(value, ',');
    let limit = items.first()?.trim().parse().ok()?;
    let window = items.iter().skip(1).find_map(|item| {
        let mut params = split_outside_quotes(item, ';').into_iter();
        (params.next()?.trim().parse::<u64>().ok()? == limit).then_some(())?;
        params.find_map(|p| match p.split_once('=') {
            Some((k, v)) if k.trim() == "w" => seconds(v),
            _ => None,
        })
    });
    Some((limit, window))
}

/// The IETF fields' counts: `RateLimit-Policy`'s quotas and windows joined by name with
/// `RateLimit`'s remaining units, or the dictionary form's limit and remaining.
fn ietf(headers: &HeaderMap) -> SmallVec<[Count; 2]> {
    let mut counts = SmallVec::new();
    let values = |name| {
        let all = headers.get_all(name).into_iter();
        all.filter_map(|v| v.to_str().ok()).collect::<Vec<_>>()
    };
    let quotas: Vec<(String, Params)> = values("ratelimit-policy")
        .into_iter()
        .flat_map(items)
        .collect();
    for value in values("ratelimit") {
        for (name, params) in items(value) {
            let remaining = params.get("r").or(params.get("remaining"));
            let Some(remaining) = remaining.and_then(|r| r.parse().ok()) else {
                continue;
            };
            let quota = quotas.iter().find(|(n, _)| *n == name).map(|(_, q)| q);
            let limit = quota.and_then(|q| q.get("q")).or(params.get("limit"));
            let Some(limit) = limit.and_then(|l| l.parse().ok()) else {
                continue;
            };
            let window = quota.and_then(|q| q.get("w")).and_then(seconds);
            counts.push(Count {
                limit,
                window,
                remaining,
            });
        }
    }
    counts
}

/// An item's parameters, by name.
#[derive(Default)]
struct Params(SmallVec<[(String, String); 4]>);

impl Params {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The items of a structured field's list, each its name (unquoted) and parameters; the
/// drafts' dictionary (`limit=100, remaining=40, reset=30`) is one item with no name.
fn items(value: &str) -> Vec<(String, Params)> {
    let members = split_outside_quotes(value, ',');
    let pair = |p: &str| {
        let (k, v) = p.split_once('=')?;
        Some((k.trim().to_owned(), v.trim().to_owned()))
    };
    let dictionary = members
        .iter()
        .all(|m| !m.trim_start().starts_with('"') && m.contains('=') && !m.contains(';'));
    if dictionary {
        return vec![(
            String::new(),
            Params(members.iter().filter_map(|m| pair(m)).collect()),
        )];
    }
    members
        .iter()
        .map(|member| {
            let mut parts = split_outside_quotes(member, ';').into_iter();
            let name = parts.next().unwrap_or_default().trim().trim_matches('"');
            (name.to_owned(), Params(parts.filter_map(pair).collect()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(limit: u64, window: Option<u64>, remaining: u64) -> Count {
        let window = window.map(Duration::from_secs);
        Count {
            limit,
            window,
            remaining,
        }
    }

    #[test]
    fn the_ietf_fields_are_joined_by_policy_name() {
        let h = headers(&[
            (
                "ratelimit-policy",
                "\"burst\";q=10;w=1, \"day\";q=1000;w=86400",
            ),
            ("ratelimit", "\"day\";r=400;t=3600, \"burst\";r=3;t=1"),
        ]);
        assert_eq!(
            counts(&h).to_vec(),
            vec![count(1000, Some(86400), 400), count(10, Some(1), 3)]
        );
        // Without its policy, an item names no limit.
        let h = headers(&[("ratelimit", "\"day\";r=400;t=3600")]);
        assert!(counts(&h).is_empty());
    }

    #[test]
    fn the_drafts_older_forms_are_read() {
        let h = headers(&[("ratelimit", "limit=100, remaining=40, reset=30")]);
        assert_eq!(counts(&h).to_vec(), vec![count(100, None, 40)]);
        let h = headers(&[
            ("ratelimit-limit", "100, 100;w=60"),
            ("ratelimit-remaining", "7"),
            ("ratelimit-reset", "30"),
        ]);
        assert_eq!(counts(&h).to_vec(), vec![count(100, Some(60), 7)]);
    }

    #[test]
    fn the_x_ratelimit_and_providers_fields_are_read() {
        let h = headers(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4990"),
            ("x-ratelimit-limit-tokens", "90000"),
            ("x-ratelimit-remaining-tokens", "1200"),
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
        ]);
        assert_eq!(
            counts(&h).to_vec(),
            vec![
                count(5000, None, 4990),
                count(90000, None, 1200),
                count(50, None, 49)
            ]
        );
    }

    #[test]
    fn values_that_cannot_be_read_are_ignored() {
        let h = headers(&[
            ("x-ratelimit-limit", "lots"),
            ("x-ratelimit-remaining", "4"),
            ("ratelimit-limit", "10"),
            ("ratelimit-remaining", "-1"),
            ("ratelimit-policy", "\"a\";q=x;w=1"),
            ("ratelimit", "\"a\";r=1, \"unclosed;r=2"),
        ]);
        assert!(counts(&h).is_empty());
    }

    #[test]
    fn a_count_is_of_a_policy_of_its_limit_and_window() {
        let minute = Duration::from_secs(60);
        assert!(count(100, Some(60), 1).is_of(100, minute));
        assert!(count(100, None, 1).is_of(100, minute));
        assert!(!count(100, Some(1), 1).is_of(100, minute));
        assert!(!count(50, None, 1).is_of(100, minute));
    }
}
