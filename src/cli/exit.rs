//! Exit statuses of the `leasehold` command, and which one each library error becomes.
//!
//! Owns: the sysexits.h numbers `run`, `status` and `break` document, and the one mapping from a
//! [`leasehold::Error`] (an I/O error classified by its errno) to an exit status.
//! Must never: print anything, or let two callers map the same error differently.

use std::io;

use leasehold::Error;
use nix::errno::Errno;

/// Command-line usage error.
pub const USAGE: i32 = 64;
/// LOCK exists but is not a leasehold lease, or is of a newer format.
pub const DATAERR: i32 = 65;
/// Cannot open LOCK or its directory.
pub const NOINPUT: i32 = 66;
/// The lock's store could not be reached or could not serve us (an etcd cluster down, or
/// without a quorum): nothing was decided about the lock (EX_UNAVAILABLE).
pub const UNAVAILABLE: i32 = 69;
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
/// `run --after-crash fail`: the last holding ended uncleanly (fenced, died, broken) and no
/// operator has run `leasehold ack` since; the command was not run. Outside sysexits.h's range
/// so that no tool reads it as one of its meanings.
pub const AFTER_CRASH: i32 = 79;
/// `run --max-time`: the command ran that long and was fenced (as timeout(1) exits).
pub const TIMEOUT: i32 = 124;
/// LOCK's file system cannot make the lock safe (configuration error).
pub const CONFIG: i32 = 78;

/// Whether an acquisition error means "the lock could not be had" (`run`'s and `lock`'s -E
/// status, default 75) rather than a failure.
pub fn is_conflict(e: &Error) -> bool {
    matches!(
        e,
        Error::WouldBlock { .. }
            | Error::Timeout { .. }
            | Error::MutexStuck { .. }
            | Error::Refused { .. }
    )
}

/// The exit status `leasehold` reports for this error (sysexits.h).
///
/// ```
/// let e = leasehold::Error::Settings("x".into());
/// assert_eq!(leasehold_cli::exit_code(&e), 64);
/// ```
pub fn exit_code(e: &Error) -> i32 {
    match e {
        Error::Io { source, .. } => io_exit_code(source),
        Error::NotALease { .. } | Error::NewerFormat { .. } | Error::Squatted { .. } => DATAERR,
        Error::Untrusted { .. } => NOPERM,
        Error::WouldBlock { .. } | Error::Timeout { .. } | Error::MutexStuck { .. } => TEMPFAIL,
        Error::Cancelled { .. } => TEMPFAIL,
        Error::Refused { .. } | Error::Raced { .. } => TEMPFAIL,
        Error::UnsafeFileSystem { .. } => CONFIG,
        Error::Settings(_) | Error::Timing(_) | Error::NameTooLong { .. } => USAGE,
        Error::ReservedName { .. } => USAGE,
        Error::Mismatch { .. } => USAGE,
        Error::BadPath { .. } => NOINPUT,
        Error::Lost { .. } => IOERR_FENCED,
        Error::Unavailable { .. } => UNAVAILABLE,
    }
}

fn io_exit_code(e: &io::Error) -> i32 {
    const ENOSPC: i32 = Errno::ENOSPC as i32;
    const EDQUOT: i32 = Errno::EDQUOT as i32;
    const EROFS: i32 = Errno::EROFS as i32;
    const EACCES: i32 = Errno::EACCES as i32;
    const EPERM: i32 = Errno::EPERM as i32;
    const ENOENT: i32 = Errno::ENOENT as i32;
    const ENOTDIR: i32 = Errno::ENOTDIR as i32;
    match e.raw_os_error() {
        Some(ENOSPC | EDQUOT | EROFS) => CANTCREAT,
        Some(EACCES | EPERM) => NOPERM,
        Some(ENOENT | ENOTDIR) => NOINPUT,
        _ => SOFTWARE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_by_errno() {
        let io = |errno: Errno| Error::Io {
            path: "/x".into(),
            op: "open",
            source: io::Error::from_raw_os_error(errno as i32),
        };
        assert_eq!(exit_code(&io(Errno::ENOSPC)), CANTCREAT);
        assert_eq!(exit_code(&io(Errno::EROFS)), CANTCREAT);
        assert_eq!(exit_code(&io(Errno::EACCES)), NOPERM);
        assert_eq!(exit_code(&io(Errno::ENOENT)), NOINPUT);
        assert_eq!(exit_code(&io(Errno::EIO)), SOFTWARE);
        let down = Error::Unavailable {
            path: "etcd://h:1/x".into(),
            op: "grant a lease",
            why: "http://h:1: connection refused".into(),
        };
        assert_eq!(exit_code(&down), UNAVAILABLE);
    }
}
