//! Keys and costs read from request bodies (`tower_ratelimit::request_body`): an MCP client's
//! calls limited per tool, a cost stated in the body, both on two layers sharing a store (in
//! memory, two instances of one Redis, the cluster); the bounds on a body read (413, 408, a
//! broken body, a body that is not JSON), nothing charged; the inner service gets the same
//! bytes and trailers, and a route without a body policy is not buffered.

#[macro_use]
mod support;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use support::http::{PROBLEM_JSON, Reply, send};
use tower::ServiceExt;
use tower_ratelimit::key::{self, HeaderKey};
use tower_ratelimit::request_body::{BodyLimits, ReadBody, RequestBody};
use tower_ratelimit::settle::Settle;
use tower_ratelimit::{ManualClock, Policy, RateLimitLayer, Store};

/// A body of these frames, then its end; `stall`: then waits forever instead.
struct Frames {
    frames: VecDeque<Frame<Bytes>>,
    stall: bool,
    fail: bool,
    /// The length it says it has (a `Content-Length`), if it says one.
    length: Option<u64>,
}

impl Frames {
    fn new(frames: impl IntoIterator<Item = Frame<Bytes>>) -> Self {
        Frames {
            frames: frames.into_iter().collect(),
            stall: false,
            fail: false,
            length: None,
        }
    }

    fn json(value: &Value) -> Self {
        Frames::new([Frame::data(Bytes::from(value.to_string()))])
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.frames.pop_front() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None if self.stall => Poll::Pending,
            None if self.fail => Poll::Ready(Some(Err(std::io::Error::other("reset")))),
            None => Poll::Ready(None),
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.length
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// What the inner service saw of one request: the bytes and trailers of its body, whether
/// the layer read it, and the parsed body.
#[derive(Debug)]
struct Seen {
    bytes: Bytes,
    trailers: Option<HeaderMap>,
    was_read: bool,
    parsed: Option<Value>,
}

/// The inner service: answers 200 with what it saw (`Seen`, as its body's debug text is
/// needless: it goes in a response extension).
async fn inner(request: Request<ReadBody<Frames>>) -> Result<Response<String>, Infallible> {
    let parsed = (request.extensions().get::<RequestBody>()).and_then(|b| b.json().cloned());
    let (parts, body) = request.into_parts();
    let _ = parts;
    let was_read = body.was_read();
    let collected = body.collect().await.expect("a body");
    let trailers = collected.trailers().cloned();
    let seen = Seen {
        bytes: collected.to_bytes(),
        trailers,
        was_read,
        parsed,
    };
    let mut response = Response::new(String::from_utf8_lossy(&seen.bytes).into_owned());
    response.extensions_mut().insert(std::sync::Arc::new(seen));
    Ok(response)
}

type Service = tower::util::BoxCloneSyncService<
    Request<Frames>,
    Response<tower_ratelimit::body::ResponseBody<String>>,
    Infallible,
>;

/// `layer` around [`inner`].
fn app<St: Store + Clone>(
    layer: &RateLimitLayer<St, tower_ratelimit::body::Wrapped, tower_ratelimit::request_body::Read>,
) -> Service {
    use tower::Layer;
    tower::util::BoxCloneSyncService::new(layer.layer(tower::service_fn(inner)))
}

/// `POST path` from `client` with `body`.
async fn post(app: &Service, path: &str, client: &str, body: Frames) -> Reply {
    let request = Request::post(path)
        .header("x-client", client)
        .body(body)
        .unwrap();
    send(app, request).await
}

/// A JSON-RPC call of `method` (an MCP tool call when `tool` is given).
fn call(id: u64, method: &str, tool: Option<&str>) -> Value {
    match tool {
        Some(tool) => json!({"jsonrpc": "2.0", "id": id, "method": method,
                             "params": {"name": tool, "arguments": {}}}),
        None => json!({"jsonrpc": "2.0", "id": id, "method": method}),
    }
}

/// Asserts `reply` is a problem+json of `status` with `code`, its detail containing `says`.
fn assert_problem(reply: &Reply, status: StatusCode, code: &str, says: &str) {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some(PROBLEM_JSON));
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["code"], code, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(says), "{detail:?} should say {says:?}");
}

/// 2 calls a minute per client and tool (per method for other calls), on `store`.
fn per_tool<St: Store>(
    store: St,
) -> RateLimitLayer<St, tower_ratelimit::body::Wrapped, tower_ratelimit::request_body::Read> {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window("2/min").name("per-tool"))
        .key(key::all((
            HeaderKey::try_new("x-client").unwrap(),
            key::jsonrpc(),
        )))
        .store(store)
        .read_bodies(BodyLimits::new())
        .build()
        .unwrap()
}

/// An MCP client's tool calls through two layers sharing a store: limited per client and
/// tool, across both.
async fn tools_across_two_layers<St: Store + Clone>(one: St, two: St, _: ManualClock) {
    let (one, two) = (app(&per_tool(one)), app(&per_tool(two)));
    let search = || Frames::json(&call(1, "tools/call", Some("search")));
    assert_eq!(
        post(&one, "/mcp", "a", search()).await.status,
        StatusCode::OK
    );
    assert_eq!(
        post(&two, "/mcp", "a", search()).await.status,
        StatusCode::OK
    );
    let third = post(&one, "/mcp", "a", search()).await;
    assert_eq!(
        third.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        third.body
    );
    assert_eq!(
        post(&two, "/mcp", "a", search()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another tool, another client, another method: keys of their own.
    let fetch = Frames::json(&call(2, "tools/call", Some("fetch")));
    assert_eq!(post(&two, "/mcp", "a", fetch).await.status, StatusCode::OK);
    assert_eq!(
        post(&one, "/mcp", "b", search()).await.status,
        StatusCode::OK
    );
    let ping = Frames::json(&call(3, "ping", None));
    assert_eq!(post(&one, "/mcp", "a", ping).await.status, StatusCode::OK);
    // A body without a method is a key of its own, limited as any other.
    let nothing = || Frames::json(&json!({"jsonrpc": "2.0", "id": 4}));
    assert_eq!(
        post(&one, "/mcp", "a", nothing()).await.status,
        StatusCode::OK
    );
    assert_eq!(
        post(&two, "/mcp", "a", nothing()).await.status,
        StatusCode::OK
    );
    let over = post(&one, "/mcp", "a", nothing()).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
}

on_two_of_each_store!(
    tools_across_two_layers,
    "bodies-tools",
    tools_in_memory,
    tools_on_two_instances_of_one_redis,
    tools_on_the_cluster
);

/// A JSON-RPC batch through two layers sharing a store: each call charged to its own key in
/// one decision, all or none; a denied batch names the calls that were over.
async fn batches_across_two_layers<St: Store + Clone>(one: St, two: St, _: ManualClock) {
    let (one, two) = (app(&per_tool(one)), app(&per_tool(two)));
    let batch = |calls: &[(u64, &str)]| {
        let calls: Vec<Value> = (calls.iter())
            .map(|(id, tool)| call(*id, "tools/call", Some(tool)))
            .collect();
        Frames::json(&Value::Array(calls))
    };
    // Two searches and a fetch: search's key is charged 2 (its limit), fetch's 1.
    let reply = post(
        &one,
        "/mcp",
        "c",
        batch(&[(1, "search"), (2, "search"), (3, "fetch")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // A fetch and a search: the search is over, so the fetch is not charged either.
    let reply = post(&two, "/mcp", "c", batch(&[(4, "fetch"), (5, "search")])).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    let problem: Value = serde_json::from_str(&reply.body).unwrap();
    assert!(
        reply.body.starts_with("{\"type\":"),
        "members in their order: {}",
        reply.body
    );
    assert_eq!(
        problem["calls"],
        json!([{"index": 1, "id": 5, "policies": ["per-tool"]}]),
        "{problem}"
    );
    let fetch = || Frames::json(&call(6, "tools/call", Some("fetch")));
    assert_eq!(
        post(&one, "/mcp", "c", fetch()).await.status,
        StatusCode::OK
    );
    assert_eq!(
        post(&two, "/mcp", "c", fetch()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A batch over one key in one go: three pings at 2 a minute.
    let pings: Vec<Value> = (7..10).map(|id| call(id, "ping", None)).collect();
    let reply = post(&one, "/mcp", "d", Frames::json(&Value::Array(pings))).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let problem: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(problem["calls"].as_array().unwrap().len(), 3, "{problem}");
    let ping = || Frames::json(&call(10, "ping", None));
    assert_eq!(post(&two, "/mcp", "d", ping()).await.status, StatusCode::OK);
}

on_two_of_each_store!(
    batches_across_two_layers,
    "bodies-batches",
    batches_in_memory,
    batches_on_two_instances_of_one_redis,
    batches_on_the_cluster
);

/// 10 tokens a minute per client, each request costing its body's `/max_tokens`.
fn tokens<St: Store>(
    store: St,
) -> RateLimitLayer<St, tower_ratelimit::body::Wrapped, tower_ratelimit::request_body::Read> {
    RateLimitLayer::builder()
        .policy(
            Policy::fixed_window("10/min")
                .name("tokens")
                .cost_json("/max_tokens"),
        )
        .key(HeaderKey::try_new("x-client").unwrap())
        .store(store)
        .read_bodies(BodyLimits::new())
        .build()
        .unwrap()
}

/// Costs stated in bodies, charged across two layers; a cost that is none is answered 400
/// and charged the floor of 1, as every refused body is.
async fn costs_across_two_layers<St: Store + Clone>(one: St, two: St, _: ManualClock) {
    let (one, two) = (app(&tokens(one)), app(&tokens(two)));
    let asking = |n: Value| Frames::json(&json!({"model": "m", "max_tokens": n}));
    assert_eq!(
        post(&one, "/llm", "a", asking(json!(6))).await.status,
        StatusCode::OK
    );
    let reply = post(&two, "/llm", "a", asking(json!(4))).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining(), Some(0));
    let over = post(&one, "/llm", "a", asking(json!(1))).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    // A cost of 0 counts 1 (no free pass): over as well.
    let zero = post(&two, "/llm", "a", asking(json!(0))).await;
    assert_eq!(zero.status, StatusCode::TOO_MANY_REQUESTS, "{zero:?}");
    for (value, says) in [
        (json!(-1), "a negative number"),
        (json!(2.5), "not a whole number"),
        (json!("ten"), "a string, not a number"),
        (json!(5_000_000_000u64), "over 4294967295"),
    ] {
        let reply = post(&one, "/llm", "b", asking(value)).await;
        assert_problem(&reply, StatusCode::BAD_REQUEST, "bad_cost", says);
    }
    let absent = Frames::json(&json!({"model": "m"}));
    let reply = post(&two, "/llm", "b", absent).await;
    assert_problem(
        &reply,
        StatusCode::BAD_REQUEST,
        "bad_cost",
        "\"/max_tokens\" of its body is absent",
    );
    // Each was charged the floor of 1, as a refused body is: b has 5 of its 10.
    let reply = post(&one, "/llm", "b", asking(json!(6))).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let reply = post(&two, "/llm", "b", asking(json!(5))).await;
    assert_eq!((reply.status, reply.remaining()), (StatusCode::OK, Some(0)));
}

on_two_of_each_store!(
    costs_across_two_layers,
    "bodies-costs",
    costs_in_memory,
    costs_on_two_instances_of_one_redis,
    costs_on_the_cluster
);

/// An LLM API: answers the usage the request's `"used"` says, as a JSON body, or with
/// `"stream": true` as server-sent events (cut across frames), the last carrying it.
async fn llm(request: Request<ReadBody<Frames>>) -> Result<Response<Frames>, Infallible> {
    let body = request
        .extensions()
        .get::<RequestBody>()
        .unwrap()
        .json()
        .unwrap()
        .clone();
    let usage = json!({"usage": {"total_tokens": body["used"]}}).to_string();
    if body["stream"] != json!(true) {
        return Ok(Response::new(Frames::new([Frame::data(Bytes::from(
            usage,
        ))])));
    }
    let events = format!("data: {{\"delta\": \"Hi\"}}\n\ndata: {usage}\n\ndata: [DONE]\n\n");
    let (a, b) = events.split_at(30);
    let frames = [a, b].map(|part| Frame::data(Bytes::copy_from_slice(part.as_bytes())));
    let mut response = Response::new(Frames::new(frames));
    let sse = http::HeaderValue::from_static("text/event-stream");
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, sse);
    Ok(response)
}

/// 100 tokens a minute per client: a call is charged its `max_tokens`, then settled at the
/// usage its response reports.
fn settled<St: Store>(
    store: St,
) -> RateLimitLayer<St, tower_ratelimit::body::Wrapped, tower_ratelimit::request_body::Read> {
    let policy = Policy::fixed_window("100/min")
        .name("tokens")
        .cost_json("/max_tokens")
        .settle(Settle::json("/usage/total_tokens"));
    RateLimitLayer::builder()
        .policy(policy)
        .key(HeaderKey::try_new("x-client").unwrap())
        .store(store)
        .read_bodies(BodyLimits::new())
        .build()
        .unwrap()
}

/// Calls estimated from their bodies, settled from their responses' JSON and from the last
/// event of a stream, exactly, as the other layer sees.
async fn usage_settled_across_two_layers<St: Store + Clone>(one: St, two: St, _: ManualClock) {
    use tower::Layer;
    let (first, second) = (settled(one), settled(two));
    let app = |layer: &RateLimitLayer<St, _, _>| layer.layer(tower::service_fn(llm));
    let ask = async |layer, body: Value| {
        let request = Request::post("/llm")
            .header("x-client", "a")
            .body(Frames::json(&body));
        send(&app(layer), request.unwrap()).await
    };
    let left = async || {
        let key = tower_ratelimit::key::Key::from("a");
        second.control().peek(&key).await.unwrap().outcomes()[0].remaining()
    };
    let reply = ask(&first, json!({"max_tokens": 50, "used": 10})).await;
    assert_eq!(
        (reply.status, reply.remaining()),
        (StatusCode::OK, Some(50)),
        "the estimate"
    );
    support::eventually("settled at 10", async || left().await == 90).await;
    let reply = ask(
        &second,
        json!({"max_tokens": 50, "used": 30, "stream": true}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.ends_with("data: [DONE]\n\n"), "{}", reply.body);
    support::eventually("settled at 30 from the stream", async || left().await == 60).await;
    // A response without its usage: the estimate stays.
    let reply = ask(&first, json!({"max_tokens": 20, "stream": true})).await;
    assert_eq!(reply.status, StatusCode::OK);
    support::eventually("the estimate of 20 kept", async || left().await == 40).await;
}

on_two_of_each_store!(
    usage_settled_across_two_layers,
    "bodies-usage",
    usage_in_memory,
    usage_on_two_instances_of_one_redis,
    usage_on_the_cluster
);

/// The inner service gets the bytes and trailers as they came, and the body parsed; a request
/// of a route no body policy applies to streams through unread, whatever its size.
#[tokio::test]
async fn the_inner_service_gets_the_same_bytes_and_trailers() {
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::gcra("100/s")
                .name("tools")
                .key(key::jsonrpc())
                .path("/mcp"),
        )
        .read_bodies(BodyLimits::new().limit(1024))
        .build()
        .unwrap();
    let app = app(&layer);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", "abc".parse().unwrap());
    let body = call(7, "tools/call", Some("search")).to_string();
    let (head, tail) = body.split_at(10);
    let frames = Frames::new([
        Frame::data(Bytes::copy_from_slice(head.as_bytes())),
        Frame::data(Bytes::copy_from_slice(tail.as_bytes())),
        Frame::trailers(trailers.clone()),
    ]);
    let request = Request::post("/mcp").body(frames).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let seen = response
        .extensions()
        .get::<std::sync::Arc<Seen>>()
        .unwrap()
        .clone();
    assert!(seen.was_read);
    assert_eq!(seen.bytes, body.as_bytes());
    assert_eq!(seen.trailers.as_ref(), Some(&trailers));
    assert_eq!(seen.parsed.as_ref().unwrap()["id"], 7);
    // Another route: not read, not bounded.
    let big = Frames::new([Frame::data(Bytes::from(vec![b'x'; 4096]))]);
    let response = app
        .clone()
        .oneshot(Request::post("/upload").body(big).unwrap())
        .await
        .unwrap();
    let seen = response
        .extensions()
        .get::<std::sync::Arc<Seen>>()
        .unwrap()
        .clone();
    assert!(!seen.was_read);
    assert_eq!(seen.bytes.len(), 4096);
    assert!(seen.parsed.is_none());
}

/// A body over the bound (said by its length, or found as it arrives), one that does not
/// arrive in time, one broken off and one that is not JSON are answered, charged nothing
/// when refusals are not charged (charged, see `body_heads.rs`).
#[tokio::test(start_paused = true)]
async fn bodies_that_cannot_be_read_are_answered_and_charge_nothing() {
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::fixed_window("1/min")
                .name("once")
                .key(key::jsonrpc()),
        )
        .read_bodies(
            (BodyLimits::new().limit(64).deadline(Duration::from_secs(5))).charge_rejected(false),
        )
        .build()
        .unwrap();
    let app = app(&layer);
    let ask = |body: Frames| send(&app, Request::post("/mcp").body(body).unwrap());
    let chunk = |n: usize| Frame::data(Bytes::from(vec![b' '; n]));
    let reply = ask(Frames::new([chunk(40), chunk(40)])).await;
    assert_problem(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        "64 bytes",
    );
    // Said by its length before any byte came: answered at once, not after the deadline.
    let mut announced = Frames::new([]);
    (announced.stall, announced.length) = (true, Some(65));
    let reply = ask(announced).await;
    assert_problem(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        "64 bytes",
    );
    let mut stalled = Frames::new([chunk(10)]);
    stalled.stall = true;
    let reply = ask(stalled).await;
    assert_problem(
        &reply,
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        "5000 ms",
    );
    let mut broken = Frames::new([chunk(10)]);
    broken.fail = true;
    let reply = ask(broken).await;
    assert_problem(
        &reply,
        StatusCode::BAD_REQUEST,
        "body_unreadable",
        "broken off",
    );
    let reply = ask(Frames::new([Frame::data(Bytes::from("{\"method\": "))])).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, "body_not_json", "not JSON");
    // Nothing was charged: the one call a minute goes through.
    let reply = ask(Frames::json(&call(1, "ping", None))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// A policy that reads the body on a layer that does not is refused at build and at reload;
/// so are limits of zero and a pointer that is none.
#[tokio::test]
async fn a_body_policy_needs_a_layer_that_reads_bodies() {
    let err = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s").name("tools").key(key::jsonrpc()))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("policy \"tools\" reads the request body"),
        "{err}"
    );
    assert!(err.contains("read_bodies"), "{err}");
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s"))
        .build()
        .unwrap();
    let err = layer
        .control()
        .reload([Policy::gcra("1/s").cost_json("/n")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("reads the request body"), "{err}");
    for (limits, says) in [
        (BodyLimits::new().limit(0), "limit of 0 bytes"),
        (BodyLimits::new().deadline(Duration::ZERO), "deadline of 0"),
    ] {
        let err = RateLimitLayer::builder()
            .policy(Policy::gcra("1/s").key(key::jsonrpc()))
            .read_bodies(limits)
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{err}");
    }
    let err = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s").name("t").cost_json("max_tokens"))
        .read_bodies(BodyLimits::new())
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("policy \"t\": cost_json: \"max_tokens\" is not a JSON pointer"),
        "{err}"
    );
    assert!(key::json("params/name").is_err());
}

/// 100 points a minute per client, each query its calculated cost, at most 4 deep.
fn graphql<St: Store>(
    store: St,
) -> RateLimitLayer<St, tower_ratelimit::body::Wrapped, tower_ratelimit::request_body::Read> {
    RateLimitLayer::builder()
        .policy(
            Policy::fixed_window("100/min")
                .name("points")
                .cost_graphql(4),
        )
        .key(HeaderKey::try_new("x-client").unwrap())
        .store(store)
        .read_bodies(BodyLimits::new())
        .build()
        .unwrap()
}

/// GraphQL queries charged their calculated cost across two layers; a query too deep or
/// that does not parse is answered 400 naming why, charged nothing.
async fn graphql_costs_across_two_layers<St: Store + Clone>(one: St, two: St, _: ManualClock) {
    let (one, two) = (app(&graphql(one)), app(&graphql(two)));
    let query = |q: &str| Frames::json(&json!({"query": q}));
    let issue = "{ viewer { repositories(first: 10) { nodes { name stars } } } }";
    let reply = post(&one, "/graphql", "a", query(issue)).await;
    assert_eq!(
        (reply.status, reply.remaining()),
        (StatusCode::OK, Some(68)),
        "{}",
        reply.body
    );
    let vars = json!({"query": "query($n: Int) { a(first: $n) { b } }", "variables": {"n": 30}});
    let reply = post(&two, "/graphql", "a", Frames::json(&vars)).await;
    assert_eq!(
        (reply.status, reply.remaining()),
        (StatusCode::OK, Some(37))
    );
    let reply = post(&one, "/graphql", "a", query("{ a(first: 40) { b } }")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let deep = post(
        &two,
        "/graphql",
        "b",
        query("{ a { b { c { d { e } } } } }"),
    )
    .await;
    assert_problem(
        &deep,
        StatusCode::BAD_REQUEST,
        "graphql_too_deep",
        "5 fields deep",
    );
    let broken = post(&one, "/graphql", "b", query("{ a(first: ) }")).await;
    assert_problem(
        &broken,
        StatusCode::BAD_REQUEST,
        "bad_graphql",
        "line 1, column",
    );
    // The two refused queries were charged 1 each: b has 98 of its 100.
    let reply = post(&two, "/graphql", "b", query("{ a(first: 97) { b } }")).await;
    assert_eq!(
        (reply.status, reply.remaining()),
        (StatusCode::OK, Some(0)),
        "b had 98 of its 100"
    );
}

on_two_of_each_store!(
    graphql_costs_across_two_layers,
    "bodies-graphql",
    graphql_in_memory,
    graphql_on_two_instances_of_one_redis,
    graphql_on_the_cluster
);
