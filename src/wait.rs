//! Waiting for a turn: event-driven on local file systems, polling with jitter on network ones.
//!
//! Owns: what wakes a waiting contender. The head of the queue waits for the lease itself:
//! inotify on LOCK's directory (filtered to LOCK's name: a watch on the file would follow the
//! replaced inode), a pidfd per same-host holder process (death wakes it at once), and a tick
//! that covers lost events, foreign holders' TTL and hung holders. A waiter behind another waits
//! only for its predecessor's ticket: a thread blocks in flock on it, so the kernel wakes exactly
//! that one successor when the predecessor leaves or dies. On network file systems (or `--poll`)
//! nothing of that reaches us from other hosts, so it sleeps a jittered interval derived from the
//! TTL and lets the next pass re-check with try-locks.
//! Must never: sleep past the caller's deadline, block in a kernel lock call on a network file
//! system, or let a missed event stall a waiter for longer than one tick.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::paths::LockPaths;
use crate::process::{self, Liveness};
use crate::queue::Ahead;
use crate::verdict::{State, Verdict};

/// The state of one contender's waiting.
#[derive(Debug)]
pub(crate) struct Waiter {
    poll_mode: bool,
    ttl: Duration,
    inotify: Option<Inotify>,
    dir: PathBuf,
    lock_name: OsString,
    seed: u64,
    predecessor: Option<((u64, u64), Receiver<()>)>,
    /// How many times this waiter woke up (for tests and benchmarks of herd-freedom).
    pub wakeups: u64,
}

impl Waiter {
    /// A waiter for `paths`. Change notification is set up lazily, the first time the lock
    /// turns out to be busy, so that an uncontended acquisition costs no inotify instance:
    /// closing one costs the kernel an RCU grace period (measured at 5–25 ms here).
    pub(crate) fn new(paths: &LockPaths, poll_mode: bool, ttl: Duration) -> Waiter {
        Waiter {
            poll_mode,
            ttl,
            inotify: None,
            dir: paths.dir.clone(),
            lock_name: paths
                .lock
                .file_name()
                .map(|n| n.to_os_string())
                .unwrap_or_default(),
            seed: u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            predecessor: None,
            wakeups: 0,
        }
    }

    /// Makes sure an inotify watch on LOCK's directory exists. Returns true when it was just set
    /// up: the caller must look at the lock again before sleeping, since a change between its
    /// last look and the watch would otherwise go unseen until the next tick.
    fn watch(&mut self) -> bool {
        if self.inotify.is_some() || self.poll_mode {
            return false;
        }
        self.inotify = pool_take(&self.dir).or_else(|| {
            let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
            let flags = AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_MODIFY
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_ATTRIB;
            ino.add_watch(&self.dir, flags).ok()?;
            Some(ino)
        });
        if self.inotify.is_none() {
            self.poll_mode = true; // no inotify here: poll
        }
        true
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
    /// died, a tick passed, or the deadline.
    pub(crate) fn wait_lease(&mut self, seen: &Verdict, deadline: Option<Instant>) {
        self.wakeups += 1;
        if self.watch() {
            return; // look again, now that changes will be seen
        }
        if self.poll_mode {
            let nap = self.poll_interval();
            std::thread::sleep(Self::until(deadline, nap));
            return;
        }
        let pidfds = if seen.same_host && seen.state == State::Held {
            holder_pidfds(seen)
        } else {
            Vec::new()
        };
        if pidfds.iter().any(Option::is_none) {
            return; // a holder process is already gone: look again now
        }
        let end = Instant::now() + Self::until(deadline, self.tick());
        let Some(ino) = &self.inotify else {
            return;
        };
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut fds: Vec<PollFd> = Vec::with_capacity(1 + pidfds.len());
            fds.push(PollFd::new(ino.as_fd(), PollFlags::POLLIN));
            for p in pidfds.iter().flatten() {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) => return,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return,
            }
            let died = fds[1..]
                .iter()
                .any(|f| f.revents().is_some_and(|r| !r.is_empty()));
            if died {
                return;
            }
            // Wake only for events about LOCK itself (or a queue overflow). One read takes what
            // is queued (the buffer holds a hundred events); anything left makes the next poll
            // return at once.
            let relevant = ino.read_events().is_ok_and(|events| {
                events.iter().any(|e| {
                    e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW)
                        || e.name.as_deref() == Some(self.lock_name.as_os_str())
                })
            });
            if relevant {
                return;
            }
        }
    }

    /// Behind another waiter: waits until that predecessor leaves the queue or dies (exactly
    /// this waiter is woken), a tick passes, or the deadline.
    pub(crate) fn wait_turn(&mut self, predecessor: &Ahead, deadline: Option<Instant>) {
        self.wakeups += 1;
        if self.poll_mode {
            let nap = self.poll_interval();
            std::thread::sleep(Self::until(deadline, nap));
            return;
        }
        if self
            .predecessor
            .as_ref()
            .is_none_or(|(id, _)| *id != predecessor.id)
        {
            self.predecessor = Some((predecessor.id, flock_waiter(&predecessor.file)));
        }
        let timeout = Self::until(deadline, self.tick());
        if let Some((_, rx)) = &self.predecessor {
            match rx.recv_timeout(timeout) {
                Ok(()) | Err(RecvTimeoutError::Disconnected) => self.predecessor = None,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(ino) = self.inotify.take() {
            pool_put(&self.dir, ino);
        }
    }
}

/// Inotify instances with a watch on a lock directory, kept for the next waiter in this process
/// instead of being closed (closing waits for an RCU grace period).
static POOL: std::sync::Mutex<Vec<(PathBuf, Inotify)>> = std::sync::Mutex::new(Vec::new());
const POOL_MAX: usize = 4;

fn pool_take(dir: &Path) -> Option<Inotify> {
    let mut pool = POOL.lock().ok()?;
    let i = pool.iter().position(|(d, _)| d == dir)?;
    let (_, ino) = pool.swap_remove(i);
    // Events that arrived while it was idle are stale: drain them.
    while let Ok(ev) = ino.read_events() {
        if ev.is_empty() {
            break;
        }
    }
    Some(ino)
}

fn pool_put(dir: &Path, ino: Inotify) {
    if let Ok(mut pool) = POOL.lock()
        && pool.len() < POOL_MAX
    {
        pool.push((dir.to_path_buf(), ino));
    }
}

/// A thread that blocks in flock on the predecessor's ticket and says when it got it (the
/// predecessor left or died). It opens the very inode that was judged live, through
/// /proc/self/fd (a new open file description, so its lock is its own and goes when it lets go
/// at once). If we stop caring, it lingers until the predecessor's lock is released, then ends.
fn flock_waiter(ticket: &std::fs::File) -> Receiver<()> {
    let (tx, rx) = mpsc::channel();
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(format!("/proc/self/fd/{}", ticket.as_raw_fd()));
    if let Ok(file) = opened {
        let spawned = std::thread::Builder::new()
            .name("leasehold-queue".into())
            .spawn(move || {
                let _ = file.lock();
                let _ = tx.send(());
            });
        if spawned.is_err() {
            // No thread: the receiver disconnects and the caller simply looks again.
        }
    }
    rx
}

/// pidfds for the holder's recorded processes; `None` for one that is already gone.
fn holder_pidfds(v: &Verdict) -> Vec<Option<OwnedFd>> {
    let Some(l) = &v.lease else {
        return Vec::new();
    };
    let h = &l.holder;
    let mut procs = vec![(h.pid, h.pid_start)];
    if let (Some(c), Some(s)) = (h.child_pid, h.child_start) {
        procs.push((c, s));
    }
    procs
        .into_iter()
        .filter(|&(pid, start)| process::liveness(pid, start) == Liveness::Alive)
        .map(|(pid, start)| {
            let p = rustix::process::Pid::from_raw(pid)?;
            let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()?;
            // Re-check after opening: the PID may have been reused in between.
            (process::liveness(pid, start) == Liveness::Alive).then_some(fd)
        })
        .collect()
}
