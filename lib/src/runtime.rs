//! Where the `flock` front end keeps a file's lease (asked for with `LEASEHOLD_FLOCK_FENCE=1`),
//! and the directory a script-mode keeper's badge lives in (`badge.rs`):
//! on a local file system, in this user's runtime directory, keyed by the locked file's device
//! and inode (and its creation time, where the file system keeps one) — never in the user's
//! directories; on a network file system, where other hosts must see it, beside the file
//! ([`crate::lease_beside`]).
//!
//! Owns: the runtime directory (`/run/lock/leasehold` for root, `$XDG_RUNTIME_DIR/leasehold`
//! otherwise, `/run/user/UID/leasehold` when that variable is unset), its trust check (a real
//! directory owned by us, writable by nobody else — `/run/lock` is world-writable, so a
//! squatter's directory there is refused), and the lease's name in it. Must never: follow a link
//! to the directory; use a directory another user could write; create anything but that one
//! directory (and only when asked to).

use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The runtime directory's own name, inside the base.
const DIR: &str = "leasehold";

/// The base directory for this user: `/run/lock` for root, else `$XDG_RUNTIME_DIR` (absolute)
/// or `/run/user/UID`.
fn base() -> PathBuf {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return PathBuf::from("/run/lock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(p) if p.is_absolute() => p,
        _ => PathBuf::from(format!("/run/user/{uid}")),
    }
}

/// Whether `p` is a directory (not a link) owned by us that no one else may write.
fn trusted(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| {
        m.file_type().is_dir()
            && m.uid() == nix::unistd::geteuid().as_raw()
            && m.mode() & 0o022 == 0
    })
}

/// The runtime directory as it stands.
enum Runtime {
    /// There and trusted.
    Usable(PathBuf),
    /// Not there yet, in a usable base: made on first use.
    Missing(PathBuf),
    /// No usable base, or something untrusted at the name.
    Unusable,
}

/// Looks at the runtime directory, creating nothing.
fn look() -> Runtime {
    let base = base();
    let root = nix::unistd::geteuid().is_root();
    // Root's base is /run/lock (world-writable, sticky): only the subdirectory must be ours.
    let base_ok = if root {
        std::fs::symlink_metadata(&base).is_ok_and(|m| m.file_type().is_dir())
    } else {
        trusted(&base)
    };
    let dir = base.join(DIR);
    match (base_ok, std::fs::symlink_metadata(&dir)) {
        (false, _) => Runtime::Unusable,
        (true, Err(_)) => Runtime::Missing(dir),
        (true, Ok(_)) if trusted(&dir) => Runtime::Usable(dir),
        (true, Ok(_)) => Runtime::Unusable,
    }
}

/// The runtime directory, made (mode 0700; 0755 for root) if missing; `None` when it cannot be
/// used.
fn make() -> Option<PathBuf> {
    match look() {
        Runtime::Usable(d) => Some(d),
        Runtime::Unusable => None,
        Runtime::Missing(d) => {
            let root = nix::unistd::geteuid().is_root();
            let _ = std::fs::DirBuilder::new()
                .mode(if root { 0o755 } else { 0o700 })
                .create(&d);
            trusted(&d).then_some(d)
        }
    }
}

/// The runtime directory, if it can be used: made first when `create` (for a keeper's badge,
/// `badge.rs`), else only if it is there.
pub(crate) fn directory(create: bool) -> Option<PathBuf> {
    if create {
        return make();
    }
    match look() {
        Runtime::Usable(d) => Some(d),
        Runtime::Missing(_) | Runtime::Unusable => None,
    }
}

/// The lease's name for the file `(dev, ino)`: `flock-DEV-INO-BIRTH` (hexadecimal), where BIRTH
/// is the file's creation time in nanoseconds (`statx` `STATX_BTIME`) when `file` still names
/// that inode and its file system records one, so that a lease left behind for a deleted file is
/// never taken for the lease of a new file that reuses its inode number; `flock-DEV-INO` where
/// the file system keeps no creation time.
fn name(file: &Path, dev: u64, ino: u64) -> OsString {
    match birth(file, (dev, ino)) {
        Some(b) => OsString::from(format!("flock-{dev:x}-{ino:x}-{b:x}")),
        None => OsString::from(format!("flock-{dev:x}-{ino:x}")),
    }
}

/// The creation time (nanoseconds since the epoch, as an unsigned number) of the file `file`
/// names, if it is the inode `(dev, ino)` and its file system keeps one.
fn birth(file: &Path, (dev, ino): (u64, u64)) -> Option<u128> {
    use rustix::fs::{AtFlags, CWD, StatxFlags, makedev, statx};
    let st = statx(
        CWD,
        file,
        AtFlags::empty(),
        StatxFlags::BTIME | StatxFlags::INO,
    )
    .ok()?;
    let same = makedev(st.stx_dev_major, st.stx_dev_minor) == dev && st.stx_ino == ino;
    let has = st.stx_mask & StatxFlags::BTIME.bits() != 0;
    (same && has).then(|| {
        let t = &st.stx_btime;
        (i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)) as u128
    })
}

/// Where the flock front end keeps the lease of `file` (device `dev`, inode `ino`, as opened):
/// in the runtime directory on a local file system (made when `create`), beside the file on a
/// network one or when the runtime directory cannot be used. `None` when the lease would be
/// beside the file and `file` has no directory beside it. Without `create` it creates nothing.
pub fn flock_lease_path(file: &Path, (dev, ino): (u64, u64), create: bool) -> Option<PathBuf> {
    let dir = file.parent().filter(|p| !p.as_os_str().is_empty());
    if crate::fsinfo::inspect(dir.unwrap_or(Path::new("."))).network {
        return crate::lease_beside(file);
    }
    let rt = if create {
        make()
    } else {
        match look() {
            Runtime::Usable(d) | Runtime::Missing(d) => Some(d),
            Runtime::Unusable => None,
        }
    };
    match rt {
        Some(d) => Some(d.join(name(file, dev, ino))),
        None => crate::lease_beside(file),
    }
}

/// The lease [`flock_lease_path`] names for `file`, if something exists there (as anything: the
/// caller that opens it applies the usual checks). Creates nothing. This is how
/// `leasehold status FILE` finds the lease of a file the `flock` front end locks.
pub fn existing_flock_lease(file: &Path) -> Option<PathBuf> {
    let m = std::fs::metadata(file).ok()?;
    let lease = flock_lease_path(file, (m.dev(), m.ino()), false)?;
    std::fs::symlink_metadata(&lease).ok().map(|_| lease)
}
