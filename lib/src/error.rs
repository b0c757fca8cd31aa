//! The library's one error type.
//!
//! Owns: every way a lease operation can fail, each carrying the path it concerns and the cause,
//! and the sysexits-style exit code a command-line caller should report for it.
//! Must never: lose the underlying `io::Error`, or describe a failure without naming the path.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::verdict::Verdict;

/// Everything that can go wrong while taking, renewing, judging or releasing a lease.
///
/// Every variant names the path it concerns. [`Error::exit_code`] maps each to the exit status
/// that `leasehold run` documents.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let lock = dir.path().join("job.lock");
/// std::fs::create_dir(&lock)?; // a directory is never a lease
/// let err = leasehold::LeaseBuilder::new(&lock).try_acquire().unwrap_err();
/// assert!(matches!(err, leasehold::Error::NotALease { .. }));
/// assert_eq!(err.exit_code(), 65);
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
    #[error("{path}: gave up after {waited:?}: {verdict}")]
    Timeout {
        /// The lock path.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
        /// The last thing we saw.
        verdict: Box<Verdict>,
    },
    /// Some process has sat on the short internal mutex far longer than any lease operation takes.
    #[error("{path}: could not take the lease mutex within {waited:?}: it is held by {holder}")]
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

/// Exit statuses (sysexits.h) used by the command-line tool.
pub mod exit {
    /// Command-line usage error.
    pub const USAGE: i32 = 64;
    /// LOCK exists but is not a leasehold lease, or is of a newer format.
    pub const DATAERR: i32 = 65;
    /// Cannot open LOCK or its directory.
    pub const NOINPUT: i32 = 66;
    /// Internal error.
    pub const SOFTWARE: i32 = 70;
    /// Cannot create a file, or no space.
    pub const CANTCREAT: i32 = 73;
    /// The lease was lost and the command fenced.
    pub const IOERR_FENCED: i32 = 74;
    /// The lock could not be had (held, or the wait ran out); `break` refused.
    pub const TEMPFAIL: i32 = 75;
    /// Permission denied.
    pub const NOPERM: i32 = 77;
    /// LOCK's file system cannot make the lock safe (configuration error).
    pub const CONFIG: i32 = 78;
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

    /// The exit status `leasehold run` reports for this error (sysexits.h).
    ///
    /// ```
    /// let e = leasehold::Error::Settings("x".into());
    /// assert_eq!(e.exit_code(), 64);
    /// ```
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Io { source, .. } => io_exit_code(source),
            Error::NotALease { .. } | Error::NewerFormat { .. } | Error::Squatted { .. } => {
                exit::DATAERR
            }
            Error::Untrusted { .. } => exit::NOPERM,
            Error::WouldBlock { .. } | Error::Timeout { .. } | Error::MutexStuck { .. } => {
                exit::TEMPFAIL
            }
            Error::Refused { .. } => exit::TEMPFAIL,
            Error::UnsafeFileSystem { .. } => exit::CONFIG,
            Error::Settings(_) | Error::NameTooLong { .. } => exit::USAGE,
            Error::BadPath { .. } => exit::NOINPUT,
            Error::Lost { .. } => exit::IOERR_FENCED,
        }
    }
}

pub(crate) fn is_enospc(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc_consts::ENOSPC) | Some(libc_consts::EDQUOT)
    )
}

fn io_exit_code(e: &io::Error) -> i32 {
    match e.raw_os_error() {
        Some(libc_consts::ENOSPC | libc_consts::EDQUOT | libc_consts::EROFS) => exit::CANTCREAT,
        Some(libc_consts::EACCES | libc_consts::EPERM) => exit::NOPERM,
        Some(libc_consts::ENOENT | libc_consts::ENOTDIR) => exit::NOINPUT,
        _ => exit::SOFTWARE,
    }
}

/// errno values, via nix so that we need no direct libc dependency.
pub(crate) mod libc_consts {
    use nix::errno::Errno;
    pub const ENOSPC: i32 = Errno::ENOSPC as i32;
    pub const EDQUOT: i32 = Errno::EDQUOT as i32;
    pub const EROFS: i32 = Errno::EROFS as i32;
    pub const EACCES: i32 = Errno::EACCES as i32;
    pub const EPERM: i32 = Errno::EPERM as i32;
    pub const ENOENT: i32 = Errno::ENOENT as i32;
    pub const ENOTDIR: i32 = Errno::ENOTDIR as i32;
    pub const ELOOP: i32 = Errno::ELOOP as i32;
    pub const ENXIO: i32 = Errno::ENXIO as i32;
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
