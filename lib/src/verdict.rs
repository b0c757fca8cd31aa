//! Judging someone else's lease: free, held, stale or hung, always with a reason a person can act
//! on.
//!
//! Owns: the liveness rules. A same-host holder (same host name, boot id and pid namespace) is
//! judged by its processes; any other holder only by whether this host has seen its heartbeat
//! move within a TTL on its own clock — a revoked record by whether this host has seen the
//! revoked record itself unchanged for a TTL. Must never: judge a foreign holder by local PIDs, or call
//! a lease stale on the strength of another host's wall clock (unless the caller opted in to a
//! skew allowance); call a revoked lease free while its holder may still run; count an old job's
//! process that cannot be checked as "not this job's".

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::clock::{Clock, human_duration, parse_rfc3339};
use crate::fsio::LockContent;
use crate::identity::Identity;
use crate::observe::{self, Memory};
use crate::paths::LockPaths;
use crate::process::{self, Liveness};
use crate::record::{Lease, LeaseState, fingerprint};

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
    pub queue: Vec<crate::queue::Waiting>,
    /// What a waiter waits behind when it is not the lease itself — the waiter queued just
    /// ahead, or a process sitting on the lease mutex — named by the kernel's word (who holds
    /// the flock), never by what a file claims.
    pub behind: Option<String>,
}

/// Inputs for judging that stay the same between judgements.
#[derive(Debug)]
pub(crate) struct Judge<'a> {
    pub paths: &'a LockPaths,
    pub me: &'a Identity,
    pub clock: &'a dyn Clock,
    /// Opt-in: a foreign lease whose wall-clock heartbeat is older than TTL + this is stale.
    pub wall_skew: Option<Duration>,
    /// Whether observations may be written beside LOCK.
    pub persist: bool,
}

impl Judge<'_> {
    /// Judges what LOCK holds.
    pub(crate) fn judge(&self, content: &LockContent, mem: &mut Memory) -> Verdict {
        let now = self.clock.wall();
        let mut v = Verdict {
            path: self.paths.lock.clone(),
            state: State::Free,
            reason: String::new(),
            lease: None,
            same_host: false,
            heartbeat_age: None,
            remnants: Vec::new(),
            unchecked: None,
            judged_at: now,
            queue_ahead: 0,
            queue: Vec::new(),
            behind: None,
        };
        let (lease, bytes) = match content {
            LockContent::Missing => {
                v.reason = "no lease yet".into();
                return v;
            }
            LockContent::Empty => {
                v.reason = "empty lock file".into();
                return v;
            }
            LockContent::Lease(l, b) => (l.as_ref(), b),
        };
        v.lease = Some(lease.clone());
        let h = &lease.holder;
        v.same_host = self.me.same_host_as(&h.host, &h.boot_id, h.pid_ns);
        if lease.state == LeaseState::Released {
            v.reason = match &lease.ended {
                Some(e) => format!("released by {} at {} ({})", h.describe(), e.at, e.how),
                None => format!("released by {}", h.describe()),
            };
            return v;
        }
        let ttl = Duration::from_millis(lease.ttl_ms);
        let revoked = (lease.state == LeaseState::Revoked).then(|| revoked_by(lease));
        // A revoked record is observed under a key of its own, never its holder's heartbeat
        // sequence: a renewal racing the break can land in the replaced file and extend the old
        // holder's deadline to the break plus its renew window, so the TTL a foreign holder is
        // given must count from when this host first saw the revoked record itself.
        let key = if lease.damaged {
            fingerprint(bytes)
        } else if revoked.is_some() {
            fingerprint(bytes) | 1 << 63
        } else {
            lease.heartbeat_seq
        };
        let age = observe::observe(
            self.paths,
            self.me,
            self.clock,
            &lease.lease_id,
            key,
            mem,
            self.persist,
        );
        v.heartbeat_age = Some(age);
        if v.same_host && !lease.damaged {
            let mut alive = process::liveness(h.pid, h.pid_start) == Liveness::Alive;
            if let (Some(c), Some(s)) = (h.child_pid, h.child_start) {
                alive |= process::liveness(c, s) == Liveness::Alive;
            }
            if alive {
                if age >= ttl {
                    v.state = State::Hung;
                    v.reason = match &revoked {
                        None => format!(
                            "holder's processes are alive but its heartbeat has not moved for {} (TTL {}): frozen?",
                            human_duration(age),
                            human_duration(ttl)
                        ),
                        Some(by) => format!(
                            "{by}, but its holder's processes are still alive {} later (TTL {}): frozen?",
                            human_duration(age),
                            human_duration(ttl)
                        ),
                    };
                } else {
                    v.state = State::Held;
                    v.reason = match &revoked {
                        None => "holder alive on this host".into(),
                        Some(by) => format!(
                            "{by}; its holder fences at its next renewal: free once its processes are gone"
                        ),
                    };
                }
                return v;
            }
            v.state = State::Stale;
            v.reason = match process::liveness(h.pid, h.pid_start) {
                Liveness::Dead(why) => why.to_string(),
                Liveness::Alive => "process gone".to_string(),
            };
            if let Some(by) = &revoked {
                v.reason = format!("{by}; {}", v.reason);
            }
            if let Some(g) = h.pgid {
                // Only processes provably of this job count: a reused group id must neither be
                // signalled nor keep the lock forever. Those that cannot be checked are neither
                // signalled nor ignored: a takeover is refused while they live.
                let ev = process::JobEvidence::for_lock(&lease.lease_id, h.uid, self.paths);
                let judged = process::judge_group(g, &ev);
                v.remnants = judged.belongs.iter().map(|p| p.pid).collect();
                v.unchecked = judged.unknown_line(g, &h.user);
                if !v.remnants.is_empty() {
                    v.reason += &format!(
                        "; {} leftover process(es) in its process group {g}",
                        v.remnants.len()
                    );
                }
                if !judged.unknown.is_empty() {
                    v.reason += &format!(
                        "; {} process(es) in its process group {g} cannot be checked",
                        judged.unknown.len()
                    );
                }
            }
            return v;
        }
        if age >= ttl {
            v.state = State::Stale;
            v.reason = match &revoked {
                None => format!(
                    "no heartbeat seen from {} for {} (TTL {})",
                    h.host,
                    human_duration(age),
                    human_duration(ttl)
                ),
                Some(by) => format!(
                    "{by}; this host has seen the revoked record unchanged for {} (TTL {})",
                    human_duration(age),
                    human_duration(ttl)
                ),
            };
            if lease.damaged {
                v.reason += "; the record is damaged";
            }
            return v;
        }
        if let (Some(skew), Some(at)) = (self.wall_skew, parse_rfc3339(&lease.heartbeat_at))
            && let Ok(behind) = now.duration_since(at)
            && behind > ttl + skew
        {
            v.state = State::Stale;
            v.reason = format!(
                "heartbeat written {} ago by its clock, beyond TTL {} plus the allowed skew {}",
                human_duration(behind),
                human_duration(ttl),
                human_duration(skew)
            );
            return v;
        }
        v.state = State::Held;
        v.reason = if let Some(by) = &revoked {
            format!(
                "{by}; its holder on {} fences at its next renewal: free once this host has seen the revoked record unchanged for its TTL ({} left)",
                h.host,
                human_duration(ttl.saturating_sub(age))
            )
        } else if v.same_host {
            "record damaged; waiting for it to stay unchanged for a TTL".into()
        } else {
            format!(
                "holder on another host ({}), heartbeat being watched",
                h.host
            )
        };
        v
    }
}

/// `revoked by alice@web1 pid 9 at 2026-…` for a revoked record.
fn revoked_by(lease: &Lease) -> String {
    match &lease.ended {
        Some(e) => match &e.by {
            Some(by) => format!("revoked by {by} at {}", e.at),
            None => format!("revoked at {}", e.at),
        },
        None => "revoked".into(),
    }
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

impl fmt::Display for Verdict {
    /// One line: `held by alice@web1 pid 4242 (terraform apply), heartbeat 3s ago, held 12m`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(b) = &self.behind {
            // Waiting behind something other than the lease: say that first, then the lease.
            write!(f, "behind {b}; the lease is ")?;
            if self.state == State::Held && self.reason.contains("queued ahead") {
                return write!(f, "{}", self.reason);
            }
        }
        match self.state {
            State::Free => write!(f, "free ({})", self.reason),
            _ => {
                write!(f, "{} by {}", self.state, self.holder())?;
                if let Some(a) = self.heartbeat_age {
                    write!(f, ", heartbeat {} ago", human_duration(a))?;
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
