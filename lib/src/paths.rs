//! The files that make up one lock: LOCK itself and its helpers beside it.
//!
//! Owns: turning the path a user named into an absolute LOCK path (directory part canonicalised,
//! final component never followed) and deriving every helper file name from it ([`helper_name`]:
//! the same name on every host and in every process, and never longer than a file name may be).
//! Must never: name a file outside LOCK's directory, or follow a symlink at LOCK.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
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
/// A helper's name is `.NAME` followed by its suffix whenever that fits in `NAME_MAX` (255)
/// bytes. When it does not (LOCK's own name is long), the helper is named `.PREFIX~HASH` and the
/// suffix, where PREFIX is the first 189 bytes of NAME (fewer, to end on a character boundary
/// when NAME is UTF-8) and HASH is the FNV-1a 64 hash of all of NAME's bytes in 16 lowercase hex
/// digits: the same on every host, so every contender finds the same mutex. A LOCK whose own
/// name is longer than 255 bytes is refused ([`Error::NameTooLong`]).
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
    /// The file name of the LOCK whose mutex file `mutex` is (LOCK's own: a holder file of a
    /// shared lock uses LOCK's mutex), as its identity line names it.
    mutex_of: OsString,
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
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong {
                path: lock.to_path_buf(),
                len: name.len(),
                max: NAME_MAX,
            });
        }
        if let Some(prefix) = shortened_shape(name.as_encoded_bytes()) {
            return Err(Error::ReservedName {
                path: lock.to_path_buf(),
                prefix,
            });
        }
        if lock.as_os_str().as_encoded_bytes().ends_with(b"/") {
            return Err(bad("names a directory (ends in '/')"));
        }
        let parent = match lock.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = std::fs::canonicalize(&parent)
            .map_err(|e| Error::io(&parent, "resolve the lock's directory", e))?;
        let helper = |suffix: &str| dir.join(helper_name(&name, suffix));
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
            mutex_of: name,
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

    /// This lock's region of LOCK's directory for kernel locks (`klock::DirRegion`): a function
    /// of LOCK's name alone, so every process derives it. Regions of [`klock::REGION`] bytes,
    /// one per 39-bit hash of the name, never negative.
    pub(crate) fn dir_region(&self) -> crate::klock::DirRegion {
        let slot = fnv1a64(self.lock_name().as_encoded_bytes()) >> 25;
        crate::klock::DirRegion((slot as i64) * crate::klock::REGION)
    }

    /// LOCK's name in its directory.
    pub(crate) fn lock_name(&self) -> &OsStr {
        last(&self.lock)
    }

    /// The file name of the LOCK the mutex file belongs to (its identity line names it).
    pub(crate) fn mutex_of(&self) -> &OsStr {
        &self.mutex_of
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

/// The suffix of the lease that the `flock`-compatible front end keeps beside a user's file.
pub const FLOCK_LEASE_SUFFIX: &str = ".leasehold-flock";

/// Where the lease for a *user's* file lives when that file is locked the flock(1) way (the
/// `flock` name of the `leasehold` binary): beside it, in the same directory, named
/// `.NAME.leasehold-flock` (shortened like every helper name when NAME is long). The user's file
/// itself is never written; this lease is an ordinary LOCK with its own helper files.
///
/// `None` when `file` names no final component (`/`, `.`, a path ending in `..`): such a lock
/// has no directory beside it to keep a lease in. Pure: looks at nothing on disk.
///
/// ```
/// let l = leasehold::lease_beside("/srv/job.sh").unwrap();
/// assert_eq!(l, std::path::Path::new("/srv/.job.sh.leasehold-flock"));
/// assert!(leasehold::lease_beside("/").is_none());
/// ```
pub fn lease_beside(file: impl AsRef<Path>) -> Option<PathBuf> {
    let file = file.as_ref();
    let name = file.file_name()?;
    let parent = file.parent().unwrap_or(Path::new(""));
    Some(parent.join(helper_name(name, FLOCK_LEASE_SUFFIX)))
}

/// The lease beside `file` (see [`lease_beside`]) if one exists there (as anything: the caller
/// that opens it applies the usual checks), else `None`. This is how `leasehold status FILE`
/// finds the lease of a file that the `flock` front end locks.
pub fn existing_lease_beside(file: impl AsRef<Path>) -> Option<PathBuf> {
    let lease = lease_beside(file)?;
    std::fs::symlink_metadata(&lease).ok().map(|_| lease)
}

/// The longest file name (one path component) Linux file systems accept, in bytes.
pub const NAME_MAX: usize = 255;

/// The longest helper suffix [`helper_name`] keeps within [`NAME_MAX`] for any LOCK name.
pub(crate) const MAX_SUFFIX: usize = 48;

/// How many bytes of LOCK's name a shortened helper name keeps: room for the leading `.`, the
/// `~` and 16 hex digits, and a suffix of up to [`MAX_SUFFIX`] bytes.
const SHORT_PREFIX: usize = NAME_MAX - 1 - 1 - 16 - MAX_SUFFIX;

/// The name of the helper file with `suffix` (e.g. `.leasehold-mutex`) for the lock named
/// `lock_name`: `.NAME<suffix>` when that fits in [`NAME_MAX`] bytes, else
/// `.PREFIX~HASH<suffix>` (see [`LockPaths`]), which fits for any suffix of up to
/// [`MAX_SUFFIX`] bytes. Depends on nothing but its arguments, so every process on every host
/// derives the same name.
pub(crate) fn helper_name(lock_name: &OsStr, suffix: &str) -> OsString {
    let name = lock_name.as_encoded_bytes();
    let mut out = OsString::from(".");
    if 1 + name.len() + suffix.len() <= NAME_MAX {
        out.push(lock_name);
        out.push(suffix);
        return out;
    }
    let mut keep = SHORT_PREFIX.min(name.len());
    if let Ok(s) = std::str::from_utf8(name) {
        while !s.is_char_boundary(keep) {
            keep -= 1;
        }
    }
    // On Unix a file name is plain bytes: any prefix of one is a valid name (it cannot hold
    // a '/' or NUL, as the whole name cannot).
    out.push(OsStr::from_bytes(&name[..keep]));
    out.push(format!("~{:016x}", fnv1a64(name)));
    out.push(suffix);
    out
}

/// Whether a LOCK name has the shape of the stem of a shortened helper name (`PREFIX~HASH`,
/// PREFIX as [`helper_name`] cuts it: [`SHORT_PREFIX`] bytes, or up to 3 fewer to end on a
/// character boundary): such a lock's plain helper names (`.NAME` + suffix) would be exactly
/// the shortened ones of a long-named lock, so it is refused. Returns PREFIX's length.
fn shortened_shape(name: &[u8]) -> Option<usize> {
    let prefix = name.len().checked_sub(17)?;
    let (head, tail) = name.split_at(prefix);
    let hex = tail.strip_prefix(b"~")?;
    let lower_hex = hex
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    (lower_hex && !head.is_empty() && (SHORT_PREFIX - 3..=SHORT_PREFIX).contains(&prefix))
        .then_some(prefix)
}

/// FNV-1a, 64 bits: written out here because the helper names depend on it and must not change
/// with a library or compiler version (std's hashers are seeded or unspecified).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn short_names_keep_the_plain_helper_name() {
        let n = helper_name(OsStr::new("deploy.lock"), ".leasehold-mutex");
        assert_eq!(n, ".deploy.lock.leasehold-mutex");
        let just_fits = "x".repeat(NAME_MAX - 1 - ".leasehold-tmp".len());
        let n = helper_name(OsStr::new(&just_fits), ".leasehold-tmp");
        assert_eq!(n.len(), NAME_MAX);
        assert_eq!(n, OsString::from(format!(".{just_fits}.leasehold-tmp")));
    }

    #[test]
    fn long_names_are_shortened_with_a_hash_of_the_whole_name() {
        let name = "n".repeat(NAME_MAX);
        let suffix = "s".repeat(MAX_SUFFIX);
        let n = helper_name(OsStr::new(&name), &suffix);
        assert_eq!(n.len(), NAME_MAX);
        let want = format!(
            ".{}~{:016x}{suffix}",
            &name[..SHORT_PREFIX],
            fnv1a64(name.as_bytes())
        );
        assert_eq!(n, OsString::from(want));
        // Pinned so that a change to the derivation (which would split contenders of different
        // versions between two mutexes) cannot go unnoticed.
        let pinned = helper_name(OsStr::new(&"L".repeat(250)), ".leasehold-mutex");
        let want = format!(".{}~0f91a5d6f33c56c5.leasehold-mutex", "L".repeat(189));
        assert_eq!(pinned, OsString::from(want));
    }

    #[test]
    fn the_flock_lease_sits_beside_the_file_and_its_own_helpers_fit() {
        assert_eq!(
            lease_beside("rel/job.sh").unwrap(),
            Path::new("rel/.job.sh.leasehold-flock")
        );
        assert_eq!(
            lease_beside("data/").unwrap(),
            Path::new(".data.leasehold-flock")
        );
        for p in ["/", ".", "a/.."] {
            assert!(lease_beside(p).is_none(), "{p}");
        }
        // A long name: the lease's own name is shortened, and so are its helpers' names.
        let long = format!("/srv/{}", "n".repeat(NAME_MAX));
        let lease = lease_beside(&long).unwrap();
        let name = lease.file_name().unwrap();
        assert!(name.len() <= NAME_MAX);
        assert!(
            name.as_encoded_bytes()
                .ends_with(FLOCK_LEASE_SUFFIX.as_bytes())
        );
        assert!(helper_name(name, ".leasehold-mutex").len() <= NAME_MAX);
    }

    #[test]
    fn every_name_and_suffix_up_to_the_limits_fits() {
        for len in [
            1, 100, 189, 190, 200, 206, 207, 230, 238, 239, 240, 254, 255,
        ] {
            for slen in [0, 1, 14, 16, 30, 47, 48] {
                let name = "a".repeat(len);
                let suffix = "-".repeat(slen);
                let n = helper_name(OsStr::new(&name), &suffix);
                assert!(n.len() <= NAME_MAX, "{len} + {slen}: {}", n.len());
                assert!(!n.as_encoded_bytes().contains(&b'/'));
                assert!(n.as_encoded_bytes().ends_with(suffix.as_bytes()));
            }
        }
    }

    #[test]
    fn names_sharing_a_long_prefix_get_different_helpers() {
        let common = "p".repeat(200);
        let a = format!("{common}{}", "a".repeat(55));
        let b = format!("{common}{}", "b".repeat(55));
        let ha = helper_name(OsStr::new(&a), ".leasehold-mutex");
        let hb = helper_name(OsStr::new(&b), ".leasehold-mutex");
        assert_ne!(ha, hb);
        assert_eq!(ha, helper_name(OsStr::new(&a), ".leasehold-mutex"));
    }

    #[test]
    fn shortening_never_splits_a_utf8_character_nor_needs_utf8() {
        let name = "é".repeat(127); // 254 bytes; byte 189 falls inside a character
        let n = helper_name(OsStr::new(&name), ".leasehold-queue");
        assert!(n.to_str().is_some(), "{n:?}");
        assert!(n.len() <= NAME_MAX);
        let raw = OsStr::from_bytes(&[0xff; 250]);
        let n = helper_name(raw, ".leasehold-queue");
        assert!(n.len() <= NAME_MAX);
        assert_eq!(
            &n.as_encoded_bytes()[1..1 + SHORT_PREFIX],
            &[0xff; SHORT_PREFIX][..]
        );
    }

    /// A lock literally named like a long lock's shortened helper stem is refused; the same
    /// stem shape of another length, or with capital hex digits, is an ordinary name.
    #[test]
    fn a_lock_name_shaped_like_a_shortened_helper_stem_is_refused() {
        let dir = std::env::temp_dir();
        let long = "L".repeat(250);
        let helper = helper_name(OsStr::new(&long), ".leasehold-mutex");
        let stem = &helper.as_encoded_bytes()[1..helper.len() - ".leasehold-mutex".len()];
        let stem = std::str::from_utf8(stem).unwrap();
        let e = LockPaths::new(dir.join(stem)).unwrap_err();
        assert!(matches!(e, Error::ReservedName { prefix: 189, .. }), "{e}");
        for ok in [
            format!("{}~0f91a5d6f33c56c5", "L".repeat(10)),
            format!("{}~0F91A5D6F33C56C5", "L".repeat(189)),
            format!("{}~0f91a5d6f33c56c5x", "L".repeat(189)),
        ] {
            assert!(LockPaths::new(dir.join(&ok)).is_ok(), "{ok}");
        }
    }

    #[test]
    fn a_lock_name_longer_than_name_max_is_refused() {
        let dir = std::env::temp_dir();
        let e = LockPaths::new(dir.join("z".repeat(NAME_MAX + 1))).unwrap_err();
        assert!(
            matches!(
                e,
                Error::NameTooLong {
                    len: 256,
                    max: 255,
                    ..
                }
            ),
            "{e}"
        );
        assert!(LockPaths::new(dir.join("z".repeat(NAME_MAX))).is_ok());
    }
}
