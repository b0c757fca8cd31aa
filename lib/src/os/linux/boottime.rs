//! Instants on CLOCK_BOOTTIME, the clock of every renew deadline.
//!
//! Owns: [`BootInstant`], a point on CLOCK_BOOTTIME. Unlike CLOCK_MONOTONIC (std's `Instant`),
//! CLOCK_BOOTTIME keeps counting while the system is suspended. Other hosts' clocks do too: a
//! holder whose host slept through its TTL must find its renew deadline passed the moment it
//! resumes, not a suspend's length later (PROTOCOL.md §5).
//! Must never: be mixed with `Instant` (a different clock); be used for waits a person asked for
//! (`-w`), which stay on std's `Instant`.

use std::ops::{Add, Sub};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::time::{ClockId, clock_gettime};

/// A point on CLOCK_BOOTTIME (time since boot, suspend included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BootInstant(Duration);

impl BootInstant {
    /// Now. CLOCK_BOOTTIME exists on every kernel leasehold runs on (Linux ≥ 2.6.39); should
    /// reading it ever fail, CLOCK_MONOTONIC (never ahead of it) stands in, so deadlines can
    /// only come early.
    pub(crate) fn now() -> BootInstant {
        let t = clock_gettime(ClockId::CLOCK_BOOTTIME)
            .or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC))
            .unwrap_or_else(|_| TimeSpec::new(0, 0));
        BootInstant(Duration::new(
            t.tv_sec().max(0) as u64,
            t.tv_nsec().clamp(0, 999_999_999) as u32,
        ))
    }

    /// This instant as an absolute CLOCK_BOOTTIME time for a timerfd; never all zero (a zero
    /// expiration would disarm the timer instead of firing at once).
    pub(crate) fn timespec(self) -> TimeSpec {
        TimeSpec::from_duration(self.0.max(Duration::from_nanos(1)))
    }

    /// How long after `earlier` this is (zero if it is not later).
    pub(crate) fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(d))
    }
}

impl Sub<BootInstant> for BootInstant {
    type Output = Duration;
    /// Saturating: an instant before `earlier` gives zero.
    fn sub(self, earlier: BootInstant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_instants_advance_and_never_run_ahead_of_monotonic_deadlines_backwards() {
        let a = BootInstant::now();
        std::thread::sleep(Duration::from_millis(2));
        let b = BootInstant::now();
        assert!(b > a);
        assert!(b - a >= Duration::from_millis(2));
        assert_eq!(a - b, Duration::ZERO);
        assert_eq!((a + Duration::from_secs(1)) - a, Duration::from_secs(1));
    }

    #[test]
    fn boottime_is_never_behind_monotonic() {
        let mono = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap();
        let boot = BootInstant::now();
        let mono = Duration::new(mono.tv_sec() as u64, mono.tv_nsec() as u32);
        assert!(boot.0 >= mono, "boottime {:?} < monotonic {mono:?}", boot.0);
    }
}
