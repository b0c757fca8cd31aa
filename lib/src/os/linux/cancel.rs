//! Stopping a waiting acquisition from outside it: another thread, or a signal handler.
//!
//! Owns: the [`Cancel`] handle — an eventfd that, once written, stays readable — and the one
//! check of it ([`Cancel::is_cancelled`]). A waiter polls its fd beside whatever it waits on, so
//! a cancelled wait ends at once; the acquisition then returns [`Error::Cancelled`] and drops
//! its queue ticket on the way out (`queue.rs`), as a timeout does.
//! Must never: install a signal handler or touch process-global state (the binary decides which
//! signals cancel, and writes to [`Cancel::as_raw_fd`] from its own handler); cancel a lease
//! already taken (a guard is released, never cancelled).
//!
//! [`Error::Cancelled`]: crate::Error::Cancelled

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::error::{Error, Result};

/// A handle that stops a waiting acquisition: give a clone to
/// [`LeaseBuilder::cancel`](crate::LeaseBuilder::cancel), call [`Cancel::cancel`] from anywhere.
/// Once cancelled it stays cancelled; use a new one for the next acquisition.
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let lock = dir.path().join("job.lock");
/// let held = leasehold::LeaseBuilder::new(&lock).try_acquire()?;
/// let cancel = leasehold::Cancel::new()?;
/// let waiter = {
///     let b = leasehold::LeaseBuilder::new(&lock).cancel(cancel.clone());
///     std::thread::spawn(move || b.acquire())
/// };
/// cancel.cancel();
/// assert!(matches!(waiter.join().unwrap(), Err(leasehold::Error::Cancelled { .. })));
/// held.release()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Cancel {
    fd: Arc<OwnedFd>,
}

impl Cancel {
    /// A new handle, not cancelled.
    pub fn new() -> Result<Cancel> {
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| Error::io("eventfd", "create a cancel handle", e.into()))?;
        Ok(Cancel {
            fd: Arc::new(OwnedFd::from(efd)),
        })
    }

    /// Cancels every acquisition waiting with this handle (and every later one).
    pub fn cancel(&self) {
        let one = 1u64.to_ne_bytes();
        // A full counter (2^64 - 2 writes) is still readable: the result does not matter.
        let _ = nix::unistd::write(self.fd.as_fd(), &one);
    }

    /// Whether [`Cancel::cancel`] was called (or 8 bytes written to the fd).
    pub fn is_cancelled(&self) -> bool {
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }

    /// The eventfd, for a signal handler: writing the 8 bytes of a non-zero native-endian
    /// `u64` to it (async-signal-safe `write(2)`) cancels. Valid while a clone of this handle
    /// lives.
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Sleeps `d`, or less if `cancel` (when given) is cancelled meanwhile.
pub(crate) fn nap(cancel: Option<&Cancel>, d: std::time::Duration) {
    match cancel {
        None => std::thread::sleep(d),
        Some(c) => {
            // Rounded up: a sub-millisecond nap must not turn into a busy loop.
            let ms = u16::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(c.fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(ms));
        }
    }
}
