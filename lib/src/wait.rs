//! Waiting for a turn: event-driven on local file systems, polling with jitter on network ones.
//!
//! Owns: what wakes a waiting contender. The head of the queue waits for the lease itself: a
//! one-shot inotify watch on LOCK's directory (a watch on the file would follow the replaced
//! inode), armed before each sleep and followed by one more `lstat` of LOCK, a pidfd per
//! same-host holder process (death wakes it at once), and a tick that covers lost events,
//! foreign holders' TTL and hung holders. A waiter behind another waits
//! only for its predecessor's ticket: a thread blocks in flock on it, so the kernel wakes exactly
//! that one successor when the predecessor leaves or dies; such threads are kept for the
//! process's next waits. On network file systems (or `--poll`)
//! nothing of that reaches us from other hosts, so it sleeps a jittered interval derived from the
//! TTL and lets the next pass re-check with try-locks.
//! Must never: sleep past the caller's deadline, block in a kernel lock call on a network file
//! system, or let a missed event stall a waiter for longer than one tick.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::cancel::{self, Cancel};
use crate::fsio;
use crate::grave;
use crate::paths::LockPaths;
use crate::process::{self, Liveness};
use crate::queue::Ahead;
use crate::record::LeaseState;
use crate::verdict::{State, Verdict};

/// The state of one contender's waiting.
#[derive(Debug)]
pub(crate) struct Waiter {
    poll_mode: bool,
    ttl: Duration,
    inotify: Option<Inotify>,
    /// LOCK's directory, for the inotify pool's key.
    dir: PathBuf,
    /// LOCK's paths: the watch goes on the directory we opened, through its descriptor.
    paths: LockPaths,
    seed: u64,
    /// The ticket ahead we wait on, and the read end of a pipe whose writer (the thread that
    /// blocks in its lock) hangs up when it got it.
    predecessor: Option<((u64, u64), OwnedFd)>,
    /// pidfds of the holder processes we wait on, by (pid, start time), kept across wake-ups.
    pidfds: Vec<((i32, u64), OwnedFd)>,
    /// How many times this waiter woke up (for tests and benchmarks of herd-freedom).
    pub wakeups: u64,
    /// Ends every wait at once when cancelled.
    cancel: Option<Cancel>,
}

impl Waiter {
    /// A waiter for `paths`. Change notification is set up lazily, the first time the lock
    /// turns out to be busy, so that an uncontended acquisition costs no inotify instance:
    /// closing one costs the kernel an RCU grace period (measured at 5–25 ms here).
    pub(crate) fn new(
        paths: &LockPaths,
        poll_mode: bool,
        ttl: Duration,
        cancel: Option<Cancel>,
    ) -> Waiter {
        Waiter {
            poll_mode,
            ttl,
            inotify: None,
            dir: paths.dir.clone(),
            paths: paths.clone(),
            seed: u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            predecessor: None,
            pidfds: Vec::new(),
            wakeups: 0,
            cancel,
        }
    }

    /// Arms a one-shot inotify watch on LOCK's directory (creating or reusing the instance).
    /// One-shot, so that the kernel drops the watch with the first event: a process that is not
    /// waiting at the moment (its instance pooled, or the new holder busy taking the lease) is
    /// not sent every later change in the directory, which with many waiters cost each
    /// operation there a microsecond per instance. False when inotify is not available here
    /// (the waiter then polls).
    fn arm(&mut self) -> bool {
        if self.poll_mode {
            return false;
        }
        match &self.inotify {
            // Events that fired an earlier watch were looked at then: discard them.
            Some(ino) => drain(ino),
            None => {
                self.inotify = pool_take(&self.dir)
                    .or_else(|| Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok());
            }
        }
        let armed = self.inotify.as_ref().is_some_and(|ino| {
            ino.add_watch(&self.paths.handle().proc_path(), watch_flags())
                .is_ok()
        });
        if !armed {
            self.poll_mode = true; // no inotify here: poll
        }
        armed
    }

    /// The polling interval on network file systems: TTL/10 within [5 ms, 1 s], jittered by
    /// ±25 % so hosts do not poll in lockstep.
    fn poll_interval(&mut self) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let jitter = 0.75 + (self.seed % 1000) as f64 / 2000.0;
        (self.ttl / 10)
            .clamp(Duration::from_millis(5), Duration::from_secs(1))
            .mul_f64(jitter)
    }

    /// The longest a waiter sleeps without looking again, also its ticket's heartbeat interval.
    pub(crate) fn tick(&self) -> Duration {
        (self.ttl / 4).clamp(Duration::from_millis(1), Duration::from_secs(5))
    }

    fn until(deadline: Option<Instant>, d: Duration) -> Duration {
        match deadline {
            Some(dl) => d.min(dl.saturating_duration_since(Instant::now())),
            None => d,
        }
    }

    /// At the head of the queue: waits until the lease may have changed, its same-host holder
    /// died, a tick passed, or the deadline. `sig` is LOCK's signature when it was last judged
    /// (see [`fsio::Sig`]): LOCK is stated again once the watch is armed, so that a change
    /// between that judgement and the watch is never slept through.
    pub(crate) fn wait_lease(
        &mut self,
        seen: &Verdict,
        sig: Option<fsio::Sig>,
        deadline: Option<Instant>,
    ) {
        self.wakeups += 1;
        if !self.poll_mode && (!self.arm() || fsio::signature(&self.paths) != sig) {
            return; // changed since it was judged (or inotify just failed): look again
        }
        if self.poll_mode {
            let nap = self.poll_interval().min(stale_in(seen));
            cancel::nap(self.cancel.as_ref(), Self::until(deadline, nap));
            return;
        }
        grave::reap();
        let want = if seen.same_host && seen.state == State::Held {
            holder_procs(seen)
        } else {
            Vec::new()
        };
        self.pidfds.retain(|(p, _)| want.contains(p));
        for p in want {
            if self.pidfds.iter().any(|(q, _)| *q == p) {
                continue;
            }
            match pidfd(p) {
                Watch::Alive(fd) => self.pidfds.push((p, fd)),
                Watch::Dead => {}         // nothing to wait for: the judgement knew
                Watch::DiedNow => return, // gone since the judgement: look again now
            }
        }
        let pidfds = &self.pidfds;
        let cancel = self.cancel.as_ref();
        let end = Instant::now() + Self::until(deadline, self.tick().min(stale_in(seen)));
        let Some(ino) = &self.inotify else {
            return;
        };
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut fds: Vec<PollFd> = Vec::with_capacity(2 + pidfds.len());
            fds.push(PollFd::new(ino.as_fd(), PollFlags::POLLIN));
            for (_, p) in pidfds {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
            }
            // Last, so that the pidfds keep their places after the inotify descriptor.
            if let Some(c) = cancel {
                fds.push(PollFd::new(c.fd(), PollFlags::POLLIN));
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) => return,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return,
            }
            if cancel.is_some_and(Cancel::is_cancelled) {
                return;
            }
            let died: Vec<bool> = fds[1..1 + pidfds.len()]
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            if died.contains(&true) {
                // Forget the dead: the next wait must not wake at once for them again.
                let mut dead = died.into_iter();
                self.pidfds.retain(|_| !dead.next().unwrap_or(false));
                return;
            }
            // The one-shot watch fired: look again. The events are not read here (that would
            // cost the hand-over a system call); the next `arm` discards them. An event about
            // another file in the directory costs one needless look.
            return;
        }
    }

    /// Behind another waiter: waits until that predecessor leaves the queue or dies (exactly
    /// this waiter is woken), a tick passes, or the deadline.
    pub(crate) fn wait_turn(&mut self, predecessor: &Ahead, deadline: Option<Instant>) {
        self.wakeups += 1;
        if self.poll_mode {
            let nap = self.poll_interval();
            cancel::nap(self.cancel.as_ref(), Self::until(deadline, nap));
            return;
        }
        if self
            .predecessor
            .as_ref()
            .is_none_or(|(id, _)| *id != predecessor.id)
        {
            match flock_waiter(&predecessor.file) {
                Some(rx) => self.predecessor = Some((predecessor.id, rx)),
                None => {
                    cancel::nap(self.cancel.as_ref(), Self::until(deadline, self.tick()));
                    return;
                }
            }
        }
        let timeout = Self::until(deadline, self.tick());
        if let Some((_, rx)) = &self.predecessor {
            // The thread's end of the pipe closes when it got the lock (or could not start):
            // readable, or hung up.
            let mut fds = vec![PollFd::new(rx.as_fd(), PollFlags::POLLIN)];
            if let Some(c) = &self.cancel {
                fds.push(PollFd::new(c.fd(), PollFlags::POLLIN));
            }
            let ms = u16::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
            let woke = match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) => false,
                Ok(_) => fds[0].revents().is_some_and(|r| !r.is_empty()),
                Err(_) => true, // look again
            };
            if woke {
                self.predecessor = None;
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(ino) = self.inotify.take() {
            pool_put(&self.dir, ino);
        }
        // Closed later: a waiter is dropped on its way to hand over a lease it just took.
        grave::bury(
            std::mem::take(&mut self.pidfds)
                .into_iter()
                .map(|(_, fd)| fd),
        );
    }
}

/// What wakes the head: LOCK renamed over, created, deleted, written or changed in mode
/// (released in place), in a watch the first event removes.
fn watch_flags() -> AddWatchFlags {
    AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_ONESHOT
}

/// Inotify instances used for a lock directory, kept for the next waiter in this process
/// instead of being closed (closing waits for an RCU grace period).
static POOL: std::sync::Mutex<Vec<(PathBuf, Inotify)>> = std::sync::Mutex::new(Vec::new());
const POOL_MAX: usize = 4;

fn pool_take(dir: &Path) -> Option<Inotify> {
    let mut pool = POOL.lock().ok()?;
    let i = pool.iter().position(|(d, _)| d == dir)?;
    let (_, ino) = pool.swap_remove(i);
    // Events that arrived while it was idle are stale.
    drain(&ino);
    Some(ino)
}

/// Reads and discards every queued event.
fn drain(ino: &Inotify) {
    while let Ok(ev) = ino.read_events() {
        if ev.is_empty() {
            break;
        }
    }
}

fn pool_put(dir: &Path, ino: Inotify) {
    if let Ok(mut pool) = POOL.lock()
        && pool.len() < POOL_MAX
    {
        pool.push((dir.to_path_buf(), ino));
    }
}

/// One wait for a predecessor's ticket: a descriptor of the ticket open for writing, and the
/// write end of the pipe to hang up once its lock was had.
type TicketWait = (std::fs::File, OwnedFd);

/// Queue threads between waits, each reachable through its channel (at most
/// [`QUEUE_THREADS_KEPT`]). A thread started for each wait and ended at its wake-up cost a
/// thread's start and end at every queued wait (contended throughput on tmpfs was 17–61 %
/// lower), and its end fell in the middle of the predecessor's take, which wakes it
/// (docs/performance.md, *A hand-over*).
static QUEUE_THREADS: std::sync::Mutex<Vec<std::sync::mpsc::Sender<TicketWait>>> =
    std::sync::Mutex::new(Vec::new());
const QUEUE_THREADS_KEPT: usize = 2;

/// A thread that blocks in the kernel lock (`klock.rs`) on the predecessor's ticket and says
/// when it got it (the predecessor left or died). It opens the very inode that was judged
/// live, through /proc/self/fd (a new open file description, so its lock is its own and goes
/// when it lets go at once). If we stop caring, it lingers until the predecessor's lock is
/// released. A thread kept from an earlier wait takes the wait if there is one; a new one is
/// started otherwise; either is kept for the next wait after it, or ends if enough are kept.
fn flock_waiter(ticket: &std::fs::File) -> Option<OwnedFd> {
    // A pipe rather than a channel, so that a wait can poll it beside a cancel handle. None
    // when no pipe can be had (out of descriptors): the caller naps a tick and looks again.
    let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).ok()?;
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(format!("/proc/self/fd/{}", ticket.as_raw_fd()));
    // No descriptor: the write end goes now, and the caller simply looks again.
    let Ok(file) = opened else {
        return Some(rx);
    };
    let mut wait = (file, tx);
    loop {
        let kept = QUEUE_THREADS.lock().ok().and_then(|mut k| k.pop());
        let Some(thread) = kept else {
            break;
        };
        // A thread that is gone hands the wait back.
        match thread.send(wait) {
            Ok(()) => return Some(rx),
            Err(back) => wait = back.0,
        }
    }
    // No thread: the write end is gone with the closure, and the caller simply looks again.
    let _ = std::thread::Builder::new()
        .name("leasehold-queue".into())
        .spawn(move || queue_thread(wait));
    Some(rx)
}

/// The body of a queue thread: one wait after the other, as long as it is kept between them.
fn queue_thread(mut wait: TicketWait) {
    loop {
        let (file, tx) = wait;
        let _ = crate::klock::wait_free(&file);
        drop(file);
        drop(tx); // hang up: the waiter's poll wakes
        let (give, next) = std::sync::mpsc::channel();
        match QUEUE_THREADS.lock() {
            Ok(mut kept) if kept.len() < QUEUE_THREADS_KEPT => kept.push(give),
            _ => return,
        }
        wait = match next.recv() {
            Ok(w) => w,
            Err(_) => return,
        };
    }
}

/// The holder's recorded processes, as (pid, start time).
fn holder_procs(v: &Verdict) -> Vec<(i32, u64)> {
    let Some(l) = &v.lease else {
        return Vec::new();
    };
    let h = &l.holder;
    let mut procs = vec![(h.pid, h.pid_start)];
    if let (Some(c), Some(s)) = (h.child_pid, h.child_start) {
        procs.push((c, s));
    }
    procs
}

enum Watch {
    Alive(OwnedFd),
    Dead,
    DiedNow,
}

/// A pidfd for the process `(pid, start)` if it lives.
fn pidfd((pid, start): (i32, u64)) -> Watch {
    if process::liveness(pid, start) != Liveness::Alive {
        return Watch::Dead;
    }
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        return Watch::Dead;
    };
    match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
        // Re-check after opening: the PID may have been reused in between.
        Ok(fd) if process::liveness(pid, start) == Liveness::Alive => Watch::Alive(fd),
        _ => Watch::DiedNow,
    }
}

/// How long until a held lease turns stale (a foreign holder) or hung (a same-host one) by its
/// *holder's* TTL on our clock, if its heartbeat does not move: the waiter looks again then
/// rather than at its own tick, which follows the waiter's TTL and may be far longer (a waiter
/// with the default 30 s TTL ticks every 5 s; a holder with `--ttl 2s` is stale after 2 s).
/// Waking early costs one judgement; it never makes anything stale sooner.
///
/// A lock held by a holder its record no longer names (`Verdict::holder_unseen`: LOCK removed
/// or replaced under it) frees when that holder's kernel mark goes, which raises no event:
/// looked at again every [`UNSEEN_NAP`] (a rare state, and it lasts one fence).
fn stale_in(seen: &Verdict) -> Duration {
    match (&seen.lease, seen.heartbeat_age) {
        (Some(l), Some(age)) if seen.state == State::Held => Duration::from_millis(l.ttl_ms)
            .saturating_sub(age)
            .saturating_add(Duration::from_millis(1)),
        (l, _)
            if seen.state == State::Held
                && l.as_ref().is_none_or(|l| l.state == LeaseState::Released) =>
        {
            UNSEEN_NAP
        }
        // Behind a kernel lock on LOCK itself (`Verdict::kernel_locked`: flock(1)), whose
        // release raises no event either.
        (_, None) if seen.state == State::Held && seen.behind.is_some() => UNSEEN_NAP,
        _ => Duration::MAX,
    }
}

/// See [`stale_in`].
const UNSEEN_NAP: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids of our threads named `leasehold-queue`, once every one of them sleeps (state
    /// `S`: blocked in a kernel lock, or kept and waiting for the next wait). No other unit
    /// test of this crate starts such threads.
    fn queue_threads_asleep() -> Vec<String> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let mut ids = Vec::new();
            let mut asleep = true;
            for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
                let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                if comm.trim() != "leasehold-queue" {
                    continue;
                }
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                let state = stat.rsplit_once(") ").map(|(_, r)| r.starts_with('S'));
                asleep &= state == Some(true);
                ids.push(t.file_name().to_string_lossy().into_owned());
            }
            if asleep && !ids.is_empty() {
                ids.sort();
                return ids;
            }
            assert!(
                Instant::now() < until,
                "queue threads still running: {ids:?}"
            );
            std::thread::yield_now();
        }
    }

    /// A predecessor's ticket, locked as its owner locks it; the lock goes with the `File`.
    fn locked_ticket(dir: &Path, name: &str) -> (std::fs::File, std::fs::File) {
        let path = dir.join(name);
        let ticket = std::fs::File::create(&path).unwrap();
        let owner = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let at = crate::klock::Where {
            network: false,
            writable: true,
        };
        assert!(crate::klock::try_exclusive(&owner, at).unwrap());
        (ticket, owner)
    }

    fn woke(rx: &OwnedFd) -> bool {
        let mut fds = [PollFd::new(rx.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::from(10_000u16)).unwrap() == 1
    }

    /// The thread that waits for a predecessor's ticket wakes the waiter when the predecessor
    /// leaves, and is then kept for the next wait instead of ending: its end fell in the middle
    /// of that predecessor's take. The next wait is served by the same thread.
    #[test]
    fn a_queue_thread_wakes_its_waiter_and_is_kept_for_the_next_wait() {
        let dir = tempfile::tempdir().unwrap();
        let (first, owner) = locked_ticket(dir.path(), "q-1");
        let rx = flock_waiter(&first).expect("a pipe");
        let before = queue_threads_asleep();
        assert!(!woke_now(&rx), "the predecessor is still in line");
        drop(owner);
        assert!(woke(&rx), "the predecessor left: the waiter wakes");
        // Kept: it puts itself back among the kept threads.
        let until = Instant::now() + Duration::from_secs(10);
        while QUEUE_THREADS.lock().unwrap().is_empty() {
            assert!(Instant::now() < until, "the queue thread was not kept");
            std::thread::yield_now();
        }
        let (second, owner) = locked_ticket(dir.path(), "q-2");
        let rx = flock_waiter(&second).expect("a pipe");
        assert_eq!(
            queue_threads_asleep(),
            before,
            "no new thread for the next wait"
        );
        assert!(!woke_now(&rx));
        drop(owner);
        assert!(woke(&rx));
    }

    fn woke_now(rx: &OwnedFd) -> bool {
        let mut fds = [PollFd::new(rx.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
    }
}
