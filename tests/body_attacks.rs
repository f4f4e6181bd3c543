//! What one crafted body must not do to a layer that reads bodies: get a free pass (an empty
//! batch, a cost of 0), make the layer hold or compute without bound (a batch of thousands of
//! calls or keys), or walk past an exhausted limit on a cluster whose other slots fail. On two
//! layers sharing a store (in memory, two instances of one Redis, the cluster), and on a
//! cluster with nodes really paused.

#[macro_use]
mod support;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};
use support::http::{PROBLEM_JSON, Reply, send};
use tower_ratelimit::body::{ResponseBody, Wrapped};
use tower_ratelimit::key::{self, HeaderKey};
use tower_ratelimit::request_body::{BodyLimits, Read, ReadBody};
use tower_ratelimit::{ManualClock, Policy, RateLimitLayer, Store};

type Layer<St> = RateLimitLayer<St, Wrapped, Read>;
type Service = tower::util::BoxCloneSyncService<
    Request<Full<Bytes>>,
    Response<ResponseBody<String>>,
    Infallible,
>;

/// `layer` around a service answering 200.
fn app<St: Store + Clone>(layer: &Layer<St>) -> Service {
    use tower::Layer;
    let ok = tower::service_fn(|_: Request<ReadBody<Full<Bytes>>>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    });
    tower::util::BoxCloneSyncService::new(layer.layer(ok))
}

/// `POST /` from `client` with the JSON `body`.
async fn post(app: &Service, client: &str, body: &Value) -> Reply {
    let request = Request::post("/")
        .header("x-client", client)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    send(app, request).await
}

/// A JSON-RPC call of `method`.
fn call(id: usize, method: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method})
}

/// A batch of `n` calls, the `i`th of `method(i)`.
fn batch(n: usize, method: impl Fn(usize) -> String) -> Value {
    Value::Array((0..n).map(|i| call(i, &method(i))).collect())
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

/// The statuses of `n` requests of `body` from `client`, through `one` and `two` in turn.
async fn statuses(one: &Service, two: &Service, client: &str, body: &Value, n: usize) -> Vec<u16> {
    let mut seen = Vec::new();
    for i in 0..n {
        let app = if i % 2 == 0 { one } else { two };
        seen.push(post(app, client, body).await.status.as_u16());
    }
    seen
}

/// 2 a minute per client, each request costing its body's `/n` (at least `floor` when given).
fn costed<St: Store>(store: St, floor: Option<u32>) -> Layer<St> {
    let mut policy = Policy::fixed_window("2/min").name("costed").cost_json("/n");
    if let Some(floor) = floor {
        policy = policy.min_body_cost(floor);
    }
    RateLimitLayer::builder()
        .policy(policy)
        .key(HeaderKey::try_new("x-client").unwrap())
        .store(store)
        .read_bodies(BodyLimits::new())
        .build()
        .unwrap()
}

/// 2 calls a minute per client and JSON-RPC method, batches within `limits`.
fn per_method<St: Store>(store: St, limits: BodyLimits) -> Layer<St> {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window("2/min").name("per-method"))
        .key(key::all((
            HeaderKey::try_new("x-client").unwrap(),
            key::jsonrpc(),
        )))
        .store(store)
        .read_bodies(limits)
        .build()
        .unwrap()
}

/// A cost of 0 counts 1 unless the policy says 0 is a cost; an empty batch is refused, never
/// a request charged nothing.
async fn no_free_pass<St: Store + Clone>(one: St, two: St, _: ManualClock) {
    let (a, b) = (
        app(&costed(one.clone(), None)),
        app(&costed(two.clone(), None)),
    );
    let zero = json!({"n": 0});
    assert_eq!(
        statuses(&a, &b, "a", &zero, 5).await,
        [200, 200, 429, 429, 429]
    );
    // Each call of a batch counts at least 1: three calls of 0 are over 2.
    let calls = json!([{"n": 0}, {"n": 0}, {"n": 0}]);
    assert_eq!(statuses(&a, &b, "b", &calls, 1).await, [429]);
    assert_eq!(statuses(&a, &b, "b", &json!({"n": 1}), 1).await, [200]);
    // A floor of 0: a body of 0 is a real cost of nothing (a look), charged nothing.
    let (a0, b0) = (
        app(&costed(one.clone(), Some(0))),
        app(&costed(two.clone(), Some(0))),
    );
    assert_eq!(statuses(&a0, &b0, "c", &zero, 5).await, [200; 5]);
    assert_eq!(
        statuses(&a0, &b0, "c", &json!({"n": 2}), 2).await,
        [200, 429]
    );
    // A higher floor charges every request at least it.
    let (a2, b2) = (
        app(&costed(one.clone(), Some(2))),
        app(&costed(two.clone(), Some(2))),
    );
    assert_eq!(
        statuses(&a2, &b2, "d", &json!({"n": 1}), 2).await,
        [200, 429]
    );
    // An empty batch asks for nothing: refused, on a body cost and on a JSON-RPC key; and
    // charged the floor, as a refused body is (the third is over 2).
    let empty = json!([]);
    for _ in 0..2 {
        let reply = post(&a, "e", &empty).await;
        assert_problem(
            &reply,
            StatusCode::BAD_REQUEST,
            "batch_empty",
            "at least one call",
        );
    }
    let reply = post(&b, "e", &empty).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    let (m1, m2) = (
        per_method(one, BodyLimits::new()),
        per_method(two, BodyLimits::new()),
    );
    let reply = post(&app(&m1), "e", &empty).await;
    assert_problem(
        &reply,
        StatusCode::BAD_REQUEST,
        "batch_empty",
        "empty batch",
    );
    let reply = post(&app(&m2), "e", &empty).await;
    assert_problem(
        &reply,
        StatusCode::BAD_REQUEST,
        "batch_empty",
        "empty batch",
    );
}

on_two_of_each_store!(
    no_free_pass,
    "attacks-free",
    no_free_pass_in_memory,
    no_free_pass_on_two_instances_of_one_redis,
    no_free_pass_on_the_cluster
);

/// A batch past its calls or its keys is refused `413`, naming the bound, charged nothing;
/// within them it is decided as before.
async fn batches_bounded<St: Store + Clone>(one: St, two: St, _: ManualClock) {
    let limits = BodyLimits::new().batch_calls(4).batch_keys(2);
    let (a, b) = (
        app(&per_method(one.clone(), limits)),
        app(&per_method(two.clone(), limits)),
    );
    let five = batch(5, |_| "ping".into());
    let reply = post(&a, "a", &five).await;
    assert_problem(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_large",
        "5 calls, over the 4",
    );
    let three_keys = batch(3, |i| format!("m{i}"));
    let reply = post(&b, "a", &three_keys).await;
    assert_problem(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_many_keys",
        "more than the 2 keys of policy per-method",
    );
    // Nothing was charged: m0 and ping have their 2 each, in a batch of 4 calls of 2 keys.
    let within = json!([
        call(1, "m0"),
        call(2, "ping"),
        call(3, "m0"),
        call(4, "ping")
    ]);
    assert_eq!(post(&a, "a", &within).await.status, StatusCode::OK);
    assert_eq!(
        post(&b, "a", &call(5, "m0")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The defaults: 32 calls, 8 keys a policy; the 3,400 calls of 3,400 methods are refused
    // before a key is made.
    let (a, b) = (
        app(&per_method(one, BodyLimits::new())),
        app(&per_method(two, BodyLimits::new())),
    );
    let huge = Value::Array(
        (0..3400)
            .map(|i| json!({"method": format!("m{i}")}))
            .collect(),
    );
    assert!(huge.to_string().len() < BodyLimits::DEFAULT_LIMIT);
    let reply = post(&a, "b", &huge).await;
    assert_problem(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_large",
        "over the 32",
    );
    let nine = batch(9, |i| format!("m{i}"));
    let reply = post(&b, "b", &nine).await;
    assert_problem(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_many_keys",
        "the 8 keys",
    );
    let eight = batch(32, |i| format!("m{}", i % 8));
    let reply = post(&a, "c", &eight).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "32 calls of 8 keys at 2 each"
    );
    let sixteen = batch(16, |i| format!("m{}", i % 8));
    assert_eq!(post(&b, "c", &sixteen).await.status, StatusCode::OK);
}

on_two_of_each_store!(
    batches_bounded,
    "attacks-bounds",
    batches_bounded_in_memory,
    batches_bounded_on_two_instances_of_one_redis,
    batches_bounded_on_the_cluster
);

#[test]
fn absurd_batch_bounds_are_refused_at_build() {
    for limits in [
        BodyLimits::new().batch_calls(0),
        BodyLimits::new().batch_keys(0),
    ] {
        let built = RateLimitLayer::builder()
            .policy(Policy::fixed_window("2/min").cost_json("/n"))
            .read_bodies(limits)
            .build();
        let error = built.expect_err("refused").to_string();
        assert!(error.contains("admits no batch"), "{error}");
    }
}

/// Pauses (SIGSTOP) a Redis node until dropped (SIGCONT).
struct Paused(u32);

impl Paused {
    fn node(node: &support::RedisServer) -> Self {
        signal("-STOP", node.pid());
        Paused(node.pid())
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

fn signal(which: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid}");
}

/// On a cluster, a batch whose exhausted call's slot answers while the slots of its other
/// calls do not (their nodes paused) is denied: the failure policy (open, the default) lets
/// through no batch a slot said was over its limit. The calls' slots are decided at once, so
/// the batch is answered at one deadline, not one per slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_its_limit_is_denied_whatever_other_slots_do() {
    let cluster = support::RedisCluster::start();
    let deadline = Duration::from_millis(400);
    let store = || async {
        tower_ratelimit::RedisStore::builder(&cluster.url())
            .prefix("attacks-slots:")
            .deadline(deadline)
            .build()
            .await
            .unwrap()
    };
    let one_a_minute = |store| {
        RateLimitLayer::builder()
            .policy(Policy::fixed_window("1/min").name("per-method"))
            .key(key::all((
                HeaderKey::try_new("x-client").unwrap(),
                key::jsonrpc(),
            )))
            .store(store)
            .read_bodies(BodyLimits::new())
            .build()
            .unwrap()
    };
    let (one, two) = (
        app(&one_a_minute(store().await)),
        app(&one_a_minute(store().await)),
    );
    assert_eq!(
        post(&one, "a", &call(1, "search")).await.status,
        StatusCode::OK
    );
    // The node holding the exhausted key stays up; the others pause.
    let holds = |n: &&support::RedisServer| !n.cli(&["KEYS", "attacks-slots:*"]).trim().is_empty();
    let up = cluster.nodes.iter().filter(holds).count();
    assert_eq!(up, 1, "one key, on one node");
    let paused: Vec<Paused> = (cluster.nodes.iter())
        .filter(|n| !holds(n))
        .map(Paused::node)
        .collect();
    let calls = |n| {
        json!(
            [call(0, "search")]
                .into_iter()
                .chain((1..n).map(|i| call(i, &format!("junk{i}"))))
                .collect::<Vec<_>>()
        )
    };
    for _ in 0..3 {
        let started = Instant::now();
        let reply = post(&two, "a", &calls(8)).await;
        let took = started.elapsed();
        assert_eq!(
            reply.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            reply.body
        );
        assert!(
            reply.body.contains("search") || reply.body.contains("\"index\":0"),
            "{}",
            reply.body
        );
        // A paused slot was waited for, up to the deadline.
        assert!(took >= deadline, "{took:?}: no slot was paused");
    }
    drop(paused);
    // With every node back, the junk calls of a fresh client go through.
    let reply = post(&one, "b", &calls(8)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// A batch's IETF fields carry one item per policy (its tightest key), whatever the number of
/// its calls and keys: a batch cannot grow the response's headers past a proxy's buffer.
async fn headers_per_policy<St: Store + Clone>(one: St, two: St, _: ManualClock) {
    let layer = |store| {
        RateLimitLayer::builder()
            .policy(Policy::fixed_window("3/min").name("per-method"))
            .policy(
                Policy::fixed_window("100/min")
                    .name("per-client")
                    .key(HeaderKey::try_new("x-client").unwrap()),
            )
            .key(key::all((
                HeaderKey::try_new("x-client").unwrap(),
                key::jsonrpc(),
            )))
            .headers(tower_ratelimit::headers::HeaderStyle::Ietf)
            .store(store)
            .read_bodies(BodyLimits::new())
            .build()
            .unwrap()
    };
    let (a, b) = (app(&layer(one)), app(&layer(two)));
    let single = post(&a, "a", &call(0, "m0")).await;
    // 8 keys: m0 twice more (1 left of 3), the others once.
    let eight = batch(9, |i| format!("m{}", i.saturating_sub(1)));
    let reply = post(&b, "a", &eight).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let state = reply.header("ratelimit").unwrap();
    assert_eq!(
        state.matches(";r=").count(),
        2,
        "one item per policy: {state}"
    );
    assert!(
        state.starts_with("\"per-method\";r=0"),
        "m0's tightest key: {state}"
    );
    let policy = reply.header("ratelimit-policy").unwrap();
    assert_eq!(policy.matches(";q=").count(), 2, "{policy}");
    for reply in [&single, &reply] {
        assert_eq!(reply.header("ratelimit-policy"), Some(policy));
    }
    // Denied: the violated key is the item.
    let reply = post(&a, "a", &batch(2, |i| format!("m{}", 7 - i))).await;
    assert_eq!(reply.status, StatusCode::OK, "m7 and m6 have 2 left");
    let reply = post(&b, "a", &json!([call(0, "m1"), call(1, "m0")])).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    let state = reply.header("ratelimit").unwrap();
    assert_eq!(state.matches(";r=").count(), 2, "{state}");
    assert!(state.starts_with("\"per-method\";r=0;t="), "{state}");
}

on_two_of_each_store!(
    headers_per_policy,
    "attacks-headers",
    headers_per_policy_in_memory,
    headers_per_policy_on_two_instances_of_one_redis,
    headers_per_policy_on_the_cluster
);
