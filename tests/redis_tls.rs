//! TLS to real `redis-server`s whose only ports are TLS ones, with certificates made by the
//! test (rcgen): standalone with a custom CA, mutual TLS, a pool, the cluster (TLS between its
//! nodes too) and Sentinel with a failover; every bad certificate is one clear error from
//! `build()`, within the connect timeout.

use std::time::{Duration, Instant};

use tower_ratelimit::key::{GlobalKey, Key};
use tower_ratelimit::{Algorithm, ManualClock, Policy, RateLimitLayer, RedisStore, RedisTls};

mod support;

use support::tls::Pki;

/// How many of `n` checks of `key` `layer` admits.
async fn admitted<S: tower_ratelimit::Store>(
    layer: &RateLimitLayer<S>,
    key: &str,
    n: usize,
) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let decision = layer.check(&Key::from(key), 1).await.expect("a decision");
        admitted += usize::from(decision.is_allowed());
    }
    admitted
}

fn layer(store: RedisStore, policy: Policy) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder()
        .policy(policy)
        .key(GlobalKey)
        .store(store)
        .build()
        .unwrap()
}

/// Builds a store for `url` with `tls` and returns the error, asserting it came within the
/// connect timeout's bound (no hang).
async fn build_error(url: &str, tls: Option<RedisTls>) -> String {
    let mut builder = RedisStore::builder(url).connect_timeout(Duration::from_secs(2));
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    let started = Instant::now();
    let error = builder.build().await.expect_err("build fails").to_string();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "build() took {:?} to fail: {error}",
        started.elapsed()
    );
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_server_decides_with_a_custom_ca_on_every_connection_kind() {
    let pki = Pki::new();
    let server = pki.server("server", false, &[]);
    let clock = ManualClock::new();
    for (pool, functions) in [(false, true), (true, true), (false, false)] {
        let mut builder = RedisStore::builder(&server.url())
            .tls(RedisTls::new().ca_pem(pki.ca.clone()))
            .prefix("tls:")
            .clock(clock.clone())
            .functions(functions);
        if pool {
            builder = builder.pool(4);
        }
        let store = builder.build().await.expect("connect over TLS");
        assert_eq!(store.uses_functions(), functions);
        // The multiplexed connection is the store's own, its writes coalesced.
        let coalesced = format!("{store:?}").contains("multiplexed (TLS, coalesced writes)");
        assert_eq!(coalesced, !pool, "{store:?}");
        for algorithm in Algorithm::ALL {
            let name = format!("{algorithm}-{pool}-{functions}");
            let layer = layer(store.clone(), Policy::new(algorithm, "3/h").name(&name));
            assert_eq!(admitted(&layer, "k", 5).await, 3, "{name}");
        }
    }
    support::assert_no_key_without_ttl(&server, "tls:");
    // The server saw the decisions over TLS: it has no plain-text port at all.
    assert_eq!(server.cli(&["CONFIG", "GET", "port"]), "port\n0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_presents_the_client_certificate() {
    let pki = Pki::new();
    let server = pki.server("server", true, &[]);
    let store = RedisStore::builder(&server.url())
        .tls(pki.client_tls())
        .build()
        .await
        .expect("connect with a client certificate");
    let layer = layer(store, Policy::gcra("2/h"));
    assert_eq!(admitted(&layer, "k", 3).await, 2);
    // Without a client certificate, or with one from a CA the server does not trust.
    let ca_only = RedisTls::new().ca_pem(pki.ca.clone());
    let error = build_error(&server.url(), Some(ca_only.clone())).await;
    assert!(
        error.contains("cannot connect to Redis at rediss://localhost"),
        "{error}"
    );
    let stranger = ca_only.client_certificate(pki.stranger.cert.clone(), pki.stranger.key.clone());
    let error = build_error(&server.url(), Some(stranger)).await;
    assert!(
        error.contains("cannot connect to Redis at rediss://localhost"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_certificate_is_one_clear_error_from_build() {
    let pki = Pki::new();
    let good = pki.server("server", false, &[]);
    let with_ca = || Some(RedisTls::new().ca_pem(pki.ca.clone()));
    // The system's roots do not know the test CA; nor does another CA.
    let error = build_error(&good.url(), None).await;
    assert!(error.contains("not signed by a trusted CA"), "{error}");
    let other = Some(RedisTls::new().ca_pem(pki.other_ca.clone()));
    let error = build_error(&good.url(), other).await;
    assert!(error.contains("not signed by a trusted CA"), "{error}");
    // A certificate for another name, an expired one.
    let wrong_name = pki.server("wrong_name", false, &[]);
    let error = build_error(&wrong_name.url(), with_ca()).await;
    assert!(error.contains("not valid for the host name"), "{error}");
    let expired = pki.server("expired", false, &[]);
    let error = build_error(&expired.url(), with_ca()).await;
    assert!(error.contains("expired"), "{error}");
    // Plain text against the TLS-only port, TLS against a plain-text port.
    let plain_url = good.url().replace("rediss://", "redis://");
    let error = build_error(&plain_url, None).await;
    assert!(error.contains(&format!("Redis at {plain_url}")), "{error}");
    assert!(error.contains("it needs rediss://"), "{error}");
    let plain = support::RedisServer::start();
    let tls_url = plain.url().replace("redis://", "rediss://");
    let error = build_error(&tls_url, with_ca()).await;
    assert!(error.contains("no answer to the TLS handshake"), "{error}");
    // TLS settings with a plain-text URL; a CA that is not PEM; a key that is not one.
    let error = build_error(&plain.url(), with_ca()).await;
    assert!(error.contains("use rediss://"), "{error}");
    let not_pem = Some(RedisTls::new().ca_pem("not a certificate"));
    let error = build_error(&good.url(), not_pem).await;
    assert!(
        error.contains("TLS: RedisTls::ca_pem: holds no certificate"),
        "{error}"
    );
    let bad_key = RedisTls::new().client_certificate(pki.client.cert.clone(), "no key");
    let error = build_error(&good.url(), Some(bad_key)).await;
    assert!(
        error.contains("RedisTls::client_certificate (the key): not a PEM private key"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepting_invalid_certificates_is_explicit() {
    let pki = Pki::new();
    let wrong_name = pki.server("wrong_name", false, &[]);
    let store = RedisStore::builder(&wrong_name.url())
        .tls(RedisTls::new().danger_accept_invalid_certificates(true))
        .build()
        .await
        .expect("no verification");
    // Unverified connections are redis-rs's own (development only: no need for speed).
    assert!(!format!("{store:?}").contains("coalesced"), "{store:?}");
    let layer = layer(store, Policy::fixed_window("1/h"));
    assert_eq!(admitted(&layer, "k", 2).await, 1);
    let shown = format!(
        "{:?}",
        RedisTls::new().danger_accept_invalid_certificates(true)
    );
    assert!(shown.contains("insecure: true"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_decides_exactly_across_its_nodes() {
    let pki = Pki::new();
    let cluster = pki.cluster();
    let clock = ManualClock::new();
    let store = || {
        RedisStore::builder(&cluster.url())
            .tls(pki.client_tls())
            .prefix("ctls:")
            .clock(clock.clone())
            .deadline(Duration::from_secs(10))
            .build()
    };
    let (a, b) = (store().await.unwrap(), store().await.unwrap());
    // The nodes' connections are the store's own, their writes coalesced.
    assert!(
        format!("{a:?}").contains("cluster (TLS, coalesced writes)"),
        "{a:?}"
    );
    let policy = Policy::sliding_window("20/h");
    let (la, lb) = (layer(a, policy.clone()), layer(b, policy));
    let admitted = support::lease::race_on_four_keys(&la, &lb, 200).await;
    assert_eq!(admitted, 4 * 20);
    let holding = cluster
        .nodes
        .iter()
        .filter(|n| !n.cli(&["--scan", "--pattern", "ctls:*"]).is_empty())
        .count();
    assert!(holding >= 2, "the keys are spread over the nodes");
    for node in &cluster.nodes {
        support::assert_no_key_without_ttl(node, "ctls:");
    }
    // A cluster pool takes the certificates too: its connections are the store's cluster
    // client's.
    let pooled = RedisStore::builder(&cluster.url())
        .tls(pki.client_tls())
        .prefix("ctls-pool:")
        .pool(2)
        .build()
        .await
        .expect("a cluster pool through TLS with a client certificate");
    let layer = layer(pooled, Policy::gcra("2/h").name("pooled"));
    let key = tower_ratelimit::key::Key::from("p");
    for allowed in [true, true, false] {
        assert_eq!(layer.check(&key, 1).await.unwrap().is_allowed(), allowed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sentinels_find_the_primary_again_after_a_failover() {
    let pki = Pki::new();
    let mut sentinels = pki.sentinels();
    let clock = ManualClock::new();
    let store = RedisStore::builder(&sentinels.url())
        .tls(pki.client_tls())
        .prefix("stls:")
        .clock(clock)
        .deadline(Duration::from_millis(200))
        .build()
        .await
        .expect("connect through TLS sentinels");
    // The primary's connection is the store's own, its writes coalesced.
    assert!(
        format!("{store:?}").contains("sentinel (TLS, coalesced writes)"),
        "{store:?}"
    );
    let layer = layer(store, Policy::fixed_window("10/h"));
    assert_eq!(admitted(&layer, "k", 4).await, 4);
    assert_eq!(sentinels.primary.cli(&["WAIT", "1", "5000"]), "1");
    sentinels.primary.kill();
    // Decisions fail (the failure policy's turn) until the replica is promoted.
    let killed = Instant::now();
    loop {
        match layer.check(&Key::from("k"), 1).await {
            Ok(decision) => {
                assert!(decision.is_allowed(), "5th of 10");
                break;
            }
            Err(_) => {
                assert!(
                    killed.elapsed() < Duration::from_secs(60),
                    "no failover in a minute"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(sentinels.replica.cli(&["ROLE"]).starts_with("master"));
    assert_eq!(
        admitted(&layer, "k", 10).await,
        5,
        "exact after the failover"
    );
}

/// The demo server on a TLS-only Redis asking for a client certificate, as an ACL user whose
/// password is in no URL: `REDIS_CA`, `REDIS_CLIENT_CERT`, `REDIS_CLIENT_KEY`,
/// `REDIS_USERNAME`, `REDIS_PASSWORD`; a file it cannot read stops it, naming the variable;
/// a password Redis refuses is told, never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_server_speaks_tls_as_an_acl_user() {
    let pki = Pki::new();
    let server = pki.server("server", true, &[]);
    let password = "demo-Pa55word";
    let pass = format!(">{password}");
    server.cli(&["ACL", "SETUSER", "demo", "on", &pass, "~rl:*", "+@all"]);
    let (ca, cert, key) = (
        pki.path("ca.crt"),
        pki.path("client.crt"),
        pki.path("client.key"),
    );
    let url = server.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_CA", &ca),
        ("REDIS_CLIENT_CERT", &cert),
        ("REDIS_CLIENT_KEY", &key),
        ("REDIS_USERNAME", "demo"),
        ("REDIS_PASSWORD", password),
        ("RATE_LIMIT", "3/h"),
        ("KEY", "global"),
    ];
    let demo = support::demo::DemoServer::start(&env);
    assert!(
        demo.first_line.contains("store=redis"),
        "{}",
        demo.first_line
    );
    assert!(!demo.first_line.contains(password), "{}", demo.first_line);
    demo.line_with("redis: connected");
    let statuses: Vec<u16> = (0..4).map(|_| demo.get("/", &[]).0).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert!(!server.cli(&["KEYS", "rl:*"]).is_empty());
    // A file it cannot read; a key without its certificate; a wrong password.
    let mut bad = env;
    bad[1].1 = "/nonexistent/ca.crt";
    let error = support::demo::start_error(&bad);
    assert!(error.contains("REDIS_CA: cannot read"), "{error}");
    // A file that is not PEM, named by its variable and not by REDIS_URL.
    let not_pem = pki.path("not.pem");
    std::fs::write(&not_pem, "not PEM at all\n").expect("write a file");
    for (at, variable, problem) in [
        (
            1,
            "REDIS_CA",
            "holds no certificate (no BEGIN CERTIFICATE block)",
        ),
        (
            2,
            "REDIS_CLIENT_CERT",
            "holds no certificate (no BEGIN CERTIFICATE block)",
        ),
        (3, "REDIS_CLIENT_KEY", "not a PEM private key"),
    ] {
        let mut bad = env;
        bad[at].1 = not_pem.as_str();
        let error = support::demo::start_error(&bad);
        assert!(error.contains(&format!("{variable}: {problem}")), "{error}");
        assert!(!error.contains("REDIS_URL"), "{error}");
    }
    let mut bad = env;
    bad[2].1 = "";
    let error = support::demo::start_error(&bad);
    assert!(
        error.contains("REDIS_CLIENT_KEY: set REDIS_CLIENT_CERT too"),
        "{error}"
    );
    // A wrong password does not stop it (Redis may be fixed while it runs): it says why it
    // is not connected, without the password.
    let mut bad = env;
    bad[5].1 = "wrong-Pa55word";
    let demo = support::demo::DemoServer::start(&bad);
    let line = demo.line_with("refused the credentials");
    assert!(line.starts_with("redis: not connected yet"), "{line}");
    assert!(!line.contains("wrong-Pa55word"), "{line}");
}
