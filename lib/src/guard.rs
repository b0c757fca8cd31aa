//! Holding a lease: the guard, its loss, and its release.
//!
//! Owns: the [`LeaseGuard`] (token, lease id, timing, loss: `is_lost`, `wait_lost`, `on_lost`),
//! one renewal turn and when it counts (only if it completed before the deadline; the new
//! deadline counts from its start), recording the wrapped command in the lease, and the order
//! of a release. The store does the I/O of each (`store/`): renewing in place after checking
//! the lease is still ours, the release (in place to a waiting head, or a released record),
//! and keeps the holder's files. The threads that renew and watch live in `keeper.rs`; the
//! timing rules in `timing.rs`.
//! Must never: extend the deadline on a renewal that completed after it; count a renewal whose
//! lease was not ours or was revoked; write LOCK after finding it is not ours; make a revoked
//! record held again; renew or write after the release began.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard as StdGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::boottime::BootInstant;

use crate::clock::{Clock, format_rfc3339};
use crate::error::{Error, Result};
use crate::handover::ServeCallback;
use crate::keeper::{self, Kept};
use crate::loss::{LossReason, LostCallback};
use crate::record::{Lease, LeaseState};
use crate::store::any::AnyHolding;
use crate::store::{Holding, Ours, Release, Renewal};
use crate::timing::Timing;
use crate::verdict::Verdict;

/// Everything a new guard starts from.
pub(crate) struct Start<H> {
    /// The absolute LOCK path.
    pub path: PathBuf,
    pub timing: Timing,
    pub clock: Arc<dyn Clock>,
    pub lease: Lease,
    pub bytes: Vec<u8>,
    /// When the acquiring write began: the first renew deadline counts from here.
    pub started: BootInstant,
    pub on_lost: Option<LostCallback>,
    pub on_serve: Option<ServeCallback>,
    pub broke: Option<Verdict>,
    /// The lease's link to its store.
    pub holding: H,
}

struct Record {
    lease: Lease,
    bytes: Vec<u8>,
}

struct Control {
    /// The renew deadline, on CLOCK_BOOTTIME (see `boottime.rs`).
    deadline: BootInstant,
    /// When the keeper should next renew this guard.
    next_renew: BootInstant,
    stop: bool,
    /// Threads inside `wait_lost` (notified only when there are any).
    waiting: usize,
    last_error: Option<String>,
    /// When a look at our record is due, after a change to it was seen (see `Kept::check_at`).
    check_at: Option<BootInstant>,
    /// When the last renewal or look started.
    last_look: BootInstant,
}

/// At most one look per this long at a record that keeps changing (our own renewals change it
/// too): a removed or replaced record is noticed within it, at the cost of one read.
const CHECK_GAP: std::time::Duration = std::time::Duration::from_millis(100);

/// A guard's first look, this long after it starts; its record is watched from then on (see
/// `keeper::Keeper::watch`: a watch costs its process a wait at exit that a lease held for a
/// millisecond should not pay).
pub(crate) const WATCH_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

struct Inner<H> {
    path: PathBuf,
    /// Our lease id, which never changes (read without the record's lock).
    lease_id: String,
    timing: Timing,
    clock: Arc<dyn Clock>,
    record: Mutex<Record>,
    control: Mutex<Control>,
    cond: Condvar,
    lost: AtomicBool,
    loss: Mutex<Option<LossReason>>,
    on_lost: Option<LostCallback>,
    on_serve: Option<ServeCallback>,
    holding: H,
}

fn lock<T>(m: &Mutex<T>) -> StdGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A held lease. Renews itself from a background thread; released on [`LeaseGuard::release`]
/// or on drop.
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let guard = leasehold::LeaseBuilder::new(dir.path().join("job.lock")).try_acquire()?;
/// assert!(guard.token() >= 1);
/// assert!(!guard.is_lost());
/// guard.release()?;
/// # Ok(()) }
/// ```
pub struct LeaseGuard {
    inner: Arc<Inner<AnyHolding>>,
    broke: Option<Verdict>,
    done: bool,
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("path", &self.inner.path)
            .field("lease_id", &self.lease_id())
            .field("token", &self.token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LeaseGuard {
    pub(crate) fn start(s: Start<impl Into<AnyHolding>>) -> Result<LeaseGuard> {
        let Start {
            path,
            timing,
            clock,
            lease,
            bytes,
            started,
            on_lost,
            on_serve,
            broke,
            holding,
        } = s;
        let inner = Arc::new(Inner {
            path,
            lease_id: lease.lease_id.clone(),
            timing,
            clock,
            record: Mutex::new(Record { lease, bytes }),
            control: Mutex::new(Control {
                deadline: started + timing.renew_window(),
                next_renew: started + timing.heartbeat,
                stop: false,
                waiting: 0,
                last_error: None,
                check_at: Some(started + WATCH_AFTER),
                last_look: started,
            }),
            cond: Condvar::new(),
            lost: AtomicBool::new(false),
            loss: Mutex::new(None),
            on_lost,
            on_serve,
            holding: holding.into(),
        });
        let renew_at = lock(&inner.control).next_renew;
        keeper::keep(Arc::clone(&inner) as Arc<dyn Kept>, renew_at)
            .map_err(|e| Error::io(&inner.path, "start the renewal threads", e))?;
        Ok(LeaseGuard {
            inner,
            broke,
            done: false,
        })
    }

    /// The fencing token: strictly greater than every token handed out before for this LOCK.
    /// Pass it to the resource you guard so it can refuse a stale holder's late writes.
    pub fn token(&self) -> u64 {
        lock(&self.inner.record).lease.token
    }

    /// The random id of this holding (32 hex digits), for breaking it by id ([`crate::BreakMode::LeaseId`]).
    pub fn lease_id(&self) -> String {
        self.inner.lease_id.clone()
    }

    /// Whether LOCK still holds our lease, held (see `store::ours`): a fresh read, without the
    /// lease mutex and without our record's lock. Unreadable storage counts as "yes" (the
    /// guard's own deadline decides then).
    pub fn still_ours(&self) -> bool {
        match self.inner.holding.still_ours(&self.inner.lease_id) {
            Ok(o) => o == Ours::Held,
            Err(_) => true,
        }
    }

    /// The absolute LOCK path.
    pub fn path(&self) -> &std::path::Path {
        &self.inner.path
    }

    /// A copy of the lease as last written.
    pub fn lease(&self) -> Lease {
        lock(&self.inner.record).lease.clone()
    }

    /// The timing in force.
    pub fn timing(&self) -> Timing {
        self.inner.timing
    }

    /// What we broke to get this lease, if it was stale or hung.
    pub fn broke(&self) -> Option<&Verdict> {
        self.broke.as_ref()
    }

    /// True once the guard is lost: stop work that the lease protects, now.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.load(Ordering::Acquire)
    }

    /// Why the guard was lost, if it was.
    pub fn loss(&self) -> Option<LossReason> {
        lock(&self.inner.loss).clone()
    }

    /// Blocks until the guard is lost or `timeout` passes; returns the reason if lost.
    pub fn wait_lost(&self, timeout: Duration) -> Option<LossReason> {
        let end = Instant::now() + timeout;
        let mut c = lock(&self.inner.control);
        c.waiting += 1;
        while !self.is_lost() && !c.stop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            c = self
                .inner
                .cond
                .wait_timeout(c, end - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        c.waiting -= 1;
        drop(c);
        self.loss()
    }

    /// Records the wrapped command (its pid, start time and process group) in the lease, so that
    /// contenders see that the holding job lives on while the command does.
    ///
    /// Waits for the mutex up to two TTLs; a stopped process sitting on it is judged after one
    /// TTL, as a contender would judge it. Renewals go on meanwhile (they need no mutex).
    pub fn set_child(&self, pid: i32, start: u64, pgid: i32) -> Result<()> {
        let inner = &self.inner;
        // The section first, then our record: a renewal (record only) is never held up by the
        // wait.
        let ttl = inner.timing.ttl;
        let section = inner.holding.enter(Instant::now() + ttl * 2, ttl)?;
        let mut rec = lock(&inner.record);
        let mut lease = rec.lease.clone();
        lease.holder.child_pid = Some(pid);
        lease.holder.child_start = Some(start);
        lease.holder.pgid = Some(pgid);
        let bytes = lease.to_bytes();
        inner.holding.rewrite(&section, &rec.lease, &bytes)?;
        drop(section);
        *rec = Record { lease, bytes };
        Ok(())
    }

    /// A duplicate (close-on-exec) of the descriptor on which this holder holds its kernel lock
    /// on LOCK's own file — the lock that keeps util-linux `flock(1)` on LOCK waiting for the
    /// holding (PROTOCOL.md §10). A process that must keep flock(1) out past this process's own
    /// death, until what the job left running is stopped (the `leasehold run` guardian), keeps
    /// it open; [`LeaseGuard::release`] lets go of the lock for every duplicate at once.
    /// On NFS it is a byte-range lock on LOCK's file, on a descriptor open read-write (PROTOCOL.md
    /// §9, "In place"). `None` where the holder holds no such lock: for shared and counted
    /// leases, on etcd and S3, and once LOCK was rewritten to another file.
    ///
    /// ```
    /// # fn main() -> Result<(), leasehold::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("job.lock");
    /// let guard = leasehold::LeaseBuilder::new(&path).try_acquire()?;
    /// let keep = guard.lock_file_descriptor(); // hand it to a process that outlives us
    /// guard.release()?;
    /// drop(keep);
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_file_descriptor(&self) -> Option<std::os::fd::OwnedFd> {
        self.inner.holding.kernel_lock()
    }

    /// Duplicates of the descriptors on which this holder keeps the lock of files that are no
    /// longer LOCK — the file its lease replaced (claimed when it was taken) and its own earlier
    /// files —, so that util-linux flock(1) that opened one of them before the rename waits for
    /// us (PROTOCOL.md §4). A process that outlives us (the binary's guardian) keeps them and, if
    /// we die before our release served their waiters, serves them itself with
    /// [`serve_blocked`] before it lets go. Empty where there are none (NFS, shared leases,
    /// etcd, S3, a lock taken when LOCK did not exist, or whose file nobody else had open
    /// once ours replaced it: see [`drop_unreachable`]).
    ///
    /// ```
    /// # fn main() -> Result<(), leasehold::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("job.lock");
    /// leasehold::LeaseBuilder::new(&path).try_acquire()?.release()?;
    /// let guard = leasehold::LeaseBuilder::new(&path).try_acquire()?;
    /// let old = guard.old_file_descriptors(); // empty: nobody else had the released file open
    /// guard.release()?;
    /// drop(old);
    /// # Ok(())
    /// # }
    /// ```
    pub fn old_file_descriptors(&self) -> Vec<std::os::fd::OwnedFd> {
        self.inner.holding.old_locks()
    }

    /// How the holding before this one ended, as this lease recorded it when it was taken
    /// (`None`: the lock was never held, or was emptied). See [`crate::LastEnding`].
    pub fn previous(&self) -> Option<crate::ending::LastEnding> {
        lock(&self.inner.record).lease.history.last.clone()
    }

    /// When a command last started under this lock before this holding (RFC 3339, the
    /// starter's wall clock), for `--once-per`.
    pub fn last_start(&self) -> Option<String> {
        lock(&self.inner.record).lease.history.last_start.clone()
    }

    /// Releases the lease without an ending of its own: the command was not started on purpose
    /// (`--after-crash fail`, `--once-per`, a failed `--recover`), so the ending before it and
    /// the last start stay the lock's last (`why` is recorded after [`crate::SKIPPED`]).
    pub fn release_skipped(self, why: &str) -> Result<()> {
        self.release_with(&format!("{}{why}", crate::ending::SKIPPED))
    }

    /// Releases the lease, recording `how` the job ended (e.g. `exit 0`). Writes a released record
    /// atomically; if that cannot be written (a full disk, a mutex some stopped process sits on),
    /// marks our record released in place instead, which releases it just the same (only `how`
    /// is not recorded). Errs only when neither could be done: contenders then judge the lock by
    /// its holder's death or its TTL. Does nothing to a LOCK that is no longer ours.
    pub fn release_with(mut self, how: &str) -> Result<()> {
        self.finish(how)
    }

    /// Releases the lease (`how` = `released`).
    pub fn release(self) -> Result<()> {
        self.release_with("released")
    }

    fn finish(&mut self, how: &str) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let inner = &self.inner;
        // Holding our record keeps a renewal from starting until `stop` is set (a renewal
        // checks it after taking the record).
        let rec = lock(&inner.record);
        inner.holding.release(Release {
            mine: &rec.lease,
            bytes: &rec.bytes,
            how,
            clock: inner.clock.as_ref(),
            wait: inner.timing.release_mutex_wait(),
            stuck_after: inner.timing.ttl,
            stop: &mut || stop_threads(inner),
            lost: inner.lost.load(Ordering::Acquire),
            on_serve: inner.on_serve.as_deref(),
        })
    }
}

/// Takes a guard off the keeper: no renewal starts after this, and one in progress finishes
/// before our record lock can be had.
fn stop_threads<H: Holding>(inner: &Arc<Inner<H>>) {
    let mut c = lock(&inner.control);
    c.stop = true;
    let waiting = c.waiting > 0;
    drop(c);
    if waiting {
        inner.cond.notify_all();
    }
    keeper::forget(&(Arc::clone(inner) as Arc<dyn Kept>));
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let _ = self.finish("released (guard dropped)");
    }
}

impl<H: Holding> Inner<H> {
    fn set_lost(&self, reason: LossReason) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        *lock(&self.loss) = Some(reason.clone());
        // Take the control lock so a waiter between its check and its wait cannot miss this.
        drop(lock(&self.control));
        self.cond.notify_all();
        if let Some(cb) = &self.on_lost {
            cb(&reason);
        }
    }

    /// One renewal: our record with its heartbeat moved, written by the store if the lease is
    /// still ours. `Err(Some(reason))` is fatal; `Err(None)` is transient (retry).
    fn renew_once(&self) -> std::result::Result<(), Option<LossReason>> {
        let mut rec = lock(&self.record);
        if lock(&self.control).stop {
            return Ok(()); // released meanwhile: never touch LOCK again
        }
        let seq = rec.lease.heartbeat_seq.saturating_add(1);
        let at = format_rfc3339(self.clock.wall());
        let mut bytes = rec.bytes.clone();
        if Lease::rewrite_header(&mut bytes, LeaseState::Held, seq, &at).is_none() {
            return Err(Some(LossReason::Vanished {
                what: "internal: our record is shorter than its header".into(),
            }));
        }
        match self.holding.renew(&self.lease_id, &bytes) {
            Ok(()) => {}
            Err(Renewal::Lost(reason)) => return Err(Some(reason)),
            Err(Renewal::Transient(e)) => {
                lock(&self.control).last_error = Some(e.to_string());
                return Err(None);
            }
        }
        rec.lease.heartbeat_seq = seq;
        rec.lease.heartbeat_at = at;
        rec.bytes = bytes;
        Ok(())
    }
}

impl<H: Holding> Kept for Inner<H> {
    fn done(&self) -> bool {
        self.lost.load(Ordering::Acquire) || lock(&self.control).stop
    }

    fn next_renew(&self) -> BootInstant {
        lock(&self.control).next_renew
    }

    fn live_deadline(&self) -> Option<BootInstant> {
        if self.lost.load(Ordering::Acquire) {
            return None;
        }
        let c = lock(&self.control);
        (!c.stop).then_some(c.deadline)
    }

    /// Renews, then schedules the next renewal. A renewal counts only if it completed before
    /// the deadline; the new deadline then counts from its start.
    fn renew_turn(&self) -> bool {
        let t = self.timing;
        let started = BootInstant::now();
        {
            // A renewal looks at the record too.
            let mut c = lock(&self.control);
            c.last_look = started;
            c.check_at = None;
        }
        match self.renew_once() {
            Ok(()) => {
                let done = BootInstant::now();
                let mut c = lock(&self.control);
                let counted = done < c.deadline && !self.lost.load(Ordering::Acquire);
                if counted {
                    c.deadline = started + t.renew_window();
                    c.last_error = None;
                }
                c.next_renew = started + t.heartbeat;
                counted
            }
            Err(Some(reason)) => {
                self.set_lost(reason);
                false
            }
            Err(None) => {
                lock(&self.control).next_renew = BootInstant::now() + t.renew_retry();
                false
            }
        }
    }

    fn watched(&self) -> Option<(PathBuf, std::ffi::OsString)> {
        self.holding.watched()
    }

    fn check_at(&self) -> Option<BootInstant> {
        let c = lock(&self.control);
        c.check_at
            .filter(|_| !c.stop && !self.lost.load(Ordering::Acquire))
    }

    fn request_check(&self) {
        let mut c = lock(&self.control);
        if c.check_at.is_none() && !c.stop {
            c.check_at = Some(BootInstant::now().max(c.last_look + CHECK_GAP));
        }
    }

    /// The look: with our record locked (as a renewal), so that a release, which marks the
    /// record released itself, never races it.
    fn check_turn(&self) {
        let _rec = lock(&self.record);
        {
            let mut c = lock(&self.control);
            c.check_at = None;
            if c.stop {
                return;
            }
            c.last_look = BootInstant::now();
        }
        if let Err(Renewal::Lost(reason)) = self.holding.check(&self.lease_id) {
            self.set_lost(reason);
        }
    }

    fn expire(&self) {
        let last_error = lock(&self.control).last_error.clone();
        self.set_lost(LossReason::RenewTimeout { last_error });
    }
}

/// Lets programs blocked on the flock held through `files` (descriptors from
/// [`LeaseGuard::old_file_descriptors`]) have it, one after the other, waiting while each runs:
/// what a holder's release does before it becomes visible, for a process that kept those
/// descriptors past a holder that died (the binary's guardian). Files whose flock these
/// descriptors do not hold are left alone; nothing blocked, nothing waited for. `tell` hears
/// of each program before it runs ([`Served`](crate::Served); `lock` is LOCK, for it to name).
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("job.lock");
/// leasehold::LeaseBuilder::new(&path).try_acquire()?.release()?;
/// let guard = leasehold::LeaseBuilder::new(&path).try_acquire()?;
/// let old: Vec<std::fs::File> = guard.old_file_descriptors().into_iter().map(Into::into).collect();
/// leasehold::serve_blocked(&path, &old, |s| eprintln!("serving {}", s.who())); // nobody: at once
/// guard.release()?;
/// # Ok(())
/// # }
/// ```
pub fn serve_blocked(
    lock: &std::path::Path,
    files: &[std::fs::File],
    tell: impl Fn(&crate::Served) + Send + Sync,
) {
    crate::handover::serve_old_waiters(files, lock, Some(&tell));
}

/// Closes the files among `files` (descriptors from [`LeaseGuard::old_file_descriptors`]) that
/// nobody can ever lock again: nameless, and open through no other open file description (a
/// duplicate shares the holder's). Kept open, they would only stop the file system from being
/// remounted read-only (the kernel refuses while an unlinked file is open). What a holder does
/// at each renewal, for a process that keeps those descriptors for the length of the holding
/// (the binary's guardian). On file systems without leases (NFS) nothing is closed.
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("job.lock");
/// leasehold::LeaseBuilder::new(&path).try_acquire()?.release()?;
/// let guard = leasehold::LeaseBuilder::new(&path).try_acquire()?;
/// let mut old: Vec<std::fs::File> = guard.old_file_descriptors().into_iter().map(Into::into).collect();
/// leasehold::drop_unreachable(&mut old);
/// assert!(old.is_empty(), "the released record's file: nameless, and nobody else has it open");
/// guard.release()?;
/// # Ok(())
/// # }
/// ```
pub fn drop_unreachable(files: &mut Vec<std::fs::File>) {
    files.retain(crate::klock::still_reachable);
}
