//! The process-global signal state of the supervisor: the handlers, the self-pipe they write
//! to, and forwarding INT/TERM/HUP/QUIT to the command's process group.
//!
//! Owns: the statics shared with the signal handler and the guard's loss callback (wake-pipe fd,
//! pending-signal flags, the loss flag, the one-supervisor-per-process flag), installing the
//! handlers, waiting for a wake-up byte, and sending pending signals on to the command's group.
//! Must never: do anything in a handler but store to atomics and `write(2)` one byte (keeping
//! errno); or install a handler over a signal leasehold was started with ignored.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, killpg, sigaction};
use nix::unistd::Pid;

use leasehold::Result;

use super::{Supervisor, io_error};

/// Signals sent to leasehold that are forwarded to the command's process group.
pub const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

// State shared with the signal handler and the loss callback. There is one supervisor per
// process (see `Supervisor::new`).
pub(super) static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
static PENDING: [AtomicBool; 5] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];
const CHLD_SLOT: usize = 4;
pub(super) static LOST: AtomicBool = AtomicBool::new(false);
/// The eventfd of the acquisition's cancel handle (`leasehold::Cancel`) while the lease is
/// waited for; -1 otherwise. A forwarded signal writes to it, so the wait ends at once.
pub(super) static CANCEL_FD: AtomicI32 = AtomicI32::new(-1);
pub(super) static CREATED: AtomicBool = AtomicBool::new(false);

fn slot(sig: libc::c_int) -> Option<usize> {
    if sig == libc::SIGCHLD {
        return Some(CHLD_SLOT);
    }
    FORWARDED.iter().position(|s| *s as libc::c_int == sig)
}

/// Writes one byte to the self-pipe; async-signal-safe, keeps errno.
pub(super) fn wake() {
    let fd = WAKE_FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    // SAFETY: errno is thread-local; write(2) on a non-blocking pipe is async-signal-safe. A full
    // pipe (EAGAIN) already holds a wake-up, so the result does not matter.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let byte = 1u8;
        let _ = libc::write(fd, (&raw const byte).cast(), 1);
        *errno = saved;
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    if let Some(i) = slot(sig) {
        PENDING[i].store(true, Ordering::Release);
        if i != CHLD_SLOT {
            cancel_wait();
        }
    }
    wake();
}

/// Cancels the acquisition's wait, if one is going on; async-signal-safe, keeps errno.
fn cancel_wait() {
    let fd = CANCEL_FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    // SAFETY: as in `wake`: write(2) of 8 bytes to an eventfd (what `Cancel::cancel` writes).
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let one = 1u64.to_ne_bytes();
        let _ = libc::write(fd, one.as_ptr().cast(), one.len());
        *errno = saved;
    }
}

/// The first forwarded signal that arrived and is still pending, taken off the pending set.
pub(super) fn take_pending() -> Option<Signal> {
    FORWARDED.into_iter().find(|sig| {
        slot(*sig as libc::c_int).is_some_and(|i| PENDING[i].swap(false, Ordering::AcqRel))
    })
}

/// Ends this process by `sig`, as its default action would have without our handler (so that
/// the caller's shell sees "killed by SIGTERM", 143, and an interactive script stops on
/// SIGINT). Returns only if the signal did not end the process.
pub(super) fn die_by(sig: Signal) {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restoring the default disposition.
    let _ = unsafe { sigaction(sig, &default) };
    let mut set = SigSet::empty();
    set.add(sig);
    let _ = set.thread_unblock();
    let _ = nix::sys::signal::raise(sig);
}

/// Installs the wake-up handler for `sig`. Returns false (and leaves the signal ignored) when it
/// was ignored: a command started with a signal ignored inherits that, as it would without us.
pub(super) fn install(sig: Signal) -> Result<bool> {
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only touches atomics and write(2).
    let old = unsafe { sigaction(sig, &act) }
        .map_err(|e| io_error("signal", "install a signal handler", e.into()))?;
    if sig != Signal::SIGCHLD && matches!(old.handler(), SigHandler::SigIgn) {
        // SAFETY: restoring the previous disposition.
        unsafe { sigaction(sig, &old) }
            .map_err(|e| io_error("signal", "restore a signal handler", e.into()))?;
        return Ok(false);
    }
    Ok(true)
}

impl Supervisor {
    /// Waits for a wake-up byte (a signal, or the loss callback) or `timeout`, then drains the
    /// pipe. Flags are checked by the caller after this returns, so no wake-up is lost.
    pub(super) fn sleep(&self, timeout: Duration) {
        let t = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.wake_rx.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, t);
        let mut buf = [0u8; 64];
        while let Ok(n) = nix::unistd::read(&self.wake_rx, &mut buf) {
            if n < buf.len() {
                break;
            }
        }
        PENDING[CHLD_SLOT].store(false, Ordering::Release);
    }

    /// Sends each forwarded signal that arrived since the last call on to the command's group.
    pub(super) fn forward_pending(&self, child: Pid) {
        for sig in &self.forwarded {
            if let Some(i) = slot(*sig as libc::c_int)
                && PENDING[i].swap(false, Ordering::AcqRel)
            {
                let _ = killpg(child, *sig);
            }
        }
    }
}
