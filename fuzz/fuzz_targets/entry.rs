//! An administrator's entry (a key to list or limit, in any form) made the keys of each
//! extractor, and an entry's end (`until`) given to a layer: every mistake an error, never a
//! panic.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    text: &'a str,
    bytes: &'a [u8],
    secs: u64,
}

fuzz_target!(|input: Input<'_>| {
    tower_ratelimit::fuzzing::entry(input.text, input.bytes, input.secs);
});
