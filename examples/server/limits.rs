//! `PUT /admin/limits/{policy}/{key}?quota=20/min[&until=<unix seconds>]` and
//! `DELETE /admin/limits/{policy}/{key}`: one key's own limit, set and cleared on every
//! instance sharing the store (`RateLimitLayer::set_limit`, `clear_limit`). They answer 204;
//! a bad parameter gets 400 with a problem+json body naming it, a store that fails 503.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use tower_ratelimit::key::Key;
use tower_ratelimit::{LimitError, Quota, RateLimitLayer, Store};

/// The routes, on `layer`. A `{key}` names requests as the policy's key makes keys of them
/// (an address in any form, a token): the library turns it into their key, or refuses it.
pub(crate) fn routes<St: Store, M: Send + Sync + 'static, R: Send + Sync + 'static>(
    layer: RateLimitLayer<St, M, R>,
) -> Router {
    let cleared = layer.clone();
    Router::new().route(
        "/admin/limits/{policy}/{key}",
        put(
            move |Path(at): Path<(String, String)>, Query(q): Query<HashMap<String, String>>| {
                let layer = layer.clone();
                async move { set(&layer, at, q).await.unwrap_or_else(|e| e) }
            },
        )
        .delete(move |Path(at): Path<(String, String)>| {
            let layer = cleared.clone();
            async move { clear(&layer, at).await.unwrap_or_else(|e| e) }
        }),
    )
}

async fn set<St: Store, M, R>(
    layer: &RateLimitLayer<St, M, R>,
    (policy, key): (String, String),
    query: HashMap<String, String>,
) -> Result<Response, Response> {
    let key = Key::from(key);
    let quota: Quota = match query.get("quota") {
        None => return Err(bad("quota", "missing; e.g. quota=20/min")),
        Some(q) => q.parse().map_err(|e| bad("quota", &format!("{e}")))?,
    };
    let until = until(&query).map_err(|e| bad("until", &e))?;
    if let Some(name) = query.keys().find(|k| *k != "quota" && *k != "until") {
        return Err(bad(name, "unknown parameter; expected quota and until"));
    }
    let result = layer.control().set_limit(&policy, &key, quota, until).await;
    result
        .map(|_| StatusCode::NO_CONTENT.into_response())
        .map_err(failed)
}

async fn clear<St: Store, M, R>(
    layer: &RateLimitLayer<St, M, R>,
    (policy, key): (String, String),
) -> Result<Response, Response> {
    let key = Key::from(key);
    let result = layer.control().clear_limit(&policy, &key).await;
    result
        .map(|_| StatusCode::NO_CONTENT.into_response())
        .map_err(failed)
}

/// What a failed change answers: 400 naming the policy or the quota, 503 when the store failed.
fn failed(error: LimitError) -> Response {
    match error {
        LimitError::UnknownPolicy(_) => bad("policy", &error.to_string()),
        LimitError::Quota(e) => bad("quota", &e.to_string()),
        LimitError::Until(e) => bad("until", &e),
        LimitError::Entry(e) => bad("key", &e.to_string()),
        e => problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string(), None),
    }
}

/// The query's `until=<unix seconds>`, if any: a time after now; else what is wrong with it.
pub(crate) fn until(query: &HashMap<String, String>) -> Result<Option<SystemTime>, String> {
    let Some(text) = query.get("until") else {
        return Ok(None);
    };
    let until = text
        .parse::<u64>()
        .ok()
        .and_then(|secs| UNIX_EPOCH.checked_add(Duration::from_secs(secs)))
        .ok_or_else(|| {
            format!("{text:?} is not a time in Unix seconds (a whole number from now to 2255)")
        })?;
    if until <= SystemTime::now() {
        return Err(format!("{text} is past"));
    }
    Ok(Some(until))
}

/// 400, naming the bad parameter.
pub(crate) fn bad(name: &str, reason: &str) -> Response {
    problem(StatusCode::BAD_REQUEST, reason, Some(name))
}

/// An RFC 9457 problem: the status, what went wrong, and the parameter at fault
/// (`invalid-params`).
pub(crate) fn problem(status: StatusCode, detail: &str, parameter: Option<&str>) -> Response {
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": match parameter {
            Some(name) => format!("{name}: {detail}"),
            None => detail.to_owned(),
        },
    });
    if let Some(name) = parameter {
        body["invalid-params"] = serde_json::json!([{ "name": name, "reason": detail }]);
    }
    (
        status,
        [("content-type", "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}
