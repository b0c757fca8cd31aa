//! Waiting for a held lock to change hands.
//!
//! Owns: how long a contender sleeps between attempts, and what wakes it early.
//! Must never: sleep past the caller's deadline, or poll so slowly that a foreign holder's
//! silence for a TTL goes unnoticed for long.

use std::time::{Duration, Instant};

use crate::paths::LockPaths;
use crate::verdict::Verdict;

/// Sleeps between acquisition attempts: exponential backoff with jitter, capped by a fraction
/// of the TTL so that a foreign holder's stale heartbeat is noticed promptly.
#[derive(Debug)]
pub(crate) struct Waiter {
    backoff: Duration,
    cap: Duration,
    seed: u64,
}

impl Waiter {
    pub(crate) fn new(_paths: &LockPaths, poll: bool, ttl: Duration) -> Waiter {
        let cap = if poll {
            (ttl / 8).clamp(Duration::from_millis(5), Duration::from_secs(2))
        } else {
            (ttl / 20).clamp(Duration::from_millis(1), Duration::from_millis(100))
        };
        Waiter {
            backoff: Duration::from_micros(200),
            cap,
            seed: u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Sleeps until the lock may have changed, or the deadline.
    pub(crate) fn wait(&mut self, _seen: &Verdict, deadline: Option<Instant>) {
        // xorshift jitter in [0.75, 1.25) so that waiters do not poll in lockstep.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let jitter = 0.75 + (self.seed % 1000) as f64 / 2000.0;
        let mut nap = self.backoff.mul_f64(jitter);
        if let Some(d) = deadline {
            nap = nap.min(d.saturating_duration_since(Instant::now()));
        }
        std::thread::sleep(nap);
        self.backoff = (self.backoff * 2).min(self.cap);
    }
}
