//! The timing rules of a lease: TTL, heartbeat, grace and the safety margin between them.
//!
//! Owns: the defaults (heartbeat TTL/3, grace min(5 s, TTL/4), margin max(20 ms, TTL/20)), the
//! check that explicit values fit, the renew window (how long after the start of a counted
//! renewal a guard is lost without another), and the other waits derived from the TTL.
//! Must never: accept `heartbeat + grace + margin >= ttl`: a holder must be able to fence its
//! command (grace) with a margin to spare before any contender may judge its lease stale.

use std::time::Duration;

use crate::error::{Error, Result, TimingError};

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
    /// Fills in defaults (heartbeat TTL/3, grace min(5s, TTL/4), margin max(20ms, TTL/20)) and
    /// checks that explicit values fit. The error ([`TimingError`]) says which setting to change.
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
        let margin = (ttl / 20).max(Duration::from_millis(20));
        let hb = heartbeat.unwrap_or(ttl / 3);
        let grace_v = grace.unwrap_or((ttl / 4).min(Duration::from_secs(5)));
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
