//! Outbound calls (`egress::EgressLayer`): clients that share one budget through their store,
//! wait for their booked time or give up, and learn pauses from the upstream's answers.
//!
//! Every store decides on tokio's clock ([`TokioClock`]): paused in memory, so that the waits
//! (and the store's time with them) pass at once; on a real redis-server (and a real cluster)
//! it is the real time, the few waits that complete are short, and only their lower bound is
//! asserted.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::{RedisCluster, RedisServer};
use tower::{Layer, Service, ServiceExt};
use tower_ratelimit::egress::{
    AdaptiveRate, EgressError, EgressLayer, GaveUp, Reason, RetryBudget, RetryLayer,
};
use tower_ratelimit::key::Key;
use tower_ratelimit::{Clock, MemoryStore, Policy, RedisStore, Store};

/// The time of tokio's clock (paused or not), from a day's start: the stores decide on the
/// same time the waits run on.
#[derive(Clone, Debug)]
struct TokioClock(tokio::time::Instant);

impl TokioClock {
    fn new() -> Self {
        TokioClock(tokio::time::Instant::now())
    }
}

impl Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        999_993_600_000_000 + self.0.elapsed().as_micros() as u64
    }
}

/// A store on `url` (a server's or a cluster's) with keys under `prefix`, on `clock`.
async fn redis(url: &str, prefix: &str, clock: &TokioClock) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .deadline(Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .await
        .expect("connect to the test Redis")
}

/// What the counting upstream answers its first call with (then `200`).
type FirstAnswer = Option<(StatusCode, Vec<(&'static str, String)>)>;

/// An upstream that counts the calls that reach it (with the time each came, on tokio's
/// clock), answering the first as told.
#[derive(Clone, Default)]
struct Upstream {
    calls: Arc<Mutex<Vec<tokio::time::Instant>>>,
    first: Arc<Mutex<FirstAnswer>>,
    /// How long the first answer takes.
    slow_first: Duration,
    /// How many calls get the first answer (one when 0).
    times: usize,
}

impl Upstream {
    fn answering_first(status: StatusCode, headers: &[(&'static str, &str)]) -> Self {
        let headers = headers.iter().map(|(n, v)| (*n, v.to_string())).collect();
        Upstream {
            first: Arc::new(Mutex::new(Some((status, headers)))),
            ..Upstream::default()
        }
    }

    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<String>,
        Response = Response<String>,
        Error = Infallible,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        let this = self.clone();
        tower::service_fn(move |_: Request<String>| {
            let this = this.clone();
            async move {
                let nth = {
                    let mut calls = this.calls.lock().unwrap();
                    calls.push(tokio::time::Instant::now());
                    calls.len()
                };
                let first = nth == 1;
                if first {
                    tokio::time::sleep(this.slow_first).await;
                }
                let mut response = Response::new(String::from("ok"));
                let answer = match nth <= this.times.max(1) {
                    true => this.first.lock().unwrap().clone(),
                    false => None,
                };
                if let Some((status, headers)) = answer {
                    *response.status_mut() = status;
                    for (name, value) in headers {
                        response.headers_mut().insert(name, value.parse().unwrap());
                    }
                }
                Ok::<_, Infallible>(response)
            }
        })
    }
}

/// GCRA at 2 per second (one every 500 ms, two at once), named `partner`.
fn partner() -> Policy {
    Policy::gcra("2/s").name("partner")
}

/// A call to the partner's API.
fn call() -> Request<String> {
    Request::post("https://api.partner.example/v1/orders")
        .body(String::new())
        .unwrap()
}

/// An egress layer on `store` (deciding on `clock`) with `partner()`, waiting up to `max_wait`.
fn egress<St: Store>(store: St, clock: &TokioClock, max_wait: Duration) -> EgressLayer<St> {
    egress_with(store, clock, partner(), max_wait)
}

/// An egress layer on `store` (deciding on `clock`) with `policy`, waiting up to `max_wait`.
fn egress_with<St: Store>(
    store: St,
    clock: &TokioClock,
    policy: Policy,
    max_wait: Duration,
) -> EgressLayer<St> {
    EgressLayer::builder()
        .store(store)
        .clock(clock.clone())
        .policy(policy)
        .max_wait(max_wait)
        .build()
        .expect("a valid egress layer")
}

/// GCRA at one a second (one at once), named `partner`.
fn one_a_second() -> Policy {
    Policy::gcra("1/s").name("partner")
}

/// What a call through `layer` to `upstream` came to: its status, or why it was not sent.
async fn send<St: Store>(
    layer: &EgressLayer<St>,
    upstream: &Upstream,
) -> Result<StatusCode, GaveUp> {
    match layer.layer(upstream.service()).oneshot(call()).await {
        Ok(response) => Ok(response.status()),
        Err(EgressError::GaveUp(gave_up)) => Err(gave_up),
        Err(EgressError::Upstream(never)) => match never {},
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Six calls at once from two clients, alternating: two sent at once, two after their booked
/// times (500 ms, 1 s), two given up (their times are past the longest wait of 1 s) naming
/// the policy and when to retry. Returns when each sent call reached the upstream, from the
/// start.
async fn six_calls_from_two_clients<St: Store>(
    a: &EgressLayer<St>,
    b: &EgressLayer<St>,
) -> (Vec<Duration>, Vec<GaveUp>) {
    let upstream = Upstream::default();
    let started = tokio::time::Instant::now();
    let mut calls = Vec::new();
    for i in 0..6 {
        let (layer, upstream) = (if i % 2 == 0 { a } else { b }.clone(), upstream.clone());
        calls.push(tokio::spawn(async move { send(&layer, &upstream).await }));
        // Each books its time before the next asks.
        tokio::task::yield_now().await;
        tokio::time::sleep(ms(1)).await;
    }
    let mut gave_up = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(status) => assert_eq!(status, StatusCode::OK),
            Err(g) => gave_up.push(g),
        }
    }
    let times = upstream
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - started)
        .collect();
    (times, gave_up)
}

fn assert_shared_budget(times: &[Duration], gave_up: &[GaveUp]) {
    assert_eq!(times.len(), 4, "{times:?}");
    let mut sorted = times.to_vec();
    sorted.sort();
    assert!(sorted[1] < ms(300), "two at once: {sorted:?}");
    assert!(sorted[2] >= ms(500), "never before its time: {sorted:?}");
    assert!(sorted[3] >= ms(1000), "never before its time: {sorted:?}");
    assert_eq!(gave_up.len(), 2);
    for g in gave_up {
        assert_eq!((g.reason(), g.policy()), (Reason::Limited, "partner"));
        let retry = g.retry_after().expect("when to retry");
        assert!(retry > ms(1000) && retry <= ms(1500), "{retry:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn two_clients_on_one_memory_store_share_one_budget() {
    let clock = TokioClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let (a, b) = (
        egress(store.clone(), &clock, ms(1000)),
        egress(store, &clock, ms(1000)),
    );
    let (times, gave_up) = six_calls_from_two_clients(&a, &b).await;
    assert_shared_budget(&times, &gave_up);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_on_one_redis_share_one_budget() {
    let server = RedisServer::start();
    let clock = TokioClock::new();
    let a = egress(
        redis(&server.url(), "egress:", &clock).await,
        &clock,
        ms(1000),
    );
    let b = egress(
        redis(&server.url(), "egress:", &clock).await,
        &clock,
        ms(1000),
    );
    let (times, gave_up) = six_calls_from_two_clients(&a, &b).await;
    assert_shared_budget(&times, &gave_up);
    support::assert_no_key_without_ttl(&server, "egress:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_on_a_redis_cluster_share_one_budget() {
    let cluster = RedisCluster::start();
    let clock = TokioClock::new();
    let a = egress(
        redis(&cluster.url(), "egress:", &clock).await,
        &clock,
        ms(1000),
    );
    let b = egress(
        redis(&cluster.url(), "egress:", &clock).await,
        &clock,
        ms(1000),
    );
    let (times, gave_up) = six_calls_from_two_clients(&a, &b).await;
    assert_shared_budget(&times, &gave_up);
}

/// The forms an upstream tells its callers to pause in, each asking for 2 s.
fn pausing_answers() -> Vec<(StatusCode, Vec<(&'static str, &'static str)>)> {
    vec![
        (StatusCode::TOO_MANY_REQUESTS, vec![("retry-after", "2")]),
        (StatusCode::SERVICE_UNAVAILABLE, vec![("retry-after", "2")]),
        (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("ratelimit", "\"default\";r=0;t=2")],
        ),
        // Nothing left, said on a success.
        (
            StatusCode::OK,
            vec![("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "2")],
        ),
    ]
}

/// `a`'s first call is answered with a pause of 2 s: it gets that answer as it came; then no
/// call of `b` reaches the upstream before the pause ends: one that may wait 1 s gives up
/// (retry after the pause), one that may wait 3 s is sent once it ends.
async fn a_pause_holds_for_both<St: Store>(
    a: &EgressLayer<St>,
    b_short: &EgressLayer<St>,
    b_long: &EgressLayer<St>,
    answer: (StatusCode, Vec<(&'static str, &'static str)>),
) {
    let what = format!("{answer:?}");
    let upstream = Upstream::answering_first(answer.0, &answer.1);
    assert_eq!(send(a, &upstream).await, Ok(answer.0), "{what}");
    let started = tokio::time::Instant::now();
    let gave_up = send(b_short, &upstream).await.expect_err(&what);
    assert_eq!(gave_up.reason(), Reason::Limited, "{what}");
    let retry = gave_up.retry_after().expect("when to retry");
    assert!(retry > ms(1000) && retry <= ms(2000), "{what}: {retry:?}");
    assert_eq!(upstream.calls(), 1, "{what}");
    assert_eq!(send(b_long, &upstream).await, Ok(StatusCode::OK), "{what}");
    assert!(
        started.elapsed() >= ms(1900),
        "{what}: {:?}",
        started.elapsed()
    );
    assert_eq!(upstream.calls(), 2, "{what}");
}

#[tokio::test(start_paused = true)]
async fn an_upstreams_pause_holds_for_every_client_in_memory() {
    for answer in pausing_answers() {
        let clock = TokioClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let a = egress(store.clone(), &clock, ms(1000));
        let b_short = egress(store.clone(), &clock, ms(1000));
        let b_long = egress(store, &clock, ms(3000));
        a_pause_holds_for_both(&a, &b_short, &b_long, answer).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_pause_holds_for_every_client_on_redis() {
    let server = RedisServer::start();
    for (i, answer) in pausing_answers().into_iter().enumerate() {
        let (clock, prefix, url) = (TokioClock::new(), format!("pause{i}:"), server.url());
        let a = egress(redis(&url, &prefix, &clock).await, &clock, ms(1000));
        let b_short = egress(redis(&url, &prefix, &clock).await, &clock, ms(1000));
        let b_long = egress(redis(&url, &prefix, &clock).await, &clock, ms(3000));
        a_pause_holds_for_both(&a, &b_short, &b_long, answer).await;
        support::assert_no_key_without_ttl(&server, &prefix);
    }
}

/// A call that booked its time before the upstream asked for a pause, whose time comes
/// during it, is held: it books a time after the pause (or gives up, past its longest wait).
async fn a_booked_call_is_held_by_a_later_pause<St: Store>(layer: &EgressLayer<St>) {
    let mut upstream =
        Upstream::answering_first(StatusCode::TOO_MANY_REQUESTS, &[("retry-after", "2")]);
    upstream.slow_first = ms(100);
    let started = tokio::time::Instant::now();
    let first = tokio::spawn({
        let (layer, upstream) = (layer.clone(), upstream.clone());
        async move { send(&layer, &upstream).await }
    });
    tokio::time::sleep(ms(10)).await;
    // Booked for 1 s from now, before the pause (learned at 100 ms) is.
    let booked = tokio::spawn({
        let (layer, upstream) = (layer.clone(), upstream.clone());
        async move { send(&layer, &upstream).await }
    });
    assert_eq!(first.await.unwrap(), Ok(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(booked.await.unwrap(), Ok(StatusCode::OK));
    let calls = upstream.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    let sent = calls[1] - started;
    assert!(sent >= ms(2100), "sent during the pause, at {sent:?}");
}

#[tokio::test(start_paused = true)]
async fn a_booked_call_is_held_by_a_later_pause_in_memory() {
    let clock = TokioClock::new();
    let layer = egress_with(
        MemoryStore::with_clock(clock.clone()),
        &clock,
        one_a_second(),
        ms(3000),
    );
    a_booked_call_is_held_by_a_later_pause(&layer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booked_call_is_held_by_a_later_pause_on_redis() {
    let server = RedisServer::start();
    let clock = TokioClock::new();
    let layer = egress_with(
        redis(&server.url(), "held:", &clock).await,
        &clock,
        one_a_second(),
        ms(3000),
    );
    a_booked_call_is_held_by_a_later_pause(&layer).await;
    support::assert_no_key_without_ttl(&server, "held:");
}

/// A held call dropped while it waits for the time it booked after the pause (a timeout
/// above it) gives that time back: the next call is sent when the pause ends, not a second
/// after.
async fn a_held_call_dropped_gives_its_time_back<St: Store>(layer: &EgressLayer<St>) {
    let mut upstream =
        Upstream::answering_first(StatusCode::TOO_MANY_REQUESTS, &[("retry-after", "2")]);
    upstream.slow_first = ms(100);
    let started = tokio::time::Instant::now();
    let first = tokio::spawn({
        let (layer, upstream) = (layer.clone(), upstream.clone());
        async move { send(&layer, &upstream).await }
    });
    tokio::time::sleep(ms(10)).await;
    // Booked for 1 s, held at 1 s by the pause, booked again after it (2.1 s), dropped at 1.5 s.
    let dropped = tokio::time::timeout(ms(1500), send(layer, &upstream)).await;
    assert!(dropped.is_err(), "{dropped:?}");
    // Its time goes back by a store call of its own (with Redis, on a task): the next call
    // is made once it landed, when the key is free again by the pause's end, not a second after.
    let key = Key::from("api.partner.example:443");
    let mut free_at = Duration::MAX;
    for _ in 0..10_000 {
        let peeked = layer.limits().control().peek(&key).await.unwrap();
        free_at = started.elapsed() + peeked.tightest().reset_after();
        if free_at < ms(2600) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        free_at < ms(2600),
        "the dropped call's time was kept: free at {free_at:?}"
    );
    assert_eq!(first.await.unwrap(), Ok(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(send(layer, &upstream).await, Ok(StatusCode::OK));
    let calls = upstream.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "the dropped call was sent");
    let sent = calls[1] - started;
    assert!(sent >= ms(2100), "sent during the pause, at {sent:?}");
    assert!(
        sent < ms(2600),
        "the dropped call's time was kept: sent at {sent:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_held_call_dropped_gives_its_time_back_in_memory() {
    let clock = TokioClock::new();
    let layer = egress_with(
        MemoryStore::with_clock(clock.clone()),
        &clock,
        one_a_second(),
        ms(5000),
    );
    a_held_call_dropped_gives_its_time_back(&layer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_dropped_gives_its_time_back_on_redis() {
    let server = RedisServer::start();
    let clock = TokioClock::new();
    let layer = egress_with(
        redis(&server.url(), "dropped:", &clock).await,
        &clock,
        one_a_second(),
        ms(5000),
    );
    a_held_call_dropped_gives_its_time_back(&layer).await;
    support::assert_no_key_without_ttl(&server, "dropped:");
}

/// GCRA at 100 an hour (a hundred at once; one more every 36 s: none in a test's time).
fn hundred_an_hour() -> Policy {
    Policy::gcra("100/h").name("partner")
}

/// The upstream answers the first call (through `a`) saying it has 5 left of `report`'s
/// limit: when that is the policy's limit (and window, when named), `b` sends 5 more calls
/// and gives up the 6th (its place is an hour away); otherwise it sends all 6.
async fn a_remaining_count_corrects_the_policy<St: Store>(
    a: &EgressLayer<St>,
    b: &EgressLayer<St>,
    report: &[(&'static str, &str)],
    corrects: bool,
) {
    let upstream = Upstream::answering_first(StatusCode::OK, report);
    assert_eq!(send(a, &upstream).await, Ok(StatusCode::OK));
    let mut sent = 0;
    for _ in 0..6 {
        match send(b, &upstream).await {
            Ok(_) => sent += 1,
            Err(gave_up) => assert_eq!(gave_up.policy(), "partner"),
        }
    }
    assert_eq!(sent, if corrects { 5 } else { 6 }, "{report:?}");
}

/// The reports of 5 left of a limit of 100 an hour, and whether each is the policy's.
fn remaining_reports() -> Vec<(Vec<(&'static str, &'static str)>, bool)> {
    vec![
        (
            vec![("x-ratelimit-limit", "100"), ("x-ratelimit-remaining", "5")],
            true,
        ),
        (
            vec![
                ("ratelimit-policy", "\"hourly\";q=100;w=3600"),
                ("ratelimit", "\"hourly\";r=5;t=600"),
            ],
            true,
        ),
        // Another limit, another window: another policy of the upstream's.
        (
            vec![("x-ratelimit-limit", "50"), ("x-ratelimit-remaining", "5")],
            false,
        ),
        (
            vec![
                ("ratelimit-policy", "\"burst\";q=100;w=1"),
                ("ratelimit", "\"burst\";r=5;t=1"),
            ],
            false,
        ),
    ]
}

#[tokio::test(start_paused = true)]
async fn a_remaining_count_corrects_the_policy_in_memory() {
    for (report, corrects) in remaining_reports() {
        let clock = TokioClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let layer = || egress_with(store.clone(), &clock, hundred_an_hour(), ms(100));
        a_remaining_count_corrects_the_policy(&layer(), &layer(), &report, corrects).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remaining_count_corrects_the_policy_on_redis() {
    let server = RedisServer::start();
    for (i, (report, corrects)) in remaining_reports().into_iter().enumerate() {
        let clock = TokioClock::new();
        let prefix = format!("corrected{i}:");
        let layer = async || {
            egress_with(
                redis(&server.url(), &prefix, &clock).await,
                &clock,
                hundred_an_hour(),
                ms(100),
            )
        };
        let (a, b) = (layer().await, layer().await);
        a_remaining_count_corrects_the_policy(&a, &b, &report, corrects).await;
        support::assert_no_key_without_ttl(&server, &prefix);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remaining_count_corrects_the_policy_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let clock = TokioClock::new();
    let layer = async || {
        egress_with(
            redis(&cluster.url(), "corrected:", &clock).await,
            &clock,
            hundred_an_hour(),
            ms(100),
        )
    };
    let (a, b) = (layer().await, layer().await);
    let (report, _) = remaining_reports().remove(0);
    a_remaining_count_corrects_the_policy(&a, &b, &report, true).await;
}

/// The key of the partner's calls.
fn partner_key() -> Key {
    Key::from("api.partner.example:443")
}

/// An egress layer on `store` with `partner()` (10 a second after `ten()`) and an adaptive
/// rate raising every second.
fn adaptive<St: Store>(store: St, clock: &TokioClock) -> EgressLayer<St> {
    EgressLayer::builder()
        .store(store)
        .clock(clock.clone())
        .policy(Policy::gcra("10/s").name("partner"))
        .max_wait(ms(2000))
        .adaptive(AdaptiveRate::new().raise_every(ms(1000)))
        .build()
        .expect("a valid egress layer")
}

/// The partner's limit for its key, as `layer` decides now.
async fn limit_of<St: Store>(layer: &EgressLayer<St>) -> u64 {
    let decision = layer.limits().control().peek(&partner_key()).await.unwrap();
    decision.outcomes()[0].limit()
}

/// Two calls at once through `a`, both refused with a bare `429`, halve the partner's limit
/// once, for `b` too; the next answer raises it a tenth of the configured limit only once a
/// second has passed.
async fn a_bare_refusal_lowers_the_limit<St: Store>(a: &EgressLayer<St>, b: &EgressLayer<St>) {
    let mut upstream = Upstream::answering_first(StatusCode::TOO_MANY_REQUESTS, &[]);
    upstream.times = 2;
    // Both admitted under the configured limit: the first is answered after the second.
    upstream.slow_first = ms(50);
    let (one, two) = tokio::join!(send(a, &upstream), send(a, &upstream));
    assert_eq!(
        (one, two),
        (
            Ok(StatusCode::TOO_MANY_REQUESTS),
            Ok(StatusCode::TOO_MANY_REQUESTS)
        )
    );
    assert_eq!(limit_of(b).await, 5);
    // An answer at once does not raise it.
    assert_eq!(send(b, &upstream).await, Ok(StatusCode::OK));
    assert_eq!(limit_of(a).await, 5);
    tokio::time::sleep(ms(1100)).await;
    assert_eq!(send(b, &upstream).await, Ok(StatusCode::OK));
    assert_eq!(limit_of(a).await, 6);
    // Nor the next, within the second.
    assert_eq!(send(a, &upstream).await, Ok(StatusCode::OK));
    assert_eq!(limit_of(b).await, 6);
}

#[tokio::test(start_paused = true)]
async fn a_bare_refusal_lowers_the_limit_and_answers_raise_it_back_in_memory() {
    let clock = TokioClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let (a, b) = (adaptive(store.clone(), &clock), adaptive(store, &clock));
    a_bare_refusal_lowers_the_limit(&a, &b).await;
    // A second at a time, back to the configured limit: no limit of its own.
    let upstream = Upstream::default();
    for limit in 7..=10 {
        tokio::time::sleep(ms(1100)).await;
        assert_eq!(send(&a, &upstream).await, Ok(StatusCode::OK));
        assert_eq!(limit_of(&b).await, limit);
    }
    tokio::time::sleep(ms(1100)).await;
    assert_eq!(send(&a, &upstream).await, Ok(StatusCode::OK));
    assert_eq!(limit_of(&b).await, 10);
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_limit_never_goes_below_its_floor() {
    let clock = TokioClock::new();
    let layer = adaptive(MemoryStore::with_clock(clock.clone()), &clock);
    let mut upstream = Upstream::answering_first(StatusCode::TOO_MANY_REQUESTS, &[]);
    upstream.times = 10;
    for expected in [5, 2, 1, 1] {
        assert_eq!(
            send(&layer, &upstream).await,
            Ok(StatusCode::TOO_MANY_REQUESTS)
        );
        assert_eq!(limit_of(&layer).await, expected);
        tokio::time::sleep(ms(1100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_lowered_limit_is_forgotten_after_a_while_without_news() {
    let clock = TokioClock::new();
    let layer = EgressLayer::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .clock(clock.clone())
        .policy(Policy::gcra("10/s").name("partner"))
        .adaptive(AdaptiveRate::new().forget_after(ms(30_000)))
        .build()
        .unwrap();
    let upstream = Upstream::answering_first(StatusCode::TOO_MANY_REQUESTS, &[]);
    assert_eq!(
        send(&layer, &upstream).await,
        Ok(StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(limit_of(&layer).await, 5);
    tokio::time::sleep(ms(29_000)).await;
    assert_eq!(limit_of(&layer).await, 5);
    tokio::time::sleep(ms(2_000)).await;
    assert_eq!(limit_of(&layer).await, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_refusal_lowers_the_limit_on_redis() {
    let server = RedisServer::start();
    let clock = TokioClock::new();
    let a = adaptive(redis(&server.url(), "adapt:", &clock).await, &clock);
    let b = adaptive(redis(&server.url(), "adapt:", &clock).await, &clock);
    a_bare_refusal_lowers_the_limit(&a, &b).await;
    support::assert_no_key_without_ttl(&server, "adapt:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_refusal_lowers_the_limit_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let clock = TokioClock::new();
    let a = adaptive(redis(&cluster.url(), "adapt:", &clock).await, &clock);
    let b = adaptive(redis(&cluster.url(), "adapt:", &clock).await, &clock);
    a_bare_refusal_lowers_the_limit(&a, &b).await;
}

#[tokio::test(start_paused = true)]
async fn a_layer_that_does_not_learn_lets_the_next_call_through() {
    let clock = TokioClock::new();
    let layer = EgressLayer::builder()
        .clock(clock.clone())
        .store(MemoryStore::with_clock(clock.clone()))
        .policy(partner())
        .learn_from_upstream(false)
        .build()
        .unwrap();
    let upstream =
        Upstream::answering_first(StatusCode::TOO_MANY_REQUESTS, &[("retry-after", "60")]);
    assert_eq!(
        send(&layer, &upstream).await,
        Ok(StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(send(&layer, &upstream).await, Ok(StatusCode::OK));
}

#[tokio::test(start_paused = true)]
async fn a_call_that_names_no_upstream_is_not_sent() {
    let clock = TokioClock::new();
    let layer = egress(MemoryStore::with_clock(clock.clone()), &clock, ms(1000));
    let upstream = Upstream::default();
    let relative = Request::get("/v1/orders").body(String::new()).unwrap();
    let got = layer.layer(upstream.service()).oneshot(relative).await;
    let Err(EgressError::GaveUp(gave_up)) = got else {
        panic!("{got:?}")
    };
    assert_eq!(gave_up.reason(), Reason::KeyRejected);
    assert_eq!(upstream.calls(), 0);
    assert!(gave_up.to_string().contains("no key"), "{gave_up}");
}

#[test]
fn absurd_waits_and_pauses_fail_the_build() {
    let build = |b: tower_ratelimit::egress::EgressLayerBuilder| {
        b.policy(partner())
            .build()
            .expect_err("refused")
            .to_string()
    };
    assert!(build(EgressLayer::builder().max_wait(Duration::ZERO)).contains("max_wait"));
    let day = Duration::from_secs(86_400);
    assert!(build(EgressLayer::builder().max_wait(day)).contains("max_wait"));
    assert!(build(EgressLayer::builder().max_pause(Duration::ZERO)).contains("max_pause"));
    let adapt = |rate: AdaptiveRate| build(EgressLayer::builder().adaptive(rate));
    assert!(adapt(AdaptiveRate::new().decrease(1.0)).contains("decrease"));
    assert!(adapt(AdaptiveRate::new().decrease(f64::NAN)).contains("decrease"));
    assert!(adapt(AdaptiveRate::new().increase(0.0)).contains("increase"));
    assert!(adapt(AdaptiveRate::new().floor(1.5)).contains("floor"));
    assert!(adapt(AdaptiveRate::new().raise_every(Duration::ZERO)).contains("raise_every"));
    let blind = EgressLayer::builder().learn_from_upstream(false);
    assert!(build(blind.adaptive(AdaptiveRate::new())).contains("learn_from_upstream"));
    let none = EgressLayer::builder().build().expect_err("no policy");
    assert!(!none.to_string().is_empty());
    // A policy that takes leases cannot wait: it keeps refusing at once, and builds.
    let leased = EgressLayer::builder()
        .policy(Policy::gcra("100/s").lease(10))
        .build();
    assert!(leased.is_ok(), "{leased:?}");
}

/// A call of `method` through a [`RetryLayer`] made of `retry` (outside an egress layer) to an
/// upstream that answers the first call with `first`: its status, and when each call reached
/// the upstream after the first.
async fn retried(
    retry: RetryLayer,
    method: http::Method,
    first: (StatusCode, &[(&'static str, &str)]),
) -> (StatusCode, Vec<Duration>) {
    let clock = TokioClock::new();
    let layer = egress(MemoryStore::with_clock(clock.clone()), &clock, ms(5000));
    let upstream = Upstream::answering_first(first.0, first.1);
    let client = retry.layer(layer.layer(upstream.service()));
    let call = Request::builder()
        .method(method)
        .uri("https://api.partner.example/v1/orders/7")
        .body(String::new())
        .unwrap();
    let status = client.oneshot(call).await.expect("answered").status();
    let calls = upstream.calls.lock().unwrap().clone();
    (status, calls.iter().map(|t| *t - calls[0]).collect())
}

const REFUSED: (StatusCode, &[(&str, &str)]) =
    (StatusCode::TOO_MANY_REQUESTS, &[("retry-after", "1")]);

#[tokio::test(start_paused = true)]
async fn an_idempotent_call_refused_is_sent_again_at_the_named_time() {
    for method in [http::Method::GET, http::Method::PUT, http::Method::DELETE] {
        let retry = RetryLayer::new(RetryBudget::default());
        let (status, calls) = retried(retry, method.clone(), REFUSED).await;
        assert_eq!(status, StatusCode::OK, "{method}");
        assert_eq!(calls.len(), 2, "{method}");
        assert!(
            calls[1] >= ms(1000),
            "{method}: sent again at {:?}",
            calls[1]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_that_is_not_idempotent_is_never_sent_again_unless_asked() {
    let retry = RetryLayer::new(RetryBudget::default());
    for method in [http::Method::POST, http::Method::PATCH] {
        let (status, calls) = retried(retry.clone(), method.clone(), REFUSED).await;
        assert_eq!(
            (status, calls.len()),
            (StatusCode::TOO_MANY_REQUESTS, 1),
            "{method}"
        );
    }
    let asked = retry.non_idempotent(true);
    let (status, calls) = retried(asked, http::Method::POST, REFUSED).await;
    assert_eq!((status, calls.len()), (StatusCode::OK, 2));
}

#[tokio::test(start_paused = true)]
async fn retries_stay_within_their_budget_and_the_named_time() {
    // No retry earned: the refusal is the answer.
    let spent = RetryLayer::new(RetryBudget::new(0.0, 0));
    let (status, calls) = retried(spent, http::Method::GET, REFUSED).await;
    assert_eq!((status, calls.len()), (StatusCode::TOO_MANY_REQUESTS, 1));
    // A refusal that names no time, or one past the longest wait, is not retried.
    let retry = RetryLayer::new(RetryBudget::default());
    let unnamed = (StatusCode::TOO_MANY_REQUESTS, &[][..]);
    let (status, calls) = retried(retry.clone(), http::Method::GET, unnamed).await;
    assert_eq!((status, calls.len()), (StatusCode::TOO_MANY_REQUESTS, 1));
    let short = retry.longest_wait(ms(500));
    let (status, calls) = retried(short, http::Method::GET, REFUSED).await;
    assert_eq!((status, calls.len()), (StatusCode::TOO_MANY_REQUESTS, 1));
    // A budget of one retry a second and none from calls: the second refusal in that second
    // is not retried.
    let one = RetryLayer::new(RetryBudget::new(0.0, 1));
    let (status, calls) = retried(one.clone(), http::Method::GET, REFUSED).await;
    assert_eq!((status, calls.len()), (StatusCode::OK, 2));
    let (status, calls) = retried(one, http::Method::GET, REFUSED).await;
    assert_eq!((status, calls.len()), (StatusCode::TOO_MANY_REQUESTS, 1));
}

#[tokio::test(start_paused = true)]
async fn capacity_is_kept_for_critical_calls() {
    use tower_ratelimit::policy::Reserve;
    let clock = TokioClock::new();
    let reserve = Reserve::header("x-priority")
        .share("critical", 100)
        .others(50);
    let layer = EgressLayer::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .clock(clock.clone())
        .policy(Policy::gcra("10/min").name("partner").reserve(reserve))
        .build()
        .unwrap();
    let upstream = Upstream::default();
    let client = layer.layer(upstream.service());
    let call = |priority: Option<&str>| {
        let mut call = Request::get("https://api.partner.example/v1/rates");
        if let Some(p) = priority {
            call = call.header("x-priority", p);
        }
        call.body(String::new()).unwrap()
    };
    for _ in 0..5 {
        assert!(client.clone().oneshot(call(None)).await.is_ok());
    }
    // The others' half is used: theirs give up at once, the critical ones go on.
    let refused = client
        .clone()
        .oneshot(call(None))
        .await
        .expect_err("past the share");
    assert_eq!(refused.gave_up().map(GaveUp::reason), Some(Reason::Limited));
    for _ in 0..5 {
        assert!(client.clone().oneshot(call(Some("critical"))).await.is_ok());
    }
    assert!(
        client
            .clone()
            .oneshot(call(Some("critical")))
            .await
            .is_err()
    );
    assert_eq!(upstream.calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_call_is_settled_at_what_its_response_says_it_used() {
    use tower_ratelimit::key::Key;
    use tower_ratelimit::settle::Settle;
    let clock = TokioClock::new();
    let tokens = Policy::token_bucket("100/min")
        .name("tokens")
        .cost(|_: &tower_ratelimit::key::RequestRef<'_>| 40)
        .settle(Settle::header("x-tokens-used"));
    let layer = EgressLayer::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .clock(clock.clone())
        .policy(tokens)
        .build()
        .unwrap();
    let upstream = Upstream::answering_first(StatusCode::OK, &[("x-tokens-used", "5")]);
    let response = layer
        .layer(upstream.service())
        .oneshot(call())
        .await
        .unwrap();
    drop(response);
    let key = Key::from("api.partner.example:443");
    let eventually_settled = async {
        loop {
            let left = layer
                .limits()
                .control()
                .peek(&key)
                .await
                .unwrap()
                .tightest()
                .remaining();
            if left == 95 {
                return;
            }
            tokio::time::sleep(ms(1)).await;
        }
    };
    tokio::time::timeout(ms(1000), eventually_settled)
        .await
        .expect("settled at 5 of 40");
}
