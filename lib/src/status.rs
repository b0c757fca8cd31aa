//! Looking at a lock and breaking it by hand: what `leasehold status` and `leasehold break` do.
//!
//! Owns: judging a lock for display (recording this host's observation, as a contender would),
//! and the operator's break: by lease id (the id is the operator's
//! confirmation), stale-only, or forced. A break keeps the token and says who broke it and why:
//! a stale lease (or a forged or copied one, whose live processes are verifiably not this
//! lock's) becomes a released record, a live one a revoked record.
//! Must never: change a lease while only looking; break a live lease without the operator naming
//! its id or forcing; free a live lease at once (it is revoked: two jobs must never overlap);
//! signal a process that /proc does not verify.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock, format_rfc3339};
use crate::error::{Error, Result};
use crate::fsio::LockContent;
use crate::identity::Identity;
use crate::observe::Memory;
use crate::paths::LockPaths;
use crate::process::{self, Evidence};
use crate::record::{Ending, Lease, LeaseState};
use crate::store::file::FileStore;
use crate::store::{Binding, Store, StuckPolicy};
use crate::takeover;
use crate::verdict::{State, Verdict};

pub(crate) mod holders;
pub(crate) mod outcome;

pub use outcome::{AtTerminal, BreakMode, Broken, Frees};

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
/// assert_eq!(v.lease.as_ref().map(|l| l.token), Some(g.token()));
/// # Ok(()) }
/// ```
pub fn status(path: impl AsRef<Path>) -> Result<Verdict> {
    status_with(path, &Identity::current(), &SystemClock)
}

/// [`status`] as seen by an injected identity and clock (for tests and tools).
pub fn status_with(path: impl AsRef<Path>, me: &Identity, clock: &dyn Clock) -> Result<Verdict> {
    if let Some(r) = crate::store::status_elsewhere(path.as_ref(), me, clock) {
        return r;
    }
    let paths = LockPaths::new(path)?;
    // A LOCK that does not exist is said to be so, and looking creates nothing beside it (no
    // mutex, no observation file): there is no lease to observe.
    let missing = matches!(paths.handle().stat(paths.lock_name()), Ok(None));
    let store = FileStore::looking(paths);
    if missing {
        let mut judge = store.judge(me, clock);
        judge.persist = false;
        let mut v = judge.judge(&LockContent::Missing, &mut Memory::default());
        v.reason = "does not exist (no lease yet; nothing was created)".into();
        if crate::mutex::marked_if_present(store.paths()) {
            v.holder_unseen();
        }
        v.queue = store.waiting();
        return Ok(v);
    }
    // Take the mutex if we can (so the observation file is written by one process at a time);
    // a status that cannot get it, or cannot write beside LOCK, still reads and judges. A look
    // never creates the mutex: without one (a file no lease was ever taken on — `/dev/null`, an
    // ordinary file — or a mutex deleted), it reads without it and records no observation, so
    // looking at any file creates nothing beside it (LOCK's record is replaced atomically and
    // read with torn-read retries, so a read without the mutex is a consistent one).
    let mutex_exists = !matches!(
        store.paths().handle().stat(store.paths().mutex_name()),
        Ok(None)
    );
    let m = if mutex_exists {
        enter(&store).ok()
    } else {
        None
    };
    let content = store.read()?;
    let mut judge = store.judge(me, clock);
    judge.persist = m.is_some();
    let mut v = judge.judge(&content, &mut Memory::default());
    let from = v.lease.as_ref().map_or(0, |l| l.token);
    if v.state == State::Free && m.as_ref().is_some_and(|m| store.marked(m, from)) {
        v.holder_unseen();
    } else if v.state != State::Held
        && let Some(who) = store.foreign_lock(
            (v.lease.as_ref()).filter(|_| v.state == State::Hung && v.same_host),
            None,
        )
    {
        v.kernel_locked(who);
    }
    if let Some(mode) = crate::slots::lock_mode(&content) {
        let look = crate::slots::Look {
            me,
            clock,
            wall_skew: None,
            persist: m.is_some(),
        };
        holders::look(&store, mode, &mut v, look)?;
    }
    // Shared or slotted holders whose records are gone or forged still hold their counted
    // marks (PROTOCOL.md §13): the lock is held, whatever the files say (free or stale).
    if matches!(v.state, State::Free | State::Stale)
        && m.as_ref().is_some_and(|m| store.shared_holders(m, 1) > 0)
    {
        v.holder_unseen();
    }
    v.queue = store.waiting();
    Ok(v)
}

/// Enters the store's section for a look or a break, waiting at most [`LOOK_WAIT`].
fn enter<S: Store>(store: &S) -> Result<S::Section> {
    let deadline = Some(Instant::now() + LOOK_WAIT);
    let policy = StuckPolicy::Report;
    store.enter(
        &mut Default::default(),
        deadline,
        Duration::MAX,
        policy,
        None,
        None,
    )
}

/// Breaks the lease at `path`.
///
/// - A stale lease is replaced by a released record at once (token kept, who broke it and why
///   recorded), after stopping (verified SIGKILL) what its job left in its process group.
/// - A live lease ([`BreakMode::LeaseId`] or [`BreakMode::Force`]) is **revoked**: the record keeps its lease id,
///   holder and token, with state `revoked` and who revoked it. Its holder fences at its next
///   renewal; the lock is not free until its processes are gone (same host) or each contender's
///   host has seen the revoked record unchanged for its TTL (other hosts): see [`Frees`].
/// - A hung same-host holder's command is stopped first (verified) and the lease released.
/// - A lease whose live processes are verifiably not holders of this lock (a forged or copied
///   lease: pid 1, an unrelated process) is released at once, signalling nothing.
/// - When the old job's processes cannot be checked (another user's /proc), nothing is
///   signalled: a live lease is revoked, a stale one is refused unless forced.
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let lock = dir.path().join("job.lock");
/// let g = leasehold::LeaseBuilder::new(&lock).try_acquire()?;
/// // A live lease is refused without the operator's confirmation...
/// assert!(leasehold::break_lease(&lock, leasehold::BreakMode::Stale).is_err());
/// // ...and revoked with it: not free while its holder (this process) lives.
/// let b = leasehold::break_lease(&lock, leasehold::BreakMode::LeaseId(g.lease_id()))?;
/// assert!(b.was_live);
/// assert_eq!(b.written, leasehold::LeaseState::Revoked);
/// assert_eq!(leasehold::status(&lock)?.state, leasehold::State::Held);
/// // Its holder's release frees it.
/// g.release()?;
/// assert_eq!(leasehold::status(&lock)?.state, leasehold::State::Free);
/// # Ok(()) }
/// ```
pub fn break_lease(path: impl AsRef<Path>, mode: BreakMode) -> Result<Broken> {
    if let Some(r) = crate::store::break_elsewhere(path.as_ref(), &mode) {
        return r;
    }
    let store = FileStore::looking(LockPaths::new(path)?);
    let me = Identity::current();
    let clock = SystemClock;
    let section = enter(&store)?;
    let content = store.read()?;
    let v = store
        .judge(&me, &clock)
        .judge(&content, &mut Memory::default());
    if let Some(m) = crate::slots::lock_mode(&content) {
        let look = crate::slots::Look {
            me: &me,
            clock: &clock,
            wall_skew: None,
            persist: true,
        };
        return holders::brk(&store, &section, m, &content, &v, &mode, look);
    }
    let refuse = |why: String| Error::Refused {
        path: store.paths().lock.clone(),
        why,
    };
    let (LockContent::Lease(lease, _), false) = (&content, v.state == State::Free) else {
        return Err(refuse(format!("nothing to break: {v}")));
    };
    permitted(&v, lease, &mode).map_err(refuse)?;
    let b = Breaker {
        store: &store,
        section: &section,
        lease,
        v: &v,
        by: format!("{}@{} pid {}", me.user, me.host, std::process::id()),
        clock: &clock,
    };
    break_judged(&b, &mode)
}

/// What `ack` decides inside the mutex: the record to write, if any, and what to report.
pub(crate) type AckFn<'a> = dyn FnMut(&Lease) -> Result<(Option<Lease>, crate::ending::Acked)> + 'a;

/// `leasehold ack`'s write (`ending.rs`): inside the mutex, `f` looks at LOCK's record and
/// returns the record to write in its place, if any, and what to report.
pub(crate) fn ack_under_mutex(path: &Path, f: &mut AckFn<'_>) -> Result<crate::ending::Acked> {
    let store = FileStore::looking(LockPaths::new(path)?);
    let section = enter(&store)?;
    let content = store.read()?;
    let lease = match &content {
        LockContent::Lease(l, _) if l.mode.is_none() => l,
        LockContent::Lease(..) => {
            return Err(Error::Refused {
                path: store.paths().lock.clone(),
                why: "a shared or counted lock keeps no ending record".into(),
            });
        }
        _ => {
            return Err(Error::Refused {
                path: store.paths().lock.clone(),
                why: "no ending is recorded: LOCK is missing or empty".into(),
            });
        }
    };
    let (rec, out) = f(lease)?;
    if let Some(r) = rec {
        store.replace(&section, &r)?;
    }
    Ok(out)
}

/// Breaks the lease `b` judged, as `mode` allows: a live one revoked (or, when forged or
/// hung, replaced), a stale one released — LOCK's own lease, or one holder's of a shared lock.
fn break_judged<S: Store>(b: &Breaker<'_, S>, mode: &BreakMode) -> Result<Broken> {
    let was_live = matches!(b.v.state, State::Held | State::Hung);
    let out = Broken {
        verdict: b.v.clone(),
        was_live,
        stopped: 0,
        written: LeaseState::Released,
        frees: Frees::Now,
        forged: None,
        unchecked: None,
        at_terminal: None,
        already_revoked: false,
        more: Vec::new(),
    };
    if was_live {
        b.live(mode, out)
    } else {
        b.stale(mode, out)
    }
}

/// Whether `mode` lets the operator break the lease judged `v`: why not, if it does not.
pub(crate) fn permitted(
    v: &Verdict,
    lease: &Lease,
    mode: &BreakMode,
) -> std::result::Result<(), String> {
    match mode {
        BreakMode::Stale if v.state != State::Stale => Err(format!(
            "refusing to break a live lease: {v}; break it by its lease id {}, or by force",
            lease.lease_id
        )),
        BreakMode::LeaseId(id) if !id.eq_ignore_ascii_case(&lease.lease_id) => Err(format!(
            "lease id {} does not match the lease on this lock (id {}, {}): check the id for a typo; nothing broken",
            crate::text::escape(id),
            lease.lease_id,
            v.holder()
        )),
        _ => Ok(()),
    }
}

/// One break, inside the store's section.
struct Breaker<'a, S: Store> {
    store: &'a S,
    section: &'a S::Section,
    lease: &'a Lease,
    v: &'a Verdict,
    /// Who breaks it: `user@host pid N`.
    by: String,
    clock: &'a dyn Clock,
}

impl<S: Store> Breaker<'_, S> {
    /// Replaces the lease with its own record in `state`, saying who ended it and `how`.
    fn write(&self, state: LeaseState, how: String) -> Result<()> {
        let mut rec = self.lease.clone();
        rec.state = state;
        rec.damaged = false;
        rec.ended = Some(Ending {
            at: format_rfc3339(self.clock.wall()),
            how,
            by: Some(self.by.clone()),
        });
        self.store.replace(self.section, &rec)
    }

    fn refuse(&self, why: String) -> Error {
        Error::Refused {
            path: self.store.binding().lock().to_path_buf(),
            why,
        }
    }

    /// A stale lease (its holder gone, or silent for a TTL): released, after stopping
    /// (verified) what its job left — unless something of it cannot be checked, which only a
    /// forced break goes past.
    fn stale(&self, mode: &BreakMode, mut out: Broken) -> Result<Broken> {
        let v = self.v;
        match &v.unchecked {
            Some(line) if *mode == BreakMode::Stale => {
                return Err(self.refuse(format!("not breaking ({v}): {line}")));
            }
            Some(line) => out.unchecked = Some(line.clone()),
            None => {
                out.stopped = takeover::stop_old_job(v, self.store.binding())
                    .map_err(|why| self.refuse(format!("cannot stop the old job ({v}): {why}")))?;
            }
        }
        self.write(LeaseState::Released, format!("broken: {}", v.reason))?;
        Ok(out)
    }

    /// A live lease (held or hung): revoked — or, same host, released when it is forged or
    /// copied (signalling nothing) or hung with a command that can be stopped (verified).
    fn live(&self, mode: &BreakMode, mut out: Broken) -> Result<Broken> {
        let (v, lease, binding) = (self.v, self.lease, self.store.binding());
        let ttl = Duration::from_millis(lease.ttl_ms);
        if ttl > crate::timing::MAX_TTL {
            // No leasehold grants such a TTL: waiting it out (a year, say) is what a forged
            // record would make every contender do. Cleared at once, signalling nothing.
            let what = format!(
                "a TTL of {}, longer than any leasehold grants ({}), so not a lease leasehold wrote",
                crate::clock::human_duration(ttl),
                crate::clock::human_duration(crate::timing::MAX_TTL)
            );
            self.write(LeaseState::Released, format!("broken: {what}"))?;
            out.forged = Some(what);
            return Ok(out);
        }
        if v.same_host {
            let found = judge_live(lease, binding);
            if let Some(forged) = found.forged() {
                let how = format!("broken: {forged} (forged or copied lease)");
                self.write(LeaseState::Released, how)?;
                out.forged = Some(forged);
                return Ok(out);
            }
            // Worth saying only when it is why the lease is revoked rather than stopped or
            // replaced (a live holder that provably is this lock's is revoked anyway).
            if !found.belongs || v.state == State::Hung {
                out.unchecked = found.unknown.clone();
            }
            out.at_terminal = at_terminal(lease);
            if let Some(t) = &out.at_terminal
                && (out.unchecked.as_ref())
                    .is_some_and(|u| u.starts_with(&format!("pid {} ", t.pid)))
            {
                // Said by `at_terminal`, with what to do.
                out.unchecked = None;
            }
            if v.state == State::Hung && found.unknown.is_none() {
                match takeover::stop_hung(lease, binding) {
                    Ok(n) => {
                        out.stopped = n;
                        self.write(LeaseState::Released, format!("broken: {}", v.reason))?;
                        return Ok(out);
                    }
                    Err(why) => out.unchecked = Some(why),
                }
            }
            out.frees = Frees::WhenGone { ttl };
        } else {
            out.frees = Frees::AfterTtl { ttl };
        }
        out.written = LeaseState::Revoked;
        if lease.state == LeaseState::Revoked {
            // Writing it again would restart every other host's observation of it.
            out.already_revoked = true;
            return Ok(out);
        }
        let how = match mode {
            BreakMode::LeaseId(_) => "revoked by lease id",
            _ => "revoked by force",
        };
        self.write(LeaseState::Revoked, format!("{how}: {}", v.reason))?;
        Ok(out)
    }
}

/// What /proc says of a live same-host lease's processes: the recorded holder and command, and
/// the members of its recorded process group.
#[derive(Debug, Default)]
struct LiveJob {
    /// Some recorded process, or a member of the group, provably belongs to this lock's job.
    belongs: bool,
    /// Recorded live processes that provably do not belong to it: why.
    not_ours: Vec<String>,
    /// The first process that cannot be checked: why (and what to do).
    unknown: Option<String>,
}

impl LiveJob {
    /// When every recorded live process is provably not a holder of this lock, and nothing in
    /// its group belongs to the job or is unreadable: what the lease names, for the break line.
    fn forged(&self) -> Option<String> {
        if self.belongs || self.unknown.is_some() || self.not_ours.is_empty() {
            return None;
        }
        Some(self.not_ours.join("; "))
    }
}

/// The script of a script-mode lease, alive (same start time) and at a terminal: who must end.
fn at_terminal(lease: &Lease) -> Option<AtTerminal> {
    let h = &lease.holder;
    if !h.on_behalf {
        return None;
    }
    let (pid, start) = h.child_pid.zip(h.child_start)?;
    let s = process::stat(pid).ok()??;
    if s.start != start || s.is_dead() {
        return None;
    }
    Some(AtTerminal {
        pid,
        user: crate::lockdir::user_name(s.uid),
        tty: process::tty_name(pid)?,
    })
}

fn judge_live(lease: &Lease, binding: &dyn Binding) -> LiveJob {
    let h = &lease.holder;
    let ev = binding.evidence(lease);
    let mut out = LiveJob::default();
    let recorded = [Some((h.pid, h.pid_start)), h.child_pid.zip(h.child_start)];
    for (i, (pid, start)) in recorded.into_iter().flatten().enumerate() {
        match process::stat(pid) {
            // The holder by its holder's mark; its command by its environment.
            Ok(Some(s)) if s.start == start && !s.is_dead() => match if i == 0 {
                ev.check_holder(&s)
            } else {
                ev.check(&s)
            } {
                Evidence::Belongs => out.belongs = true,
                Evidence::NotOurs(why) => out.not_ours.push(format!(
                    "lease names pid {pid}, which is not a holder of this lock ({why})"
                )),
                Evidence::Unknown(why) => {
                    out.unknown.get_or_insert(format!(
                        "pid {pid} (uid {}) cannot be checked: {why}",
                        s.uid
                    ));
                }
            },
            Ok(_) => {}
            Err(e) => {
                out.unknown
                    .get_or_insert(format!("/proc/{pid}/stat cannot be read: {e}"));
            }
        }
    }
    if let Some(pg) = h.pgid {
        let g = process::judge_group(pg, &ev);
        out.belongs |= !g.belongs.is_empty();
        if out.unknown.is_none() {
            out.unknown = g.unknown_line(pg, &h.user);
        }
    }
    out
}
