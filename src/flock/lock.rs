//! The kernel lock flock(1) takes: opening the user's file as flock(1) opens it, and
//! `flock(2)` or an open-file-description `fcntl` lock on it, at once, for ever, or until a
//! deadline.
//!
//! Owns: the open flags (`O_RDONLY|O_NOCTTY|O_CREAT`, mode 0666, a directory read-only; `O_WRONLY`
//! for an exclusive `--fcntl` lock; close-on-exec only when the command must not inherit it),
//! the lock and unlock calls, and the timed wait (a `SIGALRM` timer aimed at the calling thread,
//! repeating until the wait ends, so a blocked call is always interrupted however late it
//! started). Must never: write, truncate, chmod or rename the file, or leave the timer or its
//! handler armed after a wait.

use std::ffi::OsStr;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::libc;
use nix::sys::signal::{SaFlags, SigAction, SigEvent, SigHandler, SigSet, SigevNotify, Signal};
use nix::sys::stat::Mode as Perm;
use nix::sys::time::TimeSpec;
use nix::sys::timer::{Expiration, Timer, TimerSetTimeFlags};
use nix::time::ClockId;

use super::args::{Api, Mode};

/// Why the lock was not had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    /// Held by another (a non-blocking attempt).
    Conflict,
    /// The wait ran out.
    Timeout,
    /// The call failed with this errno.
    Os(Errno),
}

/// The exit status and message (without the program name) of a file flock(1) cannot open.
pub fn open_failure(path: &OsStr, e: Errno) -> (i32, String) {
    let code = match e {
        Errno::ENOMEM | Errno::EMFILE | Errno::ENFILE => 71,
        Errno::EROFS | Errno::ENOSPC => 73,
        _ => 66,
    };
    let msg = format!(
        "cannot open lock file {}: {}",
        leasehold::text::escape_os(path),
        super::strerror(e)
    );
    (code, msg)
}

/// Opens `path` as flock(1) does: `O_RDONLY` (`O_WRONLY` for an exclusive `--fcntl` lock, `O_RDWR`
/// when `rdwr`), `O_NOCTTY|O_CREAT`, mode 0666 less the umask; a directory read-only. The
/// descriptor is inherited by commands unless `cloexec`.
pub fn open(path: &OsStr, api: Api, mode: Mode, rdwr: bool, cloexec: bool) -> nix::Result<OwnedFd> {
    let access = if rdwr {
        OFlag::O_RDWR
    } else if api == Api::Ofd && mode == Mode::Exclusive {
        OFlag::O_WRONLY
    } else {
        OFlag::O_RDONLY
    };
    let extra = if cloexec {
        OFlag::O_CLOEXEC
    } else {
        OFlag::empty()
    };
    let perm = Perm::from_bits_truncate(0o666);
    let flags = access | OFlag::O_NOCTTY | OFlag::O_CREAT | extra;
    match nix::fcntl::open(path, flags, perm) {
        Err(Errno::EISDIR) => nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_NOCTTY | extra,
            Perm::empty(),
        ),
        other => other,
    }
}

/// One lock call on `fd`: blocking or not.
fn attempt(fd: RawFd, api: Api, mode: Mode, block: bool) -> nix::Result<()> {
    match api {
        Api::Flock => {
            let op = match mode {
                Mode::Shared => libc::LOCK_SH,
                Mode::Exclusive => libc::LOCK_EX,
                Mode::Unlock => libc::LOCK_UN,
            } | if block { 0 } else { libc::LOCK_NB };
            // SAFETY: flock(2) takes any integer; a bad descriptor is reported as EBADF.
            Errno::result(unsafe { libc::flock(fd, op) }).map(drop)
        }
        Api::Ofd => {
            let l_type = match mode {
                Mode::Shared => libc::F_RDLCK,
                Mode::Exclusive => libc::F_WRLCK,
                Mode::Unlock => libc::F_UNLCK,
            };
            // SAFETY: an all-zero `struct flock` is valid (whole file from offset 0, l_pid 0
            // as OFD locks require); the fields that matter are set below.
            let mut fl: libc::flock = unsafe { std::mem::zeroed() };
            fl.l_type = l_type as libc::c_short;
            fl.l_whence = libc::SEEK_SET as libc::c_short;
            let cmd = if block {
                libc::F_OFD_SETLKW
            } else {
                libc::F_OFD_SETLK
            };
            // SAFETY: `fl` is a valid struct flock for the duration of the call; a bad
            // descriptor is reported as EBADF.
            Errno::result(unsafe { libc::fcntl(fd, cmd, &fl) }).map(drop)
        }
    }
}

/// Whether an errno of a non-blocking attempt means "held by another".
fn is_conflict(e: Errno) -> bool {
    // fcntl locks may report a conflict as EACCES.
    matches!(e, Errno::EWOULDBLOCK | Errno::EACCES)
}

/// Takes (or, for [`Mode::Unlock`], drops) the kernel lock on `fd`: at once when `wait` is
/// zero, for ever when it is `None`, else until it runs out.
pub fn lock(fd: RawFd, api: Api, mode: Mode, wait: Option<Duration>) -> Result<(), Fail> {
    match wait {
        Some(d) if d.is_zero() => attempt(fd, api, mode, false).map_err(|e| {
            if is_conflict(e) {
                Fail::Conflict
            } else {
                Fail::Os(e)
            }
        }),
        None => loop {
            match attempt(fd, api, mode, true) {
                Ok(()) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(Fail::Os(e)),
            }
        },
        Some(d) => {
            let alarm = Alarm::arm(d).map_err(Fail::Os)?;
            let got = loop {
                match attempt(fd, api, mode, true) {
                    Ok(()) => break Ok(()),
                    Err(Errno::EINTR) if alarm.rang() => break Err(Fail::Timeout),
                    Err(Errno::EINTR) => continue,
                    Err(e) => break Err(Fail::Os(e)),
                }
            };
            drop(alarm);
            got
        }
    }
}

/// Set by the `SIGALRM` handler of a timed wait.
static RANG: AtomicBool = AtomicBool::new(false);

extern "C" fn on_alarm(_: libc::c_int) {
    RANG.store(true, Ordering::Release);
}

/// A timed wait's timer: `SIGALRM` to this thread after the wait, then every 10 ms until
/// dropped, with a handler installed without `SA_RESTART` so that a blocked lock call returns
/// `EINTR`. Dropping it deletes the timer and restores the previous handler.
struct Alarm {
    timer: Option<Timer>,
    old: SigAction,
}

impl Alarm {
    fn arm(after: Duration) -> Result<Alarm, Errno> {
        RANG.store(false, Ordering::Release);
        let act = SigAction::new(
            SigHandler::Handler(on_alarm),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let old = unsafe { nix::sys::signal::sigaction(Signal::SIGALRM, &act) }?;
        let mut alarm = Alarm { timer: None, old };
        let tid = nix::unistd::gettid().as_raw();
        let ev = SigEvent::new(SigevNotify::SigevThreadId {
            signal: Signal::SIGALRM,
            thread_id: tid,
            si_value: 0,
        });
        let mut timer = Timer::new(ClockId::CLOCK_MONOTONIC, ev)?;
        let first = TimeSpec::from_duration(after);
        let every = TimeSpec::from_duration(Duration::from_millis(10));
        timer.set(
            Expiration::IntervalDelayed(first, every),
            TimerSetTimeFlags::empty(),
        )?;
        alarm.timer = Some(timer);
        Ok(alarm)
    }

    fn rang(&self) -> bool {
        RANG.load(Ordering::Acquire)
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        drop(self.timer.take());
        // SAFETY: restores the disposition that was in place before `arm`.
        let _ = unsafe { nix::sys::signal::sigaction(Signal::SIGALRM, &self.old) };
    }
}

/// The exit status of a lock call that failed with `e` (not a conflict): 71 for ENOLCK and
/// ENOMEM, else 65, as flock(1).
pub fn lock_failure_code(e: Errno) -> i32 {
    if matches!(e, Errno::ENOLCK | Errno::ENOMEM) {
        71
    } else {
        65
    }
}

/// Whether a lock call's error is the one NFS gives for `flock(2)` on a read-only descriptor,
/// which flock(1) answers by reopening read-write.
pub fn wants_rdwr(e: Errno) -> bool {
    matches!(e, Errno::EIO | Errno::EBADF)
}
