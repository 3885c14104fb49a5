//! Durations (`1h30m`) and times (RFC 3339, UTC) in and out.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, SecondsFormat, Utc};

/// `30s`, `10m`, `1h30m`, `250ms`, `2d`, `0`: one or more numbers each followed by a unit
/// (`d`, `h`, `m`, `s`, `ms`), largest first.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("{why} in {text:?} (e.g. 30s, 10m, 1h30m, 250ms, 2d)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad("no duration"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    let mut last_unit = u64::MAX;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad("a number is missing"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| bad("a number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_ms = match &rest[..unit_len] {
            "d" => 86_400_000,
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1_000,
            "ms" => 1,
            "" => return Err(bad("a unit (d, h, m, s, ms) is missing")),
            other => return Err(bad(&format!("unknown unit {other:?}"))),
        };
        if unit_ms >= last_unit {
            return Err(bad(
                "units must go from the largest to the smallest, once each",
            ));
        }
        last_unit = unit_ms;
        rest = &rest[unit_len..];
        let ms = number
            .checked_mul(unit_ms)
            .ok_or_else(|| bad("a duration too long"))?;
        total = total
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| bad("a duration too long"))?;
    }
    Ok(total)
}

/// A time in RFC 3339 (`2026-11-25T21:00:00Z`, any offset), not before 1970.
pub(crate) fn parse_time(text: &str) -> Result<SystemTime, String> {
    let time = DateTime::parse_from_rfc3339(text)
        .map_err(|e| format!("{e} in {text:?}: give RFC 3339, e.g. 2026-11-25T21:00:00Z"))?;
    let time = SystemTime::from(time.with_timezone(&Utc));
    if time < UNIX_EPOCH {
        return Err(format!("{text:?} is before 1970"));
    }
    Ok(time)
}

/// Milliseconds since the Unix epoch.
pub(crate) fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// RFC 3339 in UTC: to the second for people, to the millisecond for scripts.
pub(crate) fn rfc3339(time: SystemTime, millis: bool) -> String {
    let format = if millis {
        SecondsFormat::Millis
    } else {
        SecondsFormat::Secs
    };
    match i64::try_from(epoch_ms(time))
        .ok()
        .and_then(DateTime::<Utc>::from_timestamp_millis)
    {
        Some(at) => at.to_rfc3339_opts(format, true),
        // Past the calendar's range: said, not a panic.
        None => format!("{} ms after 1970", epoch_ms(time)),
    }
}

/// The latest due time people may give (RFC 3339 has four-digit years).
const LAST_DUE_MS: u64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z

/// `now + after`, if that is a time RFC 3339 can write (before year 10000).
pub(crate) fn after_now(now: SystemTime, after: Duration) -> Result<SystemTime, String> {
    now.checked_add(after)
        .filter(|at| epoch_ms(*at) <= LAST_DUE_MS)
        .ok_or_else(|| format!("{} from now is past the year 9999", short(after)))
}

/// `in 5m`, `3s ago`, `now` (under half a second), to the nearest second, with the two
/// largest units (`in 1h30m`).
pub(crate) fn relative(time: SystemTime, now: SystemTime) -> String {
    let (ahead, gap) = match time.duration_since(now) {
        Ok(ahead) => (true, ahead),
        Err(behind) => (false, behind.duration()),
    };
    let secs = gap.as_secs() + u64::from(gap.subsec_millis() >= 500);
    match (secs, ahead) {
        (0, _) => "now".to_owned(),
        (_, true) => format!("in {}", short(Duration::from_secs(secs))),
        (_, false) => format!("{} ago", short(Duration::from_secs(secs))),
    }
}

/// A duration with its two largest units: `1h30m`, `3s`, `250ms`, `2d4h`.
pub(crate) fn short(duration: Duration) -> String {
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let units = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];
    let mut secs = ms / 1_000;
    let mut parts = Vec::new();
    for (name, size) in units {
        if secs >= size || !parts.is_empty() {
            parts.push((secs / size, name));
            secs %= size;
        }
        if parts.len() == 2 {
            break;
        }
    }
    let text: String = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let ok = |text| parse_duration(text).unwrap();
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("10m"), Duration::from_secs(600));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("2d"), Duration::from_secs(172_800));
        assert_eq!(ok("1m500ms"), Duration::from_millis(60_500));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        for bad in [
            "",
            "5",
            "s",
            "1x",
            "1s1h",
            "1s1s",
            "-1s",
            "1.5s",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_parse_and_print() {
        let at = parse_time("2026-11-25T21:00:00Z").unwrap();
        assert_eq!(rfc3339(at, false), "2026-11-25T21:00:00Z");
        assert_eq!(rfc3339(at, true), "2026-11-25T21:00:00.000Z");
        assert_eq!(parse_time("2026-11-25T22:00:00+01:00").unwrap(), at);
        assert!(parse_time("tomorrow").is_err());
        assert!(parse_time("1969-12-31T23:59:59Z").is_err());
        // Beyond the calendar: words, not a panic.
        let far = UNIX_EPOCH + Duration::from_secs(u64::MAX / 4);
        assert!(rfc3339(far, false).ends_with("ms after 1970"));
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!(after_now(now, Duration::from_secs(60)).is_ok());
        assert!(after_now(now, Duration::from_secs(99_999_999_999 * 86_400)).is_err());
        assert!(after_now(now, Duration::MAX).is_err());
    }

    #[test]
    fn relative_times_read_well() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let s = Duration::from_secs;
        assert_eq!(relative(now + s(300), now), "in 5m");
        assert_eq!(relative(now - s(3), now), "3s ago");
        assert_eq!(relative(now + s(5400), now), "in 1h30m");
        assert_eq!(relative(now + s(3600), now), "in 1h");
        assert_eq!(relative(now + Duration::from_millis(400), now), "now");
        assert_eq!(
            relative(now + Duration::from_millis(599_700), now),
            "in 10m"
        );
        assert_eq!(relative(now - Duration::from_millis(2_500), now), "3s ago");
        assert_eq!(relative(now + s(2 * 86_400 + 4 * 3600 + 5), now), "in 2d4h");
    }
}
