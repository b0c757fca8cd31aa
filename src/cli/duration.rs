//! DURATION values on the command line: `1.5` (seconds, as `flock -w` takes them), `500ms`,
//! `30s`, `5m`, `1h30m`.
//!
//! Owns: turning the text of one flag value into a `Duration`, with an error message that says
//! what is accepted. Must never: panic or overflow on any input, or guess a unit that was not
//! written (only a bare number means seconds).

use std::time::Duration;

/// Parses a DURATION: a bare number of seconds (`1.5`), or one or more `<number><unit>` parts
/// (`500ms`, `30s`, `5m`, `2h`, `1d`, `1h30m`); numbers may have a decimal fraction.
///
/// ```
/// use std::time::Duration;
/// use leasehold_cli::cli::duration::parse_duration;
/// assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
/// assert!(parse_duration("5 parsecs").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    let bad = |why: &str| format!("{why}; expected e.g. 1.5 (seconds), 500ms, 30s, 5m or 1h30m");
    if s.is_empty() {
        return Err(bad("empty duration"));
    }
    if let Ok(secs) = s.parse::<f64>() {
        return seconds(secs).ok_or_else(|| bad("not a finite, non-negative number of seconds"));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(bad(&format!("'{rest}' does not start with a number")));
        }
        let (num, after) = rest.split_at(num_len);
        let n: f64 = num
            .parse()
            .map_err(|_| bad(&format!("'{num}' is not a number")))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = match unit {
            "ms" => 0.001,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            "" => return Err(bad(&format!("'{num}' needs a unit after other parts"))),
            other => return Err(bad(&format!("unknown unit '{other}'"))),
        };
        total += n * scale;
        rest = next;
    }
    seconds(total).ok_or_else(|| bad("duration out of range"))
}

fn seconds(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("1.5"), Ok(ms(1500)));
        assert_eq!(parse_duration("2"), Ok(ms(2000)));
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("30s"), Ok(ms(30_000)));
        assert_eq!(parse_duration("5m"), Ok(ms(300_000)));
        assert_eq!(parse_duration("1h30m"), Ok(ms(5_400_000)));
        assert_eq!(parse_duration("1m30s500ms"), Ok(ms(90_500)));
        assert_eq!(parse_duration("0.25s"), Ok(ms(250)));
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "",
            "abc",
            "5x",
            "-1",
            "1h30",
            "ms",
            "1..5s",
            "nan",
            "inf",
            "1e400",
            "s5",
            "5 s",
            "99999999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
