//! Arbitrary RESP in place of a decision's reply, read by the Redis store for checks of
//! several operations, then the decision's headers written: a reply the store cannot use is
//! refused with an error, never a panic, and whatever it reads gives valid header fields.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    ops: &'a [u8],
    resp: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    if let Some(headers) = tower_ratelimit::fuzzing::read_reply(input.resp, input.ops) {
        for name in ["ratelimit-policy", "ratelimit"] {
            let value = headers.get(name).expect("both IETF fields");
            let text = value.to_str().expect("ASCII");
            let parsed: Result<sfv::List, _> = sfv::Parser::new(text).parse_list();
            parsed.unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
        }
    }
});
