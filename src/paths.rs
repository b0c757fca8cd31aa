//! The files that make up one lock: LOCK itself and its helpers beside it.
//!
//! Owns: turning the path a user named into an absolute LOCK path (directory part canonicalised,
//! final component never followed) and deriving every helper file name from it.
//! Must never: name a file outside LOCK's directory, or follow a symlink at LOCK.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// LOCK and the helper files leasehold keeps beside it.
///
/// For LOCK = `/srv/deploy.lock`:
///
/// | file | role |
/// |---|---|
/// | `/srv/deploy.lock` | the JSON lease |
/// | `/srv/.deploy.lock.leasehold-mutex` | flock mutex and fencing-token high-water mark; never renamed or deleted |
/// | `/srv/.deploy.lock.leasehold-tmp` | the one temp file that atomic writes rename into place |
/// | `/srv/.deploy.lock.leasehold-seen` | what hosts have observed of the current lease |
/// | `/srv/.deploy.lock.leasehold-queue/` | the FIFO wait queue |
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let p = leasehold::LockPaths::new("/tmp/deploy.lock")?;
/// assert_eq!(p.mutex.file_name().unwrap(), ".deploy.lock.leasehold-mutex");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockPaths {
    /// LOCK, absolute.
    pub lock: PathBuf,
    /// The directory holding LOCK, canonical.
    pub dir: PathBuf,
    /// The mutex file.
    pub mutex: PathBuf,
    /// The temp file for atomic replacement.
    pub tmp: PathBuf,
    /// The observation file.
    pub seen: PathBuf,
    /// The wait queue directory.
    pub queue: PathBuf,
}

impl LockPaths {
    /// Resolves `lock`: its directory must exist; its final component is never followed.
    pub fn new(lock: impl AsRef<Path>) -> Result<LockPaths> {
        let lock = lock.as_ref();
        let bad = |why: &str| Error::BadPath {
            path: lock.to_path_buf(),
            why: why.to_string(),
        };
        let name: OsString = match lock.file_name() {
            Some(n) => n.to_os_string(),
            None => return Err(bad("names no file (ends in '/' or '..')")),
        };
        if lock.as_os_str().as_encoded_bytes().ends_with(b"/") {
            return Err(bad("names a directory (ends in '/')"));
        }
        let parent = match lock.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = std::fs::canonicalize(&parent)
            .map_err(|e| Error::io(&parent, "resolve the lock's directory", e))?;
        let helper = |suffix: &str| {
            let mut n = OsString::from(".");
            n.push(&name);
            n.push(suffix);
            dir.join(n)
        };
        Ok(LockPaths {
            lock: dir.join(&name),
            mutex: helper(".leasehold-mutex"),
            tmp: helper(".leasehold-tmp"),
            seen: helper(".leasehold-seen"),
            queue: helper(".leasehold-queue"),
            dir,
        })
    }
}
