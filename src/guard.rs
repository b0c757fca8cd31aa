//! Holding a lease: the heartbeat, the renew deadline, loss, and release.
//!
//! Owns: the renewer thread (in-place heartbeat every interval, checking the lease is still
//! ours), the watchdog thread (declares the guard lost when no renewal has succeeded by the
//! deadline), loss notification, recording the wrapped command in the lease, and release.
//! Must never: extend the deadline on a renewal that completed after it; count a renewal whose
//! lease was not ours; write LOCK after finding it is not ours.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard as StdGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::{Clock, format_rfc3339};
use crate::error::{Error, Result};
use crate::fsio::{self, LockContent};
use crate::mutex::{self, StuckPolicy};
use crate::paths::LockPaths;
use crate::record::{Ending, Lease, LeaseState};
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
}

struct Record {
    lease: Lease,
    bytes: Vec<u8>,
}

struct Control {
    deadline: Instant,
    stop: bool,
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
    /// `process::JobEvidence`). Closed on exec, so commands do not inherit it.
    _witness: Option<std::fs::File>,
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
    threads: Vec<JoinHandle<()>>,
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
        } = s;
        let witness = std::fs::File::open(&paths.mutex).ok();
        let inner = Arc::new(Inner {
            paths,
            timing,
            clock,
            record: Mutex::new(Record { lease, bytes }),
            control: Mutex::new(Control {
                deadline: started + timing.renew_window(),
                stop: false,
                last_error: None,
            }),
            cond: Condvar::new(),
            lost: AtomicBool::new(false),
            loss: Mutex::new(None),
            on_lost,
            _witness: witness,
        });
        let mut threads = Vec::with_capacity(2);
        for (name, body) in [
            ("leasehold-renew", renewer as fn(&Inner)),
            ("leasehold-watch", watchdog as fn(&Inner)),
        ] {
            let i = Arc::clone(&inner);
            let h = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || body(&i))
                .map_err(|e| Error::io(&inner.paths.lock, "start the renewal thread", e))?;
            threads.push(h);
        }
        Ok(LeaseGuard {
            inner,
            threads,
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
            &inner.paths.mutex,
            Some(Instant::now() + inner.timing.ttl * 2),
            inner.timing.ttl,
            StuckPolicy::KillStopped,
        )?;
        let mut rec = lock(&inner.record);
        let mut lease = rec.lease.clone();
        lease.holder.child_pid = Some(pid);
        lease.holder.child_start = Some(start);
        lease.holder.pgid = Some(pgid);
        ensure_ours(&inner.paths, &rec.lease)?;
        let bytes = lease.to_bytes();
        fsio::replace(&inner.paths, &inner.paths.lock, &bytes, false)?;
        drop(m);
        *rec = Record { lease, bytes };
        Ok(())
    }

    /// Releases the lease, recording `how` the job ended (e.g. `exit 0`). Writes a released record
    /// atomically; if that cannot be written (a full disk), marks our record released in place
    /// and returns the error. Does nothing to a LOCK that is no longer ours.
    pub fn release_with(mut self, how: &str) -> Result<()> {
        self.finish(how)
    }

    /// Releases the lease (`how` = `released`).
    pub fn release(self) -> Result<()> {
        self.release_with("released")
    }

    fn stop_threads(&mut self) {
        lock(&self.inner.control).stop = true;
        self.inner.cond.notify_all();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }

    fn finish(&mut self, how: &str) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        self.stop_threads();
        let inner = &self.inner;
        let rec = lock(&inner.record);
        let mut released = rec.lease.clone();
        released.state = LeaseState::Released;
        released.ended = Some(Ending {
            at: format_rfc3339(inner.clock.wall()),
            how: how.to_string(),
            by: None,
        });
        let wait = inner.timing.ttl.min(Duration::from_secs(5));
        let full = (|| {
            let _m = mutex::lock(
                &inner.paths.mutex,
                Some(Instant::now() + wait),
                inner.timing.ttl,
                StuckPolicy::Report,
            )?;
            ensure_ours(&inner.paths, &rec.lease)?;
            fsio::replace(&inner.paths, &inner.paths.lock, &released.to_bytes(), true)
        })();
        match full {
            Ok(()) => Ok(()),
            Err(Error::Lost { .. }) => Ok(()),
            Err(e) => {
                // Leave a lease every contender judges free at once: flip our header in place.
                let mut bytes = rec.bytes.clone();
                let seq = rec.lease.heartbeat_seq.saturating_add(1);
                let at = format_rfc3339(inner.clock.wall());
                let marked = match Lease::rewrite_header(&mut bytes, LeaseState::Released, seq, &at)
                {
                    Some(region) => mark_in_place(&inner.paths, &rec.lease, region),
                    None => false,
                };
                let what = if marked {
                    "marked the lease released in place instead"
                } else {
                    "could not mark it released either; contenders will judge it by its holder's death or its TTL"
                };
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

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let _ = self.finish("released (guard dropped)");
    }
}

fn mark_in_place(paths: &LockPaths, mine: &Lease, region: &[u8]) -> bool {
    let Ok(Some(f)) = fsio::open_lock(&paths.lock, true) else {
        return false;
    };
    match fsio::read_open(&f, &paths.lock) {
        Ok(LockContent::Lease(l, _)) if l.lease_id == mine.lease_id => {}
        _ => return false,
    }
    fsio::write_header(&f, &paths.lock, region).is_ok() && f.sync_data().is_ok()
}

/// Errors with `Error::Lost` unless LOCK holds our lease, still held.
fn ensure_ours(paths: &LockPaths, mine: &Lease) -> Result<()> {
    let lost = |why: String| Error::Lost {
        path: paths.lock.clone(),
        lease_id: mine.lease_id.clone(),
        why,
    };
    match fsio::read_lock(&paths.lock)? {
        LockContent::Lease(l, _) if l.lease_id == mine.lease_id => {
            if l.state == LeaseState::Held {
                Ok(())
            } else {
                Err(lost("it was released or broken".into()))
            }
        }
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
        let path = &self.paths.lock;
        let file = match fsio::open_lock(path, true) {
            Ok(Some(f)) => f,
            Ok(None) => {
                return Err(Some(LossReason::Vanished {
                    what: format!("{} no longer exists", path.display()),
                }));
            }
            Err(e @ Error::NotALease { .. }) | Err(e @ Error::NewerFormat { .. }) => {
                return Err(Some(LossReason::Vanished {
                    what: e.to_string(),
                }));
            }
            Err(e) => return self.transient(e),
        };
        match fsio::read_open(&file, path) {
            Ok(LockContent::Lease(l, _)) if l.lease_id == rec.lease.lease_id => {
                if l.state != LeaseState::Held {
                    return Err(Some(LossReason::Taken {
                        by: "holds our lease marked released (broken)".into(),
                    }));
                }
            }
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

fn renewer(inner: &Inner) {
    let t = inner.timing;
    let retry = (t.heartbeat / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
    let mut next = Instant::now() + t.heartbeat;
    loop {
        {
            let mut c = lock(&inner.control);
            loop {
                if c.stop || inner.lost.load(Ordering::Acquire) {
                    return;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                c = inner
                    .cond
                    .wait_timeout(c, next - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        let started = Instant::now();
        match inner.renew_once() {
            Ok(()) => {
                let done = Instant::now();
                let mut c = lock(&inner.control);
                if done < c.deadline && !inner.lost.load(Ordering::Acquire) {
                    c.deadline = started + t.renew_window();
                    c.last_error = None;
                }
                drop(c);
                // No notify: the watchdog finds the later deadline when it wakes at the old one,
                // so an idle holder wakes about once per heartbeat, not twice.
                next = started + t.heartbeat;
            }
            Err(Some(reason)) => {
                inner.set_lost(reason);
                return;
            }
            Err(None) => next = Instant::now() + retry,
        }
    }
}

fn watchdog(inner: &Inner) {
    let mut c = lock(&inner.control);
    loop {
        if c.stop || inner.lost.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if now >= c.deadline {
            let last_error = c.last_error.clone();
            drop(c);
            inner.set_lost(LossReason::RenewTimeout { last_error });
            return;
        }
        let wait = c.deadline - now;
        c = inner
            .cond
            .wait_timeout(c, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}
