//! What reading the body costs (`scripts/bench.sh`, rows 13): a 1 KiB JSON-RPC call through
//! axum with a layer keyed on the call's method and tool, against the same router bare, the
//! same router whose handler parses the call (axum's `Json<Value>`), and serde_json's own
//! parse of that body; a 2 KiB GraphQL query's calculated cost
//! against apollo-parser's own parse of it.

use std::hint::black_box;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::post;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use tower::{Service, ServiceExt};
use tower_ratelimit::key::{self, PeerIp};
use tower_ratelimit::request_body::BodyLimits;
use tower_ratelimit::{Policy, RateLimitLayer};

/// A JSON-RPC `tools/call` of about 1 KiB, as an MCP client sends one.
fn jsonrpc_call() -> Bytes {
    let rows: Vec<String> = (0..17)
        .map(|i| format!(r#"{{"id":{i},"name":"row {i}","tags":["a","b"],"score":{i}.5}}"#))
        .collect();
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"search","arguments":{{"query":"rate limits","rows":[{}]}}}}}}"#,
        rows.join(",")
    );
    assert!((1000..1100).contains(&body.len()), "{}", body.len());
    Bytes::from(body)
}

/// A GraphQL query of about 2 KiB: connections, arguments, variables, fragments.
fn graphql_query() -> String {
    let mut query = String::from(
        "query Dashboard($n: Int = 20, $after: String) {\n  viewer {\n    login\n    name\n",
    );
    for i in 0..9 {
        query.push_str(&format!(
            "    repos{i}: repositories(first: $n, after: $after, orderBy: {{field: STARGAZERS, direction: DESC}}) {{\n      totalCount\n      nodes {{ ...Repo issues(last: 5) {{ nodes {{ title number }} }} }}\n    }}\n"
        ));
    }
    query.push_str(
        "  }\n}\nfragment Repo on Repository { name description stargazerCount forkCount url }\n",
    );
    assert!((1800..2300).contains(&query.len()), "{}", query.len());
    query
}

fn bodies(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let base = || Router::new().route("/mcp", post(|| async { "ok" }));
    // What a handler that parses the call itself costs: axum's `Json<Value>`, in the same
    // request, where the allocator and the caches are as the layer finds them.
    let parsing = Router::new().route(
        "/mcp",
        post(
            |axum::Json(call): axum::Json<serde_json::Value>| async move {
                black_box(call);
                "ok"
            },
        ),
    );
    let per_tool = Policy::gcra("1000000/s")
        .burst(1_000_000_000)
        .key(key::all((PeerIp::new(), key::jsonrpc())));
    let layer = RateLimitLayer::builder()
        .policy(per_tool)
        .read_bodies(BodyLimits::new())
        .build()
        .unwrap();
    let body = jsonrpc_call();
    let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 40_000));
    let mut group = c.benchmark_group("bodies");
    let routers = [
        ("bare", base()),
        ("bare_parsing", parsing),
        ("layer_jsonrpc", base().layer(layer)),
    ];
    for (name, mut router) in routers {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut request = http::Request::post("/mcp")
                    .header("content-type", "application/json")
                    .body(Body::from(body.clone()))
                    .unwrap();
                request.extensions_mut().insert(ConnectInfo(peer));
                rt.block_on(async {
                    let ready = ServiceExt::<http::Request<Body>>::ready(&mut router).await;
                    let response = ready.unwrap().call(request).await.unwrap();
                    assert!(response.status().is_success());
                    black_box(response)
                })
            })
        });
    }
    group.bench_function("serde_json", |b| {
        b.iter(|| black_box(serde_json::from_slice::<serde_json::Value>(black_box(&body)).unwrap()))
    });
    let query = graphql_query();
    assert_eq!(
        tower_ratelimit::graphql::query_cost(&query, None, None)
            .unwrap()
            .cost,
        // viewer, login, name; 9 × repositories: 1 + 20 × (totalCount + nodes: 1 + Repo's 5
        // + issues: 1 + 5 × (nodes, title, number)).
        3 + 9 * (1 + 20 * (1 + (1 + 5 + (1 + 5 * 3))))
    );
    group.bench_function("graphql_cost", |b| {
        b.iter(|| {
            black_box(tower_ratelimit::graphql::query_cost(
                black_box(&query),
                None,
                None,
            ))
        })
    });
    group.bench_function("graphql_parse", |b| {
        b.iter(|| {
            let tree = apollo_parser::Parser::new(black_box(&query))
                .recursion_limit(128)
                .token_limit(50_000)
                .parse();
            black_box(tree.errors().len())
        })
    });
    group.finish();
}

criterion_group!(benches, bodies);
criterion_main!(benches);
