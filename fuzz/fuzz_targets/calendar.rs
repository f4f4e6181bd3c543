//! Calendar zone and day strings, then the period holding any time: never a panic; the period
//! holds the time, lasts a day, a week or a month give or take a daylight-saving hour (the one
//! holding the epoch is cut there), and the next one starts where it ends.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tower_ratelimit::calendar::{Calendar, Weekday};

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    zone: &'a str,
    week_start: &'a str,
    month_day: u8,
    period: u8,
    /// Seconds since the Unix epoch, to the year 9892 (the time-zone database places times
    /// to 9999; past it, periods are their nominal length).
    seconds: u64,
}

const HOUR: u64 = 3_600_000_000;
const DAY: u64 = 24 * HOUR;

fuzz_target!(|input: Input<'_>| {
    let Ok(calendar) = Calendar::in_zone(input.zone) else {
        return;
    };
    let Ok(week_start) = input.week_start.parse::<Weekday>() else {
        return;
    };
    let calendar = calendar
        .week_starts_on(week_start)
        .month_starts_on(input.month_day);
    let t = (input.seconds % 250_000_000_000) * 1_000_000;
    let window = tower_ratelimit::fuzzing::calendar_window(calendar.clone(), input.period, t);
    let Ok((start, end)) = window else {
        return;
    };
    assert!(
        start <= t && t < end,
        "{calendar:?}: {t} not in [{start}, {end})"
    );
    let (shortest, longest) = match input.period % 3 {
        0 => (DAY - 2 * HOUR, DAY + 2 * HOUR),
        1 => (7 * DAY - 2 * HOUR, 7 * DAY + 2 * HOUR),
        _ => (28 * DAY - 2 * HOUR, 31 * DAY + 2 * HOUR),
    };
    let length = end - start;
    // The period holding the epoch, the earliest time there is, begins there.
    assert!(
        (shortest..=longest).contains(&length) || (start == 0 && length <= longest),
        "{calendar:?} at {t}: a period of {length} µs"
    );
    let (next, _) = tower_ratelimit::fuzzing::calendar_window(calendar, input.period, end).unwrap();
    assert_eq!(next, end, "the next period starts where this one ends");
});
