//! The demo server's body contract (`BODY_KEY`, `BODY_COST`, `JSONRPC`, `BODY_LIMIT`; the
//! routes `/echo`, `/mcp`), checked from outside: in memory, on two servers sharing one
//! Redis, and on two sharing a cluster.

#[macro_use]
mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::demo::{DemoServer, post, start_error};

/// A JSON-RPC tool call.
fn tool(id: u64, name: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name}})
}

/// `body` posted to `/mcp` of `server`: the status and the body.
fn mcp(server: &DemoServer, body: &Value) -> (u16, String) {
    post(
        server.addr,
        "/mcp",
        &[("content-type", "application/json")],
        &body.to_string(),
    )
}

/// An MCP client's calls through `a` and `b` (the same server, or two sharing a store) with
/// `JSONRPC=true RATE_LIMIT=2/min`: per client and tool; a batch all or none, naming the call
/// over; costs from `BODY_COST` through `/llm`'s requests.
fn tools_and_batches(a: &DemoServer, b: &DemoServer) {
    assert!(a.first_line.contains("JSONRPC=true"), "{}", a.first_line);
    assert_eq!(mcp(a, &tool(1, "search")).0, 200);
    let (status, body) = mcp(b, &tool(2, "search"));
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["result"]["tool"], "search", "{answer}");
    assert_eq!(mcp(a, &tool(3, "search")).0, 429);
    assert_eq!(mcp(b, &tool(4, "fetch")).0, 200);
    // The search is over: the batch is denied, its fetch not charged.
    let (status, body) = mcp(a, &json!([tool(5, "fetch"), tool(6, "search")]));
    assert_eq!(status, 429, "{body}");
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        problem["calls"],
        json!([{"index": 1, "id": 6, "policies": ["gcra:2/min:body"]}])
    );
    let (status, body) = mcp(b, &json!([tool(7, "fetch"), tool(8, "list")]));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        mcp(a, &tool(9, "fetch")).0,
        429,
        "fetch spent its 2 in the batches"
    );
    // No free pass and no unbounded batch: `[]` is refused, 33 calls are over BATCH_CALLS.
    let (status, problem) = mcp(b, &json!([]));
    assert_eq!(status, 400, "{problem}");
    assert!(problem.contains("\"batch_empty\""), "{problem}");
    let many: Vec<Value> = (0..33).map(|i| tool(i, "ping")).collect();
    let (status, problem) = mcp(a, &Value::Array(many));
    assert_eq!(status, 413, "{problem}");
    assert!(problem.contains("\"batch_too_large\""), "{problem}");
}

/// `/echo` through `a` and `b` with `BODY_KEY=/user BODY_COST=/n RATE_LIMIT=10/min`: the body
/// answered as it came; each user charged what its bodies say, across both.
fn keys_and_costs(a: &DemoServer, b: &DemoServer) {
    let echo = |s: &DemoServer, body: &str| post(s.addr, "/echo", &[], body);
    let body = r#"{"user": "ann", "n": 6,   "padding": "as it came"}"#;
    assert_eq!(echo(a, body), (200, body.to_owned()));
    assert_eq!(echo(b, r#"{"user": "ann", "n": 4}"#).0, 200);
    assert_eq!(echo(a, r#"{"user": "ann", "n": 1}"#).0, 429);
    assert_eq!(echo(b, r#"{"user": "bob", "n": 10}"#).0, 200);
    let (status, problem) = echo(a, r#"{"user": "cat", "n": -2}"#);
    assert_eq!(status, 400, "{problem}");
    assert!(
        problem.contains("\"bad_cost\"") && problem.contains("negative"),
        "{problem}"
    );
    let (status, problem) = echo(b, "not json");
    assert_eq!(status, 400);
    assert!(problem.contains("\"body_not_json\""), "{problem}");
    let (status, problem) = echo(
        a,
        &format!(r#"{{"user": "cat", "n": 1, "pad": "{}"}}"#, "x".repeat(300)),
    );
    assert_eq!(status, 413, "{problem}");
    assert!(problem.contains("\"body_too_large\""), "{problem}");
    assert_eq!(
        echo(b, r#"{"user": "cat", "n": 10}"#).0,
        200,
        "cat was charged nothing"
    );
    // A cost of 0 counts 1: cat is over.
    assert_eq!(echo(a, r#"{"user": "cat", "n": 0}"#).0, 429);
}

const KEYS_AND_COSTS: [(&str, &str); 5] = [
    ("BODY_KEY", "/user"),
    ("BODY_COST", "/n"),
    ("RATE_LIMIT", "10/min"),
    ("ALGORITHM", "fixed_window"),
    ("BODY_LIMIT", "256"),
];

#[test]
fn bad_body_variables_stop_the_server_naming_them() {
    for (name, value, says) in [
        (
            "BODY_KEY",
            "params/name",
            "BODY_KEY: \"params/name\" is not a JSON pointer",
        ),
        (
            "BODY_COST",
            "tokens",
            "BODY_COST: \"tokens\" is not a JSON pointer",
        ),
        (
            "JSONRPC",
            "yes",
            "JSONRPC: \"yes\" is neither true nor false",
        ),
        (
            "BODY_LIMIT",
            "0",
            "BODY_LIMIT: \"0\" is not a number of bytes",
        ),
        (
            "BODY_LIMIT",
            "64k",
            "BODY_LIMIT: \"64k\" is not a number of bytes",
        ),
        (
            "BATCH_CALLS",
            "0",
            "BATCH_CALLS: \"0\" is not a number from 1",
        ),
        (
            "BATCH_KEYS",
            "many",
            "BATCH_KEYS: \"many\" is not a number from 1",
        ),
        (
            "MIN_BODY_COST",
            "-1",
            "MIN_BODY_COST: \"-1\" is not a whole number",
        ),
    ] {
        let err = start_error(&[(name, value)]);
        assert!(err.contains(says), "{name}={value}: {err}");
    }
    let both = start_error(&[("BODY_COST", "/n"), ("GRAPHQL_COST", "true")]);
    assert!(both.contains("BODY_COST and GRAPHQL_COST"), "{both}");
    let err = start_error(&[("CONFIG", "examples/limits.toml"), ("JSONRPC", "true")]);
    assert!(err.contains("JSONRPC cannot be set with it"), "{err}");
}

/// A body variable limits the routes with bodies (`POST /echo`, `/mcp`, `/graphql`) only:
/// `GET /` and the WebSocket upgrade keep the plain policies of `RATE_LIMIT` (one of 3/min:
/// the upgrade, two `GET /`, then 429 for both), and a body route is counted apart from them.
#[test]
fn body_variables_leave_the_other_routes_alone() {
    for body in [
        ("JSONRPC", "true"),
        ("BODY_COST", "/n"),
        ("BODY_KEY", "/user"),
        ("GRAPHQL_COST", "true"),
    ] {
        let server = DemoServer::start(&[body, ("RATE_LIMIT", "3/min")]);
        let upgrade = || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                match support::ws::try_connect(server.addr, "k").await {
                    Ok(_) => 101,
                    Err(refused) => refused.status().as_u16(),
                }
            })
        };
        let mut statuses = vec![upgrade()];
        statuses.extend((0..3).map(|_| server.get("/", &[]).0));
        statuses.push(upgrade());
        assert_eq!(statuses, [101, 200, 200, 429, 429], "{body:?}");
        let (status, response) = server.get("/health", &[]);
        assert_eq!(status, 200, "{body:?}: {response}");
        let (status, answer) = match body.0 {
            "JSONRPC" => mcp(&server, &tool(1, "search")),
            "GRAPHQL_COST" => post(
                server.addr,
                "/graphql",
                &[("content-type", "application/json")],
                r#"{"query": "{ a }"}"#,
            ),
            _ => post(server.addr, "/echo", &[], r#"{"user": "ann", "n": 1}"#),
        };
        assert_eq!(
            status, 200,
            "{body:?}: a body route has policies of its own: {answer}"
        );
        let (_, problem) = post(server.addr, "/echo", &[], "not json");
        if body.0 != "GRAPHQL_COST" {
            assert!(problem.contains("body_not_json"), "{body:?}: {problem}");
        }
    }
}

/// X-RateLimit-Remaining of a whole response.
fn remaining(response: &str) -> u64 {
    let line = (response.lines())
        .find(|l| l.to_ascii_lowercase().starts_with("x-ratelimit-remaining:"))
        .unwrap_or_else(|| panic!("no X-RateLimit-Remaining in {response}"));
    line.split(':').nth(1).unwrap().trim().parse().unwrap()
}

/// `/llm` through `a` and `b` with `COST_BODY=json:/usage/total_tokens RATE_LIMIT=100/h`:
/// each call admitted on 1, then settled at the usage its JSON or its last event reports.
fn usage_settled(a: &DemoServer, b: &DemoServer) {
    let (status, body) = support::demo::fetch(a.addr, "/llm?tokens=30", &[]);
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"usage":{"total_tokens":30}}"#)
    );
    // A look that costs nothing once settled (1, then 0) sees what the other settled.
    let settled_to = |server: &DemoServer, left: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let (_, response) = server.get("/llm?tokens=0", &[]);
            if remaining(&response) == left {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never {left} left: {response}"
            );
        }
    };
    settled_to(b, 100 - 30 - 1);
    let (status, body) = support::demo::fetch(b.addr, "/llm?tokens=25&stream=true", &[]);
    assert_eq!(status, 200);
    assert!(
        body.ends_with("data: {\"usage\":{\"total_tokens\":25}}\n\n"),
        "{body}"
    );
    settled_to(a, 100 - 30 - 25 - 1);
}

const USAGE: [(&str, &str); 3] = [
    ("COST_BODY", "json:/usage/total_tokens"),
    ("RATE_LIMIT", "100/h"),
    ("ALGORITHM", "fixed_window"),
];

/// `/graphql` through `a` and `b` with `GRAPHQL_COST=true GRAPHQL_MAX_DEPTH=4
/// RATE_LIMIT=100/min`: each query charged its calculated cost across both; too deep or
/// broken, 400 and charged 1 (a refused body is charged its floor).
fn graphql_costs(a: &DemoServer, b: &DemoServer) {
    assert!(
        a.first_line.contains("GRAPHQL_MAX_DEPTH=4"),
        "{}",
        a.first_line
    );
    let query = |s: &DemoServer, q: &str| {
        let body = json!({ "query": q }).to_string();
        post(
            s.addr,
            "/graphql",
            &[("content-type", "application/json")],
            &body,
        )
    };
    let issue = "{ viewer { repositories(first: 10) { nodes { name stars } } } }";
    assert_eq!(query(a, issue), (200, r#"{"data":null}"#.to_owned()));
    let (status, problem) = query(b, "{ a { b { c { d { e } } } } }");
    assert_eq!(status, 400);
    assert!(
        problem.contains("\"graphql_too_deep\"") && problem.contains("5 fields deep"),
        "{problem}"
    );
    let (status, problem) = query(a, "{ a(first: ) }");
    assert_eq!(status, 400);
    assert!(problem.contains("\"bad_graphql\""), "{problem}");
    assert_eq!(
        query(b, "{ a(first: 65) { b } }").0,
        200,
        "66 more: 100 spent, 2 of them by the refused queries"
    );
    assert_eq!(query(a, "{ a }").0, 429);
}

/// A `POST` to `path` of `server` whose head says 65,000 bytes and whose body stops after a
/// few: the status, read within 5 s (the body's deadline is 10 s).
fn unfinished(server: &DemoServer, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n\
         content-length: 65000\r\n\r\n{{\"query\": \""
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut response = [0u8; 12];
    stream
        .read_exact(&mut response)
        .expect("answered before the body's deadline");
    std::str::from_utf8(&response[9..12])
        .unwrap()
        .parse()
        .unwrap()
}

/// `GRAPHQL_COST=true GRAPHQL_MAX_DEPTH=2 RATE_LIMIT=1/min` through `a` and `b`: a flood of
/// too-deep queries meets `429` after the first (each refused query is charged), and the
/// client's next body, unfinished, is answered `429` without waiting for it.
fn refused_and_unfinished(a: &DemoServer, b: &DemoServer) {
    let deep = json!({"query": "{ a { b { c } } }"}).to_string();
    let json = [("content-type", "application/json")];
    let seen: Vec<u16> = (0..6)
        .map(|i| post([a, b][i % 2].addr, "/graphql", &json, &deep).0)
        .collect();
    assert_eq!(seen, [400, 429, 429, 429, 429, 429]);
    assert_eq!(unfinished(b, "/graphql"), 429);
    assert_eq!(unfinished(a, "/graphql"), 429);
}

const REFUSED: [(&str, &str); 4] = [
    ("GRAPHQL_COST", "true"),
    ("GRAPHQL_MAX_DEPTH", "2"),
    ("RATE_LIMIT", "1/min"),
    ("ALGORITHM", "fixed_window"),
];

on_each_demo_store!(
    refused_and_unfinished,
    REFUSED,
    "refused:",
    refused_and_unfinished_bodies_in_memory,
    refused_and_unfinished_bodies_on_two_servers_of_one_redis,
    refused_and_unfinished_bodies_on_two_servers_of_a_cluster
);

/// `DENY=127.0.0.1 BODY_COST=/n`: a denied client gets `403` before its body is read,
/// whatever the body.
#[test]
fn a_denied_client_is_answered_before_its_body() {
    let server = DemoServer::start(&[("DENY", "127.0.0.1"), ("BODY_COST", "/n")]);
    for body in ["not json", r#"{"n": 1}"#, ""] {
        let (status, problem) = post(server.addr, "/echo", &[], body);
        assert_eq!(status, 403, "{problem}");
    }
    assert_eq!(unfinished(&server, "/echo"), 403);
}

/// `BODY_READING_PER_KEY=2 BODY_COST=/n`: with two bodies of a client being read, its next
/// request with a body gets `429` `bodies_in_flight` at once; once they end, it is read.
#[test]
fn a_clients_bodies_read_at_once_are_bounded() {
    use std::io::Write;
    let server = DemoServer::start(&[
        ("BODY_READING_PER_KEY", "2"),
        ("BODY_COST", "/n"),
        ("RATE_LIMIT", "1000/min"),
    ]);
    let held: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
            let head = "POST /echo HTTP/1.1\r\nHost: localhost\r\n\
                        content-length: 65000\r\n\r\n{\"n\": ";
            stream.write_all(head.as_bytes()).unwrap();
            stream
        })
        .collect();
    // The held heads reach the server in their own time: ask until they are seen (within
    // the bodies' deadline of 10 s).
    let refused = (0..300).find_map(|_| {
        let (status, problem) = post(server.addr, "/echo", &[], r#"{"n": 1}"#);
        std::thread::sleep(Duration::from_millis(20));
        (status == 429).then_some(problem)
    });
    let problem = refused.expect("a third body of the client is refused while two are read");
    assert!(problem.contains("bodies_in_flight"), "{problem}");
    drop(held);
    let passed = (0..200).any(|_| post(server.addr, "/echo", &[], r#"{"n": 1}"#).0 == 200);
    assert!(passed, "read again once the held bodies ended");
}

const GRAPHQL: [(&str, &str); 4] = [
    ("GRAPHQL_COST", "true"),
    ("GRAPHQL_MAX_DEPTH", "4"),
    ("RATE_LIMIT", "100/min"),
    ("ALGORITHM", "fixed_window"),
];

const TOOLS: [(&str, &str); 2] = [("JSONRPC", "true"), ("RATE_LIMIT", "2/min")];

on_each_demo_store!(
    tools_and_batches,
    TOOLS,
    "mcp:",
    mcp_tools_and_batches_in_memory,
    mcp_tools_and_batches_on_two_servers_of_one_redis,
    mcp_tools_and_batches_on_two_servers_of_a_cluster
);

on_each_demo_store!(
    keys_and_costs,
    KEYS_AND_COSTS,
    "bk:",
    body_keys_and_costs_in_memory,
    body_keys_and_costs_on_two_servers_of_one_redis,
    body_keys_and_costs_on_two_servers_of_a_cluster
);

on_each_demo_store!(
    usage_settled,
    USAGE,
    "use:",
    usage_settled_from_the_response_in_memory,
    usage_settled_from_the_response_on_two_servers_of_one_redis,
    usage_settled_from_the_response_on_two_servers_of_a_cluster
);

on_each_demo_store!(
    graphql_costs,
    GRAPHQL,
    "gql:",
    graphql_costs_in_memory,
    graphql_costs_on_two_servers_of_one_redis,
    graphql_costs_on_two_servers_of_a_cluster
);
