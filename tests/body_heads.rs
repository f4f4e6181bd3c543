//! What a layer that reads bodies answers on the head alone, before the body is read (a list
//! that denies, an exemption, a key already out of budget), and what a refused body costs (it
//! is charged to the head's keys, so a flood of bad bodies meets `429`). On two layers sharing
//! a store (in memory, two instances of one Redis, the cluster).

#[macro_use]
mod support;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};
use support::http::{Reply, send};
use tower_ratelimit::body::{ResponseBody, Wrapped};
use tower_ratelimit::key::HeaderKey;
use tower_ratelimit::lists::Lists;
use tower_ratelimit::request_body::{BodyLimits, Read, ReadBody};
use tower_ratelimit::{ManualClock, Policy, RateLimitLayer, Store};

type Body = BoxBody<Bytes, Infallible>;
type Layer<St> = RateLimitLayer<St, Wrapped, Read>;
type Service =
    tower::util::BoxCloneSyncService<Request<Body>, Response<ResponseBody<String>>, Infallible>;

/// Long enough that an answer within [`AT_ONCE`] was not a body's deadline.
const DEADLINE: Duration = Duration::from_secs(60);
const AT_ONCE: Duration = Duration::from_secs(10);

/// `layer` around a service answering 200 with the body it read.
fn app<St: Store + Clone>(layer: &Layer<St>) -> Service {
    use tower::Layer;
    let echo = tower::service_fn(|request: Request<ReadBody<Body>>| async {
        let body = request.into_body().collect().await.map(|b| b.to_bytes());
        let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
        Ok::<_, Infallible>(Response::new(body))
    });
    tower::util::BoxCloneSyncService::new(layer.layer(echo))
}

/// 2 a minute per `x-client`, each request costing its body's `/n`; the client `bad` denied,
/// `/health` exempt; refused bodies charged or not (`charge`).
fn layer<St: Store>(store: St, clock: &ManualClock, charge: bool) -> Layer<St> {
    RateLimitLayer::builder()
        .clock(clock.clone())
        .policy(Policy::fixed_window("2/min").name("costed").cost_json("/n"))
        .key(HeaderKey::try_new("x-client").unwrap())
        .exempt_if(|r| r.uri().path() == "/health")
        .lists(Lists::new().deny(["bad"]))
        .deny_cache(1_000)
        .store(store)
        .read_bodies(BodyLimits::new().deadline(DEADLINE).charge_rejected(charge))
        .build()
        .unwrap()
}

/// `POST path` from `client` with `body`, answered within [`AT_ONCE`].
async fn post(app: &Service, path: &str, client: &str, body: Body) -> Reply {
    let request = Request::post(path)
        .header("x-client", client)
        .body(body)
        .unwrap();
    tokio::time::timeout(AT_ONCE, send(app, request))
        .await
        .expect("answered before the body's deadline")
}

fn json(value: &Value) -> Body {
    Full::new(Bytes::from(value.to_string())).boxed()
}

fn text(text: &'static str) -> Body {
    Full::new(Bytes::from_static(text.as_bytes())).boxed()
}

/// A body whose first bytes come and whose end never does.
fn never_ending() -> Body {
    let first =
        futures_util::stream::once(async { Ok(Frame::data(Bytes::from_static(b"{\"n\":"))) });
    BodyExt::boxed(StreamBody::new(
        first.chain(futures_util::stream::pending()),
    ))
}

/// Whether a body from `client` that never ends is still awaited by `app` after 300 ms
/// (its key has budget left, nothing answers it from the head).
async fn awaited(app: &Service, client: &str) -> bool {
    let request = Request::post("/")
        .header("x-client", client)
        .body(never_ending())
        .unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(300), send(app, request)).await;
    waited.is_err()
}

/// The code of `reply`'s problem document.
fn code(reply: &Reply) -> String {
    let body: Value = serde_json::from_str(&reply.body).unwrap_or_default();
    body["code"].as_str().unwrap_or_default().to_owned()
}

/// A denied client, an exempt route and a key out of budget are answered from the head: the
/// body is not read (a body that never ends gets its answer at once).
async fn heads_answered_first<St: Store + Clone>(one: St, two: St, clock: ManualClock) {
    let (a, b) = (
        app(&layer(one, &clock, true)),
        app(&layer(two, &clock, true)),
    );
    for body in [never_ending(), text("not json"), json(&json!({"n": 1}))] {
        let reply = post(&a, "/", "bad", body).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    }
    // Exempt: the body streams through unread by the layer, whatever it is.
    let reply = post(&b, "/health", "a", text("not json")).await;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (StatusCode::OK, "not json")
    );
    assert_eq!(
        post(&a, "/", "a", json(&json!({"n": 2}))).await.status,
        StatusCode::OK
    );
    // The other instance learns the key is out of budget from the store (its deny cache
    // remembers), then answers a body that never ends at once.
    let reply = post(&b, "/", "a", json(&json!({"n": 1}))).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let reply = post(&b, "/", "a", never_ending()).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    assert!(reply.header("retry-after").is_some());
    // A key with budget left waits for its body as before (answered at the deadline).
    assert!(
        awaited(&a, "c").await,
        "a key with budget left waits for its body"
    );
}

on_two_of_each_store!(
    heads_answered_first,
    "heads-first",
    heads_answered_first_in_memory,
    heads_answered_first_on_two_instances_of_one_redis,
    heads_answered_first_on_the_cluster
);

/// Without a deny cache, a body that does not come with its head has its head's keys looked
/// at in the store while it is awaited: out of budget, `429` at once.
async fn slow_bodies_looked_at<St: Store + Clone>(one: St, two: St, clock: ManualClock) {
    let layer = |store| {
        RateLimitLayer::builder()
            .clock(clock.clone())
            .policy(Policy::fixed_window("2/min").name("costed").cost_json("/n"))
            .key(HeaderKey::try_new("x-client").unwrap())
            .store(store)
            .read_bodies(BodyLimits::new().deadline(DEADLINE))
            .build()
            .unwrap()
    };
    let (a, b) = (app(&layer(one)), app(&layer(two)));
    assert_eq!(
        post(&a, "/", "a", json(&json!({"n": 2}))).await.status,
        StatusCode::OK
    );
    let reply = post(&b, "/", "a", never_ending()).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    assert_eq!(reply.header("retry-after"), Some("60"));
    assert!(
        awaited(&a, "b").await,
        "a key with budget left waits for its body"
    );
    assert_eq!(
        post(&a, "/", "b", json(&json!({"n": 2}))).await.status,
        StatusCode::OK
    );
}

on_two_of_each_store!(
    slow_bodies_looked_at,
    "heads-slow",
    slow_bodies_looked_at_in_memory,
    slow_bodies_looked_at_on_two_instances_of_one_redis,
    slow_bodies_looked_at_on_the_cluster
);

/// Refused bodies (not JSON, too large, a cost that is no number) are charged to the head's
/// key at the policy's floor: two of them exhaust 2 a minute, the third and a good request
/// after them get `429`. Charging off, they cost nothing.
async fn refused_bodies_charged<St: Store + Clone>(one: St, two: St, clock: ManualClock) {
    let (a, b) = (
        app(&layer(one.clone(), &clock, true)),
        app(&layer(two.clone(), &clock, true)),
    );
    let reply = post(&a, "/", "a", text("not json")).await;
    assert_eq!(
        (reply.status, code(&reply).as_str()),
        (StatusCode::BAD_REQUEST, "body_not_json")
    );
    let big = Bytes::from(vec![b' '; BodyLimits::DEFAULT_LIMIT + 1]);
    let reply = post(&b, "/", "a", Full::new(big).boxed()).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    let reply = post(&a, "/", "a", json(&json!({"n": "lots"}))).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    let reply = post(&b, "/", "a", json(&json!({"n": 1}))).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    // A cost that is no number is charged as well.
    let reply = post(&a, "/", "b", json(&json!({"n": "lots"}))).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert_eq!(
        post(&b, "/", "b", json(&json!({"n": 1}))).await.status,
        StatusCode::OK
    );
    assert_eq!(
        post(&a, "/", "b", json(&json!({"n": 1}))).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Charging off: refused bodies are free, and a good request after five still passes.
    let (a, b) = (
        app(&layer(one, &clock, false)),
        app(&layer(two, &clock, false)),
    );
    for app in [&a, &b, &a, &b, &a] {
        assert_eq!(
            post(app, "/", "c", text("[")).await.status,
            StatusCode::BAD_REQUEST
        );
    }
    assert_eq!(
        post(&b, "/", "c", json(&json!({"n": 2}))).await.status,
        StatusCode::OK
    );
}

on_two_of_each_store!(
    refused_bodies_charged,
    "heads-refused",
    refused_bodies_charged_in_memory,
    refused_bodies_charged_on_two_instances_of_one_redis,
    refused_bodies_charged_on_the_cluster
);

/// A policy keyed by the head counts each call of a batch: a client's 5 a minute is 5 calls,
/// in batches or not, whatever methods (and so fresh keys of the policy reading the body)
/// the calls name; a limit of requests in flight counts a batch once.
async fn batches_count_each_call<St: Store + Clone>(one: St, two: St, clock: ManualClock) {
    let layer = |store| {
        RateLimitLayer::builder()
            .clock(clock.clone())
            .policy(Policy::fixed_window("5/min").name("per-client"))
            // A batch is one request in flight: 4 calls pass a limit of 2 at once.
            .policy(Policy::concurrency(2).name("in-flight"))
            .policy(Policy::fixed_window("100/min").name("per-method").key(
                tower_ratelimit::key::all((
                    HeaderKey::try_new("x-client").unwrap(),
                    tower_ratelimit::key::jsonrpc(),
                )),
            ))
            .key(HeaderKey::try_new("x-client").unwrap())
            .store(store)
            .read_bodies(BodyLimits::new())
            .build()
            .unwrap()
    };
    let (a, b) = (app(&layer(one)), app(&layer(two)));
    let calls = |n: usize, from: usize| {
        let calls: Vec<Value> = (from..from + n)
            .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": format!("m{i}")}))
            .collect();
        json(&Value::Array(calls))
    };
    let reply = post(&a, "/", "a", calls(4, 0)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(
        post(&b, "/", "a", calls(2, 4)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(post(&b, "/", "a", calls(1, 6)).await.status, StatusCode::OK);
    assert_eq!(
        post(&a, "/", "a", calls(1, 7)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

on_two_of_each_store!(
    batches_count_each_call,
    "heads-calls",
    batches_count_each_call_in_memory,
    batches_count_each_call_on_two_instances_of_one_redis,
    batches_count_each_call_on_the_cluster
);

/// A refused body is charged to a policy keyed by the body too, its body part `(unread)`:
/// per client with `all((client, jsonrpc()))`, so a's third bad body gets `429` while a's
/// calls and b's bad bodies keep their budgets; a policy keyed by the method alone is not
/// charged. A policy that waits is charged as well, and answers `429` without waiting.
async fn refused_bodies_charged_to_body_keys<St: Store + Clone>(
    one: St,
    two: St,
    clock: ManualClock,
) {
    let client = || HeaderKey::try_new("x-client").unwrap();
    let per_method = || {
        let key = tower_ratelimit::key::all((client(), tower_ratelimit::key::jsonrpc()));
        Policy::fixed_window("2/min").name("per-method").key(key)
    };
    // Keyed by the method alone: its one key of a bad body would be every client's.
    let per_method_of_all = || {
        Policy::fixed_window("1/min")
            .name("of-all")
            .key(tower_ratelimit::key::jsonrpc())
    };
    let layer = |store: St, policy: Policy| {
        RateLimitLayer::builder()
            .clock(clock.clone())
            .policy(policy)
            .policy(per_method_of_all())
            .key(client())
            .store(store)
            .read_bodies(BodyLimits::new().deadline(DEADLINE))
            .build()
            .unwrap()
    };
    let (a, b) = (
        app(&layer(one.clone(), per_method())),
        app(&layer(two.clone(), per_method())),
    );
    for app in [&a, &b] {
        let reply = post(app, "/", "a", text("not json")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    }
    let reply = post(&a, "/", "a", text("[")).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    assert!(reply.body.contains("per-method"), "{}", reply.body);
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "m"});
    assert_eq!(post(&b, "/", "a", json(&call)).await.status, StatusCode::OK);
    let reply = post(&b, "/", "b", text("not json")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    // A policy that waits: charged, not waited for.
    let smoothed = || {
        Policy::fixed_window("2/min")
            .name("smoothed")
            .cost_json("/n")
            .wait_up_to(Duration::from_secs(30))
    };
    let (a, b) = (app(&layer(one, smoothed())), app(&layer(two, smoothed())));
    for app in [&a, &b] {
        let reply = post(app, "/", "w", text("not json")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    }
    let reply = post(&a, "/", "w", text("not json")).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
}

on_two_of_each_store!(
    refused_bodies_charged_to_body_keys,
    "heads-unread",
    refused_bodies_charged_to_body_keys_in_memory,
    refused_bodies_charged_to_body_keys_on_two_instances_of_one_redis,
    refused_bodies_charged_to_body_keys_on_the_cluster
);

/// A key listed at runtime, on one instance, is answered as the list says by the other
/// before its body matters: denied, `403` for a refused body and at once for a body that
/// never ends; allowed, its refused bodies charged nothing (three of them, then `429` for none) and a slow body of a spent key
/// awaited, never `429`.
async fn runtime_lists_answer_before_the_body<St: Store + Clone>(
    one: St,
    two: St,
    clock: ManualClock,
) {
    use tower_ratelimit::key::Key;
    let layer = |store| {
        RateLimitLayer::builder()
            .clock(clock.clone())
            .policy(Policy::fixed_window("1/min").name("costed").cost_json("/n"))
            .key(HeaderKey::try_new("x-client").unwrap())
            .lists(Lists::new())
            .store(store)
            .read_bodies(BodyLimits::new().deadline(DEADLINE))
            .build()
            .unwrap()
    };
    let (one, two) = (layer(one), layer(two));
    let (a, b) = (app(&one), app(&two));
    one.control().deny_key(&Key::from("d"), None).await.unwrap();
    for body in [text("not json"), never_ending()] {
        let reply = post(&b, "/", "d", body).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    }
    assert_eq!(
        post(&a, "/", "k", json(&json!({"n": 1}))).await.status,
        StatusCode::OK
    );
    one.control()
        .allow_key(&Key::from("k"), None)
        .await
        .unwrap();
    // In memory the head knows the entry, and the body streams through unread (200); with
    // Redis the store's call says so after the body is read (400): never a charge, or 429.
    for app in [&a, &b, &a] {
        let reply = post(app, "/", "k", text("[")).await;
        let status = reply.status;
        assert!(
            matches!(status.as_u16(), 200 | 400),
            "{status}: {}",
            reply.body
        );
    }
    assert!(awaited(&b, "k").await, "an allowed key's body is awaited");
}

on_two_of_each_store!(
    runtime_lists_answer_before_the_body,
    "heads-lists",
    runtime_lists_answer_before_the_body_in_memory,
    runtime_lists_answer_before_the_body_on_two_instances_of_one_redis,
    runtime_lists_answer_before_the_body_on_the_cluster
);

/// At most `reading_per_key` bodies are read at once for a key: the next one of that key gets
/// `429` (`bodies_in_flight`) at once, unread and charged nothing, while another key's body
/// is read; once one of the key's bodies ends, its next is read. Requests without the key
/// count by their peer.
async fn bodies_read_at_once_bounded_per_key<St: Store + Clone>(
    one: St,
    _two: St,
    clock: ManualClock,
) {
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .policy(
            Policy::fixed_window("100/min")
                .name("costed")
                .cost_json("/n"),
        )
        .key(HeaderKey::try_new("x-client").unwrap())
        .store(one)
        .read_bodies(BodyLimits::new().deadline(DEADLINE).reading_per_key(2))
        .build()
        .unwrap();
    let app = app(&layer);
    let slow = |client: &str| {
        let mut request = Request::post("/");
        if !client.is_empty() {
            request = request.header("x-client", client);
        }
        Box::pin(send(&app, request.body(never_ending()).unwrap()))
    };
    let mut held = [slow("a"), slow("a"), slow(""), slow("")];
    for reading in &mut held {
        let waited = tokio::time::timeout(Duration::from_millis(50), reading).await;
        assert!(waited.is_err(), "its body is awaited");
    }
    let reply = post(&app, "/", "a", json(&json!({"n": 1}))).await;
    assert_eq!(
        (reply.status, code(&reply).as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "bodies_in_flight"),
        "{}",
        reply.body
    );
    assert!(awaited(&app, "b").await, "another key's body is read");
    // Without the layer's key, bodies count by the peer (here none: one count for all).
    let request = Request::post("/").body(text("{}")).unwrap();
    let reply = send(&app, request).await;
    assert_eq!(code(&reply), "bodies_in_flight", "{}", reply.body);
    drop(held);
    let reply = post(&app, "/", "a", json(&json!({"n": 1}))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

on_two_of_each_store!(
    bodies_read_at_once_bounded_per_key,
    "heads-readers",
    bodies_read_at_once_bounded_per_key_in_memory,
    bodies_read_at_once_bounded_per_key_on_two_instances_of_one_redis,
    bodies_read_at_once_bounded_per_key_on_the_cluster
);
