//! What the layer reads of request bodies (`BODY_KEY`, `BODY_COST`, `JSONRPC`, `BODY_LIMIT`)
//! and the routes that show it: `POST /echo`, `POST /mcp`, `POST /graphql`, `GET /llm`.
//!
//! With a body variable set, each `RATE_LIMIT` policy is two: one reading the body, for the
//! routes with bodies only (`BODY_ROUTES`), named `<name>:body`; and the plain one, for every
//! other route (`GET /`, the WebSocket upgrade...), which has no body to read.

use std::sync::Arc;

use axum::Router;
use axum::http::Method;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tower_ratelimit::Policy;
use tower_ratelimit::key::{self, KeyExtractor};
use tower_ratelimit::request_body::BodyLimits;

use crate::config::env_or;

/// The variables a policy file replaces (its policies say their keys and costs).
pub(crate) const REPLACED_BY_CONFIG: [&str; 5] = [
    "BODY_KEY",
    "BODY_COST",
    "JSONRPC",
    "GRAPHQL_COST",
    "GRAPHQL_MAX_DEPTH",
];

/// The routes with bodies (`POST`), the only ones the body variables apply to.
const BODY_ROUTES: [&str; 3] = ["/echo", "/mcp", "/graphql"];

/// Whether `request` is a `POST` to one of [`BODY_ROUTES`].
fn has_body(request: &key::RequestRef<'_>) -> bool {
    request.method() == Method::POST && BODY_ROUTES.contains(&request.uri().path())
}

/// What the policies read of a request's body.
pub(crate) struct Bodies {
    /// `BODY_KEY`: the pointer whose value joins `KEY`'s key.
    pointer: Option<String>,
    /// `JSONRPC=true`: the call's method joins the key, a batch charged per call.
    jsonrpc: bool,
    /// `BODY_COST`: the pointer of the request's cost.
    cost: Option<String>,
    /// `GRAPHQL_COST=true`: the query's calculated cost, at most `GRAPHQL_MAX_DEPTH` deep.
    graphql: Option<u32>,
    /// `MIN_BODY_COST`: the least a cost read from the body counts.
    floor: u32,
    /// `BODY_LIMIT`: the bound on a body read.
    pub(crate) limits: BodyLimits,
}

impl Bodies {
    /// Reads the variables; a bad value names its variable.
    pub(crate) fn from_env() -> Result<Self, String> {
        let pointer = |name: &str| -> Result<Option<String>, String> {
            match env_or(name, "")?.as_str() {
                "" => Ok(None),
                p => {
                    key::json(p).map_err(|e| format!("{name}: {e}"))?;
                    Ok(Some(p.to_owned()))
                }
            }
        };
        let yes = |name: &str| match env_or(name, "false")?.as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(format!("{name}: {other:?} is neither true nor false")),
        };
        let jsonrpc = yes("JSONRPC")?;
        let depth = env_or("GRAPHQL_MAX_DEPTH", "10")?;
        let depth = match depth.parse::<u32>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "GRAPHQL_MAX_DEPTH: {depth:?} is not a depth of 1 or more fields"
                ));
            }
        };
        let graphql = yes("GRAPHQL_COST")?.then_some(depth);
        let cost = pointer("BODY_COST")?;
        if cost.is_some() && graphql.is_some() {
            return Err("BODY_COST and GRAPHQL_COST: a request has one cost; drop one".into());
        }
        let limit = env_or("BODY_LIMIT", &BodyLimits::DEFAULT_LIMIT.to_string())?;
        let limit = match limit.parse::<usize>() {
            Ok(n) if (1..=1 << 30).contains(&n) => n,
            _ => {
                return Err(format!(
                    "BODY_LIMIT: {limit:?} is not a number of bytes from 1 to 1073741824"
                ));
            }
        };
        let count = |name: &str, default: usize, most: usize| {
            let value = env_or(name, &default.to_string())?;
            match value.parse::<usize>() {
                Ok(n) if (1..=most).contains(&n) => Ok(n),
                _ => Err(format!(
                    "{name}: {value:?} is not a number from 1 to {most}"
                )),
            }
        };
        let calls = count("BATCH_CALLS", BodyLimits::DEFAULT_BATCH_CALLS, 10_000)?;
        let keys = count("BATCH_KEYS", BodyLimits::DEFAULT_BATCH_KEYS, 1_000)?;
        let reading = count(
            "BODY_READING_PER_KEY",
            BodyLimits::DEFAULT_READING_PER_KEY,
            100_000,
        )?;
        let floor = env_or("MIN_BODY_COST", "1")?;
        let floor = (floor.parse::<u32>())
            .map_err(|_| format!("MIN_BODY_COST: {floor:?} is not a whole number of units"))?;
        Ok(Bodies {
            pointer: pointer("BODY_KEY")?,
            jsonrpc,
            cost,
            graphql,
            floor,
            limits: BodyLimits::new()
                .limit(limit)
                .batch_calls(calls)
                .batch_keys(keys)
                .reading_per_key(reading),
        })
    }

    /// Whether a variable reads request bodies.
    fn reads(&self) -> bool {
        self.pointer.is_some() || self.jsonrpc || self.cost.is_some() || self.graphql.is_some()
    }

    /// `policy` (named `name`, keyed by `head`, the key of `KEY`) as the layer gets it: itself
    /// when no variable reads bodies; else itself for the routes without bodies, and for
    /// those with bodies a policy `<name>:body` reading them.
    pub(crate) fn policies(
        &self,
        policy: Policy,
        name: &str,
        head: impl FnOnce() -> Result<Arc<dyn KeyExtractor>, String>,
    ) -> Result<Vec<Policy>, String> {
        if !self.reads() {
            return Ok(vec![policy]);
        }
        let name = format!("{name}:body");
        if name.len() > 64 {
            return Err(format!(
                "POLICY_NAME: the policy of the routes with bodies is named {name:?}, over 64 characters; shorten POLICY_NAME"
            ));
        }
        let mut body = self
            .policy(policy.clone())
            .name(name)
            .key(self.key(head()?));
        for path in BODY_ROUTES {
            body = body.route(Some(Method::POST), path);
        }
        Ok(vec![policy.exempt_if(has_body), body])
    }

    /// `head`, the key of `KEY`, joined with the body's parts the variables name.
    fn key(&self, head: Arc<dyn KeyExtractor>) -> Arc<dyn KeyExtractor> {
        let mut parts = vec![head];
        if let Some(pointer) = &self.pointer {
            parts.push(Arc::new(key::json(pointer).expect("checked when read")));
        }
        if self.jsonrpc {
            parts.push(Arc::new(key::jsonrpc()));
        }
        match parts.len() {
            1 => parts.remove(0),
            _ => Arc::new(key::all(parts)),
        }
    }

    /// `policy`, costing what the body says when `BODY_COST` is set, or its GraphQL query's
    /// cost with `GRAPHQL_COST`.
    fn policy(&self, policy: Policy) -> Policy {
        match (&self.cost, self.graphql) {
            (Some(pointer), _) => policy.cost_json(pointer).min_body_cost(self.floor),
            (None, Some(depth)) => policy.cost_graphql(depth).min_body_cost(self.floor),
            (None, None) => policy,
        }
    }

    /// The variables set, for the start line.
    pub(crate) fn describe(&self) -> String {
        let mut said = format!(
            " BODY_LIMIT={} BATCH_CALLS={} BATCH_KEYS={} BODY_READING_PER_KEY={} MIN_BODY_COST={}",
            self.limits.get_limit(),
            self.limits.get_batch_calls(),
            self.limits.get_batch_keys(),
            self.limits.get_reading_per_key(),
            self.floor
        );
        for (name, value) in [("BODY_KEY", &self.pointer), ("BODY_COST", &self.cost)] {
            if let Some(value) = value {
                said.push_str(&format!(" {name}={value}"));
            }
        }
        if self.jsonrpc {
            said.push_str(" JSONRPC=true");
        }
        if let Some(depth) = self.graphql {
            said.push_str(&format!(" GRAPHQL_COST=true GRAPHQL_MAX_DEPTH={depth}"));
        }
        said
    }
}

/// The routes whose bodies the policies read.
pub(crate) fn routes() -> Router {
    Router::new()
        .route(
            BODY_ROUTES[0],
            post(|body: axum::body::Bytes| async move { body }),
        )
        .route(BODY_ROUTES[1], post(mcp))
        .route(
            BODY_ROUTES[2],
            post(|| async { axum::Json(json!({"data": null})) }),
        )
        .route("/llm", get(llm))
}

/// `POST /mcp`: a JSON-RPC result for each call (an array for a batch), echoing its method.
async fn mcp(body: axum::body::Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    let answer = |call: &Value| {
        json!({"jsonrpc": "2.0", "id": call.get("id"),
               "result": {"method": call.get("method"), "tool": call.pointer("/params/name")}})
    };
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Array(calls)) => {
            axum::Json(Value::Array(calls.iter().map(answer).collect())).into_response()
        }
        Ok(call) => axum::Json(answer(&call)).into_response(),
        Err(_) => {
            let error = json!({"jsonrpc": "2.0", "id": null,
                               "error": {"code": -32700, "message": "Parse error"}});
            axum::Json(error).into_response()
        }
    }
}

/// `GET /llm?tokens=N[&stream=true]`: the usage of N tokens as an LLM API reports it, in a
/// JSON body, or as the last of three server-sent events.
async fn llm(
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<axum::response::Response, (axum::http::StatusCode, &'static str)> {
    use axum::response::IntoResponse;
    let bad = (
        axum::http::StatusCode::BAD_REQUEST,
        "tokens must be a whole number\n",
    );
    let tokens: u64 = q.get("tokens").ok_or(bad)?.parse().map_err(|_| bad)?;
    let usage = json!({"usage": {"total_tokens": tokens}});
    if q.get("stream").map(String::as_str) != Some("true") {
        return Ok(axum::Json(usage).into_response());
    }
    let events = format!(
        "data: {}\n\ndata: {}\n\ndata: {usage}\n\n",
        json!({"delta": "Hello"}),
        json!({"delta": " world"}),
    );
    Ok(([("content-type", "text/event-stream")], events).into_response())
}
