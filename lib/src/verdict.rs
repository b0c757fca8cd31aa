//! What a judgement of a lock says: the verdict data, as `status`, errors and wait lines show it.
//!
//! Owns: the four states, the [`Verdict`] record (the lease judged, the reason, the observer-side
//! heartbeat age, leftovers, who waits) and its one-line form, and what a queue ticket says of
//! its waiter ([`Waiting`]). The rules that produce a verdict live in `judge.rs`.
//! Must never: depend on how a verdict is reached (no file, process or queue access here), so
//! that errors and displays can name verdicts without pulling in the protocol.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::clock::{human_duration, parse_rfc3339};
use crate::record::{Lease, LeaseState};

/// The four verdicts on a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Nobody holds it: no lease, an empty file, or a released lease.
    Free,
    /// A live holder has it.
    Held,
    /// Its holder is dead (same host) or silent for a full TTL (any host): it may be broken.
    Stale,
    /// A same-host holder whose processes live but whose heartbeat has stalled for a TTL
    /// (a frozen wrapper). Its processes must be stopped before anyone takes over.
    Hung,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Free => "free",
            State::Held => "held",
            State::Stale => "stale",
            State::Hung => "hung",
        })
    }
}

/// What a queue ticket says about its waiter (shown by `status`; never trusted to name who waits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// Position: smaller is served first.
    #[serde(default)]
    pub seq: u64,
    /// The waiter's PID (in its own pid namespace).
    pub pid: i32,
    /// Host name of the waiter.
    pub host: String,
    /// User name of the waiter.
    pub user: String,
    /// Waiter's wall clock when it joined the queue.
    pub since: String,
    /// What it wants to run.
    #[serde(default)]
    pub command: Vec<String>,
    /// Incremented in place while the waiter lives.
    #[serde(default)]
    pub beat: u64,
}

/// A judgement of a lock, with the lease it was made on and the reason.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The lock judged (absolute).
    pub path: std::path::PathBuf,
    /// What we concluded.
    pub state: State,
    /// Why, in words: `process gone`, `no heartbeat seen for 31s (TTL 30s)`, ...
    pub reason: String,
    /// The lease read (for `Free`, the last released lease, if any).
    pub lease: Option<Lease>,
    /// Whether the holder is on this host, boot and pid namespace.
    pub same_host: bool,
    /// How long this host has seen the heartbeat unchanged (observer-side; never the holder's clock).
    pub heartbeat_age: Option<Duration>,
    /// For a stale same-host lease: live processes left in the old job's process group that
    /// provably belong to it (stopped, verified, before anyone takes over).
    pub remnants: Vec<i32>,
    /// For a stale same-host lease: live processes in the old job's process group that cannot
    /// be checked (another user's /proc, as non-root), as one line saying who, why and what the
    /// operator can do. A takeover is refused while it is set: never "not this job's" unread.
    pub unchecked: Option<String>,
    /// Our wall clock at the time of judging, for "held 12m".
    pub judged_at: SystemTime,
    /// How many live waiters are queued ahead of the one judging (0 for `status`).
    pub queue_ahead: usize,
    /// Who waits, in order (filled in by `status`).
    pub queue: Vec<Waiting>,
    /// What a waiter waits behind when it is not the lease itself — the waiter queued just
    /// ahead, or a process sitting on the lease mutex — named by the kernel's word (who holds
    /// the flock), never by what a file claims.
    pub behind: Option<String>,
    /// For a shared or counted lock (`--shared`, `--slots N`): the verdict of each holder that
    /// holds one of its holder files (LOCK's own exclusive lease, if any, is this verdict).
    pub holders: Vec<Verdict>,
    /// For a holder whose store expires it by itself (`status` of an etcd lock's owner): that
    /// lease's time to live as the store tells it (etcd's `LeaseTimeToLive`), in place of a
    /// heartbeat observed from this host. `None` for a store whose leases only their holders
    /// and contenders end (files, S3).
    pub server_lease: Option<ServerLease>,
}

/// A lease the store itself expires, and its time to live as the store answered (an etcd
/// lease, `LeaseTimeToLive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLease {
    /// The store's id of the lease (etcd's lease id).
    pub lease: i64,
    /// Seconds left before the cluster expires it without another keepalive.
    pub remaining_s: i64,
    /// The TTL it was granted with, in seconds (at least the `--ttl` asked, rounded up).
    pub granted_s: i64,
}

impl Verdict {
    /// The holder as `user@host pid N (command)`, or `nobody`.
    pub fn holder(&self) -> String {
        match &self.lease {
            Some(l) if self.state != State::Free => l.holder.describe(),
            _ => "nobody".into(),
        }
    }

    /// How long the lease has been held by the holder's account, when that is plausible.
    pub fn held_for(&self) -> Option<Duration> {
        let l = self.lease.as_ref()?;
        self.judged_at
            .duration_since(parse_rfc3339(&l.acquired_at)?)
            .ok()
    }
}

impl Verdict {
    /// Makes this verdict say that LOCK's own file is held with a kernel lock (`flock(2)`, or an
    /// OFD or POSIX lock) by `who`: no leasehold holder takes one, so it is another program —
    /// util-linux flock(1) on the same file, the flock drop-in — and nobody may take the lease
    /// until it lets go, whatever the record says.
    pub(crate) fn kernel_locked(&mut self, who: String) {
        self.state = State::Held;
        self.heartbeat_age = None;
        // A dead run's guardian says what it is (`mutex::kept_after`), also where a refusal
        // or a wait line says what we are behind; anyone else is taken for another program.
        let guardian = who.starts_with(crate::mutex::GUARDIAN_WORDS);
        self.behind = Some(if guardian {
            format!("a kernel lock on LOCK itself, kept by {who}")
        } else {
            "a kernel lock on LOCK itself".into()
        });
        let what = if guardian {
            ""
        } else {
            ": another program (flock(1) on the same file?), not a leasehold lease, whatever its \
             record says"
        };
        self.reason = format!(
            "LOCK itself is locked by {who}{what} ({}); nobody takes the lease until it lets go",
            self.reason
        );
    }

    /// Makes this verdict say that nothing is granted for `left` yet: LOCK's disk came back as
    /// another attachment in this boot, and a lease of up to `ttl` that never reached it may
    /// still have a holder running (PROTOCOL.md §8, *Durable per mount epoch*).
    pub(crate) fn settling(&mut self, left: std::time::Duration, ttl: std::time::Duration) {
        self.state = State::Held;
        self.heartbeat_age = None;
        self.behind = Some(format!(
            "LOCK's disk, back as a new device in this boot ({:.1}s left of a {:.1}s grace)",
            left.as_secs_f64(),
            ttl.as_secs_f64()
        ));
        self.reason = format!(
            "LOCK's file system is another attachment of its disk than the one its leases were \
             written on, in this boot (a disk that dropped off and came back): a lease that \
             never reached the disk may still have a holder running, so nothing is granted \
             until the longest TTL granted there ({:.1}s) has passed since this was first \
             seen; the record says: {}",
            ttl.as_secs_f64(),
            self.reason
        );
    }

    /// Makes this verdict on a lock whose record says it is free (missing, emptied, released)
    /// say what the kernel says instead: a holder of this lock is still running — its record was
    /// removed or replaced under it, and it stops its command when it notices.
    pub(crate) fn holder_unseen(&mut self) {
        self.state = State::Held;
        self.reason = format!(
            "a holder of this lock is still running, though its lease record is gone \
             (removed, emptied or replaced under it: {}); it stops its command as soon as it \
             notices",
            self.reason
        );
    }
}

impl fmt::Display for Verdict {
    /// One line: `held by alice@web1 pid 4242 (terraform apply), heartbeat unchanged here for 3s,
    /// held 12m, token 17`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(b) = &self.behind {
            // Waiting behind something other than the lease: say that first, then the lease —
            // unless nothing could be read about it (no lease and no reason: an etcd cluster
            // without a leader answers nothing).
            if self.state == State::Free && self.lease.is_none() && self.reason.is_empty() {
                return write!(f, "behind {b}");
            }
            write!(f, "behind {b}; the lease is ")?;
            if self.state == State::Held && self.reason.contains("queued ahead") {
                return write!(f, "{}", self.reason);
            }
        }
        let unnamed = self
            .lease
            .as_ref()
            .is_none_or(|l| l.state == LeaseState::Released);
        match self.state {
            State::Free => write!(f, "free ({})", self.reason),
            State::Held if unnamed => write!(f, "held: {}", self.reason),
            _ => {
                write!(f, "{} by {}", self.state, self.holder())?;
                if let Some(a) = self.heartbeat_age {
                    // The observer's measure, never the holder's clock: how long this host
                    // has seen the heartbeat stay the same.
                    write!(f, ", heartbeat unchanged here for {}", human_duration(a))?;
                }
                if let Some(h) = self.held_for() {
                    write!(f, ", held {}", human_duration(h))?;
                }
                if let Some(l) = &self.lease {
                    write!(f, ", token {}", l.token)?;
                }
                let revoked = self
                    .lease
                    .as_ref()
                    .is_some_and(|l| l.state == LeaseState::Revoked);
                if self.state != State::Held || revoked {
                    write!(f, ": {}", self.reason)?;
                }
                Ok(())
            }
        }
    }
}
