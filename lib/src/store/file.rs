//! The lock-file store: leases kept in LOCK, beside its helper files (PROTOCOL.md §1–§6).
//!
//! Owns: how the [`Store`] contract is kept with files — the exclusive section is the flock
//! mutex (`mutex.rs`), reads and atomic replacement go through `fsio.rs`, the token sequence is
//! the mutex file's high-water mark, places in line are queue tickets (`queue.rs`), waiting is
//! inotify, pidfds and predecessor flocks (`wait.rs`), and the fast hand-over goes through
//! `handover.rs` — and what a file-store contender and holder keep open between steps (the
//! mutex descriptor, LOCK's descriptor, the ticket and its prepared lease, the reserved token;
//! the witness, the written and replaced files, the holder's mark).
//! Must never: keep LOCK open on a network file system beyond one read, except a holder's own
//! file with its lock (PROTOCOL.md §9, "In place"); write LOCK except by renaming a complete
//! record over it under the mutex, rewriting the header of our own record after checking it is
//! ours, setting the released bit on it, or — a holder on NFS — writing whole records into the
//! file whose lock it holds, under the mutex, while LOCK still names it; reach a file except
//! through LOCK's directory descriptor.

use crate::cancel::Cancel;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard as StdGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Binding, Holding, Joiner, Ours, Release, Renewal, Store, StuckPolicy, Took, ours};
use crate::boottime::BootInstant;
use crate::clock::format_rfc3339;
use crate::error::{Error, Result};
use crate::fsinfo::Storage;
use crate::fsio::{self, LockContent, Seen, Written};
use crate::handover;
use crate::klock::Where;
use crate::loss::LossReason;
use crate::mutex::{self, MutexFile, MutexGuard, MutexWait};
use crate::paths::LockPaths;
use crate::queue::{self, Ahead, Observed, Ticket};
use crate::record::{Ending, Lease, LeaseState, MUTABLE_RANGE};
use crate::verdict::{Verdict, Waiting};
use crate::wait::Waiter;

mod holding;
mod origin;

pub(crate) use holding::FileHolding;
use holding::holder_mark;
#[cfg(feature = "s3")]
pub(crate) use holding::not_ours;

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
    /// opening, kept open past our rename when we take the lease, and carrying our waiting hint
    /// — let go of while we sleep behind others in line (see `wait`).
    seen: Option<Seen>,
    /// A token reserved in the high-water mark while we were next in line.
    reserved: Option<u64>,
    /// LOCK did not exist at our last look: a take creates it (`fsio::create_lock_claimed`).
    missing: bool,
}

/// How many tokens one durable raise of the ceiling covers on a local disk (PROTOCOL.md §3).
const TOKEN_BLOCK: u64 = 64;

impl FileStore {
    /// Who holds an exclusive kernel lock on LOCK's own file (a `flock(2)`, an OFD or a POSIX
    /// write lock), in words, if anyone does, asked when LOCK's record would let a contender in
    /// (released, emptied) or names a holder whose job was just stopped. A leasehold holder
    /// holds a flock on its file for the whole holding and lets go of it before its record
    /// says released (`klock::hold_lock_file`), so such a lock is another program's —
    /// util-linux flock(1) on the same file, the flock drop-in — or a holder's whose record was
    /// emptied under it (still running: waited for too). Only `frozen`'s own is not counted: a
    /// hung holder on this host whose job a takeover stopped and which is left frozen (§7),
    /// recognised by the kernel's evidence that the locking process is that very holder of this
    /// lock (its pid and start time, and its holder's mark on this lock's mutex file or this
    /// lease in its environment: `process::JobEvidence`), never by the record alone, which a
    /// directory writer can forge. On a local file system /proc/locks names the locker; on NFS
    /// a test for a conflicting lock on the first byte asks the server.
    ///
    /// Inside a section that may take the lease (`claim`), on a local file system, the look
    /// also claims the file when no other program holds it (`mutex::claim_lock_file`): the take
    /// keeps that claim for the holding.
    pub(crate) fn foreign_lock(
        &self,
        frozen: Option<&Lease>,
        claim: Option<&MutexGuard>,
    ) -> Option<String> {
        let f = self
            .paths
            .handle()
            .open_existing(self.paths.lock_name(), false)
            .ok()?;
        if self.storage.network {
            // Inside a section that may take the lease, LOCK's file is claimed for a take in
            // place (a holder's byte-range lock from byte 1, `klock::hold_in_place`), which
            // fails while flock(1) — a whole-file lock — holds it; the test on byte 0 then
            // says whether that was another program (flock(1): whole file) or a holder's own
            // lock (from byte 1: a frozen holder on some host, whose file the take then
            // replaces by rename instead, as before).
            if let Some(section) = claim
                && self.origin.is_none()
                && let Ok(Some((rw, _))) = fsio::open_lock(&self.paths, true)
                && rw.metadata().is_ok_and(|m| {
                    // Only into a file of our own uid (root too: never into a user's file,
                    // which that user could then rewrite under root's lease).
                    use std::os::unix::fs::MetadataExt;
                    m.uid() == rustix::process::geteuid().as_raw()
                })
                && crate::mutex::claim_in_place(section, rw)
            {
                return None;
            }
            return match crate::klock::held_by_other(&f, true) {
                Ok(true) => Some("a process on some host (NFS)".into()),
                _ => None,
            };
        }
        let own = |pid| frozen.is_some_and(|l| self.holder_itself(l, pid));
        match claim {
            Some(section) if self.origin.is_none() => {
                crate::mutex::claim_lock_file(section, f, own)
            }
            _ => crate::mutex::exclusive_locker(&f, own),
        }
    }

    /// Whether `pid` is `l`'s holder process itself, on the kernel's evidence (see
    /// [`FileStore::foreign_lock`]).
    fn holder_itself(&self, l: &Lease, pid: i32) -> bool {
        let h = &l.holder;
        if pid != h.pid
            || !crate::identity::Identity::current().same_host_as(&h.host, &h.boot_id, h.pid_ns)
        {
            return false;
        }
        match crate::process::stat(pid) {
            Ok(Some(st)) if st.start == h.pid_start => matches!(
                Store::binding(self).evidence(l).check(&st),
                crate::process::Evidence::Belongs
            ),
            _ => false,
        }
    }

    /// LOCK's path, its directory and its helper names.
    pub(crate) fn paths(&self) -> &LockPaths {
        &self.paths
    }

    /// Tokens per durable raise of the ceiling: a block on a local disk; one where writes are
    /// not synced anyway (tmpfs, `durable(false)`) and on network file systems, where hosts
    /// with different boot ids share the file (the second line vouches for one boot only).
    fn token_block(&self) -> u64 {
        if self.sync && !self.storage.network {
            TOKEN_BLOCK
        } else {
            1
        }
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

impl FileStore {
    /// Whether LOCK's file can only have been written by us or root: owned by our uid or root,
    /// one link, no group or other write bit.
    fn record_trusted(&self) -> bool {
        let me = rustix::process::geteuid().as_raw();
        matches!(
            self.paths.handle().stat(self.paths.lock_name()),
            Ok(Some(m)) if (m.uid == me || m.uid == 0) && m.nlink == 1 && m.mode & 0o022 == 0
        )
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
        let at = Where {
            network: self.storage.network,
            writable: self.rw_mutex || self.storage.network,
        };
        let (paths, reuse) = (&self.paths, kept.take());
        mutex::lock_with(reuse, paths, deadline, stuck_after, policy, waiting, at)
    }

    fn leave(&self, section: MutexGuard, kept: &mut Option<MutexFile>) {
        *kept = section.unlock();
    }

    fn current(&self, _: &MutexGuard, place: &mut Place) -> Result<LockContent> {
        let before = place.seen.as_ref().map(|s| s.sig.id());
        let (content, seen) = fsio::read_lock_keep(&self.paths, place.seen.take())?;
        place.missing = matches!(content, LockContent::Missing);
        // Never keep LOCK open on a network file system: an NFS client that renames over a
        // file it has open keeps the old file alive on the server (a silly rename), and another
        // host whose cached name still leads to it would read the old lease instead of getting
        // ESTALE and looking the name up again (see `fsio::read_lock`).
        place.seen = seen.filter(|_| !self.storage.network);
        // A file just opened (not the one kept from our last look, hinted then) gets our hint
        // at once: the holder that releases while we judge it then releases in place, with no
        // look at /proc/locks for a program blocked on its file (`handover::announce_waiting`).
        if let Some(s) = &place.seen
            && before != Some(s.sig.id())
        {
            handover::announce_waiting(s);
        }
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
        // Our hint is on LOCK's file since we read it (`current`), and stays while we wait.
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
            if let Ok(seen) = m.tokens()
                && let Ok(t) = next_token(seen.floor(), current_token)
                && m.record_token(t, &seen, self.token_block(), self.sync)
                    .is_ok()
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
    ) -> Result<Took<FileHolding>> {
        let Place {
            seen: replaced,
            mut ticket,
            reserved,
            missing,
            ..
        } = place;
        // LOCK's file as we found it, claimed by our look for other programs' locks (see
        // [`FileStore::foreign_lock`]) — or, LOCK missing at that look: created and claimed
        // now, before any token or mark of ours exists (flock(1) creates a missing file too:
        // we never rename over a file it just created and locked; one created since our look
        // is looked at again).
        let mut claimed = m.take_claimed();
        if claimed.is_none() && missing && self.origin.is_none() {
            claimed = fsio::create_lock_claimed(&self.paths, self.storage.network)?;
        }
        let seen = m.tokens()?;
        let token = match reserved {
            // Nobody reserved or used a token since ours: it is still above every token
            // handed out, and already below the durable ceiling.
            Some(t) if seen.last == Some(t) && prev_token < t => t,
            _ => {
                let t = next_token(seen.floor(), prev_token)?;
                m.record_token(t, &seen, self.token_block(), self.sync)?;
                t
            }
        };
        let (lease, bytes) = lease(token);
        // On a local disk whose epoch record vouches for this lease's TTL, the lease need not
        // be synced (PROTOCOL.md §8, *Durable per mount epoch*); the record is raised or
        // rewritten (synced) first when it does not, and this one lease is then synced.
        let vouched = self
            .sync
            .then(|| {
                let ttl = Duration::from_millis(lease.ttl_ms);
                crate::epoch::vouches(&self.paths, self.storage, ttl)
            })
            .flatten();
        let sync = self.sync && vouched.is_none();
        // Our holder's marks, before the lease becomes visible (see [`holder_mark`] and
        // `klock::hold_mark`): the second stays with the mutex descriptor we keep as witness.
        let mark = holder_mark(&self.paths);
        if self.origin.is_some() {
            // A holder file's lease (a shared or slotted holder): a counted mark, no token's.
            m.hold_shared_mark();
        } else {
            m.hold_mark(token);
        }
        // On a network file system (an NFS client), LOCK's inode stays: our lease is written
        // into the very file our claim holds (PROTOCOL.md §9, "In place"), or — no claim: LOCK
        // not ours to write, or still locked by a frozen holder — renamed into place
        // carrying the same lock; every later record of the holding goes in place.
        let (written, replaced, started) = if self.storage.network && self.origin.is_none() {
            let started = BootInstant::now();
            let written = match claimed {
                Some(c) => {
                    let id = c
                        .metadata()
                        .map(|m| {
                            use std::os::unix::fs::MetadataExt;
                            (m.dev(), m.ino())
                        })
                        .map_err(|e| Error::io(&self.paths.lock, "stat", e))?;
                    fsio::write_in_place(&c, &self.paths.lock, &bytes)?;
                    fsio::Written { id, kept: Some(c) }
                }
                None => fsio::replace_in_place(&self.paths, &self.paths.lock, &bytes)?,
            };
            (written, None, started)
        } else {
            // LOCK's file as we found it: claimed (above), or — a takeover no such look
            // preceded — claimed now if nobody holds it, and kept for the holding either way
            // (PROTOCOL.md §10).
            let replaced = match (claimed, replaced) {
                (Some(c), _) => Some(c),
                (None, Some(s)) => {
                    if !self.storage.network && self.origin.is_none() {
                        let _ = crate::klock::claim_lock_file(&s.file);
                    }
                    Some(s.file)
                }
                (None, None) => None,
            };
            // The renew deadline counts from before the lease becomes visible: conservative.
            let started = BootInstant::now();
            let prepared = ticket
                .as_mut()
                .and_then(|t| t.install(&bytes, sync, &self.paths));
            let written = match prepared {
                Some(w) => w?,
                // A holder of LOCK on a local file system holds a flock on its file for the
                // whole holding, taken before the rename (util-linux flock(1) waits for it,
                // PROTOCOL.md §10). (On NFS: in place, above.)
                None if !self.storage.network && self.origin.is_none() => {
                    fsio::replace_holding(&self.paths, &self.paths.lock, &bytes, sync)?
                }
                None => fsio::replace_keep(&self.paths, &self.paths.lock, &bytes, sync)?,
            };
            (written, replaced, started)
        };
        // Leave the queue: the name goes while we hold the mutex (so it is surely ours), the
        // lock after the mutex is free, waking exactly our successor.
        let ticket = ticket.map(Ticket::unlink_held);
        let witness = m.unlock();
        drop(ticket);
        // The file our lease replaced is nameless now: kept (with its claim) only while someone
        // else may ask for its lock; closed at our first renewal once nobody can, so that the
        // file system can still be remounted read-only under us (`FileHolding::forget_unreachable`,
        // PROTOCOL.md §3) — not here: closing the last reference to a nameless file frees it,
        // which on a disk cost the next holder's take ~80 us.
        let mut holding = FileHolding::new(self, witness, written, replaced, mark);
        // (No epoch record vouches on NFS: `sync` is the store's there, `vouched` none.)
        holding.sync = sync;
        holding.rests_on = Mutex::new(vouched);
        Ok((lease, bytes, started, holding))
    }

    fn marked(&self, section: &MutexGuard, from: u64) -> bool {
        // The token a record shows is a floor for the marks only if nobody but us or root can
        // have written that record (PROTOCOL.md §4): a directory writer's released record with
        // a token above a running holder's must not hide that holder's mark.
        let from = if from > 0 && !self.record_trusted() {
            0
        } else {
            from
        };
        section.holder_marked(from)
    }

    fn kernel_locked(&self, section: &MutexGuard, frozen: Option<&Lease>) -> Option<String> {
        self.foreign_lock(frozen, Some(section))
    }

    fn settling(&self, m: &MutexGuard) -> Option<(Duration, Duration)> {
        // LOCK's disk came back as another attachment: tokens handed out there may be above
        // the last token the mutex file's second line shows (neither LOCK nor that line was
        // synced), though never above its ceiling (always synced). So before the record says
        // this attachment, a token above the ceiling is reserved (synced): the floor from then
        // on is above every token handed out (PROTOCOL.md §3, §8).
        let floor_raised = || {
            m.tokens().is_ok_and(|seen| {
                m.record_token(seen.ceiling.saturating_add(1), &seen, TOKEN_BLOCK, true)
                    .is_ok()
            })
        };
        crate::epoch::settling(&self.paths, self.storage, floor_raised)
    }

    fn shared_holders(&self, section: &MutexGuard, cap: usize) -> usize {
        section.shared_holders(cap)
    }

    fn no_marks(&self, section: &MutexGuard) -> bool {
        section.no_marks()
    }

    fn replace(&self, _: &MutexGuard, lease: &Lease) -> Result<()> {
        fsio::replace(&self.paths, &self.paths.lock, &lease.to_bytes(), true)
    }

    fn clean_after_crash(&self) {
        fsio::remove_leftover_temps(&self.paths);
    }

    fn waker(&self, poll: bool, ttl: Duration, cancel: Option<Cancel>) -> Waiter {
        Waiter::new(&self.paths, poll, ttl, cancel)
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
            // Behind others in line, LOCK's file as we last read it is let go of before we
            // sleep: we do not wake when LOCK changes, so it soon is an old file, whose holder
            // — the one whose lease replaced it — would find it open here at its release, and
            // read /proc/locks to learn whether we are blocked on it (every release at N = 8
            // in the contention bench). Our hint on it serves nobody: the head's is what a
            // releasing holder finds. We read LOCK afresh when our turn comes.
            Some(p) => {
                place.seen = None;
                waker.wait_turn(p, deadline)
            }
            None => waker.wait_lease(seen, place.seen.as_ref().map(|s| s.sig), deadline),
        }
    }

    fn waiting(&self) -> Vec<Waiting> {
        queue::snapshot(&self.paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::libc;
    use std::os::unix::fs::MetadataExt;

    /// What util-linux flock(1) takes through an NFS client: a whole-file write lock (here an
    /// OFD lock on a description of its own), tried without waiting.
    fn whole_file_lock(f: &File) -> bool {
        use std::os::fd::AsFd;
        // SAFETY: a plain C struct; all-zero is valid.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        let arg = nix::fcntl::FcntlArg::F_OFD_SETLK(&fl);
        nix::fcntl::fcntl(f.as_fd(), arg).is_ok()
    }

    /// A store for `lock` told it is on a network file system (on a local one: its kernel
    /// locks are the same OFD byte-range locks an NFS client forwards to the server).
    fn told_network(lock: &std::path::Path) -> FileStore {
        let net = Storage {
            network: true,
            memory_backed: false,
        };
        FileStore::new(LockPaths::new(lock).unwrap(), net, false)
    }

    /// On a network file system, a file whose holder's lock (from byte 1) is still held — a
    /// frozen holder's — is not written in place: the take renames its lease over it, carrying
    /// its own lock, and never mistakes that lock for another program's (byte 0 is free).
    #[test]
    fn a_take_on_a_network_file_system_renames_over_a_file_a_holder_s_lock_is_still_on() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        let store = || told_network(&lock);
        let b = crate::LeaseBuilder::new(&lock);
        let ino = || std::fs::metadata(&lock).unwrap().ino();
        crate::acquire::through(&b, store(), None, true)
            .unwrap()
            .release()
            .unwrap();
        let old = ino();
        let frozen = File::options().read(true).write(true).open(&lock).unwrap();
        assert!(crate::klock::hold_in_place(&frozen).unwrap());

        let g = crate::acquire::through(&b, store(), None, true).unwrap();
        assert_ne!(
            ino(),
            old,
            "renamed over the file another holder's lock is on"
        );
        let rw = File::options().read(true).write(true).open(&lock).unwrap();
        assert!(
            !whole_file_lock(&rw),
            "the new file carries the holder's lock"
        );
        g.release().unwrap();
        assert!(whole_file_lock(&rw), "let go at release");
    }

    /// A holder on a network file system (the store told so, on a local one: its kernel
    /// locks are the same OFD byte-range locks an NFS client forwards to the server) keeps
    /// LOCK's inode from take to release, holding a lock from byte 1 all along: a whole-file
    /// lock (flock(1) on another client) fails while it holds and is granted once it
    /// released; a contender then finds that program's lock and does not start; the next take
    /// writes into the same file again. With a take or release by rename the inode changes
    /// and flock(1), holding the old file, would run beside the next holder (PROTOCOL.md §9).
    #[test]
    fn a_holder_on_a_network_file_system_keeps_lock_s_inode_and_flock1_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        let store = || told_network(&lock);
        let b = crate::LeaseBuilder::new(&lock);
        let ino = || std::fs::metadata(&lock).unwrap().ino();
        let rw = || File::options().read(true).write(true).open(&lock).unwrap();

        let g = crate::acquire::through(&b, store(), None, true).unwrap();
        let first = ino();
        let flock1 = rw();
        assert!(
            !whole_file_lock(&flock1),
            "flock(1) must wait for the holder"
        );
        g.release().unwrap();
        assert_eq!(ino(), first, "released in place");
        let c = fsio::read_lock(&LockPaths::new(&lock).unwrap()).unwrap();
        assert!(
            matches!(&c, LockContent::Lease(l, _) if l.state == LeaseState::Released),
            "{c:?}"
        );
        assert!(
            whole_file_lock(&flock1),
            "flock(1) gets the file once released"
        );

        let busy = crate::acquire::through(&b, store(), None, true);
        assert!(
            matches!(&busy, Err(Error::WouldBlock { .. })),
            "a contender must not start beside flock(1): {busy:?}"
        );
        drop(flock1);

        let g = crate::acquire::through(&b, store(), None, true).unwrap();
        assert_eq!(ino(), first, "taken in place");
        assert!(!whole_file_lock(&rw()), "held again");
        // The child's record (longer than the lease it replaces) goes in place too, and the
        // lock stays.
        let me = std::process::id() as i32;
        g.set_child(me, 1, me).unwrap();
        assert_eq!(ino(), first, "the child's record in place");
        assert!(!whole_file_lock(&rw()), "still held after set_child");
        assert!(g.still_ours());
        g.release_with("exit 3").unwrap();
        assert_eq!(ino(), first);
        let c = fsio::read_lock(&LockPaths::new(&lock).unwrap()).unwrap();
        assert!(
            matches!(&c, LockContent::Lease(l, _)
                if l.state == LeaseState::Released
                    && l.ended.as_ref().is_some_and(|e| e.how == "exit 3")),
            "the released record, with how the job ended, in place: {c:?}"
        );
    }

    /// LOCK missing at a contender's look, and created and locked since by another program
    /// (util-linux flock(1) creates a missing file): the take loses the race (`Raced`: it looks
    /// again) before it makes a lease, and never renames over that program's file — on a local
    /// disk and on NFS alike. (Before, the take renamed over it, and flock(1) ran beside us.)
    #[test]
    fn a_take_never_renames_over_a_lock_file_created_and_locked_since_its_look() {
        for network in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let lock = dir.path().join("job.lock");
            let storage = Storage {
                network,
                memory_backed: false,
            };
            let store = FileStore::new(LockPaths::new(&lock).unwrap(), storage, false);
            let mut kept = None;
            let policy = StuckPolicy::Report;
            let m =
                (store.enter(&mut kept, None, Duration::from_secs(5), policy, None, None)).unwrap();
            let mut place = Place::default();
            let content = store.current(&m, &mut place).unwrap();
            assert!(matches!(content, LockContent::Missing), "{content:?}");
            // flock(1) creates LOCK and locks it, between our look and our take.
            let flock1 = File::create(&lock).unwrap();
            assert!(whole_file_lock(&flock1));
            let ino = std::fs::metadata(&lock).unwrap().ino();
            let took = store.take(m, place, 0, &mut |_| {
                panic!("a lease made after LOCK appeared since the look (network: {network})")
            });
            assert!(
                matches!(&took, Err(Error::Raced { .. })),
                "network: {network}: {:?}",
                took.as_ref().map(|_| "taken")
            );
            let meta = std::fs::metadata(&lock).unwrap();
            assert_eq!(meta.ino(), ino, "flock(1)'s file is still LOCK");
            assert_eq!(meta.len(), 0, "and nothing was written into it");
        }
    }

    /// A contender's read of LOCK under the mutex places its hint on the file at once (before
    /// it queues, if it ever does), so that a holder releasing meanwhile finds it and releases in
    /// place instead of reading /proc/locks; the hint goes with the contender's descriptor.
    #[test]
    fn a_contender_hints_on_the_lock_file_as_soon_as_it_has_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("job.lock");
        let g = crate::LeaseBuilder::new(&lock).try_acquire().unwrap();
        // The holder's own open file description of LOCK's file (a duplicate of it).
        let held = File::from(
            g.lock_file_descriptor()
                .expect("a local holder keeps its file"),
        );
        assert!(
            !crate::klock::waiting_hinted(&held).unwrap(),
            "nobody looks yet"
        );

        let paths = LockPaths::new(&lock).unwrap();
        let storage = crate::fsinfo::inspect(&paths.dir).storage();
        if storage.network {
            eprintln!("skipped: the temp directory is on a network file system (no hints there)");
            return;
        }
        let store = FileStore::new(paths, storage, false);
        let mut kept = None;
        let policy = StuckPolicy::Report;
        let m = (store.enter(&mut kept, None, Duration::from_secs(5), policy, None, None)).unwrap();
        let mut place = Place::default();
        let content = store.current(&m, &mut place).unwrap();
        assert!(matches!(content, LockContent::Lease(..)), "{content:?}");
        assert!(
            crate::klock::waiting_hinted(&held).unwrap(),
            "a contender that has read LOCK hints on its file"
        );
        store.leave(m, &mut kept);
        drop(place);
        assert!(
            !crate::klock::waiting_hinted(&held).unwrap(),
            "the hint goes with the contender's descriptor"
        );
        g.release().unwrap();
    }
}
