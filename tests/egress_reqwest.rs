//! The egress layer as reqwest-middleware's `Middleware` (`EgressLayer::middleware`): two
//! reqwest clients (two layers on one store: one memory store, two stores of one Redis, two of
//! a cluster) share one budget against a counting upstream on loopback, and an upstream's
//! pause, learned by one, holds both. Real time: the bounds asserted leave room for a loaded
//! machine.

mod support;

use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use support::upstream::{Seen, upstream};
use support::{RedisCluster, RedisServer};
use tower_ratelimit::egress::{EgressLayer, GaveUp, Reason};
use tower_ratelimit::{MemoryStore, Policy, RedisStore, Store};

/// A reqwest client whose calls go through an egress layer on `store` with `policy`.
fn client<St: Store>(store: St, policy: Policy, max_wait: Duration) -> ClientWithMiddleware {
    let layer = EgressLayer::builder()
        .store(store)
        .policy(policy)
        .max_wait(max_wait)
        .build()
        .expect("a valid egress layer");
    ClientBuilder::new(reqwest::Client::new())
        .with(layer.middleware())
        .build()
}

/// A store of the Redis (or cluster) at `url`, with keys under `prefix`.
async fn redis(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .build()
        .await
        .expect("connect to the test Redis")
}

/// GCRA at 10 per second (ten at once, then one every 100 ms).
fn ten_a_second() -> Policy {
    Policy::gcra("10/s").name("partner")
}

/// Sends `n` calls to `url` from each client, three at a time each: the statuses.
async fn send_from_both(clients: [&ClientWithMiddleware; 2], url: &str, n: usize) -> Vec<u16> {
    let mut tasks = Vec::new();
    for client in clients {
        for lane in 0..3 {
            let (client, url) = (client.clone(), url.to_owned());
            let calls = (lane..n).step_by(3).count();
            tasks.push(tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..calls {
                    let response = client.get(&url).send().await.expect("sent");
                    statuses.push(response.status().as_u16());
                }
                statuses
            }));
        }
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    statuses
}

/// Two clients, 15 calls each, on a budget of ten at once and ten a second: every call is
/// sent (each waits for its booked time), none early: in any second, at most the burst and a
/// second's worth (and one for the edges), and the 30th no sooner than 1.9 s after the first.
async fn two_clients_share_one_budget<St: Store>(a: St, b: St) {
    let (url, seen) = upstream(None, 0, HeaderMap::new()).await;
    let wait = Duration::from_secs(10);
    let (a, b) = (
        client(a, ten_a_second(), wait),
        client(b, ten_a_second(), wait),
    );
    let statuses = send_from_both([&a, &b], &url, 15).await;
    assert_eq!(statuses, vec![200; 30]);
    let arrivals = seen.arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 30);
    for (i, &from) in arrivals.iter().enumerate() {
        let within = arrivals[i..]
            .iter()
            .take_while(|&&t| t - from < Duration::from_secs(1))
            .count();
        assert!(within <= 21, "{within} calls within a second of call {i}");
    }
    let spread = arrivals[29] - arrivals[0];
    assert!(spread >= Duration::from_millis(1900), "{spread:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reqwest_clients_on_one_memory_store_share_one_budget() {
    let store = MemoryStore::new();
    two_clients_share_one_budget(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reqwest_clients_on_one_redis_share_one_budget() {
    let server = RedisServer::start();
    let (a, b) = (
        redis(&server.url(), "mw:").await,
        redis(&server.url(), "mw:").await,
    );
    two_clients_share_one_budget(a, b).await;
    support::assert_no_key_without_ttl(&server, "mw:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reqwest_clients_on_a_redis_cluster_share_one_budget() {
    let cluster = RedisCluster::start();
    let (a, b) = (
        redis(&cluster.url(), "mw:").await,
        redis(&cluster.url(), "mw:").await,
    );
    two_clients_share_one_budget(a, b).await;
}

/// The upstream's 4th call is answered `429` with `Retry-After: 1`: no call of either client
/// reaches it for that second, but those already on their way when it answered; every call
/// the clients make is sent in the end (a wait of 5 s covers the pause).
async fn a_pause_holds_both_clients<St: Store>(a: St, b: St) {
    let pause = HeaderMap::from_iter([("retry-after".parse().unwrap(), "1".parse().unwrap())]);
    let (url, seen) = upstream(None, 4, pause).await;
    let wait = Duration::from_secs(5);
    let (a, b) = (
        client(a, ten_a_second(), wait),
        client(b, ten_a_second(), wait),
    );
    let statuses = send_from_both([&a, &b], &url, 6).await;
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 1);
    assert_eq!(statuses.len(), 12);
    assert_paused(&seen, Duration::from_secs(1));
}

/// No arrival from 50 ms (calls on their way) to `pause` after the refusal.
fn assert_paused(seen: &Seen, pause: Duration) {
    let refused = seen.refused_at.lock().unwrap().expect("a refusal");
    let arrivals = seen.arrivals.lock().unwrap().clone();
    for (i, &t) in arrivals.iter().enumerate().filter(|(_, t)| **t > refused) {
        let after = t - refused;
        assert!(
            after < Duration::from_millis(50) || after >= pause,
            "call {i} arrived {after:?} after the refusal"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_learned_through_reqwest_holds_both_clients_in_memory() {
    let store = MemoryStore::new();
    a_pause_holds_both_clients(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_learned_through_reqwest_holds_both_clients_on_redis() {
    let server = RedisServer::start();
    let (a, b) = (
        redis(&server.url(), "mwp:").await,
        redis(&server.url(), "mwp:").await,
    );
    a_pause_holds_both_clients(a, b).await;
    support::assert_no_key_without_ttl(&server, "mwp:");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_learned_through_reqwest_holds_both_clients_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let (a, b) = (
        redis(&cluster.url(), "mwp:").await,
        redis(&cluster.url(), "mwp:").await,
    );
    a_pause_holds_both_clients(a, b).await;
}

#[tokio::test]
async fn a_call_given_up_is_a_middleware_error_holding_why() {
    let (url, seen) = upstream(None, 0, HeaderMap::new()).await;
    let one = Policy::gcra("1/min").name("partner");
    let client = client(MemoryStore::new(), one, Duration::from_millis(10));
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    let started = Instant::now();
    let error = client.get(&url).send().await.expect_err("given up");
    assert!(started.elapsed() < Duration::from_secs(5), "it waited");
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("{error:?}")
    };
    let gave_up = error.downcast_ref::<GaveUp>().expect("a GaveUp");
    assert_eq!(gave_up.reason(), Reason::Limited);
    assert_eq!(gave_up.policy(), "partner");
    assert!(gave_up.retry_after().unwrap() > Duration::from_secs(50));
    assert_eq!(seen.arrivals.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_client_error_comes_back_as_reqwests() {
    // A port nothing listens on: bound, then closed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    drop(listener);
    let client = client(MemoryStore::new(), ten_a_second(), Duration::from_secs(1));
    let error = client.get(&url).send().await.expect_err("refused");
    assert!(
        matches!(error, reqwest_middleware::Error::Reqwest(ref e) if e.is_connect()),
        "{error:?}"
    );
}
