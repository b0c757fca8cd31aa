//! The one bounded poll: [`wait_until`] (and [`ensure_within`], which fails the test instead),
//! and [`bounded`], a call that must return in time (an open of a FIFO would hang).
//! Tests synchronise on files, pipes and signals; this only bounds how long they look.

use std::time::{Duration, Instant};

/// Checks `cond` every 2 ms until it holds or `limit` has passed; returns whether it held.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// [`wait_until`], panicking with "timed out after LIMIT waiting for WHAT" when it fails.
#[track_caller]
pub fn ensure_within(what: &str, limit: Duration, cond: impl FnMut() -> bool) {
    assert!(
        wait_until(limit, cond),
        "timed out after {limit:?} waiting for {what}"
    );
}

/// Runs `f` on a thread; panics if it does not return within `limit` (e.g. blocked opening a
/// FIFO). The thread is left behind if it hangs.
#[track_caller]
pub fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not return within {limit:?} (blocked?)"),
    }
}
