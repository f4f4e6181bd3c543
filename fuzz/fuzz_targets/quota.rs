#![no_main]
use libfuzzer_sys::fuzz_target;
use tower_ratelimit::Quota;

fuzz_target!(|text: &str| {
    if let Ok(quota) = text.parse::<Quota>() {
        let printed = quota.to_string();
        let again: Quota = printed.parse().expect("a printed quota parses");
        assert_eq!(again, quota, "{text:?} printed as {printed:?}");
    }
});
