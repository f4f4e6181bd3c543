//! A response's stream of server-sent events, read by the settle reader for a cost at a JSON
//! pointer: cut in any pieces, it reads what it reads of the stream given whole; never a
//! panic.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    cuts: Vec<u8>,
    body: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    let (whole, cut) = tower_ratelimit::fuzzing::events_cost(input.body, &input.cuts);
    assert_eq!(whole, cut, "{:?} cut {:?}", input.body, input.cuts);
});
