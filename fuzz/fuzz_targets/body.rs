//! Request bodies as a client sends them, through a layer that reads bodies (a JSON-RPC key,
//! a cost at a pointer, a GraphQL cost: batches among them): every body is answered with a
//! status of the layer's contract, never a panic; once a limit is (almost) spent, a body is
//! admitted only where an oracle reading it on its own says a correct layer may (a batch, a
//! cost of 0, a batch settled from the response's JSON: none gets past it); a GraphQL
//! query's cost is computed or
//! refused with an error; and the settle reader reads a response's JSON, or its events, the
//! same however the body is cut.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    layer: u8,
    events: bool,
    cut: u16,
    body: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    let status = tower_ratelimit::fuzzing::body_status(input.body, input.layer);
    assert!(
        [200, 400, 413, 429].contains(&status),
        "{status}: {:?}",
        input.body
    );
    let (after, admissible) =
        tower_ratelimit::fuzzing::body_after_exhausted(input.body, input.layer);
    assert!(
        [200, 400, 413, 429].contains(&after) && (after != 200 || admissible),
        "{after} past a spent limit: {:?}",
        input.body
    );
    if let Ok(query) = std::str::from_utf8(input.body) {
        if let Ok(cost) = tower_ratelimit::graphql::query_cost(query, None, None) {
            assert!(cost.depth <= 128, "{cost:?}");
        }
    }
    let (whole, cut) =
        tower_ratelimit::fuzzing::json_cost(input.body, input.events, usize::from(input.cut));
    assert_eq!(whole, cut, "{:?}", input.body);
});
