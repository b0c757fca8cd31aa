//! What a builder keeps between its own acquisitions of one lock.
//!
//! Owns: [`Resolved`] — LOCK's resolved paths, what its file system was found to be, and the
//! kept mutex descriptor — worked out by one `Acquirer` and handed to the next one the same
//! builder (or a clone of it) makes, so that `try_acquire` in a loop does not resolve LOCK again.
//! Must never: outlive a change of LOCK's directory (the acquirer re-resolves when the
//! directory path leads elsewhere) or serve another LOCK.

use crate::fsinfo::FsInfo;
use crate::paths::LockPaths;

use super::Store;
use super::file::FileStore;

/// What a builder keeps between its own calls (see `LeaseBuilder::try_acquire`).
#[derive(Debug)]
pub(crate) struct Resolved {
    pub paths: LockPaths,
    pub fs: FsInfo,
    pub kept: <FileStore as Store>::Kept,
}
