//! Policies from a TOML file (feature `serde`): the reload guide's example builds the layer it
//! describes, mistakes are reported at their line with the field, and a changed file reloads
//! a running layer keeping every key's usage.
#![cfg(feature = "toml")]

mod support;

use http::{Method, Request, StatusCode};
use support::http::{Seen, inner, send};
use tower::Layer;
use tower_ratelimit::config::Limits;
use tower_ratelimit::key::Key;
use tower_ratelimit::{ManualClock, MemoryStore, RateLimitLayer};

/// The reload guide's example file.
const EXAMPLE: &str = include_str!("../examples/limits.toml");

fn read(text: &str) -> Result<Limits, String> {
    Limits::from_toml(text).map_err(|e| e.to_string())
}

#[test]
fn the_readme_example_reads_and_builds() {
    let limits = read(EXAMPLE).unwrap();
    let layer = RateLimitLayer::builder()
        .policies(limits.policies().unwrap())
        .build()
        .unwrap();
    assert_eq!(
        layer.policy_names(),
        ["per-ip", "failed-logins", "reports", "exports", "hourly"]
    );
}

#[test]
fn the_reload_guide_shows_the_example_file() {
    let guide = include_str!("../src/guide/reload.md");
    let body = EXAMPLE.split_once("\n\n").map(|(_, rest)| rest).unwrap();
    assert!(
        guide.contains(body),
        "the reload guide shows examples/limits.toml"
    );
}

#[test]
fn mistakes_name_the_line_and_the_field() {
    let cases = [
        (
            "[[policy]]\nname = \"a\"\nquota = \"10/fortnight\"\n",
            &["line 3 (quota): ", "unit"][..],
        ),
        (
            "[[policy]]\nname = \"a\"\nquota = \"10/s\"\nbrust = 3\n",
            &["line 4 (brust): ", "unknown field `brust`"],
        ),
        (
            "[[policy]]\nquota = \"10/s\"\n\n[[policy]]\nname = \"b\"\nalgorithm = \"fixed_window\"\nquota = \"10/s\"\nburst = 3\n",
            &["line 4: policy #2: ", "fixed_window has no burst"],
        ),
        (
            "[[policy]]\nname = \"c\"\nconcurrency = 2\nquota = \"1/s\"\n",
            &["line 1: policy #1: ", "concurrency policy takes no quota"],
        ),
        (
            "[[policy]]\nname = \"d\"\nquota = \"10/s\"\nwait = \"forever\"\n",
            &["line 4 (wait): ", "not a duration"],
        ),
        (
            "[[policy]]\nname = \"e\"\nquota = \"10/s\"\nroutes = [\"items\"]\n",
            &["line 4 (routes): ", "not a route"],
        ),
        (
            "[[policy]]\nname = \"f\"\nquota = \"10/s\"\nkey = \"cookie\"\n",
            &["line 4 (key): ", "unknown key"],
        ),
        (
            "[[policy]]\nname = \"g\"\nquota = \"10/s\"\nsettle_body = \"lines\"\n",
            &["line 4 (settle_body): ", "expected bytes"],
        ),
        (
            "[[policy]]\nname = \"h\"\nquota = \"10/s\"\nsettle_body = \"bytes\"\nsettle_header = \"x-used\"\n",
            &["line 1: policy #1: ", "from one place"],
        ),
        (
            "[[policy]]\nname = \"i\"\nquota = \"10/s\"\nsettle_at_most = 3\n",
            &["line 1: policy #1: ", "settle_at_most"],
        ),
        (
            "[[policy]]\nname = \"j\"\nquota = \"10/s\"\nsettle_header = \"x-used\"\nshadow = true\n",
            &["line 1: policy #1: ", "settles its cost"],
        ),
        (
            "[[policy]]\nname = \"k\"\nquota = \"10/day\"\ntime_zone = \"Mars/Olympus\"\n",
            &["line 4 (time_zone): ", "unknown time zone"],
        ),
        (
            "[[policy]]\nname = \"l\"\nquota = \"10/week\"\nweek_starts = \"someday\"\n",
            &["line 4 (week_starts): ", "not a day of the week"],
        ),
        (
            "[[policy]]\nname = \"m\"\nquota = \"10/month\"\nmonth_starts = 40\n",
            &["line 1: policy #1: ", "1 to 31"],
        ),
        ("key = \"ip\"\n", &["missing field `policy`"]),
    ];
    for (text, wanted) in cases {
        let err = read(text).unwrap_err();
        for w in wanted {
            assert!(err.contains(w), "{text:?}: {err:?} lacks {w:?}");
        }
    }
}

/// A policy per route, a tier from a header, statuses that charge: what the file says is what
/// the layer does.
#[tokio::test]
async fn a_file_configures_routes_tiers_and_statuses() {
    let limits = read(
        r#"
key = "global"

[[policy]]
name = "reports"
algorithm = "fixed_window"
quota = "1/min"
routes = ["GET /reports"]
tiers = { pro = "3/min" }
tier_header = "x-plan"
"#,
    )
    .unwrap();
    let layer = RateLimitLayer::builder()
        .policies(limits.policies().unwrap())
        .build()
        .unwrap();
    let seen = Seen::default();
    let service = layer.layer(inner(&seen));
    let get = |path: &str, plan: Option<&str>| {
        let mut r = Request::builder().method(Method::GET).uri(path);
        if let Some(plan) = plan {
            r = r.header("x-plan", plan);
        }
        r.body(()).unwrap()
    };
    assert_eq!(
        send(&service, get("/reports", None)).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&service, get("/reports", None)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        assert_eq!(
            send(&service, get("/reports", Some("pro"))).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        send(&service, get("/reports", Some("pro"))).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another route: no policy applies.
    assert_eq!(
        send(&service, get("/items", None)).await.status,
        StatusCode::OK
    );
}

/// Tokens per minute from a file (their unit `tokens`): admitted on the file's cost, settled
/// at the response's header.
#[tokio::test]
async fn a_file_configures_a_cost_settled_after_the_response() {
    let limits = read(
        r#"
key = "global"

[[policy]]
name = "tokens"
algorithm = "token_bucket"
quota = "1000/min"
cost = 100
unit = "tokens"
settle_header = "x-tokens"
settle_at_most = 2
"#,
    )
    .unwrap();
    let layer = RateLimitLayer::builder()
        .policies(limits.policies().unwrap())
        .build()
        .unwrap();
    let app = tower::service_fn(|_: Request<()>| async {
        let response = http::Response::builder()
            .header("x-tokens", "40")
            .body(String::new())
            .unwrap();
        Ok::<_, std::convert::Infallible>(response)
    });
    let service = layer.layer(app);
    let response = tower::ServiceExt::oneshot(service, Request::new(()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let left = layer
        .control()
        .peek(&Key::global())
        .await
        .unwrap()
        .outcomes()[0]
        .remaining();
    assert_eq!(left, 960, "settled at 40, not the file's 100");
}

/// A calendar quota from a file: a month from the 15th in Kolkata, counted to its end.
#[tokio::test]
async fn a_file_configures_a_calendar_quota() {
    let limits = read(
        r#"
key = "global"

[[policy]]
name = "plan"
algorithm = "fixed_window"
quota = "1000/month"
time_zone = "Asia/Kolkata"
month_starts = 15
"#,
    )
    .unwrap();
    // 2026-11-14 18:30 UTC is midnight on the 15th in Kolkata: a minute before it.
    let clock = ManualClock::starting_at(1_794_681_000_000_000 - 60_000_000);
    let layer = RateLimitLayer::builder()
        .store(tower_ratelimit::MemoryStore::with_clock(clock))
        .policies(limits.policies().unwrap())
        .build()
        .unwrap();
    let decision = layer.check(&Key::global(), 1).await.unwrap();
    let outcome = &decision.outcomes()[0];
    assert_eq!(outcome.reset_after(), std::time::Duration::from_secs(60));
    assert_eq!(outcome.limit(), 1000);
}

/// The file changes (a raised quota): reloading the layer with it keeps what keys used.
#[tokio::test]
async fn a_changed_file_reloads_the_layer_keeping_usage() {
    let clock = ManualClock::new();
    let file = |quota: &str| {
        read(&format!("key = \"global\"\n[[policy]]\nname = \"api\"\nalgorithm = \"sliding_window\"\nquota = \"{quota}\"\n")).unwrap()
    };
    let layer = RateLimitLayer::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .policies(file("10/min").policies().unwrap())
        .build()
        .unwrap();
    let key = Key::from("anyone");
    for _ in 0..5 {
        assert!(layer.check(&key, 1).await.unwrap().is_allowed());
    }
    let report = layer
        .control()
        .reload(file("20/min").policies().unwrap())
        .unwrap();
    assert_eq!(
        report.to_string(),
        r#"changed "api": sliding_window 10/min -> sliding_window 20/min; 0 unchanged"#
    );
    assert_eq!(
        layer
            .control()
            .peek(&key)
            .await
            .unwrap()
            .tightest()
            .remaining(),
        15
    );
}

/// Keys and costs of the body from a file: a policy per client and tool (`ip+jsonrpc`) and
/// one costing the body's `/max_tokens`; a pointer that is none is reported at its line, and
/// a file of body policies needs a layer that reads bodies.
#[tokio::test]
async fn a_file_configures_keys_and_costs_of_the_body() {
    use tower_ratelimit::request_body::BodyLimits;
    let limits = read(
        r#"
[[policy]]
name = "per-tool"
quota = "1/min"
key = "header:x-client+jsonrpc"

[[policy]]
name = "tokens"
algorithm = "fixed_window"
quota = "100/min"
key = "header:x-client"
cost = "json:/max_tokens"
"#,
    )
    .unwrap();
    let layer = RateLimitLayer::builder()
        .policies(limits.policies().unwrap())
        .read_bodies(BodyLimits::new())
        .build()
        .unwrap();
    let app = tower::service_fn(|_: Request<_>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    });
    let service = layer.layer(app);
    let call = |tool: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}"}},"max_tokens":60}}"#
        );
        Request::post("/mcp")
            .header("x-client", "a")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    assert_eq!(send(&service, call("search")).await.status, StatusCode::OK);
    // Another tool: its own key of the first policy, but the tokens are shared: 120 > 100.
    let reply = send(&service, call("fetch")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(reply.body.contains("\"tokens\""), "{}", reply.body);
    assert_eq!(
        layer
            .control()
            .peek(&Key::from("a"))
            .await
            .unwrap()
            .outcomes()[1]
            .remaining(),
        40
    );
    let err = read("[[policy]]\nquota = \"1/s\"\ncost = \"json:max_tokens\"\n").unwrap_err();
    assert!(
        err.contains("line 3 (cost)") && err.contains("not a JSON pointer"),
        "{err}"
    );
    let err = read("[[policy]]\nquota = \"1/s\"\nkey = \"ip+json:x\"\n").unwrap_err();
    assert!(
        err.contains("line 3 (key)") && err.contains("not a JSON pointer"),
        "{err}"
    );
    let unread = RateLimitLayer::builder()
        .policies(limits.policies().unwrap())
        .build();
    assert!(unread.unwrap_err().to_string().contains("read_bodies"));
}

/// The body guide's file reads, and builds on a layer that reads bodies.
#[test]
fn the_body_guides_file_reads_and_builds() {
    let guide = include_str!("../src/guide/body.md");
    let start = guide.find("```toml\n").unwrap() + "```toml\n".len();
    let text = &guide[start..start + guide[start..].find("```").unwrap()];
    let limits = read(text).unwrap();
    RateLimitLayer::builder()
        .policies(limits.policies().unwrap())
        .read_bodies(tower_ratelimit::request_body::BodyLimits::new())
        .build()
        .unwrap();
}
