//! Outbound calls of several tenants to one upstream (`egress::EgressLayer`): keyed by the
//! credential each call carries, one tenant's pause holds that tenant's calls only; and what
//! a settled cost leaves a key owing pauses it `max_pause` at most, in memory and on Redis.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::RedisServer;
use tower::{Layer, ServiceExt};
use tower_ratelimit::egress::{EgressError, EgressLayer};
use tower_ratelimit::key::{ApiKey, KeyExtractor, RequestRef, UpstreamHost};
use tower_ratelimit::settle::Settle;
use tower_ratelimit::{ManualClock, MemoryStore, Policy, RedisStore, Store};

/// A call to the provider with `token` as its bearer credential.
fn call(token: &str) -> Request<String> {
    Request::post("https://llm.example/v1/chat")
        .header("authorization", format!("Bearer {token}"))
        .body(String::new())
        .unwrap()
}

/// The upstream: a `429` with `Retry-After: 60` for the tenant `spent`, else `200` saying the
/// call used `used` tokens.
fn upstream(
    spent: &'static str,
    used: &'static str,
) -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |call: Request<String>| async move {
        let auth = call.headers().get("authorization").unwrap().as_bytes();
        let mut response = Response::new(String::new());
        if auth.ends_with(spent.as_bytes()) {
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response
                .headers_mut()
                .insert("retry-after", "60".parse().unwrap());
        } else {
            response
                .headers_mut()
                .insert("x-tokens-used", used.parse().unwrap());
        }
        Ok::<_, Infallible>(response)
    })
}

/// What a call with `token` came to: its status, or that it gave up.
async fn send<St: Store>(layer: &EgressLayer<St>, token: &str) -> Option<StatusCode> {
    match layer
        .layer(upstream("spent", "1"))
        .oneshot(call(token))
        .await
    {
        Ok(response) => Some(response.status()),
        Err(EgressError::GaveUp(_)) => None,
        Err(EgressError::Upstream(never)) => match never {},
    }
}

/// One tenant's credential paused by the upstream holds that tenant's calls, not the
/// other's; the store's key holds no credential.
async fn a_tenants_pause_holds_that_tenant_only<St: Store>(store: St, clock: ManualClock) {
    let layer = EgressLayer::builder()
        .store(store)
        .clock(clock)
        .per_credential(ApiKey::bearer())
        .policy(Policy::gcra("100/min").name("llm"))
        .max_wait(Duration::from_secs(1))
        .build()
        .unwrap();
    assert_eq!(
        send(&layer, "spent").await,
        Some(StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(send(&layer, "spent").await, None, "paused for 60 s");
    assert_eq!(send(&layer, "tenant-b").await, Some(StatusCode::OK));
    assert_eq!(send(&layer, "tenant-b").await, Some(StatusCode::OK));
    // Without a credential, not sent.
    let bare = Request::post("https://llm.example/v1/chat")
        .body(String::new())
        .unwrap();
    let sent = layer.layer(upstream("spent", "1")).oneshot(bare).await;
    assert!(matches!(sent, Err(EgressError::GaveUp(_))));
    // The key is the host's and the credential's hash: the paused one is the spent
    // tenant's.
    let spent = key_of("spent");
    assert!(
        !layer
            .limits()
            .control()
            .peek(&spent)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(
        layer
            .limits()
            .control()
            .peek(&key_of("tenant-b"))
            .await
            .unwrap()
            .is_allowed()
    );
    let host = UpstreamHost
        .extract(&RequestRef::new(&call("spent")))
        .unwrap();
    assert!(
        layer
            .limits()
            .control()
            .peek(&host)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(!format!("{spent:?}").contains("spent"), "{spent:?}");
}

/// The key of a call with `token`: its upstream and the token's hash.
fn key_of(token: &str) -> tower_ratelimit::key::Key {
    let request = call(token);
    tower_ratelimit::key::all((UpstreamHost, ApiKey::bearer()))
        .extract(&RequestRef::new(&request))
        .unwrap()
}

#[tokio::test]
async fn a_tenants_pause_holds_that_tenant_only_in_memory() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    a_tenants_pause_holds_that_tenant_only(store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_pause_holds_that_tenant_only_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = redis(&server, "tenants:", &clock).await;
    a_tenants_pause_holds_that_tenant_only(store, clock).await;
    support::assert_no_key_without_ttl(&server, "tenants:");
}

/// A store on `server` with keys under `prefix`, on `clock`.
async fn redis(server: &RedisServer, prefix: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::builder(&server.url())
        .prefix(prefix)
        .clock(clock.clone())
        .build()
        .await
        .expect("connect to the test Redis")
}

/// A call estimated at the whole bucket (100 tokens) that the upstream says used 1,000 (ten
/// times the limit, the default clamp) leaves the key owing what the rate pays back in
/// `max_pause` (one minute: 100 tokens), not nine minutes' worth.
async fn a_settled_debt_pauses_the_key_max_pause_at_most<St: Store>(store: St, clock: ManualClock) {
    let tokens = Policy::token_bucket("100/min")
        .name("tokens")
        .cost(|_: &RequestRef<'_>| 100)
        .settle(Settle::header("x-tokens-used"));
    let layer = EgressLayer::builder()
        .store(store)
        .clock(clock)
        .per_credential(ApiKey::bearer())
        .policy(tokens)
        .max_pause(Duration::from_secs(60))
        .max_wait(Duration::from_millis(10))
        .build()
        .unwrap();
    let sent = layer
        .layer(upstream("none", "1000"))
        .oneshot(call("a"))
        .await;
    drop(sent.unwrap());
    let key = key_of("a");
    // Settled once the store has it (the settling is on its way when the call returns): the
    // bucket is then more than the minute its 100 tokens take from full.
    let full = Duration::from_secs(60);
    let mut settled = false;
    for _ in 0..1_000 {
        let decision = layer.limits().control().peek(&key).await.unwrap();
        if decision.tightest().reset_after() > full {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(settled, "the call's cost was settled");
    let next = layer.limits().check(&key, 1).await.unwrap();
    assert!(!next.is_allowed());
    let owed = next.retry_after();
    let owed = owed.expect("the key owes what the call used past its estimate");
    // The call is charged its 100 and 100 past them, what a minute pays back; the next
    // token comes 600 ms after.
    assert!(owed <= Duration::from_millis(60_600), "owes {owed:?}");
    assert!(owed >= Duration::from_secs(59), "owes {owed:?}");
}

#[tokio::test]
async fn a_settled_debt_pauses_the_key_max_pause_at_most_in_memory() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    a_settled_debt_pauses_the_key_max_pause_at_most(store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_debt_pauses_the_key_max_pause_at_most_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = redis(&server, "debt:", &clock).await;
    a_settled_debt_pauses_the_key_max_pause_at_most(store, clock).await;
    support::assert_no_key_without_ttl(&server, "debt:");
}
