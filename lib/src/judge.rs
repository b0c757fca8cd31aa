//! Judging someone else's lease: free, held, stale or hung, always with a reason a person can act
//! on.
//!
//! Owns: the liveness rules. A same-host holder (same host name, boot id and pid namespace) is
//! judged by its processes, asked of a [`Processes`] source (the real one reads /proc through
//! `process.rs`; unit tests use a fake); any other holder only by whether this host has seen its
//! heartbeat move within a TTL on its own clock — a revoked record by whether this host has seen
//! the revoked record itself unchanged for a TTL.
//! Must never: judge a foreign holder by local PIDs, or call a lease stale on the strength of
//! another host's wall clock (unless the caller opted in to a skew allowance); call a revoked
//! lease free while its holder may still run; count an old job's process that cannot be checked
//! as "not this job's"; read /proc itself (only through [`Processes`]).

use std::time::Duration;

use crate::clock::{Clock, human_duration, parse_rfc3339};
use crate::fsio::LockContent;
use crate::identity::Identity;
use crate::observe::{self, Memory};
use crate::process::{self, Liveness};
use crate::record::{Lease, LeaseState, fingerprint};
use crate::store::binding::Binding;
use crate::verdict::{State, Verdict};

/// Where the judge learns whether a same-host holder's processes live.
pub(crate) trait Processes: Sync {
    /// Whether the process recorded as `(pid, start)` is still that process, alive.
    fn liveness(&self, pid: i32, start: u64) -> Liveness;
    /// The live members of the old job's process group `pgid`, as judged against this lock's
    /// evidence for `lease` (see `process::JobEvidence`).
    fn leftovers(&self, lease: &Lease, pgid: i32, binding: &dyn Binding) -> Leftovers;
}

/// What is left alive in a dead holder's process group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Leftovers {
    /// Members that provably belong to the old job (stopped before a takeover).
    pub belongs: Vec<i32>,
    /// How many members cannot be checked.
    pub unknown: usize,
    /// One line on those that cannot be checked: who, why, and what to do.
    pub line: Option<String>,
}

/// The real source: /proc, through `process.rs`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Proc;

impl Processes for Proc {
    fn liveness(&self, pid: i32, start: u64) -> Liveness {
        process::liveness(pid, start)
    }
    fn leftovers(&self, lease: &Lease, pgid: i32, binding: &dyn Binding) -> Leftovers {
        let h = &lease.holder;
        let judged = process::judge_group(pgid, &binding.evidence(lease));
        Leftovers {
            belongs: judged.belongs.iter().map(|p| p.pid).collect(),
            unknown: judged.unknown.len(),
            line: judged.unknown_line(pgid, &h.user),
        }
    }
}

/// For a stale same-host lease `lease` judged `v`: what its job left alive in its process group
/// (when it recorded one), judged against `binding`'s evidence. Only processes provably of this
/// job count as remnants: a reused group id must neither be signalled nor keep the lock
/// forever. Those that cannot be checked are neither signalled nor ignored: a takeover is
/// refused while they live. Shared by every store (the file judge, etcd's verdict).
pub(crate) fn note_leftovers(
    v: &mut Verdict,
    lease: &Lease,
    procs: &dyn Processes,
    binding: &dyn Binding,
) {
    let Some(g) = lease.holder.pgid else {
        return;
    };
    let left = procs.leftovers(lease, g, binding);
    v.remnants = left.belongs;
    v.unchecked = left.line;
    if !v.remnants.is_empty() {
        v.reason += &format!(
            "; {} leftover process(es) in its process group {g}",
            v.remnants.len()
        );
    }
    if left.unknown > 0 {
        v.reason += &format!(
            "; {} process(es) in its process group {g} cannot be checked",
            left.unknown
        );
    }
}

/// Inputs for judging that stay the same between judgements.
#[derive(Debug)]
pub(crate) struct Judge<'a> {
    /// How this lock's jobs are bound to it, and where observations are kept.
    pub binding: &'a dyn Binding,
    pub me: &'a Identity,
    pub clock: &'a dyn Clock,
    /// Opt-in: a foreign lease whose wall-clock heartbeat is older than TTL + this is stale.
    pub wall_skew: Option<Duration>,
    /// Whether observations may be written beside LOCK.
    pub persist: bool,
}

/// A held or revoked lease, as the judge sees it.
struct Seen<'l> {
    lease: &'l Lease,
    ttl: Duration,
    /// How long this host has seen it unchanged.
    age: Duration,
    /// `revoked by …` for a revoked record.
    revoked: Option<String>,
}

impl Judge<'_> {
    /// Judges what LOCK holds, by the real /proc.
    pub(crate) fn judge(&self, content: &LockContent, mem: &mut Memory) -> Verdict {
        self.judge_by(content, mem, &Proc)
    }

    /// Judges what LOCK holds, asking `procs` about same-host processes.
    pub(crate) fn judge_by(
        &self,
        content: &LockContent,
        mem: &mut Memory,
        procs: &dyn Processes,
    ) -> Verdict {
        let mut v = Verdict {
            path: self.binding.lock().to_path_buf(),
            state: State::Free,
            reason: String::new(),
            lease: None,
            same_host: false,
            heartbeat_age: None,
            remnants: Vec::new(),
            unchecked: None,
            judged_at: self.clock.wall(),
            queue_ahead: 0,
            queue: Vec::new(),
            behind: None,
            holders: Vec::new(),
            server_lease: None,
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
                // Ended by someone else (`leasehold break`): name who, then whose it was.
                Some(e) => match &e.by {
                    Some(by) => format!(
                        "ended by {} at {} ({}); last held by {}",
                        crate::text::escape(by),
                        e.at,
                        e.how,
                        h.describe()
                    ),
                    None => format!("released by {} at {} ({})", h.describe(), e.at, e.how),
                },
                None => format!("released by {}", h.describe()),
            };
            return v;
        }
        let seen = self.observe(lease, bytes, mem);
        v.heartbeat_age = Some(seen.age);
        if v.same_host && !lease.damaged {
            self.same_host(&mut v, &seen, procs);
        } else {
            self.by_observation(&mut v, &seen);
        }
        v
    }

    /// Records what this host sees of a held or revoked lease, and for how long it has.
    fn observe<'l>(&self, lease: &'l Lease, bytes: &[u8], mem: &mut Memory) -> Seen<'l> {
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
            self.binding.observations(),
            self.me,
            self.clock,
            &lease.lease_id,
            key,
            mem,
            self.persist,
        );
        Seen {
            lease,
            ttl: Duration::from_millis(lease.ttl_ms),
            age,
            revoked,
        }
    }

    /// A same-host holder: judged by its processes.
    fn same_host(&self, v: &mut Verdict, s: &Seen<'_>, procs: &dyn Processes) {
        let h = &s.lease.holder;
        // Script mode: the job is the script; its keeper only renews and releases for it, so
        // a script that is gone leaves the lease stale even while its keeper still lives (a
        // later `lock -n` need not wait for the keeper's release; what the script left in its
        // group is stopped as remnants below).
        let script = h.on_behalf && h.child_pid.is_some();
        // Looked at once: the reason below says what this found (a second look costs a /proc
        // read on the way to a takeover).
        let holder = (!script).then(|| procs.liveness(h.pid, h.pid_start));
        let mut alive = holder == Some(Liveness::Alive);
        if let (Some(c), Some(st)) = (h.child_pid, h.child_start) {
            alive |= procs.liveness(c, st) == Liveness::Alive;
        }
        if alive {
            (v.state, v.reason) = if s.age >= s.ttl {
                let (age, ttl) = (human_duration(s.age), human_duration(s.ttl));
                let reason = match &s.revoked {
                    None => format!(
                        "holder's processes are alive but its heartbeat has not moved for {age} (TTL {ttl}): frozen?"
                    ),
                    Some(by) => format!(
                        "{by}, but its holder's processes are still alive {age} later (TTL {ttl}): frozen?"
                    ),
                };
                (State::Hung, reason)
            } else {
                let reason = match &s.revoked {
                    None => "holder alive on this host".into(),
                    Some(by) => format!(
                        "{by}; its holder fences at its next renewal: free once its processes are gone"
                    ),
                };
                (State::Held, reason)
            };
            return;
        }
        v.state = State::Stale;
        v.reason = match holder {
            None => "script exited".to_string(),
            Some(Liveness::Dead(why)) => why.to_string(),
            Some(Liveness::Alive) => "process gone".to_string(),
        };
        if let Some(by) = &s.revoked {
            v.reason = format!("{by}; {}", v.reason);
        }
        note_leftovers(v, s.lease, procs, self.binding);
    }

    /// Any other holder (another host, or a damaged record): judged by this host's own
    /// observation of it, and, if the caller opted in, by its wall clock with a skew allowance.
    fn by_observation(&self, v: &mut Verdict, s: &Seen<'_>) {
        let h = &s.lease.holder;
        let (age, ttl) = (human_duration(s.age), human_duration(s.ttl));
        if s.age >= s.ttl {
            v.state = State::Stale;
            v.reason = match &s.revoked {
                None => format!("no heartbeat seen from {} for {age} (TTL {ttl})", h.host),
                Some(by) => format!(
                    "{by}; this host has seen the revoked record unchanged for {age} (TTL {ttl})"
                ),
            };
            if s.lease.damaged {
                v.reason += "; the record is damaged";
            }
            return;
        }
        if let (Some(skew), Some(at)) = (self.wall_skew, parse_rfc3339(&s.lease.heartbeat_at))
            && let Ok(behind) = v.judged_at.duration_since(at)
            && behind > s.ttl + skew
        {
            v.state = State::Stale;
            v.reason = format!(
                "heartbeat written {} ago by its clock, beyond TTL {ttl} plus the allowed skew {}",
                human_duration(behind),
                human_duration(skew)
            );
            return;
        }
        v.state = State::Held;
        v.reason = if let Some(by) = &s.revoked {
            format!(
                "{by}; its holder on {} fences at its next renewal: free once this host has seen the revoked record unchanged for its TTL ({} left)",
                h.host,
                human_duration(s.ttl.saturating_sub(s.age))
            )
        } else if v.same_host {
            "record damaged; waiting for it to stay unchanged for a TTL".into()
        } else {
            format!(
                "holder on another host ({}), heartbeat being watched",
                h.host
            )
        };
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

#[cfg(test)]
mod tests;
