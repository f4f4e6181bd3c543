//! The decision's replies are integers only: every call the store made during everything it
//! does (captured from Redis's slow log) is sent again over RESP3, and every element of every
//! reply is an integer, never a double or a string (servers whose Lua returns non-integral
//! numbers as doubles, such as Dragonfly's Lua 5.4, would otherwise slip through a reader that
//! converts).

use redis::Value;

mod support;

use support::RedisServer;
use support::everything::everything;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reply_of_the_decision_is_integers_only() {
    let server = RedisServer::start();
    for set in [
        ["slowlog-log-slower-than", "0"],
        ["slowlog-max-len", "100000"],
    ] {
        assert_eq!(server.cli(&["CONFIG", "SET", set[0], set[1]]), "OK");
    }
    for functions in [true, false] {
        let store = tower_ratelimit::RedisStore::builder(&server.url())
            .functions(functions)
            .build()
            .await
            .unwrap();
        everything(&store, || {}).await;
        server.cli(&["FLUSHALL"]);
    }
    let client = redis::Client::open(format!("{}?protocol=resp3", server.url())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let log: Vec<Vec<Value>> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut replayed = 0;
    for entry in log {
        let Ok(args) = redis::from_redis_value::<Vec<String>>(entry[3].clone()) else {
            continue;
        };
        let decision = ["FCALL", "EVALSHA"].contains(&args[0].to_uppercase().as_str());
        // The slow log cuts calls of more than 32 arguments.
        if !decision || args.iter().any(|a| a.contains("more arguments")) {
            continue;
        }
        let reply: Value = redis::cmd(&args[0])
            .arg(&args[1..])
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let Value::Array(items) = &reply else {
            panic!("{args:?}: {reply:?}")
        };
        assert!(!items.is_empty(), "{args:?}");
        for item in items {
            assert!(matches!(item, Value::Int(_)), "{args:?}: {reply:?}");
        }
        replayed += 1;
    }
    assert!(replayed > 100, "{replayed} calls replayed");
}
