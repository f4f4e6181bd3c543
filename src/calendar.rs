//! Calendar periods: a day, a week or a month as a time zone's clocks show it.
//!
//! A fixed window counts windows aligned to the Unix epoch: a day ends at midnight UTC and a
//! week starts on a Thursday. A quota sold by plan ("10,000 calls a month, renewed on the 1st")
//! counts calendar periods instead: a [`Calendar`] says where they start (a time zone, the day
//! a week starts on, the day of the month a month starts on), and a
//! [fixed window](crate::Algorithm::FixedWindow) policy given one
//! ([`Policy::calendar`](crate::Policy::calendar)) counts each period from its first instant
//! to the next one's, exact across daylight-saving changes and months of 28 to 31 days.
//!
//! ```
//! use tower_ratelimit::{Algorithm, calendar::Calendar, Policy, calendar::Weekday};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! // 10,000 a month, renewed at midnight on the 15th in Paris.
//! let monthly = Policy::new(Algorithm::FixedWindow, "10000/month")
//!     .calendar(Calendar::in_zone("Europe/Paris")?.month_starts_on(15));
//! // 2,000 a week, from Sunday midnight in New York.
//! let weekly = Policy::new(Algorithm::FixedWindow, "2000/week")
//!     .calendar(Calendar::in_zone("America/New_York")?.week_starts_on(Weekday::Sunday));
//! # let _ = (monthly, weekly);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use jiff::ToSpan;
use jiff::civil::Date;
use jiff::tz::TimeZone;

use crate::algorithm::compact;
use crate::error::ConfigError;
use crate::quota::Quota;

/// A day of the week, the one a [`Calendar`]'s weeks start on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    fn jiff(self) -> jiff::civil::Weekday {
        match self {
            Weekday::Monday => jiff::civil::Weekday::Monday,
            Weekday::Tuesday => jiff::civil::Weekday::Tuesday,
            Weekday::Wednesday => jiff::civil::Weekday::Wednesday,
            Weekday::Thursday => jiff::civil::Weekday::Thursday,
            Weekday::Friday => jiff::civil::Weekday::Friday,
            Weekday::Saturday => jiff::civil::Weekday::Saturday,
            Weekday::Sunday => jiff::civil::Weekday::Sunday,
        }
    }

    const ALL: [(Weekday, &'static str); 7] = [
        (Weekday::Monday, "monday"),
        (Weekday::Tuesday, "tuesday"),
        (Weekday::Wednesday, "wednesday"),
        (Weekday::Thursday, "thursday"),
        (Weekday::Friday, "friday"),
        (Weekday::Saturday, "saturday"),
        (Weekday::Sunday, "sunday"),
    ];
}

impl FromStr for Weekday {
    type Err = ConfigError;

    /// A day's English name, or its first three letters, in any case: `monday`, `Sun`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        Weekday::ALL
            .into_iter()
            .find(|(_, name)| *name == lower || (lower.len() == 3 && name.starts_with(&lower)))
            .map(|(day, _)| day)
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "{s:?} is not a day of the week; expected e.g. monday"
                ))
            })
    }
}

/// Where calendar periods start: a time zone, the day weeks start on (Monday unless set) and
/// the day of the month months start on (the 1st unless set). See the [module](self) docs.
#[derive(Clone)]
pub struct Calendar {
    zone: TimeZone,
    name: Arc<str>,
    week_start: Weekday,
    month_day: u8,
}

impl Calendar {
    /// Periods in UTC: days from midnight UTC, weeks from Monday, months from the 1st.
    pub fn utc() -> Self {
        Calendar {
            zone: TimeZone::UTC,
            name: "UTC".into(),
            week_start: Weekday::Monday,
            month_day: 1,
        }
    }

    /// Periods in the IANA time zone `name` (e.g. `Europe/Paris`, `Asia/Kolkata`), from the
    /// time-zone database built into the crate, so that every instance agrees whatever its
    /// system has. Fails when the zone is unknown.
    pub fn in_zone(name: &str) -> Result<Self, ConfigError> {
        let zone = TimeZone::get(name).map_err(|e| {
            ConfigError::new(format!(
                "unknown time zone {name:?} ({e}); expected e.g. Europe/Paris"
            ))
        })?;
        Ok(Calendar {
            zone,
            name: name.into(),
            ..Calendar::utc()
        })
    }

    /// Weeks start at midnight on `day` (default Monday).
    pub fn week_starts_on(mut self, day: Weekday) -> Self {
        self.week_start = day;
        self
    }

    /// Months start at midnight on `day` of the month, 1 to 31 (default 1): a month without
    /// that day starts on its last day (with 31, a period runs from January 31st to February
    /// 28th or 29th, then to March 31st). Any other day is an error when the layer is built.
    pub fn month_starts_on(mut self, day: u8) -> Self {
        self.month_day = day;
        self
    }

    /// The time zone's name.
    pub fn zone(&self) -> &str {
        &self.name
    }

    /// The day weeks start on.
    pub fn week_start(&self) -> Weekday {
        self.week_start
    }

    /// The day of the month months start on.
    pub fn month_day(&self) -> u8 {
        self.month_day
    }

    /// The calendar in a few words after `sep` (`:Europe/Paris:sunday:day15`), for a policy's
    /// default name and the report of a reload: its zone, and its week and month starts
    /// when they are not the defaults.
    pub(crate) fn describe(&self, sep: &str) -> String {
        let mut text = format!("{sep}{}", self.name);
        if self.week_start != Weekday::Monday {
            let (_, name) = Weekday::ALL[self.week_start as usize];
            text.push_str(&format!("{sep}{name}"));
        }
        if self.month_day != 1 {
            text.push_str(&format!("{sep}day{}", self.month_day));
        }
        text
    }

    /// Checks the calendar's settings.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=31).contains(&self.month_day) {
            return Err(ConfigError::new(format!(
                "month_starts_on must be a day of the month, 1 to 31 (got {})",
                self.month_day
            )));
        }
        Ok(())
    }

    /// Midnight at the start of `date`, or the first instant after it when the zone skips
    /// midnight that day, in microseconds since the Unix epoch.
    fn midnight(&self, date: Date) -> Option<u64> {
        let zoned = date.to_zoned_datetime(self.zone.clone()).ok()?;
        // A period that began before the epoch, the earliest time there is, begins there.
        Some(zoned.timestamp().as_microsecond().max(0).unsigned_abs())
    }

    /// The day `self.month_day` of the month `months` after the one of `date`, or that month's
    /// last day.
    fn month_start(&self, date: Date, months: i32) -> Option<Date> {
        let first = date.first_of_month().checked_add(months.months()).ok()?;
        let day = (self.month_day as i8).min(first.days_in_month());
        first.with().day(day).build().ok()
    }

    /// The start and end of the `period` holding `t`, in microseconds.
    fn period(&self, period: Period, t: u64) -> Option<(u64, u64)> {
        let at = jiff::Timestamp::from_microsecond(i64::try_from(t).ok()?).ok()?;
        let today = at.to_zoned_datetime(self.zone.clone()).date();
        let (first, next) = match period {
            Period::Day => (today, today.tomorrow().ok()?),
            Period::Week => {
                let back = today.weekday().since(self.week_start.jiff());
                let first = today.checked_sub(i64::from(back).days()).ok()?;
                (first, first.checked_add(7.days()).ok()?)
            }
            Period::Month => {
                let this = self.month_start(today, 0)?;
                if today >= this {
                    (this, self.month_start(today, 1)?)
                } else {
                    (self.month_start(today, -1)?, this)
                }
            }
        };
        Some((self.midnight(first)?, self.midnight(next)?))
    }

    /// A number that tells calendars and their periods apart (zone, week start, month day,
    /// period), the same in every process: a policy whose calendar changes is a new
    /// definition of it in Redis too.
    fn id(&self, period: Period) -> u64 {
        // FNV-1a, kept below 2^48 so that Lua reads it back exactly.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let text = format!(
            "{}|{:?}|{}|{period:?}",
            self.name, self.week_start, self.month_day
        );
        for byte in text.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        hash >> 16
    }
}

impl FromStr for Calendar {
    type Err = ConfigError;

    /// The calendar of an IANA time zone ([`Calendar::in_zone`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Calendar::in_zone(s.trim())
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        (&self.name, self.week_start, self.month_day)
            == (&other.name, other.week_start, other.month_day)
    }
}

impl Eq for Calendar {}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calendar")
            .field("zone", &self.name)
            .field("week_start", &self.week_start)
            .field("month_day", &self.month_day)
            .finish()
    }
}

/// What a calendar quota counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Period {
    Day,
    Week,
    Month,
}

impl Period {
    /// The period of a quota's window: one day, one week or one month.
    pub(crate) fn of(window_us: u64, monthly: bool) -> Option<Period> {
        const DAY: u64 = 86_400_000_000;
        match (monthly, window_us) {
            (true, _) => Some(Period::Month),
            (false, DAY) => Some(Period::Day),
            (false, w) if w == 7 * DAY => Some(Period::Week),
            _ => None,
        }
    }

    /// The nominal length, for a time the time-zone database cannot place.
    fn nominal_us(self) -> u64 {
        match self {
            Period::Day => 86_400_000_000,
            Period::Week => 7 * 86_400_000_000,
            Period::Month => 31 * 86_400_000_000,
        }
    }
}

/// Four boundaries in a row: the periods before, holding, and after the time they were found
/// for (`at[1] <= t < at[2]`), and the same in the form a Redis call carries them.
#[derive(Debug)]
pub(crate) struct Bounds {
    at: [u64; 4],
    /// `;b0,b1,b2,b3`, appended to the tier's tag.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    text: Box<str>,
}

impl Bounds {
    /// The boundaries, written after a tier's tag.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

/// The periods of one calendar quota: where each starts and ends, the last ones found kept, so
/// that the usual decision finds its period without asking the time-zone database.
pub(crate) struct Periods {
    calendar: Calendar,
    period: Period,
    last: ArcSwap<Bounds>,
}

impl Periods {
    pub(crate) fn new(calendar: Calendar, period: Period) -> Self {
        let last = ArcSwap::from_pointee(Self::find(&calendar, period, 0));
        Periods {
            calendar,
            period,
            last,
        }
    }

    /// The boundaries around `t`.
    fn find(calendar: &Calendar, period: Period, t: u64) -> Bounds {
        let nominal = period.nominal_us();
        let (start, end) = calendar
            .period(period, t)
            .unwrap_or_else(|| (t - t % nominal, t - t % nominal + nominal));
        let before = start
            .checked_sub(1)
            .and_then(|t| calendar.period(period, t))
            .map_or(start.saturating_sub(nominal), |p| p.0);
        let after = calendar.period(period, end).map_or(end + nominal, |p| p.1);
        let at = [before, start, end, after];
        let text = at.map(compact).join(",");
        Bounds {
            at,
            text: format!(";{text}").into_boxed_str(),
        }
    }

    /// The boundaries around `t` (`t` in the middle period), kept for the next call.
    pub(crate) fn around(&self, t: u64) -> Arc<Bounds> {
        let last = self.last.load_full();
        if last.at[1] <= t && t < last.at[2] {
            return last;
        }
        let found = Arc::new(Self::find(&self.calendar, self.period, t));
        self.last.store(found.clone());
        found
    }

    /// The start and end of the period holding `t`.
    pub(crate) fn window(&self, t: u64) -> (u64, u64) {
        let last = self.last.load();
        let at = last.at;
        match at.windows(2).find(|w| w[0] <= t && t < w[1]) {
            Some(w) => (w[0], w[1]),
            None => {
                let found = self.around(t).at;
                (found[1], found[2])
            }
        }
    }

    /// The length of the last period found: the window clients are told.
    pub(crate) fn length(&self) -> u64 {
        let at = self.last.load().at;
        at[2] - at[1]
    }

    /// Checks that `quota` counts these periods (a key's own limit keeps its policy's).
    pub(crate) fn check_same(&self, quota: Quota) -> Result<(), ConfigError> {
        match Period::of(quota.window_us(), quota.is_monthly()) {
            Some(period) if period == self.period => Ok(()),
            _ => Err(ConfigError::new(format!(
                "a key's own limit counts its policy's calendar period, one {}; got {quota}",
                match self.period {
                    Period::Day => "day",
                    Period::Week => "week",
                    Period::Month => "month",
                }
            ))),
        }
    }

    /// The Lua parameters after the limit: 0 for the window (a calendar), and the calendar's id.
    pub(crate) fn id(&self) -> u64 {
        self.calendar.id(self.period)
    }
}

impl PartialEq for Periods {
    fn eq(&self, other: &Self) -> bool {
        self.calendar == other.calendar && self.period == other.period
    }
}

impl Eq for Periods {}

impl fmt::Debug for Periods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Periods")
            .field("calendar", &self.calendar)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Microseconds of a civil time in `zone`.
    fn at(zone: &str, y: i16, m: i8, d: i8, h: i8) -> u64 {
        let tz = TimeZone::get(zone).unwrap();
        let z = jiff::civil::date(y, m, d)
            .at(h, 0, 0, 0)
            .to_zoned_datetime(tz)
            .unwrap();
        z.timestamp().as_microsecond() as u64
    }

    fn period(c: &Calendar, p: Period, t: u64) -> (u64, u64) {
        Periods::new(c.clone(), p).window(t)
    }

    const H: u64 = 3_600_000_000;

    /// Found by the `calendar` fuzz target: the period holding the epoch began before it (a
    /// week from Monday 1969-12-29), and the week after it came out 3.9 days long.
    #[test]
    fn the_periods_after_the_epoch_are_whole() {
        let c = Calendar::in_zone("EET").unwrap();
        let (s, e) = period(&c, Period::Week, 854_321_000_000);
        assert_eq!(
            (s, e),
            (at("EET", 1970, 1, 5, 0), at("EET", 1970, 1, 12, 0))
        );
        // The one holding the epoch begins there.
        let (s, e) = period(&c, Period::Week, 0);
        assert_eq!((s, e), (0, at("EET", 1970, 1, 5, 0)));
    }

    #[test]
    fn months_of_every_length() {
        let c = Calendar::utc();
        for (y, m, days) in [(2026, 1, 31), (2026, 2, 28), (2028, 2, 29), (2026, 4, 30)] {
            let (s, e) = period(&c, Period::Month, at("UTC", y, m, 10, 12));
            assert_eq!(s, at("UTC", y, m, 1, 0));
            assert_eq!(e - s, days * 24 * H, "{y}-{m}");
        }
    }

    #[test]
    fn a_month_day_past_a_short_month_is_its_last_day() {
        let c = Calendar::utc().month_starts_on(31);
        let (s, e) = period(&c, Period::Month, at("UTC", 2026, 2, 10, 0));
        assert_eq!(
            (s, e),
            (at("UTC", 2026, 1, 31, 0), at("UTC", 2026, 2, 28, 0))
        );
        let (s, e) = period(&c, Period::Month, at("UTC", 2026, 3, 1, 0));
        assert_eq!(
            (s, e),
            (at("UTC", 2026, 2, 28, 0), at("UTC", 2026, 3, 31, 0))
        );
    }

    #[test]
    fn daylight_saving_days_are_23_and_25_hours() {
        let c = Calendar::in_zone("Europe/Paris").unwrap();
        let (s, e) = period(&c, Period::Day, at("Europe/Paris", 2026, 3, 29, 12));
        assert_eq!(e - s, 23 * H);
        let (s, e) = period(&c, Period::Day, at("Europe/Paris", 2026, 10, 25, 12));
        assert_eq!(e - s, 25 * H);
        let (s, e) = period(&c, Period::Month, at("Europe/Paris", 2026, 3, 15, 12));
        assert_eq!(e - s, 2_674_800_000_000);
    }

    #[test]
    fn weeks_start_on_the_chosen_day() {
        // 2026-11-26 is a Thursday.
        let t = at("UTC", 2026, 11, 26, 9);
        let monday = period(&Calendar::utc(), Period::Week, t);
        assert_eq!(monday.0, at("UTC", 2026, 11, 23, 0));
        let sunday = Calendar::utc().week_starts_on(Weekday::Sunday);
        assert_eq!(
            period(&sunday, Period::Week, t).0,
            at("UTC", 2026, 11, 22, 0)
        );
    }

    #[test]
    fn a_half_hour_zone_starts_its_days_at_half_past() {
        let c = Calendar::in_zone("Asia/Kolkata").unwrap();
        let (s, _) = period(&c, Period::Day, at("UTC", 2026, 6, 1, 12));
        assert_eq!(s, at("UTC", 2026, 5, 31, 18) + H / 2);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(Calendar::in_zone("Mars/Olympus").is_err());
        assert!(Calendar::utc().month_starts_on(0).validate().is_err());
        assert!(Calendar::utc().month_starts_on(32).validate().is_err());
        assert_eq!("Sun".parse::<Weekday>().unwrap(), Weekday::Sunday);
        assert!("funday".parse::<Weekday>().is_err());
    }
}
