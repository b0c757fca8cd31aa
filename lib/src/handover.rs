//! The fast hand-over on a local file system: a holder releasing to a waiting head in place,
//! and the head taking the lease with its lease prepared ahead of time.
//!
//! Owns: the waiter's hint that it waits (a shared flock on the LOCK file it last read); the
//! holder's release in place (its released bit set on the file it renamed into place, when a
//! waiter's hint is there and the file holds exactly its bytes) and what is done with the files
//! let go of then (made durable, closed later by `grave.rs`); the head's prepared lease
//! (`q-N.lease` beside its ticket: written while it waits, renamed over LOCK when it takes the
//! lease). `builder.rs`, `queue.rs` and `guard.rs` call these; nothing else does a hand-over.
//! Must never: write LOCK's bytes (the release in place is one `fchmod` through a read-only
//! descriptor); mark a file that is not exactly the record we last wrote; rename a prepared file
//! that is not ours (it must still have its one name); keep a descriptor open for writing past
//! the take; be used on a network file system (the callers check).

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

use nix::fcntl::OFlag;

use crate::error::{Error, Result};
use crate::fsio::{self, Seen, Written};
use crate::grave;
use crate::lockdir::LockDir;
use crate::paths::LockPaths;

/// A waiter's hint to the holder that it waits: a shared flock on the LOCK file it judged (kept
/// open between its looks, local file systems only). It goes when that file is closed. Only a
/// hint: both answers a holder gets are safe.
pub(crate) fn announce_waiting(seen: &Seen) {
    let _ = seen.file.try_lock_shared();
}

/// The release of a lease someone waits for. When LOCK is still the file we renamed into place
/// (`w`), a waiter holds a shared flock on it (see [`announce_waiting`]), and it holds exactly
/// `bytes` (our lease as we last wrote it: held, intact): sets its released bit
/// ([`fsio::RELEASED_BIT`]) through a read-only descriptor and returns the file, still open.
/// `None` otherwise: nobody waits (the caller writes the full released record), or LOCK is not
/// simply ours, or we may not chmod it (the caller goes the long way, which reports what
/// happened). Not made durable here (see [`settle`]).
pub(crate) fn release_in_place(paths: &LockPaths, bytes: &[u8], w: Written) -> Option<File> {
    // The file we renamed into place, kept open since; if it is not LOCK any more, nobody
    // reads it by name and marking it released changes nothing.
    let f = match w.kept {
        Some(f) => f,
        None => fsio::open_lock_if(paths, w.id)?,
    };
    match f.try_lock() {
        Err(std::fs::TryLockError::WouldBlock) => {} // a waiter's shared lock
        Ok(()) => {
            // Nobody waits. Let go of the probe at once, not when `f` is closed (which may be
            // later, off the release's way): an exclusive lock on LOCK is what a contender
            // takes for another program's (flock(1)) kernel lock.
            let _ = f.unlock();
            return None;
        }
        Err(_) => return None, // no flock here
    }
    // One byte more than expected, to notice a file that grew.
    let mut now = vec![0u8; bytes.len() + 1];
    match f.read_at(&mut now, 0) {
        Ok(n) if now[..n] == bytes[..] => {}
        _ => return None,
    }
    fsio::mark_released(&f, &paths.lock).ok()?;
    Some(f)
}

/// Finishes a release in place: makes the mark durable (with `sync`), then puts the files let
/// go of — the marked file, the one our lease replaced, and the holder's mark, all read-only or
/// `O_PATH`, none locked by us — aside, to be closed off the waiter's way.
pub(crate) fn settle(
    paths: &LockPaths,
    marked: File,
    sync: bool,
    replaced: Option<File>,
    mark: Option<OwnedFd>,
) -> Result<()> {
    // The waiter replaces the record straight away, so a full released record saying how the
    // job ended would be read by nobody.
    if sync {
        marked
            .sync_all()
            .map_err(|e| Error::io(&paths.lock, "fsync the released mark", e))?;
    }
    grave::bury(
        [Some(marked), replaced]
            .into_iter()
            .flatten()
            .map(OwnedFd::from)
            .chain(mark),
    );
    Ok(())
}

/// The name of the prepared lease of the ticket named `ticket`.
pub(crate) fn prepared_name(ticket: &OsStr) -> OsString {
    let mut n = ticket.to_os_string();
    n.push(".lease");
    n
}

/// Our lease written ahead of time into `q-<seq>.lease` beside our ticket, open, so that taking
/// the lease is a write into a page that exists and one rename (no file to create).
#[derive(Debug)]
pub(crate) struct Prepared {
    path: PathBuf,
    name: OsString,
    file: File,
    /// The same file, read-only: what the holder keeps for its release.
    ro: File,
    id: (u64, u64),
    len: usize,
}

impl Prepared {
    /// Writes `bytes` (the exact length our lease will have when taken) into the prepared lease
    /// of the ticket named `ticket` in the queue directory `q`, created exclusively, and keeps
    /// it open. Local file systems only: on NFS a descriptor kept open across a rename is not
    /// what we want. `None` when it cannot be made (e.g. a skipped waiter's late file has the
    /// name): taking the lease then writes a new file as usual.
    pub(crate) fn write(q: &LockDir, ticket: &OsStr, bytes: &[u8]) -> Option<Prepared> {
        let name = prepared_name(ticket);
        let path = q.join(&name);
        let (file, id) = q.create_new(&name, fsio::LEASE_MODE).ok()?;
        let made = file.write_all_at(bytes, 0).is_ok();
        // The very inode, read-only, through our own descriptor.
        let ro = OpenOptions::new()
            .read(true)
            .custom_flags(OFlag::O_CLOEXEC.bits())
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let (true, Ok(ro)) = (made, ro) else {
            q.unlink_if(&name, id);
            return None;
        };
        Some(Prepared {
            path,
            name,
            file,
            ro,
            id,
            len: bytes.len(),
        })
    }

    /// Whether `bytes` can be written over it: any lease (the same length as drafted needs no
    /// new blocks; another length — a record whose history came out otherwise than drafted,
    /// `ending.rs` — is written and the file cut to it, which still beats a temp file: no file
    /// to create, and nothing left beside LOCK if we are killed mid-way, since whoever removes
    /// our dead ticket removes this file with it).
    pub(crate) fn fits(&self, bytes: &[u8]) -> bool {
        bytes.len() as u64 <= crate::record::MAX_LEASE_BYTES
    }

    /// Takes the lease through the prepared file: writes `bytes` into it, optionally fsyncs it,
    /// renames it over LOCK, and optionally fsyncs LOCK's directory. Under the mutex, with our
    /// ticket still queued. `None` (nothing renamed) when the name is not our file any more:
    /// the caller then writes the lease the usual way.
    pub(crate) fn install(
        self,
        q: &LockDir,
        bytes: &[u8],
        durable: bool,
        paths: &LockPaths,
    ) -> Option<Result<Written>> {
        let p = self;
        // Our file still has its one name (made exclusively, never linked elsewhere: a link
        // count of one is that name), and removing it takes the mutex we hold: it is ours at
        // the rename.
        if !p.file.metadata().is_ok_and(|m| m.nlink() == 1) {
            return None;
        }
        let done = (|| {
            p.file
                .write_all_at(bytes, 0)
                .map_err(|e| Error::io(&p.path, "write our prepared lease", e))?;
            if bytes.len() < p.len {
                p.file
                    .set_len(bytes.len() as u64)
                    .map_err(|e| Error::io(&p.path, "cut our prepared lease", e))?;
            }
            if durable {
                p.file
                    .sync_data()
                    .map_err(|e| Error::io(&p.path, "fsync our prepared lease", e))?;
            }
            q.rename_to(&p.name, paths.handle(), paths.lock_name())
                .map_err(|e| Error::io(&paths.lock, "rename into place", e))?;
            if durable {
                paths.handle().sync()?;
            }
            Ok(Written {
                id: p.id,
                kept: Some(p.ro),
            })
        })();
        if done.is_err() {
            q.unlink_if(&p.name, p.id);
        }
        Some(done)
    }

    /// Removes it (leaving the queue without the lease), if the name is still our file.
    pub(crate) fn discard(self, q: &LockDir) {
        q.unlink_if(&self.name, self.id);
    }
}
