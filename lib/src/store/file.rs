//! The lock-file store: leases kept in LOCK, beside its helper files (PROTOCOL.md §1–§6).
//!
//! Owns: how the [`Store`] contract is kept with files — the exclusive section is the flock
//! mutex (`mutex.rs`), reads and atomic replacement go through `fsio.rs`, the token sequence is
//! the mutex file's high-water mark, places in line are queue tickets (`queue.rs`), waiting is
//! inotify, pidfds and predecessor flocks (`wait.rs`), and the fast hand-over goes through
//! `handover.rs` — and what a file-store contender and holder keep open between steps (the
//! mutex descriptor, LOCK's descriptor, the ticket and its prepared lease, the reserved token;
//! the witness, the written and replaced files, the holder's mark).
//! Must never: keep LOCK open on a network file system beyond one read; write LOCK except by
//! renaming a complete record over it under the mutex, rewriting the header of our own record
//! after checking it is ours, or setting the released bit on it; reach a file except through
//! LOCK's directory descriptor.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard as StdGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Binding, Holding, Joiner, Ours, Release, Renewal, Store, StuckPolicy, ours};
use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::fsinfo::Storage;
use crate::fsio::{self, LockContent, Seen, Written};
use crate::handover;
use crate::loss::LossReason;
use crate::mutex::{self, MutexFile, MutexGuard, MutexWait};
use crate::paths::LockPaths;
use crate::queue::{self, Ahead, Observed, Ticket};
use crate::record::{Ending, Lease, LeaseState, MUTABLE_RANGE};
use crate::verdict::{Verdict, Waiting};
use crate::wait::Waiter;

mod origin;

/// Leases on one LOCK path.
#[derive(Debug, Clone)]
pub(crate) struct FileStore {
    paths: LockPaths,
    storage: Storage,
    /// Whether writes are fsynced.
    sync: bool,
    /// Whether a fresh mutex descriptor is opened read-write whatever the storage (a look by
    /// `status` or `break`, which never resolves the storage).
    rw_mutex: bool,
    /// A holder file's store (`origin.rs`): LOCK's paths, which name the lock and bind its jobs.
    origin: Option<LockPaths>,
}

/// A waiting contender's place in the queue, and what it keeps for its next look and its take.
#[derive(Debug, Default)]
pub(crate) struct Place {
    ticket: Option<Ticket>,
    observed: Observed,
    /// Our ticket was first in the queue when last judged under the mutex. Tickets are
    /// numbered above every ticket present, so it stays first for as long as it exists.
    head: bool,
    /// LOCK's file as last read (local file systems only): read again through it without
    /// opening, kept open past our rename when we take the lease, and carrying our waiting hint.
    seen: Option<Seen>,
    /// A token reserved in the high-water mark while we were next in line.
    reserved: Option<u64>,
}

impl FileStore {
    /// LOCK's path, its directory and its helper names.
    pub(crate) fn paths(&self) -> &LockPaths {
        &self.paths
    }

    /// The store of an acquirer, on storage it inspected.
    pub(crate) fn new(paths: LockPaths, storage: Storage, sync: bool) -> FileStore {
        FileStore {
            paths,
            storage,
            sync,
            rw_mutex: false,
            origin: None,
        }
    }

    /// The store of a look or a break (`status`, `break`): storage not inspected.
    pub(crate) fn looking(paths: LockPaths) -> FileStore {
        FileStore {
            paths,
            storage: Storage::default(),
            sync: true,
            rw_mutex: true,
            origin: None,
        }
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

/// The token after every one handed out: above the high-water mark and LOCK's own token.
fn next_token(hwm: u64, prev: u64) -> Result<u64> {
    hwm.max(prev)
        .checked_add(1)
        .ok_or_else(|| Error::Settings("fencing token space exhausted".into()))
}

impl Store for FileStore {
    type Kept = Option<MutexFile>;
    type Section = MutexGuard;
    type Place = Place;
    type Ahead = Ahead;
    type Waker = Waiter;
    type Holding = FileHolding;

    fn binding(&self) -> &dyn Binding {
        self
    }

    fn holder(&self, k: u32) -> FileStore {
        self.holder_file(k)
    }

    fn read(&self) -> Result<LockContent> {
        fsio::read_lock(&self.paths)
    }

    fn enter(
        &self,
        kept: &mut Option<MutexFile>,
        deadline: Option<Instant>,
        stuck_after: Duration,
        policy: StuckPolicy,
        mut place: Option<&mut Place>,
        mut blocked: Option<&mut dyn FnMut(&str)>,
    ) -> Result<MutexGuard> {
        // A look (no place, nobody to tell) waits without being told anything.
        let tell = place.is_some() || blocked.is_some();
        let mut waiting = |w: MutexWait<'_>| match w {
            MutexWait::Beat => {
                if let Some(t) = place.as_deref_mut().and_then(|p| p.ticket.as_mut()) {
                    t.beat();
                }
            }
            MutexWait::Blocked(who) => {
                if let Some(b) = blocked.as_deref_mut() {
                    b(who);
                }
            }
        };
        let waiting = tell.then_some(&mut waiting as &mut dyn FnMut(MutexWait<'_>));
        let write = self.rw_mutex || self.storage.network;
        let (paths, reuse) = (&self.paths, kept.take());
        mutex::lock_with(reuse, paths, deadline, stuck_after, policy, waiting, write)
    }

    fn leave(&self, section: MutexGuard, kept: &mut Option<MutexFile>) {
        *kept = section.unlock();
    }

    fn current(&self, _: &MutexGuard, place: &mut Place) -> Result<LockContent> {
        let (content, seen) = fsio::read_lock_keep(&self.paths, place.seen.take())?;
        // Never keep LOCK open on a network file system: an NFS client that renames over a
        // file it has open keeps the old file alive on the server (a silly rename), and another
        // host whose cached name still leads to it would read the old lease instead of getting
        // ESTALE and looking the name up again (see `fsio::read_lock`).
        place.seen = seen.filter(|_| !self.storage.network);
        Ok(content)
    }

    fn ahead(
        &self,
        _: &MutexGuard,
        place: Option<&mut Place>,
        ttl: Duration,
    ) -> Result<(Option<Ahead>, usize)> {
        let net = self.storage.network;
        let found = match place {
            None => queue::live_ahead(&self.paths, None, None, ttl, net),
            Some(p) => {
                if p.ticket.as_ref().is_some_and(|t| !t.still_queued(net)) {
                    p.ticket = None; // skipped while frozen: queue again at the back
                    p.head = false;
                }
                let mine = p.ticket.as_ref().map(|t| t.seq);
                match mine {
                    Some(_) if p.head => Ok((Vec::new(), 0)),
                    _ => queue::live_ahead(&self.paths, mine, Some(&mut p.observed), ttl, net),
                }
            }
        };
        let (mut ahead, count) = found.or_else(degrade)?;
        Ok((ahead.pop(), count))
    }

    fn describe(&self, ahead: &Ahead) -> String {
        // Named by who holds its flock, not by what the ticket says.
        format!("queued waiter #{}, {}", ahead.seq, ahead.who())
    }

    fn position(&self, ahead: &Ahead) -> u64 {
        ahead.seq
    }

    fn polls(&self) -> bool {
        self.storage.network
    }

    fn join(
        &self,
        m: &MutexGuard,
        place: &mut Place,
        current_token: u64,
        first: bool,
        who: Joiner<'_>,
    ) -> Result<()> {
        if let Some(seen) = &place.seen {
            handover::announce_waiting(seen);
        }
        if place.ticket.is_none() {
            // Without a ticket (e.g. a full or read-only directory) we still wait, unordered.
            let net = self.storage.network;
            place.ticket = Ticket::take(&self.paths, who.me, who.clock, who.command, net)
                .map(Some)
                .or_else(degrade)?;
        }
        place.head = place.ticket.is_some() && first;
        if place.head && place.reserved.is_none() {
            // Next in line: reserve our token now, durably, so that taking the lease after
            // the wake-up needs no write of the high-water mark (see `take`).
            if let Ok(hwm) = m.high_water()
                && let Ok(t) = next_token(hwm, current_token)
                && m.set_high_water(t, self.sync).is_ok()
            {
                place.reserved = Some(t);
            }
        }
        Ok(())
    }

    fn prepare(&self, place: &mut Place, lease: &[u8]) {
        // Next in line on a local file system: our lease in a file of its own, so that taking
        // the lease is one write and one rename.
        if !self.storage.network
            && place.head
            && let Some(t) = place.ticket.as_mut()
        {
            t.prepare(lease);
        }
    }

    fn take(
        &self,
        m: MutexGuard,
        place: Place,
        prev_token: u64,
        lease: &mut dyn FnMut(u64) -> (Lease, Vec<u8>),
    ) -> Result<(Lease, Vec<u8>, Instant, FileHolding)> {
        let Place {
            seen: replaced,
            mut ticket,
            reserved,
            ..
        } = place;
        let hwm = m.high_water()?;
        let token = match reserved {
            // Nobody reserved or used a token since ours: it is still above every token
            // handed out, and already durable in the high-water mark.
            Some(t) if hwm == t && prev_token < t => t,
            _ => {
                let t = next_token(hwm, prev_token)?;
                m.set_high_water(t, self.sync)?;
                t
            }
        };
        let (lease, bytes) = lease(token);
        // Our holder's mark, before the lease becomes visible (see [`holder_mark`]).
        let mark = holder_mark(&self.paths);
        // The renew deadline counts from before the lease becomes visible: conservative.
        let started = Instant::now();
        let prepared = ticket
            .as_mut()
            .and_then(|t| t.install(&bytes, self.sync, &self.paths));
        let written = match prepared {
            Some(w) => w?,
            None => fsio::replace_keep(&self.paths, &self.paths.lock, &bytes, self.sync)?,
        };
        // Leave the queue: the name goes while we hold the mutex (so it is surely ours), the
        // lock after the mutex is free, waking exactly our successor.
        let ticket = ticket.map(Ticket::unlink_held);
        let witness = m.unlock();
        drop(ticket);
        let holding = FileHolding::new(self, witness, written, replaced.map(|s| s.file), mark);
        Ok((lease, bytes, started, holding))
    }

    fn replace(&self, _: &MutexGuard, lease: &Lease) -> Result<()> {
        fsio::replace(&self.paths, &self.paths.lock, &lease.to_bytes(), true)
    }

    fn clean_after_crash(&self) {
        fsio::remove_leftover_temps(&self.paths);
    }

    fn waker(&self, poll: bool, ttl: Duration) -> Waiter {
        Waiter::new(&self.paths, poll, ttl)
    }

    fn wait(
        &self,
        waker: &mut Waiter,
        place: &mut Place,
        ahead: Option<&Ahead>,
        seen: &Verdict,
        deadline: Option<Instant>,
    ) {
        if let Some(t) = place.ticket.as_mut() {
            t.beat();
        }
        match ahead {
            Some(p) => waker.wait_turn(p, deadline),
            None => waker.wait_lease(seen, place.seen.as_ref().map(|s| s.sig), deadline),
        }
    }

    fn waiting(&self) -> Vec<Waiting> {
        queue::snapshot(&self.paths)
    }
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
fn holder_mark(paths: &LockPaths) -> Option<OwnedFd> {
    paths.handle().open_path(paths.mutex_name()).ok()
}

fn lock<T>(m: &Mutex<T>) -> StdGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A held lease in the lock file, and the files its holder keeps.
#[derive(Debug)]
pub(crate) struct FileHolding {
    paths: LockPaths,
    storage: Storage,
    sync: bool,
    /// The lock's mutex file, kept open (not locked) while we hold the lease: the kernel's
    /// evidence, in /proc/PID/fd, that this process is a holder of this lock (see
    /// `process::JobEvidence`). Closed on exec, so commands do not inherit it; locked through at
    /// release, then closed.
    witness: Mutex<Option<MutexFile>>,
    /// Our lease's file as last renamed into place.
    written: Mutex<Option<Written>>,
    /// The file our lease replaced, still open (see `fsio::read_lock_keep`); closed at release.
    replaced: Mutex<Option<File>>,
    /// The holder's mark (see [`holder_mark`]): closed only after release has written LOCK.
    mark: Mutex<Option<OwnedFd>>,
    /// A holder file's: LOCK's paths, nudged after our release to wake the head (`slots.rs`).
    origin: Option<LockPaths>,
}

impl FileHolding {
    fn new(
        store: &FileStore,
        witness: Option<MutexFile>,
        written: Written,
        replaced: Option<File>,
        mark: Option<OwnedFd>,
    ) -> FileHolding {
        let paths = &store.paths;
        let witness = witness.or_else(|| MutexFile::open(paths, store.storage.network).ok());
        FileHolding {
            paths: paths.clone(),
            storage: store.storage,
            sync: store.sync,
            witness: Mutex::new(witness),
            written: Mutex::new(Some(written)),
            replaced: Mutex::new(replaced),
            mark: Mutex::new(mark.or_else(|| holder_mark(paths))),
            origin: store.origin.clone(),
        }
    }

    /// Opens LOCK afresh, read-write, for a renewal, and checks that LOCK's directory is still
    /// the one everyone else reaches by its path.
    fn open_for_renewal(&self) -> std::result::Result<(File, u32), Renewal> {
        let vanished = |what: String| Err(Renewal::Lost(LossReason::Vanished { what }));
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
            Err(e) => return Err(Renewal::Transient(e)),
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
            Err(e) => Err(Renewal::Transient(Error::io(&self.paths.dir, "stat", e))),
        }
    }

    /// Errors with `Error::Lost` unless LOCK holds our lease, still held (or, with
    /// `revoked_ok`, for a release, revoked).
    fn ensure_ours(&self, mine: &Lease, revoked_ok: bool) -> Result<()> {
        let why = match ours(&fsio::read_lock(&self.paths)?, &mine.lease_id) {
            Ours::Held => return Ok(()),
            // Revoked is still ours to release: a holder releases when its job is over, and a
            // released record frees the lock at once instead of after its processes are gone
            // (or, on other hosts, after a TTL).
            Ours::Revoked(_) if revoked_ok => return Ok(()),
            Ours::Revoked(_) => "it was revoked".to_string(),
            Ours::Released => "it was released or broken".into(),
            Ours::Taken(by, _) => format!("held by {by}"),
            Ours::Empty => "LOCK is empty".into(),
            Ours::Missing => "LOCK is missing".into(),
        };
        Err(Error::Lost {
            path: self.paths.lock.clone(),
            lease_id: mine.lease_id.clone(),
            why,
        })
    }

    /// The full released record (state `released`, how the job ended), written atomically
    /// under the mutex, if LOCK still holds our lease (held or revoked).
    fn write_released(&self, r: &Release<'_>, witness: Option<MutexFile>) -> Result<()> {
        let mut released = r.mine.clone();
        released.state = LeaseState::Released;
        released.ended = Some(Ending {
            at: format_rfc3339(r.clock.wall()),
            how: r.how.to_string(),
            by: None,
        });
        let _m = mutex::lock_with(
            witness,
            &self.paths,
            Some(Instant::now() + r.wait),
            r.stuck_after,
            StuckPolicy::Report,
            None,
            self.storage.network,
        )?;
        self.ensure_ours(r.mine, true)?;
        let bytes = released.to_bytes();
        fsio::replace_keep(&self.paths, &self.paths.lock, &bytes, self.sync).map(|_| ())
    }

    /// When the full released record could not be written (`e`: a full disk, a mutex someone
    /// sits on): leaves a lease every contender judges free at once, by flipping our header to
    /// released in place (no new blocks needed). Only how the job ended is then not recorded,
    /// which is not worth failing a release for. Errs only when even that fails.
    fn release_in_header(&self, r: &Release<'_>, e: Error) -> Result<()> {
        let mut bytes = r.bytes.to_vec();
        let seq = r.mine.heartbeat_seq.saturating_add(1);
        let at = format_rfc3339(r.clock.wall());
        if Lease::rewrite_header(&mut bytes, LeaseState::Released, seq, &at).is_some()
            && self.mark_in_place(r.mine, &bytes[MUTABLE_RANGE])
        {
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

    /// Writes the header `region` over LOCK in place if it still holds our lease (in any state).
    fn mark_in_place(&self, mine: &Lease, region: &[u8]) -> bool {
        let paths = &self.paths;
        let Ok(Some((f, mode))) = fsio::open_lock(paths, true) else {
            return false;
        };
        match fsio::read_open(&f, &paths.lock, mode).map(|c| ours(&c, &mine.lease_id)) {
            Ok(Ours::Held | Ours::Revoked(_) | Ours::Released) => {}
            _ => return false,
        }
        fsio::write_header(&f, &paths.lock, region).is_ok() && f.sync_data().is_ok()
    }
}

impl Holding for FileHolding {
    type Section = MutexGuard;

    fn still_ours(&self, lease_id: &str) -> Result<Ours> {
        fsio::read_lock(&self.paths).map(|c| ours(&c, lease_id))
    }

    fn renew(&self, lease_id: &str, bytes: &[u8]) -> std::result::Result<(), Renewal> {
        let path = &self.paths.lock;
        let (file, mode) = self.open_for_renewal()?;
        let vanished = |what: String| Err(Renewal::Lost(LossReason::Vanished { what }));
        let taken = |by: String| Err(Renewal::Lost(LossReason::Taken { by }));
        match fsio::read_open(&file, path, mode).map(|c| ours(&c, lease_id)) {
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
            Err(e) => return Err(Renewal::Transient(e)),
        }
        let Some(region) = bytes.get(MUTABLE_RANGE) else {
            return vanished("internal: our record is shorter than its header".into());
        };
        fsio::write_header(&file, path, region).map_err(Renewal::Transient)?;
        // Closing flushes the write to an NFS server (close-to-open); only then does it count.
        drop(file);
        Ok(())
    }

    fn enter(&self, deadline: Instant, stuck_after: Duration) -> Result<MutexGuard> {
        mutex::lock(
            &self.paths,
            Some(deadline),
            stuck_after,
            StuckPolicy::KillStopped,
        )
    }

    fn rewrite(&self, _: &MutexGuard, mine: &Lease, bytes: &[u8]) -> Result<()> {
        // Never over a revoked record: that would make a broken lease held again.
        self.ensure_ours(mine, false)?;
        let w = fsio::replace_keep(&self.paths, &self.paths.lock, bytes, false)?;
        *lock(&self.written) = Some(w);
        Ok(())
    }

    fn release(&self, r: Release<'_>) -> Result<()> {
        let (wait, stuck, net) = (r.wait, r.stuck_after, self.storage.network);
        let out = self.release_here(r);
        (self.origin.iter()).for_each(|lock| crate::slots::nudge(lock, net, wait, stuck));
        out
    }
}

impl FileHolding {
    /// Releases our lease in the file we hold it in (see [`Holding::release`]).
    fn release_here(&self, r: Release<'_>) -> Result<()> {
        let witness = lock(&self.witness).take();
        let written = lock(&self.written).take();
        // Closed when this returns, after the handover: freeing old files is off its path.
        let replaced = lock(&self.replaced).take();
        // Our holder's mark goes only once LOCK no longer says we hold it.
        let mark = lock(&self.mark).take();
        // On a local file system, with someone waiting: mark our file released in place (no
        // mutex: the file is the one we renamed into place, which only we change in place, and
        // a breaker replaces the whole file). Its inotify event wakes the head waiter at once.
        let handed = match (written, self.storage.network) {
            (Some(w), false) => handover::release_in_place(&self.paths, r.bytes, w),
            _ => None,
        };
        (r.stop)();
        if let Some(f) = handed {
            return handover::settle(&self.paths, f, self.sync, replaced, mark);
        }
        match self.write_released(&r, witness) {
            Ok(()) | Err(Error::Lost { .. }) => Ok(()),
            Err(e) => self.release_in_header(&r, e),
        }
    }
}
