//! Costs settled after the response (`Policy::settle`), through the layer, on both stores:
//! an estimate lower and higher than the real cost, read from a header, an extension, a
//! trailer or a streamed body; a dropped stream; a debt that denies and then clears; bad
//! reports; and exact sums when two layers share a store under concurrency.
//!
//! Time moves only through a `ManualClock`.

mod support;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use support::{RedisCluster, RedisServer, Rng, eventually};
use tower::{Service, ServiceExt, service_fn};
use tower_ratelimit::headers::X_RATELIMIT_REMAINING;
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::{
    Algorithm, ManualClock, MemoryStore, Policy, RateLimitLayer, Store, settle::ActualCost,
    settle::Settle,
};

/// A body of the given frames, sent one per poll.
struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// The application: reports what a request asks it to, as the request's headers say:
/// `x-used` (the header of that name on the response), `x-ext` (an `ActualCost` extension),
/// `x-stream` (a body of that many bytes in chunks of at most 1,000), `x-trailer` (a
/// trailer `x-used` after a short body).
async fn app(request: Request<()>) -> Result<Response<Frames>, Infallible> {
    let asked = |name: &str| request.headers().get(name).map(|v| v.to_str().unwrap());
    let mut frames = VecDeque::new();
    if let Some(n) = asked("x-stream") {
        let mut left: usize = n.parse().unwrap();
        while left > 0 {
            let chunk = left.min(1_000);
            frames.push_back(Frame::data(Bytes::from(vec![b'x'; chunk])));
            left -= chunk;
        }
    }
    if let Some(n) = asked("x-trailer") {
        frames.push_back(Frame::data(Bytes::from_static(b"done")));
        let mut trailers = HeaderMap::new();
        trailers.insert("x-used", HeaderValue::from_str(n).unwrap());
        frames.push_back(Frame::trailers(trailers));
    }
    let mut response = Response::new(Frames(frames));
    if let Some(n) = asked("x-used") {
        let value = HeaderValue::from_str(n).unwrap();
        response.headers_mut().insert("x-used", value);
    }
    if let Some(n) = asked("x-ext") {
        response
            .extensions_mut()
            .insert(ActualCost(n.parse().unwrap()));
    }
    Ok(response)
}

/// A layer keyed by `x-user`, of `policy`, whose estimate is the request's `x-estimate`.
fn layer<St: Store>(store: St, policy: Policy) -> RateLimitLayer<St> {
    RateLimitLayer::builder()
        .store(store)
        .key(HeaderKey::try_new("x-user").unwrap())
        .policy(policy.cost(|r| {
            r.headers()
                .get("x-estimate")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        }))
        .build()
        .unwrap()
}

/// What one request got: its status, its `X-RateLimit-Remaining` and `Retry-After`.
#[derive(Debug)]
struct Got {
    status: StatusCode,
    remaining: Option<u64>,
    retry_after: Option<u64>,
}

/// Sends a request of `headers` (`x-user: u` among them unless given) and reads the whole
/// response body.
async fn send<St: Store>(layer: &RateLimitLayer<St>, headers: &[(&str, &str)]) -> Got {
    let mut request = Request::builder().header("x-user", "u");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(app));
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(request.body(()).unwrap())
        .await
        .unwrap();
    let number = |name| {
        let value = response.headers().get(name)?;
        Some(value.to_str().unwrap().parse::<u64>().unwrap())
    };
    let got = Got {
        status: response.status(),
        remaining: number(X_RATELIMIT_REMAINING),
        retry_after: number(RETRY_AFTER),
    };
    response.into_body().collect().await.unwrap();
    got
}

/// Units the key `u` has left in the layer's one policy.
async fn left<St: Store>(layer: &RateLimitLayer<St>) -> u64 {
    let decision = layer.control().peek(&Key::from("u")).await.unwrap();
    decision.outcomes()[0].remaining()
}

/// A memory store and a Redis store on `server`, each deciding on `clock`.
async fn stores(server: &RedisServer, clock: &ManualClock, prefix: &str) -> Both {
    Both {
        memory: MemoryStore::with_clock(clock.clone()),
        redis: server.store(prefix, clock).await,
    }
}

struct Both {
    memory: MemoryStore,
    redis: tower_ratelimit::RedisStore,
}

/// Runs `scenario` on both stores.
macro_rules! on_both {
    ($server:expr, $clock:expr, $prefix:expr, |$store:ident| $body:expr) => {{
        let both = stores($server, $clock, $prefix).await;
        {
            let $store = both.memory.clone();
            $body
        }
        {
            let $store = both.redis.clone();
            $body
        }
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_read_from_the_head_settles_before_the_response_goes_on() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    on_both!(&server, &clock, "head:", |store| {
        // From a header: an estimate of 10, a real cost of 3.
        let header = layer(
            store.clone(),
            Policy::fixed_window("100/min")
                .name("header")
                .settle(Settle::header("x-used")),
        );
        let got = send(&header, &[("x-estimate", "10"), ("x-used", "3")]).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(
            got.remaining,
            Some(97),
            "the response tells what is left after its settled cost"
        );
        assert_eq!(left(&header).await, 97, "settled at the real cost");
        let got = send(&header, &[("x-estimate", "10"), ("x-used", "25")]).await;
        assert_eq!(
            got.remaining,
            Some(72),
            "the response tells what is left after its settled cost"
        );
        assert_eq!(left(&header).await, 72, "a higher real cost charged");

        // From the handler's extension.
        let ext = layer(
            store.clone(),
            Policy::gcra("100/min")
                .name("extension")
                .settle(Settle::extension()),
        );
        send(&ext, &[("x-estimate", "50"), ("x-ext", "5")]).await;
        assert_eq!(left(&ext).await, 95);
        // No extension: the estimate stands.
        send(&ext, &[("x-estimate", "7")]).await;
        assert_eq!(left(&ext).await, 88);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_denies_until_time_pays_it_back_on_every_algorithm() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    on_both!(&server, &clock, "debt:", |store| {
        for algorithm in Algorithm::ALL {
            let name = format!("debt-{algorithm}");
            let policy = Policy::new(algorithm, "100/min")
                .name(name.as_str())
                .settle(Settle::header("x-used"));
            let layer = layer(store.clone(), policy);
            let got = send(&layer, &[("x-estimate", "10"), ("x-used", "350")]).await;
            assert_eq!(
                got.status,
                StatusCode::OK,
                "{algorithm}: admitted on the estimate"
            );
            let got = send(&layer, &[]).await;
            assert_eq!(
                got.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{algorithm}: in debt"
            );
            let retry = got.retry_after.expect("Retry-After");
            assert!(retry > 0, "{algorithm}");
            // Still denied just before the time Retry-After names (rounded up to seconds)...
            let exact = layer.check(&Key::from("u"), 1).await.unwrap();
            let exact = exact.outcomes()[0].retry_after().unwrap();
            assert!(
                exact.as_secs() < retry + 1,
                "{algorithm}: {exact:?} vs {retry}"
            );
            clock.advance(exact - Duration::from_micros(1));
            let denied = layer.check(&Key::from("u"), 1).await.unwrap();
            assert!(
                !denied.is_allowed(),
                "{algorithm}: the debt is not paid yet"
            );
            // ... and admitted once it is paid.
            clock.advance(Duration::from_micros(1));
            let got = send(&layer, &[]).await;
            assert_eq!(got.status, StatusCode::OK, "{algorithm}: the debt paid");
            clock.advance(Duration::from_secs(3_600));
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_is_settled_when_it_ends_or_is_dropped() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    on_both!(&server, &clock, "body:", |store| {
        let bytes = layer(
            store.clone(),
            Policy::fixed_window("100000/h")
                .name("bytes")
                .settle(Settle::body_bytes()),
        );
        let got = send(&bytes, &[("x-estimate", "500"), ("x-stream", "3500")]).await;
        assert_eq!(got.remaining, Some(99_500), "the headers tell the estimate");
        eventually("the stream settled at its end", async || {
            left(&bytes).await == 96_500
        })
        .await;

        // Dropped after its first chunk: what was sent so far.
        let mut svc = tower::ServiceBuilder::new()
            .layer(bytes.clone())
            .service(service_fn(app));
        let request = Request::builder()
            .header("x-user", "u")
            .header("x-estimate", "500")
            .header("x-stream", "5000")
            .body(())
            .unwrap();
        let response = svc.ready().await.unwrap().call(request).await.unwrap();
        let mut body = response.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().map(Bytes::len), Some(1_000));
        assert_eq!(
            left(&bytes).await,
            96_000,
            "nothing settled while it streams"
        );
        drop(body);
        eventually("the dropped stream settled", async || {
            left(&bytes).await == 95_500
        })
        .await;

        // A function of the frames: one unit per data frame.
        let frames = layer(
            store.clone(),
            Policy::token_bucket("1000/h")
                .name("frames")
                .settle(Settle::body(|f: &Frame<Bytes>| u64::from(f.is_data()))),
        );
        send(&frames, &[("x-estimate", "1"), ("x-stream", "4200")]).await;
        eventually("five frames counted", async || left(&frames).await == 995).await;

        // A trailer.
        let trailer = layer(
            store.clone(),
            Policy::sliding_log("1000/h")
                .name("trailer")
                .settle(Settle::trailer("x-used")),
        );
        send(&trailer, &[("x-estimate", "100"), ("x-trailer", "42")]).await;
        eventually("the trailer settled", async || left(&trailer).await == 958).await;
        // A body that ends without the trailer: the estimate stands.
        send(&trailer, &[("x-estimate", "100"), ("x-stream", "10")]).await;
        eventually("the estimate kept", async || left(&trailer).await == 858).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reports_are_clamped_never_a_panic() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    on_both!(&server, &clock, "bad:", |store| {
        let layer = layer(
            store.clone(),
            Policy::gcra("100/h")
                .name("bad")
                .settle(Settle::header("x-used").at_most(2)),
        );
        let key = Key::from("u");
        // Not a number: the estimate stands.
        let got = send(&layer, &[("x-estimate", "5"), ("x-used", "lots")]).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(left(&layer).await, 95);
        // Negative: nothing was used.
        send(&layer, &[("x-estimate", "5"), ("x-used", "-3")]).await;
        assert_eq!(left(&layer).await, 95);
        // Absurd: clamped to twice the limit, a debt of 200 - 95 units.
        send(
            &layer,
            &[("x-estimate", "5"), ("x-used", "99999999999999999999")],
        )
        .await;
        let peek = layer.control().peek(&key).await.unwrap();
        assert_eq!(peek.outcomes()[0].remaining(), 0);
        let owed = peek.outcomes()[0].reset_after();
        // GCRA at 100/h: 36 s a unit; reset = 200 units past a fresh key + the 95 it had used.
        assert_eq!(
            owed,
            Duration::from_secs(36 * (200 + 5)),
            "clamped at 2 x 100"
        );
        layer.control().reset(&key).await.unwrap();
    });
}

#[test]
fn a_policy_that_settles_is_enforced_alone() {
    use support::build_error;
    let settle = || Settle::header("x-used");
    let shadow = build_error(Policy::gcra("1/s").settle(settle()).shadow());
    assert!(shadow.contains("settles its cost"), "{shadow}");
    let refund = build_error(Policy::gcra("1/s").settle(settle()).refund_if(|_| true));
    assert!(refund.contains("refund_if"), "{refund}");
    let lease = build_error(Policy::gcra("1/s").settle(settle()).lease(5));
    assert!(lease.contains("lease"), "{lease}");
    let name = build_error(Policy::gcra("1/s").settle(Settle::header("bad name")));
    assert!(name.contains("not a valid header name"), "{name}");
    let zero = build_error(Policy::gcra("1/s").settle(settle().at_most(0)));
    assert!(zero.contains("at_most(0)"), "{zero}");
}

/// Two layers on the stores `a` and `b` (two instances' connections to one Redis, or one
/// memory store), `tasks` tasks each sending `per_task` streamed requests of random
/// estimates and sizes: the store's charges end up the sum of the real sizes exactly.
async fn sums_exactly<St: Store + Clone>(a: St, b: St, tasks: u64, per_task: u64, name: &str) {
    let policy = || {
        Policy::fixed_window("1000000000/h")
            .name(name)
            .settle(Settle::body_bytes())
    };
    let layers = [layer(a, policy()), layer(b, policy())];
    let mut handles = Vec::new();
    for t in 0..tasks {
        let layer = layers[(t % 2) as usize].clone();
        handles.push(tokio::spawn(async move {
            let mut rng = Rng::new(t);
            let mut sum = 0;
            for _ in 0..per_task {
                let size = rng.range(0, 3_000);
                let estimate = rng.range(1, 2_000).to_string();
                let size_text = size.to_string();
                let headers = [
                    ("x-estimate", estimate.as_str()),
                    ("x-stream", size_text.as_str()),
                ];
                let got = send(&layer, &headers).await;
                assert_eq!(got.status, StatusCode::OK);
                sum += size;
            }
            sum
        }));
    }
    let mut sum = 0;
    for h in handles {
        sum += h.await.unwrap();
    }
    let limit = 1_000_000_000;
    eventually("every stream settled", async || {
        left(&layers[0]).await == limit - sum
    })
    .await;
    assert_eq!(
        left(&layers[1]).await,
        limit - sum,
        "both layers see one count"
    );
}

/// A debt run up through the layer on `a` denies on `b` until it is paid back, then clears
/// on both.
async fn debt_across<St: Store>(a: St, b: St, clock: &ManualClock, name: &str) {
    let policy = || {
        Policy::token_bucket("60/min")
            .name(name)
            .settle(Settle::header("x-used"))
    };
    let (a, b) = (layer(a, policy()), layer(b, policy()));
    let got = send(&a, &[("x-estimate", "10"), ("x-used", "90")]).await;
    assert_eq!(got.status, StatusCode::OK);
    // 90 units from a bucket of 60 refilled at one a second: 30 owed, then one for the next.
    let got = send(&b, &[]).await;
    assert_eq!(
        got.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the other instance"
    );
    assert_eq!(got.retry_after, Some(31));
    clock.advance(Duration::from_secs(30));
    assert_eq!(send(&a, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_secs(1));
    assert_eq!(send(&b, &[]).await.status, StatusCode::OK, "the debt paid");
    assert_eq!(send(&a, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_on_one_instance_denies_on_the_other_until_paid() {
    let clock = ManualClock::new();
    let server = RedisServer::start();
    let a = server.store("debt2:", &clock).await;
    let b = server.store("debt2:", &clock).await;
    debt_across(a, b, &clock, "debt-redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_settle_exact_sums_on_one_store() {
    let clock = ManualClock::new();
    let memory = MemoryStore::with_clock(clock.clone());
    sums_exactly(memory.clone(), memory, 8, 200, "sum-memory").await;
    // Two instances: two stores, each with its own connection to one Redis.
    let server = RedisServer::start();
    let a = server.store("sum:", &clock).await;
    let b = server.store("sum:", &clock).await;
    sums_exactly(a, b, 8, 200, "sum-redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_settle_exact_sums_and_debts_on_the_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new();
    let store = async || {
        tower_ratelimit::RedisStore::builder(&cluster.url())
            .prefix("sum:")
            .deadline(Duration::from_secs(10))
            .clock(clock.clone())
            .build()
            .await
            .unwrap()
    };
    sums_exactly(store().await, store().await, 8, 50, "sum-cluster").await;
    debt_across(store().await, store().await, &clock, "debt-cluster").await;
}

/// With the IETF fields, the policy names its unit (`qu="tokens"`), and `r` tells what is
/// left after the response's own settled cost (it told the estimate before).
#[tokio::test]
async fn the_ietf_fields_name_tokens_and_tell_the_settled_cost() {
    let layer = RateLimitLayer::builder()
        .store(MemoryStore::with_clock(ManualClock::new()))
        .key(HeaderKey::try_new("x-user").unwrap())
        .headers(tower_ratelimit::headers::HeaderStyle::Ietf)
        .policy(
            Policy::fixed_window("1000/min")
                .name("tokens")
                .unit(tower_ratelimit::QuotaUnit::Tokens)
                .cost(|_| 100)
                .settle(Settle::header("x-used")),
        )
        .build()
        .unwrap();
    let fields = async |used: &str| {
        let mut svc = tower::ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(app));
        let request = Request::builder()
            .header("x-user", "u")
            .header("x-used", used)
            .body(())
            .unwrap();
        let response = svc.ready().await.unwrap().call(request).await.unwrap();
        let field = |name: &str| {
            let value = response.headers().get(name).expect(name);
            value.to_str().unwrap().to_owned()
        };
        (field("ratelimit-policy"), field("ratelimit"))
    };
    let (policy, state) = fields("30").await;
    assert!(policy.contains("qu=\"tokens\""), "{policy}");
    assert!(state.contains(";r=970"), "30 settled: {state}");
    let (_, state) = fields("30").await;
    assert!(state.contains(";r=940"), "30 and 30 settled: {state}");
}
