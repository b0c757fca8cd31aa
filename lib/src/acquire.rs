//! Taking a lease: the running state of acquisitions and the protocol of one attempt.
//!
//! Owns: one acquisition attempt under the mutex (look at the queue, read, judge, stop a
//! verified hung or leftover job, bump the durable token high-water mark, write our lease
//! atomically and durably), in two shapes sharing those steps — the one-shot caller's
//! (`try_acquire`: never queues, never overtakes a live waiter) and the blocking caller's (takes
//! the lease only at the head of the queue, joins it otherwise, and prepares its take while it
//! waits) — and the loop that repeats the blocking attempt, all against the [`Store`] traits.
//! What is kept between attempts lives here or in the store's types (PROTOCOL.md §4, §6):
//! LOCK's resolved store and the store's `Kept` (the mutex descriptor) in [`Acquirer`]; the
//! place in line (ticket, LOCK descriptor, prepared lease, reserved token), the observations
//! and the serialised lease for one blocking acquisition.
//! Must never: take over a lease judged held; start a guard before its token and lease are
//! durable; take over while a verified process of the old job still runs; let a one-shot
//! caller queue or overtake a live waiter.

use crate::cancel::Cancel;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::builder::LeaseBuilder;
use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::fsinfo::{self, FsInfo};
use crate::fsio::LockContent;
use crate::guard::{LeaseGuard, Start};
use crate::identity::Identity;
use crate::judge::Judge;
use crate::observe::Memory;
use crate::paths::LockPaths;
use crate::record::{Draft, Lease, LeaseState};
use crate::store::StuckPolicy;
use crate::store::file::FileStore;
use crate::store::resolved::Resolved;
use crate::store::{Joiner, Store, Took};
use crate::takeover;
use crate::timing::Timing;
use crate::verdict::{State, Verdict};

mod slotted;

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
    /// LOCK's store (resolved paths and storage facts), worked out on the first attempt and
    /// kept, with the file-system facts it was made from.
    resolved: Option<(FileStore, FsInfo)>,
    /// What the store keeps between attempts (the mutex file, open).
    kept: <FileStore as Store>::Kept,
}

impl std::fmt::Debug for Acquirer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquirer")
            .field("settings", &self.settings)
            .field(
                "lock",
                &self.resolved.as_ref().map(|(s, _)| &s.paths().lock),
            )
            .finish_non_exhaustive()
    }
}

enum Attempt<S: Store> {
    Taken(Box<Start<S::Holding>>),
    /// Not ours yet: what we saw, and the contender ahead of us in line we wait behind.
    Busy(Box<Verdict>, Option<S::Ahead>),
}

/// How many lost races in a row a one-shot caller looks again after before it gives up as
/// if the lock were held: each lost race is another contender's write landing first.
const RACES: u32 = 100;

/// What one acquisition works with, resolved from the settings and the lock's store.
struct Ctx<'a, S> {
    s: &'a LeaseBuilder,
    store: S,
    timing: Timing,
    me: Identity,
    /// Wait by polling (asked for, or a network file system).
    poll: bool,
}

/// A blocking acquirer's state for one acquisition: its place in line and its lease,
/// serialised ahead of the wake-up.
struct Queued<S: Store> {
    place: S::Place,
    draft: Option<Draft>,
    /// What this process saw of each holder file of a shared lock (`slots.rs`).
    holders: Vec<Memory>,
}

impl LeaseBuilder {
    /// The running state of acquisitions with these settings (see [`Acquirer`]): resolves
    /// LOCK's path on its first attempt and keeps it, with the mutex file, for the next ones.
    pub fn acquirer(&self) -> Acquirer {
        Acquirer::new(self.clone())
    }

    /// Takes the lease if it is free (or stale) now; `Error::WouldBlock` if a live holder has it.
    pub fn try_acquire(&self) -> Result<LeaseGuard> {
        self.with_cached(|a| a.try_acquire())
    }

    /// Waits as long as it takes.
    pub fn acquire(&self) -> Result<LeaseGuard> {
        self.with_cached(|a| a.acquire())
    }

    /// Waits at most `timeout`; `Error::Timeout` after that.
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<LeaseGuard> {
        self.with_cached(|a| a.acquire_until(Some(Instant::now() + timeout)))
    }

    /// Runs `f` on an [`Acquirer`] seeded with what this builder's earlier calls resolved (so
    /// that a program calling `try_acquire` on one builder in a loop pays for resolving LOCK's
    /// path and reading the mount table once, as with an `Acquirer`), and keeps it for the next.
    fn with_cached<T>(&self, f: impl FnOnce(&mut Acquirer) -> Result<T>) -> Result<T> {
        let cached = self.cache.lock().ok().and_then(|mut c| c.take());
        let mut a = Acquirer::new(self.clone());
        if let Some(r) = cached {
            let storage = r.fs.storage();
            let store = FileStore::new(r.paths, storage, storage.fsyncs(self.durable));
            a.resolved = Some((store, r.fs));
            a.kept = r.kept;
        }
        let out = f(&mut a);
        if let Some((store, fs)) = a.resolved.take()
            && let Ok(mut c) = self.cache.lock()
        {
            *c = Some(Resolved {
                paths: store.paths().clone(),
                fs,
                kept: std::mem::take(&mut a.kept),
            });
        }
        out
    }
}

impl Acquirer {
    pub(crate) fn new(settings: LeaseBuilder) -> Acquirer {
        Acquirer {
            settings,
            resolved: None,
            kept: Default::default(),
        }
    }

    /// Takes the lease if it is free (or stale) now; `Error::WouldBlock` if a live holder has it.
    pub fn try_acquire(&mut self) -> Result<LeaseGuard> {
        if let Some(r) = crate::store::acquire_elsewhere(&self.settings, None, true) {
            return r;
        }
        let store = self.store()?;
        let ctx = ctx(&self.settings, store)?;
        try_once(&ctx, &mut self.kept)
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
        if let Some(r) = crate::store::acquire_elsewhere(&self.settings, deadline, false) {
            return r;
        }
        let store = self.store()?;
        let ctx = ctx(&self.settings, store)?;
        blocking(&ctx, &mut self.kept, deadline).and_then(LeaseGuard::start)
    }
}

/// Takes the lease on a lock kept in `store` (a store other than a lock file: its
/// `Store` implementation, driven by the same loop as a file's): at once or not at all
/// (`one_shot`), or waiting until `deadline` (for ever with `None`).
#[cfg_attr(not(feature = "s3"), allow(dead_code))]
pub(crate) fn through<S: Store>(
    s: &LeaseBuilder,
    store: S,
    deadline: Option<Instant>,
    one_shot: bool,
) -> Result<LeaseGuard> {
    let ctx = ctx(s, store)?;
    let mut kept = S::Kept::default();
    if one_shot {
        try_once(&ctx, &mut kept)
    } else {
        blocking(&ctx, &mut kept, deadline).and_then(LeaseGuard::start)
    }
}

/// The one-shot acquisition: one attempt (looked at again after a lost race), never queued.
fn try_once<S: Store>(ctx: &Ctx<'_, S>, kept: &mut S::Kept) -> Result<LeaseGuard> {
    crate::grave::reap(); // as in `blocking`
    let deadline = Instant::now() + ctx.timing.one_shot_mutex_wait();
    let mut races = 0;
    loop {
        // A stale NFS handle anywhere in an attempt (a file another host just replaced) is a
        // race: the whole attempt is made again with fresh lookups (bounded), never an error.
        match crate::fsio::again_if_stale(|| one_shot(ctx, kept, deadline)) {
            Ok(Attempt::Taken(start)) => return LeaseGuard::start(*start),
            // A write inside the section lost a race (a store whose section is a
            // compare-and-swap): look again.
            Err(Error::Raced { .. }) if races < RACES => races += 1,
            Err(Error::Raced { .. }) => {
                let mut v = peek(ctx, &mut Memory::default());
                v.reason = format!("{}; lost {RACES} races for it in a row", v.reason);
                v.state = State::Held;
                return Err(Error::WouldBlock {
                    path: ctx.store.binding().lock().to_path_buf(),
                    verdict: Box::new(v),
                });
            }
            Ok(Attempt::Busy(v, _)) => {
                return Err(Error::WouldBlock {
                    path: ctx.store.binding().lock().to_path_buf(),
                    verdict: v,
                });
            }
            Err(e) => return Err(e),
        }
    }
}

impl Acquirer {
    /// LOCK's store, reusing what earlier attempts resolved unless LOCK's directory path now
    /// leads elsewhere (unmounted, replaced). Refuses storage that cannot make the lock safe,
    /// and a sticky directory where another user's files could never be taken over.
    fn store(&mut self) -> Result<FileStore> {
        let s = &self.settings;
        if self
            .resolved
            .as_ref()
            .is_some_and(|(st, _)| !matches!(st.paths().dir_moved(), Ok(false)))
        {
            self.resolved = None;
            self.kept = Default::default();
        }
        let (store, fs) = match &self.resolved {
            Some(r) => r.clone(),
            None => {
                let paths = LockPaths::new(&s.path)?;
                let fs = fsinfo::inspect(&paths.dir);
                let storage = fs.storage();
                let store = FileStore::new(paths, storage, storage.fsyncs(s.durable));
                self.resolved = Some((store.clone(), fs.clone()));
                (store, fs)
            }
        };
        let paths = store.paths();
        if let (Some(why), false) = (&fs.host_local_locks, s.allow_host_local_locks) {
            return Err(Error::UnsafeFileSystem {
                path: paths.lock.clone(),
                why: format!(
                    "{why}: another host could take the lease at the same time. Mount with \
                     local_lock=none (NFSv4 shares locks by default), or put the lock elsewhere"
                ),
            });
        }
        refuse_unshareable(paths)?;
        Ok(store)
    }
}

fn ctx<S: Store>(s: &LeaseBuilder, store: S) -> Result<Ctx<'_, S>> {
    let poll = s.poll || store.polls();
    s.want.validate()?;
    Ok(Ctx {
        s,
        timing: s.timing()?,
        me: s.identity.clone().unwrap_or_else(Identity::current),
        poll,
        store,
    })
}

/// The blocking acquisition: attempts, and waits between them, until the lease is ours or the
/// deadline passes.
fn blocking<S: Store>(
    ctx: &Ctx<'_, S>,
    kept: &mut S::Kept,
    deadline: Option<Instant>,
) -> Result<Start<S::Holding>> {
    // Files an earlier holding of ours let go of are closed now, before we look at the lock:
    // one of them may be the file the holder after us replaced and keeps, which it asks at
    // its release whether anyone else has open (`klock::open_only_here`) before reading
    // /proc/locks. The holder after us keeps it open too, so this close frees nothing.
    crate::grave::reap();
    let start = Instant::now();
    let timeout = |verdict| Error::Timeout {
        path: ctx.store.binding().lock().to_path_buf(),
        waited: start.elapsed(),
        verdict,
    };
    let mut mem = Memory::default();
    let cancel = ctx.s.cancel.as_ref();
    let cancelled = || Error::Cancelled {
        path: ctx.store.binding().lock().to_path_buf(),
        waited: start.elapsed(),
    };
    let mut waker = ctx.store.waker(ctx.poll, ctx.timing.ttl, cancel.cloned());
    let mut warmed = false;
    let mut q = Queued::<S> {
        place: Default::default(),
        draft: None,
        holders: Vec::new(),
    };
    loop {
        // Checked before each attempt: a cancel that came while we waited (or before we
        // started) takes nothing; the queue ticket goes with `q`.
        if cancel.is_some_and(Cancel::is_cancelled) {
            return Err(cancelled());
        }
        // As in `try_acquire`: a stale NFS handle makes the attempt again, never an error.
        let attempt = crate::fsio::again_if_stale(|| queued(ctx, kept, deadline, &mut mem, &mut q));
        let (mut v, ahead) = match attempt {
            Ok(Attempt::Taken(start)) => return Ok(*start),
            Ok(Attempt::Busy(v, ahead)) => (v, ahead),
            Err(Error::Raced { .. }) => continue,
            // A networked store none of whose endpoints can serve us now (down, frozen,
            // without a quorum): asked again after a wait, until the deadline, saying so.
            Err(e @ Error::Unavailable { .. }) => {
                // Nothing could be read about the lease: the line names only what we wait for.
                let mut v = judge(ctx).judge(&LockContent::Missing, &mut Memory::default());
                v.reason.clear();
                v.behind = Some(format!("the lock's store, which cannot serve us ({e})"));
                (Box::new(v), None)
            }
            // The deadline ran out while another process was inside the mutex: that is a
            // timeout like any other, explained by who sits on the mutex.
            Err(Error::MutexStuck { holder, .. })
                if deadline.is_some_and(|d| Instant::now() >= d) =>
            {
                let mut v = peek(ctx, &mut mem);
                v.behind = Some(format!("the lease mutex, held by {holder}"));
                return Err(timeout(Box::new(v)));
            }
            Err(e) => return Err(e),
        };
        let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
        // The waiter ahead is named by the kernel's word (a file store reads /proc/locks, which
        // holds up every lock operation on the host while the kernel lists them) only for
        // someone who reads it: the caller's `on_wait`, or the timeout's error.
        if let Some(a) = ahead
            .as_ref()
            .filter(|_| timed_out || ctx.s.on_wait.is_some())
        {
            v.behind = Some(ctx.store.describe(a));
        }
        if timed_out {
            return Err(timeout(v));
        }
        // Every look is reported (a display keeps its heartbeat age and "held" current from
        // it); the caller decides which changes deserve a new line.
        report(ctx.s, &v);
        if !warmed {
            // While we wait, not after the wake-up: the guard's threads (see `keeper::warm`).
            crate::keeper::warm();
            warmed = true;
        }
        ctx.store
            .wait(&mut waker, &mut q.place, ahead.as_ref(), &v, deadline);
    }
}

/// Enters the store's exclusive section. Never waits silently: a section someone sits on is
/// reported (naming who, by the kernel's word) as any other wait is, and a queued waiter's
/// place is kept alive meanwhile.
fn enter<S: Store>(
    ctx: &Ctx<'_, S>,
    kept: &mut S::Kept,
    deadline: Option<Instant>,
    place: Option<&mut S::Place>,
) -> Result<S::Section> {
    let policy = if ctx.s.take_over_hung {
        StuckPolicy::KillStopped
    } else {
        StuckPolicy::Report
    };
    let mut blocked = |who: &str| {
        if ctx.s.on_wait.is_some() {
            let mut v = peek(ctx, &mut Memory::default());
            v.behind = Some(format!("the lease mutex, held by {who}"));
            report(ctx.s, &v);
        }
    };
    let ttl = ctx.timing.ttl;
    ctx.store
        .enter(kept, deadline, ttl, policy, place, Some(&mut blocked))
}

/// One pass of a one-shot caller inside the section: it never queues and never overtakes a
/// live waiter.
fn one_shot<S: Store>(
    ctx: &Ctx<'_, S>,
    kept: &mut S::Kept,
    deadline: Instant,
) -> Result<Attempt<S>> {
    let section = enter(ctx, kept, Some(deadline), None)?;
    let (ahead, waiting_ahead) = ctx.store.ahead(&section, None, ctx.timing.ttl)?;
    let mut place = S::Place::default();
    let content = ctx.store.current(&section, &mut place)?;
    if let Some(took) = ctx.store.landed(&section, &content) {
        return Ok(taken(ctx, took, None));
    }
    if let Some((left, ttl)) = ctx.store.settling(&section) {
        let mut v = judge(ctx).judge(&content, &mut Memory::default());
        v.settling(left, ttl);
        ctx.store.leave(section, kept);
        v.queue_ahead = waiting_ahead;
        return Ok(Attempt::Busy(Box::new(v), ahead));
    }
    if crate::slots::involved(ctx.s.want, &content, &ctx.store) {
        let mut mem = Memory::default();
        let line = slotted::Line {
            kept,
            ahead,
            waiting_ahead,
        };
        return slotted::attempt(ctx, section, place, content, line, &mut mem, None);
    }
    let mut content = content;
    let mut v = loop {
        let unseen = holder_unseen(ctx, &section, &content);
        let foreign = foreign_lock(ctx, &section, &content, unseen);
        if !unseen
            && foreign.is_none()
            && let Some(l) = released(&content, ahead.is_none())
        {
            return take(ctx, section, place, Some(l), None, None);
        }
        let mut v = judge(ctx).judge(&content, &mut Memory::default());
        if unseen {
            v.holder_unseen();
        } else if let Some(who) = foreign {
            v.kernel_locked(who);
        } else if ahead.is_none() {
            if let Some(now) = released_since(ctx, &section, &mut place, &v)? {
                content = now;
                continue;
            }
            if let Some(broke) = decide(ctx, &mut v, false)? {
                match foreign_after_stop(ctx, &section, &broke) {
                    None => return take(ctx, section, place, v.lease.as_ref(), broke, None),
                    Some(who) => v.kernel_locked(who),
                }
            }
        } else {
            behind_queue(&mut v, waiting_ahead);
        }
        break v;
    };
    ctx.store.leave(section, kept);
    v.queue_ahead = waiting_ahead;
    Ok(Attempt::Busy(Box::new(v), ahead))
}

/// One pass of a blocking caller inside the section: it may take the lease only first in
/// line, and joins the line when it cannot (and prepares its take while it waits).
fn queued<S: Store>(
    ctx: &Ctx<'_, S>,
    kept: &mut S::Kept,
    deadline: Option<Instant>,
    mem: &mut Memory,
    q: &mut Queued<S>,
) -> Result<Attempt<S>> {
    let section = enter(ctx, kept, deadline, Some(&mut q.place))?;
    let (ahead, waiting_ahead) = ctx
        .store
        .ahead(&section, Some(&mut q.place), ctx.timing.ttl)?;
    let content = ctx.store.current(&section, &mut q.place)?;
    if let Some(took) = ctx.store.landed(&section, &content) {
        return Ok(taken(ctx, took, None));
    }
    if let Some((left, ttl)) = ctx.store.settling(&section) {
        // LOCK's disk came back as a new device in this boot: nothing is granted before the
        // grace is over (PROTOCOL.md §8, *Durable per mount epoch*).
        let mut v = judge(ctx).judge(&content, mem);
        v.settling(left, ttl);
        return line_up(ctx, section, kept, q, v, ahead, waiting_ahead);
    }
    if crate::slots::involved(ctx.s.want, &content, &ctx.store) {
        let place = S::Place::default(); // the take uses q's
        let line = slotted::Line {
            kept,
            ahead,
            waiting_ahead,
        };
        return slotted::attempt(ctx, section, place, content, line, mem, Some(q));
    }
    let mut content = content;
    let v = loop {
        let unseen = holder_unseen(ctx, &section, &content);
        let foreign = foreign_lock(ctx, &section, &content, unseen);
        if !unseen
            && foreign.is_none()
            && let Some(l) = released(&content, ahead.is_none())
        {
            let place = std::mem::take(&mut q.place);
            return take(ctx, section, place, Some(l), None, q.draft.take());
        }
        let mut v = judge(ctx).judge(&content, mem);
        if unseen {
            v.holder_unseen();
        } else if let Some(who) = foreign {
            v.kernel_locked(who);
        } else if ahead.is_none() {
            if let Some(now) = released_since(ctx, &section, &mut q.place, &v)? {
                content = now;
                continue;
            }
            if let Some(broke) = decide(ctx, &mut v, true)? {
                match foreign_after_stop(ctx, &section, &broke) {
                    None => {
                        let place = std::mem::take(&mut q.place);
                        return take(ctx, section, place, v.lease.as_ref(), broke, q.draft.take());
                    }
                    Some(who) => v.kernel_locked(who),
                }
            }
        } else {
            behind_queue(&mut v, waiting_ahead);
        }
        break v;
    };
    line_up(ctx, section, kept, q, v, ahead, waiting_ahead)
}

/// Inside the section, for a blocking caller that cannot take the lease yet (judged `v`):
/// joins the line (or keeps its place), leaves the section, and serialises its lease while it
/// waits.
fn line_up<S: Store>(
    ctx: &Ctx<'_, S>,
    section: S::Section,
    kept: &mut S::Kept,
    q: &mut Queued<S>,
    mut v: Verdict,
    ahead: Option<S::Ahead>,
    waiting_ahead: usize,
) -> Result<Attempt<S>> {
    let token = v.lease.as_ref().map_or(0, |l| l.token);
    let command = ctx.s.command.clone().unwrap_or_default();
    let clock = ctx.s.clock.as_ref();
    let who = Joiner {
        me: &ctx.me,
        clock,
        command: &command,
    };
    let first = ahead.is_none();
    ctx.store.join(&section, &mut q.place, token, first, who)?;
    ctx.store.leave(section, kept);
    // Serialised now, while we wait, rather than after the wake-up (with the history a
    // hand-over from the holder we wait for would carry: `ending.rs`).
    let history = crate::ending::speculate(v.lease.as_ref());
    if q.draft
        .as_ref()
        .is_none_or(|d| d.lease().history != history)
    {
        let now = format_rfc3339(clock.wall());
        let mut lease = ctx.s.new_lease(&ctx.me, &ctx.timing, &now);
        lease.history = history;
        q.draft = Draft::new(lease);
    }
    if let Some(d) = &q.draft {
        ctx.store.prepare(&mut q.place, d.bytes());
    }
    v.queue_ahead = waiting_ahead;
    Ok(Attempt::Busy(Box::new(v), ahead))
}

/// Whether a lease judged `v` (with nobody queued ahead) may be taken: `Some(broke)` — what
/// we broke to get it, if anything — after stopping what is left of a stale or hung job
/// (verified). What may not be stopped (e.g. an old job's process that cannot be checked)
/// makes a blocking caller wait for it to go, saying why, and a one-shot caller refuse.
/// Inside the section: whether LOCK says the lock is free (missing, emptied, released) while a
/// holder of this lock still holds its kernel mark — its record was removed or replaced under
/// it (by hand, a cleanup job, another user): it notices and stops its command, and nobody may
/// start before it has (`Store::marked`).
/// An exclusive contender also never enters while a shared or slotted holder holds its
/// counted mark, whatever LOCK says (a directory writer can replace it, PROTOCOL.md §13).
/// No mark of any kind (`Store::no_marks`, one look) answers both questions at once: the
/// usual case at a hand-over, whose holder dropped its mark before its release.
fn holder_unseen<S: Store>(ctx: &Ctx<'_, S>, section: &S::Section, content: &LockContent) -> bool {
    if ctx.store.no_marks(section) {
        return false;
    }
    ctx.store.shared_holders(section, 1) > 0 || exclusive_unseen(ctx, section, content)
}

/// [`holder_unseen`] for an exclusive holder's mark alone (by token, from the one LOCK shows).
fn exclusive_unseen<S: Store>(
    ctx: &Ctx<'_, S>,
    section: &S::Section,
    content: &LockContent,
) -> bool {
    let from = match content {
        LockContent::Missing | LockContent::Empty => 0,
        LockContent::Lease(l, _) if l.state == crate::record::LeaseState::Released => l.token,
        LockContent::Lease(..) => return false,
    };
    ctx.store.marked(section, from)
}

/// Inside the section, when LOCK's record would let us in (missing, emptied, released): who
/// holds a kernel lock on LOCK's own file, if another program does (`Store::kernel_locked`:
/// util-linux flock(1) on the same file). A record that names a holder is judged as ever.
fn foreign_lock<S: Store>(
    ctx: &Ctx<'_, S>,
    section: &S::Section,
    content: &LockContent,
    unseen: bool,
) -> Option<String> {
    let free = match content {
        LockContent::Missing => return None, // no file, no lock on it
        LockContent::Empty => true,
        LockContent::Lease(l, _) => l.state == crate::record::LeaseState::Released,
    };
    (free && !unseen)
        .then(|| ctx.store.kernel_locked(section, None))
        .flatten()
}

/// Inside the section, once a stale or hung holder of this host had its job stopped (`broke`
/// says what we broke): who holds a kernel lock on LOCK's own file, if anyone does. A leasehold holder
/// flocks its file for the whole holding (PROTOCOL.md §10), so util-linux flock(1) blocked
/// behind it takes that lock when the holder dies — and runs, while LOCK still names the dead
/// holder's record. Taking over then would rename our lease over the file flock(1) holds.
/// (A holder whose job was just stopped has let go of its flock with its death.)
fn foreign_after_stop<S: Store>(
    ctx: &Ctx<'_, S>,
    section: &S::Section,
    broke: &Option<Verdict>,
) -> Option<String> {
    let v = broke.as_ref()?;
    // Only a holder of this host (same host name, boot and pid namespace): one judged stale by
    // observation alone may be frozen on this very kernel in another pid namespace (a
    // container), keeping its own flock, which nothing here can tell from flock(1)'s.
    if !v.same_host {
        return None;
    }
    // A hung holder's job was stopped, but the frozen holder itself is left alone (§7): its
    // own flock on LOCK's file is no other program's.
    let frozen = v.lease.as_ref().filter(|_| v.state == State::Hung);
    ctx.store.kernel_locked(section, frozen)
}

/// Inside the section, before a lease judged stale or hung is taken over: LOCK read again, and
/// what it holds now if its holder has released it since it was read. A holder releases in
/// place (one `fchmod`, outside the section, by design) and exits: between our read of its
/// held record and the judgement that then finds its processes gone. The lease is then taken
/// as released — its ending `released`, not `died` (`ending.rs`). Exclusion never depended on
/// this: a released lease and a dead holder's are both free.
fn released_since<S: Store>(
    ctx: &Ctx<'_, S>,
    section: &S::Section,
    place: &mut S::Place,
    v: &Verdict,
) -> Result<Option<LockContent>> {
    let Some(judged) = v
        .lease
        .as_ref()
        .filter(|_| matches!(v.state, State::Stale | State::Hung))
    else {
        return Ok(None);
    };
    if judged.state != LeaseState::Held {
        return Ok(None);
    }
    let now = ctx.store.current(section, place)?;
    Ok(match &now {
        LockContent::Lease(l, _)
            if l.state == LeaseState::Released && l.lease_id == judged.lease_id =>
        {
            Some(now)
        }
        _ => None,
    })
}

fn decide<S: Store>(
    ctx: &Ctx<'_, S>,
    v: &mut Verdict,
    blocking: bool,
) -> Result<Option<Option<Verdict>>> {
    Ok(match v.state {
        State::Free => Some(None),
        State::Held => None,
        State::Hung if !ctx.s.take_over_hung => None,
        State::Stale | State::Hung => match takeover::stop_old_job(v, ctx.store.binding()) {
            Ok(_) => {
                // A writer that died mid-write left at most a temp file: remove it now.
                ctx.store.clean_after_crash();
                Some(Some(v.clone()))
            }
            Err(why) if blocking => {
                v.reason = format!("{}; not taking over: {why}", v.reason);
                None
            }
            Err(why) => return Err(refused(ctx.store.binding().lock(), v, &why)),
        },
    })
}

/// Takes the lease, ending the section: the store picks the token and replaces the lease with
/// ours (from `draft`, serialised ahead of time, when there is one); the guard starts from what
/// it returns.
fn take<S: Store>(
    ctx: &Ctx<'_, S>,
    section: S::Section,
    place: S::Place,
    prev: Option<&Lease>,
    broke: Option<Verdict>,
    draft: Option<Draft>,
) -> Result<Attempt<S>> {
    // What the new record carries forward: how the holding before ended, the last start.
    let reason = broke.as_ref().map(|v| v.reason.as_str());
    let history = crate::ending::carried(prev, reason);
    let prev = prev.map_or(0, |l| l.token);
    take_with(
        ctx,
        &ctx.store,
        (section, place),
        prev,
        broke,
        draft,
        history,
    )
}

/// [`take`] into `store` (LOCK's, or a holder file's of a shared lock), above token `prev`.
fn take_in<S: Store>(
    ctx: &Ctx<'_, S>,
    store: &S,
    section: S::Section,
    place: S::Place,
    prev: u64,
    broke: Option<Verdict>,
    draft: Option<Draft>,
) -> Result<Attempt<S>> {
    let h = crate::ending::History::default();
    take_with(ctx, store, (section, place), prev, broke, draft, h)
}

/// [`take_in`], the new record carrying `history` (a draft serialised with another is not used).
fn take_with<S: Store>(
    ctx: &Ctx<'_, S>,
    store: &S,
    (section, place): (S::Section, S::Place),
    prev: u64,
    broke: Option<Verdict>,
    draft: Option<Draft>,
    history: crate::ending::History,
) -> Result<Attempt<S>> {
    let s = ctx.s;
    // A `--max-time` deadline counts from the acquisition time, known only now.
    let mut draft = draft.filter(|d| s.max_time.is_none() && d.lease().history == history);
    let mut make = |token: u64| {
        let now = format_rfc3339(s.clock.wall());
        match draft.take() {
            Some(d) => d.finish(token, &now),
            None => {
                let mut lease = s.new_lease(&ctx.me, &ctx.timing, &now);
                lease.token = token;
                lease.history = history.clone();
                lease.history.deadline = crate::ending::deadline(&now, s.max_time);
                let bytes = lease.to_bytes();
                (lease, bytes)
            }
        }
    };
    let took = store.take(section, place, prev, &mut make)?;
    Ok(taken(ctx, took, broke))
}

/// The attempt a take came out as: the guard's start once the lease is ours.
fn taken<S: Store>(ctx: &Ctx<'_, S>, took: Took<S::Holding>, broke: Option<Verdict>) -> Attempt<S> {
    let (lease, bytes, started, holding) = took;
    let s = ctx.s;
    Attempt::Taken(Box::new(Start {
        path: ctx.store.binding().lock().to_path_buf(),
        timing: ctx.timing,
        clock: std::sync::Arc::clone(&s.clock),
        lease,
        bytes,
        started,
        on_lost: s.on_lost.clone(),
        on_serve: s.on_serve.clone(),
        broke,
        holding,
    }))
}

/// A released lease is free to anyone, wherever its holder lives, once nobody is queued ahead:
/// no judgement needed (the common case when a waiter is handed the lease).
fn released(content: &LockContent, first: bool) -> Option<&Lease> {
    match content {
        LockContent::Lease(l, _) if first && l.state == LeaseState::Released => Some(l),
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

fn judge<'a, S: Store>(ctx: &'a Ctx<'a, S>) -> Judge<'a> {
    let mut j = ctx.store.judge(&ctx.me, ctx.s.clock.as_ref());
    j.wall_skew = ctx.s.wall_skew;
    j
}

/// A judgement outside the section and without recording anything (to explain a wait).
fn peek<S: Store>(ctx: &Ctx<'_, S>, mem: &mut Memory) -> Verdict {
    let mut judge = judge(ctx);
    judge.persist = false;
    let content = ctx.store.read().unwrap_or(LockContent::Missing);
    judge.judge(&content, mem)
}

/// Tells the caller's `on_wait` what we wait for.
fn report(s: &LeaseBuilder, v: &Verdict) {
    if let Some(cb) = &s.on_wait {
        (cb.lock().unwrap_or_else(std::sync::PoisonError::into_inner))(v);
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

fn refused(lock: &Path, v: &Verdict, why: &str) -> Error {
    Error::Refused {
        path: lock.to_path_buf(),
        why: format!("not taking over ({v}): {why}"),
    }
}
