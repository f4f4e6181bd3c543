//! Abusive clients: the allow and deny lists (`DENY`, `ALLOW`, or the file's `deny` and
//! `allow`), their entries added at runtime on the admin address
//! (`PUT`/`DELETE /admin/deny/{key}` and `/admin/allow/{key}`, `?until=<unix seconds>`; an
//! entry with a `/` is a network), and
//! the warning before the limit (`NEAR_LIMIT`), blocks on violation (`BLOCK_FOR`,
//! `BLOCK_AFTER`, `BLOCK_MAX`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use tower_ratelimit::key::{Cidr, Key};
use tower_ratelimit::lists::{Entry, Lists};
use tower_ratelimit::{
    ConfigError, LimitError, Policy, Quota, RateLimitLayer, Store, policy::Escalation,
};

use crate::config::{Config, env_or};
use crate::limits::{bad, problem};

/// What the variables say of abusive clients.
pub(crate) struct Abuse {
    /// `DENY` and `ALLOW`, the client address found behind `TRUSTED_PROXIES`.
    pub(crate) lists: Lists,
    /// Whether `DENY` or `ALLOW` is set.
    pub(crate) listed: bool,
    /// `DENY`'s and `ALLOW`'s entries, as given.
    entries: [Vec<String>; 2],
    /// `NEAR_LIMIT`: the percent of its limit a key is warned at.
    pub(crate) near_limit: Option<u8>,
    /// `BLOCK_FOR`, `BLOCK_AFTER`, `BLOCK_MAX`: blocks on violation.
    pub(crate) escalation: Option<Escalation>,
}

/// The variables `CONFIG` replaces (the file has `deny`, `allow`, `near_limit` and the
/// `block_...` keys).
pub(crate) const REPLACED_BY_CONFIG: [&str; 6] = [
    "DENY",
    "ALLOW",
    "NEAR_LIMIT",
    "BLOCK_FOR",
    "BLOCK_AFTER",
    "BLOCK_MAX",
];

/// Reads `DENY`, `ALLOW` and `NEAR_LIMIT`; `proxies` are `TRUSTED_PROXIES`.
pub(crate) fn read(proxies: &[Cidr]) -> Result<Abuse, String> {
    let entries = |name: &str| -> Result<Vec<String>, String> {
        let value = env_or(name, "")?;
        Ok(value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect())
    };
    let (deny, allow) = (entries("DENY")?, entries("ALLOW")?);
    let client_ip = crate::config::client_ip(proxies)?;
    let listed = !deny.is_empty() || !allow.is_empty();
    let lists = (Lists::new().deny(deny.clone()).allow(allow.clone())).client_ip(client_ip);
    let near_limit = match env_or("NEAR_LIMIT", "")?.as_str() {
        "" => None,
        n => match n.parse::<u8>() {
            Ok(n) if (1..=99).contains(&n) => Some(n),
            _ => return Err(format!("NEAR_LIMIT: {n:?} is not a percent from 1 to 99")),
        },
    };
    Ok(Abuse {
        lists,
        listed,
        entries: [deny, allow],
        near_limit,
        escalation: escalation()?,
    })
}

/// `BLOCK_FOR` (the first block), `BLOCK_AFTER` (the denials within a minute that block,
/// default 1) and `BLOCK_MAX` (the longest block, default an hour): blocks doubling for each
/// new block within a day.
fn escalation() -> Result<Option<Escalation>, String> {
    let duration = |name: &str| -> Result<Option<Duration>, String> {
        match env_or(name, "")?.as_str() {
            "" => Ok(None),
            // A duration as a quota's window: 10s, 5min, 1h.
            d => match format!("1/{d}").parse::<Quota>() {
                Ok(q) => Ok(Some(q.window())),
                Err(_) => Err(format!(
                    "{name}: {d:?} is not a duration such as 10s, 5min or 1h"
                )),
            },
        }
    };
    let after = crate::config::positive("BLOCK_AFTER")?;
    let at_most = duration("BLOCK_MAX")?;
    let Some(first) = duration("BLOCK_FOR")? else {
        if after.is_some() || at_most.is_some() {
            return Err("BLOCK_AFTER and BLOCK_MAX need BLOCK_FOR, the first block".into());
        }
        return Ok(None);
    };
    let mut escalation = Escalation::new(first).after(after.unwrap_or(1), Duration::from_secs(60));
    if let Some(at_most) = at_most {
        escalation = escalation.at_most(at_most);
    } else if first > Duration::from_secs(3600) {
        escalation = escalation.at_most(first);
    }
    Ok(Some(escalation))
}

impl Abuse {
    /// Whether every entry of `DENY` and `ALLOW` names requests whose key `KEY` makes (an
    /// address where keys are addresses): an error naming the variable of the first that
    /// does not.
    pub(crate) fn check(
        &self,
        key: Box<dyn tower_ratelimit::key::KeyExtractor>,
    ) -> Result<(), String> {
        let key: std::sync::Arc<dyn tower_ratelimit::key::KeyExtractor> = key.into();
        for (name, entries) in ["DENY", "ALLOW"].into_iter().zip(&self.entries) {
            let lists = match name {
                "DENY" => Lists::new().deny(entries.clone()),
                _ => Lists::new().allow(entries.clone()),
            };
            let lists = lists.key(key.clone());
            RateLimitLayer::builder()
                .policy(Policy::gcra("1/s"))
                .lists(lists)
                .build()
                .map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }

    /// `policy` (of `RATE_LIMIT`) as the variables say.
    pub(crate) fn policy(&self, mut policy: Policy) -> Policy {
        if let Some(percent) = self.near_limit {
            policy = policy.near_limit(percent);
        }
        if let Some(escalation) = self.escalation {
            policy = policy.block_on_violation(escalation);
        }
        policy
    }
}

/// The layer's lists: the file's, or the variables'. The layer always has lists, so that
/// entries can be added at runtime; but with `LEASE` (or a file's policy with a lease), which
/// spends units without asking Redis, they would make every request ask: then only the
/// lists given count (the file's lists say so themselves).
pub(crate) fn lists(config: &Config) -> Result<Lists, String> {
    match &config.file {
        Some((path, limits)) => limits.lists().map_err(|e| format!("CONFIG {path}: {e}")),
        None => Ok(config
            .abuse
            .lists
            .clone()
            .kept_in_store(config.lease.is_none())),
    }
}

/// Which key the lists follow, for the admin routes' errors: the file's `lists_key` or `key`,
/// else `KEY`.
pub(crate) fn lists_follow(config: &Config) -> Arc<str> {
    match &config.file {
        Some((_, limits)) => limits.lists_follow().into(),
        None => format!("the lists' keys are made by KEY={}", config.key).into(),
    }
}

/// The admin routes of the lists' entries, on `layer`; a `{key}` names requests as the
/// lists' key makes keys of them (`follow` says which, in errors).
pub(crate) fn routes<St: Store, M: Send + Sync + 'static, R: Send + Sync + 'static>(
    layer: RateLimitLayer<St, M, R>,
    follow: Arc<str>,
) -> Router {
    let mut router = Router::new();
    for deny in [true, false] {
        let (put_layer, delete_layer) = (layer.clone(), layer.clone());
        let (put_follow, delete_follow) = (follow.clone(), follow.clone());
        let path = if deny {
            "/admin/deny/{key}"
        } else {
            "/admin/allow/{key}"
        };
        router = router.route(
            path,
            put(
                move |Path(key): Path<String>, Query(q): Query<HashMap<String, String>>| {
                    let (layer, follow) = (put_layer.clone(), put_follow.clone());
                    async move { answer(add(&layer, deny, &key, q).await, &follow) }
                },
            )
            .delete(move |Path(key): Path<String>| {
                let (layer, follow) = (delete_layer.clone(), delete_follow.clone());
                async move { answer(remove(&layer, deny, &key).await, &follow) }
            }),
        );
    }
    router
}

/// The entry a path names: a network when it has a `/` (`203.0.113.0/24`); anything else,
/// a single address included, a key (an address grouped as the key groups addresses, obeyed
/// by every instance from its next request, and not counted in the 1,000 networks).
fn entry(text: &str) -> Result<Entry, ConfigError> {
    match text.contains('/') {
        true => text.parse::<Cidr>().map(Entry::Network),
        false => Ok(Entry::Key(Key::from(text))),
    }
}

/// `PUT`: the key or network on the list until `until` (unix seconds), or until taken off.
async fn add<St: Store, M, R>(
    layer: &RateLimitLayer<St, M, R>,
    deny: bool,
    text: &str,
    query: HashMap<String, String>,
) -> Result<Result<(), LimitError>, Response> {
    let until = crate::limits::until(&query).map_err(|e| bad("until", &e))?;
    if let Some(name) = query.keys().find(|k| *k != "until") {
        return Err(bad(name, "unknown parameter; expected until"));
    }
    let entry = entry(text).map_err(|e| bad("network", &e.to_string()))?;
    Ok(match deny {
        true => layer.control().deny(entry, until).await,
        false => layer.control().allow(entry, until).await,
    })
}

/// `DELETE`: the key or network off the list.
async fn remove<St: Store, M, R>(
    layer: &RateLimitLayer<St, M, R>,
    deny: bool,
    text: &str,
) -> Result<Result<(), LimitError>, Response> {
    let entry = entry(text).map_err(|e| bad("network", &e.to_string()))?;
    Ok(match deny {
        true => layer.control().remove_denied(entry).await,
        false => layer.control().remove_allowed(entry).await,
    })
}

/// A change made: 204; a bad parameter: 400 naming it (a key the lists' key never makes:
/// saying which key they follow, `follow`); a store that failed: 503; a layer that keeps no
/// entries (`LEASE`): 409.
fn answer(result: Result<Result<(), LimitError>, Response>, follow: &str) -> Response {
    let error = match result {
        Ok(Ok(())) => return StatusCode::NO_CONTENT.into_response(),
        Ok(Err(error)) => error,
        Err(bad_parameter) => return bad_parameter,
    };
    let status = match error {
        LimitError::Until(e) => return bad("until", &e),
        LimitError::Entry(e) => return bad("key", &format!("{e} ({follow})")),
        LimitError::Network(e) => return bad("network", &e),
        LimitError::NoLists => StatusCode::CONFLICT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    problem(status, &error.to_string(), None)
}
