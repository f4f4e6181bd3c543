//! Header values for numbers, formatted without allocating.

use std::time::Duration;

use http::HeaderValue;

/// A header value for `n`. Numbers below 10,000 (most limits, counts and waits) point into one
/// static buffer, formatted once: nothing is allocated or reference-counted per response.
pub(crate) fn number(n: u64) -> HeaderValue {
    /// Each number below `STATIC` takes `WIDTH` bytes of the buffer, left-aligned.
    const STATIC: u64 = 10_000;
    const WIDTH: usize = 4;
    static DIGITS: std::sync::OnceLock<Box<[u8]>> = std::sync::OnceLock::new();
    if n >= STATIC {
        return HeaderValue::from(n);
    }
    let digits = DIGITS.get_or_init(|| {
        let mut buf = vec![b' '; STATIC as usize * WIDTH];
        for (i, cell) in buf.chunks_exact_mut(WIDTH).enumerate() {
            let text = i.to_string();
            cell[..text.len()].copy_from_slice(text.as_bytes());
        }
        buf.into_boxed_slice()
    });
    let start = n as usize * WIDTH;
    let len = n.checked_ilog10().map_or(1, |d| d as usize + 1);
    let bytes = bytes::Bytes::from_static(&digits[start..start + len]);
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from(n))
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            999,
            1023,
            1024,
            9_999,
            10_000,
            86_400,
            u64::MAX,
        ] {
            assert_eq!(number(n), HeaderValue::from(n));
        }
    }

    #[test]
    fn rounds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
    }
}
