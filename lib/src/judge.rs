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
use crate::paths::LockPaths;
use crate::process::{self, Liveness};
use crate::record::{Lease, LeaseState, fingerprint};
use crate::verdict::{State, Verdict};

/// Where the judge learns whether a same-host holder's processes live.
pub(crate) trait Processes: Sync {
    /// Whether the process recorded as `(pid, start)` is still that process, alive.
    fn liveness(&self, pid: i32, start: u64) -> Liveness;
    /// The live members of the old job's process group `pgid`, as judged against this lock's
    /// evidence for `lease` (see `process::JobEvidence`).
    fn leftovers(&self, lease: &Lease, pgid: i32, paths: &LockPaths) -> Leftovers;
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
    fn leftovers(&self, lease: &Lease, pgid: i32, paths: &LockPaths) -> Leftovers {
        let h = &lease.holder;
        let ev = process::JobEvidence::for_lock(&lease.lease_id, h.uid, paths);
        let judged = process::judge_group(pgid, &ev);
        Leftovers {
            belongs: judged.belongs.iter().map(|p| p.pid).collect(),
            unknown: judged.unknown.len(),
            line: judged.unknown_line(pgid, &h.user),
        }
    }
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
            path: self.paths.lock.clone(),
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
            self.paths,
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
        let mut alive = procs.liveness(h.pid, h.pid_start) == Liveness::Alive;
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
        v.reason = match procs.liveness(h.pid, h.pid_start) {
            Liveness::Dead(why) => why.to_string(),
            Liveness::Alive => "process gone".to_string(),
        };
        if let Some(by) = &s.revoked {
            v.reason = format!("{by}; {}", v.reason);
        }
        if let Some(g) = h.pgid {
            // Only processes provably of this job count: a reused group id must neither be
            // signalled nor keep the lock forever. Those that cannot be checked are neither
            // signalled nor ignored: a takeover is refused while they live.
            let left = procs.leftovers(s.lease, g, self.paths);
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
mod tests {
    //! The judge's rules without /proc: a fake process table and a clock the test moves.
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::SystemTime;

    use super::*;
    use crate::record::{Ending, Holder};

    #[derive(Debug)]
    struct FakeClock(Mutex<Duration>);
    impl Clock for FakeClock {
        fn wall(&self) -> SystemTime {
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
        }
        fn boottime(&self) -> Duration {
            *self.0.lock().unwrap()
        }
    }
    impl FakeClock {
        fn advance(&self, by: Duration) {
            *self.0.lock().unwrap() += by;
        }
    }

    /// Live (pid, start) pairs, and what a dead holder's group still holds.
    #[derive(Default)]
    struct FakeProcs {
        alive: Vec<(i32, u64)>,
        left: HashMap<i32, Leftovers>,
    }
    impl Processes for FakeProcs {
        fn liveness(&self, pid: i32, start: u64) -> Liveness {
            if self.alive.contains(&(pid, start)) {
                Liveness::Alive
            } else {
                Liveness::Dead("process gone")
            }
        }
        fn leftovers(&self, _: &Lease, pgid: i32, _: &LockPaths) -> Leftovers {
            self.left.get(&pgid).cloned().unwrap_or_default()
        }
    }

    const TTL: Duration = Duration::from_secs(30);

    fn me() -> Identity {
        Identity {
            host: "here".into(),
            boot_id: "boot-here".into(),
            pid_ns: 7,
            uid: 1000,
            user: "alice".into(),
        }
    }

    fn lease(host: &str, state: LeaseState) -> Lease {
        Lease {
            state,
            heartbeat_seq: 3,
            heartbeat_at: "2026-11-29T16:08:33.123456Z".into(),
            lease_id: "6f1c0d5e9a2b4c7d8e9f0a1b2c3d4e5f".into(),
            token: 17,
            ttl_ms: TTL.as_millis() as u64,
            acquired_at: "2026-11-29T16:00:00.000000Z".into(),
            holder: Holder {
                pid: 4242,
                pid_start: 99,
                child_pid: Some(4243),
                child_start: Some(100),
                pgid: Some(4243),
                host: host.into(),
                boot_id: format!("boot-{host}"),
                pid_ns: 7,
                uid: 1000,
                user: "alice".into(),
                command: vec!["job".into()],
                note: None,
            },
            ended: (state != LeaseState::Held).then(|| Ending {
                at: "2026-11-29T16:09:00.000000Z".into(),
                how: "revoked by force: test".into(),
                by: Some("bob@here pid 1".into()),
            }),
            damaged: false,
        }
    }

    fn content(l: &Lease) -> LockContent {
        LockContent::Lease(Box::new(l.clone()), l.to_bytes())
    }

    struct World {
        _dir: tempfile::TempDir,
        paths: LockPaths,
        me: Identity,
        clock: FakeClock,
    }

    fn world() -> World {
        let dir = tempfile::tempdir().unwrap();
        let paths = LockPaths::new(dir.path().join("job.lock")).unwrap();
        World {
            _dir: dir,
            paths,
            me: me(),
            clock: FakeClock(Mutex::new(Duration::from_secs(1000))),
        }
    }

    impl World {
        fn judge(&self, c: &LockContent, mem: &mut Memory, p: &FakeProcs) -> Verdict {
            let j = Judge {
                paths: &self.paths,
                me: &self.me,
                clock: &self.clock,
                wall_skew: None,
                persist: false,
            };
            j.judge_by(c, mem, p)
        }
    }

    #[test]
    fn free_when_missing_empty_or_released() {
        let w = world();
        let p = FakeProcs::default();
        let mut mem = Memory::default();
        for c in [
            LockContent::Missing,
            LockContent::Empty,
            content(&lease("here", LeaseState::Released)),
        ] {
            assert_eq!(w.judge(&c, &mut mem, &p).state, State::Free);
        }
    }

    #[test]
    fn same_host_dead_holder_is_stale_at_once() {
        let w = world();
        let v = w.judge(
            &content(&lease("here", LeaseState::Held)),
            &mut Memory::default(),
            &FakeProcs::default(),
        );
        assert_eq!(v.state, State::Stale);
        assert!(v.same_host);
        assert_eq!(v.reason, "process gone");
        assert!(v.remnants.is_empty() && v.unchecked.is_none());
    }

    #[test]
    fn same_host_dead_holder_reports_leftovers_and_unchecked() {
        let w = world();
        let mut p = FakeProcs::default();
        let left = Leftovers {
            belongs: vec![5000],
            unknown: 1,
            line: Some("pid 5001 cannot be checked".into()),
        };
        p.left.insert(4243, left);
        let v = w.judge(
            &content(&lease("here", LeaseState::Held)),
            &mut Memory::default(),
            &p,
        );
        assert_eq!(v.state, State::Stale);
        assert_eq!(v.remnants, vec![5000]);
        assert_eq!(v.unchecked.as_deref(), Some("pid 5001 cannot be checked"));
        assert!(v.reason.contains("1 leftover process(es)"), "{}", v.reason);
        assert!(v.reason.contains("cannot be checked"), "{}", v.reason);
    }

    #[test]
    fn same_host_alive_is_held_then_hung_after_a_stalled_ttl() {
        let w = world();
        let p = FakeProcs {
            alive: vec![(4243, 100)], // only the command lives
            ..Default::default()
        };
        let c = content(&lease("here", LeaseState::Held));
        let mut mem = Memory::default();
        assert_eq!(w.judge(&c, &mut mem, &p).state, State::Held);
        w.clock.advance(TTL - Duration::from_millis(1));
        assert_eq!(w.judge(&c, &mut mem, &p).state, State::Held);
        w.clock.advance(Duration::from_millis(1));
        let v = w.judge(&c, &mut mem, &p);
        assert_eq!(v.state, State::Hung);
        assert!(v.reason.contains("frozen?"), "{}", v.reason);
        // A heartbeat that moves is a new observation: held again.
        let mut moved = lease("here", LeaseState::Held);
        moved.heartbeat_seq += 1;
        assert_eq!(w.judge(&content(&moved), &mut mem, &p).state, State::Held);
    }

    #[test]
    fn foreign_is_stale_only_after_this_hosts_own_ttl() {
        let w = world();
        let p = FakeProcs {
            // A pid that is alive here means nothing for another host's holder.
            alive: vec![(4242, 99)],
            ..Default::default()
        };
        let c = content(&lease("there", LeaseState::Held));
        let mut mem = Memory::default();
        let v = w.judge(&c, &mut mem, &p);
        assert_eq!(v.state, State::Held);
        assert!(!v.same_host);
        w.clock.advance(TTL - Duration::from_millis(1));
        assert_eq!(w.judge(&c, &mut mem, &p).state, State::Held);
        // Another process of this host that never saw it (and no observation file): held.
        assert_eq!(w.judge(&c, &mut Memory::default(), &p).state, State::Held);
        w.clock.advance(Duration::from_millis(1));
        let v = w.judge(&c, &mut mem, &p);
        assert_eq!(v.state, State::Stale);
        assert!(
            v.reason.contains("no heartbeat seen from there"),
            "{}",
            v.reason
        );
        // Even the same host name on another boot is foreign.
        let mut rebooted = lease("here", LeaseState::Held);
        rebooted.holder.boot_id = "boot-earlier".into();
        let v = w.judge(&content(&rebooted), &mut Memory::default(), &p);
        assert!(!v.same_host);
        assert_eq!(v.state, State::Held);
    }

    #[test]
    fn foreign_dead_holder_goes_stale_for_one_shot_callers_together() {
        let w = world();
        let p = FakeProcs::default();
        let c = content(&lease("there", LeaseState::Held));
        let j = Judge {
            paths: &w.paths,
            me: &w.me,
            clock: &w.clock,
            wall_skew: None,
            persist: true,
        };
        // Each one-shot caller has a fresh memory: the observation file carries it over.
        assert_eq!(
            j.judge_by(&c, &mut Memory::default(), &p).state,
            State::Held
        );
        w.clock.advance(TTL);
        assert_eq!(
            j.judge_by(&c, &mut Memory::default(), &p).state,
            State::Stale
        );
    }

    #[test]
    fn revoked_same_host_is_held_while_alive_hung_after_ttl_stale_when_gone() {
        let w = world();
        let c = content(&lease("here", LeaseState::Revoked));
        let alive = FakeProcs {
            alive: vec![(4242, 99)],
            ..Default::default()
        };
        let mut mem = Memory::default();
        let v = w.judge(&c, &mut mem, &alive);
        assert_eq!(v.state, State::Held);
        assert!(v.reason.starts_with("revoked by bob@here"), "{}", v.reason);
        w.clock.advance(TTL);
        assert_eq!(w.judge(&c, &mut mem, &alive).state, State::Hung);
        let v = w.judge(&c, &mut mem, &FakeProcs::default());
        assert_eq!(v.state, State::Stale);
        assert!(v.reason.starts_with("revoked by"), "{}", v.reason);
    }

    #[test]
    fn revoked_foreign_counts_its_ttl_from_the_revoked_record_not_the_heartbeat() {
        let w = world();
        let p = FakeProcs::default();
        let held = content(&lease("there", LeaseState::Held));
        let mut mem = Memory::default();
        assert_eq!(w.judge(&held, &mut mem, &p).state, State::Held);
        w.clock.advance(TTL - Duration::from_secs(1));
        // Revoked (same heartbeat sequence) just before the heartbeat would have gone stale.
        let revoked = content(&lease("there", LeaseState::Revoked));
        let v = w.judge(&revoked, &mut mem, &p);
        assert_eq!(v.state, State::Held);
        assert_eq!(v.heartbeat_age, Some(Duration::ZERO));
        w.clock.advance(TTL - Duration::from_millis(1));
        assert_eq!(w.judge(&revoked, &mut mem, &p).state, State::Held);
        w.clock.advance(Duration::from_millis(1));
        let v = w.judge(&revoked, &mut mem, &p);
        assert_eq!(v.state, State::Stale);
        assert!(
            v.reason.contains("revoked record unchanged"),
            "{}",
            v.reason
        );
    }

    #[test]
    fn damaged_record_is_judged_by_its_bytes_alone_even_on_this_host() {
        let w = world();
        // Its processes "live", but a damaged record's content is not trusted.
        let p = FakeProcs {
            alive: vec![(4242, 99), (4243, 100)],
            ..Default::default()
        };
        let mut l = lease("here", LeaseState::Held);
        l.damaged = true;
        let c = content(&l);
        let mut mem = Memory::default();
        let v = w.judge(&c, &mut mem, &p);
        assert_eq!(v.state, State::Held);
        assert!(v.reason.contains("record damaged"), "{}", v.reason);
        w.clock.advance(TTL);
        let v = w.judge(&c, &mut mem, &p);
        assert_eq!(v.state, State::Stale);
        assert!(v.reason.ends_with("the record is damaged"), "{}", v.reason);
        // Other bytes are another observation: the TTL starts again.
        let mut other = l.clone();
        other.token += 1;
        assert_eq!(w.judge(&content(&other), &mut mem, &p).state, State::Held);
    }

    #[test]
    fn wall_clock_shortcut_is_opt_in() {
        let w = world();
        let p = FakeProcs::default();
        let c = content(&lease("there", LeaseState::Held)); // written long before "now"
        let mut j = Judge {
            paths: &w.paths,
            me: &w.me,
            clock: &w.clock,
            wall_skew: None,
            persist: false,
        };
        assert_eq!(
            j.judge_by(&c, &mut Memory::default(), &p).state,
            State::Held
        );
        j.wall_skew = Some(Duration::from_secs(600));
        let v = j.judge_by(&c, &mut Memory::default(), &p);
        assert_eq!(v.state, State::Stale);
        assert!(v.reason.contains("allowed skew"), "{}", v.reason);
    }
}
