//! A counting upstream on loopback for the outbound calls' tests (`tests/egress_demo.rs`,
//! `tests/egress_reqwest.rs`): when each call came, and the one it refused.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use tower_ratelimit::key::GlobalKey;
use tower_ratelimit::{Policy, RateLimitLayer};

/// What the upstream saw: each call's arrival, and the arrival of the one it refused.
#[derive(Clone, Default)]
pub struct Seen {
    pub arrivals: Arc<Mutex<Vec<Instant>>>,
    pub refused_at: Arc<Mutex<Option<Instant>>>,
}

/// An upstream on loopback: `limit` of its own when given (GCRA, holding a call that comes a
/// little early for up to 50 ms, as NGINX's `limit_req` with a delay does, rather than
/// refusing it for the network's jitter); its `refuse_nth` call answered `429` with `pause`.
pub async fn upstream(limit: Option<&str>, refuse_nth: usize, pause: HeaderMap) -> (String, Seen) {
    let seen = Seen::default();
    let handler = {
        let seen = seen.clone();
        move || {
            let (seen, pause) = (seen.clone(), pause.clone());
            async move {
                let now = Instant::now();
                let nth = {
                    let mut arrivals = seen.arrivals.lock().unwrap();
                    arrivals.push(now);
                    arrivals.len()
                };
                if nth == refuse_nth {
                    *seen.refused_at.lock().unwrap() = Some(now);
                    return (StatusCode::TOO_MANY_REQUESTS, pause, "slow down");
                }
                (StatusCode::OK, HeaderMap::new(), "ok")
            }
        }
    };
    let mut app = Router::new().route("/", get(handler));
    if let Some(limit) = limit {
        let policy = Policy::gcra(limit).wait_up_to(Duration::from_millis(50));
        let layer = RateLimitLayer::builder().key(GlobalKey).policy(policy);
        app = app.layer(layer.build().unwrap());
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}
