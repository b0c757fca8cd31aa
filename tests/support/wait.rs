//! The one bounded poll: [`wait_until`] (and [`ensure_within`], which fails the test instead).
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
