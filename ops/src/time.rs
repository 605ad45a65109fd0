//! Times on the command line (`--interval`, `--timeout`, `--pause`):
//! `2s`, `1.5s`, `500ms`, plain seconds, from 0 to a day. It parses only;
//! each option says what least time it accepts.

use std::time::Duration;

/// Longest time accepted on the command line: a day.
const MAX_MS: f64 = 86_400_000.0;

/// A time on the command line: `2s`, `1.5s`, `500ms` or plain seconds,
/// at least `min` and at most a day, in whole milliseconds.
///
/// # Errors
/// A text that is not such a time, or one out of those bounds, with a
/// message that says what is accepted.
pub fn parse_time(s: &str, min: Duration) -> Result<Duration, String> {
    let (num, unit) = match s.strip_suffix("ms") {
        Some(n) => (n, 1.0),
        None => (s.strip_suffix('s').unwrap_or(s), 1000.0),
    };
    let ms = num
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && *n >= 0.0)
        .map(|n| n * unit)
        .ok_or_else(|| format!("{s:?}: give a time such as 2s, 1.5s or 500ms"))?;
    if ms < min.as_secs_f64() * 1000.0 {
        return Err(format!("{s:?}: at least {}ms", min.as_millis()));
    }
    if ms > MAX_MS {
        return Err(format!("{s:?}: at most a day"));
    }
    // Whole milliseconds, within a day: exact in an f64 and a u64.
    Ok(Duration::from_millis(ms.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::parse_time;
    use std::time::Duration;

    #[test]
    fn times_parse_and_are_bounded() {
        let min = Duration::from_millis(100);
        assert_eq!(parse_time("2s", min), Ok(Duration::from_secs(2)));
        assert_eq!(parse_time("250ms", min), Ok(Duration::from_millis(250)));
        assert_eq!(parse_time("3", min), Ok(Duration::from_secs(3)));
        assert_eq!(parse_time("1.5s", min), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_time("0.25s", min), Ok(Duration::from_millis(250)));
        assert_eq!(parse_time("0ms", Duration::ZERO), Ok(Duration::ZERO));
        assert!(parse_time("-1s", min).is_err());
        assert!(parse_time("NaNs", min).is_err());
        assert!(parse_time("2d", min).is_err());
        assert!(parse_time("100000s", min).is_err());
        assert!(parse_time("50ms", min).is_err());
        assert!(parse_time("fast", min).is_err());
    }
}
