//! Numbers written as the Redis script reads them back.

/// `n` as few characters as Lua reads back exactly: in base 36, lowercase (`tonumber(text,
/// 36)`), or when shorter, in decimal with its trailing zeros as an exponent, `864E8` for
/// 86,400,000,000 (`tonumber(text)`: every value is below 2^53, where strtod is exact).
pub(crate) fn compact(n: u64) -> String {
    let base36 = base36(n);
    let (mut mantissa, mut zeros) = (n, 0);
    while mantissa != 0 && mantissa.is_multiple_of(10) {
        (mantissa, zeros) = (mantissa / 10, zeros + 1);
    }
    if zeros == 0 {
        return base36;
    }
    let decimal = format!("{mantissa}E{zeros}");
    if decimal.len() < base36.len() {
        decimal
    } else {
        base36
    }
}

/// `n` in base 36, lowercase.
fn base36(mut n: u64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).expect("ASCII digits")
}
