//! Adaptive concurrency (`Policy::adaptive_concurrency`): in front of a backend whose latency
//! grows with its load (it serves a few requests at a time, the rest queue), the limit settles
//! near the backend's capacity and grows again when the backend speeds up; over the limit a
//! request is shed (`503`, `temporary-reduced-capacity`) or waits in the queue; AIMD halves on
//! errors. Time is tokio's paused clock, which the layer's clock reads too: the runs are
//! simulations of minutes, made in a moment and the same every time.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_ratelimit::{Clock, Policy, RateLimitLayer, body::ResponseBody, policy::Adaptive};

/// The layer's clock: tokio's, which a paused runtime moves only when every task waits.
#[derive(Debug)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        1_000_000 + self.0.elapsed().as_micros() as u64
    }
}

type App = BoxCloneSyncService<Request<()>, Response<ResponseBody<Full<Bytes>>>, Infallible>;

/// `policy` in front of a backend serving `backend`'s permits at once, each request taking
/// `service` (answered `status`).
fn app(policy: Policy, backend: &Arc<Semaphore>, service: Duration, status: StatusCode) -> App {
    let layer = RateLimitLayer::builder()
        .policy(policy)
        .clock(TokioClock(Instant::now()))
        .build()
        .unwrap();
    let backend = backend.clone();
    BoxCloneSyncService::new(layer.layer(service_fn(move |_: Request<()>| {
        let backend = backend.clone();
        async move {
            let _turn = backend.acquire().await.unwrap();
            tokio::time::sleep(service).await;
            let mut response = Response::new(Full::new(Bytes::from_static(b"done")));
            *response.status_mut() = status;
            Ok::<_, Infallible>(response)
        }
    })))
}

/// What the clients saw: when each admitted request ended and how long it took, and the
/// requests shed.
#[derive(Default)]
struct Seen {
    admitted: Vec<(Instant, Duration)>,
    shed: usize,
}

impl Seen {
    /// Admitted requests a second, and the 99th percentile of their latency, of those that
    /// ended after `since`.
    fn since(&self, since: Instant, until: Instant) -> (f64, Duration) {
        let mut took: Vec<Duration> = (self.admitted.iter())
            .filter(|(at, _)| *at > since)
            .map(|(_, took)| *took)
            .collect();
        took.sort();
        let p99 = took[took.len() * 99 / 100];
        (took.len() as f64 / (until - since).as_secs_f64(), p99)
    }
}

/// `clients` tasks sending one request after another for `run`; a shed one tries again 5 ms
/// later.
async fn clients(app: &App, clients: usize, run: Duration, seen: &Arc<Mutex<Seen>>) {
    let until = Instant::now() + run;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (app, seen) = (app.clone(), seen.clone());
        tasks.spawn(async move {
            while Instant::now() < until {
                let started = Instant::now();
                let response = app.clone().oneshot(Request::new(())).await.unwrap();
                let status = response.status();
                // Its body dropped: the request ends, and gives its place back.
                drop(response);
                match status {
                    StatusCode::OK => {
                        let mut seen = seen.lock().unwrap();
                        seen.admitted.push((Instant::now(), started.elapsed()));
                    }
                    StatusCode::SERVICE_UNAVAILABLE => {
                        seen.lock().unwrap().shed += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    other => panic!("{other}"),
                }
            }
        });
    }
    tasks.join_all().await;
}

#[tokio::test(start_paused = true)]
async fn gradient2_settles_near_the_backends_capacity_and_grows_when_it_speeds_up() {
    // 8 at a time, 20 ms each: 400 a second at most, 20 ms unloaded.
    let backend = Arc::new(Semaphore::new(8));
    let service = Duration::from_millis(20);
    let policy = Policy::adaptive_concurrency(Adaptive::gradient2()).name("work");
    let app = app(policy, &backend, service, StatusCode::OK);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let start = Instant::now();
    clients(&app, 64, Duration::from_secs(60), &seen).await;
    let (rate, p99) = seen
        .lock()
        .unwrap()
        .since(start + Duration::from_secs(40), Instant::now());
    eprintln!("8 at a time: {rate:.0}/s, p99 {p99:?}");
    assert!(
        rate >= 0.85 * 400.0,
        "at least 85% of the capacity: {rate:.0}/s"
    );
    assert!(
        p99 <= 3 * service,
        "p99 at most 3x the unloaded latency: {p99:?}"
    );
    assert!(
        seen.lock().unwrap().shed > 0,
        "64 clients are more than it takes"
    );
    // The backend serves 32 at a time now: 1,600 a second.
    backend.add_permits(24);
    let faster = Instant::now();
    clients(&app, 64, Duration::from_secs(60), &seen).await;
    let (rate, p99) = seen
        .lock()
        .unwrap()
        .since(faster + Duration::from_secs(40), Instant::now());
    eprintln!("32 at a time: {rate:.0}/s, p99 {p99:?}");
    assert!(
        rate >= 2.0 * 400.0,
        "the limit grew with the backend: {rate:.0}/s"
    );
    assert!(p99 <= 3 * service, "{p99:?}");
}

/// A request over the limit is shed at once: `503`, the problem type
/// `temporary-reduced-capacity`, `Retry-After: 1`, naming the policy.
#[tokio::test(start_paused = true)]
async fn a_request_over_the_limit_is_shed_at_once() {
    let backend = Arc::new(Semaphore::new(0));
    let adaptive = Adaptive::gradient2().min(1).max(1);
    let policy = Policy::adaptive_concurrency(adaptive).name("work");
    let app = app(policy, &backend, Duration::ZERO, StatusCode::OK);
    // The first holds the one place (the backend never serves it).
    let first = tokio::spawn(app.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    let started = Instant::now();
    let reply = support::http::send(&app, Request::new(())).await;
    assert_eq!(started.elapsed(), Duration::ZERO, "shed without waiting");
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert!(
        reply.body.contains("temporary-reduced-capacity"),
        "{}",
        reply.body
    );
    assert!(
        reply.body.contains("limit of work is reached"),
        "{}",
        reply.body
    );
    first.abort();
}

/// With a queue, a request over the limit waits for a place: admitted when one ends within
/// its wait, shed when none does, and shed at once when the queue is full.
#[tokio::test(start_paused = true)]
async fn a_queue_holds_requests_until_a_place_frees_or_their_wait_ends() {
    let backend = Arc::new(Semaphore::new(1));
    let adaptive = Adaptive::gradient2()
        .min(1)
        .max(1)
        .queue(1, Duration::from_millis(50));
    let policy = Policy::adaptive_concurrency(adaptive).name("work");
    let app = app(policy, &backend, Duration::from_millis(30), StatusCode::OK);
    let send = |app: &App| {
        let app = app.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let status = app.oneshot(Request::new(())).await.unwrap().status();
            (status, started.elapsed())
        })
    };
    let first = send(&app);
    tokio::task::yield_now().await;
    let queued = send(&app);
    tokio::task::yield_now().await;
    let full = send(&app);
    assert_eq!(
        full.await.unwrap(),
        (StatusCode::SERVICE_UNAVAILABLE, Duration::ZERO)
    );
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    // Its place came after 30 ms, within its 50: admitted, and served 30 ms more.
    assert_eq!(
        queued.await.unwrap(),
        (StatusCode::OK, Duration::from_millis(60))
    );
    // Now a request holds the place for 100 ms: the next one's wait ends first.
    let slow = app_slow(&backend);
    let holder = send(&slow);
    tokio::task::yield_now().await;
    let waited = send(&slow).await.unwrap();
    assert_eq!(
        waited,
        (StatusCode::SERVICE_UNAVAILABLE, Duration::from_millis(50))
    );
    assert_eq!(holder.await.unwrap().0, StatusCode::OK);
}

/// A request that goes away while it waits in the queue leaves it: the next one may wait.
#[tokio::test(start_paused = true)]
async fn a_request_gone_from_the_queue_leaves_room_in_it() {
    let backend = Arc::new(Semaphore::new(1));
    let slow = app_slow(&backend);
    let holder = tokio::spawn(slow.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    let gone = tokio::spawn(slow.clone().oneshot(Request::new(())));
    tokio::task::yield_now().await;
    gone.abort();
    let _ = gone.await;
    let started = Instant::now();
    let status = slow
        .clone()
        .oneshot(Request::new(()))
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(50),
        "it waited in the queue"
    );
    assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A layer of one place and a queue of one waiting 50 ms, before requests of 100 ms.
fn app_slow(backend: &Arc<Semaphore>) -> App {
    let adaptive = Adaptive::aimd()
        .min(1)
        .max(1)
        .queue(1, Duration::from_millis(50));
    let policy = Policy::adaptive_concurrency(adaptive).name("slow");
    app(policy, backend, Duration::from_millis(100), StatusCode::OK)
}

/// AIMD: each failed response halves the limit, down to its minimum; then a second request
/// in flight is one too many.
#[tokio::test(start_paused = true)]
async fn aimd_halves_the_limit_on_each_error() {
    let backend = Arc::new(Semaphore::new(100));
    let adaptive = Adaptive::aimd().initial(8).min(1).max(8);
    let policy = Policy::adaptive_concurrency(adaptive).name("flaky");
    let failing = app(
        policy,
        &backend,
        Duration::from_millis(10),
        StatusCode::BAD_GATEWAY,
    );
    // 8 at once are all admitted, and fail.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let app = failing.clone();
        tasks.spawn(async move { app.oneshot(Request::new(())).await.unwrap().status() });
    }
    assert!(
        tasks
            .join_all()
            .await
            .iter()
            .all(|s| *s == StatusCode::BAD_GATEWAY)
    );
    // 8 -> 4 -> 2 -> 1: two at once now, and the second is shed.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let app = failing.clone();
        tasks.spawn(async move { app.oneshot(Request::new(())).await.unwrap().status() });
    }
    let mut statuses = tasks.join_all().await;
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::BAD_GATEWAY, StatusCode::SERVICE_UNAVAILABLE]
    );
}

#[test]
fn build_says_what_an_adaptive_limit_cannot_be() {
    let adaptive = || Policy::adaptive_concurrency(Adaptive::gradient2());
    let cases = [
        (adaptive().tier("pro", "10/s"), "takes no tiers"),
        (adaptive().lease(2), "takes no leases"),
        (adaptive().shadow(), "a second way"),
        (adaptive().refund_if(|_| true), "takes no refund_if"),
        (
            Policy::adaptive_concurrency(Adaptive::gradient2().min(0)),
            "1 <= min <= initial <= max",
        ),
        (
            Policy::adaptive_concurrency(Adaptive::aimd().min(10).max(5)),
            "1 <= min <= initial <= max",
        ),
        (
            Policy::adaptive_concurrency(Adaptive::gradient2().initial(2000)),
            "1 <= min <= initial <= max",
        ),
        (
            Policy::adaptive_concurrency(Adaptive::gradient2().tolerance(0.5)),
            "tolerance",
        ),
        (
            Policy::adaptive_concurrency(Adaptive::aimd().backoff(1.5)),
            "backoff",
        ),
        (
            Policy::adaptive_concurrency(Adaptive::aimd().timeout(Duration::ZERO)),
            "timeout",
        ),
        (
            Policy::adaptive_concurrency(Adaptive::aimd().queue(0, Duration::from_secs(1))),
            "at least one request",
        ),
    ];
    for (policy, expected) in cases {
        let err = support::build_error(policy);
        assert!(err.contains(expected), "{expected:?} in {err}");
    }
}
