//! The demo server end to end, over real HTTP and real time: in memory, and two instances
//! sharing one real redis-server, which must enforce one global limit per client.

mod support;

use support::RedisServer;
use support::demo::{DemoServer, fetch, request, start_error};

#[test]
fn in_memory_server_limits_per_client_with_every_algorithm() {
    for algorithm in [
        "gcra",
        "token_bucket",
        "leaky_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        // A quota per hour: real time cannot refill it during the test.
        let server = DemoServer::start(&[("ALGORITHM", algorithm), ("RATE_LIMIT", "3/h")]);
        assert!(
            server
                .first_line
                .contains(&format!("algorithm={algorithm}"))
        );
        let statuses: Vec<u16> = (0..5).map(|_| server.get("/", &[]).0).collect();
        assert_eq!(statuses, [200, 200, 200, 429, 429], "{algorithm}");
        let (_, limited) = server.get("/", &[]);
        assert!(limited.contains("retry-after: "), "{limited}");
        assert!(limited.contains("x-ratelimit-remaining: 0"), "{limited}");
        assert!(limited.contains("application/problem+json"), "{limited}");
        // /health is never limited.
        assert_eq!(server.get("/health", &[]).0, 200);
    }
}

#[test]
fn bad_configuration_stops_the_server_with_the_variable_named() {
    for (name, value, expect) in [
        ("ALGORITHM", "nope", "ALGORITHM:"),
        ("RATE_LIMIT", "0/s", "RATE_LIMIT:"),
        ("RATE_LIMIT", "ten per second", "RATE_LIMIT:"),
        ("KEY", "cookie", "KEY:"),
        ("BIND", "localhost", "BIND:"),
        ("ADMIN_BIND", "nowhere", "ADMIN_BIND:"),
        ("ON_STORE_ERROR", "maybe", "ON_STORE_ERROR:"),
        ("STORE_TIMEOUT_MS", "0", "STORE_TIMEOUT_MS:"),
        ("LEASE", "5", "LEASE:"),
        ("LEASE", "none", "LEASE:"),
        ("WAIT_MS", "0", "WAIT_MS:"),
        ("WAIT_MS", "soon", "WAIT_MS:"),
        ("CONCURRENCY", "0", "CONCURRENCY:"),
        ("CONCURRENCY", "many", "CONCURRENCY:"),
        ("PER_THREAD_READS", "maybe", "PER_THREAD_READS:"),
        ("COST_HEADER", "no such name", "COST_HEADER:"),
        ("COST_BODY", "tokens", "COST_BODY:"),
        ("TIME_ZONE", "Mars/Olympus", "TIME_ZONE:"),
        ("WEEK_STARTS", "someday", "WEEK_STARTS:"),
        ("MONTH_STARTS", "32", "MONTH_STARTS:"),
        ("POLICY_NAME", "no spaces", "POLICY_NAME:"),
        ("HEADER_TIMEOUT_MS", "0", "HEADER_TIMEOUT_MS:"),
        ("HEADER_TIMEOUT_MS", "soon", "HEADER_TIMEOUT_MS:"),
        ("ADMIN_TOKEN", "too short", "ADMIN_TOKEN:"),
    ] {
        let err = start_error(&[(name, value)]);
        assert!(
            err.starts_with(&format!("error: {expect}")),
            "{name}={value}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    // A mistake found by the layer's checks names the variable at fault, not RATE_LIMIT.
    for (env, expect) in [
        (
            &[
                ("WORK_CAPACITY", "4"),
                ("ADAPTIVE", "aimd"),
                ("ADAPTIVE_MIN", "2000"),
            ][..],
            "ADAPTIVE_MIN:",
        ),
        (
            &[
                ("WORK_CAPACITY", "4"),
                ("ADAPTIVE", "aimd"),
                ("ADAPTIVE_MAX", "2"),
            ][..],
            "ADAPTIVE_MAX:",
        ),
        (
            &[
                ("WORK_CAPACITY", "4"),
                ("ADAPTIVE", "gradient2"),
                ("ADAPTIVE_TIMEOUT_MS", "50"),
            ][..],
            "ADAPTIVE_TIMEOUT_MS:",
        ),
        (
            &[
                ("WORK_CAPACITY", "4"),
                ("ADAPTIVE", "aimd"),
                ("ADAPTIVE_TIMEOUT_MS", "0"),
            ][..],
            "ADAPTIVE_TIMEOUT_MS:",
        ),
        (
            &[("BLOCK_FOR", "10s"), ("WAIT_MS", "100")][..],
            "BLOCK_FOR:",
        ),
        (
            &[
                ("BLOCK_FOR", "10s"),
                ("PRIORITY_HEADER", "x-p"),
                ("RESERVE", "10"),
            ][..],
            "BLOCK_FOR:",
        ),
    ] {
        let err = start_error(env);
        assert!(
            err.starts_with(&format!("error: {expect}")),
            "{env:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    // An unreachable Redis does not stop it (tests/redis_availability.rs); a bad URL does.
    let err = start_error(&[("REDIS_URL", "nope://127.0.0.1:1")]);
    assert!(err.starts_with("error: REDIS_URL:"), "{err}");
    let redis_and_reads = [
        ("REDIS_URL", "redis://127.0.0.1:1"),
        ("PER_THREAD_READS", "true"),
    ];
    let err = start_error(&redis_and_reads);
    assert!(err.starts_with("error: PER_THREAD_READS:"), "{err}");
}

#[test]
fn in_memory_server_with_per_thread_reads_limits_per_client() {
    // `PER_THREAD_READS`: the memory store's shards with a reader lock per thread group; unset,
    // the layer chooses them for one GCRA policy (or two to four packed ones), one lock for the
    // others.
    for (algorithm, told, chosen) in [
        ("gcra", "", true),
        ("sliding_log", "", false),
        ("gcra", "false", false),
        ("sliding_log", "true", true),
    ] {
        let env = [
            ("ALGORITHM", algorithm),
            ("RATE_LIMIT", "3/h"),
            ("PER_THREAD_READS", told),
        ];
        let server = DemoServer::start(&env);
        let line = &server.first_line;
        assert!(
            line.contains(&format!("PER_THREAD_READS={chosen}")),
            "{line}"
        );
        let statuses: Vec<u16> = (0..5).map(|_| server.get("/", &[]).0).collect();
        assert_eq!(statuses, [200, 200, 200, 429, 429], "{algorithm} {told:?}");
    }
}

#[test]
fn two_servers_on_one_redis_share_one_limit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "5/h"),
        ("PREFIX", "e2e:"),
        // A generous deadline: on a loaded machine the default 50 ms could fail open.
        ("STORE_TIMEOUT_MS", "10000"),
    ];
    let a = DemoServer::start(&env);
    let b = DemoServer::start(&env);
    assert!(a.first_line.contains("store=redis"), "{}", a.first_line);
    let mut admitted = 0;
    for i in 0..12 {
        let server = if i % 2 == 0 { &a } else { &b };
        if server.get("/", &[]).0 == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "one global limit across both instances");
    let keys = redis.cli(&["--scan", "--pattern", "e2e:*"]);
    assert_eq!(keys, "e2e:gcra:5/h:{4:127.0.0.1}");
}

#[test]
fn two_servers_on_one_redis_settle_the_cost_a_response_reports() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "100/h"),
        ("PREFIX", "cost:"),
        ("COST_HEADER", "x-tokens"),
        ("STORE_TIMEOUT_MS", "10000"),
    ];
    let a = DemoServer::start(&env);
    let b = DemoServer::start(&env);
    let (status, body) = fetch(a.addr, "/spend?cost=30", &[]);
    assert_eq!((status, body.as_str()), (200, "spent 30\n"));
    let remaining = |response: &str| {
        let line = response
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("x-ratelimit-remaining:"))
            .unwrap_or_else(|| panic!("no X-RateLimit-Remaining in {response}"))
            .to_owned();
        line.split(':')
            .nth(1)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    // The other instance sees the settled 30, not the estimate of 1.
    let (_, response) = b.get("/", &[]);
    assert_eq!(remaining(&response), 69, "{response}");
    // A response that cost far more than is left: the key owes it, on both instances.
    assert_eq!(
        a.get("/spend?cost=150", &[]).0,
        200,
        "admitted on its estimate"
    );
    assert_eq!(b.get("/", &[]).0, 429, "in debt");
    assert_eq!(a.get("/", &[]).0, 429, "in debt");
    assert_eq!(a.get("/spend?cost=lots", &[]).0, 429, "still in debt");
}

/// `PUT /admin/limits/{policy}/{key}` on one of two servers sharing a Redis gives a key its
/// own limit, which the other obeys on its next request; `DELETE` ends it; bad parameters
/// get 400 naming them.
#[test]
fn an_admin_changes_one_keys_limit_on_every_instance() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "2/h"),
        ("POLICY_NAME", "api"),
        ("KEY", "header:x-api-key"),
        ("PREFIX", "e2eo:"),
        ("STORE_TIMEOUT_MS", "10000"),
        ("ADMIN_BIND", "127.0.0.1:0"),
    ];
    let (a, b) = (DemoServer::start(&env), DemoServer::start(&env));
    let acme = [("x-api-key", "acme")];
    for _ in 0..2 {
        assert_eq!(b.get("/", &acme).0, 200);
    }
    assert_eq!(b.get("/", &acme).0, 429);
    let admin = a.admin_addr();
    let (status, _) = request(admin, "PUT", "/admin/limits/api/acme?quota=4/h");
    assert_eq!(status, 204);
    let (status, response) = b.get("/", &acme);
    assert_eq!(status, 200, "the other instance obeys at once");
    assert!(response.contains("x-ratelimit-limit: 4"), "{response}");
    assert_eq!(b.get("/", &acme).0, 200);
    assert_eq!(b.get("/", &acme).0, 429, "4 used of 4");
    assert_eq!(b.get("/", &[("x-api-key", "other")]).0, 200);
    let (status, _) = request(admin, "DELETE", "/admin/limits/api/acme");
    assert_eq!(status, 204);
    let (status, response) = a.get("/", &acme);
    assert_eq!(status, 429);
    assert!(response.contains("x-ratelimit-limit: 2"), "{response}");
    for (path, parameter) in [
        ("/admin/limits/api/acme?quota=0/h", "quota"),
        ("/admin/limits/api/acme", "quota"),
        ("/admin/limits/api/acme?quota=5/h&until=soon", "until"),
        ("/admin/limits/nope/acme?quota=5/h", "policy"),
        ("/admin/limits/api/acme?quota=5/h&for=ever", "for"),
    ] {
        let (status, response) = request(admin, "PUT", path);
        assert_eq!(status, 400, "{path}: {response}");
        assert!(response.contains("application/problem+json"), "{response}");
        let name = format!("\"invalid-params\":[{{\"name\":\"{parameter}\"");
        assert!(response.contains(&name), "{path}: {response}");
    }
    // Never on the public address.
    assert_eq!(
        request(a.addr, "PUT", "/admin/limits/api/acme?quota=9/h").0,
        404
    );
}

/// `TIME_ZONE`: a day in Kolkata ends at its midnight, which `Retry-After` counts to; a
/// monthly `RATE_LIMIT` takes the fixed window without being told.
#[test]
fn a_calendar_day_ends_at_the_zones_midnight() {
    let tz = jiff::tz::TimeZone::get("Asia/Kolkata").unwrap();
    let to_midnight = || {
        let now = jiff::Timestamp::now().to_zoned_datetime(tz.clone());
        let next = now.date().tomorrow().unwrap().to_zoned_datetime(tz.clone());
        let us = next.unwrap().timestamp().as_microsecond() - now.timestamp().as_microsecond();
        us as u64 / 1_000_000
    };
    // Not within a minute of midnight there: wait for the next day then.
    if to_midnight() < 60 {
        std::thread::sleep(std::time::Duration::from_secs(to_midnight() + 1));
    }
    let server = DemoServer::start(&[("RATE_LIMIT", "2/day"), ("TIME_ZONE", "Asia/Kolkata")]);
    assert_eq!(server.get("/", &[]).0, 200);
    assert_eq!(server.get("/", &[]).0, 200);
    let expected = to_midnight();
    let (status, response) = server.get("/", &[]);
    assert_eq!(status, 429);
    let retry: u64 = response
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .expect("a Retry-After")
        .trim()
        .parse()
        .unwrap();
    assert!(
        retry <= expected + 1 && retry + 10 >= expected,
        "Retry-After {retry}, midnight in Kolkata in {expected} s"
    );
    let monthly = DemoServer::start(&[("RATE_LIMIT", "1/month")]);
    assert_eq!(monthly.get("/", &[]).0, 200);
    assert_eq!(monthly.get("/", &[]).0, 429);
}

#[test]
fn a_streamed_body_is_settled_at_the_bytes_it_sent() {
    let server = DemoServer::start(&[("RATE_LIMIT", "5000/h"), ("COST_BODY", "bytes")]);
    let (status, body) = fetch(server.addr, "/stream?bytes=3500", &[]);
    assert_eq!((status, body.len()), (200, 3500));
    let (status, body) = fetch(server.addr, "/stream?bytes=3000", &[]);
    assert_eq!(
        (status, body.len()),
        (200, 3000),
        "1,500 were left: admitted on 1"
    );
    assert_eq!(server.get("/", &[]).0, 429, "6,500 sent: 1,500 owed");
    assert_eq!(server.get("/stream?bytes=x", &[]).0, 429);
}

#[test]
fn two_servers_with_leases_share_one_limit_and_ask_redis_once_per_lease() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "20/h"),
        ("LEASE", "4"),
        ("PREFIX", "e2el:"),
        ("STORE_TIMEOUT_MS", "10000"),
    ];
    let a = DemoServer::start(&env);
    let b = DemoServer::start(&env);
    assert!(a.first_line.contains("LEASE=4"), "{}", a.first_line);
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let mut admitted = 0;
    for i in 0..30 {
        let server = if i % 2 == 0 { &a } else { &b };
        if server.get("/", &[]).0 == 200 {
            admitted += 1;
        }
    }
    // Each instance holds at most one lease of 4: at most 8 units of the 20 sit unspent.
    assert!((12..=20).contains(&admitted), "{admitted} admitted");
    // Requests admitted from a lease do not ask Redis: about one call per lease of 4 (each
    // instance's first request is decided by Redis alone and its first lease is of 2), plus
    // the calls of the denied requests.
    let stats = redis.cli(&["INFO", "commandstats"]);
    let calls: u64 = stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let denied = 30 - admitted;
    assert!(
        calls <= (admitted as u64).div_ceil(4) + 4 + denied as u64,
        "{calls} calls for {admitted} admitted and {denied} denied"
    );
}

/// `WAIT_MS`: two servers on one Redis, at 2 requests a second with waits of up to a second:
/// of requests sent together, the first two go on at once, the next two after waiting for
/// their times (500 ms apart, whichever server they reach), the rest get 429 at once.
#[test]
fn two_servers_with_waits_queue_on_one_schedule() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "2/s"),
        ("WAIT_MS", "1000"),
        ("PREFIX", "e2ew:"),
        ("STORE_TIMEOUT_MS", "10000"),
    ];
    let a = DemoServer::start(&env);
    let b = DemoServer::start(&env);
    assert!(a.first_line.contains("WAIT_MS=1000"), "{}", a.first_line);
    let started = std::time::Instant::now();
    let replies: Vec<(u16, std::time::Duration)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let server = if i % 2 == 0 { &a } else { &b };
                s.spawn(move || {
                    let (status, _) = server.get("/", &[]);
                    (status, started.elapsed())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok: Vec<_> = replies.iter().filter(|(s, _)| *s == 200).collect();
    let limited = replies.iter().filter(|(s, _)| *s == 429).count();
    // Six requests sent together: two at once, two waiting for the times 500 ms and a second
    // away, the rest rejected; on a slow machine, requests that arrive late may find a later
    // time within their wait, never fewer.
    assert!(ok.len() >= 4, "{replies:?}");
    assert_eq!(ok.len() + limited, 6, "{replies:?}");
    let waited = ok
        .iter()
        .filter(|(_, t)| *t >= std::time::Duration::from_millis(450))
        .count();
    assert!(
        waited >= 2,
        "two waited for their booked times: {replies:?}"
    );
}

/// `CONCURRENCY` on one server: while a `/slow` request is in flight, its slot is taken; once
/// it answers, the slot is free again.
#[test]
fn concurrency_holds_a_slot_while_a_slow_request_is_in_flight() {
    let server = DemoServer::start(&[
        ("CONCURRENCY", "1"),
        ("RATE_LIMIT", "1000000/s"),
        ("KEY", "global"),
    ]);
    assert!(
        server.first_line.contains("CONCURRENCY=1"),
        "{}",
        server.first_line
    );
    assert_eq!(server.get("/slow?ms=20000", &[]).0, 400, "at most 10 s");
    let (status, body) = std::thread::scope(|s| {
        loop {
            let slow = s.spawn(|| server.get("/slow?ms=1500", &[]));
            let started = std::time::Instant::now();
            // Until the slow request holds the slot; sent again when it came while one of
            // these looks held the slot, and was turned away.
            let mut taken = false;
            while !taken && !slow.is_finished() {
                taken = slot_taken(server.get("/", &[]));
                assert!(started.elapsed() < std::time::Duration::from_secs(10));
            }
            if !taken {
                let (status, _) = slow.join().unwrap();
                assert_eq!(status, 429, "turned away by a look holding the slot");
                continue;
            }
            let (_, limited) = server.get("/", &[]);
            assert!(
                !limited.contains("retry-after"),
                "no time is known: {limited}"
            );
            break slow.join().unwrap();
        }
    });
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("answered after 1500 ms"), "{body}");
    assert_eq!(server.get("/", &[]).0, 200, "the slot is free again");
}

/// `kill -9` of a server holding a concurrency slot on Redis: the other server sees the slot
/// taken until the slot's lease (`CONCURRENCY_MAX_MS`) ends, never before, then free.
#[test]
fn a_killed_servers_concurrency_slot_frees_after_max_duration() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("CONCURRENCY", "1"),
        ("CONCURRENCY_MAX_MS", "3000"),
        ("RATE_LIMIT", "1000000/s"),
        ("KEY", "global"),
        ("PREFIX", "e2ec:"),
        ("STORE_TIMEOUT_MS", "10000"),
    ];
    let mut a = DemoServer::start(&env);
    let b = DemoServer::start(&env);
    // A slow request to a takes the slot (sent again should one of b's own requests hold the
    // slot at that moment).
    let (sent, _in_flight) = 'taken: {
        for _ in 0..10 {
            let sent = std::time::Instant::now();
            let in_flight = a.send_only("/slow?ms=10000");
            while sent.elapsed() < std::time::Duration::from_secs(1) {
                if slot_taken(b.get("/", &[])) {
                    break 'taken (sent, in_flight);
                }
            }
        }
        panic!("a slow request to the first server never took the slot");
    };
    a.kill();
    // The slot was taken after `sent`, for 3 s: not free before then.
    loop {
        let (status, _) = b.get("/", &[]);
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(
            sent.elapsed() < std::time::Duration::from_secs(30),
            "the slot frees"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        sent.elapsed() >= std::time::Duration::from_millis(2_950),
        "freed after {:?}, before its lease ended",
        sent.elapsed()
    );
}

/// Whether a reply is the concurrency limit's 429 (not the rate policy's).
fn slot_taken((status, response): (u16, String)) -> bool {
    status == 429 && response.contains(r#""violated-policies":["concurrency:1"]"#)
}

/// A policy file in a fresh temporary directory: `write` replaces its text.
struct PolicyFile(std::path::PathBuf);

impl PolicyFile {
    fn new(name: &str, text: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("tower-ratelimit-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = PolicyFile(dir.join("limits.toml"));
        file.write(text);
        file
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.0, text).unwrap();
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for PolicyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

fn api(quota: &str) -> String {
    format!(
        "key = \"global\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nquota = \"{quota}\"\n"
    )
}

/// `CONFIG`: the server runs the file's policies and reloads it on a real `SIGHUP`, keeping
/// what was used; a file with a mistake is rejected with its line, and the old limits stay.
#[test]
fn a_policy_file_is_reloaded_on_sighup_keeping_usage() {
    let file = PolicyFile::new("sighup", &api("3/h"));
    let server = DemoServer::start(&[("CONFIG", file.path())]);
    assert!(
        server.first_line.contains("CONFIG=") && server.first_line.contains("(api;"),
        "{}",
        server.first_line
    );
    assert_eq!([server.get("/", &[]).0, server.get("/", &[]).0], [200, 200]);
    file.write(&api("5/h"));
    server.hangup();
    let reloaded = server.line_with("reloaded CONFIG");
    assert!(
        reloaded.contains(r#"changed "api": fixed_window 3/h -> fixed_window 5/h"#),
        "{reloaded}"
    );
    // 2 of the new 5 used: 3 more.
    let statuses: Vec<u16> = (0..4).map(|_| server.get("/", &[]).0).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);

    file.write(&api("5/fortnight"));
    server.hangup();
    let rejected = server.line_with("old limits stay");
    assert!(rejected.contains("line 6 (quota)"), "{rejected}");
    let (status, response) = server.get("/", &[]);
    assert_eq!(status, 429);
    assert!(response.contains("x-ratelimit-limit: 5"), "{response}");
}

/// Two servers on one Redis, each with its own copy of the file: one is reloaded to a higher
/// limit while the other still runs the old one, and the usage is one.
#[test]
fn two_servers_reloaded_one_after_the_other_share_usage_in_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (file_a, file_b) = (
        PolicyFile::new("rolling-a", &api("3/h")),
        PolicyFile::new("rolling-b", &api("3/h")),
    );
    let a = DemoServer::start(&[("CONFIG", file_a.path()), ("REDIS_URL", &url)]);
    let b = DemoServer::start(&[("CONFIG", file_b.path()), ("REDIS_URL", &url)]);
    assert_eq!([a.get("/", &[]).0, b.get("/", &[]).0], [200, 200]);
    file_b.write(&api("5/h"));
    b.hangup();
    b.line_with("reloaded CONFIG");
    // 2 used: A (3/h) admits one more, B (5/h) two more after it; then both deny.
    let statuses = [
        a.get("/", &[]).0,
        a.get("/", &[]).0,
        b.get("/", &[]).0,
        b.get("/", &[]).0,
        b.get("/", &[]).0,
    ];
    assert_eq!(statuses, [200, 429, 200, 200, 429]);
}

#[test]
fn a_policy_file_and_its_mistakes_at_start() {
    let err = start_error(&[("CONFIG", "examples/limits.toml"), ("RATE_LIMIT", "5/s")]);
    assert!(err.contains("drop RATE_LIMIT (or drop CONFIG)"), "{err}");
    let file = PolicyFile::new(
        "bad",
        "[[policy]]\nname = \"x\"\nquota = \"10/s\"\nburts = 2\n",
    );
    let err = start_error(&[("CONFIG", file.path())]);
    assert!(
        err.contains(&format!("CONFIG {}: line 4 (burts)", file.path())),
        "{err}"
    );
    let err = start_error(&[("CONFIG", "/nonexistent/limits.toml")]);
    assert!(err.contains("cannot read it"), "{err}");
    // The example file starts, with its five policies.
    let server = DemoServer::start(&[("CONFIG", "examples/limits.toml")]);
    assert!(
        server
            .first_line
            .contains("per-ip, failed-logins, reports, exports, hourly"),
        "{}",
        server.first_line
    );
}

/// A client that never finishes its request head is cut off after 10 s (hyper's header
/// timeout), instead of holding its connection for ever; a client that finishes it is served.
#[test]
fn a_request_head_unfinished_after_ten_seconds_is_cut_off() {
    use std::io::{Read, Write};
    let server = DemoServer::start(&[("RATE_LIMIT", "100/s")]);
    let mut slow = std::net::TcpStream::connect(server.addr).unwrap();
    slow.set_read_timeout(Some(std::time::Duration::from_secs(40)))
        .unwrap();
    let started = std::time::Instant::now();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nx-slow: 1\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let read = slow.read_to_end(&mut answer);
    let waited = started.elapsed();
    assert!(
        read.is_ok()
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the connection was closed, not left open: {read:?} after {waited:?}"
    );
    assert!(
        waited >= std::time::Duration::from_secs(9) && waited < std::time::Duration::from_secs(30),
        "cut off after about 10 s: {waited:?}"
    );
    // Meanwhile, and after, others are served.
    assert_eq!(server.get("/", &[]).0, 200);
}

/// How long after `hello` the server at `addr` closed a connection that sent it and nothing
/// more (panics if it was left open for 20 s).
fn closed_after(addr: std::net::SocketAddr, hello: &[u8]) -> std::time::Duration {
    use std::io::{Read, Write};
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let started = std::time::Instant::now();
    client.write_all(hello).unwrap();
    let mut answer = Vec::new();
    let read = client.read_to_end(&mut answer);
    let waited = started.elapsed();
    assert!(
        read.is_ok()
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the connection was closed, not left open: {read:?} after {waited:?}"
    );
    waited
}

/// `HEADER_TIMEOUT_MS` cuts off HTTP/2 as HTTP/1: a connection that sends the HTTP/2 preface
/// and an empty SETTINGS frame and then nothing, one that sends nothing at all, and half an
/// HTTP/1 head are closed once it has passed; a request in flight longer than it is answered,
/// over HTTP/2 too, and an HTTP/2 connection idle after its answer is closed in turn.
#[test]
fn http2_connections_that_send_no_request_are_cut_off() {
    use std::time::Duration;
    let server = DemoServer::start(&[("RATE_LIMIT", "100/s"), ("HEADER_TIMEOUT_MS", "1000")]);
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    let half_a_head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
    for (what, hello) in [
        ("the HTTP/2 preface", preface),
        ("nothing", vec![]),
        ("half a head", half_a_head),
    ] {
        let waited = closed_after(server.addr, &hello);
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_secs(10),
            "{what}: cut off after about 1 s: {waited:?}"
        );
    }
    assert_eq!(server.get("/slow?ms=2500", &[]).0, 200, "HTTP/1, in flight");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use http_body_util::{BodyExt, Empty};
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        let connection = tokio::spawn(connection);
        let request = http::Request::get(format!("http://{}/slow?ms=2500", server.addr))
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200, "HTTP/2, in flight");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"answered after 2500 ms\n");
        let answered = std::time::Instant::now();
        let ended = tokio::time::timeout(Duration::from_secs(20), connection).await;
        assert!(ended.is_ok(), "an idle HTTP/2 connection is closed");
        let idle = answered.elapsed();
        assert!(
            idle < Duration::from_secs(10),
            "closed after about 1 s idle: {idle:?}"
        );
    });
    assert_eq!(server.get("/", &[]).0, 200);
}
