//! The timing rules of a lease: TTL, heartbeat, grace and the safety margin between them.
//!
//! Owns: the defaults — the one home of the default TTL ([`DEFAULT_TTL`]) and of the heartbeat,
//! grace and margin rules ([`HEARTBEAT_DIVISOR`], [`GRACE_DIVISOR`] and [`GRACE_CAP`],
//! [`MARGIN_DIVISOR`] and [`MARGIN_FLOOR`]; in words, [`heartbeat_rule`], [`grace_rule`],
//! [`margin_rule`], which `--help`, the manual page and `tests/cli/defaults.rs` use) — the
//! check that explicit values fit, the renew window (how long after the start of a counted
//! renewal a guard is lost without another), and the other waits derived from the TTL.
//! Must never: accept `heartbeat + grace + margin >= ttl`: a holder must be able to fence its
//! command (grace) with a margin to spare before any contender may judge its lease stale.

use std::time::Duration;

use crate::error::{Error, Result, TimingError};

/// The time-to-live of a lease when none is given (`LeaseBuilder::new`, `leasehold run --ttl`,
/// `LEASEHOLD_FLOCK_TTL`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// [`DEFAULT_TTL`] as the command line writes a DURATION (`--ttl`'s default in `--help`); a unit
/// test checks that it says the same.
pub const DEFAULT_TTL_TEXT: &str = "30s";

/// The default heartbeat (renewal interval) is TTL / this.
pub const HEARTBEAT_DIVISOR: u32 = 3;

/// The default grace (SIGTERM to SIGKILL when fencing) is TTL / this, at most [`GRACE_CAP`].
pub const GRACE_DIVISOR: u32 = 4;

/// The most the default grace is.
pub const GRACE_CAP: Duration = Duration::from_secs(5);

/// The safety margin is TTL / this, at least [`MARGIN_FLOOR`].
pub const MARGIN_DIVISOR: u32 = 20;

/// The least the safety margin is.
pub const MARGIN_FLOOR: Duration = Duration::from_millis(20);

/// The default heartbeat in words, as help and documents state it: `TTL/3`.
pub fn heartbeat_rule() -> String {
    format!("TTL/{HEARTBEAT_DIVISOR}")
}

/// The default grace in words: `min(5s, TTL/4)`.
pub fn grace_rule() -> String {
    format!(
        "min({}, TTL/{GRACE_DIVISOR})",
        crate::clock::human_duration(GRACE_CAP)
    )
}

/// The safety margin in words: `max(20ms, TTL/20)`.
pub fn margin_rule() -> String {
    format!(
        "max({}, TTL/{MARGIN_DIVISOR})",
        crate::clock::human_duration(MARGIN_FLOOR)
    )
}

/// The longest TTL leasehold grants (24 h, as `consul lock`'s sessions): a TTL is how long a
/// silent holder is waited for, not how long a job may run. A record claiming more was not
/// written by this leasehold, and `break --force` clears it at once (PROTOCOL.md §10).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// Timing of a guard, validated: `heartbeat + grace + margin < ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Time-to-live: how long without a visible heartbeat before others may presume us dead.
    pub ttl: Duration,
    /// Renewal interval.
    pub heartbeat: Duration,
    /// Time between SIGTERM and SIGKILL when fencing a command.
    pub grace: Duration,
    /// Safety margin kept between our own fencing and the earliest takeover.
    pub margin: Duration,
}

impl Timing {
    /// Fills in defaults ([`heartbeat_rule`], [`grace_rule`], [`margin_rule`]) and checks that explicit values fit. The error ([`TimingError`]) says which setting to change.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::Timing;
    /// let t = Timing::new(Duration::from_secs(30), None, None).unwrap();
    /// assert_eq!(t.heartbeat, Duration::from_secs(10));
    /// assert!(Timing::new(Duration::from_secs(1), Some(Duration::from_secs(1)), None).is_err());
    /// ```
    pub fn new(
        ttl: Duration,
        heartbeat: Option<Duration>,
        grace: Option<Duration>,
    ) -> Result<Timing> {
        if ttl.is_zero() {
            return Err(Error::Timing(TimingError::ZeroTtl));
        }
        if ttl > MAX_TTL {
            return Err(Error::Timing(TimingError::TooLong { ttl }));
        }
        let margin = (ttl / MARGIN_DIVISOR).max(MARGIN_FLOOR);
        let hb = heartbeat.unwrap_or(ttl / HEARTBEAT_DIVISOR);
        let grace_v = grace.unwrap_or((ttl / GRACE_DIVISOR).min(GRACE_CAP));
        if hb.is_zero() {
            return Err(Error::Timing(TimingError::ZeroHeartbeat));
        }
        if hb + grace_v + margin >= ttl {
            return Err(Error::Timing(TimingError::DoesNotFit {
                ttl,
                heartbeat: hb,
                grace: grace_v,
                margin,
                heartbeat_set: heartbeat.is_some(),
                grace_set: grace.is_some(),
            }));
        }
        Ok(Timing {
            ttl,
            heartbeat: hb,
            grace: grace_v,
            margin,
        })
    }

    /// How long after the start of a successful renewal the guard is lost without another.
    pub fn renew_window(&self) -> Duration {
        self.ttl - self.grace - self.margin
    }

    /// How soon a renewal that failed transiently is tried again: heartbeat/4, within 1–100 ms.
    pub(crate) fn renew_retry(&self) -> Duration {
        (self.heartbeat / 4).clamp(Duration::from_millis(1), Duration::from_millis(100))
    }

    /// How long a one-shot acquisition waits for the mutex: TTL/2, at most 500 ms.
    pub(crate) fn one_shot_mutex_wait(&self) -> Duration {
        (self.ttl / 2).min(Duration::from_millis(500))
    }

    /// How long a release waits for the mutex to write its full released record: TTL, at most 5 s.
    pub(crate) fn release_mutex_wait(&self) -> Duration {
        self.ttl.min(Duration::from_secs(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ttl_text_says_default_ttl() {
        assert_eq!(crate::clock::human_duration(DEFAULT_TTL), DEFAULT_TTL_TEXT);
    }

    #[test]
    fn rules_in_words_are_the_defaults_filled_in() {
        assert_eq!(heartbeat_rule(), "TTL/3");
        assert_eq!(grace_rule(), "min(5s, TTL/4)");
        assert_eq!(margin_rule(), "max(20ms, TTL/20)");
        let t = Timing::new(DEFAULT_TTL, None, None).expect("the defaults fit");
        assert_eq!(t.heartbeat, DEFAULT_TTL / HEARTBEAT_DIVISOR);
        assert_eq!(t.grace, GRACE_CAP.min(DEFAULT_TTL / GRACE_DIVISOR));
        assert_eq!(t.margin, MARGIN_FLOOR.max(DEFAULT_TTL / MARGIN_DIVISOR));
    }
}
