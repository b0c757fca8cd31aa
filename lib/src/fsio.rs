//! Every read and write of LOCK's bytes and of the helper files.
//!
//! Owns: opening LOCK safely (never following a symlink, never blocking on a FIFO, refusing
//! anything but a regular file, size-capped), re-reading until a torn read is gone, atomic
//! replacement through an exclusively created temp file, the in-place header write a renewal does, and the
//! released bit (the sticky bit a holder sets to release in place; every read applies it).
//! Must never: write LOCK except by renaming a complete record over it, rewriting the fixed
//! header of a record we verified is ours, or setting the released bit on such a record;
//! unlink anything but a temp file it created (or a crashed writer's, checked); reach any file
//! except through LOCK's directory descriptor ([`crate::lockdir`]).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, Result, libc_consts};
use crate::lockdir::Meta;
use crate::paths::LockPaths;
use crate::record::{Lease, LeaseState, MAX_LEASE_BYTES, MUTABLE_RANGE, Parsed};

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

/// The mode bit (S_ISVTX, the sticky bit) a holder sets on its own LOCK file to release it in
/// place: one `fchmod` through a read-only descriptor, no write to the file. A record whose
/// file carries it reads as released, whatever its JSON says (see [`with_mode`]).
pub(crate) const RELEASED_BIT: u32 = 0o1000;

/// The permission bits of every lease file leasehold writes (readable by all: `status` and
/// other users' contenders read it).
pub(crate) const LEASE_MODE: u32 = 0o644;

/// Opens LOCK for reading or read-write without following a symlink or blocking on a FIFO, and
/// checks it is a regular file of plausible size (and, to write it, one with a single link that
/// we own: a renewal only ever writes the file it renamed into place itself). `Ok(None)` when
/// it does not exist; otherwise the file and its mode (for [`read_open`]).
pub(crate) fn open_lock(paths: &LockPaths, write: bool) -> Result<Option<(File, u32)>> {
    Ok(open_lock_len(paths, write)?.map(|(f, meta)| (f, meta.mode)))
}

/// Opens LOCK read-only as [`open_lock`] does, if it is still the file `id` (device, inode).
pub(crate) fn open_lock_if(paths: &LockPaths, id: (u64, u64)) -> Option<File> {
    match open_lock_len(paths, false) {
        Ok(Some((f, meta))) if meta.id() == id => Some(f),
        _ => None,
    }
}

/// Releases a record in place by setting [`RELEASED_BIT`] on its file (one we wrote, so of
/// mode [`LEASE_MODE`]). Needs ownership of the file, not write access: works through a
/// read-only descriptor, so a holder never keeps LOCK open for writing.
pub(crate) fn mark_released(file: &File, path: &Path) -> Result<()> {
    file.set_permissions(std::fs::Permissions::from_mode(LEASE_MODE | RELEASED_BIT))
        .map_err(|e| Error::io(path, "mark the lease released (chmod +t)", e))
}

/// Whether LOCK holds the very lease `l` now (same id and holder, not damaged) in a file only
/// the lease's uid or root can have written: owned by that uid or root, one link, no group or
/// other write bit. A user who may write LOCK's directory can rename a file of their own over
/// LOCK, but that file is theirs. Script mode's evidence for its script (PROTOCOL.md §10),
/// trusted as `observe.rs` trusts the per-uid observation files.
pub(crate) fn written_by_holder(paths: &LockPaths, l: &Lease) -> bool {
    let Ok(Some((file, meta))) = open_lock_len(paths, false) else {
        return false;
    };
    let owner_ok = meta.uid == l.holder.uid || meta.uid == 0;
    if !owner_ok || meta.mode & 0o022 != 0 || meta.nlink != 1 {
        return false;
    }
    match read_open(&file, &paths.lock, meta.mode) {
        Ok(LockContent::Lease(now, _)) => {
            now.lease_id == l.lease_id && now.holder == l.holder && !now.damaged
        }
        _ => false,
    }
}

/// A held record read from a file with [`RELEASED_BIT`] set is released.
fn with_mode(content: LockContent, mode: u32) -> LockContent {
    match content {
        LockContent::Lease(mut l, b) if mode & RELEASED_BIT != 0 => {
            l.state = LeaseState::Released;
            LockContent::Lease(l, b)
        }
        other => other,
    }
}

/// As [`open_lock`], also giving the file's stat at open. On NFS the file just opened can have
/// been replaced by another host before its `fstat` (ESTALE): a race, so it is opened again (a
/// bounded number of times).
fn open_lock_len(paths: &LockPaths, write: bool) -> Result<Option<(File, Meta)>> {
    again_if_stale(|| open_lock_len_once(paths, write))
}

/// Runs `call` again (a bounded number of times, napping between) while it fails with ESTALE:
/// on NFS, a file handle another host has just replaced; a new call looks the name up afresh.
pub(crate) fn again_if_stale<T>(mut call: impl FnMut() -> Result<T>) -> Result<T> {
    let mut tries = 0;
    loop {
        match call() {
            Err(e) if e.is_stale_handle() && tries < crate::lockdir::STALE_TRIES => {
                tries += 1;
                crate::lockdir::stale_nap(tries);
            }
            other => return other,
        }
    }
}

fn open_lock_len_once(paths: &LockPaths, write: bool) -> Result<Option<(File, Meta)>> {
    let path = &paths.lock;
    let file = match paths.handle().open_existing(paths.lock_name(), write) {
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
    let meta = file
        .metadata()
        .map(|m| Meta::of(&m))
        .map_err(|e| Error::io(path, "stat", e))?;
    if !meta.is_file() {
        return Err(not_a_lease(path, meta.kind()));
    }
    if meta.size > MAX_LEASE_BYTES {
        return Err(not_a_lease(
            path,
            &format!("{} bytes, larger than any lease", meta.size),
        ));
    }
    if write {
        // Only our own file, renamed into place by us, is ever written in place.
        paths.handle().check(paths.lock_name(), &meta, "lease")?;
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

/// Parses an open LOCK whose mode is `mode`, re-reading through torn reads. Judges a
/// persistently bad checksum as a damaged record.
pub(crate) fn read_open(file: &File, path: &Path, mode: u32) -> Result<LockContent> {
    read_open_sized(file, path, None).map(|c| with_mode(c, mode))
}

/// As [`read_open`] without the mode, with the file's size at open as a hint for the first read.
fn read_open_sized(file: &File, path: &Path, len: Option<u64>) -> Result<LockContent> {
    read_open_known(file, path, len, None)
}

/// As [`read_open_sized`]; and when the file holds exactly `known`'s bytes (a record we wrote
/// ourselves, byte for byte), `known`'s lease without parsing them again.
fn read_open_known(
    file: &File,
    path: &Path,
    len: Option<u64>,
    known: Option<(&Lease, &[u8])>,
) -> Result<LockContent> {
    let mut buf = Vec::with_capacity(1024);
    for attempt in 0..TORN_RETRIES {
        read_all(file, path, &mut buf, len.filter(|_| attempt == 0))?;
        if let Some((l, b)) = known
            && buf == b
        {
            return Ok(LockContent::Lease(Box::new(l.clone()), buf));
        }
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
pub(crate) fn read_lock(paths: &LockPaths) -> Result<LockContent> {
    read_lock_keep(paths, None).map(|(c, _)| c)
}

/// As [`read_lock`], for a holder that knows the record it last wrote (`mine`, exactly
/// `bytes`): when LOCK holds exactly those bytes, `mine` is the answer without a parse (a
/// release's check that the lease is still ours: a JSON parse was a sixth of an uncontended
/// acquire and release). The mode still counts (a record released in place is released).
pub(crate) fn read_lock_known(
    paths: &LockPaths,
    mine: &Lease,
    bytes: &[u8],
) -> Result<LockContent> {
    let path = &paths.lock;
    again_if_stale(|| match open_lock_len(paths, false)? {
        None => Ok(LockContent::Missing),
        Some((f, meta)) => read_open_known(&f, path, Some(meta.size), Some((mine, bytes)))
            .map(|c| with_mode(c, meta.mode)),
    })
}

/// What `lstat` says of LOCK, as far as any change to it shows: a rename over it (inode), a
/// write in place (size, modification and change times), a release in place (mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sig {
    id: (u64, u64),
    mode: u32,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Sig {
    /// The file's device and inode.
    pub(crate) fn id(&self) -> (u64, u64) {
        self.id
    }

    fn of(m: &Meta) -> Sig {
        Sig {
            id: m.id(),
            mode: m.mode,
            len: m.size,
            mtime: m.mtime,
            ctime: m.ctime,
        }
    }

    /// The same file with the same bytes as at `earlier`: same inode, size and modification
    /// time (a chmod changes neither).
    fn same_bytes_as(&self, earlier: &Sig) -> bool {
        self.id == earlier.id && self.len == earlier.len && self.mtime == earlier.mtime
    }
}

/// LOCK's signature now (`None`: missing, or not to be stated).
pub(crate) fn signature(paths: &LockPaths) -> Option<Sig> {
    paths
        .handle()
        .stat(paths.lock_name())
        .ok()
        .flatten()
        .map(|m| Sig::of(&m))
}

/// LOCK's file as last read, still open, with what `lstat` said of it just before that read,
/// and the held lease read from it (if it was one).
#[derive(Debug)]
pub(crate) struct Seen {
    pub file: File,
    /// LOCK's signature as stated just before the last read.
    pub sig: Sig,
    /// The lease that read found held, with its exact bytes.
    last: Option<(Box<Lease>, Vec<u8>)>,
}

impl Seen {
    /// Keeps a held lease read through it (only a held one can be released in place later).
    fn remember(mut self, content: &LockContent) -> Seen {
        self.last = match content {
            LockContent::Lease(l, b) if l.state == LeaseState::Held => Some((l.clone(), b.clone())),
            _ => None,
        };
        self
    }
}

/// As [`read_lock`], also handing back the file read, still open. On a local file system,
/// whoever replaces LOCK can keep it open past the rename: the old inode is then freed at that
/// later close, not inside the rename (freeing a file's pages costs more than the rest of the
/// rename on tmpfs). Never on NFS: there an open file renamed over stays alive on the server,
/// and a stale cached name would then read it instead of failing with ESTALE.
///
/// With `seen` (only ever on a local file system, where the kernel's page cache is the file),
/// if LOCK still names that file it is read through it: one stat instead of an open and a
/// close. If that stat shows the file released in place ([`RELEASED_BIT`]) and not modified
/// since the last read through `seen` (same modification time and size), the lease read then
/// is the answer.
pub(crate) fn read_lock_keep(
    paths: &LockPaths,
    seen: Option<Seen>,
) -> Result<(LockContent, Option<Seen>)> {
    let path = &paths.lock;
    if let Some(mut s) = seen {
        match paths.handle().stat(paths.lock_name()) {
            Ok(Some(m)) if m.id() == s.sig.id && m.is_file() && m.size <= MAX_LEASE_BYTES => {
                let now = Sig::of(&m);
                let earlier = std::mem::replace(&mut s.sig, now);
                // Released in place, and not written since we read it: what we read is still
                // what it holds.
                if m.mode & RELEASED_BIT != 0
                    && now.same_bytes_as(&earlier)
                    && let Some((l, b)) = s.last.take()
                {
                    return Ok((with_mode(LockContent::Lease(l, b), m.mode), Some(s)));
                }
                return read_open_sized(&s.file, path, Some(m.size))
                    .map(|c| with_mode(c, m.mode))
                    .map(|c| {
                        let s = s.remember(&c);
                        (c, Some(s))
                    });
            }
            Ok(None) => return Ok((LockContent::Missing, None)),
            _ => {}
        }
    }
    again_if_stale(|| match open_lock_len(paths, false)? {
        None => Ok((LockContent::Missing, None)),
        Some((f, meta)) => read_open_sized(&f, path, Some(meta.size))
            .map(|c| with_mode(c, meta.mode))
            .map(|c| {
                let s = Seen {
                    file: f,
                    sig: Sig::of(&meta),
                    last: None,
                }
                .remember(&c);
                (c, Some(s))
            }),
    })
}

/// Writes the mutable header region of a record in place: no new blocks are needed, so this
/// works on a full file system.
pub(crate) fn write_header(file: &File, path: &Path, region: &[u8]) -> Result<()> {
    file.write_all_at(region, MUTABLE_RANGE.start as u64)
        .map_err(|e| Error::io(path, "rewrite the lease header in place", e))
}

/// The device and inode of a file just renamed into place, and, when it was prepared ahead of
/// time or is a holder's (see [`replace_holding`]), the file itself open read-only, carrying the
/// holder's flock (never open for writing on a local file system: a descriptor open for
/// writing for as long as a lease would keep it from being remounted read-only). A holder's on
/// NFS is open read-write, carrying its byte-range lock ([`replace_in_place`]).
#[derive(Debug)]
pub(crate) struct Written {
    pub id: (u64, u64),
    pub kept: Option<File>,
}

/// Replaces the file `target` (LOCK or another file in LOCK's directory) atomically with
/// `bytes`: write a new temp file (created exclusively: see [`create_temp`]), optionally fsync
/// it, rename it over `target`, optionally fsync the directory. Callers hold the mutex.
pub(crate) fn replace(paths: &LockPaths, target: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    replace_keep(paths, target, bytes, durable).map(|_| ())
}

/// As [`replace`], saying which file it put in place (see [`Written`]).
pub(crate) fn replace_keep(
    paths: &LockPaths,
    target: &Path,
    bytes: &[u8],
    durable: bool,
) -> Result<Written> {
    replace_inner(paths, target, bytes, durable, Hold::Nothing)
}

/// As [`replace_keep`], for a holder's lease on a local file system: the new file, open
/// read-only, carries the holder's exclusive flock (`klock::hold_lock_file`), taken before the
/// rename, so there is no instant at which LOCK names our lease in a file util-linux flock(1)
/// could lock; it is kept (in [`Written::kept`]) for the whole holding.
pub(crate) fn replace_holding(
    paths: &LockPaths,
    target: &Path,
    bytes: &[u8],
    durable: bool,
) -> Result<Written> {
    replace_inner(paths, target, bytes, durable, Hold::Flock)
}

/// As [`replace_keep`], for a holder's lease on a network file system when it cannot be
/// written in place (LOCK missing, not ours to write, or locked by a frozen holder: see
/// [`write_in_place`]): the new file, kept open read-write, carries the holding's byte-range
/// lock (`klock::hold_in_place`), taken before the rename, and every later record of the
/// holding is written into it in place.
pub(crate) fn replace_in_place(paths: &LockPaths, target: &Path, bytes: &[u8]) -> Result<Written> {
    replace_inner(paths, target, bytes, true, Hold::Range)
}

/// What a new file carries into place for its holder.
#[derive(Clone, Copy, PartialEq)]
enum Hold {
    Nothing,
    /// A local holder's flock and OFD read lock, on a read-only descriptor ([`held_copy`]).
    Flock,
    /// An NFS holder's byte-range write lock, on the read-write descriptor it was written by.
    Range,
}

/// LOCK, missing at the contender's look, created empty (`O_EXCL`) and claimed at once —
/// before any token or mark of ours exists — as a take claims the file it found: util-linux
/// flock(1) creates a missing file too, and a rename over a file it had just created and locked
/// would let it run beside us. On a network file system the claim is the holder's byte-range
/// lock (`klock::hold_in_place`), and our lease is then written into the file; on a local one
/// it is a found file's claim (`klock::claim_lock_file`), and our lease is renamed over the
/// file, which is kept only while someone else has it open (`klock::still_reachable`).
/// [`Error::Raced`] when LOCK exists after all (created since our look) or another program
/// locked the new file between our create and our claim: the caller looks again, and finds it.
/// `Ok(None)` when it cannot be created here (a full or read-only disk, a directory we may not
/// write): the take's own write then says why. If that write fails after the create, LOCK is
/// left empty, which reads as free.
pub(crate) fn create_lock_claimed(paths: &LockPaths, network: bool) -> Result<Option<File>> {
    let raced = || Error::Raced {
        path: paths.lock.clone(),
    };
    let f = match paths.handle().create_new(paths.lock_name(), LEASE_MODE) {
        Ok((f, _)) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(raced()),
        Err(_) => return Ok(None),
    };
    let claimed = if network {
        crate::klock::hold_in_place(&f)
    } else {
        crate::klock::claim_lock_file(&f)
    };
    match claimed {
        Ok(true) => Ok(Some(f)),
        Ok(false) => Err(raced()),
        Err(e) => Err(Error::io(&paths.lock, "lock", e)),
    }
}

/// Writes `bytes` as the whole of `file` (LOCK's own file, open read-write, whose holding
/// lock we hold: `klock::hold_in_place`) in place — the released bit cleared first, one
/// `pwrite` from offset 0, the file cut to its new length, `fdatasync` (a descriptor kept
/// open is never flushed by a close, and NFS readers see only what reached the server). A
/// reader racing it reads a mix, which the checksum catches; it reads again (§2). Callers
/// hold the mutex, or hold the lease and its lock, and checked that LOCK's name still leads
/// to `file`.
pub(crate) fn write_in_place(file: &File, path: &Path, bytes: &[u8]) -> Result<()> {
    let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
    if meta.permissions().mode() & RELEASED_BIT != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(LEASE_MODE))
            .map_err(|e| Error::io(path, "clear the released bit", e))?;
    }
    file.write_all_at(bytes, 0)
        .map_err(|e| Error::io(path, "write the lease in place", e))?;
    if meta.len() > bytes.len() as u64 {
        file.set_len(bytes.len() as u64)
            .map_err(|e| Error::io(path, "cut the lease to its length", e))?;
    }
    file.sync_data()
        .map_err(|e| Error::io(path, "fsync the lease", e))
}

fn replace_inner(
    paths: &LockPaths,
    target: &Path,
    bytes: &[u8],
    durable: bool,
    hold: Hold,
) -> Result<Written> {
    let dir = paths.handle();
    let Some(target_name) = target
        .file_name()
        .filter(|_| target.parent() == Some(dir.path()))
    else {
        return Err(Error::BadPath {
            path: target.to_path_buf(),
            why: "not in the lock's directory".into(),
        });
    };
    let (mut f, name, id) =
        create_temp(paths).map_err(|e| Error::io(&paths.tmp, "create a temp file", e))?;
    let tmp = dir.join(&name);
    let result = (|| {
        // Unsynced, the rename would otherwise write the blocks back on ext4 (an fsync
        // allocates them anyway): see `fsinfo::preallocate`.
        if !durable {
            dir.preallocate(&f, bytes.len());
        }
        f.write_all(bytes)
            .map_err(|e| Error::io(&tmp, "write the temp file", e))?;
        if durable {
            f.sync_data()
                .map_err(|e| Error::io(&tmp, "fsync the temp file", e))?;
        }
        let kept = match hold {
            Hold::Nothing => None,
            Hold::Flock => Some(held_copy(&f, &tmp)?),
            // A lock someone else took first (only a directory writer who opened our new file
            // meanwhile could) is left to them, as in `held_copy`.
            Hold::Range => {
                let _ = crate::klock::hold_in_place(&f);
                Some(f.try_clone().map_err(|e| Error::io(&tmp, "dup", e))?)
            }
        };
        rename_ours(dir, &name, id, target_name)
            .map_err(|e| Error::io(target, "rename into place", e))?;
        if durable {
            dir.sync()?;
        }
        Ok(kept)
    })();
    if result.is_err() {
        // Give back the blocks on a full disk, but only if the name is still our file.
        dir.unlink_if(&name, id);
    }
    result.map(|kept| Written { id, kept })
}

/// The very inode of `f`, opened read-only through our own descriptor (never through its
/// name), with the holder's flock on it (see [`replace_holding`]). A flock someone else took
/// first — only a directory writer who opened our new file meanwhile could — is left to them:
/// the file is still ours, and that writer could disturb flock(1) users anyway.
pub(crate) fn held_copy(f: &File, path: &Path) -> Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let ro = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_CLOEXEC.bits())
        .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .map_err(|e| Error::io(path, "open our new lease read-only", e))?;
    let _ = crate::klock::hold_lock_file(&ro);
    Ok(ro)
}

/// Renames our temp file `name` (the inode `id`) over `target`. An NFS client can answer
/// ENOENT for a name it had just looked up when another host, or the server's own path, has
/// replaced a file in the directory meanwhile: while `name` still leads to our file, that is a
/// race, and the rename is made again (a bounded number of times).
fn rename_ours(
    dir: &crate::lockdir::LockDir,
    name: &std::ffi::OsStr,
    id: (u64, u64),
    target: &std::ffi::OsStr,
) -> io::Result<()> {
    let mut tries = 0;
    loop {
        match dir.rename(name, target) {
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && tries < 5
                    && matches!(dir.stat(name), Ok(Some(m)) if m.id() == id) =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Creates the temp file for one atomic write, exclusively: `.NAME.leasehold-tmp` — found there
/// only as the leftover of a writer that crashed (every writer holds the mutex and renames its
/// temp file away), so it is removed first if it is leasehold's own shape (regular, one link,
/// trusted owner) and then created anew with `O_EXCL` — or, when that name is taken by
/// anything else (planted there), a name with 16 random hex digits, also with `O_EXCL`. Either
/// way nothing existing is ever opened, and crashed writers' files cannot pile up.
fn create_temp(paths: &LockPaths) -> io::Result<(File, std::ffi::OsString, (u64, u64))> {
    let dir = paths.handle();
    let template = paths.tmp_name().as_bytes();
    let fixed = OsStr::from_bytes(&template[..template.len().saturating_sub(17)]);
    for _ in 0..2 {
        match dir.create_new(fixed, LEASE_MODE) {
            Ok((f, m)) => return Ok((f, fixed.to_os_string(), m)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !dir.unlink_leftover(fixed) {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    dir.create_temp(paths.tmp_name(), LEASE_MODE)
}

/// Removes randomly named temp files (see [`create_temp`]) a crashed writer left: names made
/// from the temp template, regular files with one link whose owner the directory trusts. Called under the
/// mutex (every writer of a temp file holds it, so none is in use), when a stale lease is taken
/// over: a writer only crashes mid-write by dying, which leaves its lease stale.
pub(crate) fn remove_leftover_temps(paths: &LockPaths) {
    let dir = paths.handle();
    let t = paths.tmp_name().as_bytes();
    let prefix = &t[..t.len().saturating_sub(16)];
    let Ok(names) = dir.names() else {
        return;
    };
    for n in names {
        let b = n.as_bytes();
        if b.len() == t.len()
            && b.starts_with(prefix)
            && b[prefix.len()..].iter().all(u8::is_ascii_hexdigit)
        {
            dir.unlink_leftover(&n);
        }
    }
}

/// Reads a small helper file in LOCK's directory, following no symlink, if it passes `trust`
/// (given the file's stat after opening). `Ok(None)` if missing or not trusted. A stale NFS
/// handle (the file replaced by another host) is looked up afresh.
pub(crate) fn read_small(
    paths: &LockPaths,
    name: &OsStr,
    cap: u64,
    trust: impl Fn(&Meta) -> bool,
) -> Result<Option<Vec<u8>>> {
    again_if_stale(|| read_small_once(paths, name, cap, &trust))
}

fn read_small_once(
    paths: &LockPaths,
    name: &OsStr,
    cap: u64,
    trust: &impl Fn(&Meta) -> bool,
) -> Result<Option<Vec<u8>>> {
    let path = paths.handle().join(name);
    let f = match paths.handle().open_existing(name, false) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, "open", e)),
    };
    let meta = f
        .metadata()
        .map(|m| Meta::of(&m))
        .map_err(|e| Error::io(&path, "stat", e))?;
    if !trust(&meta) {
        return Ok(None);
    }
    // Room for the whole file and one byte more: one read takes it, the next says the end.
    let mut buf = Vec::with_capacity(usize::try_from(meta.size.min(cap)).unwrap_or(0) + 1);
    f.take(cap)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(&path, "read", e))?;
    Ok(Some(buf))
}
