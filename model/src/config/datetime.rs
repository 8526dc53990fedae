//! TOML offset date-times ↔ Unix milliseconds, for drain deadlines (wall-clock, like the
//! model's `drain_deadline_unix_ms`).

use toml::value::{Date, Datetime, Offset, Time};

/// Milliseconds since the Unix epoch of `dt`, which must be a full date-time with an offset
/// (`2026-12-01T10:00:00Z`, `2026-12-01T11:00:00+01:00`): a local time means different
/// instants on different balancers.
pub fn to_unix_ms(dt: &Datetime) -> Result<u64, String> {
    let (Some(date), Some(time), Some(offset)) = (dt.date, dt.time, dt.offset) else {
        return Err(format!("{dt} is not a date and time with a UTC offset (e.g. 2026-12-01T10:00:00Z)"));
    };
    let offset_minutes = match offset {
        Offset::Z => 0,
        Offset::Custom { minutes } => i64::from(minutes),
    };
    let days = days_from_civil(i64::from(date.year), i64::from(date.month), i64::from(date.day));
    let seconds = days * 86_400 + i64::from(time.hour) * 3600 + i64::from(time.minute) * 60 + i64::from(time.second.unwrap_or(0))
        - offset_minutes * 60;
    let ms = seconds * 1000 + i64::from(time.nanosecond.unwrap_or(0) / 1_000_000);
    u64::try_from(ms).map_err(|_| format!("{dt} is before 1970"))
}

/// `ms` as a UTC date-time, with milliseconds only when there are any.
pub fn from_unix_ms(ms: u64) -> Datetime {
    let seconds = (ms / 1000) as i64;
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let millis = (ms % 1000) as u32;
    Datetime {
        date: Some(Date { year: year as u16, month: month as u8, day: day as u8 }),
        time: Some(Time {
            hour: (rest / 3600) as u8,
            minute: (rest / 60 % 60) as u8,
            second: Some((rest % 60) as u8),
            nanosecond: (millis != 0).then_some(millis * 1_000_000),
        }),
        offset: Some(Offset::Z),
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the era/day-of-era method: 400-year
/// eras repeat exactly, and a year starting in March puts the leap day last).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Datetime {
        text.parse().unwrap()
    }

    #[test]
    fn known_instants() {
        for (text, ms) in [
            ("1970-01-01T00:00:00Z", 0),
            ("2000-02-29T12:34:56Z", 951_827_696_000),
            ("2026-12-01T10:00:00.250Z", 1_796_119_200_250),
            ("2026-12-01T11:00:00+01:00", 1_796_119_200_000),
            ("2100-03-01T00:00:00Z", 4_107_542_400_000),
        ] {
            assert_eq!(to_unix_ms(&parse(text)), Ok(ms), "{text}");
        }
    }

    #[test]
    fn round_trips_every_day_for_centuries() {
        for days in (0..200 * 366).step_by(7) {
            let ms = days * 86_400_000 + 3_723_004;
            assert_eq!(to_unix_ms(&from_unix_ms(ms)), Ok(ms), "day {days}");
        }
        assert_eq!(from_unix_ms(1_796_119_200_000).to_string(), "2026-12-01T10:00:00Z");
        assert_eq!(from_unix_ms(1_796_119_200_250).to_string(), "2026-12-01T10:00:00.25Z");
    }

    #[test]
    fn local_and_early_times_are_refused() {
        for text in ["2026-12-01T10:00:00", "2026-12-01", "10:00:00"] {
            assert!(to_unix_ms(&parse(text)).unwrap_err().contains("UTC offset"), "{text}");
        }
        assert!(to_unix_ms(&parse("1969-12-31T23:59:59Z")).unwrap_err().contains("before 1970"));
    }
}
