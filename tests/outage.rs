//! What an instance keeps doing through an outage of Redis (really paused with `SIGSTOP`):
//! the denials it saw (a policy's, a block on violation, a key on the deny list) keep
//! answering until their ends, whatever the failure policy; a key it never saw denied gets the
//! failure policy's answer.

mod support;

use std::process::Command;
use std::time::Duration;

use http::{Request, StatusCode};
use support::RedisServer;
use support::http::{App, Reply, Seen, app, send};
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::lists::Lists;
use tower_ratelimit::{Escalation, FailurePolicy, Policy, RateLimitLayer, RedisStore};

/// A layer of 2 an hour per `x-key` (blocking a key denied twice within a minute for ten
/// minutes), with lists kept in the store, failing `failure` after a 50 ms deadline.
async fn layer(server: &RedisServer, failure: FailurePolicy) -> RateLimitLayer<RedisStore> {
    let store = RedisStore::builder(&server.url())
        .deadline(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let escalation = Escalation::new(Duration::from_secs(600)).after(2, Duration::from_secs(60));
    RateLimitLayer::builder()
        .policy(
            Policy::gcra("2/h")
                .name("held")
                .block_on_violation(escalation),
        )
        .key(HeaderKey::try_new("x-key").unwrap())
        .lists(Lists::new())
        .on_store_error(failure)
        .circuit_breaker(None)
        .store(store)
        .build()
        .unwrap()
}

async fn ask(app: &App, key: &str) -> Reply {
    send(
        app,
        Request::builder().header("x-key", key).body(()).unwrap(),
    )
    .await
}

fn signal(server: &RedisServer, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &server.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal}");
}

/// Redis paused: what each instance saw denied stays denied on it, to its end; what it did not
/// see gets the failure policy; once Redis is back, Redis decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_seen_hold_while_redis_is_paused() {
    let server = RedisServer::start();
    for failure in [FailurePolicy::Open, FailurePolicy::Closed] {
        let (one, two) = (layer(&server, failure).await, layer(&server, failure).await);
        let (a, b) = (app(&one, &Seen::default()), app(&two, &Seen::default()));
        let prefix = format!("{failure:?}");
        let k = |name: &str| format!("{prefix}-{name}");
        // Denied by the policy, then blocked (seen by `a`); denied at runtime on `one`, and
        // its request seen refused by `b`.
        for _ in 0..2 {
            assert_eq!(ask(&a, &k("spent")).await.status, StatusCode::OK);
        }
        assert_eq!(
            ask(&a, &k("spent")).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        for _ in 0..4 {
            ask(&a, &k("blocked")).await;
        }
        let blocked = ask(&a, &k("blocked")).await;
        assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            blocked.retry_after() > 500,
            "a ten-minute block: {}",
            blocked.retry_after()
        );
        one.deny_key(&Key::from(k("denied")), None).await.unwrap();
        two.deny_key(&Key::from(k("seen")), None).await.unwrap();
        assert_eq!(ask(&a, &k("seen")).await.status, StatusCode::FORBIDDEN);

        signal(&server, "-STOP");
        let outage = async {
            // Held by `a` and `one`: the denial, the block, the entries.
            let spent = ask(&a, &k("spent")).await;
            assert_eq!(
                spent.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{failure:?}: spent"
            );
            assert!(spent.retry_after() > 0);
            let blocked = ask(&a, &k("blocked")).await;
            assert_eq!(
                blocked.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{failure:?}: blocked"
            );
            assert!(blocked.retry_after() > 500, "to the block's end");
            assert_eq!(
                ask(&a, &k("denied")).await.status,
                StatusCode::FORBIDDEN,
                "{failure:?}"
            );
            assert_eq!(
                ask(&a, &k("seen")).await.status,
                StatusCode::FORBIDDEN,
                "{failure:?}"
            );
            // Not seen: the failure policy answers.
            let unseen = match failure {
                FailurePolicy::Closed => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::OK,
            };
            assert_eq!(
                ask(&a, &k("fresh")).await.status,
                unseen,
                "{failure:?}: unseen"
            );
            assert_eq!(
                ask(&b, &k("spent")).await.status,
                unseen,
                "{failure:?}: b never saw it"
            );
        };
        let result = tokio::time::timeout(Duration::from_secs(20), outage).await;
        signal(&server, "-CONT");
        result.expect("answers within the deadline while Redis is paused");
        // Back: Redis decides (a fresh key's first request is admitted with its headers).
        let fresh = ask(&b, &k("after")).await;
        assert_eq!(fresh.status, StatusCode::OK);
        assert_eq!(fresh.remaining(), Some(1), "{failure:?}: decided by Redis");
        // Taken off on one: no longer held there.
        one.remove_denied(&Key::from(k("denied"))).await.unwrap();
        assert_eq!(ask(&a, &k("denied")).await.status, StatusCode::OK);
    }
}
