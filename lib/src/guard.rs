//! Holding a lease: the guard, its loss, and its release.
//!
//! Owns: the [`LeaseGuard`] (token, lease id, timing, loss: `is_lost`, `wait_lost`, `on_lost`),
//! one renewal of it (in place, after checking LOCK still holds our lease) and when a renewal
//! counts, recording the wrapped command in the lease, the release (in place to a waiting head
//! through `handover.rs`, otherwise a full released record under the mutex, or at worst our
//! header flipped to released in place), the one check "is LOCK still our lease?"
//! ([`ours`]), and the holder's mark (an `O_PATH` descriptor on the lock's mutex file, kept
//! exactly while the lease is held: the kernel's word that this process holds this lock). The
//! threads that renew and watch live in `keeper.rs`; the timing rules in `timing.rs`.
//! Must never: extend the deadline on a renewal that completed after it; count a renewal whose
//! lease was not ours or was revoked; write LOCK after finding it is not ours; make a revoked
//! record held again.

use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard as StdGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::clock::{Clock, format_rfc3339};
use crate::error::{Error, Result};
use crate::fsinfo::Storage;
use crate::fsio::{self, LockContent};
use crate::handover;
use crate::keeper::{self, Kept};
use crate::mutex::{self, MutexFile, StuckPolicy};
use crate::paths::LockPaths;
use crate::record::{Ending, Lease, LeaseState, MUTABLE_RANGE};
use crate::timing::Timing;
use crate::verdict::Verdict;

/// Why a guard was lost. Once lost, a guard stays lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// LOCK now holds someone else's lease (it was broken and taken, or replaced).
    Taken {
        /// Who holds it now, or what LOCK holds.
        by: String,
    },
    /// LOCK no longer leads to our lease: missing, not a lease, or the storage went away.
    Vanished {
        /// What we found.
        what: String,
    },
    /// No renewal succeeded before the renew deadline.
    RenewTimeout {
        /// The last error seen while renewing, if any.
        last_error: Option<String>,
    },
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Taken { by } => write!(f, "lease taken: LOCK now {by}"),
            LossReason::Vanished { what } => write!(f, "lease vanished: {what}"),
            LossReason::RenewTimeout {
                last_error: Some(e),
            } => {
                write!(f, "could not renew the lease before its deadline: {e}")
            }
            LossReason::RenewTimeout { last_error: None } => {
                write!(f, "could not renew the lease before its deadline")
            }
        }
    }
}

/// The `on_lost` callback.
pub(crate) type LostCallback = Arc<dyn Fn(&LossReason) + Send + Sync>;

/// Everything a new guard starts from.
pub(crate) struct Start {
    pub paths: LockPaths,
    pub timing: Timing,
    pub clock: Arc<dyn Clock>,
    pub lease: Lease,
    pub bytes: Vec<u8>,
    /// When the acquiring write began: the first renew deadline counts from here.
    pub started: Instant,
    pub on_lost: Option<LostCallback>,
    pub broke: Option<Verdict>,
    /// The mutex file the acquisition locked (now unlocked), kept as the witness.
    pub witness: Option<MutexFile>,
    /// Our lease's file, as renamed into place.
    pub written: Option<fsio::Written>,
    /// LOCK's storage: on a local file system the kernel's view of the file is the truth at
    /// once (no attribute or data cache between hosts), so release may check and mark our lease
    /// through the file we keep open.
    pub storage: Storage,
    /// Whether writes are fsynced.
    pub sync: bool,
    /// The file our lease replaced, still open (see `fsio::read_lock_keep`); closed at release.
    pub replaced: Option<std::fs::File>,
    /// The holder's mark (see [`holder_mark`]), opened before our lease became visible; opened
    /// by `start` when not given.
    pub mark: Option<OwnedFd>,
}

/// The holder's mark: an `O_PATH` descriptor on the lock's mutex file, kept for exactly as
/// long as this process holds the lease (closed on exec, and after release has written our
/// released record). Nobody else opens the mutex file `O_PATH` — waiters keep it open for
/// reading, never so — so the kernel's /proc/PID/fd and fdinfo then say that this process is a
/// holder of this very lock (see `process::JobEvidence`). Opened with `O_NOFOLLOW` (a
/// symbolic link planted at the name gives a descriptor on the link, which no judge takes for
/// the mutex file: they compare with a regular file's device and inode); `None` if it cannot
/// be opened (this holder is then judged by its heartbeat and its command only). Opened under
/// the mutex, before our lease is visible, so no judge ever sees our lease without our mark.
pub(crate) fn holder_mark(paths: &LockPaths) -> Option<OwnedFd> {
    paths.handle().open_path(paths.mutex_name()).ok()
}

struct Record {
    lease: Lease,
    bytes: Vec<u8>,
}

impl Record {
    /// Our record with its header flipped to released at `at` (heartbeat sequence + 1): what a
    /// release writes in place, at [`MUTABLE_RANGE`].
    fn released_header(&self, at: &str) -> Option<Vec<u8>> {
        let mut bytes = self.bytes.clone();
        let seq = self.lease.heartbeat_seq.saturating_add(1);
        Lease::rewrite_header(&mut bytes, LeaseState::Released, seq, at)?;
        Some(bytes)
    }
}

struct Control {
    deadline: Instant,
    /// When the keeper should next renew this guard.
    next_renew: Instant,
    stop: bool,
    /// Threads inside `wait_lost` (notified only when there are any).
    waiting: usize,
    last_error: Option<String>,
}

struct Inner {
    paths: LockPaths,
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
    /// The lock's mutex file, kept open (not locked) while we hold the lease: the kernel's
    /// evidence, in /proc/PID/fd, that this process is a holder of this lock (see
    /// `process::JobEvidence`). Closed on exec, so commands do not inherit it; locked through at
    /// release, then closed.
    witness: Mutex<Option<MutexFile>>,
    /// Our lease's file as last renamed into place (see [`Start::written`]).
    written: Mutex<Option<fsio::Written>>,
    storage: Storage,
    sync: bool,
    replaced: Mutex<Option<std::fs::File>>,
    /// The holder's mark (see [`holder_mark`]): closed only after release has written LOCK.
    mark: Mutex<Option<OwnedFd>>,
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
    inner: Arc<Inner>,
    broke: Option<Verdict>,
    done: bool,
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("path", &self.inner.paths.lock)
            .field("lease_id", &self.lease_id())
            .field("token", &self.token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LeaseGuard {
    pub(crate) fn start(s: Start) -> Result<LeaseGuard> {
        let Start {
            paths,
            timing,
            clock,
            lease,
            bytes,
            started,
            on_lost,
            broke,
            witness,
            written,
            storage,
            sync,
            replaced,
            mark,
        } = s;
        let witness = witness.or_else(|| MutexFile::open(&paths, storage.network).ok());
        let mark = mark.or_else(|| holder_mark(&paths));
        let inner = Arc::new(Inner {
            lease_id: lease.lease_id.clone(),
            paths,
            timing,
            clock,
            record: Mutex::new(Record { lease, bytes }),
            control: Mutex::new(Control {
                deadline: started + timing.renew_window(),
                next_renew: started + timing.heartbeat,
                stop: false,
                waiting: 0,
                last_error: None,
            }),
            cond: Condvar::new(),
            lost: AtomicBool::new(false),
            loss: Mutex::new(None),
            on_lost,
            witness: Mutex::new(witness),
            written: Mutex::new(written),
            storage,
            sync,
            replaced: Mutex::new(replaced),
            mark: Mutex::new(mark),
        });
        let renew_at = lock(&inner.control).next_renew;
        keeper::keep(Arc::clone(&inner) as Arc<dyn Kept>, renew_at)
            .map_err(|e| Error::io(&inner.paths.lock, "start the renewal threads", e))?;
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

    /// The random id of this holding (32 hex digits), for `leasehold break --lease-id`.
    pub fn lease_id(&self) -> String {
        self.inner.lease_id.clone()
    }

    /// Whether LOCK still holds our lease, held (see [`ours`]): a fresh read, without the
    /// lease mutex and without our record's lock. Unreadable storage counts as "yes" (the
    /// guard's own deadline decides then).
    pub fn still_ours(&self) -> bool {
        match fsio::read_lock(&self.inner.paths) {
            Ok(c) => ours(&c, &self.inner.lease_id) == Ours::Held,
            Err(_) => true,
        }
    }

    /// The absolute LOCK path.
    pub fn path(&self) -> &std::path::Path {
        &self.inner.paths.lock
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
        // The mutex first, then our record: a renewal (record only) is never held up by the wait.
        let m = mutex::lock(
            &inner.paths,
            Some(Instant::now() + inner.timing.ttl * 2),
            inner.timing.ttl,
            StuckPolicy::KillStopped,
        )?;
        let mut rec = lock(&inner.record);
        let mut lease = rec.lease.clone();
        lease.holder.child_pid = Some(pid);
        lease.holder.child_start = Some(start);
        lease.holder.pgid = Some(pgid);
        // Never over a revoked record: that would make a broken lease held again.
        ensure_ours(&inner.paths, &rec.lease, false)?;
        let bytes = lease.to_bytes();
        let w = fsio::replace_keep(&inner.paths, &inner.paths.lock, &bytes, false)?;
        *lock(&inner.written) = Some(w);
        drop(m);
        *rec = Record { lease, bytes };
        Ok(())
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
        // Holding our record keeps a renewal from starting until `stop` is set below (a renewal
        // checks it after taking the record).
        let rec = lock(&inner.record);
        let witness = lock(&inner.witness).take();
        let written = lock(&inner.written).take();
        // Closed when this returns, after the handover: freeing old files is off its path.
        let replaced = lock(&inner.replaced).take();
        // Our holder's mark goes only once LOCK no longer says we hold it.
        let mark = lock(&inner.mark).take();
        // On a local file system, with someone waiting: mark our file released in place (no
        // mutex: the file is the one we renamed into place, which only we change in place, and
        // a breaker replaces the whole file). Its inotify event wakes the head waiter at once.
        let handed = match (written, inner.storage.network) {
            (Some(w), false) => handover::release_in_place(&inner.paths, &rec.bytes, w),
            _ => None,
        };
        stop_threads(inner);
        if let Some(f) = handed {
            return handover::settle(&inner.paths, f, inner.sync, replaced, mark);
        }
        let full = inner.write_released(&rec, how, witness);
        match full {
            Ok(()) | Err(Error::Lost { .. }) => Ok(()),
            Err(e) => inner.release_in_header(&rec, e),
        }
    }
}

impl Inner {
    /// The full released record (state `released`, how the job ended), written atomically
    /// under the mutex, if LOCK still holds our lease (held or revoked).
    fn write_released(&self, rec: &Record, how: &str, witness: Option<MutexFile>) -> Result<()> {
        let mut released = rec.lease.clone();
        released.state = LeaseState::Released;
        released.ended = Some(Ending {
            at: format_rfc3339(self.clock.wall()),
            how: how.to_string(),
            by: None,
        });
        let _m = mutex::lock_with(
            witness,
            &self.paths,
            Some(Instant::now() + self.timing.release_mutex_wait()),
            self.timing.ttl,
            StuckPolicy::Report,
            None,
            self.storage.network,
        )?;
        ensure_ours(&self.paths, &rec.lease, true)?;
        let bytes = released.to_bytes();
        fsio::replace_keep(&self.paths, &self.paths.lock, &bytes, self.sync).map(|_| ())
    }

    /// When the full released record could not be written (`e`: a full disk, a mutex someone
    /// sits on): leaves a lease every contender judges free at once, by flipping our header to
    /// released in place. Only how the job ended is then not recorded, which is not worth
    /// failing a release for. Errs only when even that fails.
    fn release_in_header(&self, rec: &Record, e: Error) -> Result<()> {
        let marked = rec
            .released_header(&format_rfc3339(self.clock.wall()))
            .is_some_and(|b| mark_in_place(&self.paths, &rec.lease, &b[MUTABLE_RANGE]));
        if marked {
            return Ok(());
        }
        let what = "could not mark it released in place either; contenders will judge it by its holder's death or its TTL";
        Err(Error::Io {
            path: self.paths.lock.clone(),
            op: "write the released record",
            source: std::io::Error::new(
                match &e {
                    Error::Io { source, .. } => source.kind(),
                    _ => std::io::ErrorKind::Other,
                },
                format!("{e}; {what}"),
            ),
        })
    }
}

/// Takes a guard off the keeper: no renewal starts after this, and one in progress finishes
/// before our record lock can be had.
fn stop_threads(inner: &Arc<Inner>) {
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

/// What LOCK holds, as far as our lease is concerned: the one answer to "is LOCK still our
/// lease?", for renewals, releases, `set_child` and the wrapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ours {
    /// Our lease, held.
    Held,
    /// Our lease, revoked by an operator; by whom, if recorded.
    Revoked(Option<String>),
    /// Our lease, released (broken, or by the released bit).
    Released,
    /// Someone else's lease: who, and its token.
    Taken(String, u64),
    /// An empty LOCK (freed by hand).
    Empty,
    /// No LOCK at all.
    Missing,
}

/// Whether `content` (what LOCK holds) is our lease `lease_id`, and in what state.
pub(crate) fn ours(content: &LockContent, lease_id: &str) -> Ours {
    match content {
        LockContent::Lease(l, _) if l.lease_id == lease_id => match l.state {
            LeaseState::Held => Ours::Held,
            LeaseState::Revoked => Ours::Revoked(l.ended.as_ref().and_then(|e| e.by.clone())),
            LeaseState::Released => Ours::Released,
        },
        LockContent::Lease(l, _) => Ours::Taken(l.holder.describe(), l.token),
        LockContent::Empty => Ours::Empty,
        LockContent::Missing => Ours::Missing,
    }
}

/// Errors with `Error::Lost` unless LOCK holds our lease, still held (or, with `revoked_ok`, for
/// a release, revoked).
fn ensure_ours(paths: &LockPaths, mine: &Lease, revoked_ok: bool) -> Result<()> {
    let why = match ours(&fsio::read_lock(paths)?, &mine.lease_id) {
        Ours::Held => return Ok(()),
        // Revoked is still ours to release: a holder releases when its job is over, and a
        // released record frees the lock at once instead of after its processes are gone (or,
        // on other hosts, after a TTL).
        Ours::Revoked(_) if revoked_ok => return Ok(()),
        Ours::Revoked(_) => "it was revoked".to_string(),
        Ours::Released => "it was released or broken".into(),
        Ours::Taken(by, _) => format!("held by {by}"),
        Ours::Empty => "LOCK is empty".into(),
        Ours::Missing => "LOCK is missing".into(),
    };
    Err(Error::Lost {
        path: paths.lock.clone(),
        lease_id: mine.lease_id.clone(),
        why,
    })
}

/// Writes the header `region` over LOCK in place if it still holds our lease (in any state).
fn mark_in_place(paths: &LockPaths, mine: &Lease, region: &[u8]) -> bool {
    let Ok(Some((f, mode))) = fsio::open_lock(paths, true) else {
        return false;
    };
    match fsio::read_open(&f, &paths.lock, mode).map(|c| ours(&c, &mine.lease_id)) {
        Ok(Ours::Held | Ours::Revoked(_) | Ours::Released) => {}
        _ => return false,
    }
    fsio::write_header(&f, &paths.lock, region).is_ok() && f.sync_data().is_ok()
}

impl Inner {
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

    /// One renewal. `Err(Some(reason))` is fatal; `Err(None)` is transient (retry).
    fn renew_once(&self) -> std::result::Result<(), Option<LossReason>> {
        let mut rec = lock(&self.record);
        if lock(&self.control).stop {
            return Ok(()); // released meanwhile: never touch LOCK again
        }
        let path = &self.paths.lock;
        let (file, mode) = self.open_for_renewal()?;
        let vanished = |what: String| Err(Some(LossReason::Vanished { what }));
        let taken = |by: String| Err(Some(LossReason::Taken { by }));
        match fsio::read_open(&file, path, mode).map(|c| ours(&c, &self.lease_id)) {
            Ok(Ours::Held) => {}
            Ok(Ours::Revoked(by)) => {
                let by = by.map(|b| format!(" by {b}")).unwrap_or_default();
                return taken(format!("holds our lease revoked{by}"));
            }
            Ok(Ours::Released) => return taken("holds our lease marked released (broken)".into()),
            Ok(Ours::Taken(by, token)) => return taken(format!("held by {by} (token {token})")),
            Ok(Ours::Empty) => return vanished("LOCK is empty".into()),
            // read_open never reports Missing for an open file; vanished all the same.
            Ok(Ours::Missing) => return vanished("LOCK is missing".into()),
            Err(e @ Error::NotALease { .. }) => return vanished(e.to_string()),
            Err(e) => return self.transient(e),
        }
        let seq = rec.lease.heartbeat_seq.saturating_add(1);
        let at = format_rfc3339(self.clock.wall());
        let mut bytes = rec.bytes.clone();
        let Some(region) = Lease::rewrite_header(&mut bytes, LeaseState::Held, seq, &at) else {
            return vanished("internal: our record is shorter than its header".into());
        };
        if let Err(e) = fsio::write_header(&file, path, region) {
            return self.transient(e);
        }
        // Closing flushes the write to an NFS server (close-to-open); only then does it count.
        drop(file);
        rec.lease.heartbeat_seq = seq;
        rec.lease.heartbeat_at = at;
        rec.bytes = bytes;
        Ok(())
    }

    /// Opens LOCK afresh, read-write, for a renewal, and checks that LOCK's directory is still
    /// the one everyone else reaches by its path.
    fn open_for_renewal(&self) -> std::result::Result<(std::fs::File, u32), Option<LossReason>> {
        let vanished = |what: String| Err(Some(LossReason::Vanished { what }));
        let (file, mode) = match fsio::open_lock(&self.paths, true) {
            Ok(Some(f)) => f,
            Ok(None) => {
                return vanished(format!("{} no longer exists", self.paths.lock.display()));
            }
            Err(
                e @ (Error::NotALease { .. }
                | Error::NewerFormat { .. }
                | Error::Squatted { .. }
                | Error::Untrusted { .. }),
            ) => return vanished(e.to_string()),
            Err(e) => return self.transient(e),
        };
        // Everyone else reaches LOCK through its directory's path: if that path no longer leads
        // to the directory we renew in, no contender sees our heartbeat any more.
        match self.paths.dir_moved() {
            Ok(false) => Ok((file, mode)),
            Ok(true) => vanished(format!(
                "{} no longer leads to the directory the lease was taken in \
                 (unmounted, moved or replaced)",
                self.paths.dir.display()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                vanished(format!("{} no longer exists", self.paths.dir.display()))
            }
            Err(e) => self.transient(Error::io(&self.paths.dir, "stat", e)),
        }
    }

    fn transient<T>(&self, e: Error) -> std::result::Result<T, Option<LossReason>> {
        lock(&self.control).last_error = Some(e.to_string());
        Err(None)
    }
}

impl Kept for Inner {
    fn done(&self) -> bool {
        self.lost.load(Ordering::Acquire) || lock(&self.control).stop
    }

    fn next_renew(&self) -> Instant {
        lock(&self.control).next_renew
    }

    fn live_deadline(&self) -> Option<Instant> {
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
        let started = Instant::now();
        match self.renew_once() {
            Ok(()) => {
                let done = Instant::now();
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
                lock(&self.control).next_renew = Instant::now() + t.renew_retry();
                false
            }
        }
    }

    fn expire(&self) {
        let last_error = lock(&self.control).last_error.clone();
        self.set_lost(LossReason::RenewTimeout { last_error });
    }
}
