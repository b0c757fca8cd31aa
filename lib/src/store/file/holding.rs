//! The held side of the file store: [`FileHolding`], one held lease's link to LOCK (or to its
//! holder file) — renewal in place, the `ours()` check, release (in place by the released bit,
//! or a released record under the mutex: renamed over LOCK, or — on NFS — written into the
//! file we keep, PROTOCOL.md §9, "In place").
//!
//! Owns: what `Holding` (`store/mod.rs`) asks of a held lease on files. Must never: renew or
//! release a lease that is no longer ours (every write is preceded by `ours()`), or follow a
//! link (every open goes through LOCK's directory descriptor).

use super::*;
use std::os::unix::fs::MetadataExt;

/// The holder's mark: an `O_PATH` descriptor on the lock's mutex file, kept for exactly as
/// long as this process holds the lease (closed on exec, and after release has written our
/// released record). Nobody else opens the mutex file `O_PATH` — waiters keep it open for
/// reading, never so — so the kernel's /proc/PID/fd and fdinfo then say that this process is a
/// holder of this very lock (see `process::JobEvidence`). Opened with `O_NOFOLLOW` (a
/// symbolic link planted at the name gives a descriptor on the link, which no judge takes for
/// the mutex file: they compare with a regular file's device and inode); `None` if it cannot
/// be opened (this holder is then judged by its heartbeat and its command only). Opened under
/// the mutex, before our lease is visible, so no judge ever sees our lease without our mark.
pub(super) fn holder_mark(paths: &LockPaths) -> Option<OwnedFd> {
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
    /// Whether our records are synced: not when the epoch record vouched for our lease
    /// (PROTOCOL.md §8), so neither is our release.
    pub(super) sync: bool,
    /// The epoch record (device, inode) our unsynced lease rests on; `None` when the lease was
    /// synced, or once it is (see `renew`).
    pub(super) rests_on: Mutex<Option<(u64, u64)>>,
    /// The lock's mutex file, kept open (not locked) while we hold the lease: the kernel's
    /// evidence, in /proc/PID/fd, that this process is a holder of this lock (see
    /// `process::JobEvidence`). Closed on exec, so commands do not inherit it; locked through at
    /// release, then closed.
    witness: Mutex<Option<MutexFile>>,
    /// Our lease's file as last renamed into place.
    written: Mutex<Option<Written>>,
    /// The file our lease replaced, still open (see `fsio::read_lock_keep`); closed at release.
    replaced: Mutex<Option<File>>,
    /// Our own earlier files, replaced by a rewrite (`set_child`), with our flock still on
    /// them: a program blocked on one is served before our release (`handover::serve_old_waiters`).
    superseded: Mutex<Vec<File>>,
    /// The holder's mark (see [`holder_mark`]): closed only after release has written LOCK.
    mark: Mutex<Option<OwnedFd>>,
    /// A holder file's: LOCK's paths, nudged after our release to wake the head (`slots.rs`).
    origin: Option<LockPaths>,
}

impl FileHolding {
    pub(super) fn new(
        store: &FileStore,
        witness: Option<MutexFile>,
        written: Written,
        replaced: Option<File>,
        mark: Option<OwnedFd>,
    ) -> FileHolding {
        let paths = &store.paths;
        let witness =
            witness.or_else(|| MutexFile::open(paths, Where::of(store.storage.network)).ok());
        FileHolding {
            paths: paths.clone(),
            storage: store.storage,
            sync: store.sync,
            rests_on: Mutex::new(None),
            witness: Mutex::new(witness),
            written: Mutex::new(Some(written)),
            replaced: Mutex::new(replaced),
            superseded: Mutex::new(Vec::new()),
            mark: Mutex::new(mark.or_else(|| holder_mark(paths))),
            origin: store.origin.clone(),
        }
    }

    /// Opens LOCK afresh (read-write for a renewal, read-only for a look), and checks that it
    /// is the very file we last put in place and that LOCK's directory is still the one
    /// everyone else reaches by its path.
    ///
    /// Lost at once, never transient: LOCK missing, not a lease, another file than ours (a
    /// copy of our lease renamed over it is not ours: nobody reads what we would write into
    /// the old one), or no longer writable by us (permission denied: it was replaced by another
    /// user's file, or its permissions were taken from us; credentials that expired on NFS say
    /// the same). Each means our heartbeat no longer reaches anyone, so the lease is lost now
    /// rather than at the renew deadline.
    fn open_for_renewal(
        &self,
        write: bool,
        lease_id: &str,
    ) -> std::result::Result<(File, u32), Renewal> {
        let vanished = |what: String| Err(Renewal::Lost(LossReason::Vanished { what }));
        let shown = self.paths.lock.display();
        let (file, mode) = match fsio::open_lock(&self.paths, write) {
            Ok(Some(f)) => f,
            Ok(None) => return vanished(format!("{shown} no longer exists")),
            Err(
                e @ (Error::NotALease { .. }
                | Error::NewerFormat { .. }
                | Error::Squatted { .. }
                | Error::Untrusted { .. }),
            ) => return vanished(e.to_string()),
            // Not ours to write any more: replaced by another user's file (a breaker's, an
            // attacker's), or its permissions changed. Lost now, never transient: say why from
            // what it holds (read-only), or that we may no longer write it.
            Err(Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                return match fsio::read_lock(&self.paths) {
                    Ok(c) if !matches!(ours(&c, lease_id), Ours::Held) => {
                        Err(Renewal::Lost(not_ours(ours(&c, lease_id))))
                    }
                    _ => vanished(format!(
                        "{shown} can no longer be written by us ({source}): replaced by another \
                         user's file, or its permissions changed"
                    )),
                };
            }
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

    /// Lost when `file` (LOCK, holding our lease) is not the very file our lease was written
    /// to: a copy of our lease renamed over it. Checked after its content, so that a record
    /// that is not ours at all (taken, revoked) is reported as such.
    fn same_file(&self, file: &File) -> std::result::Result<(), Renewal> {
        match (lock(&self.written).as_ref(), file.metadata()) {
            (Some(w), Ok(m)) if (m.dev(), m.ino()) != w.id => {
                Err(Renewal::Lost(LossReason::Vanished {
                    what: format!(
                        "{} was replaced by another file holding a copy of our lease (not the \
                         one our lease was written to)",
                        self.paths.lock.display()
                    ),
                }))
            }
            _ => Ok(()),
        }
    }

    /// Errors with `Error::Lost` unless LOCK holds our lease, still held (or, with
    /// `revoked_ok`, for a release, revoked: then who revoked it, if recorded). `bytes`, when
    /// known, are exactly what we last wrote (`mine`'s): found as they are, they need no parse.
    fn ensure_ours(
        &self,
        mine: &Lease,
        bytes: Option<&[u8]>,
        revoked_ok: bool,
    ) -> Result<Option<String>> {
        let now = match bytes {
            Some(b) => fsio::read_lock_known(&self.paths, mine, b)?,
            None => fsio::read_lock(&self.paths)?,
        };
        let why = match ours(&now, &mine.lease_id) {
            Ours::Held => return Ok(None),
            // Revoked is still ours to release: a holder releases when its job is over, and a
            // released record frees the lock at once instead of after its processes are gone
            // (or, on other hosts, after a TTL).
            Ours::Revoked(by) if revoked_ok => return Ok(by),
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
    /// under the mutex, if LOCK still holds our lease (held or revoked): [`Wrote::Full`].
    /// Writing nothing, the caller releasing in place instead, when by then a contender hints
    /// that it looks at `kept` (LOCK's file as we put it in place) after a clean end (`clean`:
    /// a record in place loses nothing then, and no look is needed), [`Wrote::Hinted`]; or
    /// when someone waits blocked for our flock on it, [`Wrote::Blocked`]:
    /// util-linux flock(1), which must get the lock on the file LOCK names, not on one renamed
    /// away.
    fn write_released(
        &self,
        r: &Release<'_>,
        witness: Option<MutexFile>,
        kept: Option<&File>,
        clean: bool,
    ) -> Result<Wrote> {
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
            Where::of(self.storage.network),
        )?;
        if let Some(by) = self.ensure_ours(r.mine, Some(r.bytes), true)?
            && let Some(e) = released.ended.as_mut()
        {
            // Revoked by an operator: the released record keeps who ended the lease.
            e.how = format!("{}, after it was revoked", e.how);
            e.by = Some(by);
        }
        let bytes = released.to_bytes();
        // On a network file system, LOCK's inode stays (PROTOCOL.md §9, "In place"): our lock
        // is let go of, then the released record is written into our very file, still LOCK —
        // so that flock(1) on any client, which may have opened it at any time, locks the
        // file every contender looks at.
        if let Some(k) = kept.filter(|_| self.in_place()) {
            if self.still_lock(k) {
                let _ = crate::klock::let_go_in_place(k);
                return fsio::write_in_place(k, &self.paths.lock, &bytes).map(|_| Wrote::Full);
            }
            let _ = crate::klock::let_go_in_place(k);
            return fsio::replace_keep(&self.paths, &self.paths.lock, &bytes, self.sync)
                .map(|_| Wrote::Full);
        }
        // Checked last, just before the rename: one that blocks after it gets the file renamed
        // away when we let go (a window of microseconds, PROTOCOL.md §10).
        if let Some(k) = kept {
            // Only a file that holds exactly our lease as we wrote it is marked in place (a
            // revoked one says by whom in the full record).
            if clean
                && crate::klock::waiting_hinted(k).unwrap_or(false)
                && handover::holds_exactly(k, r.bytes)
            {
                return Ok(Wrote::Hinted);
            }
            if mutex::someone_blocked(k) {
                return Ok(Wrote::Blocked);
            }
            // A program that has it open for writing, unblocked (a polling NFS client's
            // flock(1)): the file stays LOCK, released in place, as above.
            if handover::opened_for_writing(k) && handover::holds_exactly(k, r.bytes) {
                return Ok(Wrote::Hinted);
            }
        }
        fsio::replace_keep(&self.paths, &self.paths.lock, &bytes, self.sync).map(|_| Wrote::Full)
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

    /// Whether our records are written in place into the file we keep (a holder on a network
    /// file system, PROTOCOL.md §9, "In place").
    fn in_place(&self) -> bool {
        self.storage.network && self.origin.is_none()
    }

    /// Whether LOCK's name leads to `file` now (a fresh open by name: on NFS, one that
    /// revalidates what the client cached).
    fn still_lock(&self, file: &File) -> bool {
        file.metadata()
            .is_ok_and(|m| fsio::open_lock_if(&self.paths, (m.dev(), m.ino())).is_some())
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

    fn kernel_lock(&self) -> Option<std::os::fd::OwnedFd> {
        let written = lock(&self.written);
        let kept = written.as_ref()?.kept.as_ref()?;
        // A duplicate shares the open file description, and with it the flock and the OFD
        // lock; close-on-exec, as `try_clone` makes it.
        kept.try_clone().ok().map(std::os::fd::OwnedFd::from)
    }

    fn old_locks(&self) -> Vec<std::os::fd::OwnedFd> {
        let superseded = lock(&self.superseded);
        let replaced = lock(&self.replaced);
        // Not those nobody can lock any more (closed at our next renewal, `forget_unreachable`).
        let reachable = |f: &&File| self.storage.network || crate::klock::still_reachable(f);
        (superseded.iter().chain(replaced.iter()))
            .filter(reachable)
            .filter(|f| crate::os::linux::procfs::holds_exclusive_flock(f) == Some(true))
            .filter_map(|f| f.try_clone().ok().map(std::os::fd::OwnedFd::from))
            .collect()
    }

    fn still_ours(&self, lease_id: &str) -> Result<Ours> {
        fsio::read_lock(&self.paths).map(|c| ours(&c, lease_id))
    }

    fn renew(&self, lease_id: &str, bytes: &[u8]) -> std::result::Result<(), Renewal> {
        self.forget_unreachable();
        let path = &self.paths.lock;
        let (file, mode) = self.open_for_renewal(true, lease_id)?;
        match fsio::read_open(&file, path, mode).map(|c| ours(&c, lease_id)) {
            Ok(Ours::Held) => self.same_file(&file)?,
            Ok(o) => return Err(Renewal::Lost(not_ours(o))),
            Err(e @ Error::NotALease { .. }) => {
                return Err(Renewal::Lost(LossReason::Vanished {
                    what: e.to_string(),
                }));
            }
            Err(e) => return Err(Renewal::Transient(e)),
        }
        let Some(region) = bytes.get(MUTABLE_RANGE) else {
            return Err(Renewal::Lost(LossReason::Vanished {
                what: "internal: our record is shorter than its header".into(),
            }));
        };
        fsio::write_header(&file, path, region).map_err(Renewal::Transient)?;
        // Our lease went unsynced on the epoch record's word (PROTOCOL.md §8): if that record
        // has been removed or replaced since (a cleanup, a directory writer), nothing on the
        // disk would hold contenders back should it drop off now, so the lease is made durable.
        let rests_on = *lock(&self.rests_on);
        if let Some(id) = rests_on
            && !crate::epoch::still(&self.paths, id)
            && file.sync_data().is_ok()
            && self.paths.handle().sync().is_ok()
        {
            *lock(&self.rests_on) = None;
        }
        // Closing flushes the write to an NFS server (close-to-open); only then does it count.
        let id = file.metadata().map(|m| (m.dev(), m.ino()));
        drop(file);
        // And only if LOCK's name still leads to the file we wrote: a copy of our lease renamed
        // over it after our look above took our write into the unlinked file, which nobody
        // reads, while others' observation of the copy started before this renewal counted
        // (the SPIN model's `broken-count-unseen`: a contender on a fast clock took over while
        // the holder ran on). What this cannot see is a copy made *before* our write and
        // renamed in *after* this check (the model's `gap-writer-early-copy`): on this host
        // the keeper's watch notices it at once; from another host only the next renewal does
        // (PROTOCOL §10, known gaps).
        match (id, self.paths.handle().stat(self.paths.lock_name())) {
            (Ok(ours), Ok(Some(m))) if m.id() == ours => Ok(()),
            (Ok(_), Ok(_)) => Err(Renewal::Lost(LossReason::Vanished {
                what: format!(
                    "{} was replaced by another file while we renewed it",
                    self.paths.lock.display()
                ),
            })),
            (Err(e), _) => Err(Renewal::Transient(Error::io(path, "stat", e))),
            (_, Err(e)) => Err(Renewal::Transient(Error::io(path, "stat", e))),
        }
    }

    fn check(&self, lease_id: &str) -> std::result::Result<(), Renewal> {
        let (file, mode) = match self.open_for_renewal(false, lease_id) {
            Err(Renewal::Transient(_)) => return Ok(()),
            other => other?,
        };
        let path = &self.paths.lock;
        let lost = |reason| Err(Renewal::Lost(reason));
        match fsio::read_open(&file, path, mode).map(|c| ours(&c, lease_id)) {
            Ok(Ours::Held) => self.same_file(&file),
            Ok(o) => lost(not_ours(o)),
            Err(_) => Ok(()),
        }
    }

    fn watched(&self) -> Option<(std::path::PathBuf, std::ffi::OsString)> {
        let dir = self.paths.handle();
        Some((dir.proc_path(), self.paths.lock_name().to_os_string()))
    }

    fn enter(&self, deadline: Instant, stuck_after: Duration) -> Result<MutexGuard> {
        mutex::lock(
            &self.paths,
            Some(deadline),
            stuck_after,
            StuckPolicy::KillStopped,
            self.storage.network,
        )
    }

    fn rewrite(&self, _: &MutexGuard, mine: &Lease, bytes: &[u8]) -> Result<()> {
        // Never over a revoked record: that would make a broken lease held again.
        self.ensure_ours(mine, None, false)?;
        // The new file carries our flock before it becomes LOCK; the old one keeps ours until
        // our release serves whoever blocked on it meanwhile (`handover::serve_old_waiters`) —
        // or is closed at a renewal once nobody else has it open (`forget_unreachable`).
        // On a network file system, into our own file in place while LOCK still names it
        // (else renamed, carrying our lock, as at a take without a claim).
        if self.in_place() {
            let mut written = lock(&self.written);
            if let Some(k) = written.as_ref().and_then(|w| w.kept.as_ref())
                && self.still_lock(k)
            {
                return fsio::write_in_place(k, &self.paths.lock, bytes);
            }
            *written = Some(fsio::replace_in_place(
                &self.paths,
                &self.paths.lock,
                bytes,
            )?);
            return Ok(());
        }
        let w = if self.storage.network || self.origin.is_some() {
            fsio::replace_keep(&self.paths, &self.paths.lock, bytes, false)?
        } else {
            fsio::replace_holding(&self.paths, &self.paths.lock, bytes, false)?
        };
        if let Some(old) = lock(&self.written).replace(w).and_then(|o| o.kept) {
            lock(&self.superseded).push(old);
        }
        Ok(())
    }

    fn release(&self, r: Release<'_>) -> Result<()> {
        let (wait, stuck, net) = (r.wait, r.stuck_after, self.storage.network);
        let out = self.release_here(r);
        (self.origin.iter()).for_each(|lock| crate::slots::nudge(lock, net, wait, stuck));
        out
    }
}

/// What [`FileHolding::write_released`] did.
enum Wrote {
    /// The full released record is LOCK now.
    Full,
    /// Nothing: a contender hints that it looks at LOCK's file, after a clean end, or another
    /// program has it open for writing, unblocked (release in place).
    Hinted,
    /// Nothing: someone is blocked for our flock on LOCK's file (release for them).
    Blocked,
}

/// Why a renewal that found `o` (anything but [`Ours::Held`]) lost the lease.
pub(crate) fn not_ours(o: Ours) -> LossReason {
    match o {
        Ours::Revoked(by) => LossReason::Broken {
            how: LossReason::revoked(by),
        },
        Ours::Released => LossReason::Broken {
            how: "marked released by a break".into(),
        },
        Ours::Taken(by, token) => LossReason::Taken {
            by: format!("held by {by} (token {token})"),
        },
        Ours::Empty => LossReason::Vanished {
            what: "LOCK is empty".into(),
        },
        // read_open never reports Missing for an open file; vanished all the same. (Held is
        // not a loss: callers match it first.)
        Ours::Missing | Ours::Held => LossReason::Vanished {
            what: "LOCK is missing".into(),
        },
    }
}

impl FileHolding {
    /// Closes the files that are no longer LOCK and that nobody can ever lock again (see
    /// `klock::still_reachable`): the file our lease replaced, our own earlier files, once
    /// nobody else has them open. Kept, they would stop the file system from being remounted
    /// read-only under us (PROTOCOL.md §3). At each renewal, never at the take: closing the
    /// last reference to a nameless file frees it, off the hand-over's path here. Local file
    /// systems only (an NFS client has no leases to ask: everything stays reachable there).
    fn forget_unreachable(&self) {
        if self.storage.network {
            return;
        }
        let _ = lock(&self.replaced).take_if(|f| !crate::klock::still_reachable(f));
        lock(&self.superseded).retain(crate::klock::still_reachable);
    }

    /// Releases our lease in the file we hold it in (see [`Holding::release`]).
    fn release_here(&self, r: Release<'_>) -> Result<()> {
        // First, while our lease still keeps every contender out: programs blocked on files
        // that are no longer LOCK but whose flock we hold get them, one after the other.
        // One look says, in the usual case, that nobody waits on any of them, nor on LOCK's
        // file (`glance`, last) — unless, after a clean end (whose record in place loses
        // nothing: `ending::clean_handover`), a contender hints that it looks at LOCK's file (a
        // waiter, or one that has just read it to judge it: `FileStore::current`): the release
        // is then in place (below), which leaves a program blocked on that file's flock on the
        // file every contender looks at, so LOCK's file needs no look (`in_place`). Decided
        // once, here: a hint that goes while old files are served changes nothing.
        let mut glance = None;
        let clean = crate::ending::clean_handover(r.how, r.mine);
        let mut in_place = false;
        if !self.storage.network {
            let superseded: Vec<File> = lock(&self.superseded).drain(..).collect();
            let replaced = lock(&self.replaced);
            let written = lock(&self.written);
            let kept = written.as_ref().and_then(|w| w.kept.as_ref());
            in_place =
                clean && kept.is_some_and(|k| crate::klock::waiting_hinted(k).unwrap_or(false));
            let kept = kept.filter(|_| !in_place);
            let old: Vec<&File> = superseded.iter().chain(replaced.iter()).collect();
            let files: Vec<&File> = old.iter().copied().chain(kept).collect();
            let mut seen = mutex::nobody_blocked_at_a_glance(&files);
            if kept.is_some() {
                glance = seen.pop();
            }
            // Served: a file someone may be blocked on, or that another program has open for
            // writing (on an NFS server, a client's flock(1) polls: /proc/locks never shows it
            // blocked, and the server holds the file open read-write for it; the glance says so).
            let waited_on: Vec<&File> = (old.into_iter().zip(seen))
                .filter(|(_, s)| *s != Some(false))
                .map(|(f, _)| f)
                .collect();
            if !waited_on.is_empty() {
                // Serving may take a while: LOCK's own file is looked at again below.
                glance = None;
                handover::serve_old_waiters(waited_on, &self.paths.lock, r.on_serve);
            }
            // Let go explicitly: a duplicate handed to the guardian (`old_locks`) must not keep
            // them past our release.
            for f in superseded.iter().chain(replaced.iter()) {
                let _ = crate::klock::let_go_lock_file(f);
            }
        }
        let witness = lock(&self.witness).take();
        // Our kernel mark goes before anything says the lock is free (a contender that finds
        // it free while the mark is held waits for a holder it cannot see).
        if let Some(w) = &witness {
            w.drop_mark();
        }
        let written = lock(&self.written).take();
        // Closed when this returns, after the handover: freeing old files is off its path.
        let replaced = lock(&self.replaced).take();
        // Our holder's mark goes only once LOCK no longer says we hold it.
        let mark = lock(&self.mark).take();
        // Util-linux flock(1) (or any program) blocked for our flock on LOCK's file: it must get
        // that lock on the file LOCK still names, so we release in place for it (PROTOCOL.md §10).
        let local = !self.storage.network;
        let blocked = local
            && !in_place
            && glance != Some(Some(false))
            && (written.as_ref().and_then(|w| w.kept.as_ref())).is_some_and(mutex::someone_blocked);
        // A program that has LOCK's file open for writing, not blocked: on an NFS server, a
        // client's flock(1) polls, and /proc/locks never shows it blocked. The file must stay
        // LOCK for it too: released in place (after an unclean end as well, whose ending is
        // then not recorded, as for a blocked one).
        let opened = local
            && !in_place
            && !blocked
            && glance != Some(Some(false))
            && (written.as_ref().and_then(|w| w.kept.as_ref()))
                .is_some_and(handover::opened_for_writing);
        // On a local file system, with someone waiting: mark our file released in place (no
        // mutex: the file is the one we renamed into place, which only we change in place, and
        // a breaker replaces the whole file). Its inotify event wakes the head waiter at once.
        // Only after a clean end: a record released in place says nothing of how (`ending.rs`).
        let (handed, written) = match written {
            Some(w) if local && !blocked && (clean || opened) => {
                match handover::release_in_place(&self.paths, r.bytes, w, in_place || opened) {
                    Ok(f) => (Some(f), None),
                    Err(w) => (None, Some(w)),
                }
            }
            other => (None, other),
        };
        (r.stop)();
        if let Some(f) = handed {
            return handover::settle(&self.paths, f, self.sync, replaced, mark);
        }
        // Our flock on LOCK's file (if any) is held until the full released record has been
        // renamed over it, then let go of explicitly: a duplicate of its descriptor (the
        // `run` guardian's, `LeaseGuard::lock_file_descriptor`) may outlive ours for a moment.
        let kept = written.as_ref().and_then(|w| w.kept.as_ref());
        let outcome = if blocked {
            Ok(Wrote::Blocked)
        } else {
            self.write_released(&r, witness, kept, local && clean)
        };
        if !matches!(outcome, Ok(Wrote::Blocked | Wrote::Hinted))
            && let Some(k) = kept
        {
            let _ = if local {
                crate::klock::let_go_lock_file(k)
            } else {
                crate::klock::let_go_in_place(k)
            };
        }
        let marked = match outcome {
            Ok(Wrote::Full) | Err(Error::Lost { .. }) => return Ok(()),
            Err(e) => return self.release_in_header(&r, e),
            // A contender's hint since our first look: released in place, as then.
            Ok(Wrote::Hinted) => {
                written.and_then(|w| handover::release_in_place(&self.paths, r.bytes, w, true).ok())
            }
            // Somebody blocked for our flock: released in place, for them.
            Ok(Wrote::Blocked) => (written.and_then(|w| w.kept))
                .and_then(|f| handover::release_to_blocked(&self.paths, r.bytes, f).ok()),
        };
        match marked {
            Some(f) => handover::settle(&self.paths, f, self.sync, replaced, mark),
            None => self.release_in_header(
                &r,
                Error::Io {
                    path: self.paths.lock.clone(),
                    op: "mark the lease released in place",
                    source: std::io::Error::other("it no longer holds our lease as written"),
                },
            ),
        }
    }
}
