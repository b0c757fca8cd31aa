//! The file store of a holder file of a shared or counted lock (`slots.rs`, PROTOCOL.md §13).
//!
//! Owns: making the store whose lease file is holder file K beside LOCK (everything else —
//! the directory, the mutex and token high-water mark, temp files, the queue — is LOCK's),
//! and how any file store names its lock and binds its jobs: by LOCK's own paths, so that a
//! holder file's jobs, which carry LOCK's path, are recognised as this lock's.
//! Must never: let a holder file's store name or bind by the holder file's path.

use super::*;

impl FileStore {
    /// LOCK's own paths (for a holder file's store, those of the lock it belongs to).
    pub(crate) fn origin(&self) -> &LockPaths {
        self.origin.as_ref().unwrap_or(&self.paths)
    }

    /// The store of holder file `k` of this lock (see `Store::holder`).
    pub(super) fn holder_file(&self, k: u32) -> FileStore {
        let origin = self.origin().clone();
        FileStore {
            paths: crate::slots::holder_paths(&origin, k),
            origin: Some(origin),
            ..self.clone()
        }
    }
}

/// A store names its lock, and binds its jobs, by LOCK's own paths — also the store of a holder
/// file of a shared lock, whose jobs carry LOCK's path — and keeps its observations beside the
/// file it reads (a holder file has its own, so that several holders are observed apart).
impl Binding for FileStore {
    fn lock(&self) -> &std::path::Path {
        &self.origin().lock
    }
    fn evidence(&self, lease: &Lease) -> crate::process::JobEvidence {
        crate::store::binding::file_evidence(self.origin(), &self.paths, lease)
    }
    fn observations(&self) -> Option<&LockPaths> {
        Some(&self.paths)
    }
}
