//! What a key costs the memory store in bytes, counted by a counting allocator (dhat's): a
//! client sending 4,000-byte keys costs what one sending 16-byte keys does (a key longer than
//! `key::LONGEST` is kept as a 128-bit hash), in the store and in the warnings near the limit.

mod support;

use http::{Request, StatusCode};
use support::http::{Seen, app, send};
use tower_ratelimit::key::HeaderKey;
use tower_ratelimit::{MemoryStore, Policy, RateLimitLayer};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Keys sent for each length.
const KEYS: usize = 4_000;

/// The heap bytes a fresh layer holds per key after one request of each of `KEYS` keys of
/// `len` bytes (a policy that warns at the first request, so that each key is also in the
/// map of keys warned of).
async fn bytes_per_key(len: usize) -> usize {
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("10/h").name("bytes").near_limit(1))
        .key(HeaderKey::try_new("x-key").unwrap())
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let app = app(&layer, &Seen::default());
    let keys: Vec<String> = (0..KEYS).map(|i| format!("{i:0len$}")).collect();
    let before = dhat::HeapStats::get().curr_bytes;
    for key in &keys {
        let request = Request::builder().header("x-key", key).body(()).unwrap();
        assert_eq!(send(&app, request).await.status, StatusCode::OK);
    }
    let after = dhat::HeapStats::get().curr_bytes;
    drop(keys);
    after.saturating_sub(before) / KEYS
}

#[tokio::test(flavor = "current_thread")]
async fn a_long_key_costs_what_a_short_one_does() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let short = bytes_per_key(16).await;
    let long = bytes_per_key(4_000).await;
    eprintln!("memory store bytes per key: {short} (16-byte keys), {long} (4,000-byte keys)");
    assert!(short > 0, "the keys were kept");
    assert!(long <= 600, "a 4,000-byte key costs {long} bytes");
    assert!(
        long * 2 <= short * 3,
        "a 4,000-byte key costs at most 1.5 times a 16-byte one: {long} against {short}"
    );
}
