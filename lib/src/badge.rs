//! A script-mode keeper's badge, for a lock with no directory of its own (`etcd://`, `s3://`):
//! kernel evidence, for `leasehold unlock`, that a process is the keeper of one lease.
//!
//! Owns: the badge file — `keeper-LEASE_ID` in this user's runtime directory (`runtime.rs`:
//! ours, writable by nobody else), created exclusively by the keeper once its lease is taken,
//! kept open as an `O_PATH` descriptor for as long as it holds the lease, and removed when the
//! keeper lets go of it — and finding it again by lease id. A lock file has the same evidence
//! in its holder's mark on the mutex file (PROTOCOL.md §7); a store URL names no directory to
//! keep one in, and its record is writable by anyone with the store's credentials, so the
//! record's word alone never leads to a signal. Must never: follow a link; create or remove a
//! file outside that directory, or one it did not create itself; accept a lease id that is not
//! plain hexadecimal (it becomes a file name); use a directory another user could write.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::error::{Error, Result};

/// The badge's name for `lease_id`, if it is a lease id (1–64 lowercase hexadecimal digits:
/// leasehold's are 32) and so a safe file name.
fn name(lease_id: &str) -> Option<OsString> {
    let ok = !lease_id.is_empty()
        && lease_id.len() <= 64
        && lease_id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then(|| OsString::from(format!("keeper-{lease_id}")))
}

/// The runtime directory, opened without following a link, if it is ours and nobody else may
/// write it (made first when `create`).
fn directory(create: bool) -> Option<OwnedFd> {
    let path = crate::runtime::directory(create)?;
    let fd = rustix::fs::open(
        &path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    let ours = st.st_uid == rustix::process::geteuid().as_raw();
    (ours && st.st_mode & 0o022 == 0).then_some(fd)
}

/// Held by a keeper for as long as it holds a lease on a lock without a directory: the badge
/// file, open as an `O_PATH` descriptor (the kernel's evidence, in `/proc/PID/fd`, that this
/// process is the keeper), removed on drop.
///
/// ```
/// // A lease id that is not plain hexadecimal never becomes a file name.
/// assert!(leasehold::KeeperBadge::create("../x").is_err());
/// ```
#[derive(Debug)]
pub struct KeeperBadge {
    dir: OwnedFd,
    name: OsString,
    mark: OwnedFd,
}

impl KeeperBadge {
    /// Creates the badge of the lease `lease_id` (exclusively: a file already there is never
    /// taken over) and keeps it open.
    pub fn create(lease_id: &str) -> Result<KeeperBadge> {
        let refused = |why: &str| {
            Error::Settings(format!(
                "cannot make the keeper's badge for lease {}: {why}",
                crate::text::escape(lease_id)
            ))
        };
        let name = name(lease_id).ok_or_else(|| refused("not a lease id"))?;
        let dir = directory(true)
            .ok_or_else(|| refused("no runtime directory of ours that only we may write"))?;
        let made = rustix::fs::openat(
            &dir,
            &name,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| refused(&e.to_string()))?;
        let mark = rustix::fs::openat(
            &dir,
            &name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| refused(&e.to_string()))?;
        if id_of(&made) != id_of(&mark) {
            // Replaced between the two opens: not ours to keep (nor to remove).
            return Err(refused("the file was replaced as it was made"));
        }
        Ok(KeeperBadge { dir, name, mark })
    }
}

/// Device and inode of an open file.
fn id_of(fd: impl AsFd) -> Option<(u64, u64)> {
    rustix::fs::fstat(fd).ok().map(|s| (s.st_dev, s.st_ino))
}

impl Drop for KeeperBadge {
    fn drop(&mut self) {
        // Only the file we made: the name must still lead to it.
        let here = rustix::fs::statat(&self.dir, &self.name, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|s| (s.st_dev, s.st_ino));
        if here.is_some() && here == id_of(&self.mark) {
            let _ = rustix::fs::unlinkat(&self.dir, &self.name, AtFlags::empty());
        }
    }
}

/// Device and inode of the badge of the lease `lease_id` in this user's runtime directory, if
/// there is one: a regular file we own, with one name. What a keeper holding it open shows in
/// `/proc/PID/fd` ([`crate::process::JobEvidence::with_holder_mark`]). Creates nothing.
///
/// ```
/// assert_eq!(leasehold::keeper_badge("0123456789abcdef0123456789abcdef"), None);
/// ```
pub fn keeper_badge(lease_id: &str) -> Option<(u64, u64)> {
    let name = name(lease_id)?;
    let dir = directory(false)?;
    let st = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    let ok = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
        && st.st_uid == rustix::process::geteuid().as_raw()
        && st.st_nlink == 1;
    ok.then_some((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_hexadecimal_lease_ids_name_a_badge() {
        assert!(name("0123abcd").is_some());
        for bad in ["", "../x", "ABCD", "a/b", "x", &"a".repeat(65)] {
            assert!(name(bad).is_none(), "{bad:?}");
        }
    }
}
