//! The IETF fields a decision's outcomes give, whatever the policies' names, quotas, verdicts
//! and the partition key: lists an RFC 9651 parser accepts, one item per policy name (a
//! batch's keys of one policy give one item), named as it is, with the limit of one of them.
#![no_main]
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tower_ratelimit::Quota;
use tower_ratelimit::fuzzing::Outcome;

#[derive(Arbitrary, Debug)]
struct Policy {
    name: String,
    algorithm: u8,
    limit: u32,
    window_ms: u64,
    allowed: bool,
    remaining: u64,
    reset_after_us: u64,
    retry_after_us: Option<u64>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    policies: Vec<Policy>,
    key: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let outcomes: Vec<Outcome> = (input.policies.into_iter().take(8))
        .filter_map(|p| {
            let quota = Quota::new(p.limit, Duration::from_millis(p.window_ms)).ok()?;
            Some(Outcome {
                name: p.name,
                algorithm: p.algorithm,
                quota,
                allowed: p.allowed,
                remaining: p.remaining,
                reset_after_us: p.reset_after_us,
                retry_after_us: p.retry_after_us,
            })
        })
        .collect();
    let Ok(headers) = tower_ratelimit::fuzzing::headers(&outcomes, &input.key) else {
        return;
    };
    // One item per policy name, in the order the names first come (a batch checks a policy
    // once per key: its item is its tightest key's).
    let mut names: Vec<&str> = Vec::new();
    for o in &outcomes {
        if !names.contains(&o.name.as_str()) {
            names.push(&o.name);
        }
    }
    for name in ["ratelimit-policy", "ratelimit"] {
        let value = headers.get(name).expect("both IETF fields");
        let text = value.to_str().expect("ASCII");
        let parsed: Result<sfv::List, _> = sfv::Parser::new(text).parse_list();
        let list = parsed.unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
        assert_eq!(list.len(), names.len(), "{text:?}");
        for (entry, policy) in list.iter().zip(&names) {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{name}: an inner list in {text:?}");
            };
            assert_eq!(
                item.bare_item,
                sfv::BareItem::String(sfv::String::from_string(policy.to_string()).unwrap())
            );
            if name == "ratelimit-policy" {
                let q = item.params.get("q").expect("q");
                let limits = (outcomes.iter().filter(|o| o.name == *policy)).map(|o| {
                    sfv::BareItem::Integer(sfv::Integer::constant(o.quota.limit().into()))
                });
                assert!(limits.into_iter().any(|l| &l == q), "{text:?}");
            }
        }
    }
});
