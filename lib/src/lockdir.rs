//! LOCK's directory, opened once: every file leasehold touches beside LOCK (and LOCK itself) is
//! reached through this one descriptor.
//!
//! Owns: the directory descriptor and the `*at` calls made through it (open, stat, rename,
//! unlink, mkdir, list) — none of which follows a symbolic link at the name it is given —,
//! exclusive creation (under unpredictable names for temp files), the modes new helper files get
//! in a group-shared directory, and the trust rule every existing helper file is checked against
//! after opening: a regular file with one link, owned by someone the directory lets share it.
//! Must never: follow a link at a name in the directory; open an existing name with `O_CREAT`
//! or `O_TRUNC`; create a file except with `O_EXCL`; unlink a name it did not check just before.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::error::{Error, Result};

/// The sticky bit (`S_ISVTX`).
const STICKY: u32 = 0o1000;
/// Group write permission.
const GROUP_WRITE: u32 = 0o020;
/// Write permission for others.
const OTHER_WRITE: u32 = 0o002;

/// How many times a call by name is made again when NFS answers ESTALE.
pub(crate) const STALE_TRIES: u32 = 10;

/// The nap before try `n` (from 1) of a call NFS answered ESTALE: 1 ms doubling, at most
/// 50 ms (about a quarter of a second in all): time for the client to drop what it cached of
/// the replaced file.
pub(crate) fn stale_nap(n: u32) {
    let ms = (1u64 << n.min(6)).min(50);
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// Runs a call that names a file in the directory, again (a bounded number of times) while an
/// NFS client answers ESTALE: the name led to a file handle that another host (or the server's
/// own path) has just replaced, and a new call looks the name up afresh. A race, not an error.
///
/// Also again, after a short nap, while an open answers EWOULDBLOCK: another process holds a
/// lease on the file for the microseconds it takes to ask whether anyone else has it open
/// (`klock::open_only_here`, a holder's release), and our opens never block (`O_NONBLOCK`, so
/// that a FIFO planted at a name cannot hang us) — the kernel answers such an open at once
/// instead of letting it wait for the lease to go. A race too. (A regular file's open answers
/// it for nothing else.)
fn fresh<T>(mut call: impl FnMut() -> rustix::io::Result<T>) -> rustix::io::Result<T> {
    let mut tries = 0;
    let mut leased = 0;
    loop {
        match call() {
            Err(rustix::io::Errno::STALE) if tries < STALE_TRIES => {
                tries += 1;
                stale_nap(tries);
            }
            Err(rustix::io::Errno::WOULDBLOCK) if leased < LEASED_TRIES => {
                leased += 1;
                leased_nap(leased);
            }
            other => return other,
        }
    }
}

/// How many times an open answered EWOULDBLOCK is made again (see [`fresh`]): with
/// [`leased_nap`], about two seconds in all — far beyond the microseconds a lease is held, yet
/// bounded (a holder that died between taking and letting go of its lease, while another
/// process shares its descriptor, leaves it until the kernel's lease-break-time, 45 s).
const LEASED_TRIES: u32 = 420;

/// The nap before try `n` (from 1) of an open answered EWOULDBLOCK: 20 µs doubling, at most
/// 5 ms.
fn leased_nap(n: u32) {
    let us = (20u64 << n.min(8)).min(5_000);
    std::thread::sleep(std::time::Duration::from_micros(us));
}

/// What `stat` says of a file, as far as leasehold needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub dev: u64,
    pub ino: u64,
    /// The whole `st_mode`: type and permission bits.
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Meta {
    pub(crate) fn of(m: &std::fs::Metadata) -> Meta {
        Meta {
            dev: m.dev(),
            ino: m.ino(),
            mode: m.mode(),
            nlink: m.nlink(),
            uid: m.uid(),
            gid: m.gid(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    // The field types of `struct stat` differ between architectures.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    fn of_stat(s: &rustix::fs::Stat) -> Meta {
        Meta {
            dev: s.st_dev as u64,
            ino: s.st_ino as u64,
            mode: s.st_mode as u32,
            nlink: s.st_nlink as u64,
            uid: s.st_uid as u32,
            gid: s.st_gid as u32,
            size: s.st_size.max(0) as u64,
            mtime: (s.st_mtime as i64, s.st_mtime_nsec as i64),
            ctime: (s.st_ctime as i64, s.st_ctime_nsec as i64),
        }
    }

    /// Device and inode.
    pub(crate) fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    pub(crate) fn is_file(&self) -> bool {
        self.mode & 0o170000 == 0o100000
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.mode & 0o170000 == 0o040000
    }

    /// What kind of file this is, in words.
    pub(crate) fn kind(&self) -> &'static str {
        match self.mode & 0o170000 {
            0o100000 => "a regular file",
            0o040000 => "a directory",
            0o120000 => "a symbolic link",
            0o010000 => "a FIFO",
            0o140000 => "a socket",
            0o020000 => "a character device",
            0o060000 => "a block device",
            _ => "a special file",
        }
    }
}

/// The name of the user `uid`, or `uid N` when it has none.
pub(crate) fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => format!("uid {uid}"),
    }
}

/// LOCK's directory, open.
#[derive(Debug)]
pub(crate) struct LockDir {
    fd: OwnedFd,
    path: PathBuf,
    /// The directory's owner, group and mode when it was opened.
    pub meta: Meta,
    /// Our effective uid.
    euid: u32,
    /// Whether the directory is on ext4, asked once (`fstatfs`) by the first
    /// [`LockDir::preallocate`].
    ext4: std::sync::OnceLock<bool>,
    /// The `diskseq` of the directory's block device, read once by the first
    /// [`LockDir::diskseq`]: the descriptor stays on the attachment it was opened on.
    diskseq: std::sync::OnceLock<u64>,
}

impl LockDir {
    /// Opens the directory at `path` (already canonical: no symlink is followed on the way).
    pub(crate) fn open(path: &Path) -> Result<LockDir> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| Error::io(path, "open the lock's directory", e.into()))?;
        let meta = rustix::fs::fstat(&fd)
            .map(|s| Meta::of_stat(&s))
            .map_err(|e| Error::io(path, "stat the lock's directory", e.into()))?;
        Ok(LockDir {
            fd,
            path: path.to_path_buf(),
            meta,
            euid: rustix::process::geteuid().as_raw(),
            ext4: std::sync::OnceLock::new(),
            diskseq: std::sync::OnceLock::new(),
        })
    }

    /// The directory's path (for messages).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this directory (for messages only: never opened by path).
    pub(crate) fn join(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// A path that names this very directory through our descriptor (for inotify, which takes
    /// a path: the kernel resolves it to the directory we opened, whatever its name leads to now).
    pub(crate) fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Group-shared: writable by its group and not sticky (a sticky directory lets only a
    /// file's owner rename or remove it, so another member could not take over).
    pub(crate) fn group_shared(&self) -> bool {
        self.meta.mode & GROUP_WRITE != 0 && self.meta.mode & STICKY == 0
    }

    /// Writable by everyone and not sticky.
    pub(crate) fn world_shared(&self) -> bool {
        self.meta.mode & OTHER_WRITE != 0 && self.meta.mode & STICKY == 0
    }

    /// Sticky (like `/tmp` and `/run/lock`).
    pub(crate) fn sticky(&self) -> bool {
        self.meta.mode & STICKY != 0
    }

    /// The mode a new shared helper file (mutex, ticket) or directory gets: `base`, plus the
    /// group write bit in a group-shared directory (and the others' write bit too in a
    /// directory everyone may write, not sticky), so that every user who shares the directory
    /// can use it whatever the creator's umask (as git's `core.sharedRepository=group` does).
    pub(crate) fn shared_mode(&self, base: u32) -> u32 {
        if self.world_shared() {
            base | GROUP_WRITE | OTHER_WRITE
        } else if self.group_shared() {
            base | GROUP_WRITE
        } else {
            base
        }
    }

    /// Opens an existing `name`, read-only or read-write, never following a symlink, never
    /// blocking on a FIFO, never becoming a controlling terminal; never creates it.
    pub(crate) fn open_existing(&self, name: &OsStr, write: bool) -> io::Result<File> {
        let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
        let fd = fresh(|| {
            rustix::fs::openat(
                &self.fd,
                name,
                access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
                Mode::empty(),
            )
        })?;
        Ok(File::from(fd))
    }

    /// The directory itself opened again (read-only): a descriptor of its own, whose kernel
    /// locks are its own (`klock::announce`).
    pub(crate) fn reopen(&self) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// An `O_PATH` descriptor on `name` (never following a symlink): it names the file without
    /// opening it for reading or writing.
    pub(crate) fn open_path(&self, name: &OsStr) -> io::Result<OwnedFd> {
        Ok(rustix::fs::openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// Creates `name` exclusively (read-write), never through a symlink, with exactly `mode`
    /// whatever the umask (or a default ACL) took from it, and returns it with its identity
    /// (device, inode). The identity comes from an `fstat`, which every caller needed anyway;
    /// the same `fstat` tells whether the mode has to be fixed, so the `fchmod` is made only
    /// when the permission bits the file was created with differ from `mode` (under the usual
    /// umask 022 a 0644 file needs none; a group-shared 0664 one does). Either way no more
    /// system calls than an unconditional `fchmod` followed by the caller's own `fstat`.
    pub(crate) fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<(File, (u64, u64))> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR
                | OFlags::CREATE
                | OFlags::EXCL
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::NOCTTY
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        let file = File::from(fd);
        let fixed = (|| -> io::Result<(u64, u64)> {
            let meta = Meta::of_stat(&rustix::fs::fstat(&file)?);
            if meta.mode & 0o7777 != mode & 0o7777 {
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))?;
            }
            Ok(meta.id())
        })();
        match fixed {
            Ok(id) => Ok((file, id)),
            Err(e) => {
                let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
                Err(e)
            }
        }
    }

    /// Creates a new file exclusively under an unpredictable name: `template` with its last 16
    /// bytes (which must be ASCII) replaced by random hex digits. Returns the file and its name.
    /// Returns the file, its name and its identity (see [`LockDir::create_new`]).
    pub(crate) fn create_temp(
        &self,
        template: &OsStr,
        mode: u32,
    ) -> io::Result<(File, OsString, (u64, u64))> {
        let bytes = template.as_bytes();
        let keep = bytes.len().saturating_sub(16);
        let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
        for _ in 0..16 {
            let mut name = bytes[..keep].to_vec();
            name.extend_from_slice(random_hex16().as_bytes());
            let name = OsStr::from_bytes(&name).to_os_string();
            match self.create_new(&name, mode) {
                Ok((f, m)) => return Ok((f, name, m)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// `lstat` of `name` (never following a symlink); `None` when there is no such name.
    pub(crate) fn stat(&self, name: &OsStr) -> io::Result<Option<Meta>> {
        match fresh(|| rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)) {
            Ok(s) => Ok(Some(Meta::of_stat(&s))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Renames `from` over `to`, both in this directory.
    pub(crate) fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        Ok(fresh(|| {
            rustix::fs::renameat(&self.fd, from, &self.fd, to)
        })?)
    }

    /// Renames `from` in this directory over `to` in `dest`.
    pub(crate) fn rename_to(&self, from: &OsStr, dest: &LockDir, to: &OsStr) -> io::Result<()> {
        Ok(rustix::fs::renameat(&self.fd, from, &dest.fd, to)?)
    }

    /// Unlinks `name` if it is still the file `id` (device, inode) and has no other link.
    /// Returns whether it did.
    pub(crate) fn unlink_if(&self, name: &OsStr, id: (u64, u64)) -> bool {
        match self.stat(name) {
            Ok(Some(m)) if m.id() == id && m.is_file() && m.nlink <= 1 => {
                rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()).is_ok()
            }
            _ => false,
        }
    }

    /// Unlinks `name` if it is a regular file with one link whose owner we trust (see
    /// [`LockDir::check`]): leftovers of leasehold's own, never anybody else's file.
    pub(crate) fn unlink_leftover(&self, name: &OsStr) -> bool {
        match self.stat(name) {
            Ok(Some(m)) if self.check(name, &m, "leftover").is_ok() => self.unlink_if(name, m.id()),
            _ => false,
        }
    }

    /// Creates the directory `name` with exactly `mode` (whatever the umask), if it is missing.
    pub(crate) fn mkdir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) => {
                if let Ok(Some(sub)) = self.open_subdir(name) {
                    let _ = rustix::fs::fchmod(&sub.fd, Mode::from_raw_mode(mode));
                }
                Ok(())
            }
            Err(rustix::io::Errno::EXIST) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the subdirectory `name` without following a symlink at it. `Ok(None)` when there is
    /// no such name; an error when the name is a symlink or not a directory.
    pub(crate) fn open_subdir(&self, name: &OsStr) -> io::Result<Option<LockDir>> {
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let meta = Meta::of_stat(&rustix::fs::fstat(&fd)?);
        Ok(Some(LockDir {
            fd,
            path: self.path.join(name),
            meta,
            euid: self.euid,
            ext4: std::sync::OnceLock::new(),
            diskseq: std::sync::OnceLock::new(),
        }))
    }

    /// The `diskseq` of the directory's block device (`read` asks sysfs), asked once per
    /// `LockDir`: a disk that drops off and comes back is another attachment, which this
    /// descriptor never reaches (a new `LockDir` is opened on it, and reads it anew).
    pub(crate) fn diskseq(&self, read: impl FnOnce(u64) -> u64) -> u64 {
        *self.diskseq.get_or_init(|| read(self.meta.dev))
    }

    /// Gives `f`, a new file of ours in this directory about to have `len` bytes written,
    /// its blocks up front when the directory is on ext4 (`fsinfo::preallocate`). Whether it
    /// is, is asked of the directory once per `LockDir`, not of every file written.
    pub(crate) fn preallocate(&self, f: &File, len: usize) {
        if *self.ext4.get_or_init(|| crate::fsinfo::is_ext4(&self.fd)) {
            crate::fsinfo::preallocate(f, len);
        }
    }

    /// The names in the directory (without `.` and `..`).
    pub(crate) fn names(&self) -> io::Result<Vec<OsString>> {
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(&self.fd)? {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                out.push(OsStr::from_bytes(n).to_os_string());
            }
        }
        Ok(out)
    }

    /// fsync the directory, so that a rename in it is durable. Some file systems refuse fsync
    /// on directories; the rename is then as durable as it gets.
    pub(crate) fn sync(&self) -> Result<()> {
        match rustix::fs::fsync(&self.fd) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => Ok(()),
            Err(e) => Err(Error::io(&self.path, "fsync the directory", e.into())),
        }
    }

    /// The trust rule for an existing helper file `name` (`role` says which, for messages), as
    /// `meta` (from `fstat` of the descriptor just opened, or `lstat`) shows it:
    /// - a regular file (a directory, FIFO, socket or device squatting the name: refused, 65);
    /// - with exactly one link (a hard link planted to some other file: refused, 65);
    /// - owned by us, or by root, or we are root, or — in a group-shared directory — its group
    ///   is the directory's group, or the directory is writable by everyone and not sticky
    ///   (refused otherwise, 77: we do not use another user's file).
    ///
    /// In a sticky directory a file of another user is refused too unless we are root: there
    /// only its owner may rename over it or remove it, so we could not take the lock over.
    pub(crate) fn check(&self, name: &OsStr, meta: &Meta, role: &str) -> Result<()> {
        let path = self.join(name);
        // Named only for a refusal: a user lookup (NSS) costs a dozen system calls.
        let owner = || user_name(meta.uid);
        if !meta.is_file() {
            return Err(Error::Squatted {
                path,
                why: format!(
                    "{} owned by {} has the name of leasehold's {role}; leasehold uses \
                     only its own regular files there and left it untouched: remove it",
                    meta.kind(),
                    owner()
                ),
            });
        }
        if meta.nlink != 1 {
            return Err(Error::Squatted {
                path,
                why: format!(
                    "the {role} has {} hard links (owner {}): a link planted to another \
                     file; leasehold left it untouched: remove this name",
                    meta.nlink,
                    owner()
                ),
            });
        }
        self.check_owner(name, meta, role)
    }

    /// The ownership half of [`LockDir::check`].
    pub(crate) fn check_owner(&self, name: &OsStr, meta: &Meta, role: &str) -> Result<()> {
        if meta.uid == self.euid || self.euid == 0 {
            return Ok(());
        }
        let path = self.join(name);
        let owner = user_name(meta.uid);
        let me = user_name(self.euid);
        let dir = self.path.display();
        if self.sticky() {
            // Who may replace a file in a sticky directory: its owner, the directory's owner
            // (unless that is us: leasehold still refuses) and root, each named once ("only
            // root", never "only root or root").
            let mut may = vec![owner.clone()];
            let dir_owner = (self.meta.uid != self.euid).then(|| user_name(self.meta.uid));
            for other in dir_owner.into_iter().chain([user_name(0)]) {
                if !may.contains(&other) {
                    may.push(other);
                }
            }
            let may = match may.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => owner.clone(),
            };
            return Err(Error::Untrusted {
                path,
                why: format!(
                    "the {role} belongs to {owner}, and {dir} is sticky (mode {:o}): only \
                     {may} can replace it there, so {me} cannot share this lock. To \
                     share a lock between users, keep it in a group-shared directory (`install \
                     -d -m 2775 -g GROUP DIR`; README: \"Sharing a lock between users\")",
                    self.meta.mode & 0o7777
                ),
            });
        }
        // In a directory anyone may write (not sticky), anyone can already replace every file:
        // a file of any owner there is shared as far as the directory can share it.
        if meta.uid == 0
            || self.world_shared()
            || (self.group_shared() && meta.gid == self.meta.gid)
        {
            return Ok(());
        }
        Err(Error::Untrusted {
            path,
            why: format!(
                "the {role} belongs to {owner}, not to {me}, and {dir} is not shared with \
                 {owner} through its group: leasehold will not use another user's file. Make \
                 {dir} group-shared (`chgrp GROUP {dir}; chmod 2775 {dir}`) or remove the file"
            ),
        })
    }
}

/// 16 random hex digits (getrandom; falls back to std's randomly keyed hasher).
fn random_hex16() -> String {
    let mut buf = [0u8; 8];
    if rustix::rand::getrandom(&mut buf, rustix::rand::GetRandomFlags::empty()).is_err() {
        use std::hash::BuildHasher;
        let s = std::collections::hash_map::RandomState::new();
        buf = s
            .hash_one((std::process::id(), std::time::Instant::now()))
            .to_le_bytes();
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_unpredictable_and_keep_the_template_length() {
        let d = tempfile::tempdir().unwrap();
        let dir = LockDir::open(&std::fs::canonicalize(d.path()).unwrap()).unwrap();
        let t = OsStr::new(".x.leasehold-tmp-0000000000000000");
        let (_a, na, _) = dir.create_temp(t, 0o644).unwrap();
        let (_b, nb, _) = dir.create_temp(t, 0o644).unwrap();
        assert_ne!(na, nb);
        assert_eq!(na.len(), t.len());
        assert!(na.as_bytes().starts_with(b".x.leasehold-tmp-"));
    }

    /// Under the process's umask (022 or 002 in practice, whatever it is here), a new helper
    /// file gets exactly the mode asked for, whether or not the umask took bits from it (0664
    /// and 0666 lose some under 022, 0600 and 0644 none), and the returned identity is the file's.
    #[test]
    fn a_new_file_has_exactly_the_mode_asked_for_and_its_own_identity() {
        let d = tempfile::tempdir().unwrap();
        let dir = LockDir::open(&std::fs::canonicalize(d.path()).unwrap()).unwrap();
        for mode in [0o600, 0o644, 0o664, 0o666, 0o1644] {
            let name = format!("f{mode:o}");
            let (f, id) = dir.create_new(OsStr::new(&name), mode).unwrap();
            let now = Meta::of(&f.metadata().unwrap());
            assert_eq!(now.mode & 0o7777, mode, "{name}: mode {:o}", now.mode);
            assert_eq!(id, now.id(), "{name}: the returned identity is the file's");
            let by_name = std::fs::symlink_metadata(d.path().join(&name)).unwrap();
            assert_eq!(by_name.mode() & 0o7777, mode, "{name}");
        }
    }

    #[test]
    fn a_hard_link_or_a_directory_at_a_helper_name_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = LockDir::open(&std::fs::canonicalize(d.path()).unwrap()).unwrap();
        std::fs::write(d.path().join("victim"), "x").unwrap();
        std::fs::hard_link(d.path().join("victim"), d.path().join("m")).unwrap();
        std::fs::create_dir(d.path().join("q")).unwrap();
        let m = dir.stat(OsStr::new("m")).unwrap().unwrap();
        let e = dir.check(OsStr::new("m"), &m, "mutex").unwrap_err();
        assert!(matches!(e, Error::Squatted { .. }), "{e}");
        let q = dir.stat(OsStr::new("q")).unwrap().unwrap();
        let e = dir.check(OsStr::new("q"), &q, "mutex").unwrap_err();
        assert!(matches!(e, Error::Squatted { .. }), "{e}");
        assert!(!dir.unlink_leftover(OsStr::new("m")));
        assert!(d.path().join("m").exists());
    }
}
