//! The Redis guide's least-privilege ACL lines, run for real: the store's whole behaviour
//! under each (every operation, the admin operations, a reload, the fallback to `EVAL` after a
//! flush, a pool, the cluster, Sentinel) leaves Redis's `ACL LOG` empty; a user lacking a command, or a Redis
//! refusing `TIME` in scripts, fails at `build()` naming it; credentials are never printed.

use std::time::Duration;

use http::StatusCode;
use tower_ratelimit::key::{GlobalKey, Key};
use tower_ratelimit::{Policy, RateLimitLayer, RedisStore, SystemClock};

mod support;

use support::everything::everything;
use support::http::{Seen, get, inner};
use support::trace::Recorder;
use support::{RedisCluster, RedisServer};

const PASSWORD: &str = "s3cret-Pa55word-for-the-test";

/// The guide's `ACL SETUSER` lines: for Redis functions (`FCALL`), and for `EVALSHA`.
fn acl_lines() -> Vec<Vec<String>> {
    let guide = include_str!("../src/guide/redis.md");
    let lines: Vec<Vec<String>> = guide
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER ratelimiter "))
        .map(|l| {
            l.replace(">CHANGE-ME", &format!(">{PASSWORD}"))
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "the guide has the FCALL and the EVALSHA lines"
    );
    assert!(lines[0].contains(&"+fcall".to_owned()));
    assert!(lines[1].contains(&"+evalsha".to_owned()));
    lines
}

fn set_user(server: &RedisServer, line: &[String]) {
    let args: Vec<&str> = line.iter().map(String::as_str).collect();
    assert_eq!(server.cli(&args), "OK", "{line:?}");
    server.cli(&["ACL", "LOG", "RESET"]);
}

/// What Redis denied the user, from `ACL LOG`: each entry's `object` (the command or key).
fn denied(server: &RedisServer) -> Vec<String> {
    let log = server.cli(&["ACL", "LOG"]);
    let lines: Vec<&str> = log.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "object")
        .map(|w| w[1].to_owned())
        .collect()
}

fn store_as_user(url: &str) -> tower_ratelimit::RedisStoreBuilder {
    RedisStore::builder(url)
        .credentials("ratelimiter", PASSWORD)
        .prefix("rl:")
        .deadline(Duration::from_secs(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_acl_lines_allow_everything_the_store_does() {
    for (line, functions) in acl_lines().iter().zip([true, false]) {
        let server = RedisServer::start();
        set_user(&server, line);
        let store = store_as_user(&server.url())
            .functions(functions)
            .build()
            .await
            .expect("build under the least-privilege user");
        assert_eq!(store.uses_functions(), functions);
        let flushed = if functions { "FUNCTION" } else { "SCRIPT" };
        everything(&store, || assert_eq!(server.cli(&[flushed, "FLUSH"]), "OK")).await;
        if functions {
            let name = RedisStore::function_name();
            support::eventually("the function is loaded again", async || {
                server.cli(&["FUNCTION", "LIST"]).contains(name)
            })
            .await;
        }
        assert_eq!(denied(&server), Vec::<String>::new(), "{line:?}");
        // A pool's connections too.
        server.cli(&["FLUSHALL"]);
        let pooled = store_as_user(&server.url())
            .functions(functions)
            .pool(2)
            .build()
            .await
            .expect("a pool under the least-privilege user");
        everything(&pooled, || {}).await;
        assert_eq!(denied(&server), Vec::<String>::new(), "{line:?}, pool");
        // The EVALSHA line's user, asked for functions, falls back to EVALSHA; Redis denied
        // FUNCTION LOAD alone.
        if !functions {
            let store = store_as_user(&server.url()).build().await.unwrap();
            assert!(!store.uses_functions());
            assert_eq!(denied(&server), ["function|load"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acl_line_allows_everything_on_the_cluster() {
    let cluster = RedisCluster::start();
    let line = &acl_lines()[0];
    for node in &cluster.nodes {
        set_user(node, line);
    }
    // Its password from a credentials provider, which every node's connection asks.
    let store = RedisStore::builder(&cluster.url())
        .credentials_provider(Duration::from_secs(60), || async {
            Ok(("ratelimiter".to_owned(), PASSWORD.to_owned()))
        })
        .deadline(Duration::from_secs(10))
        .build()
        .await
        .expect("build under the least-privilege user");
    everything(&store, || {
        for node in &cluster.nodes {
            node.cli(&["FUNCTION", "FLUSH"]);
        }
    })
    .await;
    for node in &cluster.nodes {
        assert_eq!(denied(node), Vec::<String>::new(), "node {}", node.port);
    }
}

/// The error of `build()` as the user of the guide's FCALL line without `permission`.
async fn error_lacking(server: &RedisServer, permission: &str) -> String {
    let mut line = acl_lines()[0].clone();
    line.retain(|w| w != permission);
    set_user(server, &line);
    let built = store_as_user(&server.url()).build().await;
    built.expect_err("build fails").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acl_line_allows_everything_behind_sentinel() {
    let sentinels = support::Sentinels::start();
    let line = &acl_lines()[0];
    for server in [&sentinels.primary, &sentinels.replica] {
        set_user(server, line);
    }
    let store = store_as_user(&sentinels.url())
        .build()
        .await
        .expect("build under the least-privilege user");
    everything(&store, || {
        sentinels.primary.cli(&["FUNCTION", "FLUSH"]);
    })
    .await;
    assert_eq!(denied(&sentinels.primary), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_is_an_error_of_build_naming_the_command() {
    let server = RedisServer::start();
    let error = error_lacking(&server, "+zadd").await;
    assert!(error.contains("may not run ZADD"), "{error}");
    assert!(error.contains("ACL line"), "{error}");
    // Keys outside the prefix are refused too.
    set_user(&server, &acl_lines()[0]);
    let error = store_as_user(&server.url())
        .prefix("other:")
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("ACL line"), "{error}");
}

/// A Redis that refuses `TIME` in scripts: `build()` names the option, and with the
/// instances' clock the store works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_refusing_time_needs_the_instances_clock() {
    let server = RedisServer::start();
    let error = error_lacking(&server, "+time").await;
    assert!(error.contains("Redis refuses TIME"), "{error}");
    assert!(error.contains("clock(SystemClock::new())"), "{error}");
    assert_eq!(denied(&server), ["time"]);
    server.cli(&["ACL", "LOG", "RESET"]);
    let store = store_as_user(&server.url())
        .clock(SystemClock::new())
        .build()
        .await
        .expect("the instances' clock");
    everything(&store, || {
        server.cli(&["FUNCTION", "FLUSH"]);
    })
    .await;
    assert_eq!(denied(&server), Vec::<String>::new());
}

/// The password given beside the URL, or in it, appears in no `Debug`, error or log line.
#[tokio::test(flavor = "current_thread")]
async fn credentials_are_never_printed() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let server = RedisServer::start();
    set_user(&server, &acl_lines()[0]);
    let builder = store_as_user(&server.url());
    let shown = format!("{builder:?}");
    assert!(
        shown.contains("ratelimiter") && !shown.contains(PASSWORD),
        "{shown}"
    );
    let store = builder.build().await.expect("the right password");
    assert!(!format!("{store:?}").contains(PASSWORD));
    // A wrong password, beside the URL and in it.
    let wrong = format!("{PASSWORD}-wrong");
    let error = RedisStore::builder(&server.url())
        .credentials("ratelimiter", &wrong)
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("refused the credentials"), "{error}");
    let url = format!("redis://ratelimiter:{wrong}@127.0.0.1:{}", server.port);
    let in_url = RedisStore::builder(&url).build().await.unwrap_err();
    for text in [error, in_url.to_string(), format!("{in_url:?}")] {
        assert!(!text.contains(PASSWORD), "{text}");
    }
    // And Redis down: the error, and the failure policy's warning.
    drop(server);
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s"))
        .key(GlobalKey)
        .store(store)
        .build()
        .unwrap();
    let error = layer.check(&Key::from("k"), 1).await.unwrap_err();
    assert!(!format!("{error} {error:?}").contains(PASSWORD));
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(inner(&Seen::default()));
    assert_eq!(
        get(&svc).await.status,
        StatusCode::OK,
        "the failure policy, open"
    );
    let logged = recorder.everything();
    assert!(logged.contains("WARN"), "the failure was logged: {logged}");
    assert!(!logged.contains(PASSWORD), "{logged}");
}

/// A password rotated while the layer decides (the user is given the new password, the
/// provider hands it out, the old one is removed), as with IAM tokens: no decision fails, no
/// connection is refused (`ACL LOG` is empty), and new connections get the new password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_rotated_while_deciding_fail_no_decision() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    let server = RedisServer::start();
    set_user(&server, &acl_lines()[0]);
    let current = Arc::new(Mutex::new(PASSWORD.to_owned()));
    let asked = Arc::new(AtomicUsize::new(0));
    let provider = {
        let (current, asked) = (current.clone(), asked.clone());
        move || {
            asked.fetch_add(1, Ordering::SeqCst);
            let password = current.lock().unwrap().clone();
            async move { Ok(("ratelimiter".to_owned(), password)) }
        }
    };
    let every = Duration::from_millis(50);
    for pool in [false, true] {
        let mut builder = RedisStore::builder(&server.url())
            .credentials_provider(every, provider.clone())
            .deadline(Duration::from_secs(10));
        if pool {
            builder = builder.pool(2);
        }
        let store = builder.build().await.expect("the provider's password");
        let layer = RateLimitLayer::builder()
            .policy(Policy::gcra("1000000/s"))
            .store(store)
            .build()
            .unwrap();
        let (stop, decided) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let deciding = {
            let (stop, decided) = (stop.clone(), decided.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    layer
                        .check(&Key::from("k"), 1)
                        .await
                        .expect("no decision fails");
                    decided.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        // Rotate: the new password, handed out, then the old one removed, each after the
        // connections had time to authenticate again.
        let (old, new) = (
            current.lock().unwrap().clone(),
            format!("{PASSWORD}-{pool}"),
        );
        assert_eq!(
            server.cli(&["ACL", "SETUSER", "ratelimiter", &format!(">{new}")]),
            "OK"
        );
        *current.lock().unwrap() = new.clone();
        let (since, auths) = (asked.load(Ordering::SeqCst), server.calls("auth"));
        support::eventually("the provider is asked again, twice", async || {
            asked.load(Ordering::SeqCst) >= since + 2
        })
        .await;
        // The live connections authenticated again (`AUTH` on them; HELLO for new ones).
        support::eventually("AUTH on the live connections", async || {
            server.calls("auth") >= auths + 2
        })
        .await;
        assert_eq!(
            server.cli(&["ACL", "SETUSER", "ratelimiter", &format!("<{old}")]),
            "OK"
        );
        let before = decided.load(Ordering::SeqCst);
        support::eventually("decisions go on", async || {
            decided.load(Ordering::SeqCst) > before + 100
        })
        .await;
        stop.store(true, Ordering::SeqCst);
        deciding.await.expect("no decision failed");
        assert_eq!(denied(&server), Vec::<String>::new(), "no AUTH was refused");
        // The old password no longer works; a new store gets the new one from the provider.
        let error = RedisStore::builder(&server.url())
            .credentials("ratelimiter", &old)
            .build()
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("refused the credentials"),
            "{error}"
        );
        server.cli(&["ACL", "LOG", "RESET"]);
        RedisStore::builder(&server.url())
            .credentials_provider(every, provider.clone())
            .build()
            .await
            .expect("the new password");
    }
}
