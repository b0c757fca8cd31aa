//! The library's one error type.
//!
//! Owns: every way a lease operation can fail, each carrying the path it concerns and the cause.
//! Must never: lose the underlying `io::Error`, describe a failure without naming the path, or
//! decide how a program reports it (exit statuses and option names belong to the caller).

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::clock::human_duration;
use crate::verdict::Verdict;

/// Everything that can go wrong while taking, renewing, judging or releasing a lease.
///
/// Every variant names the path it concerns. An I/O failure keeps its `io::Error`
/// ([`Error::io_error`]) so that a caller can classify it (the `leasehold` command maps each
/// variant and errno to a sysexits.h exit status).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let lock = dir.path().join("job.lock");
/// std::fs::create_dir(&lock)?; // a directory is never a lease
/// let err = leasehold::LeaseBuilder::new(&lock).try_acquire().unwrap_err();
/// assert!(matches!(err, leasehold::Error::NotALease { .. }));
/// assert!(err.io_error().is_none());
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call on `path` failed.
    #[error("{path}: cannot {op}: {source}")]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// What leasehold was doing, e.g. "open", "rename into place".
        op: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// `path` exists but is not a leasehold lease; it was left untouched.
    #[error("{path}: not a leasehold lease ({what}); left untouched")]
    NotALease {
        /// The lock path.
        path: PathBuf,
        /// What was found instead.
        what: String,
    },
    /// The lease at `path` was written by a newer leasehold.
    #[error(
        "{path}: lease format version {found} is newer than this leasehold understands ({supported}); left untouched"
    )]
    NewerFormat {
        /// The lock path.
        path: PathBuf,
        /// The version found in the file.
        found: u64,
        /// The newest version this build reads.
        supported: u64,
    },
    /// The lock is held by a live holder and the caller asked not to wait.
    #[error("{path}: {verdict}")]
    WouldBlock {
        /// The lock path.
        path: PathBuf,
        /// Who holds it and why that holder counts as live.
        verdict: Box<Verdict>,
    },
    /// The caller's wait ran out.
    #[error("{path}: gave up after {}: {verdict}", human_duration(*.waited))]
    Timeout {
        /// The lock path.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
        /// The last thing we saw.
        verdict: Box<Verdict>,
    },
    /// The wait was stopped through a [`Cancel`](crate::Cancel) handle before the lease was
    /// ours; nothing was taken, and this contender's place in the queue was given up.
    #[error("{path}: stopped waiting after {}; nothing was taken", human_duration(*.waited))]
    Cancelled {
        /// The lock path.
        path: PathBuf,
        /// How long we had waited.
        waited: Duration,
    },
    /// Some process has sat on the short internal mutex far longer than any lease operation takes.
    #[error(
        "{path}: could not take the lease mutex within {}: it is held by {holder}",
        human_duration(*.waited)
    )]
    MutexStuck {
        /// The mutex file.
        path: PathBuf,
        /// How long we waited for it.
        waited: Duration,
        /// Who holds it, as far as /proc/locks tells.
        holder: String,
    },
    /// Settings that cannot work together.
    #[error("invalid settings: {0}")]
    Settings(String),
    /// This contender's setting (`--shared`, `--slots N`, or a plain lock) disagrees with the
    /// one the lock's holders use: every holder and waiter of one lock must agree.
    #[error(
        "{path}: its holders use it as {held}, but this asks for {asked}: every holder of one lock must use the same setting"
    )]
    Mismatch {
        /// The lock path.
        path: PathBuf,
        /// The setting of the lock's holders (`--slots 3`, `--shared`, `a plain lock`).
        held: String,
        /// The setting asked for here.
        asked: String,
    },
    /// A TTL, heartbeat and grace that cannot work together.
    #[error("invalid settings: {0}")]
    Timing(TimingError),
    /// The lock path itself cannot be used (no file name, parent missing, ...).
    #[error("{path}: {why}")]
    BadPath {
        /// The path as given.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// LOCK's own file name is longer than a file name may be.
    #[error("{path}: the file name is {len} bytes long; the limit is {max} bytes (NAME_MAX)")]
    NameTooLong {
        /// The lock path as given.
        path: PathBuf,
        /// The length of its final component, in bytes.
        len: usize,
        /// The longest file name allowed, in bytes.
        max: usize,
    },
    /// LOCK's own file name has the shape of a shortened helper name (`PREFIX~` and 16 hex
    /// digits): its helper files could be another lock's.
    #[error(
        "{path}: the file name ends in '~' and 16 hex digits after {prefix} bytes, the shape \
         leasehold gives the helper files of a lock whose name is too long to use as it is; a \
         lock of this name could share another lock's helper files: choose another name"
    )]
    ReservedName {
        /// The lock path as given.
        path: PathBuf,
        /// How many bytes come before the `~`.
        prefix: usize,
    },
    /// LOCK's file system cannot make the lock safe (an NFS mount whose locks are host-local).
    #[error("{path}: {why}")]
    UnsafeFileSystem {
        /// The lock path.
        path: PathBuf,
        /// What is wrong and how to fix it.
        why: String,
    },
    /// A holder on this host was hung, and could not be safely stopped, so it was not taken over.
    #[error("{path}: {why}")]
    Refused {
        /// The lock path.
        path: PathBuf,
        /// Why we would not take it over.
        why: String,
    },
    /// Something that is not leasehold's own file sits at a helper file's name (a directory, a
    /// FIFO, a socket, a hard link to another file); it was left untouched.
    #[error("{path}: {why}")]
    Squatted {
        /// The helper file's path.
        path: PathBuf,
        /// What is there, whose it is, and what to do.
        why: String,
    },
    /// A helper file belongs to a user this directory does not let us share it with (or a
    /// sticky directory keeps us from taking it over); it was left untouched.
    #[error("{path}: {why}")]
    Untrusted {
        /// The helper file's path.
        path: PathBuf,
        /// Whose it is and what to do.
        why: String,
    },
    /// No member of the lock's store could serve a request: each endpoint tried refused the
    /// connection, had no leader, or did not answer in time (an etcd cluster down or without a
    /// quorum; an S3 endpoint down, frozen or answering 5xx). `why` names each endpoint tried
    /// and its cause, in words.
    #[error("{path}: cannot {op}: {}{why}", unavailable_lead(path))]
    Unavailable {
        /// The lock's URL.
        path: PathBuf,
        /// What leasehold was doing, e.g. "grant a lease".
        op: &'static str,
        /// Each endpoint tried and why it failed, e.g. `http://h:2379: connection refused`.
        why: String,
    },
    /// Another process changed the lock between our read of it and a write of ours (a store
    /// whose writes are compare-and-swaps: S3), which was therefore not made. An acquisition
    /// looks again by itself; from anything else (`break` of several holders, `ack`), look
    /// again: writes made before it stand.
    #[error("{path}: another process changed the lock between our read and our write: look again")]
    Raced {
        /// The lock's URL.
        path: PathBuf,
    },
    /// Our own lease was no longer ours when we came to change it.
    #[error("{path}: lease {lease_id} is no longer ours: {why}")]
    Lost {
        /// The lock path.
        path: PathBuf,
        /// Our lease id.
        lease_id: String,
        /// What we found instead.
        why: String,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            op,
            source,
        }
    }

    /// The `io::ErrorKind`-style classification: true when the file system is full.
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::Io { source, .. } if is_enospc(source))
    }

    /// Whether this is an NFS "stale file handle" (ESTALE): another host replaced or removed a
    /// file we had looked up. A race to look again after, never a verdict (PROTOCOL.md §9).
    pub(crate) fn is_stale_handle(&self) -> bool {
        self.io_error()
            .is_some_and(|e| e.raw_os_error() == Some(nix::errno::Errno::ESTALE as i32))
    }

    /// The operating system's error behind this one, if it is an I/O failure.
    ///
    /// ```
    /// let e = leasehold::Error::Settings("x".into());
    /// assert!(e.io_error().is_none());
    /// ```
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub(crate) fn is_enospc(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc_consts::ENOSPC) | Some(libc_consts::EDQUOT)
    )
}

/// errno values, via nix so that we need no direct libc dependency.
pub(crate) mod libc_consts {
    use nix::errno::Errno;
    pub const ENOSPC: i32 = Errno::ENOSPC as i32;
    pub const EDQUOT: i32 = Errno::EDQUOT as i32;
    pub const ELOOP: i32 = Errno::ELOOP as i32;
    pub const ENXIO: i32 = Errno::ENXIO as i32;
}

/// Why a TTL, heartbeat and grace cannot work together ([`Error::Timing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingError {
    /// The TTL is zero.
    ZeroTtl,
    /// The heartbeat interval is zero.
    ZeroHeartbeat,
    /// The TTL is longer than [`MAX_TTL`](crate::timing::MAX_TTL).
    TooLong {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// Heartbeat + grace + safety margin is not less than the TTL.
    DoesNotFit {
        /// The TTL.
        ttl: Duration,
        /// The heartbeat interval (given or defaulted).
        heartbeat: Duration,
        /// The grace (given or defaulted).
        grace: Duration,
        /// The safety margin (derived from the TTL).
        margin: Duration,
        /// Whether the heartbeat was given explicitly.
        heartbeat_set: bool,
        /// Whether the grace was given explicitly.
        grace_set: bool,
    },
}

impl TimingError {
    /// The setting to change, by its neutral name: "the TTL", "the heartbeat", "the grace",
    /// or "the heartbeat and the grace". A caller with its own names for the settings (the
    /// `leasehold` command's flags) matches on the variant instead.
    pub fn culprit(&self) -> &'static str {
        match self {
            TimingError::ZeroTtl | TimingError::TooLong { .. } => "the TTL",
            TimingError::ZeroHeartbeat => "the heartbeat",
            TimingError::DoesNotFit {
                heartbeat_set,
                grace_set,
                ..
            } => match (heartbeat_set, grace_set) {
                (true, false) => "the heartbeat",
                (false, true) => "the grace",
                (true, true) => "the heartbeat and the grace",
                (false, false) => "the TTL",
            },
        }
    }
}

impl std::fmt::Display for TimingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            TimingError::ZeroTtl | TimingError::ZeroHeartbeat => {
                write!(f, "{} must be greater than zero", self.culprit())
            }
            TimingError::TooLong { ttl } => write!(
                f,
                "the TTL {} is longer than the longest leasehold grants ({}): the TTL is how long a \
                 silent holder is waited for, not how long the job may run",
                human_duration(ttl),
                human_duration(crate::timing::MAX_TTL)
            ),
            TimingError::DoesNotFit {
                ttl,
                heartbeat,
                grace,
                margin,
                ..
            } => write!(
                f,
                "heartbeat {} + grace {} + safety margin {} must be less than the TTL {}; shorten {} or lengthen the TTL",
                human_duration(heartbeat),
                human_duration(grace),
                human_duration(margin),
                human_duration(ttl),
                self.culprit()
            ),
        }
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What an [`Error::Unavailable`] says before its causes, by the store its lock names.
fn unavailable_lead(path: &std::path::Path) -> &'static str {
    if crate::store::Kind::of(path) == crate::store::Kind::S3 {
        "the S3 endpoint could not serve it: "
    } else {
        "no etcd member could serve it: "
    }
}
