//! Looking at a lock and breaking it by hand: what `leasehold status` and `leasehold break` do.
//!
//! Owns: judging a lock for display (recording this host's observation, as a contender would),
//! the JSON form of a verdict, and the operator's break: by lease id (the id is the operator's
//! confirmation), stale-only, or forced. A break writes a released record that keeps the token
//! and says who broke it and why.
//! Must never: change a lease while only looking; break a live lease without the operator naming
//! its id or forcing; signal a process that /proc does not verify.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::clock::{Clock, SystemClock, format_rfc3339};
use crate::error::{Error, Result};
use crate::fsio::{self, LockContent};
use crate::identity::Identity;
use crate::mutex::{self, StuckPolicy};
use crate::observe::Memory;
use crate::paths::LockPaths;
use crate::queue;
use crate::record::{Ending, LeaseState};
use crate::verdict::{Judge, State, Verdict};

/// How long `status` and `break` wait for the mutex before reading without it.
const LOOK_WAIT: Duration = Duration::from_secs(2);

/// Judges the lock at `path` without changing it, recording what this host saw of the holder's
/// heartbeat (so that repeated one-shot looks still see a silent foreign holder go stale).
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let lock = dir.path().join("job.lock");
/// assert_eq!(leasehold::status(&lock)?.state, leasehold::State::Free);
/// let g = leasehold::LeaseBuilder::new(&lock).try_acquire()?;
/// let v = leasehold::status(&lock)?;
/// assert_eq!(v.state, leasehold::State::Held);
/// assert_eq!(v.to_json()["token"], g.token());
/// # Ok(()) }
/// ```
pub fn status(path: impl AsRef<Path>) -> Result<Verdict> {
    status_with(path, &Identity::current(), &SystemClock)
}

/// [`status`] as seen by an injected identity and clock (for tests and tools).
pub fn status_with(path: impl AsRef<Path>, me: &Identity, clock: &dyn Clock) -> Result<Verdict> {
    let paths = LockPaths::new(path)?;
    // Take the mutex if we can (so the observation file is written by one process at a time);
    // a status that cannot get it, or cannot write beside LOCK, still reads and judges.
    let m = mutex::lock(
        &paths,
        Some(Instant::now() + LOOK_WAIT),
        Duration::MAX,
        StuckPolicy::Report,
    )
    .ok();
    let content = fsio::read_lock(&paths)?;
    let judge = Judge {
        paths: &paths,
        me,
        clock,
        wall_skew: None,
        persist: m.is_some(),
    };
    let mut v = judge.judge(&content, &mut Memory::default());
    v.queue = queue::snapshot(&paths);
    Ok(v)
}

/// What `break` may break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakMode {
    /// Only a stale lease; a live (held or hung) one is refused with the reason.
    Stale,
    /// Exactly the lease with this id, live or not: naming the id is the operator's confirmation.
    LeaseId(String),
    /// Whatever lease is there.
    Force,
}

/// The outcome of a break.
#[derive(Debug, Clone)]
pub struct Broken {
    /// The lease as it was judged just before breaking.
    pub verdict: Verdict,
    /// True when its holder was judged live: it will fence its command at its next renewal.
    pub was_live: bool,
    /// Processes of the old job that were stopped (verified against /proc) before breaking.
    pub stopped: usize,
}

/// Breaks the lease at `path` by writing a released record in its place (token kept, who broke
/// it and why recorded). A hung same-host holder's command is stopped first (verified SIGKILL
/// of its process group), as are leftover processes of a dead holder's job.
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let lock = dir.path().join("job.lock");
/// let g = leasehold::LeaseBuilder::new(&lock).try_acquire()?;
/// // A live lease is refused without the operator's confirmation...
/// assert!(leasehold::break_lease(&lock, leasehold::BreakMode::Stale).is_err());
/// // ...and broken with it.
/// let b = leasehold::break_lease(&lock, leasehold::BreakMode::LeaseId(g.lease_id()))?;
/// assert!(b.was_live);
/// # Ok(()) }
/// ```
pub fn break_lease(path: impl AsRef<Path>, mode: BreakMode) -> Result<Broken> {
    let paths = LockPaths::new(path)?;
    let me = Identity::current();
    let clock = SystemClock;
    let _m = mutex::lock(
        &paths,
        Some(Instant::now() + LOOK_WAIT),
        Duration::MAX,
        StuckPolicy::Report,
    )?;
    let content = fsio::read_lock(&paths)?;
    let judge = Judge {
        paths: &paths,
        me: &me,
        clock: &clock,
        wall_skew: None,
        persist: true,
    };
    let v = judge.judge(&content, &mut Memory::default());
    let refuse = |why: String| Error::Refused {
        path: paths.lock.clone(),
        why,
    };
    let (LockContent::Lease(lease, _), false) = (&content, v.state == State::Free) else {
        return Err(refuse(format!("nothing to break: {v}")));
    };
    match &mode {
        BreakMode::Stale if v.state != State::Stale => {
            return Err(refuse(format!(
                "refusing to break a live lease: {v}; name it with --lease-id {} or use --force",
                lease.lease_id
            )));
        }
        BreakMode::LeaseId(id) if !id.eq_ignore_ascii_case(&lease.lease_id) => {
            return Err(refuse(format!(
                "the lease id is {}, not {id}: the lease changed hands; nothing broken",
                lease.lease_id
            )));
        }
        _ => {}
    }
    let stopped = crate::builder::stop_old_job(&v, &paths)
        .map_err(|why| refuse(format!("cannot stop the old job ({v}): {why}")))?;
    let mut rec = lease.as_ref().clone();
    rec.state = LeaseState::Released;
    rec.damaged = false;
    rec.ended = Some(Ending {
        at: format_rfc3339(clock.wall()),
        how: format!("broken: {}", v.reason),
        by: Some(format!(
            "{}@{} pid {}",
            me.user,
            me.host,
            std::process::id()
        )),
    });
    fsio::replace(&paths, &paths.lock, &rec.to_bytes(), true)?;
    let was_live = matches!(v.state, State::Held | State::Hung);
    Ok(Broken {
        verdict: v,
        was_live,
        stopped,
    })
}

impl Verdict {
    /// The machine-readable form used by `leasehold status --json`.
    pub fn to_json(&self) -> Value {
        let l = self.lease.as_ref();
        let h = l.map(|l| &l.holder);
        json!({
            "path": self.path.display().to_string(),
            "state": self.state,
            "reason": self.reason,
            "token": l.map(|l| l.token),
            "lease_id": l.map(|l| l.lease_id.clone()),
            "lease_state": l.map(|l| l.state),
            "pid": h.map(|h| h.pid),
            "child_pid": h.and_then(|h| h.child_pid),
            "pgid": h.and_then(|h| h.pgid),
            "host": h.map(|h| h.host.clone()),
            "user": h.map(|h| h.user.clone()),
            "command": h.map(|h| h.command.clone()),
            "note": h.and_then(|h| h.note.clone()),
            "acquired_at": l.map(|l| l.acquired_at.clone()),
            "heartbeat_at": l.map(|l| l.heartbeat_at.clone()),
            "heartbeat_seq": l.map(|l| l.heartbeat_seq),
            "heartbeat_age_ms": self.heartbeat_age.map(|a| a.as_millis() as u64),
            "ttl_ms": l.map(|l| l.ttl_ms),
            "same_host": self.same_host,
            "queue": self.queue.iter().map(|w| json!({
                "seq": w.seq, "pid": w.pid, "host": w.host, "user": w.user,
                "since": w.since, "command": w.command,
            })).collect::<Vec<_>>(),
            "ended": l.and_then(|l| l.ended.as_ref()).map(|e| json!({
                "at": e.at, "how": e.how, "by": e.by,
            })),
        })
    }
}
