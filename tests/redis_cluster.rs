//! The Redis store on a real 3-primary Redis Cluster started by the test: exactness under
//! contention, hostile keys in the crate's chosen slot, NOSCRIPT on every node, TTLs.

mod support;

use support::lease::{fewest_admitted, hammer, race_on_four_keys};
use support::{RedisCluster, assert_no_key_without_ttl};
use tower_ratelimit::key::Key;
use tower_ratelimit::{Algorithm, ManualClock, Policy, RateLimitLayer, RedisStore};

/// One cluster, started once (it takes a few seconds) and stopped when the suite ends, even
/// when a scenario fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_suite() {
    let cluster = RedisCluster::start();
    let c = &cluster;
    two_instances_admit_exactly_the_limit_on_the_cluster(c).await;
    two_instances_charge_several_policies_on_the_cluster(c).await;
    hostile_keys_land_in_the_crates_slot(c).await;
    script_flush_on_every_node_is_survived(c).await;
    redis_time_works_on_the_cluster(c).await;
    policies_on_different_slots_charge_all_or_nothing(c).await;
    leases_keep_two_instances_within_the_limit_on_the_cluster(c).await;
    leased_policies_on_different_slots_charge_all_or_nothing(c).await;
    waits_share_one_schedule_on_the_cluster(c).await;
    a_wait_on_one_slot_is_released_when_another_slot_denies(c).await;
    concurrency_on_the_cluster(c).await;
    ietf_fields_on_the_cluster(c).await;
    reloads_keep_usage_on_the_cluster(c).await;
}

async fn store(
    cluster: &RedisCluster,
    prefix: &str,
    clock: &ManualClock,
    pool: bool,
) -> RedisStore {
    let mut b = RedisStore::builder(&cluster.url())
        .deadline(std::time::Duration::from_secs(10))
        .prefix(prefix)
        .clock(clock.clone());
    if pool {
        b = b.pool(8);
    }
    b.build().await.expect("connect to the test cluster")
}

fn check_all_nodes(cluster: &RedisCluster, prefix: &str) {
    for node in &cluster.nodes {
        assert_no_key_without_ttl(node, prefix);
    }
}

async fn two_instances_admit_exactly_the_limit_on_the_cluster(cluster: &RedisCluster) {
    let clock = ManualClock::new();
    for algorithm in Algorithm::ALL {
        let a = store(cluster, "crace:", &clock, false).await;
        let b = store(cluster, "crace:", &clock, true).await;
        let policy = Policy::new(algorithm, "50/h").name(algorithm.name());
        let la = RateLimitLayer::builder()
            .policy(policy.clone())
            .store(a)
            .build()
            .unwrap();
        let lb = RateLimitLayer::builder()
            .policy(policy)
            .store(b)
            .build()
            .unwrap();
        let admitted = race_on_four_keys(&la, &lb, 1_000).await;
        assert_eq!(admitted, 4 * 50, "{algorithm}");
    }
    check_all_nodes(cluster, "crace:");
}

/// Two and three policies of one key (one slot), raced by two instances on four keys (so
/// several slots and nodes): all or nothing, each key admitted the smallest limit.
async fn two_instances_charge_several_policies_on_the_cluster(cluster: &RedisCluster) {
    let clock = ManualClock::new();
    for (i, set) in support::lease::several_policy_sets().iter().enumerate() {
        let a = store(cluster, "csrace:", &clock, false).await;
        let b = store(cluster, "csrace:", &clock, true).await;
        support::lease::race_several(a, b, &format!("s{i}"), set, 600, 4).await;
    }
    check_all_nodes(cluster, "csrace:");
}

async fn hostile_keys_land_in_the_crates_slot(cluster: &RedisCluster) {
    let clock = ManualClock::new();
    let s = store(cluster, "chostile:", &clock, false).await;
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("1/h").name("p"))
        .store(s.clone())
        .build()
        .unwrap();
    let hostile = [
        Key::from("{victim}"),
        Key::from("x}{victim"),
        Key::from("{}"),
        Key::from("a:b"),
        Key::from("new\nline"),
        Key::from(&b"\xc3\x28 bad utf-8"[..]),
        Key::from(vec![b'{'; 64 * 1024]),
        Key::from("victim"),
    ];
    let victim_key = String::from_utf8(s.key_for("p", &Key::from("victim"))).unwrap();
    let victim_slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", &victim_key]);
    for key in &hostile {
        assert!(layer.check(key, 1).await.unwrap().is_allowed(), "{key:?}");
        let rk = String::from_utf8(s.key_for("p", key)).unwrap();
        // The slot is the one of the crate's hash tag, i.e. of the tag's body alone.
        let tag = &rk[rk.find('{').unwrap() + 1..rk.find('}').unwrap()];
        let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", &rk]);
        assert_eq!(
            slot,
            cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", tag]),
            "{rk}"
        );
        if *key != Key::from("victim") {
            assert!(rk != victim_key);
        }
        // The key is stored on the node that owns that slot, with a TTL.
        let node = cluster.node_for(rk.as_bytes());
        assert_eq!(node.cli(&["EXISTS", &rk]), "1", "{rk} on its node");
        assert!(node.cli(&["PTTL", &rk]).parse::<i64>().unwrap() > 0);
    }
    // "{victim}" and friends did not land in the victim's bucket (or its slot, but by chance).
    assert_ne!(
        cluster.nodes[0].cli(&[
            "CLUSTER",
            "KEYSLOT",
            &String::from_utf8(s.key_for("p", &Key::from("{victim}"))).unwrap()
        ]),
        victim_slot
    );
    for key in &hostile {
        assert!(
            !layer.check(key, 1).await.unwrap().is_allowed(),
            "{key:?} has its own bucket"
        );
    }
    check_all_nodes(cluster, "chostile:");
}

async fn script_flush_on_every_node_is_survived(cluster: &RedisCluster) {
    let clock = ManualClock::new();
    for (pool, functions) in [(false, true), (true, true), (false, false), (true, false)] {
        let mut b = RedisStore::builder(&cluster.url())
            .deadline(std::time::Duration::from_secs(10))
            .prefix("cflush:")
            .clock(clock.clone())
            .functions(functions);
        if pool {
            b = b.pool(8);
        }
        let s = b.build().await.expect("connect to the test cluster");
        assert_eq!(s.uses_functions(), functions);
        for node in &cluster.nodes {
            let loaded = node
                .cli(&["FUNCTION", "LIST"])
                .contains(RedisStore::function_name());
            assert!(
                !functions || loaded,
                "the function is loaded on every primary"
            );
        }
        let flush = if functions { "FUNCTION" } else { "SCRIPT" };
        let layer = RateLimitLayer::builder()
            .policy(Policy::gcra("1000/h").name("g"))
            .store(s.clone())
            .build()
            .unwrap();
        for round in 0..5 {
            for node in &cluster.nodes {
                node.cli(&[flush, "FLUSH"]);
                if !functions {
                    assert_eq!(node.cli(&["SCRIPT", "EXISTS", s.script_sha()]), "0");
                }
            }
            for i in 0..12 {
                layer
                    .check(&Key::from(format!("k{i}")), 1)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("round {round}, key {i}, pool {pool}, {flush} FLUSH: {e}")
                    });
            }
        }
    }
    check_all_nodes(cluster, "cflush:");
}

async fn redis_time_works_on_the_cluster(cluster: &RedisCluster) {
    let s = RedisStore::builder(&cluster.url())
        .deadline(std::time::Duration::from_secs(10))
        .prefix("ctime:")
        .build()
        .await
        .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(Policy::sliding_log("3/h").name("l"))
        .store(s)
        .build()
        .unwrap();
    let key = Key::from("t");
    for _ in 0..3 {
        assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    }
    let d = layer.check(&key, 1).await.unwrap();
    assert!(!d.is_allowed());
    let retry = d.retry_after().unwrap();
    assert!(
        retry > std::time::Duration::from_secs(3590)
            && retry <= std::time::Duration::from_secs(3600)
    );
    check_all_nodes(cluster, "ctime:");
}

async fn policies_on_different_slots_charge_all_or_nothing(cluster: &RedisCluster) {
    on_different_slots(cluster, "cslots:", None).await;
}

async fn leased_policies_on_different_slots_charge_all_or_nothing(cluster: &RedisCluster) {
    on_different_slots(cluster, "cleased:", Some((5, 1))).await;
}

/// A per-IP policy (100/h) and a per-user one (2/h) whose keys live on different slots, each
/// taking leases of the sizes given, if any: four requests, the last two denied by the
/// per-user policy, and the per-IP policy charged for the two admitted only.
async fn on_different_slots(cluster: &RedisCluster, prefix: &str, leases: Option<(u32, u32)>) {
    use http::StatusCode;
    use tower::ServiceExt;

    let clock = ManualClock::new();
    let s = store(cluster, prefix, &clock, false).await;
    let mut per_ip = Policy::fixed_window("100/h").name("per-ip");
    let mut per_user = Policy::fixed_window("2/h").name("per-user");
    if let Some((ip, user)) = leases {
        per_ip = per_ip.lease(ip);
        per_user = per_user.lease(user);
    }
    let svc = ip_and_user_service(
        cluster,
        &s,
        &clock,
        (per_ip, "per-ip"),
        (per_user, "per-user"),
    );
    let ip_key = String::from_utf8(s.key_for("per-ip", &Key::from("198.51.100.7"))).unwrap();
    let mut statuses = Vec::new();
    for i in 0..4 {
        if i == 2 {
            // With leases: the per-IP lease ends, and the next requests ask for a new one on
            // its slot, which the per-user slot then denies.
            clock.advance(std::time::Duration::from_secs(2));
        }
        statuses.push(
            svc.clone()
                .oneshot(ip_and_user_request())
                .await
                .unwrap()
                .status(),
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // The per-IP policy was charged only for the two admitted requests: what the denied ones
    // charged on its slot was refunded, and the leases they took there given back. With
    // leases, the first request was decided as without (a key seen once), the second took a
    // lease whose units left went back with the next asking.
    let node = cluster.node_for(ip_key.as_bytes());
    let state = node.cli(&["GET", &ip_key]);
    // "tokens-or-count ...TAG": the state, then the tag of the parameters it was written under
    // (from its first letter).
    let count = state
        .split(|c: char| c.is_ascii_alphabetic())
        .next()
        .and_then(|s| s.split(' ').nth(1));
    assert_eq!(count, Some("2"), "per-ip state {state:?}");
    check_all_nodes(cluster, prefix);
}

async fn leases_keep_two_instances_within_the_limit_on_the_cluster(cluster: &RedisCluster) {
    let (limit, lease) = (100, 10);
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, format!("{limit}/h").as_str())
            .name(format!("lease-{algorithm}"))
            .lease(lease as u32);
        let connect = |pool: bool| {
            let mut b = RedisStore::builder(&cluster.url())
                .deadline(std::time::Duration::from_secs(10))
                .prefix("clease:");
            if pool {
                b = b.pool(8);
            }
            b.build()
        };
        let a = connect(false).await.unwrap();
        let b = connect(true).await.unwrap();
        let admitted = hammer(a, b, policy, 240).await;
        let fewest = fewest_admitted(algorithm, limit, lease);
        assert!(
            (fewest..=limit).contains(&admitted),
            "{algorithm}: {admitted} admitted, not within {fewest}..={limit}"
        );
    }
    check_all_nodes(cluster, "clease:");
}

/// A service behind one layer of a per-IP policy (`per_ip`, keyed by `x-ip`) and a per-user
/// one (`per_user`, keyed by `x-user`) on `s`, after checking that the keys of the requests
/// [`ip_and_user_request`] makes live on different slots of the cluster.
fn ip_and_user_service(
    cluster: &RedisCluster,
    s: &RedisStore,
    clock: &ManualClock,
    (per_ip, ip_name): (Policy, &str),
    (per_user, user_name): (Policy, &str),
) -> impl tower::Service<
    http::Request<()>,
    Response = http::Response<
        tower_ratelimit::body::ResponseBody<http_body_util::Full<bytes::Bytes>>,
    >,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone
+ use<> {
    use http::HeaderName;
    use tower_layer::Layer;
    use tower_ratelimit::key::HeaderKey;

    let layer = RateLimitLayer::builder()
        .policy(per_ip.key(HeaderKey::new(HeaderName::from_static("x-ip"))))
        .policy(per_user.key(HeaderKey::new(HeaderName::from_static("x-user"))))
        .store(s.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    let ip_key = String::from_utf8(s.key_for(ip_name, &Key::from("198.51.100.7"))).unwrap();
    let user_key = String::from_utf8(s.key_for(user_name, &Key::from("alice"))).unwrap();
    let slot = |k: &str| cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", k]);
    assert_ne!(slot(&ip_key), slot(&user_key));
    layer.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"ok"),
        )))
    }))
}

/// A request from 198.51.100.7 as alice.
fn ip_and_user_request() -> http::Request<()> {
    http::Request::builder()
        .header("x-ip", "198.51.100.7")
        .header("x-user", "alice")
        .body(())
        .unwrap()
}

fn smooth() -> Policy {
    Policy::gcra("2/s")
        .name("smooth")
        .wait_up_to(std::time::Duration::from_secs(1))
}

/// Two instances (one multiplexed connection, one pool) queue on one schedule on the cluster.
async fn waits_share_one_schedule_on_the_cluster(cluster: &RedisCluster) {
    let clock = ManualClock::new();
    let layer = |store| {
        RateLimitLayer::builder()
            .policy(smooth())
            .store(store)
            .build()
            .unwrap()
    };
    let a = layer(store(cluster, "cwait:", &clock, false).await);
    let b = layer(store(cluster, "cwait:", &clock, true).await);
    let mut got = Vec::new();
    for i in 0..5 {
        let l = if i % 2 == 0 { &a } else { &b };
        let d = l.check(&Key::from("k"), 1).await.unwrap();
        got.push(d.is_allowed().then(|| d.wait().as_millis()));
    }
    assert_eq!(got, [Some(0), Some(0), Some(500), Some(1000), None]);
    check_all_nodes(cluster, "cwait:");
}

/// A per-IP policy that lets requests wait and a per-user one that does not, on different
/// slots: a request the per-IP slot would reserve but the per-user slot denies is rejected,
/// and its per-IP slot released, so the next request gets that slot.
async fn a_wait_on_one_slot_is_released_when_another_slot_denies(cluster: &RedisCluster) {
    use http::StatusCode;
    use tower::ServiceExt;

    let clock = ManualClock::new();
    let s = store(cluster, "cwslots:", &clock, false).await;
    let per_ip = smooth();
    let per_user = Policy::fixed_window("3/h").name("per-user");
    let svc = ip_and_user_service(
        cluster,
        &s,
        &clock,
        (per_ip.clone(), "smooth"),
        (per_user, "per-user"),
    );
    let mut statuses = Vec::new();
    let started = std::time::Instant::now();
    for _ in 0..4 {
        statuses.push(
            svc.clone()
                .oneshot(ip_and_user_request())
                .await
                .unwrap()
                .status(),
        );
    }
    // Two at once, the third after waiting 500 ms for its per-IP slot (the user's third of
    // three), the fourth denied by the per-user slot.
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(500));
    // The fourth's per-IP slot (a second away) was released: the next per-IP request gets it.
    let ip_only = RateLimitLayer::builder()
        .policy(per_ip)
        .store(s)
        .clock(clock.clone())
        .build()
        .unwrap();
    let next = ip_only.check(&Key::from("198.51.100.7"), 1).await.unwrap();
    assert_eq!(next.wait(), std::time::Duration::from_millis(1000));
    check_all_nodes(cluster, "cwslots:");
}

/// A concurrency limit on the cluster: two instances share one count (slots taken by admin
/// checks, which never give them back, free at `max_duration`); with a per-user rate policy on
/// another slot, a request the rate policy denies gives back the slot it took on the first.
async fn concurrency_on_the_cluster(cluster: &RedisCluster) {
    use http::{HeaderName, Request, Response, StatusCode};
    use std::time::Duration;
    use tower::{ServiceExt, service_fn};
    use tower_layer::Layer;
    use tower_ratelimit::key::HeaderKey;

    let clock = ManualClock::new();
    let conc = || {
        Policy::concurrency(2)
            .name("cconc")
            .max_duration(Duration::from_secs(10))
    };
    let layer = |store, policies: Vec<Policy>| {
        policies
            .into_iter()
            .fold(RateLimitLayer::builder(), |b, p| b.policy(p))
            .store(store)
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let a = layer(store(cluster, "cconc:", &clock, false).await, vec![conc()]);
    let b = layer(store(cluster, "cconc:", &clock, true).await, vec![conc()]);
    let key = Key::from("k");
    assert!(a.check(&key, 1).await.unwrap().is_allowed());
    assert!(b.check(&key, 1).await.unwrap().is_allowed());
    assert!(!a.check(&key, 1).await.unwrap().is_allowed(), "one count");
    clock.advance(Duration::from_secs(10));
    assert!(
        b.check(&key, 1).await.unwrap().is_allowed(),
        "freed at max_duration"
    );

    let s = store(cluster, "cconc2:", &clock, false).await;
    let per_ip = Policy::concurrency(1)
        .name("ip-conc")
        .key(HeaderKey::new(HeaderName::from_static("x-ip")));
    let per_user = Policy::fixed_window("1/h")
        .name("user-hourly")
        .key(HeaderKey::new(HeaderName::from_static("x-user")));
    let both = layer(s.clone(), vec![per_ip.clone(), per_user]);
    let ip_key = String::from_utf8(s.key_for("ip-conc", &Key::from("203.0.113.9"))).unwrap();
    let user_key = String::from_utf8(s.key_for("user-hourly", &Key::from("bob"))).unwrap();
    let slot = |k: &str| cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", k]);
    assert_ne!(slot(&ip_key), slot(&user_key));
    let svc = both.layer(service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"ok"),
        )))
    }));
    let request = || {
        Request::builder()
            .header("x-ip", "203.0.113.9")
            .header("x-user", "bob")
            .body(())
            .unwrap()
    };
    let free = async || {
        let ip_only = layer(s.clone(), vec![per_ip.clone()]);
        let d = ip_only.check(&Key::from("203.0.113.9"), 0).await.unwrap();
        d.outcomes()[0].remaining()
    };
    let first = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    drop(first);
    // The body dropped: its slot goes back (sent without waiting for the answer).
    let started = std::time::Instant::now();
    while free().await != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "slot given back"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let second = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(
        second.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "bob's hour is spent"
    );
    assert_eq!(
        free().await,
        1,
        "the per-IP slot the denied request took went back"
    );
    check_all_nodes(cluster, "cconc:");
    check_all_nodes(cluster, "cconc2:");
}

/// The IETF fields of a decision made on the cluster, read with a structured-field parser:
/// a rate policy and a concurrency limit, each item with the key's `pk`.
async fn ietf_fields_on_the_cluster(cluster: &RedisCluster) {
    use http::{Request, Response};
    use tower::{ServiceExt, service_fn};
    use tower_layer::Layer;
    use tower_ratelimit::headers::{HeaderStyle, RATELIMIT, RATELIMIT_POLICY};
    use tower_ratelimit::key::GlobalKey;

    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("10/s").name("rate"))
        .policy(Policy::concurrency(3).name("conc"))
        .key(GlobalKey)
        .headers(HeaderStyle::Ietf)
        .partition_keys(b"sixteen bytes or more of secret")
        .store(store(cluster, "cietf:", &clock, false).await)
        .build()
        .unwrap();
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"ok"),
        )))
    }));
    let response = svc.oneshot(Request::new(())).await.unwrap();
    let field = |name| -> sfv::List {
        let value = response.headers()[&name].to_str().unwrap();
        sfv::Parser::new(value).parse().unwrap()
    };
    let (policy, state) = (field(RATELIMIT_POLICY), field(RATELIMIT));
    let pk = |list: &sfv::List, i: usize| match &list[i] {
        sfv::ListEntry::Item(item) => item.params.get("pk").cloned(),
        _ => panic!("an inner list"),
    };
    let first = pk(&policy, 0).expect("a pk");
    assert!(matches!(&first, sfv::BareItem::ByteSequence(b) if b.len() == 16));
    for i in 0..2 {
        assert_eq!(pk(&policy, i).as_ref(), Some(&first), "one key, one pk");
        assert_eq!(pk(&state, i).as_ref(), Some(&first));
    }
    let sfv::ListEntry::Item(conc) = &policy[1] else {
        panic!("an inner list")
    };
    match conc.params.get("qu") {
        Some(sfv::BareItem::String(qu)) => assert_eq!(qu.as_str(), "concurrent-requests"),
        other => panic!("qu is {other:?}"),
    }
    check_all_nodes(cluster, "cietf:");
}

/// Two instances on the cluster, one reloaded from 10 to 20 a minute while the other still
/// runs 10: on keys spread over the slots, each converts the state to its own quota, so
/// together they admit 20 per key, as one would; reloaded too, the other sees every unit used.
async fn reloads_keep_usage_on_the_cluster(cluster: &RedisCluster) {
    let clock = ManualClock::new();
    for algorithm in Algorithm::ALL {
        let prefix = format!("creload-{}:", algorithm.name());
        let api = |limit: u32| {
            let quota = tower_ratelimit::Quota::new(limit, std::time::Duration::from_secs(60));
            Policy::new(algorithm, quota.unwrap()).name("api")
        };
        let layer = |store: RedisStore| {
            RateLimitLayer::builder()
                .policy(api(10))
                .store(store)
                .build()
                .unwrap()
        };
        let a = layer(store(cluster, &prefix, &clock, false).await);
        let b = layer(store(cluster, &prefix, &clock, true).await);
        let keys: Vec<Key> = (0..6).map(|i| Key::from(format!("user-{i}"))).collect();
        for key in &keys {
            for _ in 0..4 {
                assert!(a.check(key, 1).await.unwrap().is_allowed());
            }
        }
        b.control().reload([api(20)]).unwrap();
        for key in &keys {
            let mut admitted = 4;
            for i in 0..40 {
                let instance = if i % 2 == 0 { &a } else { &b };
                if instance.check(key, 1).await.unwrap().is_allowed() {
                    admitted += 1;
                }
            }
            assert_eq!(admitted, 20, "{algorithm} {key:?}");
        }
        a.control().reload([api(20)]).unwrap();
        for key in &keys {
            assert_eq!(
                a.control().peek(key).await.unwrap().tightest().remaining(),
                0,
                "{algorithm}"
            );
        }
        check_all_nodes(cluster, &prefix);
    }
}
