//! What the benchmark drivers share.
#![allow(dead_code)]

use tower_ratelimit::key::Key;
use tower_ratelimit::{RateLimitLayer, RedisStore};

/// Runs one command on a fresh connection to `url`.
pub(crate) async fn redis_cmd(url: &str, args: &[&str]) -> redis::Value {
    let client = redis::Client::open(url).expect("URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut conn).await.expect("command")
}

/// The call that `layer` sends to decide `key` at cost 1, as Redis received it: the command
/// (`FCALL` or `EVALSHA`), the function's name or the script's SHA, then every argument. Read
/// from the slow log, told to log every command for the moment, so the benchmarks replay the
/// exact bytes without the crate exposing its script's arguments.
pub(crate) async fn captured_call(
    url: &str,
    layer: &RateLimitLayer<RedisStore>,
    key: &Key,
) -> Vec<String> {
    captured(url, layer.check(key, 1)).await
}

/// The call that `decide` makes Redis run, as [`captured_call`] reads it.
pub(crate) async fn captured<T>(url: &str, decide: impl Future<Output = T>) -> Vec<String> {
    redis_cmd(url, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]).await;
    redis_cmd(url, &["SLOWLOG", "RESET"]).await;
    decide.await;
    let log = redis_cmd(url, &["SLOWLOG", "GET", "16"]).await;
    redis_cmd(url, &["CONFIG", "SET", "slowlog-log-slower-than", "10000"]).await;
    let entries: Vec<Vec<redis::Value>> = redis::from_redis_value(log).expect("SLOWLOG");
    entries
        .into_iter()
        .filter_map(|entry| redis::from_redis_value(entry.get(3)?.clone()).ok())
        .find(|args: &Vec<String>| {
            args[0].eq_ignore_ascii_case("fcall") || args[0].eq_ignore_ascii_case("evalsha")
        })
        .expect("the decision's call in the slow log")
}

/// Whether `cargo bench` started this driver (it passes `--bench`) rather than
/// `scripts/bench.sh`: the drivers then say what they are for and stop.
pub(crate) fn started_by_cargo_bench(args: &[String]) -> bool {
    if args.iter().any(|a| a == "--bench") && args.len() <= 2 {
        eprintln!("a driver of scripts/bench.sh; run that script to measure with it");
        return true;
    }
    false
}

/// A runtime with `threads` worker threads, as the drivers measure with.
pub(crate) fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a runtime")
}
