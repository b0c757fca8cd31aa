//! Time as leasehold sees it: the wall clock (shown to people, never trusted for liveness) and
//! CLOCK_BOOTTIME (compared only between processes of one boot of one host).
//!
//! Owns: the injectable [`Clock`] trait, the real clock, and the fixed-width RFC 3339 format used
//! in lease records. Must never: compare boottime readings across hosts or boots, or decide
//! liveness from a wall-clock timestamp written by another host.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of time. The real one is [`SystemClock`]; tests inject skewed ones.
///
/// ```
/// use leasehold::{Clock, SystemClock};
/// let c = SystemClock;
/// assert!(c.boottime() > std::time::Duration::ZERO);
/// ```
pub trait Clock: Send + Sync + fmt::Debug {
    /// The wall clock, written into leases for people to read.
    fn wall(&self) -> SystemTime;
    /// Time since this host booted, including time suspended (CLOCK_BOOTTIME).
    fn boottime(&self) -> Duration;
}

/// The machine's real clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
    fn boottime(&self) -> Duration {
        match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
            Ok(ts) => Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32),
            // CLOCK_BOOTTIME exists on every Linux since 2.6.39; fall back to monotonic anyway.
            Err(_) => match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
                Ok(ts) => Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32),
                Err(_) => Duration::ZERO,
            },
        }
    }
}

/// A wall clock shifted by a fixed offset: for testing skew between hosts.
///
/// ```
/// use leasehold::{Clock, SkewedClock};
/// let ahead = SkewedClock::ahead(std::time::Duration::from_secs(600));
/// assert!(ahead.wall() > std::time::SystemTime::now());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    ahead: bool,
    by: Duration,
}

impl SkewedClock {
    /// A wall clock running `by` ahead of the real one.
    pub fn ahead(by: Duration) -> Self {
        SkewedClock { ahead: true, by }
    }
    /// A wall clock running `by` behind the real one.
    pub fn behind(by: Duration) -> Self {
        SkewedClock { ahead: false, by }
    }
}

impl Clock for SkewedClock {
    fn wall(&self) -> SystemTime {
        let now = SystemTime::now();
        if self.ahead {
            now + self.by
        } else {
            now.checked_sub(self.by).unwrap_or(UNIX_EPOCH)
        }
    }
    fn boottime(&self) -> Duration {
        SystemClock.boottime()
    }
}

/// Width of a timestamp written by [`format_rfc3339`].
pub const RFC3339_WIDTH: usize = 27;

/// Formats a time as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (always 27 bytes for years 0000–9999).
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// let t = UNIX_EPOCH + Duration::from_micros(1_764_432_513_123_456);
/// assert_eq!(leasehold::format_rfc3339(t), "2025-11-29T16:08:33.123456Z");
/// ```
pub fn format_rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs().min(253_402_300_799); // 9999-12-31T23:59:59
    let micros = d.subsec_micros();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, dd) = civil_from_days(days);
    // Digits into a fixed template rather than through a formatter: two of these are written
    // on the path of every take and release.
    let mut b = *b"0000-00-00T00:00:00.000000Z";
    for (field, v) in [
        (0..4, y.unsigned_abs()),
        (5..7, u64::from(m)),
        (8..10, u64::from(dd)),
        (11..13, rem / 3600),
        (14..16, (rem / 60) % 60),
        (17..19, rem % 60),
        (20..26, u64::from(micros)),
    ] {
        let mut v = v;
        for d in b[field].iter_mut().rev() {
            *d = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }
    // ASCII digits and separators: always UTF-8.
    std::str::from_utf8(&b)
        .map(str::to_owned)
        .unwrap_or_default()
}

/// Parses the format written by [`format_rfc3339`] (and plain `...SSZ`). Returns `None` otherwise.
///
/// ```
/// let t = leasehold::parse_rfc3339("2025-11-29T16:08:33.123456Z").unwrap();
/// assert_eq!(leasehold::format_rfc3339(t), "2025-11-29T16:08:33.123456Z");
/// ```
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let rest = s.get(19..)?;
    let micros = if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.strip_suffix('Z')?;
        if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let mut v: u64 = digits.parse().ok()?;
        for _ in digits.len()..6 {
            v *= 10;
        }
        for _ in 6..digits.len() {
            v /= 10;
        }
        v
    } else if rest == "Z" {
        0
    } else {
        return None;
    };
    let days = days_from_civil(y, mo, d);
    let secs = days.checked_mul(86_400)? + h * 3600 + mi * 60 + se;
    if secs < 0 {
        return None;
    }
    Some(UNIX_EPOCH + Duration::from_secs(secs as u64) + Duration::from_micros(micros))
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A short human form of a duration: `850ms`, `3s`, `12m`, `2h05m`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(leasehold::human_duration(Duration::from_millis(850)), "850ms");
/// assert_eq!(leasehold::human_duration(Duration::from_secs(725)), "12m05s");
/// ```
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    if s < 60 {
        if ms < 10_000 && !ms.is_multiple_of(1000) {
            return format!("{:.1}s", d.as_secs_f64());
        }
        return format!("{s}s");
    }
    if s < 3600 {
        return format!("{}m{:02}s", s / 60, s % 60);
    }
    format!("{}h{:02}m", s / 3600, (s / 60) % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_formatter_writes_what_the_format_macro_wrote() {
        let reference = |t: SystemTime| {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
            let secs = d.as_secs().min(253_402_300_799);
            let micros = d.subsec_micros();
            let rem = secs % 86_400;
            let (y, m, dd) = civil_from_days((secs / 86_400) as i64);
            format!(
                "{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{micros:06}Z",
                rem / 3600,
                (rem / 60) % 60,
                rem % 60
            )
        };
        let mut t = 0u64;
        let mut seen = 0;
        // Every leap rule, month end and clamp: steps of a prime number of microseconds
        // across the whole range, and the edges.
        while t < 260_000_000_000_000_000 {
            let at = UNIX_EPOCH + Duration::from_micros(t);
            assert_eq!(format_rfc3339(at), reference(at), "{t}");
            t += 1_000_003_000_007;
            seen += 1;
        }
        assert!(seen > 200_000);
        for at in [
            UNIX_EPOCH,
            UNIX_EPOCH - Duration::from_secs(1),
            UNIX_EPOCH + Duration::from_micros(951_782_400_000_000), // 2000-02-29
            UNIX_EPOCH + Duration::from_micros(253_402_300_799_999_999),
            UNIX_EPOCH + Duration::from_secs(u64::MAX / 4),
        ] {
            assert_eq!(format_rfc3339(at), reference(at));
        }
    }

    #[test]
    fn roundtrip_many_instants() {
        for secs in [
            0u64,
            951_782_400,
            1_709_164_800,
            4_102_444_800,
            253_402_300_799,
        ] {
            let t = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(999_999);
            let s = format_rfc3339(t);
            assert_eq!(s.len(), RFC3339_WIDTH, "{s}");
            assert_eq!(parse_rfc3339(&s), Some(t), "{s}");
        }
    }

    #[test]
    fn parse_rejects_garbage() {
        for s in [
            "",
            "2025-13-01T00:00:00Z",
            "2025-11-31T00:00:0xZ",
            "abcd-ef-ghTij:kl:mnZ",
        ] {
            assert_eq!(parse_rfc3339(s), None, "{s}");
        }
    }
}
