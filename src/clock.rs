//! Wall-clock time as the API shows it (Unix epoch milliseconds) and as
//! file times count it (nanoseconds), and the engine's time stamps read
//! as Unix seconds.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Nanoseconds since the Unix epoch, as file times count them.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Whole seconds since the Unix epoch of a time stamp as the engine writes
/// them (`YYYY-MM-DDTHH:MM:SS[.fraction]Z`, always UTC); `None` for
/// anything else. The engine's events API takes Unix seconds only.
pub fn unix_seconds(stamp: &str) -> Option<i64> {
    let b = stamp.as_bytes();
    let shape = b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && (b[19] == b'Z' || b[19] == b'.')
        && b[b.len() - 1] == b'Z';
    if !shape {
        return None;
    }
    let field = |at: usize, len: usize| -> Option<i64> {
        let digits = &b[at..at + len];
        digits
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let (year, month, day) = (field(0, 4)?, field(5, 2)?, field(8, 2)?);
    let (hour, minute, second) = (field(11, 2)?, field(14, 2)?, field(17, 2)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm): years start
    // in March, so the leap day is the last of its year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

#[cfg(test)]
mod tests {
    use super::unix_seconds;

    #[test]
    fn engine_time_stamps_read_as_unix_seconds() {
        for (stamp, seconds) in [
            ("1970-01-01T00:00:00Z", 0),
            ("1999-12-31T23:59:59Z", 946_684_799),
            ("2000-03-01T00:00:00Z", 951_868_800),
            ("2024-02-29T12:00:00Z", 1_709_208_000),
            ("2026-11-26T21:28:55.592760441Z", 1_795_728_535),
            ("2100-03-01T00:00:00.5Z", 4_107_542_400),
        ] {
            assert_eq!(unix_seconds(stamp), Some(seconds), "{stamp}");
        }
    }

    #[test]
    fn anything_else_is_not_a_time() {
        for stamp in [
            "",
            "0001-01-01T00:00:00",
            "2026-11-26 21:28:55Z",
            "2026-11-26T21:28:55+01:00",
            "2026-13-01T00:00:00Z",
            "2026-11-26T24:00:00Z",
            "2026-11-2aT21:28:55Z",
            "+026-11-26T21:28:55Z",
            "2026-11-26T21:28:55xZ",
        ] {
            assert_eq!(unix_seconds(stamp), None, "{stamp}");
        }
    }
}
