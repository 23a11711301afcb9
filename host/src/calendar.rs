//! Calendar periods for budgets that reset: an hour, a day, a week (from Monday) or a month
//! in an IANA timezone. A period budget is full again at each boundary of its period, as the
//! local clock of its timezone reads it: months of 28 to 31 days, and days of 23 or 25 hours
//! where daylight saving changes. All times are epoch milliseconds.

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, Offset, TimeZone};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// How long a period budget lasts before it is full again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// From each whole hour of the local clock.
    Hour,
    /// From each local midnight.
    Day,
    /// From each Monday's local midnight.
    Week,
    /// From the local midnight that starts each month's first day.
    Month,
}

impl Period {
    /// The period's name as configurations write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }
}

/// A period in a timezone: when a period budget resets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Calendar {
    /// The period.
    pub period: Period,
    /// The timezone whose local clock draws the boundaries.
    pub timezone: Tz,
}

impl Calendar {
    /// A calendar from a period and an IANA timezone name (`None`: the name is unknown).
    pub fn new(period: Period, timezone: &str) -> Option<Calendar> {
        Some(Calendar {
            period,
            timezone: timezone.parse().ok()?,
        })
    }

    /// The first boundary strictly after `ms`: when a budget touched at `ms` is full again.
    pub fn next_reset(&self, ms: i64) -> i64 {
        let Some(at) = DateTime::from_timestamp_millis(ms) else {
            return i64::MAX;
        };
        let local = at.with_timezone(&self.timezone);
        let next = match self.period {
            Period::Hour => {
                // The local hour starts where the local minutes and seconds are zero; offsets
                // change only on whole local hours, so an hour is always 3,600,000 ms.
                let offset_ms = i64::from(local.offset().fix().local_minus_utc()) * 1000;
                let hour = 3_600_000;
                return ms - (ms + offset_ms).rem_euclid(hour) + hour;
            }
            Period::Day => local.date_naive() + Duration::days(1),
            Period::Week => {
                let days_since_monday = local.weekday().num_days_from_monday();
                local.date_naive() + Duration::days(i64::from(7 - days_since_monday))
            }
            Period::Month => {
                let (y, m) = (local.year(), local.month());
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                NaiveDate::from_ymd_opt(y, m, 1).unwrap_or(NaiveDate::MAX)
            }
        };
        self.start_of(next)
    }

    /// The instant a local day starts: its midnight, or where midnight is skipped by a
    /// daylight-saving change, the first local time that exists that day.
    fn start_of(&self, day: NaiveDate) -> i64 {
        let midnight: NaiveDateTime = day.and_hms_opt(0, 0, 0).unwrap_or_default();
        for hours in 0..24 {
            let local = midnight + Duration::hours(hours);
            if let Some(at) = self.timezone.from_local_datetime(&local).earliest() {
                return at.timestamp_millis();
            }
        }
        // No timezone skips a whole day's hours; fall back to UTC midnight.
        midnight.and_utc().timestamp_millis()
    }

    /// The IANA name of the timezone.
    pub fn timezone_name(&self) -> &'static str {
        self.timezone.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn ms(text: &str) -> i64 {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis()
    }

    fn at(ms: i64) -> String {
        DateTime::<Utc>::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339()
    }

    fn cal(period: Period, tz: &str) -> Calendar {
        Calendar::new(period, tz).unwrap()
    }

    #[test]
    fn months_of_every_length() {
        let month = cal(Period::Month, "UTC");
        assert_eq!(
            at(month.next_reset(ms("2027-01-31T23:59:59.999Z"))),
            "2027-02-01T00:00:00+00:00"
        );
        // A leap year's February runs to the 29th.
        assert_eq!(
            at(month.next_reset(ms("2028-02-29T12:00:00Z"))),
            "2028-03-01T00:00:00+00:00"
        );
        assert_eq!(
            at(month.next_reset(ms("2027-12-15T00:00:00Z"))),
            "2028-01-01T00:00:00+00:00"
        );
        // A boundary itself belongs to the new period: the next reset is a month on.
        assert_eq!(
            at(month.next_reset(ms("2027-02-01T00:00:00Z"))),
            "2027-03-01T00:00:00+00:00"
        );
    }

    #[test]
    fn local_midnights_across_daylight_saving() {
        let day = cal(Period::Day, "Europe/Paris");
        // 2027-03-28: Paris goes from +01:00 to +02:00 at 02:00, a day of 23 hours.
        let start = day.next_reset(ms("2027-03-27T12:00:00+01:00"));
        assert_eq!(at(start), "2027-03-27T23:00:00+00:00");
        let end = day.next_reset(start);
        assert_eq!(at(end), "2027-03-28T22:00:00+00:00");
        assert_eq!(end - start, 23 * 3_600_000);
        // 2027-10-31: back to +01:00, a day of 25 hours.
        let start = day.next_reset(ms("2027-10-30T12:00:00+02:00"));
        assert_eq!(day.next_reset(start) - start, 25 * 3_600_000);
        // A month in Paris starts at Paris midnight.
        let month = cal(Period::Month, "Europe/Paris");
        assert_eq!(
            at(month.next_reset(ms("2027-06-30T23:30:00+02:00"))),
            "2027-06-30T22:00:00+00:00"
        );
    }

    #[test]
    fn weeks_start_on_monday_and_hours_on_the_local_hour() {
        let week = cal(Period::Week, "UTC");
        // 2027-01-06 is a Wednesday.
        assert_eq!(
            at(week.next_reset(ms("2027-01-06T10:00:00Z"))),
            "2027-01-11T00:00:00+00:00"
        );
        assert_eq!(
            at(week.next_reset(ms("2027-01-11T00:00:00Z"))),
            "2027-01-18T00:00:00+00:00"
        );
        let hour = cal(Period::Hour, "Asia/Kolkata");
        // India is +05:30: local hours start at half past UTC hours.
        assert_eq!(
            at(hour.next_reset(ms("2027-01-06T10:10:00Z"))),
            "2027-01-06T10:30:00+00:00"
        );
        let hour = cal(Period::Hour, "UTC");
        assert_eq!(
            at(hour.next_reset(ms("2027-01-06T10:00:00Z"))),
            "2027-01-06T11:00:00+00:00"
        );
    }

    #[test]
    fn a_skipped_midnight_starts_the_day_at_its_first_hour() {
        // America/Santiago skipped from 2022-09-11 00:00 to 01:00.
        let day = cal(Period::Day, "America/Santiago");
        let reset = day.next_reset(ms("2022-09-10T12:00:00-04:00"));
        assert_eq!(at(reset), "2022-09-11T04:00:00+00:00");
    }

    #[test]
    fn unknown_timezones_are_refused() {
        assert!(Calendar::new(Period::Day, "Mars/Olympus").is_none());
        assert!(Calendar::new(Period::Day, "America/New_York").is_some());
    }
}
