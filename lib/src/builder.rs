//! Settings for taking a lease: the builder.
//!
//! Owns: every setting of an acquisition (TTL, heartbeat, grace, note, command, clock, identity,
//! callbacks, policies, shared or counted) and their validation into a [`Timing`] (the defaults
//! are `timing.rs`'s); the lease a new holder writes, and its random lease id. Like walkdir's
//! `WalkDir`, it is settings: the running state of an acquisition lives in `Acquirer`
//! (`acquire.rs`, which also holds the builder's `acquirer`/`try_acquire`/`acquire` methods:
//! they make one). The one thing it carries besides settings is a cache, shared by its clones,
//! of what the last acquisition resolved (`store::resolved::Resolved`: LOCK's paths, its file
//! system, the kept mutex descriptor), handed to the next `Acquirer` so that a loop of
//! `try_acquire` does not resolve LOCK again.
//! Must never: hold an acquisition's running state (tickets, observations, a held lease); do
//! I/O before an acquisition is asked for.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::Result;
use crate::identity::Identity;
use crate::loss::{LossReason, LostCallback};
use crate::process;
use crate::record::{Holder, Lease, LeaseState};
use crate::timing::Timing;
use crate::verdict::Verdict;

/// The `on_wait` callback, shared by the builder's clones.
pub(crate) type WaitCallback = Arc<Mutex<dyn FnMut(&Verdict) + Send>>;

/// Settings for taking a lease on one LOCK path, and the methods that take it.
///
/// Only settings: cloning it is cheap, and taking a lease does not change it. Each
/// `try_acquire`/`acquire` call works through an [`Acquirer`](crate::Acquirer), which holds what one contender
/// keeps between attempts; keep one yourself ([`LeaseBuilder::acquirer`]) to take the same lock
/// again and again without resolving its path each time.
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let lock = dir.path().join("deploy.lock");
/// let guard = leasehold::LeaseBuilder::new(&lock)
///     .ttl(Duration::from_secs(10))
///     .note("nightly deploy")
///     .acquire_timeout(Duration::from_secs(5))?;
/// // ... do the work, passing guard.token() to the resource ...
/// assert!(!guard.is_lost());
/// guard.release_with("exit 0")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseBuilder {
    pub(crate) path: PathBuf,
    pub(crate) ttl: Duration,
    pub(crate) heartbeat: Option<Duration>,
    pub(crate) grace: Option<Duration>,
    pub(crate) note: Option<String>,
    /// `--max-time`: the deadline the lease shows (`ending.rs`); the wrapper enforces it.
    pub(crate) max_time: Option<Duration>,
    pub(crate) command: Option<Vec<String>>,
    /// The job's process, already forked and held back: pid, start time, process group.
    pub(crate) child: Option<(i32, u64, i32)>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) identity: Option<Identity>,
    pub(crate) wall_skew: Option<Duration>,
    pub(crate) on_lost: Option<LostCallback>,
    pub(crate) on_wait: Option<WaitCallback>,
    pub(crate) on_serve: Option<crate::handover::ServeCallback>,
    pub(crate) take_over_hung: bool,
    pub(crate) poll: bool,
    pub(crate) durable: bool,
    pub(crate) allow_host_local_locks: bool,
    /// Script mode: the process (pid, start time, process group) this process holds the lease
    /// for (see [`LeaseBuilder::on_behalf_of`]).
    pub(crate) on_behalf: Option<(i32, u64, i32)>,
    /// Exclusive (the default), shared, or one of N slots (see `slots.rs`).
    pub(crate) want: crate::slots::Want,
    /// Stops a waiting acquisition (see [`LeaseBuilder::cancel`]).
    pub(crate) cancel: Option<crate::cancel::Cancel>,
    /// What the builder's own `try_acquire`/`acquire` worked out about LOCK (its resolved
    /// paths and file-system facts) and kept open (the mutex file), for its next call: shared
    /// by clones, which all name the same LOCK. A call that finds it taken (another thread is
    /// acquiring through a clone) resolves afresh.
    pub(crate) cache: Arc<Mutex<Option<crate::store::resolved::Resolved>>>,
}

impl std::fmt::Debug for LeaseBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBuilder")
            .field("path", &self.path)
            .field("ttl", &self.ttl)
            .field("heartbeat", &self.heartbeat)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl LeaseBuilder {
    /// Settings for the lock at `path`, with defaults: TTL [`DEFAULT_TTL`](crate::DEFAULT_TTL),
    /// heartbeat [`heartbeat_rule`](crate::heartbeat_rule), grace [`grace_rule`](crate::grace_rule),
    /// the real clock and identity, hung same-host holders stopped and taken over.
    pub fn new(path: impl AsRef<Path>) -> Self {
        LeaseBuilder {
            path: path.as_ref().to_path_buf(),
            ttl: crate::timing::DEFAULT_TTL,
            heartbeat: None,
            grace: None,
            note: None,
            max_time: None,
            command: None,
            child: None,
            clock: Arc::new(SystemClock),
            identity: None,
            wall_skew: None,
            on_lost: None,
            on_wait: None,
            on_serve: None,
            take_over_hung: true,
            poll: false,
            durable: true,
            allow_host_local_locks: false,
            on_behalf: None,
            want: crate::slots::Want::Exclusive,
            cancel: None,
            cache: Arc::default(),
        }
    }

    /// Time-to-live: how long others wait, without seeing a heartbeat, before presuming us dead.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// Renewal interval (default [`heartbeat_rule`](crate::heartbeat_rule): TTL/3).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }
    /// SIGTERM-to-SIGKILL grace a wrapper allows when fencing (default
    /// [`grace_rule`](crate::grace_rule): min(5s, TTL/4)); the
    /// renew deadline leaves room for it.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }
    /// The longest the job may run (`run --max-time`): recorded in the lease as its `deadline`
    /// (acquisition time plus `limit`, shown by `status`). The library only records it: the
    /// holder enforces it (the `run` wrapper fences its command there).
    pub fn max_time(mut self, limit: Duration) -> Self {
        self.max_time = Some(limit);
        self
    }
    /// Free text stored in the lease.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
    /// The command line to record as what the holder runs (default: this process's argv).
    pub fn command(mut self, argv: Vec<String>) -> Self {
        self.command = Some(argv);
        self
    }
    /// The process that runs the job under the lease — its pid, start time (/proc/PID/stat
    /// field 22) and process group — forked already and held back until the lease is taken:
    /// the lease names it from its first write (one atomic write instead of a second one by
    /// [`LeaseGuard::set_child`](crate::LeaseGuard::set_child)). The process must not run the
    /// job before the acquisition returns.
    pub fn child(mut self, pid: i32, start: u64, pgid: i32) -> Self {
        self.child = Some((pid, start, pgid));
        self
    }
    /// Injects a clock (tests use skewed ones).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// Injects an identity (tests play foreign hosts with it).
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }
    /// Opt-in: also judge a foreign lease stale when its holder's own wall-clock heartbeat is
    /// older than TTL + `skew`. Off by default, because clocks may disagree by minutes.
    pub fn wall_clock_shortcut(mut self, skew: Duration) -> Self {
        self.wall_skew = Some(skew);
        self
    }
    /// Called once, from a background thread, when the guard is lost.
    pub fn on_lost(mut self, f: impl Fn(&LossReason) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(f));
        self
    }
    /// Called when we must wait, and again after every look at the lock while waiting: at
    /// least whenever the holder or its state changes, and at least once per waiter tick
    /// (TTL/4, at most 5s), so that a display can keep ages current. A caller that prints a
    /// line per call should print only when what it shows changes.
    pub fn on_wait(mut self, f: impl FnMut(&Verdict) + Send + 'static) -> Self {
        self.on_wait = Some(Arc::new(Mutex::new(f)));
        self
    }
    /// Called at the release, before the lease is let go, for each program that blocked on a
    /// file LOCK named before our lease replaced it (util-linux flock(1) that opened LOCK just
    /// before): the release lets it run first and waits until it has let go (PROTOCOL.md §4),
    /// which may take as long as that program's job. A caller that prints says why it waits.
    ///
    /// ```
    /// # fn main() -> Result<(), leasehold::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// let guard = leasehold::LeaseBuilder::new(dir.path().join("job.lock"))
    ///     .on_serve(|s| eprintln!("waiting for {} to finish first", s.who()))
    ///     .try_acquire()?;
    /// guard.release()?; // nobody blocked: nothing said
    /// # Ok(()) }
    /// ```
    pub fn on_serve(mut self, f: impl Fn(&crate::Served) + Send + Sync + 'static) -> Self {
        self.on_serve = Some(Arc::new(f));
        self
    }
    /// Whether a hung same-host holder (alive, heartbeat stalled a TTL) is stopped (verified
    /// SIGKILL of its command's process group) and taken over. Default true.
    pub fn take_over_hung(mut self, yes: bool) -> Self {
        self.take_over_hung = yes;
        self
    }
    /// Force polling instead of change notifications while waiting (for NFS).
    pub fn poll(mut self, yes: bool) -> Self {
        self.poll = yes;
        self
    }
    /// Whether token and lease writes are fsynced (default true; turn off only for tests and
    /// benchmarks). On memory-backed file systems (tmpfs, ramfs) fsync is a no-op, and
    /// leasehold skips it whatever this says.
    pub fn durable(mut self, yes: bool) -> Self {
        self.durable = yes;
        self
    }

    /// Accept a mount whose kernel locks are local to each host (NFS `local_lock=all`,
    /// `nolock`). Refused by default: there the mutex cannot exclude other hosts, and two hosts
    /// could both take the lease.
    pub fn allow_host_local_locks(mut self, yes: bool) -> Self {
        self.allow_host_local_locks = yes;
        self
    }

    /// Script mode: hold the lease on behalf of another process of the same user — the process
    /// `pid` with start time `start` (`/proc/PID/stat` field 22, see [`process::stat`]) in
    /// process group `pgid` — instead of for this process's own work. The lease records that
    /// process as its job (`child_pid`, `child_start`, `pgid`) from its very first write, and
    /// this process as the *keeper* that renews it (`holder.pid`, which keeps the holder's mark,
    /// PROTOCOL.md §7), with `holder.on_behalf` set.
    ///
    /// The caller takes on what `leasehold run` does for its command: watch that process (a
    /// pidfd), release the guard the moment it exits, and stop it when the guard is lost. A
    /// contender that finds the keeper gone and the process alive judges the lease hung after a
    /// TTL and stops that process — on the evidence of a lease file written by the lease's own
    /// uid (or root), never another user's (PROTOCOL.md §10).
    pub fn on_behalf_of(mut self, pid: i32, start: u64, pgid: i32) -> Self {
        self.on_behalf = Some((pid, start, pgid));
        self
    }

    /// Take a *shared* lease: any number of shared holders hold the lock together, and an
    /// exclusive holder (a builder without `shared` or `slots`) excludes them all — a
    /// readers-writer lock, like `flock -s`. Waiting stays first come, first served: a waiting
    /// exclusive holder is not overtaken by shared holders arriving after it. Every holder gets
    /// its own lease (heartbeat, lease id, fencing token). Default false.
    pub fn shared(mut self, yes: bool) -> Self {
        self.want = match yes {
            true => crate::slots::Want::Shared,
            false => crate::slots::Want::Exclusive,
        };
        self
    }

    /// Take one of `n` slots: at most `n` holders at once (a counting semaphore, like `sem -j
    /// N`), each with its own lease. Every holder and waiter of the lock must ask for the same
    /// `n`; one asking otherwise (or for a plain or shared lease) is refused with
    /// [`Error::Mismatch`](crate::Error::Mismatch) while the lock is in use. `slots(1)` is a
    /// semaphore of one, not a plain lock.
    pub fn slots(mut self, n: u32) -> Self {
        self.want = crate::slots::Want::Slots(n);
        self
    }

    /// Stop waiting when `cancel` is cancelled (from another thread, or by writing to its fd
    /// from a signal handler): the acquisition then returns
    /// [`Error::Cancelled`](crate::Error::Cancelled), having given up its place in the queue.
    /// A one-shot `try_acquire` is not affected. See [`Cancel`](crate::Cancel).
    pub fn cancel(mut self, cancel: crate::cancel::Cancel) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// The validated timing these settings give.
    pub fn timing(&self) -> Result<Timing> {
        Timing::new(self.ttl, self.heartbeat, self.grace)
    }

    /// Our lease as it would be taken at `now` by `me`, token 0.
    pub(crate) fn new_lease(&self, me: &Identity, timing: &Timing, now: &str) -> Lease {
        // The process the lease names beside its holder: the script it is held for, or the
        // command forked (held at its gate) before the lease was taken.
        let (child_pid, child_start, pgid) = match self.on_behalf.or(self.child) {
            Some((pid, start, pgid)) => (Some(pid), Some(start), Some(pgid)),
            None => (None, None, None),
        };
        Lease {
            state: LeaseState::Held,
            heartbeat_seq: 0,
            heartbeat_at: now.to_string(),
            lease_id: random_id(),
            token: 0,
            ttl_ms: timing.ttl.as_millis().max(1) as u64,
            acquired_at: now.to_string(),
            holder: Holder {
                pid: std::process::id() as i32,
                pid_start: process::own_start_time(),
                child_pid,
                child_start,
                pgid,
                host: me.host.clone(),
                boot_id: me.boot_id.clone(),
                pid_ns: me.pid_ns,
                uid: me.uid,
                user: me.user.clone(),
                command: self
                    .command
                    .clone()
                    .unwrap_or_else(|| std::env::args().collect()),
                note: self.note.clone(),
                on_behalf: self.on_behalf.is_some(),
            },
            ended: None,
            mode: None,
            history: Default::default(),
            damaged: false,
        }
    }
}

/// A random 128-bit id in 32 hex digits, from std's keyed SipHash: its keys come from the OS
/// once per thread and differ for every `RandomState`; the pid keeps a forked child, which
/// inherits the keys, from repeating its parent's ids. No system call after the first.
pub(crate) fn random_id() -> String {
    use std::hash::BuildHasher;
    let s = std::collections::hash_map::RandomState::new();
    let pid = std::process::id();
    let (a, b) = (s.hash_one((pid, 0u8)), s.hash_one((pid, 1u8)));
    format!("{a:016x}{b:016x}")
}
