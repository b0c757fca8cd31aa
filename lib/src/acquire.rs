//! Taking a lease: the running state of acquisitions and the protocol of one attempt.
//!
//! Owns: one acquisition attempt under the mutex (look at the queue, read, judge, stop a
//! verified hung or leftover job, bump the durable token high-water mark, write our lease
//! atomically and durably), in two shapes sharing those steps — the one-shot caller's
//! (`try_acquire`: never queues, never overtakes a live waiter) and the blocking caller's (takes
//! the lease only at the head of the queue, joins it otherwise, and prepares its take while it
//! waits) — and the loop that repeats the blocking attempt. What is kept between attempts lives
//! here (PROTOCOL.md §4, §6): LOCK's resolved paths and storage facts and the mutex descriptor
//! ([`Acquirer`]); the queue ticket, the LOCK descriptor, the observations, the prepared lease
//! and the reserved token (`Queued`, for one blocking acquisition).
//! Must never: take over a lease judged held; start a guard before its token and lease are
//! durable; take over while a verified process of the old job still runs; let a one-shot
//! caller queue or overtake a live waiter.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use crate::builder::LeaseBuilder;
use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::fsinfo::{self, FsInfo, Storage};
use crate::fsio::{self, LockContent, Seen};
use crate::guard::{LeaseGuard, Start};
use crate::handover;
use crate::identity::Identity;
use crate::judge::Judge;
use crate::mutex::{self, MutexFile, MutexGuard, MutexWait, StuckPolicy};
use crate::observe::Memory;
use crate::paths::LockPaths;
use crate::queue::{self, Ahead, Observed, Ticket};
use crate::record::{Draft, Lease, LeaseState};
use crate::takeover;
use crate::timing::Timing;
use crate::verdict::{State, Verdict};
use crate::wait::Waiter;

/// The running state of acquisitions of one lock with one set of settings, made by
/// [`LeaseBuilder::acquirer`] (as walkdir's `WalkDir` makes its `IntoIter`).
///
/// It keeps what is worth keeping from one acquisition to the next: LOCK's resolved paths and
/// file-system facts (a realpath and a read of mountinfo), and the mutex file, open. Take the
/// same lock repeatedly through one `Acquirer` to skip that work.
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let mut acquirer = leasehold::LeaseBuilder::new(dir.path().join("job.lock")).acquirer();
/// for _ in 0..3 {
///     let guard = acquirer.try_acquire()?;
///     guard.release()?;
/// }
/// # Ok(()) }
/// ```
pub struct Acquirer {
    settings: LeaseBuilder,
    /// LOCK's resolved paths and file-system facts, worked out on the first attempt and kept.
    resolved: Option<(LockPaths, FsInfo)>,
    /// The mutex file, kept open between attempts (see [`MutexFile`]).
    mutex_file: Option<MutexFile>,
}

impl std::fmt::Debug for Acquirer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquirer")
            .field("settings", &self.settings)
            .field("resolved", &self.resolved.as_ref().map(|(p, _)| &p.lock))
            .finish_non_exhaustive()
    }
}

enum Attempt {
    Taken(Box<LeaseGuard>),
    /// Not ours yet: what we saw, and the ticket ahead of ours we wait behind (if any).
    Busy(Box<Verdict>, Option<Ahead>),
}

/// What one acquisition works with, resolved from the settings and the lock's storage.
struct Ctx {
    paths: LockPaths,
    timing: Timing,
    me: Identity,
    storage: Storage,
    /// Wait by polling (asked for, or a network file system).
    poll: bool,
    /// Whether writes are fsynced: asked for, and the file system is not memory-backed.
    sync: bool,
}

/// What an attempt hands to the taking of the lease.
#[derive(Default)]
struct Carry {
    /// LOCK's file as read under the mutex, kept open past our rename (local storage only).
    replaced: Option<Seen>,
    /// Our queue ticket, left under the mutex.
    ticket: Option<Ticket>,
    /// Our lease, serialised ahead of time.
    draft: Option<Draft>,
    /// The token we reserved in the high-water mark while next in line.
    reserved: Option<u64>,
}

/// A blocking acquirer's place in the FIFO queue, and what it prepares while it waits.
#[derive(Default)]
struct Queued {
    ticket: Option<Ticket>,
    observed: Observed,
    /// Our ticket was first in the queue when last judged under the mutex. Tickets are
    /// numbered above every ticket present, so it stays first for as long as it exists.
    head: bool,
    /// LOCK's file as last read (local file systems only), to read it again without opening.
    seen: Option<Seen>,
    /// Our lease, serialised ahead of the wake-up.
    draft: Option<Draft>,
    /// A token reserved in the high-water mark while we were next in line.
    reserved: Option<u64>,
}

impl Queued {
    /// Hands what we prepared to the taking of the lease.
    fn carry(&mut self, replaced: Option<Seen>) -> Carry {
        Carry {
            replaced,
            ticket: self.ticket.take(),
            draft: self.draft.take(),
            reserved: self.reserved.take(),
        }
    }
}

impl Acquirer {
    pub(crate) fn new(settings: LeaseBuilder) -> Acquirer {
        Acquirer {
            settings,
            resolved: None,
            mutex_file: None,
        }
    }

    /// Takes the lease if it is free (or stale) now; `Error::WouldBlock` if a live holder has it.
    pub fn try_acquire(&mut self) -> Result<LeaseGuard> {
        let ctx = self.ctx()?;
        let deadline = Instant::now() + ctx.timing.one_shot_mutex_wait();
        match self.one_shot(&ctx, deadline)? {
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

    pub(crate) fn acquire_until(&mut self, deadline: Option<Instant>) -> Result<LeaseGuard> {
        let ctx = self.ctx()?;
        let start = Instant::now();
        let timeout = |verdict| Error::Timeout {
            path: ctx.paths.lock.clone(),
            waited: start.elapsed(),
            verdict,
        };
        let mut mem = Memory::default();
        let mut waiter = Waiter::new(&ctx.paths, ctx.poll, ctx.timing.ttl);
        let mut q = Queued::default();
        let mut reported: Option<(String, State, Option<u64>)> = None;
        loop {
            let (v, predecessor) = match self.queued(&ctx, deadline, &mut mem, &mut q) {
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
                    let mut v = peek(&self.settings, &ctx, &mut mem);
                    v.behind = Some(format!("the lease mutex, held by {holder}"));
                    return Err(timeout(Box::new(v)));
                }
                Err(e) => return Err(e),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timeout(v));
            }
            let lease_id = v.lease.as_ref().map(|l| l.lease_id.clone());
            let key = (
                lease_id.unwrap_or_default(),
                v.state,
                predecessor.as_ref().map(|p| p.seq),
            );
            if reported.as_ref() != Some(&key) {
                report(&self.settings, &v);
                reported = Some(key);
            }
            if let Some(t) = q.ticket.as_mut() {
                t.beat();
            }
            match &predecessor {
                Some(p) => waiter.wait_turn(p, deadline),
                None => waiter.wait_lease(&v, q.seen.as_ref().map(|s| s.sig), deadline),
            }
        }
    }

    /// The settings resolved against LOCK's storage, reusing what earlier attempts resolved
    /// unless LOCK's directory path now leads elsewhere (unmounted, replaced).
    fn ctx(&mut self) -> Result<Ctx> {
        let s = &self.settings;
        let timing = s.timing()?;
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
                let paths = LockPaths::new(&s.path)?;
                let fs = fsinfo::inspect(&paths.dir);
                self.resolved = Some((paths.clone(), fs.clone()));
                (paths, fs)
            }
        };
        if let (Some(why), false) = (&fs.host_local_locks, s.allow_host_local_locks) {
            return Err(Error::UnsafeFileSystem {
                path: paths.lock.clone(),
                why: format!(
                    "{why}: another host could take the lease at the same time. Mount with \
                     local_lock=none (NFSv4 shares locks by default), or put the lock elsewhere"
                ),
            });
        }
        refuse_unshareable(&paths)?;
        let storage = fs.storage();
        Ok(Ctx {
            sync: storage.fsyncs(s.durable),
            timing,
            paths,
            me: s.identity.clone().unwrap_or_else(Identity::current),
            poll: s.poll || storage.network,
            storage,
        })
    }

    /// Takes the mutex, reusing the kept descriptor. Never waits silently: a mutex someone sits
    /// on is reported (naming who, by the kernel's word) as any other wait is, and a queued
    /// waiter's ticket keeps beating meanwhile.
    fn enter(
        &mut self,
        ctx: &Ctx,
        deadline: Option<Instant>,
        mut ticket: Option<&mut Ticket>,
    ) -> Result<MutexGuard> {
        let kept = self.mutex_file.take();
        let s = &self.settings;
        let policy = if s.take_over_hung {
            StuckPolicy::KillStopped
        } else {
            StuckPolicy::Report
        };
        let mut waiting = |w: MutexWait<'_>| match w {
            MutexWait::Beat => {
                if let Some(t) = ticket.as_deref_mut() {
                    t.beat();
                }
            }
            MutexWait::Blocked(who) if s.on_wait.is_some() => {
                let mut v = peek(s, ctx, &mut Memory::default());
                v.behind = Some(format!("the lease mutex, held by {who}"));
                report(s, &v);
            }
            MutexWait::Blocked(_) => {}
        };
        let net = ctx.storage.network;
        let ttl = ctx.timing.ttl;
        mutex::lock_with(
            kept,
            &ctx.paths,
            deadline,
            ttl,
            policy,
            Some(&mut waiting),
            net,
        )
    }

    /// One pass of a one-shot caller under the mutex: it never queues and never overtakes a
    /// live waiter.
    fn one_shot(&mut self, ctx: &Ctx, deadline: Instant) -> Result<Attempt> {
        let m = self.enter(ctx, Some(deadline), None)?;
        let net = ctx.storage.network;
        let (mut ahead, waiting_ahead) =
            queue::live_ahead(&ctx.paths, None, None, ctx.timing.ttl, net).or_else(degrade)?;
        let (content, replaced) = look(ctx, None)?;
        if let Some(l) = released(&content, &ahead) {
            let carry = Carry {
                replaced,
                ..Carry::default()
            };
            return self.take(ctx, m, Some(l), None, carry).map(taken);
        }
        let mut v = judge(&self.settings, ctx).judge(&content, &mut Memory::default());
        if ahead.is_empty() {
            if let Some(broke) = self.decide(ctx, &mut v, false)? {
                let carry = Carry {
                    replaced,
                    ..Carry::default()
                };
                return self.take(ctx, m, v.lease.as_ref(), broke, carry).map(taken);
            }
        } else {
            behind_queue(&mut v, waiting_ahead);
        }
        self.mutex_file = m.unlock();
        v.queue_ahead = waiting_ahead;
        Ok(Attempt::Busy(Box::new(v), ahead.pop()))
    }

    /// One pass of a blocking caller under the mutex: it may take the lease only at the head of
    /// the queue, and joins the queue when it cannot (and prepares its take while it waits).
    fn queued(
        &mut self,
        ctx: &Ctx,
        deadline: Option<Instant>,
        mem: &mut Memory,
        q: &mut Queued,
    ) -> Result<Attempt> {
        let m = self.enter(ctx, deadline, q.ticket.as_mut())?;
        let net = ctx.storage.network;
        if q.ticket.as_ref().is_some_and(|t| !t.still_queued(net)) {
            q.ticket = None; // skipped while frozen: queue again at the back
            q.head = false;
        }
        let mine = q.ticket.as_ref().map(|t| t.seq);
        let (mut ahead, waiting_ahead) = match mine {
            Some(_) if q.head => Ok((Vec::new(), 0)),
            _ => queue::live_ahead(&ctx.paths, mine, Some(&mut q.observed), ctx.timing.ttl, net),
        }
        .or_else(degrade)?;
        let (content, replaced) = look(ctx, q.seen.take())?;
        if let Some(l) = released(&content, &ahead) {
            let carry = q.carry(replaced);
            return self.take(ctx, m, Some(l), None, carry).map(taken);
        }
        let mut v = judge(&self.settings, ctx).judge(&content, mem);
        if ahead.is_empty() {
            if let Some(broke) = self.decide(ctx, &mut v, true)? {
                let carry = q.carry(replaced);
                return self.take(ctx, m, v.lease.as_ref(), broke, carry).map(taken);
            }
        } else {
            behind_queue(&mut v, waiting_ahead);
        }
        self.join(ctx, &m, q, replaced, &v, ahead.is_empty())?;
        self.mutex_file = m.unlock();
        self.prepare(ctx, q);
        v.queue_ahead = waiting_ahead;
        Ok(Attempt::Busy(Box::new(v), ahead.pop()))
    }

    /// Whether a lease judged `v` (with nobody queued ahead) may be taken: `Some(broke)` — what
    /// we broke to get it, if anything — after stopping what is left of a stale or hung job
    /// (verified). What may not be stopped (e.g. an old job's process that cannot be checked)
    /// makes a blocking caller wait for it to go, saying why, and a one-shot caller refuse.
    fn decide(
        &self,
        ctx: &Ctx,
        v: &mut Verdict,
        blocking: bool,
    ) -> Result<Option<Option<Verdict>>> {
        Ok(match v.state {
            State::Free => Some(None),
            State::Held => None,
            State::Hung if !self.settings.take_over_hung => None,
            State::Stale | State::Hung => match takeover::stop_old_job(v, &ctx.paths) {
                Ok(_) => {
                    // A writer that died mid-write left at most a temp file: remove it now.
                    fsio::remove_leftover_temps(&ctx.paths);
                    Some(Some(v.clone()))
                }
                Err(why) if blocking => {
                    v.reason = format!("{}; not taking over: {why}", v.reason);
                    None
                }
                Err(why) => return Err(refused(ctx, v, &why)),
            },
        })
    }

    /// Under the mutex, for a blocking caller that cannot take the lease yet: keeps LOCK's file
    /// (local storage) with our waiting hint on it, takes a ticket if we have none, and, next
    /// in line, reserves our token durably so that taking the lease needs no write of the
    /// high-water mark.
    fn join(
        &self,
        ctx: &Ctx,
        m: &MutexGuard,
        q: &mut Queued,
        replaced: Option<Seen>,
        v: &Verdict,
        first: bool,
    ) -> Result<()> {
        let net = ctx.storage.network;
        if !net {
            if let Some(seen) = &replaced {
                handover::announce_waiting(seen);
            }
            q.seen = replaced;
        }
        if q.ticket.is_none() {
            // Without a ticket (e.g. a full or read-only directory) we still wait, unordered.
            let argv = self.settings.command.clone().unwrap_or_default();
            let clock = self.settings.clock.as_ref();
            q.ticket = Ticket::take(&ctx.paths, &ctx.me, clock, &argv, net)
                .map(Some)
                .or_else(degrade)?;
        }
        q.head = q.ticket.is_some() && first;
        if q.head && q.reserved.is_none() {
            let prev = v.lease.as_ref().map_or(0, |l| l.token);
            if let Ok(hwm) = m.high_water()
                && let Ok(t) = next_token(hwm, prev)
                && m.set_high_water(t, ctx.sync).is_ok()
            {
                q.reserved = Some(t);
            }
        }
        Ok(())
    }

    /// After the mutex, while we wait: our lease serialised now rather than after the wake-up,
    /// and, next in line on local storage, written into a file of its own too, so that taking
    /// the lease is one write and one rename.
    fn prepare(&self, ctx: &Ctx, q: &mut Queued) {
        if q.draft.is_none() {
            let now = format_rfc3339(self.settings.clock.wall());
            q.draft = Draft::new(self.settings.new_lease(&ctx.me, &ctx.timing, &now));
        }
        if !ctx.storage.network
            && q.head
            && let (Some(t), Some(d)) = (q.ticket.as_mut(), q.draft.as_ref())
        {
            t.prepare(d.bytes());
        }
    }

    /// Takes the lease under the mutex `m`: the token (reserved, or the next one, made durable
    /// first), our lease written (through the prepared file, or a temp file) and renamed over
    /// LOCK, the queue left, the mutex let go, and the guard started.
    fn take(
        &self,
        ctx: &Ctx,
        m: MutexGuard,
        prev: Option<&Lease>,
        broke: Option<Verdict>,
        carry: Carry,
    ) -> Result<LeaseGuard> {
        let s = &self.settings;
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
        let now = format_rfc3339(s.clock.wall());
        let (lease, bytes) = match draft {
            Some(d) => d.finish(token, &now),
            None => {
                let mut lease = s.new_lease(&ctx.me, &ctx.timing, &now);
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
        LeaseGuard::start(Start {
            paths: ctx.paths.clone(),
            timing: ctx.timing,
            clock: Arc::clone(&s.clock),
            lease,
            bytes,
            started,
            on_lost: s.on_lost.clone(),
            broke,
            witness,
            written: Some(written),
            storage: ctx.storage,
            sync: ctx.sync,
            replaced: replaced.map(|s| s.file),
            mark,
        })
    }
}

fn taken(g: LeaseGuard) -> Attempt {
    Attempt::Taken(Box::new(g))
}

/// Reads LOCK under the mutex (through `seen`, LOCK's file kept from the last look, when LOCK
/// still names it). Never keeps LOCK open on a network file system: an NFS client that renames
/// over a file it has open keeps the old file alive on the server (a silly rename), and another
/// host whose cached name still leads to it would read the old lease instead of getting ESTALE
/// and looking the name up again (see `fsio::read_lock`).
fn look(ctx: &Ctx, seen: Option<Seen>) -> Result<(LockContent, Option<Seen>)> {
    let (content, replaced) = fsio::read_lock_keep(&ctx.paths, seen)?;
    Ok((content, replaced.filter(|_| !ctx.storage.network)))
}

/// A released lease is free to anyone, wherever its holder lives, once nobody is queued ahead:
/// no judgement needed (the common case when a waiter is handed the lease).
fn released<'c>(content: &'c LockContent, ahead: &[Ahead]) -> Option<&'c Lease> {
    match content {
        LockContent::Lease(l, _) if ahead.is_empty() && l.state == LeaseState::Released => Some(l),
        _ => None,
    }
}

/// A free or stale lease with live waiters queued ahead is theirs first.
fn behind_queue(v: &mut Verdict, waiting_ahead: usize) {
    if v.state == State::Free || v.state == State::Stale {
        v.reason = format!("{}, but {waiting_ahead} waiter(s) queued ahead", v.reason);
        v.state = State::Held;
        v.behind = Some(format!("{waiting_ahead} queued waiter(s)"));
    }
}

fn judge<'a>(s: &'a LeaseBuilder, ctx: &'a Ctx) -> Judge<'a> {
    Judge {
        paths: &ctx.paths,
        me: &ctx.me,
        clock: s.clock.as_ref(),
        wall_skew: s.wall_skew,
        persist: true,
    }
}

/// A judgement without the mutex and without recording anything (to explain a wait).
fn peek(s: &LeaseBuilder, ctx: &Ctx, mem: &mut Memory) -> Verdict {
    let mut judge = judge(s, ctx);
    judge.persist = false;
    let content = fsio::read_lock(&ctx.paths).unwrap_or(LockContent::Missing);
    judge.judge(&content, mem)
}

/// Tells the caller's `on_wait` what we wait for.
fn report(s: &LeaseBuilder, v: &Verdict) {
    if let Some(cb) = &s.on_wait {
        (cb.lock().unwrap_or_else(PoisonError::into_inner))(v);
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
