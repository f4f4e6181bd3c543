//! Concurrency limits (`Policy::concurrency`): at most `n` requests of a key in flight, each
//! holding its slot until its response body ends or is dropped. On the memory store and on a
//! real redis-server (two instances sharing one count; slots of a vanished instance freed
//! after `max_duration`, on an injected clock). The demo server's `kill -9` test is in
//! `server_e2e.rs`.

mod support;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use support::http::send;
use support::{RedisServer, eventually};
use tokio::sync::{Semaphore, mpsc};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_ratelimit::headers::{HeaderStyle, RATELIMIT, RATELIMIT_POLICY};
use tower_ratelimit::key::{GlobalKey, Key};
use tower_ratelimit::{ManualClock, MemoryStore, Policy, RateLimitLayer, Store};

fn layer<St: Store>(store: St, policies: &[Policy], clock: &ManualClock) -> RateLimitLayer<St> {
    policies
        .iter()
        .fold(RateLimitLayer::builder(), |b, p| b.policy(p.clone()))
        .key(GlobalKey)
        .store(store)
        .clock(clock.clone())
        .headers(HeaderStyle::Both)
        .build()
        .unwrap()
}

/// A handler that counts the requests that reached it and answers each once the gate lets
/// one through (any of those waiting).
#[derive(Clone)]
struct Gate {
    entered: Arc<AtomicUsize>,
    open: Arc<Semaphore>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            entered: Arc::default(),
            open: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Gate {
    fn service(
        &self,
    ) -> impl Service<
        Request<()>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static {
        let gate = self.clone();
        service_fn(move |_: Request<()>| {
            let gate = gate.clone();
            async move {
                gate.entered.fetch_add(1, Ordering::SeqCst);
                gate.open.acquire().await.unwrap().forget();
                Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        })
    }

    async fn until_entered(&self, n: usize) {
        let in_flight = async || self.entered.load(Ordering::SeqCst) >= n;
        eventually(&format!("{n} requests are in flight"), in_flight).await;
    }
}

/// Slots free for the global key, as a look (cost 0) sees them.
async fn free<St: Store>(l: &RateLimitLayer<St>, policy: &str) -> u64 {
    let d = l.check(&Key::global(), 0).await.unwrap();
    d.outcomes()
        .iter()
        .find(|o| o.policy() == policy)
        .unwrap()
        .remaining()
}

async fn until_free<St: Store>(l: &RateLimitLayer<St>, policy: &str, n: u64) {
    eventually(&format!("{n} slots are free"), async || {
        free(l, policy).await == n
    })
    .await;
}

/// Two requests in flight fill a limit of two; a third is rejected at once, with no
/// `Retry-After`, and the IETF item of a concurrency limit; once one in flight has answered
/// (its body read to the end), its slot is free for the next.
async fn in_flight_requests_hold_their_slots<St: Store>(store: St, clock: ManualClock) {
    let l = layer(store, &[Policy::concurrency(2).name("conc")], &clock);
    let gate = Gate::default();
    let svc = l.clone().layer(gate.service());
    let spawn = || {
        let svc = svc.clone();
        tokio::spawn(async move { send(&svc, Request::new(())).await })
    };
    let first = spawn();
    let second = spawn();
    gate.until_entered(2).await;
    assert_eq!(free(&l, "conc").await, 0);

    let limited = send(&svc, Request::new(())).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        limited.header(http::header::RETRY_AFTER),
        None,
        "no time is known"
    );
    assert_eq!(limited.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(limited.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        limited.header(RATELIMIT_POLICY),
        Some(r#""conc";q=2;qu="concurrent-requests""#)
    );
    assert_eq!(limited.header(RATELIMIT), Some(r#""conc";r=0"#));
    assert!(
        limited.body.contains(r#""retry_after":null"#),
        "{}",
        limited.body
    );
    assert_eq!(
        gate.entered.load(Ordering::SeqCst),
        2,
        "never reached the handler"
    );

    // One of the two answers; its slot is free for the next.
    gate.open.add_permits(1);
    until_free(&l, "conc", 1).await;
    let third = spawn();
    gate.until_entered(3).await;
    assert_eq!(free(&l, "conc").await, 0);
    gate.open.add_permits(2);
    for r in [first, second, third] {
        assert_eq!(r.await.unwrap().status, StatusCode::OK);
    }
    until_free(&l, "conc", 2).await;
}

/// A streamed body holds its slot until its last frame; a body dropped unread gives it back;
/// a request dropped in flight (its client went away) too.
async fn streamed_and_dropped_bodies<St: Store>(store: St, clock: ManualClock) {
    let l = layer(store, &[Policy::concurrency(1).name("stream")], &clock);
    let (senders_tx, mut senders) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let svc = l.clone().layer(service_fn(move |_: Request<()>| {
        let (tx, rx) = mpsc::channel(4);
        senders_tx.send(tx).unwrap();
        async move { Ok::<_, Infallible>(Response::new(ChannelBody(rx))) }
    }));
    // The headers arrive; the body streams on.
    let response = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let tx = senders.recv().await.unwrap();
    let mut body = response.into_body();
    tx.send(Bytes::from_static(b"part 1")).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part 1");
    assert_eq!(free(&l, "stream").await, 0, "held while the body streams");
    let blocked = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    // The last frame: the body ends, and the slot is free.
    tx.send(Bytes::from_static(b"part 2")).await.unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "part 2");
    until_free(&l, "stream", 1).await;

    // A body dropped before its end gives the slot back.
    let response = svc.clone().oneshot(Request::new(())).await.unwrap();
    let _tx = senders.recv().await.unwrap();
    assert_eq!(free(&l, "stream").await, 0);
    drop(response);
    until_free(&l, "stream", 1).await;

    // A request dropped while the handler runs gives its slot back.
    let gate = Gate::default();
    let svc = l.clone().layer(gate.service());
    let in_flight = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, Request::new(())).await }
    });
    gate.until_entered(1).await;
    assert_eq!(free(&l, "stream").await, 0);
    in_flight.abort();
    assert!(in_flight.await.unwrap_err().is_cancelled());
    until_free(&l, "stream", 1).await;
}

/// With a rate policy: no slot is taken when the rate policy rejects, and no rate unit is
/// charged when no slot is free.
async fn combined_with_a_rate_policy_atomically<St: Store>(store: St, clock: ManualClock) {
    let conc = Policy::concurrency(1).name("one-at-a-time");
    let rate = Policy::fixed_window("2/h").name("hourly");
    let l = layer(store, &[conc, rate], &clock);
    let gate = Gate::default();
    let svc = l.clone().layer(gate.service());
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, Request::new(())).await }
    });
    gate.until_entered(1).await;
    assert_eq!(free(&l, "hourly").await, 1);
    // No slot free: rejected by the concurrency limit alone, the hourly unit not charged.
    let r = send(&svc, Request::new(())).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let d = r.decision.as_ref().unwrap();
    let violated: Vec<&str> = d.violated().map(|o| o.policy()).collect();
    assert_eq!(violated, ["one-at-a-time"]);
    assert_eq!(free(&l, "hourly").await, 1, "no rate unit charged");
    gate.open.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    until_free(&l, "one-at-a-time", 1).await;

    // The second hourly unit, then the hourly limit rejects: no slot is taken.
    gate.open.add_permits(1);
    assert_eq!(send(&svc, Request::new(())).await.status, StatusCode::OK);
    until_free(&l, "one-at-a-time", 1).await;
    let r = send(&svc, Request::new(())).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let d = r.decision.as_ref().unwrap();
    let violated: Vec<&str> = d.violated().map(|o| o.policy()).collect();
    assert_eq!(violated, ["hourly"]);
    assert_eq!(free(&l, "one-at-a-time").await, 1, "no slot taken");
}

/// An instance that vanishes with slots held (its requests never end: the futures are leaked,
/// as a `kill -9` leaves them) keeps them until `max_duration`, then they are free.
async fn vanished_slots_free_after_max_duration<St: Store>(store: St, clock: ManualClock) {
    let policy = Policy::concurrency(2)
        .name("leaky-instance")
        .max_duration(Duration::from_secs(30));
    let l = layer(store, &[policy], &clock);
    let gate = Gate::default();
    let svc = l.clone().layer(gate.service());
    for _ in 0..2 {
        let mut future = Box::pin(svc.clone().oneshot(Request::new(())));
        // Polled until the handler runs, then forgotten: never ended, never dropped.
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let started = std::time::Instant::now();
        let before = gate.entered.load(Ordering::SeqCst);
        while gate.entered.load(Ordering::SeqCst) == before {
            assert!(future.as_mut().poll(&mut cx).is_pending());
            assert!(started.elapsed() < Duration::from_secs(10));
            tokio::task::yield_now().await;
        }
        std::mem::forget(future);
    }
    assert_eq!(free(&l, "leaky-instance").await, 0);
    clock.advance(Duration::from_secs(29));
    let r = send(&svc, Request::new(())).await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "still held at 29 s"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(free(&l, "leaky-instance").await, 2, "free at max_duration");
}

macro_rules! on_each_store {
    ($($test:ident,)*) => {
        mod in_memory {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let clock = ManualClock::new();
                    let run = super::$test(MemoryStore::with_clock(clock.clone()), clock);
                    tokio::time::timeout(Duration::from_secs(60), run).await.expect("done in a minute");
                }
            )*
        }

        mod on_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let server = RedisServer::start();
                    let clock = ManualClock::new();
                    let run = super::$test(server.store("conc:", &clock).await, clock);
                    tokio::time::timeout(Duration::from_secs(60), run).await.expect("done in a minute");
                    support::assert_no_key_without_ttl(&server, "conc:");
                }
            )*
        }
    };
}

on_each_store! {
    in_flight_requests_hold_their_slots,
    streamed_and_dropped_bodies,
    combined_with_a_rate_policy_atomically,
    vanished_slots_free_after_max_duration,
}

/// Two instances, each with its own connection to one Redis, share one count of requests in
/// flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_one_count() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let policy = [Policy::concurrency(2).name("shared")];
    let a = layer(server.store("conc:", &clock).await, &policy, &clock);
    let b = layer(server.store("conc:", &clock).await, &policy, &clock);
    let gate = Gate::default();
    let (sa, sb) = (
        a.clone().layer(gate.service()),
        b.clone().layer(gate.service()),
    );
    let on_a = tokio::spawn({
        let sa = sa.clone();
        async move { send(&sa, Request::new(())).await }
    });
    let on_b = tokio::spawn({
        let sb = sb.clone();
        async move { send(&sb, Request::new(())).await }
    });
    gate.until_entered(2).await;
    assert_eq!(
        send(&sa, Request::new(())).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&sb, Request::new(())).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    gate.open.add_permits(1);
    gate.open.add_permits(1);
    assert_eq!(on_a.await.unwrap().status, StatusCode::OK);
    assert_eq!(on_b.await.unwrap().status, StatusCode::OK);
    until_free(&a, "shared", 2).await;
    support::assert_no_key_without_ttl(&server, "conc:");
}

/// A client sending its requests one after the other never finds its previous request's slot
/// still taken: the slot's release is queued on the instance's connection to Redis before the
/// response ends, ahead of the next request's decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_requests_never_see_their_own_previous_slot() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let l = layer(
        server.store("conc:", &clock).await,
        &[Policy::concurrency(1).name("one")],
        &clock,
    );
    let svc = l.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    for i in 0..200 {
        let r = send(&svc, Request::new(())).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}");
    }
}

/// A request whose client goes away while Redis decides (Redis paused with `CLIENT PAUSE`, so
/// the decision is still on its way when the request is dropped) does not keep the slot the
/// decision takes: the decision finishes on its own and the slot is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_redis_decides_gives_its_slot_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let l = layer(
        server.store("conc:", &clock).await,
        &[Policy::concurrency(1).name("abandoned")],
        &clock,
    );
    let gate = Gate::default();
    let svc = l.clone().layer(gate.service());
    assert_eq!(free(&l, "abandoned").await, 1);
    server.cli(&["CLIENT", "PAUSE", "300", "WRITE"]);
    let request = tokio::spawn(async move { send(&svc, Request::new(())).await });
    // Until Redis holds the decision's call, blocked by the pause.
    let started = std::time::Instant::now();
    while !server
        .cli(&["CLIENT", "LIST"])
        .lines()
        .any(|c| c.contains("flags=b ") && c.contains("cmd=fcall"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the call reaches Redis"
        );
        tokio::task::yield_now().await;
    }
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    // Once Redis resumes, the decision takes the slot, and gives it back.
    until_free(&l, "abandoned", 1).await;
    assert_eq!(gate.entered.load(Ordering::SeqCst), 0);
    support::assert_no_key_without_ttl(&server, "conc:");
}

#[test]
fn concurrency_limits_that_cannot_work_fail_the_build() {
    let second = Duration::from_secs(1);
    for (policy, says) in [
        (Policy::concurrency(0), "zero"),
        (Policy::concurrency(2).shadow(), "shadow"),
        (Policy::concurrency(2).wait_up_to(second), "wait_up_to"),
        (Policy::concurrency(2).lease(1), "lease"),
        (
            Policy::concurrency(2).refund_if(|s| s.is_server_error()),
            "refund_if",
        ),
        (Policy::concurrency(2).max_duration(Duration::ZERO), "zero"),
        (Policy::gcra("1/s").max_duration(second), "concurrency"),
    ] {
        let error = support::build_error(policy);
        assert!(error.contains(says), "{error:?} should say {says:?}");
    }
    // The default name says what it is.
    let l = RateLimitLayer::builder()
        .policy(Policy::concurrency(3))
        .build()
        .unwrap();
    assert_eq!(l.policy_names(), ["concurrency:3"]);
}

/// A body streamed from a channel: a frame per message, the end when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|m| m.map(|b| Ok(Frame::data(b))))
    }
}
