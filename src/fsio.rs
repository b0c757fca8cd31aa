//! Every read and write of LOCK's bytes and of the helper files.
//!
//! Owns: opening LOCK safely (never following a symlink, never blocking on a FIFO, refusing
//! anything but a regular file, size-capped), re-reading until a torn read is gone, atomic
//! replacement through the one temp file, and the in-place header write a renewal does.
//! Must never: write LOCK except by renaming a complete record over it or rewriting the fixed
//! header of a record we verified is ours; unlink anything it did not just create.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use nix::fcntl::OFlag;

use crate::error::{Error, Result, libc_consts};
use crate::paths::LockPaths;
use crate::record::{Lease, MAX_LEASE_BYTES, MUTABLE_RANGE, Parsed};

/// How many times a torn read is retried before the record is called damaged.
const TORN_RETRIES: u32 = 200;

/// What LOCK holds right now.
#[derive(Debug)]
pub(crate) enum LockContent {
    /// No file at LOCK.
    Missing,
    /// An empty file (e.g. made by `touch`): free.
    Empty,
    /// A lease record, and its exact bytes.
    Lease(Box<Lease>, Vec<u8>),
}

/// Opens LOCK for reading or read-write without following a symlink or blocking on a FIFO, and
/// checks it is a regular file of plausible size. `Ok(None)` when it does not exist.
pub(crate) fn open_lock(path: &Path, write: bool) -> Result<Option<File>> {
    Ok(open_lock_len(path, write)?.map(|(f, _)| f))
}

/// Opens LOCK as [`open_lock`] does, if it is still the file `id` (device, inode).
pub(crate) fn open_lock_if(path: &Path, write: bool, id: (u64, u64)) -> Option<File> {
    match open_lock_len(path, write) {
        Ok(Some((f, meta))) if (meta.dev(), meta.ino()) == id => Some(f),
        _ => None,
    }
}

/// As [`open_lock`], also giving the file's size at open.
fn open_lock_len(path: &Path, write: bool) -> Result<Option<(File, std::fs::Metadata)>> {
    let flags = OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let res = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(flags.bits())
        .open(path);
    let file = match res {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc_consts::ELOOP) => {
            return Err(not_a_lease(path, "a symbolic link"));
        }
        Err(e) if e.raw_os_error() == Some(libc_consts::ENXIO) => {
            return Err(not_a_lease(path, "a socket or device"));
        }
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EISDIR as i32) => {
            return Err(not_a_lease(path, "a directory"));
        }
        Err(e) => return Err(Error::io(path, "open", e)),
    };
    let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(not_a_lease(path, what));
    }
    if meta.len() > MAX_LEASE_BYTES {
        return Err(not_a_lease(
            path,
            &format!("{} bytes, larger than any lease", meta.len()),
        ));
    }
    Ok(Some((file, meta)))
}

fn not_a_lease(path: &Path, what: &str) -> Error {
    Error::NotALease {
        path: path.to_path_buf(),
        what: what.to_string(),
    }
}

/// Reads the whole of an open LOCK from offset 0 (at most the size cap plus one byte). With
/// `len`, the size the file had when it was opened, it stops there instead of reading on to
/// an empty read (a torn result is caught by the checksum, and re-read without the hint).
fn read_all(file: &File, path: &Path, buf: &mut Vec<u8>, len: Option<u64>) -> Result<()> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    let mut off = 0u64;
    loop {
        let n = match file.read_at(&mut chunk, off) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path, "read", e)),
        };
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        off += n as u64;
        if len.is_some_and(|l| off >= l) {
            return Ok(());
        }
        if off > MAX_LEASE_BYTES {
            return Err(not_a_lease(path, "larger than any lease"));
        }
    }
}

/// Parses an open LOCK, re-reading through torn reads. Judges a persistently bad checksum as a
/// damaged record.
pub(crate) fn read_open(file: &File, path: &Path) -> Result<LockContent> {
    read_open_sized(file, path, None)
}

/// As [`read_open`], with the file's size at open as a hint for the first read.
pub(crate) fn read_open_sized(file: &File, path: &Path, len: Option<u64>) -> Result<LockContent> {
    let mut buf = Vec::with_capacity(1024);
    for attempt in 0..TORN_RETRIES {
        read_all(file, path, &mut buf, len.filter(|_| attempt == 0))?;
        match Lease::parse(&buf) {
            Parsed::Empty => return Ok(LockContent::Empty),
            Parsed::Lease(l) => return Ok(LockContent::Lease(l, buf)),
            Parsed::Newer(found) => {
                return Err(Error::NewerFormat {
                    path: path.to_path_buf(),
                    found,
                    supported: crate::record::FORMAT_VERSION,
                });
            }
            Parsed::NotALease(what) => return Err(not_a_lease(path, &what)),
            Parsed::Torn => {
                if attempt < 16 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
        }
    }
    match Lease::parse_damaged(&buf) {
        Parsed::Lease(l) => Ok(LockContent::Lease(l, buf)),
        Parsed::NotALease(what) => Err(not_a_lease(path, &what)),
        _ => Err(not_a_lease(path, "damaged leasehold record")),
    }
}

/// Opens LOCK afresh (close-to-open on NFS) and reads what it holds. On NFS an open can be
/// served from a cached handle of a file another host has since renamed over, and the server
/// then answers ESTALE: open again, which looks the name up anew.
pub(crate) fn read_lock(path: &Path) -> Result<LockContent> {
    read_lock_keep(path, None).map(|(c, _)| c)
}

/// LOCK's file as last read, still open, with its device and inode.
#[derive(Debug)]
pub(crate) struct Seen {
    pub file: File,
    pub id: (u64, u64),
}

/// As [`read_lock`], also handing back the file read, still open. On a local file system,
/// whoever replaces LOCK can keep it open past the rename: the old inode is then freed at that
/// later close, not inside the rename (freeing a file's pages costs more than the rest of the
/// rename on tmpfs). Never on NFS: there an open file renamed over stays alive on the server,
/// and a stale cached name would then read it instead of failing with ESTALE.
///
/// With `seen` (only ever on a local file system, where the kernel's page cache is the file),
/// if LOCK still names that file it is read through it: one stat instead of an open and a
/// close.
pub(crate) fn read_lock_keep(
    path: &Path,
    seen: Option<Seen>,
) -> Result<(LockContent, Option<Seen>)> {
    if let Some(s) = seen {
        match std::fs::symlink_metadata(path) {
            Ok(m)
                if (m.dev(), m.ino()) == s.id
                    && m.file_type().is_file()
                    && m.len() <= MAX_LEASE_BYTES =>
            {
                return read_open_sized(&s.file, path, Some(m.len())).map(|c| (c, Some(s)));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok((LockContent::Missing, None));
            }
            _ => {}
        }
    }
    let mut tries = 0;
    loop {
        let r = match open_lock_len(path, false) {
            Ok(None) => return Ok((LockContent::Missing, None)),
            Ok(Some((f, meta))) => {
                let id = (meta.dev(), meta.ino());
                read_open_sized(&f, path, Some(meta.len())).map(|c| (c, Some(Seen { file: f, id })))
            }
            Err(e) => Err(e),
        };
        match r {
            Err(Error::Io { source, .. })
                if source.raw_os_error() == Some(nix::errno::Errno::ESTALE as i32) && tries < 5 =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Writes the mutable header region of a record in place: no new blocks are needed, so this
/// works on a full file system.
pub(crate) fn write_header(file: &File, path: &Path, region: &[u8]) -> Result<()> {
    file.write_all_at(region, MUTABLE_RANGE.start as u64)
        .map_err(|e| Error::io(path, "rewrite the lease header in place", e))
}

/// The device and inode of a file just renamed into place (it is not kept open: a descriptor
/// open for writing for as long as a lease would keep the file system from being remounted
/// read-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    pub id: (u64, u64),
}

/// Replaces `target` atomically with `bytes`: write the temp file, optionally fsync it, rename
/// it over `target`, optionally fsync the directory. Callers hold the mutex, so the one temp
/// name is never used by two writers at once; a crashed writer's temp file is simply
/// overwritten by the next.
pub(crate) fn replace(paths: &LockPaths, target: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    replace_keep(paths, target, bytes, durable, None).map(|_| ())
}

/// As [`replace`], saying which file it put in place (see [`Written`]). `dir`, when given, is
/// LOCK's directory already open, to fsync without opening it again.
pub(crate) fn replace_keep(
    paths: &LockPaths,
    target: &Path,
    bytes: &[u8],
    durable: bool,
    dir: Option<&File>,
) -> Result<Written> {
    let tmp = &paths.tmp;
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).bits())
        .open(tmp)
        .map_err(|e| Error::io(tmp, "create the temp file", e))?;
    let meta = f.metadata().map_err(|e| Error::io(tmp, "stat", e))?;
    if !meta.file_type().is_file() {
        return Err(not_a_lease(
            tmp,
            "the temp file's name is taken by something else",
        ));
    }
    if meta.mode() & 0o7777 != 0o644 {
        // An older temp file keeps its mode through O_TRUNC; a lease must stay readable.
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    let result = (|| {
        f.write_all(bytes)
            .map_err(|e| Error::io(tmp, "write the temp file", e))?;
        if durable {
            f.sync_data()
                .map_err(|e| Error::io(tmp, "fsync the temp file", e))?;
        }
        std::fs::rename(tmp, target).map_err(|e| Error::io(target, "rename into place", e))?;
        if durable {
            match dir {
                Some(d) => sync_open_dir(d, &paths.dir)?,
                None => sync_dir(&paths.dir)?,
            }
        }
        Ok(())
    })();
    let id = (meta.dev(), meta.ino());
    if result.is_err() {
        // Give back the blocks on a full disk, but only if the name is still our file.
        if let Ok(now) = std::fs::symlink_metadata(tmp)
            && (now.dev(), now.ino()) == id
        {
            let _ = std::fs::remove_file(tmp);
        }
    }
    result.map(|()| Written { id })
}

/// Opens a directory (to fsync it later).
pub(crate) fn open_dir(dir: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_CLOEXEC).bits())
        .open(dir)
        .map_err(|e| Error::io(dir, "open the directory", e))
}

/// fsync a directory, so that a rename in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    sync_open_dir(&open_dir(dir)?, dir)
}

/// fsync an open directory (`dir` names it, for errors).
fn sync_open_dir(d: &File, dir: &Path) -> Result<()> {
    match d.sync_all() {
        Ok(()) => Ok(()),
        // Some file systems refuse fsync on directories; the rename is then as durable as it gets.
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EINVAL as i32) => Ok(()),
        Err(e) => Err(Error::io(dir, "fsync the directory", e)),
    }
}

/// Reads a small helper file by path, following no symlink. `Ok(None)` if missing.
pub(crate) fn read_small(path: &Path, cap: u64) -> Result<Option<Vec<u8>>> {
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, "open", e)),
    };
    let mut buf = Vec::new();
    f.take(cap)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, "read", e))?;
    Ok(Some(buf))
}
