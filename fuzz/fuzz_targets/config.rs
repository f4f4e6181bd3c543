//! A configuration file (TOML): read, its policies and lists made and a layer built from
//! them; every mistake an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tower_ratelimit::RateLimitLayer;
use tower_ratelimit::config::Limits;

fuzz_target!(|text: &str| {
    let Ok(limits) = Limits::from_toml(text) else {
        return;
    };
    let Ok(policies) = limits.policies() else {
        return;
    };
    let mut builder = RateLimitLayer::builder();
    for policy in policies {
        builder = builder.policy(policy);
    }
    if let Ok(lists) = limits.lists() {
        builder = builder.lists(lists);
    }
    let _ = builder.build();
});
