//! CronJob schedules as kube-controller-manager reads them (the standard five-field format of
//! robfig/cron with its descriptors): minute, hour, day of month, month, day of week; `*`,
//! `?`, lists, ranges, steps, month and weekday names, `@hourly` .. `@yearly` and
//! `@every <duration>`. When both day fields are restricted, a day matching either runs (as in
//! Vixie cron); when one is `*`, both must match.
//!
//! Written here rather than taken from a crate: the maintained Rust cron crates take a seconds
//! field or bring a second date-time library, and the simulator needs robfig's semantics only.

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, ToSpan};

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Minute, hour, day of month, month and weekday sets (bit i set: value i allowed), and
    /// whether each day field was a star (robfig's `starBit`).
    Fields {
        minutes: u64,
        hours: u64,
        days: u64,
        months: u64,
        weekdays: u64,
        days_star: bool,
        weekdays_star: bool,
    },
    /// `@every <duration>`: at fixed intervals from the previous run.
    Every(u64),
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One field's set; `names` are the values from `min` on, for month and weekday names.
fn field(text: &str, min: u32, max: u32, names: &[&str]) -> Result<(u64, bool), String> {
    let value = |s: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(min + i as u32);
        }
        s.parse::<u32>().map_err(|_| {
            format!("failed to parse int from {s}: strconv.Atoi: parsing {s:?}: invalid syntax")
        })
    };
    let mut bits = 0u64;
    let mut star = false;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (
                r,
                Some(s.parse::<u32>().map_err(|_| {
                    format!(
                        "failed to parse int from {s}: strconv.Atoi: parsing {s:?}: invalid syntax"
                    )
                })?),
            ),
            None => (part, None),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            if step.is_none() {
                star = true;
            }
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let v = value(range)?;
            // `5/15` runs from 5 to the end.
            (v, if step.is_some() { max } else { v })
        };
        if lo < min {
            return Err(format!(
                "beginning of range ({lo}) below minimum ({min}): {part}"
            ));
        }
        if hi > max {
            return Err(format!("end of range ({hi}) above maximum ({max}): {part}"));
        }
        if lo > hi {
            return Err(format!(
                "beginning of range ({lo}) beyond end of range ({hi}): {part}"
            ));
        }
        let step = step.unwrap_or(1);
        if step == 0 {
            return Err(format!("step of range should be a positive number: {part}"));
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, star))
}

/// `@every` durations as Go's `time.ParseDuration` writes them (`1h30m`, `90s`), in seconds.
fn go_duration(text: &str) -> Option<u64> {
    let mut total = 0f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += n * scale;
    }
    // robfig rounds down to whole seconds, at least one.
    Some((total as u64).max(1))
}

impl Schedule {
    /// Parses a schedule; the error is robfig/cron's wording where it matters to a user.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.starts_with("TZ=") || text.starts_with("CRON_TZ=") {
            return Err("cannot use TZ or CRON_TZ in schedule, use timeZone field instead".into());
        }
        if let Some(every) = text.strip_prefix("@every ") {
            return go_duration(every.trim())
                .map(Self::Every)
                .ok_or_else(|| format!("failed to parse duration {text}"));
        }
        let expanded = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => return Err(format!("unrecognized descriptor: {t}")),
            t => t,
        };
        let f: Vec<&str> = expanded.split_whitespace().collect();
        if f.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: [{}]",
                f.len(),
                f.join(" ")
            ));
        }
        let (minutes, _) = field(f[0], 0, 59, &[])?;
        let (hours, _) = field(f[1], 0, 23, &[])?;
        let (days, days_star) = field(f[2], 1, 31, &[])?;
        let (months, _) = field(f[3], 1, 12, &MONTHS)?;
        let (weekdays, weekdays_star) = field(f[4], 0, 6, &WEEKDAYS)?;
        Ok(Self::Fields {
            minutes,
            hours,
            days,
            months,
            weekdays,
            days_star,
            weekdays_star,
        })
    }

    /// The first run strictly after `after`, in time zone `tz`; `None` if there is none within
    /// five years (`0 0 30 2 *`). Field by field as robfig/cron does: a month that does not
    /// match skips to the next month, a day to the next day, an hour to the next hour.
    pub fn next(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let Self::Fields {
            minutes,
            hours,
            months,
            ..
        } = self
        else {
            let Self::Every(secs) = self else {
                return None;
            };
            return after
                .checked_add(Span::new().seconds(i64::try_from(*secs).ok()?))
                .ok();
        };
        let bit = |set: u64, v: i8| set & (1 << v) != 0;
        let start = tz.to_datetime(after);
        let mut t = start
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = start.year() + 5;
        while t.year() <= limit {
            if !bit(*months, t.month()) {
                t = t
                    .first_of_month()
                    .checked_add(1.month())
                    .ok()?
                    .start_of_day();
            } else if !self.day_matches(&t) {
                t = t.start_of_day().checked_add(1.day()).ok()?;
            } else if !bit(*hours, t.hour()) {
                t = t
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
            } else if !bit(*minutes, t.minute()) {
                t = t.checked_add(1.minute()).ok()?;
            } else {
                // A time a clock change skipped runs just after it; one it repeated runs once.
                let run = tz.to_ambiguous_zoned(t).compatible().ok()?.timestamp();
                if run > after {
                    return Some(run);
                }
                t = t.checked_add(1.minute()).ok()?;
            }
        }
        None
    }

    fn day_matches(&self, t: &DateTime) -> bool {
        let Self::Fields {
            days,
            weekdays,
            days_star,
            weekdays_star,
            ..
        } = self
        else {
            return false;
        };
        let bit = |set: u64, v: i8| set & (1 << v) != 0;
        let day = bit(*days, t.day());
        let weekday = bit(*weekdays, t.weekday().to_sunday_zero_offset());
        if *days_star || *weekdays_star {
            day && weekday
        } else {
            day || weekday
        }
    }

    /// The latest run in `(after, now]`, and how many runs were missed in that window
    /// (counting stops at 101, as the controller only warns above 100).
    pub fn latest(
        &self,
        after: Timestamp,
        now: Timestamp,
        tz: &TimeZone,
    ) -> (Option<Timestamp>, usize) {
        let mut latest = None;
        let mut missed = 0;
        let mut t = after;
        while let Some(next) = self.next(t, tz) {
            if next > now {
                break;
            }
            latest = Some(next);
            missed += 1;
            t = next;
            if missed > 100 {
                // Jump to the last run before now without counting further.
                let mut probe = now.checked_sub(Span::new().hours(24)).unwrap_or(now).max(t);
                while let Some(n) = self.next(probe, tz) {
                    if n > now {
                        break;
                    }
                    latest = Some(n);
                    probe = n;
                }
                break;
            }
        }
        (latest, missed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap_or_default()
    }

    fn next(schedule: &str, after: &str) -> String {
        Schedule::parse(schedule)
            .ok()
            .and_then(|s| s.next(at(after), &TimeZone::UTC))
            .map(|t| t.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn fields_lists_ranges_steps_and_names() {
        assert_eq!(
            next("*/5 * * * *", "2026-01-01T00:02:30Z"),
            "2026-01-01T00:05:00Z"
        );
        assert_eq!(
            next("0 9-17/4 * * *", "2026-01-01T10:00:00Z"),
            "2026-01-01T13:00:00Z"
        );
        assert_eq!(
            next("15,45 * * * *", "2026-01-01T00:15:00Z"),
            "2026-01-01T00:45:00Z"
        );
        assert_eq!(
            next("0 0 1 MAR *", "2026-01-15T00:00:00Z"),
            "2026-03-01T00:00:00Z"
        );
        // 2026-01-01 is a Thursday.
        assert_eq!(
            next("30 8 * * mon-fri", "2026-01-02T09:00:00Z"),
            "2026-01-05T08:30:00Z"
        );
        assert_eq!(
            next("5/20 * * * *", "2026-01-01T00:26:00Z"),
            "2026-01-01T00:45:00Z"
        );
        assert_eq!(
            next("@hourly", "2026-01-01T00:00:00Z"),
            "2026-01-01T01:00:00Z"
        );
        assert_eq!(
            next("@every 90s", "2026-01-01T00:00:00Z"),
            "2026-01-01T00:01:30Z"
        );
    }

    #[test]
    fn restricted_day_fields_match_either_and_a_star_makes_them_both_needed() {
        // The 13th, or any Friday: Friday 2026-01-02 comes first.
        assert_eq!(
            next("0 0 13 * 5", "2026-01-01T00:00:00Z"),
            "2026-01-02T00:00:00Z"
        );
        assert_eq!(
            next("0 0 13 * *", "2026-01-01T00:00:00Z"),
            "2026-01-13T00:00:00Z"
        );
        assert_eq!(
            next("0 0 * * 5", "2026-01-03T00:00:00Z"),
            "2026-01-09T00:00:00Z"
        );
    }

    #[test]
    fn a_time_zone_moves_the_runs() {
        let tz = TimeZone::fixed(jiff::tz::offset(2));
        let s = Schedule::parse("0 9 * * *").unwrap_or(Schedule::Every(1));
        assert_eq!(
            s.next(at("2026-01-01T00:00:00Z"), &tz)
                .map(|t| t.to_string()),
            Some("2026-01-01T07:00:00Z".into())
        );
    }

    #[test]
    fn bad_schedules_are_refused_with_robfigs_words() {
        for (bad, why) in [
            ("* * * *", "expected exactly 5 fields, found 4"),
            ("61 * * * *", "end of range (61) above maximum (59)"),
            ("x * * * *", "failed to parse int from x"),
            ("*/0 * * * *", "step of range should be a positive number"),
            ("@sometimes", "unrecognized descriptor"),
            ("TZ=UTC * * * * *", "use timeZone field instead"),
        ] {
            let err = Schedule::parse(bad).err().unwrap_or_default();
            assert!(err.contains(why), "{bad}: {err}");
        }
        assert_eq!(next("0 0 30 2 *", "2026-01-01T00:00:00Z"), "", "never");
    }

    #[test]
    fn the_latest_missed_run_is_found_and_missed_runs_are_counted() {
        let s = Schedule::parse("*/10 * * * *").unwrap_or(Schedule::Every(1));
        let (latest, missed) = s.latest(
            at("2026-01-01T00:00:00Z"),
            at("2026-01-01T00:35:00Z"),
            &TimeZone::UTC,
        );
        assert_eq!(latest, Some(at("2026-01-01T00:30:00Z")));
        assert_eq!(missed, 3);
        let (latest, missed) = s.latest(
            at("2025-01-01T00:00:00Z"),
            at("2026-01-01T00:35:00Z"),
            &TimeZone::UTC,
        );
        assert_eq!(latest, Some(at("2026-01-01T00:30:00Z")));
        assert!(missed > 100);
    }
}
