//! How a lock's jobs are bound to it: what judging and stopping an old job need from a store
//! besides its leases.
//!
//! Owns: the [`Binding`] trait, its implementation on [`LockPaths`], and the file store's job
//! evidence (`file_evidence`, which `FileStore`'s binding in `file/origin.rs` uses too); the
//! etcd store's binding (by environment alone) is in `etcd/mod.rs`.
//! Must never: depend on the judge or the store traits (they depend on it), or trust a file
//! another user can write as evidence (see `process.rs` and PROTOCOL.md §10).

use std::path::Path;

use crate::paths::LockPaths;
use crate::process::JobEvidence;
use crate::record::Lease;

/// How a lock's jobs are bound to it, and where this host's observations of it are kept: what
/// judging and stopping an old job need from a store besides its leases.
///
/// The file store answers with LOCK's path, the evidence of `process.rs` (the job's environment
/// naming this LOCK and lease id, or the holder's `O_PATH` mark on this lock's mutex file) and
/// the per-uid observation files beside LOCK; the etcd store, which has no files, names its lock
/// by its URL, binds jobs by their environment alone, and keeps observations in memory.
pub(crate) trait Binding: Sync + std::fmt::Debug {
    /// The lock's name: what errors and verdicts name, and what its jobs carry in
    /// `LEASEHOLD_LOCK`.
    fn lock(&self) -> &Path;
    /// The kernel evidence that a process belongs to `lease`'s job on this lock, made now (a
    /// replaced mutex file is noticed).
    fn evidence(&self, lease: &Lease) -> JobEvidence;
    /// Where this host keeps its observations of a foreign heartbeat, if the store keeps them
    /// across processes (`None`: each process remembers only what it saw itself).
    fn observations(&self) -> Option<&LockPaths>;
}

impl Binding for LockPaths {
    fn lock(&self) -> &Path {
        &self.lock
    }
    fn evidence(&self, lease: &Lease) -> JobEvidence {
        file_evidence(self, self, lease)
    }
    fn observations(&self) -> Option<&LockPaths> {
        Some(self)
    }
}

/// The file store's evidence for `lease`, kept in the file `file` (LOCK itself, or a holder file
/// of a shared or counted lock) of the lock `origin`: a process carrying `origin`'s LOCK path and
/// the lease id in its environment, or holding the holder's mark on `origin`'s mutex — and, for
/// a script-mode lease, the script itself, which carries nothing in its environment: named by
/// the lease file, believed only when its own uid (or root) wrote that file (PROTOCOL.md §10).
pub(crate) fn file_evidence(origin: &LockPaths, file: &LockPaths, lease: &Lease) -> JobEvidence {
    let h = &lease.holder;
    let mut ev = JobEvidence::for_lock(&lease.lease_id, h.uid, origin);
    let trusted = crate::fsio::written_by_holder(file, lease);
    if !trusted {
        // The holder's mark binds a process to a mutex *inode*; a record that anyone else could
        // have written (a forgery naming another lock's holder, whose mutex file was renamed
        // here) must not borrow it. Its job's environment still binds it to this lock.
        ev.mutex = None;
    }
    match (h.on_behalf, h.child_pid, h.child_start) {
        (true, Some(c), Some(cs)) if trusted => ev.with_trusted_child(c, cs),
        _ => ev,
    }
}
