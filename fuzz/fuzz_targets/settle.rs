//! A reported cost's header or trailer value, read as the settle reader reads it, against a
//! plain reading: a decimal integer (spaces around it allowed; `-0` is 0; larger than any
//! bound when it overflows), negative, or invalid.
#![no_main]
use http::HeaderValue;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(bytes) else {
        return;
    };
    let read = tower_ratelimit::fuzzing::reported_cost(&value);
    let text = value.as_bytes().trim_ascii();
    let (negative, digits) = match text.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let expected = if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        "Invalid".to_owned()
    } else if negative && digits.iter().any(|&d| d != b'0') {
        "Negative".to_owned()
    } else if negative {
        "Cost(0)".to_owned()
    } else {
        let n = std::str::from_utf8(digits)
            .unwrap()
            .parse::<u128>()
            .map_or(u64::MAX, |n| u64::try_from(n).unwrap_or(u64::MAX));
        format!("Cost({n})")
    };
    assert_eq!(read, expected, "{value:?}");
});
