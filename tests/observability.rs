//! Seeing who is limited: the summary of the keys each policy denied (through the layer, on
//! both stores, two instances sharing one Redis, a cluster), its JSON admin route, the
//! decision's tracing span, and the catalogue of metrics the dashboard is drawn from.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use http::{Method, Request, StatusCode};
use support::http::{inner, send};
use support::trace::{Recorder, Seen};
use support::{RedisCluster, RedisServer};
use tower::{Layer, Service, ServiceExt};
use tower_ratelimit::key::{HeaderKey, Key};
use tower_ratelimit::telemetry::{METRICS, MetricKind};
use tower_ratelimit::top::TopLimited;
use tower_ratelimit::{
    FailurePolicy, ManualClock, MemoryStore, Policy, RateLimitLayer, RedisStore, Store,
    headers::HeaderStyle,
};

fn by_user<St: Store>(store: St, policies: Vec<Policy>, clock: &ManualClock) -> RateLimitLayer<St> {
    RateLimitLayer::builder()
        .key(HeaderKey::try_new("x-user").unwrap())
        .policies(policies)
        .store(store)
        .clock(clock.clone())
        .top_limited(TopLimited::new())
        .build()
        .unwrap()
}

fn as_user(user: &str) -> Request<()> {
    Request::get("/").header("x-user", user).body(()).unwrap()
}

/// Sends one request of `user` through `layer`; its status.
async fn status_of<St: Store>(layer: &RateLimitLayer<St>, user: &str) -> StatusCode {
    let seen = support::http::Seen::default();
    send(&layer.layer(inner(&seen)), as_user(user)).await.status
}

/// `(text, count)` of the `n` keys `policy` denied most.
fn top<St: Store>(layer: &RateLimitLayer<St>, policy: &str, n: usize) -> Vec<(String, u64)> {
    let top = layer.control().top_limited(policy, n);
    top.iter()
        .map(|k| (k.text().to_owned(), k.count()))
        .collect()
}

/// Through the layer on the memory store: 20,000 distinct clients each denied once, among
/// ten clients denied 3,000, 2,800, ... 1,200 times (the summary's own test floods it with
/// 100,000). The ten are reported in order, each count within its error of the truth, and a
/// second policy keeps its own summary.
#[tokio::test]
async fn the_layer_reports_the_ten_heaviest_of_a_flood_of_distinct_keys() {
    let clock = ManualClock::new();
    let layer = by_user(
        MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(300_000)
            .build(),
        vec![
            Policy::fixed_window("1/h").name("per-user"),
            Policy::fixed_window("1000000/h").name("roomy"),
        ],
        &clock,
    );
    let seen = support::http::Seen::default();
    let service = layer.layer(inner(&seen));
    let heavy: Vec<(String, u64)> = (0..10)
        .map(|i| (format!("heavy-{i}"), 3_000 - 200 * i as u64))
        .collect();
    let mut stream: Vec<String> = (0..20_000).map(|i| format!("flood-{i}")).collect();
    for (user, count) in &heavy {
        stream.extend(std::iter::repeat_n(user.clone(), *count as usize));
    }
    let mut rng = support::Rng::new(7);
    for i in (1..stream.len()).rev() {
        stream.swap(i, rng.range(0, i as u64) as usize);
    }
    // Each client's first request is admitted (1/h): send it first, then the stream, all
    // of it denied.
    let mut first: Vec<&String> = stream.iter().collect();
    first.sort();
    first.dedup();
    for user in first.into_iter().chain(&stream) {
        let mut service = service.clone();
        let ready = service.ready().await.unwrap();
        ready.call(as_user(user)).await.unwrap();
    }
    let reported = layer.control().top_limited("per-user", 10);
    let names: Vec<&str> = reported.iter().map(|k| k.text()).collect();
    let want: Vec<&str> = heavy.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, want);
    for (limited, (_, count)) in reported.iter().zip(&heavy) {
        assert!(limited.count() >= *count, "{limited:?}");
        assert!(limited.count() - limited.error() <= *count, "{limited:?}");
        assert!(limited.error() <= stream.len() as u64 / 256, "{limited:?}");
    }
    assert!(layer.control().top_limited("roomy", 10).is_empty());
    let reports = layer.control().top_limited_reports(3);
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0].policy(), "per-user");
    assert_eq!(reports[0].limited(), stream.len() as u64);
    assert_eq!(reports[0].keys().len(), 3);
    assert_eq!(
        layer.control().top_limited("per-user", 1)[0].key(),
        Some(&Key::from("heavy-0"))
    );
}

/// The same counts on Redis; with two instances sharing it, each reports the denials it made
/// of the one global limit; on a cluster, keys in different slots are all counted.
#[tokio::test]
async fn instances_sharing_redis_each_report_what_they_denied() {
    let redis = RedisServer::start();
    let cluster = RedisCluster::start();
    for url in [redis.url(), cluster.url()] {
        let clock = ManualClock::new();
        let store = || async {
            RedisStore::builder(url.as_str())
                .prefix("obs:")
                .clock(clock.clone())
                .build()
                .await
                .unwrap()
        };
        let policy = || vec![Policy::gcra("2/h").name("per-user")];
        let a = by_user(store().await, policy(), &clock);
        let b = by_user(store().await, policy(), &clock);
        // alice: 2 admitted by A, then 3 denied by A and 4 by B; bob{x} and carol{y} land in
        // other slots of a cluster.
        for _ in 0..5 {
            status_of(&a, "alice").await;
        }
        for _ in 0..4 {
            assert_eq!(status_of(&b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
        }
        for user in ["bob{x}", "carol{y}"] {
            for _ in 0..3 {
                status_of(&b, user).await;
            }
        }
        assert_eq!(top(&a, "per-user", 10), [("alice".to_owned(), 3)], "{url}");
        assert_eq!(
            top(&b, "per-user", 10),
            [
                ("alice".to_owned(), 4),
                ("bob{x}".to_owned(), 1),
                ("carol{y}".to_owned(), 1)
            ],
            "{url}"
        );
        // A minute later (the summary's period), nothing is reported.
        clock.advance(Duration::from_secs(61));
        assert_eq!(top(&b, "per-user", 10), []);
    }
}

/// A reload keeps the summary of a policy that stays, starts one for a new policy and drops
/// that of a policy gone.
#[tokio::test]
async fn a_reload_keeps_the_summaries_of_the_policies_that_stay() {
    let clock = ManualClock::new();
    let layer = by_user(
        MemoryStore::builder().clock(clock.clone()).build(),
        vec![
            Policy::fixed_window("1/h").name("stays"),
            Policy::fixed_window("1/h").name("goes"),
        ],
        &clock,
    );
    for _ in 0..3 {
        status_of(&layer, "dave").await;
    }
    assert_eq!(top(&layer, "goes", 5), [("dave".to_owned(), 2)]);
    layer
        .control()
        .reload([
            Policy::fixed_window("1/h").name("stays"),
            Policy::fixed_window("1/h").name("new"),
        ])
        .unwrap();
    assert_eq!(top(&layer, "goes", 5), []);
    status_of(&layer, "dave").await;
    assert_eq!(top(&layer, "stays", 5), [("dave".to_owned(), 3)]);
    // "new" admitted dave's first request.
    assert_eq!(top(&layer, "new", 5), []);
}

async fn admin(
    service: &tower_ratelimit::top::TopLimitedService,
    method: Method,
    uri: &str,
) -> (StatusCode, serde_json::Value) {
    // A loopback client, as the route's default guard asks.
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "127.0.0.1:9000")
        .extension(std::net::SocketAddr::from(([127, 0, 0, 1], 50000)))
        .body(())
        .unwrap();
    let response = service.clone().oneshot(request).await.unwrap();
    assert_eq!(response.headers()["content-type"], "application/json");
    let status = response.status();
    (status, serde_json::from_str(response.body()).unwrap())
}

#[tokio::test]
async fn the_admin_route_answers_json_and_clear_errors() {
    let clock = ManualClock::new();
    let layer = by_user(
        MemoryStore::builder().clock(clock.clone()).build(),
        vec![
            Policy::fixed_window("1/h").name("per-user"),
            Policy::fixed_window("100/h").name("other"),
        ],
        &clock,
    );
    for user in [
        "erin", "erin", "erin", "frank", "frank", "quote\"d", "quote\"d",
    ] {
        status_of(&layer, user).await;
    }
    let service = layer.control().top_limited_service();
    let (status, all) = admin(&service, Method::GET, "/admin/top").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        all,
        serde_json::json!({
            "period_seconds": 60,
            "keys_as": "text",
            "policies": [
                {"policy": "per-user", "limited": 4, "keys": [
                    {"key": "erin", "count": 2, "error": 0},
                    {"key": "frank", "count": 1, "error": 0},
                    {"key": "quote\"d", "count": 1, "error": 0},
                ], "near_limit": 0, "near_keys": []},
                {"policy": "other", "limited": 0, "keys": [], "near_limit": 0, "near_keys": []},
            ]
        })
    );
    let (status, one) = admin(&service, Method::GET, "/admin/top?policy=per%2Duser&n=1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one["policies"].as_array().unwrap().len(), 1);
    assert_eq!(
        one["policies"][0]["keys"],
        serde_json::json!([{"key": "erin", "count": 2, "error": 0}])
    );

    for (method, uri, want, says) in [
        (
            Method::GET,
            "/admin/top?policy=nope",
            404,
            "no policy is named \"nope\"",
        ),
        (Method::GET, "/admin/top?n=0", 400, "not a positive number"),
        (
            Method::GET,
            "/admin/top?n=many",
            400,
            "not a positive number",
        ),
        (Method::POST, "/admin/top", 405, "only GET"),
    ] {
        let (status, body) = admin(&service, method, uri).await;
        assert_eq!(status.as_u16(), want, "{uri}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(says), "{uri}: {error}");
    }
    // A layer that keeps no summary says how to keep one.
    let plain = RateLimitLayer::new(Policy::gcra("1/s"), tower_ratelimit::key::GlobalKey);
    assert!(plain.control().top_limited("gcra:1/s", 10).is_empty());
    let (status, body) = admin(&plain.control().top_limited_service(), Method::GET, "/").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].as_str().unwrap().contains("top_limited"));
}

/// The route names other clients' keys: by default it answers a loopback client with a
/// loopback `Host` only; with a token, the holder of the token only.
#[tokio::test]
async fn the_admin_route_is_guarded() {
    use tower_ratelimit::admin::{AdminGuardLayer, AdminToken};
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s"))
        .key(tower_ratelimit::key::GlobalKey)
        .top_limited(TopLimited::new())
        .build()
        .unwrap();
    let ask = |service: tower_ratelimit::top::TopLimitedService,
               peer: Option<[u8; 4]>,
               host: &'static str,
               auth: Option<&'static str>| async move {
        let mut request = Request::get("/admin/top").header("host", host);
        if let Some(peer) = peer {
            request = request.extension(std::net::SocketAddr::from((peer, 4000)));
        }
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = service.oneshot(request.body(()).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let problem = response.headers()["content-type"] == "application/problem+json";
        let challenge = response.headers().get("www-authenticate").cloned();
        (status, problem, challenge)
    };
    let open = layer.control().top_limited_service();
    let local = Some([127, 0, 0, 1]);
    assert_eq!(ask(open.clone(), local, "localhost:80", None).await.0, 200);
    assert_eq!(ask(open.clone(), local, "[::1]:80", None).await.0, 200);
    assert_eq!(ask(open.clone(), local, "127.0.0.1", None).await.0, 200);
    // DNS rebinding: a loopback peer, a page's own name.
    assert_eq!(
        ask(open.clone(), local, "evil.example", None).await,
        (403, true, None)
    );
    // A remote peer, or none known.
    let remote = Some([203, 0, 113, 9]);
    assert_eq!(ask(open.clone(), remote, "127.0.0.1", None).await.0, 403);
    assert_eq!(ask(open.clone(), None, "127.0.0.1", None).await.0, 403);

    let token = AdminToken::new("0123456789abcdef-secret").unwrap();
    let guarded = open.guard(AdminGuardLayer::token(token));
    let (status, problem, challenge) = ask(guarded.clone(), local, "localhost", None).await;
    assert_eq!((status, problem), (401, true));
    assert_eq!(challenge.unwrap(), r#"Bearer realm="admin""#);
    let wrong = Some("Bearer 0123456789abcdef-secreT");
    assert_eq!(ask(guarded.clone(), local, "localhost", wrong).await.0, 401);
    let right = Some("bearer 0123456789abcdef-secret");
    assert_eq!(
        ask(guarded.clone(), remote, "api.example", right).await.0,
        200
    );
}

/// Hashed, a key is reported as the `pk` the client sees in its own `RateLimit` header, so an
/// operator can match a complaint with the report without the report holding the key.
#[tokio::test]
async fn hashed_keys_are_the_partition_keys_clients_see() {
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::try_new("x-user").unwrap())
        .policy(Policy::fixed_window("1/h").name("per-user"))
        .headers(HeaderStyle::Ietf)
        .partition_keys(b"0123456789abcdef-keep-me-secret")
        .top_limited(TopLimited::new().hashed())
        .build()
        .unwrap();
    let seen = support::http::Seen::default();
    let service = layer.layer(inner(&seen));
    send(&service, as_user("grace")).await;
    let limited = send(&service, as_user("grace")).await;
    let header = limited.header("ratelimit").unwrap().to_owned();
    let top = layer.control().top_limited("per-user", 1);
    assert_eq!(top[0].key(), None);
    assert!(
        header.contains(&format!("pk={}", top[0].text())),
        "{header} and {top:?}"
    );
    assert!(!top[0].text().contains("grace"));
    // hashed() without a secret is a build error.
    let err = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s"))
        .top_limited(TopLimited::new().hashed())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("partition_keys"), "{err}");
    let err = RateLimitLayer::builder()
        .policy(Policy::gcra("1/s"))
        .top_limited(TopLimited::new().keys(0))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("1 to 65536"), "{err}");
}

// ----- Tracing -----

fn fields(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One `debug` span per decision, naming the policies, the outcome and who denied; nothing
/// at `info` or above, even for a shadow policy's denial or a rejected key.
#[tokio::test(flavor = "current_thread")]
async fn each_decision_is_one_debug_span_and_nothing_is_logged_at_info() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let clock = ManualClock::new();
    let layer = by_user(
        MemoryStore::builder().clock(clock.clone()).build(),
        vec![
            Policy::fixed_window("2/h").name("per-user"),
            Policy::fixed_window("1/h").name("trial").shadow(),
        ],
        &clock,
    );
    for _ in 0..3 {
        status_of(&layer, "heidi").await;
    }
    let seen = support::http::Seen::default();
    let rejected = send(&layer.layer(inner(&seen)), Request::new(())).await;
    assert_eq!(rejected.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        recorder.decisions(),
        [
            fields(&[("policies", "per-user,trial"), ("outcome", "allowed")]),
            fields(&[
                ("policies", "per-user,trial"),
                ("outcome", "allowed"),
                ("limited_by", "trial")
            ]),
            fields(&[
                ("policies", "per-user,trial"),
                ("outcome", "limited"),
                ("limited_by", "per-user,trial")
            ]),
            fields(&[("policies", "per-user"), ("outcome", "key_rejected")]),
        ]
    );
    assert_eq!(recorder.loud().len(), 0, "{:?}", recorder.loud());
}

/// On Redis the span has the store's latency; a failing store is logged at `warn` once a
/// second at most, with how many failures went by since, and each decision's span says
/// what answered.
#[tokio::test(flavor = "current_thread")]
async fn redis_decisions_carry_the_store_latency_and_failures_warn_once_a_second() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let mut redis = RedisServer::start();
    let clock = ManualClock::new();
    let store = RedisStore::builder(&redis.url())
        .deadline(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::try_new("x-user").unwrap())
        .policy(Policy::gcra("5/h").name("per-user"))
        .store(store)
        .clock(clock.clone())
        .circuit_breaker(None)
        .on_store_error(FailurePolicy::Open)
        .build()
        .unwrap();
    assert_eq!(status_of(&layer, "ivan").await, StatusCode::OK);
    let first = recorder.decisions().remove(0);
    let store_us: u64 = first["store_us"].parse().unwrap();
    assert!(store_us > 0 && store_us < 200_000, "{first:?}");
    assert_eq!(first["outcome"], "allowed");

    redis.kill();
    for _ in 0..20 {
        assert_eq!(status_of(&layer, "ivan").await, StatusCode::OK);
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(status_of(&layer, "ivan").await, StatusCode::OK);
    // The layer's warnings; beside them, the store's one event of the connection it lost.
    let (warned, lost): (Vec<Seen>, Vec<Seen>) = recorder
        .loud()
        .into_iter()
        .partition(|e| e.fields["message"].starts_with("rate-limit store failed"));
    assert!(lost.len() <= 1, "{lost:?}");
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(warned.iter().all(|e| e.level == "WARN"));
    assert_eq!(warned[0].fields["more_since_last"], "0");
    assert_eq!(warned[1].fields["more_since_last"], "19");
    let last = recorder.decisions().pop().unwrap();
    assert_eq!(last["outcome"], "allowed", "{last:?}");
    assert_eq!(last["failure_policy"], "open", "{last:?}");
    assert!(
        ["failed", "timeout"].contains(&last["degraded"].as_str()),
        "{last:?}"
    );
}

// ----- Metrics and the dashboard -----

fn read(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `"ratelimit_..."` name in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("ratelimit_") {
        let before = rest[..at].chars().next_back();
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.push(name);
        }
    }
    names
}

fn source_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The catalogue is the truth: every metric name in the source is in [`METRICS`], and every
/// metric of it is emitted somewhere outside the catalogue.
#[test]
fn the_catalogue_lists_exactly_the_metrics_the_source_emits() {
    let mut files = Vec::new();
    source_files(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut used = std::collections::BTreeSet::new();
    for file in files.iter().filter(|f| !f.ends_with("telemetry.rs")) {
        let text = std::fs::read_to_string(file).unwrap();
        for name in metric_names(&text) {
            if name != "ratelimit_" {
                used.insert(name);
            }
        }
    }
    let listed: std::collections::BTreeSet<String> =
        METRICS.iter().map(|m| m.name.to_owned()).collect();
    assert_eq!(used, listed);
    // And the production guide's table has a row for each.
    let guide = read("src/guide/production.md");
    for m in METRICS {
        assert!(
            guide.contains(&format!("| `{}` |", m.name)),
            "the production guide: {}",
            m.name
        );
    }
}

/// The metric names of `expr`, a histogram's series suffixes taken off.
fn dashboard_metrics(dashboard: &serde_json::Value, out: &mut Vec<String>) {
    match dashboard {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(expr)) => out.extend(metric_names(expr)),
                    _ => dashboard_metrics(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_metrics(v, out)),
        _ => {}
    }
}

/// Every query of the Grafana dashboard names a metric the layer emits (with the series
/// names Prometheus gives histograms), and every metric has a panel.
#[test]
fn the_dashboard_queries_only_metrics_the_layer_emits() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("dashboards/tower-ratelimit.json")).unwrap();
    let mut named = Vec::new();
    dashboard_metrics(&dashboard, &mut named);
    assert!(named.len() >= METRICS.len());
    for name in &named {
        let known = METRICS.iter().any(|m| {
            m.name == name
                || (m.kind == MetricKind::Histogram
                    && ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| *name == format!("{}{s}", m.name)))
        });
        assert!(
            known,
            "the dashboard queries {name}, which the layer does not emit"
        );
    }
    for m in METRICS {
        assert!(
            named.iter().any(|n| n.starts_with(m.name)),
            "no panel shows {}",
            m.name
        );
    }
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(
        panels
            .iter()
            .all(|p| p["title"].is_string() && p["type"].is_string())
    );
}

// ----- The demo server -----

/// `/metrics` of the server at `addr`, read by a Prometheus text-format parser.
fn scrape(addr: std::net::SocketAddr) -> prometheus_parse::Scrape {
    let (status, body) = support::demo::fetch(addr, "/metrics", &[]);
    assert_eq!(status, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// The value of the counter `name` whose labels include `labels`.
fn counter(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let matching = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)));
    matching
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) => v,
            ref other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

/// The demo server, in memory: `/metrics` in Prometheus text format counts every decision
/// the clients saw, with help texts; `/admin/top` names the client limited most; neither is
/// ever limited, nor counted.
#[test]
fn the_demo_server_serves_metrics_and_the_top_limited_keys() {
    use support::demo::{DemoServer, fetch};
    let server = DemoServer::start(&[("RATE_LIMIT", "3/h"), ("KEY", "header:x-user")]);
    assert_eq!(server.admin_addr(), server.addr);
    let mut statuses = HashMap::<u16, u32>::new();
    for (user, times) in [("judy", 7), ("mallory", 12), ("ken", 2)] {
        for _ in 0..times {
            *statuses
                .entry(fetch(server.addr, "/", &[("x-user", user)]).0)
                .or_default() += 1;
        }
    }
    assert_eq!(statuses, HashMap::from([(200, 8), (429, 13)]));
    for _ in 0..20 {
        assert_eq!(fetch(server.addr, "/admin/top", &[]).0, 200);
        scrape(server.addr);
    }
    let scrape = scrape(server.addr);
    let decisions = "ratelimit_decisions_total";
    assert_eq!(counter(&scrape, decisions, &[("outcome", "allowed")]), 8.0);
    assert_eq!(counter(&scrape, decisions, &[("outcome", "limited")]), 13.0);
    assert_eq!(
        counter(
            &scrape,
            decisions,
            &[("policy", "gcra:3/h"), ("outcome", "limited")]
        ),
        13.0
    );
    assert!(
        scrape.docs[decisions].contains("Decisions per policy"),
        "{:?}",
        scrape.docs
    );
    for sample in scrape
        .samples
        .iter()
        .filter(|s| !s.metric.starts_with("demo_"))
    {
        assert!(
            METRICS.iter().any(|m| sample.metric.starts_with(m.name)),
            "{} is not in the catalogue",
            sample.metric
        );
    }
    // The demo server's own gauges: its live tasks, and its memory store's keys.
    for own in ["demo_tasks_alive", "demo_memory_store_keys"] {
        let value = (scrape.samples.iter())
            .find(|s| s.metric == own)
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) => v,
                _ => panic!("{own} is a gauge"),
            });
        assert!(value.is_some_and(|v| v >= 1.0), "{own}: {value:?}");
    }
    let (status, top) = fetch(server.addr, "/admin/top?n=2", &[]);
    assert_eq!(status, 200);
    let top: serde_json::Value = serde_json::from_str(&top).unwrap();
    assert_eq!(
        top["policies"][0]["keys"],
        serde_json::json!([
            {"key": "mallory", "count": 9, "error": 0},
            {"key": "judy", "count": 4, "error": 0},
        ])
    );
}

/// With `ADMIN_BIND`, `/metrics` and `/admin/top` are answered there and not on the public
/// address; on Redis, the store's latency is a Prometheus histogram.
#[test]
fn admin_bind_keeps_metrics_off_the_public_address() {
    use support::demo::{DemoServer, fetch};
    let redis = RedisServer::start();
    let server = DemoServer::start(&[
        ("RATE_LIMIT", "2/h"),
        ("ADMIN_BIND", "127.0.0.1:0"),
        ("REDIS_URL", &redis.url()),
    ]);
    let admin = server.admin_addr();
    assert_ne!(admin, server.addr);
    assert_eq!(fetch(server.addr, "/metrics", &[]).0, 404);
    assert_eq!(fetch(server.addr, "/admin/top", &[]).0, 404);
    let statuses: Vec<u16> = (0..4).map(|_| fetch(server.addr, "/", &[]).0).collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
    let scrape = scrape(admin);
    let latency = scrape
        .samples
        .iter()
        .find(|s| s.metric == "ratelimit_store_duration_seconds")
        .expect("the store latency");
    match &latency.value {
        prometheus_parse::Value::Histogram(buckets) => {
            let all = buckets.iter().find(|b| b.less_than.is_infinite()).unwrap();
            assert_eq!(all.count, 4.0, "{buckets:?}");
        }
        other => panic!("not a histogram: {other:?}"),
    }
    let (status, top) = fetch(admin, "/admin/top", &[]);
    assert_eq!(status, 200);
    assert!(
        top.contains(r#"{"key":"127.0.0.1","count":2,"error":0}"#),
        "{top}"
    );
}

/// Requests the deny cache answers count as denials of the policy too: the summary sees the
/// whole flood on a limited key, not just the store's first no.
#[tokio::test]
async fn denials_from_the_deny_cache_are_counted() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::try_new("x-user").unwrap())
        .policy(Policy::fixed_window("1/h").name("per-user"))
        .store(MemoryStore::builder().clock(clock.clone()).build())
        .clock(clock.clone())
        .deny_cache(100)
        .top_limited(TopLimited::new())
        .build()
        .unwrap();
    for _ in 0..50 {
        status_of(&layer, "oscar").await;
    }
    assert_eq!(top(&layer, "per-user", 1), [("oscar".to_owned(), 49)]);
}

/// A policy that settles its cost counts the reports it did not take as they came: one too
/// large (clamped to 10 times the limit), and a response that reported nothing.
#[test]
fn the_demo_server_counts_the_costs_it_clamped() {
    use support::demo::{DemoServer, fetch};
    let server = DemoServer::start(&[("RATE_LIMIT", "10/h"), ("COST_HEADER", "x-tokens")]);
    assert_eq!(fetch(server.addr, "/spend?cost=5", &[]).0, 200);
    assert_eq!(
        fetch(server.addr, "/", &[]).0,
        200,
        "no x-tokens: the estimate kept"
    );
    assert_eq!(fetch(server.addr, "/spend?cost=5000", &[]).0, 200);
    assert_eq!(fetch(server.addr, "/", &[]).0, 429, "in debt");
    let scrape = scrape(server.addr);
    let clamped = "ratelimit_costs_clamped_total";
    let policy = ("policy", "gcra:10/h");
    assert_eq!(
        counter(&scrape, clamped, &[policy, ("reason", "too_large")]),
        1.0
    );
    assert_eq!(
        counter(&scrape, clamped, &[policy, ("reason", "missing")]),
        1.0
    );
    assert_eq!(counter(&scrape, clamped, &[("reason", "negative")]), 0.0);
}
