//! Waiting instead of rejecting (`Policy::wait_up_to`): a request the policy would reject now
//! but admits within the wait books its time in the store and goes on when that time comes.
//!
//! On the memory store everything runs on injected time: a `ManualClock` for the store and
//! tokio's paused clock for the wait. On a real redis-server the store's clock is injected
//! (so the booked times are exact) while the waits run on real time: the few waits that complete
//! are short, and only their lower bound (never before its time) is asserted.

mod support;

use std::sync::Arc;
use std::time::Duration;

use http::{Request, StatusCode};
use support::http::{Seen, inner, send};
use support::{RedisServer, eventually, global_layer as layer};
use tower::Layer;
use tower_ratelimit::key::Key;
use tower_ratelimit::{Algorithm, ManualClock, MemoryStore, Policy, Quota, RateLimitLayer, Store};

/// GCRA at 2 per second (one every 500 ms, two at once), waiting up to one second.
fn smooth() -> Policy {
    Policy::gcra("2/s")
        .name("smooth")
        .wait_up_to(Duration::from_secs(1))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The waits the store gives `n` requests made at one instant, through `layer.check` (the
/// same decision a request gets, without the wait itself); `None` for a rejected one.
async fn waits<St: Store>(layer: &RateLimitLayer<St>, n: usize) -> Vec<Option<Duration>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let d = layer.check(&Key::global(), 1).await.unwrap();
        out.push(d.is_allowed().then(|| d.wait()));
    }
    out
}

/// The time until the key is fully reset, which grows with every time booked.
async fn booked<St: Store>(layer: &RateLimitLayer<St>) -> Duration {
    layer.check(&Key::global(), 0).await.unwrap().outcomes()[0].reset_after()
}

#[tokio::test(start_paused = true)]
async fn a_request_over_the_limit_waits_for_its_slot_then_goes_on() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let seen = Seen::default();
    let svc = layer(store, smooth(), &clock).layer(inner(&seen));
    for _ in 0..2 {
        assert_eq!(send(&svc, Request::new(())).await.status, StatusCode::OK);
    }
    assert_eq!(seen.calls(), 2);

    // The third is admitted for the time 500 ms away: it waits, then goes on.
    let started = tokio::time::Instant::now();
    let third = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, Request::new(())).await }
    });
    tokio::time::sleep(ms(499)).await;
    assert_eq!(seen.calls(), 2, "not called before its time");
    let third = third.await.unwrap();
    assert_eq!(third.status, StatusCode::OK);
    assert_eq!(started.elapsed(), ms(500), "called at its time");
    assert_eq!(seen.calls(), 3);
    let decision = seen.last_decision();
    assert_eq!(
        decision.wait(),
        ms(500),
        "the handler sees how long it waited"
    );
    assert_eq!(decision.outcomes()[0].wait(), ms(500));
    assert_eq!(third.remaining(), Some(0));

    // The store's clock has not moved: the next time is a second away, the one after is
    // further than the wait allows and is rejected at once, with when to come back.
    let fourth = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, Request::new(())).await }
    });
    tokio::task::yield_now().await;
    let fifth = send(&svc, Request::new(())).await;
    assert_eq!(fifth.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(fifth.retry_after(), 2, "1.5 s away, rounded up");
    assert_eq!(fourth.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        started.elapsed(),
        ms(1500),
        "a second after the third went on"
    );
    assert_eq!(seen.calls(), 4);
}

/// Every algorithm books: requests made at one instant get times in order, each within
/// the wait, as many as the algorithm admits by the end of the wait, the rest rejected.
#[tokio::test]
async fn every_algorithm_reserves_slots_in_order_within_its_limit() {
    let quota = Quota::new(2, Duration::from_secs(1)).unwrap();
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let policy = Policy::new(algorithm, quota)
            .name("w")
            .wait_up_to(Duration::from_secs(3));
        let l = layer(store, policy, &clock);
        let got = waits(&l, 12).await;
        let admitted: Vec<Duration> = got.iter().flatten().copied().collect();
        assert!(
            admitted.windows(2).all(|w| w[0] <= w[1]),
            "{algorithm}: first come, first served: {got:?}"
        );
        assert!(
            admitted.iter().all(|w| *w <= Duration::from_secs(3)),
            "{algorithm}: {got:?}"
        );
        assert!(
            got.iter().skip_while(|w| w.is_some()).all(Option::is_none),
            "{algorithm}: once one is rejected, so are the rest: {got:?}"
        );
        // Two now and two per second of the wait (the sliding window's estimate, which
        // weighs its oldest bucket, finds room later).
        let expected = match algorithm {
            Algorithm::SlidingWindow => 6..=8,
            _ => 8..=8,
        };
        assert!(
            expected.contains(&admitted.len()),
            "{algorithm}: {} admitted: {got:?}",
            admitted.len()
        );
        assert_eq!(admitted[..2], [Duration::ZERO; 2], "{algorithm}: {got:?}");
        // At any time, no more went on in the second before it than the limit (the windows),
        // or than the burst plus the refill since the first (the buckets and GCRA).
        for (i, w) in admitted.iter().enumerate() {
            for (j, v) in admitted[..=i].iter().enumerate() {
                let n = (i - j + 1) as u128;
                let bound = match algorithm {
                    Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
                        2 + (*w - *v).as_millis() * 2 / 1000
                    }
                    _ if *w - *v < Duration::from_secs(1) => 2,
                    _ => continue,
                };
                assert!(
                    n <= bound,
                    "{algorithm}: {n} between {v:?} and {w:?}: {got:?}"
                );
            }
        }
    }
}

/// A waiting request whose client goes away gives its units back, and the next request gets
/// its time: the latest of a GCRA key (its TAT moves back), and one in the middle of a fixed
/// window's queue (the requests behind it keep theirs).
#[tokio::test(start_paused = true)]
async fn a_waiting_request_whose_client_goes_away_gives_its_slot_back() {
    let window = Policy::fixed_window("2/s")
        .name("window")
        .wait_up_to(Duration::from_secs(2));
    // (policy, requests kept waiting before the dropped one, the dropped one's wait)
    for (policy, kept, freed) in [(smooth(), 0, ms(500)), (window, 1, ms(1000))] {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let l = layer(store, policy, &clock);
        let seen = Seen::default();
        let svc = l.clone().layer(inner(&seen));
        for _ in 0..2 {
            send(&svc, Request::new(())).await;
        }
        let spawn = || {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, Request::new(())).await })
        };
        let waiting: Vec<_> = (0..kept).map(|_| spawn()).collect();
        let gone = spawn();
        tokio::task::yield_now().await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        let next = l.check(&Key::global(), 1).await.unwrap();
        assert!(next.is_allowed(), "{next:?}");
        assert_eq!(
            next.wait(),
            freed,
            "the freed time, taken by the next request"
        );
        for w in waiting {
            assert_eq!(w.await.unwrap().status, StatusCode::OK);
        }
        assert_eq!(
            seen.calls(),
            2 + kept,
            "the inner service never saw the dropped one"
        );
    }
}

#[test]
fn waits_that_cannot_work_fail_the_build() {
    let wait = Duration::from_secs(1);
    for (policy, says) in [
        (Policy::gcra("1/s").wait_up_to(Duration::ZERO), "between"),
        (
            Policy::gcra("1/s").wait_up_to(Duration::from_secs(7200)),
            "one hour",
        ),
        (Policy::gcra("1/s").shadow().wait_up_to(wait), "shadow"),
        (
            Policy::gcra("1/s")
                .charge_if(|s| s.is_server_error())
                .wait_up_to(wait),
            "charge_if",
        ),
        (Policy::gcra("10/s").lease(5).wait_up_to(wait), "leases"),
    ] {
        let error = support::build_error(policy);
        assert!(error.contains(says), "{error:?} should say {says:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// On a real redis-server
// ---------------------------------------------------------------------------------------------

/// Two instances, each with its own connection to one Redis, queue on one schedule: the
/// times they are given interleave as if one instance had taken them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_one_schedule() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let a = layer(server.store("wait:", &clock).await, smooth(), &clock);
    let b = layer(server.store("wait:", &clock).await, smooth(), &clock);
    let mut got = Vec::new();
    for i in 0..6 {
        let l = if i % 2 == 0 { &a } else { &b };
        got.extend(waits(l, 1).await);
    }
    assert_eq!(
        got,
        [
            Some(ms(0)),
            Some(ms(0)),
            Some(ms(500)),
            Some(ms(1000)),
            None,
            None
        ]
    );
    support::assert_no_key_without_ttl(&server, "wait:");
}

/// Through the service on Redis: a request waits for its time in real time (never less), and
/// one whose client goes away gives its units back, whose time the next request then gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_request_waits_and_a_dropped_one_gives_its_slot_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let l = layer(server.store("wait:", &clock).await, smooth(), &clock);
    let seen = Seen::default();
    let svc = l.clone().layer(inner(&seen));
    for _ in 0..2 {
        assert_eq!(send(&svc, Request::new(())).await.status, StatusCode::OK);
    }
    let started = std::time::Instant::now();
    let third = send(&svc, Request::new(())).await;
    assert_eq!(third.status, StatusCode::OK);
    assert!(started.elapsed() >= ms(500), "{:?}", started.elapsed());
    assert_eq!(seen.last_decision().wait(), ms(500));

    // The next time is a second away: its request is dropped while it waits.
    let before = booked(&l).await;
    drop_one_waiting(&l, before).await;
    assert_eq!(booked(&l).await, before);
    assert_eq!(seen.calls(), 3, "the inner service never saw it");
    let next = l.check(&Key::global(), 1).await.unwrap();
    assert_eq!(
        next.wait(),
        ms(1000),
        "the freed time, taken by the next request"
    );
    support::assert_no_key_without_ttl(&server, "wait:");
}

/// Sends a request through `l` that books a time, and drops it while it waits; returns once
/// the store has its units back (the key's reset moved from `before`, then back from there).
async fn drop_one_waiting<St: Store>(l: &RateLimitLayer<St>, before: Duration) {
    let svc = l.clone().layer(inner(&Seen::default()));
    let gone = tokio::spawn(async move { send(&svc, Request::new(())).await });
    let seen = Arc::new(std::sync::Mutex::new(before));
    eventually("the time is booked", async || {
        let now = booked(l).await;
        *seen.lock().unwrap() = now;
        now != before
    })
    .await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    let seen = *seen.lock().unwrap();
    eventually("the units are given back", async || booked(l).await != seen).await;
}

/// Every algorithm's release (its Lua twin against its Rust kernel): the same requests, one of
/// which is dropped while it waits for its time, leave both stores in the same state, and
/// the next request gets the same time from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_gives_a_slot_back_alike_in_both_stores() {
    let server = RedisServer::start();
    let quota = Quota::new(2, Duration::from_secs(1)).unwrap();
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, quota)
            .name(format!("release-{algorithm}"))
            .wait_up_to(Duration::from_secs(3));
        let clock = ManualClock::new();
        let memory = layer(
            MemoryStore::with_clock(clock.clone()),
            policy.clone(),
            &clock,
        );
        let redis = layer(server.store("wait:", &clock).await, policy, &clock);
        let seen = [probe(&memory).await, probe(&redis).await];
        assert_eq!(seen[0], seen[1], "{algorithm}: memory vs redis");
        let (waits, next) = &seen[0];
        assert_eq!(waits[..2], [Duration::ZERO; 2], "{algorithm}: {waits:?}");
        assert!(
            next.0,
            "{algorithm}: the next request is admitted: {seen:?}"
        );
    }
    support::assert_no_key_without_ttl(&server, "wait:");
}

/// What [`every_algorithm_gives_a_slot_back_alike_in_both_stores`] sees of one store: the
/// waits of four requests at one instant, then, after a fifth booked a time and was dropped,
/// the next request's (admitted, remaining, reset, wait).
type Seen4 = (Vec<Duration>, (bool, u64, Duration, Duration));

async fn probe<St: Store>(l: &RateLimitLayer<St>) -> Seen4 {
    // Four first: the fifth's time is later than any of theirs in every algorithm, so the
    // key's reset shows when it is booked and when it is given back.
    let got = waits(l, 4).await;
    let waits = got.into_iter().map(Option::unwrap_or_default).collect();
    let before = booked(l).await;
    drop_one_waiting(l, before).await;
    let d = l.check(&Key::global(), 1).await.unwrap();
    let o = &d.outcomes()[0];
    (
        waits,
        (d.is_allowed(), o.remaining(), o.reset_after(), d.wait()),
    )
}
