//! Holding a lease: the heartbeat, the renew deadline, loss, and release.
//!
//! Owns: the keeper — two threads per process, started on first use and shared by every guard:
//! the renewer (in-place heartbeat of each guard every interval, checking the lease is still
//! ours) and the watchdog (declares a guard lost when no renewal has succeeded by its deadline;
//! it never does I/O, so a renewal stuck in I/O cannot hold it up, and sleeps on a timerfd that
//! renewals move, so it wakes only when a deadline is really reached) — loss notification,
//! recording the wrapped command in the lease, release, and the holder's mark (an `O_PATH`
//! descriptor on the lock's mutex file, kept exactly while the lease is held: the kernel's word
//! that this process holds this lock).
//! Must never: extend the deadline on a renewal that completed after it; count a renewal whose
//! lease was not ours or was revoked; write LOCK after finding it is not ours; make a revoked
//! record held again.

use std::fmt;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard as StdGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{
    ClockId as TimerClock, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags,
};

use crate::clock::{Clock, format_rfc3339};
use crate::error::{Error, Result};
use crate::fsio::{self, LockContent};
use crate::grave;
use crate::mutex::{self, MutexFile, StuckPolicy};
use crate::paths::LockPaths;
use crate::record::{Ending, Lease, LeaseState, MUTABLE_RANGE};
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

/// Timing of a guard, validated: `heartbeat + grace + margin < ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Time-to-live: how long without a visible heartbeat before others may presume us dead.
    pub ttl: Duration,
    /// Renewal interval.
    pub heartbeat: Duration,
    /// Time between SIGTERM and SIGKILL when fencing a command.
    pub grace: Duration,
    /// Safety margin kept between our own fencing and the earliest takeover.
    pub margin: Duration,
}

impl Timing {
    /// Fills in defaults (heartbeat TTL/3, grace min(5s, TTL/4), margin max(20ms, TTL/20)) and
    /// checks that explicit values fit. The error names the setting to change.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::Timing;
    /// let t = Timing::new(Duration::from_secs(30), None, None).unwrap();
    /// assert_eq!(t.heartbeat, Duration::from_secs(10));
    /// assert!(Timing::new(Duration::from_secs(1), Some(Duration::from_secs(1)), None).is_err());
    /// ```
    pub fn new(
        ttl: Duration,
        heartbeat: Option<Duration>,
        grace: Option<Duration>,
    ) -> Result<Timing> {
        if ttl.is_zero() {
            return Err(Error::Settings("--ttl must be greater than zero".into()));
        }
        let margin = (ttl / 20).max(Duration::from_millis(20));
        let hb = heartbeat.unwrap_or(ttl / 3);
        let grace_v = grace.unwrap_or((ttl / 4).min(Duration::from_secs(5)));
        if hb.is_zero() {
            return Err(Error::Settings(
                "--heartbeat must be greater than zero".into(),
            ));
        }
        if hb + grace_v + margin >= ttl {
            let flag = match (heartbeat.is_some(), grace.is_some()) {
                (true, false) => "--heartbeat",
                (false, true) => "--grace",
                (true, true) => "--heartbeat and --grace",
                (false, false) => "--ttl",
            };
            return Err(Error::Settings(format!(
                "{flag}: heartbeat {hb:?} + grace {grace_v:?} + safety margin {margin:?} must be less than the TTL {ttl:?}; shorten {flag} or lengthen --ttl"
            )));
        }
        Ok(Timing {
            ttl,
            heartbeat: hb,
            grace: grace_v,
            margin,
        })
    }

    /// How long after the start of a successful renewal the guard is lost without another.
    pub fn renew_window(&self) -> Duration {
        self.ttl - self.grace - self.margin
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
    /// Whether LOCK is on a local file system, where the kernel's view of the file is the truth
    /// at once (no attribute or data cache between hosts): release may then check and mark our
    /// lease through the file we keep open.
    pub local: bool,
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
    local: bool,
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
            local,
            sync,
            replaced,
            mark,
        } = s;
        let witness = witness.or_else(|| MutexFile::open(&paths, !local).ok());
        let mark = mark.or_else(|| holder_mark(&paths));
        let inner = Arc::new(Inner {
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
            local,
            sync,
            replaced: Mutex::new(replaced),
            mark: Mutex::new(mark),
        });
        let k =
            keeper().map_err(|e| Error::io(&inner.paths.lock, "start the renewal threads", e))?;
        let renew_at = lock(&inner.control).next_renew;
        let mut st = lock(&k.state);
        st.guards.push(Arc::clone(&inner));
        k.arm(&mut st, true);
        // Wake the renewer only if it sleeps past this guard's first renewal; in steady state
        // (one guard after another) it is not woken.
        let wake_renewer = st.renewer.later_than(renew_at);
        drop(st);
        if wake_renewer {
            k.renew.notify_all();
        }
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
        lock(&self.inner.record).lease.lease_id.clone()
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
        let _replaced = lock(&inner.replaced).take();
        // Our holder's mark goes only once LOCK no longer says we hold it.
        let mark = lock(&inner.mark).take();
        // On a local file system, with someone waiting: mark our file released in place (no
        // mutex: the file is the one we renamed into place, which only we change in place, and
        // a breaker replaces the whole file). Its inotify event wakes the head waiter at once.
        let handed = match (written, inner.local) {
            (Some(w), true) => hand_over(&inner.paths, &rec, w),
            _ => None,
        };
        stop_threads(inner);
        if let Some(f) = handed {
            // The waiter replaces the record straight away, so a full released record saying
            // how the job ended would be read by nobody.
            if inner.sync {
                f.sync_all()
                    .map_err(|e| Error::io(&inner.paths.lock, "fsync the released mark", e))?;
            }
            // Both read-only, neither locked by us: closed later, off the waiter's way.
            grave::bury(
                [f.into(), _replaced]
                    .into_iter()
                    .flatten()
                    .map(OwnedFd::from)
                    .chain(mark),
            );
            return Ok(());
        }
        let ended_at = format_rfc3339(inner.clock.wall());
        let mut released = rec.lease.clone();
        released.state = LeaseState::Released;
        released.ended = Some(Ending {
            at: ended_at,
            how: how.to_string(),
            by: None,
        });
        let wait = inner.timing.ttl.min(Duration::from_secs(5));
        let full = (|| {
            let _m = mutex::lock_with(
                witness,
                &inner.paths,
                Some(Instant::now() + wait),
                inner.timing.ttl,
                StuckPolicy::Report,
                None,
                !inner.local,
            )?;
            ensure_ours(&inner.paths, &rec.lease, true)?;
            fsio::replace_keep(
                &inner.paths,
                &inner.paths.lock,
                &released.to_bytes(),
                inner.sync,
            )
            .map(|_| ())
        })();
        match full {
            Ok(()) => Ok(()),
            Err(Error::Lost { .. }) => Ok(()),
            Err(e) => {
                // Leave a lease every contender judges free at once: flip our header in place.
                let marked = rec
                    .released_header(&format_rfc3339(inner.clock.wall()))
                    .is_some_and(|b| mark_in_place(&inner.paths, &rec.lease, &b[MUTABLE_RANGE]));
                if marked {
                    // Released: every contender judges it free. Only how the job ended (the
                    // full record) could not be written: a full disk, or a mutex someone sits
                    // on. That is not worth failing a release for.
                    return Ok(());
                }
                let what = "could not mark it released in place either; contenders will judge it by its holder's death or its TTL";
                Err(Error::Io {
                    path: inner.paths.lock.clone(),
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
    }
}

/// Takes a guard off the keeper: no renewal starts after this, and one in progress finishes
/// before our record lock can be had. The keeper threads are not woken: they find the guard
/// gone when they next wake.
fn stop_threads(inner: &Arc<Inner>) {
    let mut c = lock(&inner.control);
    c.stop = true;
    let waiting = c.waiting > 0;
    drop(c);
    if waiting {
        inner.cond.notify_all();
    }
    if let Ok(k) = keeper() {
        // The alarm is left as it is: it can only be early now, which costs the watchdog
        // one wake-up, and no system call here.
        lock(&k.state).guards.retain(|g| !Arc::ptr_eq(g, inner));
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let _ = self.finish("released (guard dropped)");
    }
}

fn mark_in_place(paths: &LockPaths, mine: &Lease, region: &[u8]) -> bool {
    let Ok(Some((f, mode))) = fsio::open_lock(paths, true) else {
        return false;
    };
    match fsio::read_open(&f, &paths.lock, mode) {
        Ok(LockContent::Lease(l, _)) if l.lease_id == mine.lease_id => {}
        _ => return false,
    }
    fsio::write_header(&f, &paths.lock, region).is_ok() && f.sync_data().is_ok()
}

/// The release of a lease someone waits for. When LOCK is still the file we renamed into place
/// (`w`), a waiter holds a shared flock on it (every queued waiter on a local file system
/// holds one on the LOCK file it last read), and it holds exactly the bytes we last wrote (our
/// lease, held, intact): sets its released bit ([`fsio::RELEASED_BIT`]) through a read-only
/// descriptor and returns the file, still open. `None` otherwise: nobody waits (the caller
/// writes the full released record), or LOCK is not simply ours, or we may not chmod it (the
/// caller goes the long way, which reports what happened). Not made durable here.
fn hand_over(paths: &LockPaths, rec: &Record, w: fsio::Written) -> Option<File> {
    use std::os::unix::fs::FileExt;
    // The file we renamed into place, kept open since; if it is not LOCK any more, nobody
    // reads it by name and marking it released changes nothing.
    let f = match w.kept {
        Some(f) => f,
        None => fsio::open_lock_if(paths, w.id)?,
    };
    match f.try_lock() {
        Err(std::fs::TryLockError::WouldBlock) => {} // a waiter's shared lock
        _ => return None, // nobody waits (our exclusive lock goes with `f`), or no flock here
    }
    // One byte more than expected, to notice a file that grew.
    let mut now = vec![0u8; rec.bytes.len() + 1];
    match f.read_at(&mut now, 0) {
        Ok(n) if now[..n] == rec.bytes[..] => {}
        _ => return None,
    }
    fsio::mark_released(&f, &paths.lock).ok()?;
    Some(f)
}

/// Errors with `Error::Lost` unless LOCK holds our lease, still held (or, with `revoked_ok`, for
/// a release, revoked).
fn ensure_ours(paths: &LockPaths, mine: &Lease, revoked_ok: bool) -> Result<()> {
    let lost = |why: String| Error::Lost {
        path: paths.lock.clone(),
        lease_id: mine.lease_id.clone(),
        why,
    };
    match fsio::read_lock(paths)? {
        // Revoked is still ours to release: a holder releases when its job is over, and a
        // released record frees the lock at once instead of after its processes are gone (or,
        // on other hosts, after a TTL).
        LockContent::Lease(l, _) if l.lease_id == mine.lease_id => match l.state {
            LeaseState::Held => Ok(()),
            LeaseState::Revoked if revoked_ok => Ok(()),
            LeaseState::Revoked => Err(lost("it was revoked".into())),
            LeaseState::Released => Err(lost("it was released or broken".into())),
        },
        LockContent::Lease(l, _) => Err(lost(format!("held by {}", l.holder.describe()))),
        LockContent::Empty => Err(lost("LOCK is empty".into())),
        LockContent::Missing => Err(lost("LOCK is missing".into())),
    }
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
        let (file, mode) = match fsio::open_lock(&self.paths, true) {
            Ok(Some(f)) => f,
            Ok(None) => {
                return Err(Some(LossReason::Vanished {
                    what: format!("{} no longer exists", path.display()),
                }));
            }
            Err(
                e @ (Error::NotALease { .. }
                | Error::NewerFormat { .. }
                | Error::Squatted { .. }
                | Error::Untrusted { .. }),
            ) => {
                return Err(Some(LossReason::Vanished {
                    what: e.to_string(),
                }));
            }
            Err(e) => return self.transient(e),
        };
        // Everyone else reaches LOCK through its directory's path: if that path no longer leads
        // to the directory we renew in, no contender sees our heartbeat any more.
        match self.paths.dir_moved() {
            Ok(false) => {}
            Ok(true) => {
                return Err(Some(LossReason::Vanished {
                    what: format!(
                        "{} no longer leads to the directory the lease was taken in \
                         (unmounted, moved or replaced)",
                        self.paths.dir.display()
                    ),
                }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Some(LossReason::Vanished {
                    what: format!("{} no longer exists", self.paths.dir.display()),
                }));
            }
            Err(e) => return self.transient(Error::io(&self.paths.dir, "stat", e)),
        }
        match fsio::read_open(&file, path, mode) {
            Ok(LockContent::Lease(l, _)) if l.lease_id == rec.lease.lease_id => match l.state {
                LeaseState::Held => {}
                LeaseState::Revoked => {
                    let by = l.ended.as_ref().and_then(|e| e.by.clone());
                    return Err(Some(LossReason::Taken {
                        by: format!(
                            "holds our lease revoked{}",
                            by.map(|b| format!(" by {b}")).unwrap_or_default()
                        ),
                    }));
                }
                LeaseState::Released => {
                    return Err(Some(LossReason::Taken {
                        by: "holds our lease marked released (broken)".into(),
                    }));
                }
            },
            Ok(LockContent::Lease(l, _)) => {
                return Err(Some(LossReason::Taken {
                    by: format!("held by {} (token {})", l.holder.describe(), l.token),
                }));
            }
            Ok(LockContent::Empty) => {
                return Err(Some(LossReason::Vanished {
                    what: "LOCK is empty".into(),
                }));
            }
            Ok(LockContent::Missing) => return unreachable_missing(),
            Err(e @ Error::NotALease { .. }) => {
                return Err(Some(LossReason::Vanished {
                    what: e.to_string(),
                }));
            }
            Err(e) => return self.transient(e),
        }
        let seq = rec.lease.heartbeat_seq.saturating_add(1);
        let at = format_rfc3339(self.clock.wall());
        let mut bytes = rec.bytes.clone();
        let Some(region) = Lease::rewrite_header(&mut bytes, LeaseState::Held, seq, &at) else {
            return Err(Some(LossReason::Vanished {
                what: "internal: our record is shorter than its header".into(),
            }));
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

    fn transient(&self, e: Error) -> std::result::Result<(), Option<LossReason>> {
        lock(&self.control).last_error = Some(e.to_string());
        Err(None)
    }
}

fn unreachable_missing() -> std::result::Result<(), Option<LossReason>> {
    // read_open never reports Missing for an open file; treat it as vanished all the same.
    Err(Some(LossReason::Vanished {
        what: "LOCK is missing".into(),
    }))
}

impl Inner {
    fn done(&self) -> bool {
        self.lost.load(Ordering::Acquire) || lock(&self.control).stop
    }

    /// One renewal turn by the keeper: renew, then schedule the next one.
    fn renew_turn(&self) {
        let t = self.timing;
        let started = Instant::now();
        match self.renew_once() {
            Ok(()) => {
                let done = Instant::now();
                let mut c = lock(&self.control);
                let counted = done < c.deadline && !self.lost.load(Ordering::Acquire);
                if counted {
                    // Counted only if it completed before the deadline.
                    c.deadline = started + t.renew_window();
                    c.last_error = None;
                }
                c.next_renew = started + t.heartbeat;
                drop(c);
                if counted && let Ok(k) = keeper() {
                    // Move the watchdog's alarm to the new deadline: it is not woken.
                    k.arm(&mut lock(&k.state), false);
                }
            }
            Err(Some(reason)) => self.set_lost(reason),
            Err(None) => {
                let retry =
                    (t.heartbeat / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
                lock(&self.control).next_renew = Instant::now() + retry;
            }
        }
    }
}

/// The process-wide keeper: every live guard, and the two threads that serve them.
struct Keeper {
    state: Mutex<KeeperState>,
    renew: Condvar,
    /// The watchdog's alarm, always set (under the state lock) to the earliest deadline of a
    /// live guard: renewals move it without waking the watchdog, which therefore wakes only
    /// when a deadline is really reached.
    alarm: TimerFd,
}

struct KeeperState {
    guards: Vec<Arc<Inner>>,
    renewer: Sleep,
    /// What the alarm is set to (`None`: unset, or unknown).
    armed: Option<Instant>,
}

impl Keeper {
    /// Sets the alarm for the earliest deadline among the live guards of `st` (the state,
    /// locked), or clears it when there is none.
    ///
    /// `lazy` (a new guard): only ever bring the alarm forward. A later alarm than needed costs
    /// at most one early wake-up of the watchdog, which then sets it exactly; not touching it
    /// saves a system call on the way into every lease.
    fn arm(&self, st: &mut KeeperState, lazy: bool) {
        let earliest = st
            .guards
            .iter()
            .filter(|g| !g.lost.load(Ordering::Acquire))
            .filter_map(|g| {
                let c = lock(&g.control);
                (!c.stop).then_some(c.deadline)
            })
            .min();
        let needed = match (lazy, earliest, st.armed) {
            (_, e, armed) if e == armed => false,
            (true, Some(e), Some(armed)) => e < armed,
            (true, None, _) => false,
            _ => true,
        };
        if !needed {
            return;
        }
        let set = match earliest {
            Some(d) => self.alarm.set(
                Expiration::OneShot(monotonic_at(d)),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            ),
            None => self.alarm.unset(),
        };
        // If setting failed, forget what is armed, so that the next call sets it again.
        st.armed = if set.is_ok() { earliest } else { None };
    }
}

/// `at` as an absolute CLOCK_MONOTONIC time (std's `Instant` runs on that clock on Linux, but
/// does not expose it); a time already past maps to now, which fires at once.
fn monotonic_at(at: Instant) -> TimeSpec {
    let now = Instant::now();
    let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| TimeSpec::new(0, 1));
    let ahead = at.saturating_duration_since(now);
    let t = Duration::new(mono.tv_sec().max(0) as u64, mono.tv_nsec().max(0) as u32) + ahead;
    // Never all zero: a zero expiration would disarm the timer instead.
    TimeSpec::from_duration(t.max(Duration::from_nanos(1)))
}

/// What the renewer is doing, so that a new guard wakes it only when it must.
#[derive(Clone, Copy)]
enum Sleep {
    /// Awake: it looks at the guard list again before it sleeps.
    Awake,
    /// Asleep until then.
    Until(Instant),
    /// Asleep until woken.
    Forever,
}

impl Sleep {
    /// Whether a thread in this state would wake up too late for something due at `due`.
    fn later_than(self, due: Instant) -> bool {
        match self {
            Sleep::Awake => false,
            Sleep::Until(t) => t > due,
            Sleep::Forever => true,
        }
    }
}

/// The keeper of this process, its threads started on first use — and again in a forked child,
/// which inherits the keeper's memory but not its threads.
fn keeper() -> std::io::Result<&'static Keeper> {
    static KEEPER: Mutex<Option<(u32, &'static Keeper)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = lock(&KEEPER);
    if let Some((p, k)) = *slot
        && p == pid
    {
        return Ok(k);
    }
    let k: &'static Keeper = Box::leak(Box::new(Keeper {
        state: Mutex::new(KeeperState {
            guards: Vec::new(),
            renewer: Sleep::Awake,
            armed: None,
        }),
        renew: Condvar::new(),
        alarm: TimerFd::new(TimerClock::CLOCK_MONOTONIC, TimerFlags::TFD_CLOEXEC)?,
    }));
    for (name, body) in [
        ("leasehold-renew", renewer as fn(&'static Keeper)),
        ("leasehold-watch", watchdog as fn(&'static Keeper)),
    ] {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(k))?;
    }
    *slot = Some((pid, k));
    Ok(k)
}

/// Renews every guard when it is due. Renewals run one after another: one stuck in I/O delays
/// the others, whose deadlines the watchdog still keeps (they are then lost, never kept).
fn renewer(k: &'static Keeper) {
    loop {
        let due: Vec<Arc<Inner>> = {
            let mut st = lock(&k.state);
            loop {
                st.guards.retain(|g| !g.done());
                let now = Instant::now();
                let next = st.guards.iter().map(|g| lock(&g.control).next_renew).min();
                match next {
                    Some(n) if n <= now => break,
                    Some(n) => {
                        st.renewer = Sleep::Until(n);
                        st = k
                            .renew
                            .wait_timeout(st, n - now)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                    None => {
                        st.renewer = Sleep::Forever;
                        st = k.renew.wait(st).unwrap_or_else(PoisonError::into_inner);
                    }
                }
                st.renewer = Sleep::Awake;
            }
            let now = Instant::now();
            st.guards
                .iter()
                .filter(|g| lock(&g.control).next_renew <= now)
                .cloned()
                .collect()
        };
        for g in due {
            g.renew_turn();
        }
    }
}

/// Declares guards lost at their deadlines. Never does I/O: it sleeps on its alarm (see
/// [`Keeper::alarm`]), and wakes only when the earliest deadline is reached.
fn watchdog(k: &'static Keeper) {
    loop {
        if k.alarm.wait().is_err() {
            // The alarm cannot be read: look every 10 ms instead (never stop watching).
            std::thread::sleep(Duration::from_millis(10));
        }
        let st = lock(&k.state);
        let now = Instant::now();
        let mut expired = Vec::new();
        for g in st.guards.iter() {
            if g.lost.load(Ordering::Acquire) {
                continue;
            }
            let c = lock(&g.control);
            if !c.stop && now >= c.deadline {
                expired.push((Arc::clone(g), c.last_error.clone()));
            }
        }
        drop(st);
        for (g, last_error) in expired {
            g.set_lost(LossReason::RenewTimeout { last_error });
        }
        k.arm(&mut lock(&k.state), false);
    }
}
