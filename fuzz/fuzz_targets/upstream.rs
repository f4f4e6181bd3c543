//! What an upstream's answer asks of its callers, whatever its status and headers: a pause of
//! some time or none, never a panic, never a pause of nothing.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

/// The names an upstream's pause is read from, and one it is not.
const NAMES: &[&str] = &[
    "retry-after",
    "ratelimit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "x-other",
];

#[derive(Arbitrary, Debug)]
struct Input {
    status: u16,
    headers: Vec<(u8, Vec<u8>)>,
    now_secs: u32,
}

fuzz_target!(|input: Input| {
    let headers: Vec<(String, Vec<u8>)> = input
        .headers
        .into_iter()
        .map(|(n, v)| (NAMES[usize::from(n) % NAMES.len()].to_owned(), v))
        .collect();
    let now = 1_000_000_000 + u64::from(input.now_secs);
    if let Some(us) = tower_ratelimit::fuzzing::upstream_pause(input.status, &headers, now) {
        assert!(us > 0, "a pause of nothing");
    }
});
