//! Taking a lease: the builder with its settings, and the acquisition protocol.
//!
//! Owns: one acquisition attempt under the mutex (read, judge, stop a verified hung or leftover
//! job, bump the durable token high-water mark, write our lease atomically and durably) and the
//! loop that repeats it while waiting. Must never: take over a lease judged held; start a guard
//! before its token and lease are durable; take over while a verified process of the old job
//! still runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock, format_rfc3339};
use crate::error::{Error, Result};
use crate::fsinfo;
use crate::fsio;
use crate::guard::{LeaseGuard, LossReason, LostCallback, Start};
use crate::identity::Identity;
use crate::judge::Judge;
use crate::mutex::{self, MutexFile, MutexGuard, MutexWait, StuckPolicy};
use crate::observe::Memory;
use crate::paths::LockPaths;
use crate::process;
use crate::queue::{self, Observed, Ticket};
use crate::record::{Draft, Holder, Lease, LeaseState};
use crate::takeover;
use crate::timing::Timing;
use crate::verdict::{State, Verdict};
use crate::wait::Waiter;

type WaitCallback = Box<dyn FnMut(&Verdict) + Send>;

/// Settings for taking a lease on one LOCK path, and the methods that take it.
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
pub struct LeaseBuilder {
    path: PathBuf,
    ttl: Duration,
    heartbeat: Option<Duration>,
    grace: Option<Duration>,
    note: Option<String>,
    command: Option<Vec<String>>,
    clock: Arc<dyn Clock>,
    identity: Option<Identity>,
    wall_skew: Option<Duration>,
    on_lost: Option<LostCallback>,
    on_wait: Option<WaitCallback>,
    take_over_hung: bool,
    poll: bool,
    durable: bool,
    allow_host_local_locks: bool,
    /// LOCK's resolved paths and file-system facts, worked out on the first acquisition and
    /// kept for the next ones (resolving costs a realpath and a read of mountinfo).
    resolved: Option<(LockPaths, fsinfo::FsInfo)>,
    /// The mutex file, kept open between attempts (see [`MutexFile`]).
    mutex_file: Option<MutexFile>,
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

enum Attempt {
    Taken(Box<LeaseGuard>),
    /// Not ours yet: what we saw, and the ticket ahead of ours we wait behind (if any).
    Busy(Box<Verdict>, Option<queue::Ahead>),
}

struct Ctx {
    paths: LockPaths,
    timing: Timing,
    me: Identity,
    poll: bool,
    /// Not a network file system.
    local: bool,
    /// Whether writes are fsynced: asked for, and the file system is not memory-backed.
    sync: bool,
}

/// What an attempt hands to the taking of the lease.
struct Carry {
    /// LOCK's file as read under the mutex, kept open past our rename.
    replaced: Option<fsio::Seen>,
    /// Our queue ticket, left under the mutex.
    ticket: Option<Ticket>,
    /// Our lease, serialised ahead of time.
    draft: Option<Draft>,
    /// The token we reserved in the high-water mark while next in line.
    reserved: Option<u64>,
}

/// A blocking acquirer's place in the FIFO queue.
#[derive(Default)]
struct Queued {
    ticket: Option<Ticket>,
    observed: Observed,
    /// Our ticket was first in the queue when last judged under the mutex. Tickets are
    /// numbered above every ticket present, so it stays first for as long as it exists.
    head: bool,
    /// LOCK's file as last read (local file systems only), to read it again without opening.
    seen: Option<fsio::Seen>,
    /// Our lease, serialised ahead of the wake-up.
    draft: Option<Draft>,
    /// A token reserved in the high-water mark while we were next in line.
    reserved: Option<u64>,
}

impl LeaseBuilder {
    /// Settings for the lock at `path`, with defaults: TTL 30 s, heartbeat TTL/3, grace
    /// min(5 s, TTL/4), the real clock and identity, hung same-host holders stopped and taken over.
    pub fn new(path: impl AsRef<Path>) -> Self {
        LeaseBuilder {
            path: path.as_ref().to_path_buf(),
            ttl: Duration::from_secs(30),
            heartbeat: None,
            grace: None,
            note: None,
            command: None,
            clock: Arc::new(SystemClock),
            identity: None,
            wall_skew: None,
            on_lost: None,
            on_wait: None,
            take_over_hung: true,
            poll: false,
            durable: true,
            allow_host_local_locks: false,
            resolved: None,
            mutex_file: None,
        }
    }

    /// Time-to-live: how long others wait, without seeing a heartbeat, before presuming us dead.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// Renewal interval (default TTL/3).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }
    /// SIGTERM-to-SIGKILL grace a wrapper allows when fencing (default min(5 s, TTL/4)); the
    /// renew deadline leaves room for it.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
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
    /// Called when we must wait, and again whenever the holder or its state changes.
    pub fn on_wait(mut self, f: impl FnMut(&Verdict) + Send + 'static) -> Self {
        self.on_wait = Some(Box::new(f));
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

    /// The validated timing these settings give.
    pub fn timing(&self) -> Result<Timing> {
        Timing::new(self.ttl, self.heartbeat, self.grace)
    }

    fn ctx(&mut self) -> Result<Ctx> {
        let timing = self.timing()?;
        // A directory whose path now leads elsewhere (unmounted, replaced) is resolved anew.
        if self
            .resolved
            .as_ref()
            .is_some_and(|(p, _)| !matches!(p.dir_moved(), Ok(false)))
        {
            self.resolved = None;
            self.mutex_file = None;
        }
        let (paths, fs) = match &self.resolved {
            Some(r) => r.clone(),
            None => {
                let paths = LockPaths::new(&self.path)?;
                let fs = fsinfo::inspect(&paths.dir);
                self.resolved = Some((paths.clone(), fs.clone()));
                (paths, fs)
            }
        };
        if let (Some(why), false) = (&fs.host_local_locks, self.allow_host_local_locks) {
            return Err(Error::UnsafeFileSystem {
                path: paths.lock.clone(),
                why: format!(
                    "{why}: another host could take the lease at the same time. Mount with \
                     local_lock=none (NFSv4 shares locks by default), or put the lock elsewhere"
                ),
            });
        }
        refuse_unshareable(&paths)?;
        let sync = self.durable && !fs.memory_backed;
        Ok(Ctx {
            sync,
            timing,
            paths,
            me: self.identity.clone().unwrap_or_else(Identity::current),
            poll: self.poll || fs.network,
            local: !fs.network,
        })
    }

    /// Takes the lease if it is free (or stale) now; `Error::WouldBlock` if a live holder has it.
    pub fn try_acquire(&mut self) -> Result<LeaseGuard> {
        let ctx = self.ctx()?;
        let mutex_wait = ctx.timing.one_shot_mutex_wait();
        let mut mem = Memory::default();
        match self.attempt(&ctx, Some(Instant::now() + mutex_wait), &mut mem, None)? {
            Attempt::Taken(g) => Ok(*g),
            Attempt::Busy(v, _) => Err(Error::WouldBlock {
                path: ctx.paths.lock,
                verdict: v,
            }),
        }
    }

    /// Waits as long as it takes.
    pub fn acquire(&mut self) -> Result<LeaseGuard> {
        self.acquire_until(None)
    }

    /// Waits at most `timeout`; `Error::Timeout` after that.
    pub fn acquire_timeout(&mut self, timeout: Duration) -> Result<LeaseGuard> {
        self.acquire_until(Some(Instant::now() + timeout))
    }

    fn acquire_until(&mut self, deadline: Option<Instant>) -> Result<LeaseGuard> {
        let ctx = self.ctx()?;
        let start = Instant::now();
        let mut mem = Memory::default();
        let mut waiter = Waiter::new(&ctx.paths, ctx.poll, ctx.timing.ttl);
        let mut queued = Queued::default();
        let mut reported: Option<(String, State, Option<u64>)> = None;
        loop {
            let (v, predecessor) = match self.attempt(&ctx, deadline, &mut mem, Some(&mut queued)) {
                Ok(Attempt::Taken(g)) => return Ok(*g),
                Ok(Attempt::Busy(mut v, p)) => {
                    if let Some(p) = &p {
                        // Named by who holds its flock, not by what the ticket says.
                        v.behind = Some(format!("queued waiter #{}, {}", p.seq, p.who()));
                    }
                    (v, p)
                }
                // The deadline ran out while another process was inside the mutex: that is a
                // timeout like any other, explained by who sits on the mutex.
                Err(Error::MutexStuck { holder, .. })
                    if deadline.is_some_and(|d| Instant::now() >= d) =>
                {
                    let mut v = self.peek(&ctx, &mut mem);
                    v.behind = Some(format!("the lease mutex, held by {holder}"));
                    return Err(Error::Timeout {
                        path: ctx.paths.lock,
                        waited: start.elapsed(),
                        verdict: Box::new(v),
                    });
                }
                Err(e) => return Err(e),
            };
            if let Some(d) = deadline
                && Instant::now() >= d
            {
                return Err(Error::Timeout {
                    path: ctx.paths.lock,
                    waited: start.elapsed(),
                    verdict: v,
                });
            }
            let key = (
                v.lease
                    .as_ref()
                    .map(|l| l.lease_id.clone())
                    .unwrap_or_default(),
                v.state,
                predecessor.as_ref().map(|p| p.seq),
            );
            if reported.as_ref() != Some(&key) {
                if let Some(cb) = self.on_wait.as_mut() {
                    cb(&v);
                }
                reported = Some(key);
            }
            if let Some(t) = queued.ticket.as_mut() {
                t.beat();
            }
            match &predecessor {
                Some(p) => waiter.wait_turn(p, deadline),
                None => {
                    let sig = queued.seen.as_ref().map(|s| s.sig);
                    waiter.wait_lease(&v, sig, deadline)
                }
            }
        }
    }

    /// A judgement without the mutex and without recording anything (to explain a timeout).
    fn peek(&self, ctx: &Ctx, mem: &mut Memory) -> Verdict {
        let mut judge = self.judge(ctx);
        judge.persist = false;
        let content = fsio::read_lock(&ctx.paths).unwrap_or(fsio::LockContent::Missing);
        judge.judge(&content, mem)
    }

    fn judge<'a>(&'a self, ctx: &'a Ctx) -> Judge<'a> {
        Judge {
            paths: &ctx.paths,
            me: &ctx.me,
            clock: self.clock.as_ref(),
            wall_skew: self.wall_skew,
            persist: true,
        }
    }

    /// One pass under the mutex. With `queued`, a blocking acquirer: it may take the lease only
    /// at the head of the queue, and joins the queue when it cannot. Without, a one-shot caller:
    /// it never queues and never overtakes a live waiter.
    fn attempt(
        &mut self,
        ctx: &Ctx,
        deadline: Option<Instant>,
        mem: &mut Memory,
        mut queued: Option<&mut Queued>,
    ) -> Result<Attempt> {
        let policy = if self.take_over_hung {
            StuckPolicy::KillStopped
        } else {
            StuckPolicy::Report
        };
        let mut ticket = queued.as_deref_mut().and_then(|q| q.ticket.as_mut());
        let (on_wait, clock, wall_skew) = (&mut self.on_wait, &self.clock, self.wall_skew);
        // Never wait silently: a mutex someone sits on is reported, naming who (the kernel's
        // word), as any other wait is.
        let mut waiting = |w: MutexWait<'_>| match w {
            MutexWait::Beat => {
                if let Some(t) = ticket.as_deref_mut() {
                    t.beat();
                }
            }
            MutexWait::Blocked(who) => {
                if let Some(cb) = on_wait.as_mut() {
                    let judge = Judge {
                        paths: &ctx.paths,
                        me: &ctx.me,
                        clock: clock.as_ref(),
                        wall_skew,
                        persist: false,
                    };
                    let content = fsio::read_lock(&ctx.paths).unwrap_or(fsio::LockContent::Missing);
                    let mut v = judge.judge(&content, &mut Memory::default());
                    v.behind = Some(format!("the lease mutex, held by {who}"));
                    cb(&v);
                }
            }
        };
        let m = mutex::lock_with(
            self.mutex_file.take(),
            &ctx.paths,
            deadline,
            ctx.timing.ttl,
            policy,
            Some(&mut waiting),
            !ctx.local,
        )?;
        let (mut ahead, waiting_ahead) = match queued.as_deref_mut() {
            Some(q) => {
                if q.ticket
                    .as_ref()
                    .is_some_and(|t| !t.still_queued(ctx.local))
                {
                    q.ticket = None; // skipped while frozen: queue again at the back
                    q.head = false;
                }
                let mine = q.ticket.as_ref().map(|t| t.seq);
                if q.head && mine.is_some() {
                    Ok((Vec::new(), 0))
                } else {
                    queue::live_ahead(
                        &ctx.paths,
                        mine,
                        Some(&mut q.observed),
                        ctx.timing.ttl,
                        !ctx.local,
                    )
                }
            }
            None => queue::live_ahead(&ctx.paths, None, None, ctx.timing.ttl, !ctx.local),
        }
        .or_else(degrade)?;
        let seen = queued.as_deref_mut().and_then(|q| q.seen.take());
        let (content, replaced) = fsio::read_lock_keep(&ctx.paths, seen)?;
        // Never keep LOCK open on a network file system: an NFS client that renames over a
        // file it has open keeps the old file alive on the server (a silly rename), and another
        // host whose cached name still leads to it would read the old lease instead of getting
        // ESTALE and looking the name up again (see `fsio::read_lock`).
        let replaced = replaced.filter(|_| ctx.local);
        let carry = |queued: Option<&mut Queued>, replaced| {
            let (ticket, draft, reserved) = match queued {
                Some(q) => (q.ticket.take(), q.draft.take(), q.reserved.take()),
                None => (None, None, None),
            };
            Carry {
                replaced,
                ticket,
                draft,
                reserved,
            }
        };
        // A released lease is free to anyone, wherever its holder lives: no judgement needed
        // (the common case when a waiter is handed the lease).
        if ahead.is_empty()
            && let fsio::LockContent::Lease(l, _) = &content
            && l.state == LeaseState::Released
        {
            let c = carry(queued, replaced);
            let g = self.take(ctx, m, Some(l), None, c)?;
            return Ok(Attempt::Taken(Box::new(g)));
        }
        let mut v = self.judge(ctx).judge(&content, mem);
        if ahead.is_empty() {
            let take_over = match v.state {
                State::Free => Some(None),
                State::Held => None,
                State::Hung if !self.take_over_hung => None,
                State::Stale | State::Hung => match takeover::stop_old_job(&v, &ctx.paths) {
                    Ok(_) => {
                        // A writer that died mid-write left at most a temp file: remove it now.
                        fsio::remove_leftover_temps(&ctx.paths);
                        Some(Some(v.clone()))
                    }
                    // A blocking acquirer waits (saying why) for what it may not stop — e.g. an
                    // old job's process it cannot check — to go, within its deadline; a
                    // one-shot caller is refused at once.
                    Err(why) if queued.is_some() => {
                        v.reason = format!("{}; not taking over: {why}", v.reason);
                        None
                    }
                    Err(why) => return Err(refused(ctx, &v, &why)),
                },
            };
            if let Some(broke) = take_over {
                let c = carry(queued, replaced);
                let g = self.take(ctx, m, v.lease.as_ref(), broke, c)?;
                return Ok(Attempt::Taken(Box::new(g)));
            }
        } else if v.state == State::Free || v.state == State::Stale {
            v.reason = format!("{}, but {waiting_ahead} waiter(s) queued ahead", v.reason);
            v.state = State::Held;
            v.behind = Some(format!("{waiting_ahead} queued waiter(s)"));
        }
        if let Some(q) = queued.as_deref_mut() {
            if ctx.local {
                // A shared flock on the LOCK file we judged tells its holder, at release, that
                // someone waits (see `handover::release_in_place`); it goes when the file is closed.
                if let Some(seen) = &replaced {
                    crate::handover::announce_waiting(seen);
                }
                q.seen = replaced;
            }
            if q.ticket.is_none() {
                // Without a ticket (e.g. a full or read-only directory) we still wait, unordered.
                let argv = self.command.clone().unwrap_or_default();
                q.ticket =
                    Ticket::take(&ctx.paths, &ctx.me, self.clock.as_ref(), &argv, !ctx.local)
                        .map(Some)
                        .or_else(degrade)?;
            }
            q.head = q.ticket.is_some() && ahead.is_empty();
            if q.head && q.reserved.is_none() {
                // Next in line: reserve our token now, durably, so that taking the lease after
                // the wake-up needs no write of the high-water mark (see `take`).
                let prev = v.lease.as_ref().map_or(0, |l| l.token);
                if let Ok(hwm) = m.high_water()
                    && let Ok(t) = next_token(hwm, prev)
                    && m.set_high_water(t, ctx.sync).is_ok()
                {
                    q.reserved = Some(t);
                }
            }
        }
        self.mutex_file = m.unlock();
        if let Some(q) = queued {
            if q.draft.is_none() {
                // Serialised now, while we wait, rather than after the wake-up.
                let now = format_rfc3339(self.clock.wall());
                q.draft = Draft::new(self.new_lease(ctx, &now));
            }
            // Next in line on a local file system: write it into a file of its own too, so
            // that taking the lease is one write and one rename.
            if ctx.local
                && q.head
                && let (Some(t), Some(d)) = (q.ticket.as_mut(), q.draft.as_ref())
            {
                t.prepare(d.bytes());
            }
        }
        v.queue_ahead = waiting_ahead;
        Ok(Attempt::Busy(Box::new(v), ahead.pop()))
    }

    /// Our lease as it would be taken at `now`, token 0.
    fn new_lease(&self, ctx: &Ctx, now: &str) -> Lease {
        Lease {
            state: LeaseState::Held,
            heartbeat_seq: 0,
            heartbeat_at: now.to_string(),
            lease_id: random_id(),
            token: 0,
            ttl_ms: ctx.timing.ttl.as_millis().max(1) as u64,
            acquired_at: now.to_string(),
            holder: Holder {
                pid: std::process::id() as i32,
                pid_start: process::own_start_time(),
                child_pid: None,
                child_start: None,
                pgid: None,
                host: ctx.me.host.clone(),
                boot_id: ctx.me.boot_id.clone(),
                pid_ns: ctx.me.pid_ns,
                uid: ctx.me.uid,
                user: ctx.me.user.clone(),
                command: self
                    .command
                    .clone()
                    .unwrap_or_else(|| std::env::args().collect()),
                note: self.note.clone(),
            },
            ended: None,
            damaged: false,
        }
    }

    fn take(
        &self,
        ctx: &Ctx,
        m: MutexGuard,
        prev: Option<&Lease>,
        broke: Option<Verdict>,
        carry: Carry,
    ) -> Result<LeaseGuard> {
        let Carry {
            replaced,
            mut ticket,
            draft,
            reserved,
        } = carry;
        let hwm = m.high_water()?;
        let prev = prev.map_or(0, |l| l.token);
        let token = match reserved {
            // Nobody reserved or used a token since ours: it is still above every token
            // handed out, and already durable in the high-water mark.
            Some(t) if hwm == t && prev < t => t,
            _ => {
                let t = next_token(hwm, prev)?;
                m.set_high_water(t, ctx.sync)?;
                t
            }
        };
        let now = format_rfc3339(self.clock.wall());
        let (lease, bytes) = match draft {
            Some(d) => d.finish(token, &now),
            None => {
                let mut lease = self.new_lease(ctx, &now);
                lease.token = token;
                let bytes = lease.to_bytes();
                (lease, bytes)
            }
        };
        // Our holder's mark, before the lease becomes visible (see `guard::holder_mark`).
        let mark = crate::guard::holder_mark(&ctx.paths);
        // The renew deadline counts from before the lease becomes visible: conservative.
        let started = Instant::now();
        let prepared = ticket
            .as_mut()
            .and_then(|t| t.install(&bytes, ctx.sync, &ctx.paths));
        let written = match prepared {
            Some(w) => w?,
            None => fsio::replace_keep(&ctx.paths, &ctx.paths.lock, &bytes, ctx.sync)?,
        };
        // Leave the queue: the name goes while we hold the mutex (so it is surely ours), the
        // lock after the mutex is free, waking exactly our successor.
        let ticket = ticket.map(Ticket::unlink_held);
        let witness = m.unlock();
        drop(ticket);
        let g = LeaseGuard::start(Start {
            paths: ctx.paths.clone(),
            timing: ctx.timing,
            clock: Arc::clone(&self.clock),
            lease,
            bytes,
            started,
            on_lost: self.on_lost.clone(),
            broke,
            witness,
            written: Some(written),
            local: ctx.local,
            sync: ctx.sync,
            replaced: replaced.map(|s| s.file),
            mark,
        })?;
        Ok(g)
    }
}

/// A queueing failure (a full or read-only directory) degrades to unordered waiting, never to
/// refusal — except something planted at the queue's names (not leasehold's own files), which
/// is refused at once, naming it, rather than silently waited around.
fn degrade<T: Default>(e: Error) -> Result<T> {
    match e {
        Error::Squatted { .. } | Error::Untrusted { .. } => Err(e),
        _ => Ok(T::default()),
    }
}

/// In a sticky directory (`/tmp`, `/run/lock`) only a file's owner (or root) may rename over
/// it: a LOCK or mutex file of another user there could never be taken over by us. Refuse at
/// once, naming the owner, rather than wait through the holder's job and fail then.
fn refuse_unshareable(paths: &LockPaths) -> Result<()> {
    let dir = paths.handle();
    if !dir.sticky() {
        return Ok(());
    }
    for (name, role) in [
        (paths.lock_name(), "lock file"),
        (paths.mutex_name(), "mutex file"),
    ] {
        if let Ok(Some(m)) = dir.stat(name) {
            dir.check_owner(name, &m, role)?;
        }
    }
    Ok(())
}

/// The token after every one handed out: above the high-water mark and LOCK's own token.
fn next_token(hwm: u64, prev: u64) -> Result<u64> {
    hwm.max(prev)
        .checked_add(1)
        .ok_or_else(|| Error::Settings("fencing token space exhausted".into()))
}

fn refused(ctx: &Ctx, v: &Verdict, why: &str) -> Error {
    Error::Refused {
        path: ctx.paths.lock.clone(),
        why: format!("not taking over ({v}): {why}"),
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
