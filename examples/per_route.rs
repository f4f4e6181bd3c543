//! A whole API's limits as one table: a general limit per client, a strict limit on failed
//! logins, and per-plan limits for authenticated users, in one layer.
//!
//! ```text
//! cargo run --example per_route
//! curl -i localhost:3000/items                                   # general limit
//! curl -i -X POST localhost:3000/login -H 'x-password: wrong'    # 401, counted
//! curl -i localhost:3000/reports -H 'x-user: alice' -H 'x-plan: pro'
//! ```

use std::net::SocketAddr;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tower_ratelimit::headers::HeaderStyle;
use tower_ratelimit::key::{self, Key, KeyRejection, PeerIp};
use tower_ratelimit::{Policy, RateLimitLayer};

/// The user's plan, as an authentication layer would record it.
#[derive(Clone, Copy, Debug)]
enum Plan {
    Free,
    Pro,
}

/// The authenticated user.
#[derive(Clone, Debug)]
struct User(String);

/// A stand-in for real authentication: trusts `x-user` and `x-plan` headers.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    let user = headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let plan = match headers.get("x-plan").map(|v| v.as_bytes()) {
        Some(b"pro") => Plan::Pro,
        _ => Plan::Free,
    };
    if let Some(user) = user {
        request.extensions_mut().insert(User(user));
        request.extensions_mut().insert(plan);
    }
    next.run(request).await
}

async fn login(headers: HeaderMap) -> StatusCode {
    match headers.get("x-password") {
        Some(p) if p == "letmein" => StatusCode::OK,
        _ => StatusCode::UNAUTHORIZED,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let user_key = key::from_fn(|req| {
        req.extensions()
            .get::<User>()
            .map(|u| Key::from(u.0.as_str()))
            .ok_or_else(|| KeyRejection::new(StatusCode::UNAUTHORIZED, "no_user", "log in first"))
    });
    let limits = RateLimitLayer::builder()
        .key(PeerIp::new())
        // Every route: 20 requests per second per client IP, bursts of 40.
        .policy(Policy::gcra("20/s").burst(40).name("per-ip"))
        // POST /login: 5 failed attempts per 15 minutes per client IP; successes are free.
        .policy(
            Policy::sliding_log("5/15min")
                .name("failed-logins")
                .route(Some(Method::POST), "/login")
                .charge_if(|status| status == StatusCode::UNAUTHORIZED),
        )
        // /reports/*: per user, 100 per hour on the free plan, 10,000 on pro.
        .policy(
            Policy::token_bucket("100/h")
                .name("reports")
                .path("/reports")
                .key(user_key)
                .tier("pro", "10000/h")
                .select_tier(|req| match req.extensions().get::<Plan>() {
                    Some(Plan::Pro) => Some("pro".to_owned()),
                    _ => None,
                }),
        )
        // A new limit, rolled out in shadow mode: reported, never enforced.
        .policy(Policy::fixed_window("1000/h").name("hourly").shadow())
        .headers(HeaderStyle::Both)
        .build()?;

    let app = Router::new()
        .route("/items", get(|| async { "items\n" }))
        .route("/login", post(login))
        .route("/reports", get(|| async { "reports\n" }))
        .layer(limits)
        // Outermost: authentication runs before the limiter sees the request.
        .layer(middleware::from_fn(authenticate));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
