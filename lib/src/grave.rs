//! Descriptors whose closing is put off to a moment when it costs nobody time.
//!
//! Owns: a short per-process list of open descriptors nobody uses any more — read-only LOCK
//! files a holder let go of at a hand-over (closing the last one of a replaced file frees its
//! pages), pidfds of a finished wait — and closing them before a waiter sleeps, when this
//! process starts another acquisition (the holder after us asks at its release whether anyone
//! else has the file its lease replaced open: ours would make it read /proc/locks), or at once
//! when the list is full. A hand-over is measured from the release to the next holder's first step:
//! closing these inside it delayed the next holder whenever the two shared a CPU.
//! Must never: hold a descriptor open for writing (it would keep the file system from being
//! remounted read-only) or one whose closing releases a lock someone waits for.

use std::os::fd::OwnedFd;
use std::sync::Mutex;

static GRAVE: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());

/// At most this many wait; more are closed at once.
const MAX: usize = 16;

/// Puts `fds` aside, to be closed by the next [`reap`] (or now, if too many wait).
pub(crate) fn bury(fds: impl IntoIterator<Item = OwnedFd>) {
    let Ok(mut g) = GRAVE.lock() else {
        return; // poisoned: the descriptors are simply closed here
    };
    g.extend(fds);
    if g.len() > MAX {
        let gone = std::mem::take(&mut *g);
        drop(g);
        drop(gone);
    }
}

/// Closes everything put aside (before a waiter sleeps, where it costs nobody time).
pub(crate) fn reap() {
    let gone = GRAVE.lock().map(|mut g| std::mem::take(&mut *g));
    drop(gone);
}
