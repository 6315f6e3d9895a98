//! UTC timestamps without a date crate: the only dependencies allowed here are
//! serde and serde_json, and the fixtures need nothing beyond formatting
//! seconds since the epoch as RFC 3339.

/// Days since 1970-01-01 for a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`), so fixture anchors can be written as readable dates.
pub(crate) const fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub(crate) const fn epoch(y: i64, m: i64, d: i64, hh: i64, mm: i64, ss: i64) -> i64 {
    days_from_civil(y, m, d) * 86_400 + hh * 3_600 + mm * 60 + ss
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `2025-03-04T05:06:07Z`, the exact shape GitHub's API returns.
pub(crate) fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        (rem % 3_600) / 60,
        rem % 60
    )
}

/// Log-line flavour (`2025-03-04 05:06:07.123`), distinct from the API
/// format so bodies look like pasted logs rather than JSON.
pub(crate) fn log_stamp(secs: i64, millis: u64) -> String {
    let s = rfc3339(secs);
    format!("{} {}.{:03}", &s[..10], &s[11..19], millis % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(epoch(2025, 3, 4, 5, 6, 7)), "2025-03-04T05:06:07Z");
        assert_eq!(
            rfc3339(epoch(2024, 12, 31, 23, 59, 59)),
            "2024-12-31T23:59:59Z"
        );
        assert_eq!(
            log_stamp(epoch(2025, 1, 2, 3, 4, 5), 42),
            "2025-01-02 03:04:05.042"
        );
    }
}
