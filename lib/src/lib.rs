//! # leasehold
//!
//! Guard a job with a *lease* on a file instead of a bare lock.
//!
//! A lease is a JSON record in the lock file itself — who holds it (PID, process start time,
//! host, boot id, user, command), since when, a fencing token that grows with every new holder,
//! and a heartbeat the holder renews while its job runs. A contender judges the lease: a holder
//! on the same host whose processes are gone is dead at once; a holder anywhere whose heartbeat
//! has not moved for a full TTL is presumed dead. A holder that cannot renew in time is *lost*
//! and must stop its work before anyone else may take over.
//!
//! ```
//! use std::time::Duration;
//! # fn main() -> Result<(), leasehold::Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let lock = dir.path().join("backup.lock");
//!
//! let guard = leasehold::LeaseBuilder::new(&lock)
//!     .ttl(Duration::from_secs(30))
//!     .try_acquire()?;
//!
//! // A second contender is refused while the first holds it, and told who holds it.
//! let err = leasehold::LeaseBuilder::new(&lock).try_acquire().unwrap_err();
//! assert!(matches!(err, leasehold::Error::WouldBlock { .. }));
//!
//! let token = guard.token(); // hand this to the resource you guard
//! guard.release_with("exit 0")?;
//!
//! // The next holder gets a greater token.
//! let next = leasehold::LeaseBuilder::new(&lock).try_acquire()?;
//! assert!(next.token() > token);
//! # Ok(()) }
//! ```
//!
//! The on-disk format and the safety argument are in `docs/PROTOCOL.md`.

#![deny(missing_docs)]

// Linux only: leases are judged and jobs verified through pidfds, open-file-description locks,
// timers on CLOCK_BOOTTIME and /proc (README, "Linux only").
#[cfg(not(target_os = "linux"))]
compile_error!(
    "leasehold runs on Linux only (5.3 or newer): it needs pidfd_open, open-file-description \
     locks, CLOCK_BOOTTIME timers and /proc, which this target does not have"
);

// Every Linux-only kernel interface that has a module of its own (os/linux/mod.rs says which);
// re-exported under their old names so that `crate::klock::…` and the like keep working.
#[cfg(target_os = "linux")]
mod os;
#[cfg(target_os = "linux")]
use os::linux::{boottime, cancel, fsinfo, klock};

mod acquire;
mod badge;
mod builder;
mod clock;
mod ending;
mod epoch;
mod error;
mod fsio;
mod grave;
mod guard;
mod handover;
mod identity;
mod judge;
mod keeper;
mod lockdir;
mod loss;
mod mutex;
mod observe;
mod paths;
mod runtime;
// Reading /proc: public for the `leasehold` command's supervisor and this workspace's tests;
// not a stable API.
#[doc(hidden)]
pub mod process;
mod queue;
mod record;
mod slots;
mod status;
mod store;
mod takeover;
pub mod text;
mod timing;
mod verdict;
mod wait;

pub use acquire::Acquirer;
pub use badge::{KeeperBadge, keeper_badge};
pub use builder::LeaseBuilder;
pub use cancel::Cancel;
pub use clock::{Clock, SkewedClock, SystemClock, format_rfc3339, human_duration, parse_rfc3339};
pub use ending::{Ack, Acked, EndKind, History, LastEnding, SKIPPED, ack, last_ending, too_soon};
pub use error::{Error, Result, TimingError};
pub use guard::{LeaseGuard, drop_unreachable, serve_blocked};
pub use handover::{OPEN_TAKES_WITHIN, Served};
pub use identity::Identity;
pub use loss::LossReason;
pub use paths::{FLOCK_LEASE_SUFFIX, LockPaths, existing_lease_beside, lease_beside};
pub use record::{
    Ending, FORMAT_VERSION, Holder, Lease, LeaseState, MAX_WIDTH, Mode, PLAIN_FORMAT_VERSION,
};
pub use runtime::{existing_flock_lease, flock_lease_path};
pub use status::{AtTerminal, BreakMode, Broken, Frees, break_lease, status, status_with};
pub use timing::{
    DEFAULT_TTL, DEFAULT_TTL_TEXT, GRACE_CAP, GRACE_DIVISOR, HEARTBEAT_DIVISOR, MARGIN_DIVISOR,
    MARGIN_FLOOR, MAX_TTL, Timing, grace_rule, heartbeat_rule, margin_rule,
};
pub use verdict::Waiting;
pub use verdict::{ServerLease, State, Verdict};

/// Whether LOCK names a lock kept by a store rather than a file (`etcd://…`, `s3://…`): such a
/// lock has no directory, mutex or files beside it, and its jobs are bound to it by their
/// environment alone.
pub fn is_store_url(lock: impl AsRef<std::path::Path>) -> bool {
    store::Kind::of(lock.as_ref()) != store::Kind::File
}
