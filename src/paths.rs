//! The files that make up one lock: LOCK itself and its helpers beside it.
//!
//! Owns: turning the path a user named into an absolute LOCK path (directory part canonicalised,
//! final component never followed) and deriving every helper file name from it.
//! Must never: name a file outside LOCK's directory, or follow a symlink at LOCK.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::lockdir::LockDir;

/// LOCK and the helper files leasehold keeps beside it.
///
/// For LOCK = `/srv/deploy.lock`:
///
/// | file | role |
/// |---|---|
/// | `/srv/deploy.lock` | the JSON lease |
/// | `/srv/.deploy.lock.leasehold-mutex` | flock mutex and fencing-token high-water mark; never renamed or deleted |
/// | `/srv/.deploy.lock.leasehold-tmp-<16 random hex digits>` | temp files that atomic writes create exclusively and rename into place |
/// | `/srv/.deploy.lock.leasehold-seen-<uid>` | what this user's processes have observed of the current lease |
/// | `/srv/.deploy.lock.leasehold-queue/` | the FIFO wait queue |
///
/// ```
/// # fn main() -> Result<(), leasehold::Error> {
/// let p = leasehold::LockPaths::new("/tmp/deploy.lock")?;
/// assert_eq!(p.mutex.file_name().unwrap(), ".deploy.lock.leasehold-mutex");
/// # Ok(()) }
/// ```
///
/// LOCK's directory is opened once, here; every file operation goes through that descriptor by
/// name (`openat`, `renameat`, `unlinkat`, `fstatat`, never following a link), so renaming or
/// replacing the directory's path afterwards cannot redirect them.
#[derive(Debug, Clone)]
pub struct LockPaths {
    /// LOCK, absolute.
    pub lock: PathBuf,
    /// The directory holding LOCK, canonical.
    pub dir: PathBuf,
    /// The mutex file.
    pub mutex: PathBuf,
    /// The template of temp files for atomic replacement: its last 16 digits are replaced by
    /// random ones for each file.
    pub tmp: PathBuf,
    /// The observation file of the calling user.
    pub seen: PathBuf,
    /// The wait queue directory.
    pub queue: PathBuf,
    /// LOCK's directory, open.
    handle: Arc<LockDir>,
}

impl PartialEq for LockPaths {
    fn eq(&self, other: &Self) -> bool {
        (&self.lock, &self.mutex, &self.tmp, &self.seen, &self.queue)
            == (
                &other.lock,
                &other.mutex,
                &other.tmp,
                &other.seen,
                &other.queue,
            )
    }
}

impl Eq for LockPaths {}

/// The final component of a path built by [`LockPaths::new`] (always present there).
fn last(p: &Path) -> &OsStr {
    p.file_name().unwrap_or_else(|| OsStr::new("."))
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
        let handle = Arc::new(LockDir::open(&dir)?);
        let uid = rustix::process::geteuid().as_raw();
        Ok(LockPaths {
            lock: dir.join(&name),
            mutex: helper(".leasehold-mutex"),
            tmp: helper(".leasehold-tmp-0000000000000000"),
            seen: helper(&format!(".leasehold-seen-{uid}")),
            queue: helper(".leasehold-queue"),
            dir,
            handle,
        })
    }

    /// Whether the directory's path no longer leads to the directory we opened (unmounted,
    /// mounted over, moved or replaced): a process starting now would use another directory.
    pub(crate) fn dir_moved(&self) -> std::io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&self.dir)?;
        Ok((m.dev(), m.ino()) != self.handle.meta.id())
    }

    /// LOCK's directory, open.
    pub(crate) fn handle(&self) -> &LockDir {
        &self.handle
    }

    /// LOCK's name in its directory.
    pub(crate) fn lock_name(&self) -> &OsStr {
        last(&self.lock)
    }

    /// The mutex file's name.
    pub(crate) fn mutex_name(&self) -> &OsStr {
        last(&self.mutex)
    }

    /// The temp file name template.
    pub(crate) fn tmp_name(&self) -> &OsStr {
        last(&self.tmp)
    }

    /// The observation file's name.
    pub(crate) fn seen_name(&self) -> &OsStr {
        last(&self.seen)
    }

    /// The wait queue directory's name.
    pub(crate) fn queue_name(&self) -> &OsStr {
        last(&self.queue)
    }
}
