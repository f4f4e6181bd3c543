//! The middleware in axum: `Router::layer` vs `route_layer`, per-route limits, peer addresses
//! from `MockConnectInfo` (in `keys.rs`), the `Decision` extractor, and a real server over TCP.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::http::get_path;

use axum::Router;
use axum::routing::get;
use http::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, ServiceExt};
use tower_ratelimit::axum::AxumBody;
use tower_ratelimit::headers::X_RATELIMIT_LIMIT;
use tower_ratelimit::key::{GlobalKey, PeerIp};
use tower_ratelimit::{Decision, ManualClock, MemoryStore, Policy, RateLimitLayer};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A global fixed-window limit on a manual clock that never moves unless told.
fn global(quota: &str, name: &str, store: &MemoryStore) -> RateLimitLayer {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window(quota).name(name))
        .key(GlobalKey)
        .store(store.clone())
        .build()
        .unwrap()
}

/// Reports the remaining count of the decision that let the request through.
async fn remaining(decision: Decision) -> String {
    decision.tightest().remaining().to_string()
}

async fn maybe_remaining(decision: Option<Decision>) -> String {
    match decision {
        Some(d) => format!("some {}", d.tightest().remaining()),
        None => "none".to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Where the layer goes
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn route_layer_leaves_unmatched_paths_404_and_free() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let app = Router::new()
        .route("/a", get(remaining))
        .route_layer(global("3/s", "api", &store));

    for _ in 0..20 {
        let r = get_path(&app, "/nope").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert!(
            r.headers.get(X_RATELIMIT_LIMIT).is_none(),
            "a 404 never went through the limiter"
        );
    }
    assert_eq!(store.len(), 0, "nothing was counted");

    let r = get_path(&app, "/a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "2", "the matched route still has its full quota");
    assert_eq!(r.remaining(), Some(2));
}

#[tokio::test]
async fn router_layer_counts_unmatched_paths() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let app = Router::new()
        .route("/a", get(remaining))
        .layer(global("3/s", "api", &store));

    for expected in [2, 1, 0] {
        let r = get_path(&app, "/nope").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(r.remaining(), Some(expected), "a 404 costs a unit");
    }
    let r = get_path(&app, "/nope").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "even 404s are limited"
    );
    let r = get_path(&app, "/a").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the 404s used up /a's quota"
    );
}

#[tokio::test]
async fn routes_with_their_own_limits_are_independent() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let app = Router::new()
        .route(
            "/a",
            get(remaining).route_layer(global("2/s", "route-a", &store)),
        )
        .route(
            "/b",
            get(remaining).route_layer(global("3/s", "route-b", &store)),
        );

    assert_eq!(get_path(&app, "/a").await.body, "1");
    assert_eq!(get_path(&app, "/a").await.body, "0");
    for _ in 0..5 {
        assert_eq!(
            get_path(&app, "/a").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    for expected in ["2", "1", "0"] {
        let r = get_path(&app, "/b").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, expected, "/a's denials do not touch /b");
    }
    assert_eq!(
        get_path(&app, "/b").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    clock.advance(Duration::from_secs(1));
    assert_eq!(get_path(&app, "/a").await.body, "1");
    assert_eq!(get_path(&app, "/b").await.body, "2");
}

#[tokio::test]
async fn one_layer_on_several_routes_is_one_bucket() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let app = Router::new()
        .route("/a", get(remaining))
        .route("/b", get(remaining))
        .route_layer(global("2/s", "shared", &store));
    assert_eq!(get_path(&app, "/a").await.body, "1");
    assert_eq!(get_path(&app, "/b").await.body, "0");
    assert_eq!(
        get_path(&app, "/a").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

// ---------------------------------------------------------------------------------------------
// Peer addresses
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// The Decision extractor
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_decision_extractor_sees_the_remaining_count() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let app = Router::new()
        .route(
            "/limited",
            get(maybe_remaining).route_layer(global("3/s", "api", &store)),
        )
        .route(
            "/required",
            get(remaining).route_layer(global("3/s", "api-2", &store)),
        )
        .route("/free", get(maybe_remaining))
        .route("/free-required", get(remaining));

    for expected in ["some 2", "some 1", "some 0"] {
        let r = get_path(&app, "/limited").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, expected);
    }
    assert_eq!(
        get_path(&app, "/limited").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get_path(&app, "/required").await.body, "2");

    let r = get_path(&app, "/free").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "none", "Option<Decision> is None without the layer");

    let r = get_path(&app, "/free-required").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.body.contains("RateLimitLayer"), "{}", r.body);
}

#[tokio::test]
async fn without_the_decision_extension_handlers_see_none_and_headers_stay() {
    let store = MemoryStore::with_clock(ManualClock::new());
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("2/s").name("quiet"))
        .key(GlobalKey)
        .store(store)
        .decision_extension(false)
        .build()
        .unwrap();
    let app = Router::new().route("/", get(maybe_remaining).route_layer(layer));

    let r = get_path(&app, "/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "none", "no Decision in the request's extensions");
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("1"),
        "headers as before"
    );
    assert_eq!(get_path(&app, "/").await.status, StatusCode::OK);
    assert_eq!(
        get_path(&app, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn axum_body_answers_in_axums_own_body_with_the_same_responses() {
    let layer = || {
        RateLimitLayer::builder()
            .policy(Policy::fixed_window("1/s").name("api"))
            .key(GlobalKey)
            .store(MemoryStore::with_clock(ManualClock::new()))
            .build()
            .unwrap()
    };
    let wrapped = Router::new().route("/", get(|| async { "hello" }).route_layer(layer()));
    let svc = layer()
        .body::<AxumBody>()
        .layer(Router::new().route("/", get(|| async { "hello" })));
    // The response's body is axum's own (the annotation fails to compile otherwise).
    let request = Request::get("/").body(axum::body::Body::empty()).unwrap();
    let first: http::Response<axum::body::Body> = svc.clone().oneshot(request).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["x-ratelimit-remaining"], "0");

    // Admitted and limited responses are the same as the default body's, byte for byte.
    let expected_ok = get_path(&wrapped, "/").await;
    let expected_limited = get_path(&wrapped, "/").await;
    let limited = get_path(&svc, "/").await;
    assert_eq!(expected_ok.status, StatusCode::OK);
    assert_eq!(expected_ok.body, "hello");
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.body, expected_limited.body);
    assert!(!limited.body.is_empty());
    assert_eq!(
        limited.header(X_RATELIMIT_LIMIT),
        expected_limited.header(X_RATELIMIT_LIMIT)
    );
    assert_eq!(limited.header("retry-after"), Some("1"));
}

#[tokio::test]
async fn axum_body_boxes_another_inner_body_once() {
    // A plain tower service answering with `String` bodies, not axum's.
    let inner = tower::service_fn(|_: Request<axum::body::Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::from("plain")))
    });
    let svc = RateLimitLayer::builder()
        .policy(Policy::fixed_window("1/s").name("plain"))
        .key(GlobalKey)
        .store(MemoryStore::with_clock(ManualClock::new()))
        .build()
        .unwrap()
        .body::<AxumBody>()
        .layer(inner);
    let r = get_path(&svc, "/").await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "plain"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        get_path(&svc, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

// ---------------------------------------------------------------------------------------------
// A real server
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct RawResponse {
    status: u16,
    /// Lower-cased names.
    headers: Vec<(String, String)>,
    body: String,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        let mut values = self.headers.iter().filter(|(n, _)| n == name);
        let value = values.next().map(|(_, v)| v.as_str());
        assert!(values.next().is_none(), "{name} appears more than once");
        value
    }
}

/// One HTTP/1.1 request on its own connection, read to the end.
async fn raw_get(addr: SocketAddr, path: &str) -> RawResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();

    let (head, body) = raw
        .split_once("\r\n\r\n")
        .expect("a complete response head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let mut parts = status_line.splitn(3, ' ');
    assert_eq!(parts.next(), Some("HTTP/1.1"), "{status_line}");
    let status = parts.next().unwrap().parse().unwrap();
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(':').expect("a header line");
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    RawResponse {
        status,
        headers,
        body: body.to_owned(),
    }
}

#[tokio::test]
async fn a_real_server_limits_by_peer_address() {
    // Fixed windows are aligned to the clock's epoch, so on the system clock even a generous
    // window could roll over between two requests; the manual clock rules that out while the
    // network, `ConnectInfo` and header encoding are real. The clock starts on a minute.
    let clock = ManualClock::starting_at(16_666_667 * 60_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    let app = Router::new()
        .route("/", get(remaining))
        .route_layer(
            RateLimitLayer::builder()
                .policy(Policy::fixed_window("2/60s"))
                .key(PeerIp::new())
                .store(store.clone())
                .build()
                .unwrap(),
        )
        // Added after `route_layer`, so not limited.
        .route("/health", get(|| async { "up" }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });

    let run = async {
        // The names as they are on the wire.
        let (limit, left, reset, retry) = (
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "retry-after",
        );

        for expected in ["1", "0"] {
            let r = raw_get(addr, "/").await;
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(r.body, expected);
            assert_eq!(r.header(limit), Some("2"));
            assert_eq!(r.header(left), Some(expected));
            assert_eq!(r.header(reset), Some("60"));
            assert_eq!(r.header(retry), None);
        }

        clock.advance(Duration::from_secs(15));
        let r = raw_get(addr, "/health").await;
        assert_eq!((r.status, r.body.as_str()), (200, "up"));
        assert_eq!(r.header(left), None, "/health is not limited");
        let r = raw_get(addr, "/").await;
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(r.header(limit), Some("2"));
        assert_eq!(r.header(left), Some("0"));
        assert_eq!(r.header(reset), Some("45"));
        assert_eq!(r.header(retry), Some("45"));
        assert!(
            r.body.contains(r#""violated":["fixed_window:2/min"]"#),
            "{}",
            r.body
        );
        assert!(r.body.contains(r#""retry_after":45"#), "{}", r.body);
        let length: usize = r.header("content-length").unwrap().parse().unwrap();
        assert_eq!(length, r.body.len());

        // All those connections came from 127.0.0.1: one key.
        assert_eq!(store.len(), 1);
        assert_eq!(
            raw_get(addr, "/").await.status,
            429,
            "a new connection is the same client"
        );
        clock.advance(Duration::from_secs(45));
        let r = raw_get(addr, "/").await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body, "1");
    };
    // A safety net against a hung connection, not a wait.
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the server answered");
    server.abort();
}
