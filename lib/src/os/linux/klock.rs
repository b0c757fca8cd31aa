//! The kernel locks leasehold takes on its own helper files (the mutex and queue tickets), in
//! the form that every host reaching the file excludes: through an NFS client, on the NFS
//! server's own path, and on a local disk (PROTOCOL.md §3, "Kernel locks").
//!
//! Owns: the choice of lock calls — on a local file system `flock(2)` *and* an open file
//! description (OFD) byte-range lock on the file's first byte; on a network file system the OFD lock
//! alone —, the test "does anyone else hold it?" (`F_OFD_GETLK`), the holders' marks (an
//! exclusive holder's by token, a shared or slotted holder's counted), a section's
//! announcement on LOCK's directory ([`announce`]), and the two locks on LOCK's own file: the
//! holder's exclusive flock (and OFD read lock) for the whole holding ([`hold_lock_file`]) and a waiter's hint
//! ([`hint_waiting`]).
//! Must never: block (except [`wait_free`], which a caller runs on its own thread); leave one of
//! the two locks held when taking the other failed.
//!
//! Why two locks on a local disk: an NFS server keeps the locks its clients take as byte-range
//! locks on the backing file (nfs-ganesha as OFD locks, knfsd as POSIX locks), and on Linux a
//! local `flock(2)` never conflicts with a byte-range lock. A job on the file server locking the
//! export's own path with `flock(2)` alone ran beside a job on a client. The OFD lock conflicts
//! with the server's byte-range locks; the `flock(2)` keeps `/proc/locks` naming the holder's
//! pid (OFD locks show pid -1 there), which the stuck-mutex judgement and the "blocked by" line
//! rely on. On an NFS client `flock(2)` is itself sent to the server as a whole-file byte-range
//! lock, so the OFD lock alone is the same lock there, without a second round trip.
//!
//! Why a *read* OFD lock on a local disk when the descriptor is read-only: an OFD write lock
//! needs a descriptor open for writing, and the mutex's kept descriptor is read-only on a local
//! disk (see `mutex::MutexFile`). Local holders exclude each other through `flock(2)`; the read
//! lock is there to conflict with the write locks the NFS server holds for its clients, which it
//! does. (Two server-local holders' read locks never meet: each holds the flock first.)

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

/// Whether the lock is to be taken as on a network file system (the OFD lock alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Where {
    pub network: bool,
    /// The descriptor is open for writing (an OFD write lock is possible).
    pub writable: bool,
}

impl Where {
    /// Read-write on a network file system (NFSv4 refuses exclusive locks on read-only
    /// descriptors), read-only elsewhere (see `mutex::MutexFile`).
    pub(crate) fn of(network: bool) -> Where {
        Where {
            network,
            writable: network,
        }
    }
}

/// The byte the exclusive lock covers (the mutex, a ticket).
const LOCK_BYTE: i64 = 0;
/// The byte of LOCK's own file that a holder's OFD read lock covers beside its flock
/// ([`hold_lock_file`]): not [`LOCK_BYTE`], where waiters hint that they wait.
const HOLDING_BYTE: i64 = 1;
/// Where the holders' marks start: a holder of token `t` keeps byte `MARKS + t` of the mutex
/// file read-locked for as long as it holds (see [`hold_mark`]) — apart from [`LOCK_BYTE`], so
/// that holding never blocks the mutex.
const MARKS: i64 = 1;

fn range(kind: libc::c_short, byte: i64) -> libc::flock {
    span(kind, byte, 1)
}

/// `len` bytes from `byte` (0: to the end of every possible file).
fn span(kind: libc::c_short, byte: i64, len: i64) -> libc::flock {
    // SAFETY: `flock` is a plain C struct; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = len;
    fl
}

/// Where the shared holders' marks start on the mutex file (see [`hold_shared_mark`]): far
/// above every token's mark (tokens that large share the last byte below it).
const SHARED: i64 = 1 << 62;

/// The byte of the mark of token `token`.
fn mark_byte(token: u64) -> i64 {
    MARKS
        .saturating_add(i64::try_from(token).unwrap_or(i64::MAX))
        .min(SHARED - 1)
}

fn ofd(file: &File, kind: libc::c_short, wait: bool) -> io::Result<bool> {
    ofd_at(file, kind, wait, LOCK_BYTE)
}

fn ofd_at(file: &File, kind: libc::c_short, wait: bool, byte: i64) -> io::Result<bool> {
    let fl = range(kind, byte);
    let arg = if wait {
        FcntlArg::F_OFD_SETLKW(&fl)
    } else {
        FcntlArg::F_OFD_SETLK(&fl)
    };
    match fcntl(file.as_fd(), arg) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) if !wait => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    // SAFETY: flock(2) on a descriptor we own; a bad one is reported as EBADF.
    match unsafe { libc::flock(file.as_raw_fd(), op) } {
        0 => Ok(true),
        _ => {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// Tries to take the exclusive lock on `file` without waiting: `Ok(false)` when someone else
/// holds it (on this host, or through the NFS server, or the server's local path).
pub(crate) fn try_exclusive(file: &File, at: Where) -> io::Result<bool> {
    let kind = if at.writable || at.network {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    } as libc::c_short;
    if at.network {
        return ofd(file, kind, false);
    }
    if !flock(file, libc::LOCK_EX | libc::LOCK_NB)? {
        return Ok(false);
    }
    match ofd(file, kind, false) {
        Ok(true) => Ok(true),
        other => {
            let _ = flock(file, libc::LOCK_UN);
            other
        }
    }
}

/// The holder's lock on LOCK's own file (local file systems, exclusive holders): an exclusive
/// `flock(2)` on the file its lease is written to, taken before that file is renamed over LOCK
/// and kept for the whole holding, so that util-linux flock(1) on LOCK waits for the holder as
/// the holder waits for it (PROTOCOL.md §10, "util-linux flock(1) on LOCK itself"). `Ok(false)`
/// when someone else locks the file already (it is new and unpredictably named: only a
/// directory writer who opened it meanwhile could).
///
/// Beside the flock, an OFD read lock on the file's byte [`HOLDING_BYTE`]: on the NFS server's
/// own path that is what conflicts with the locks the server keeps for its clients (a client's
/// flock(1) is a whole-file write lock there, which a local flock never meets), so flock(1) on
/// a client waits for a holder on the server's path too (PROTOCOL.md §10). A read lock (the
/// descriptor is read-only, as it must be) on its own byte: not counted as another program's
/// exclusive lock (`mutex::exclusive_locker`), and apart from waiters' hints on the first byte.
pub(crate) fn hold_lock_file(file: &File) -> io::Result<bool> {
    if !flock(file, libc::LOCK_EX | libc::LOCK_NB)? {
        return Ok(false);
    }
    ofd_at(file, libc::F_RDLCK as libc::c_short, false, HOLDING_BYTE)
}

/// A contender's claim on LOCK's file as it found it free (local file systems): the holder's
/// locks of [`hold_lock_file`] taken on it, without waiting, *as* the test that no other program
/// holds it — so that nothing takes the file between that test and the rename of our lease over
/// it. Kept for the whole holding that follows: a program that opened the file before the rename
/// (util-linux flock(1)) and locks it after waits for us, instead of running on a file nobody
/// looks at (PROTOCOL.md §10). `Ok(false)`, holding nothing, when another description holds a
/// flock on it, or a byte-range write lock (a client's flock(1) through the NFS server).
pub(crate) fn claim_lock_file(file: &File) -> io::Result<bool> {
    if !flock(file, libc::LOCK_EX | libc::LOCK_NB)? {
        return Ok(false);
    }
    // Our read lock on its byte meets every write lock taken from now on; one taken before is
    // found by the test that follows it.
    let held = ofd_at(file, libc::F_RDLCK as libc::c_short, false, HOLDING_BYTE)
        .and_then(|got| Ok(got && !range_write_locked(file)?));
    match held {
        Ok(true) => Ok(true),
        other => {
            let _ = let_go_lock_file(file);
            other
        }
    }
}

/// Takes [`hold_lock_file`]'s locks on `file` again, waiting for each: the exclusive flock
/// (which a local flock(1) holds) and the OFD read lock on [`HOLDING_BYTE`] (which the
/// byte-range write lock an NFS server keeps for its client's flock(1) holds off). For
/// `handover::serve_old_waiters`, on a file only programs that opened it long ago can lock:
/// it is no longer LOCK.
pub(crate) fn wait_exclusive(file: &File) -> io::Result<()> {
    loop {
        match flock(file, libc::LOCK_EX) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => {
                other?;
                break;
            }
        }
    }
    loop {
        match ofd_at(file, libc::F_RDLCK as libc::c_short, true, HOLDING_BYTE) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// Whether no other open file description has `file`'s inode open — and so nobody can be
/// blocked on its locks (a lock request needs an open descriptor of the file; one opened
/// without read or write access cannot lock). Asked as a write lease (`F_SETLEASE`,
/// `F_WRLCK`), which the kernel grants only when the inode's counts of open readers and writers
/// are this description's own, and let go of at once: microseconds, where a read of
/// /proc/locks, the other way to know, waits for an RCU grace period when nobody read it in the
/// last few milliseconds (8–16 ms here, docs/performance.md). `false` whenever it cannot say:
/// another description has the file open (anyone's — a status look, a waiter, a second open of
/// our own), the file is not ours (a lease needs its owner or CAP_LEASE), leases are off
/// (`fs.leases-enable`) or the file system has none (NFS).
///
/// An open of the file racing the microseconds the lease is held waits in that open() until we
/// let go, and the kernel tells the lease holder by a signal: SIGURG here (`F_SETSIG` on this
/// description), whose default action is to ignore it — never the default SIGIO, which would
/// end the process.
pub(crate) fn open_only_here(file: &File) -> bool {
    lease_refused(file, libc::F_WRLCK) == Some(false)
}

/// Whether anyone but us can still lock `file`, a file that is no longer LOCK (the one our
/// lease replaced, or one of ours a rewrite replaced), whose claim we keep for whoever opened
/// it before our rename (PROTOCOL.md §10): `true` while it still has a name (a hard link
/// someone made) or another open file description has it ([`open_only_here`] cannot say so:
/// anyone's — a flock(1) blocked on our claim, the released holder before us that has not
/// closed it yet). `false` once it is nameless and open nowhere else: a lock needs an open
/// description, and a nameless file can no longer be opened, so nobody can ever ask for its
/// lock again — and keeping it open would only stop the file system from being remounted
/// read-only under the holding (the kernel refuses while an unlinked file is open, §3).
pub(crate) fn still_reachable(file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let named = file.metadata().map_or(true, |m| m.nlink() > 0);
    named || !open_only_here(file)
}

/// Whether another open file description has `file`'s inode open *for writing*: `Some(true)`
/// when the kernel refuses a read lease (`F_SETLEASE` `F_RDLCK`, granted only while nobody
/// else has the file open for writing, and let go of at once) with EAGAIN, `Some(false)` when
/// it grants it, `None` when it cannot say (a file another user owns — a lease needs its owner
/// or CAP_LEASE —, leases off, a file system without them). `file` must be open read-only.
/// leasehold's own looks, waiters and `status` open LOCK's files read-only; an NFS server
/// opens the file read-write for a client's write lock — util-linux flock(1) on a client
/// reopens its file read-write for `LOCK_EX` — and keeps it open while the client polls
/// (measured with ganesha 4.3: PROTOCOL.md §10). Racing opens: as [`open_only_here`].
pub(crate) fn open_for_writing_elsewhere(file: &File) -> Option<bool> {
    lease_refused(file, libc::F_RDLCK)
}

/// Asks for a lease of `kind` on `file` and lets go of it at once: `Some(true)` when the kernel
/// refuses it because of another open (EAGAIN), `Some(false)` when it grants it, `None` when
/// it cannot be had for another reason. A lease broken by an open racing its microseconds is
/// signalled with SIGURG (`F_SETSIG`; ignored by default), never SIGIO.
fn lease_refused(file: &File, kind: libc::c_int) -> Option<bool> {
    // <asm-generic/fcntl.h>, the same on every Linux architecture; the libc crate lacks it.
    const F_SETSIG: libc::c_int = 10;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl(2) with integer arguments on a descriptor we own; a bad one is EBADF.
    unsafe {
        if libc::fcntl(fd, F_SETSIG, libc::SIGURG) != 0 {
            return None;
        }
        if libc::fcntl(fd, libc::F_SETLEASE, kind) != 0 {
            let e = io::Error::last_os_error().raw_os_error();
            return (e == Some(libc::EAGAIN)).then_some(true);
        }
        libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK);
    }
    Some(false)
}

/// The holding lock of a holder on a network file system (NFS clients), which keeps LOCK's
/// inode and writes its records in place (PROTOCOL.md §9, "In place"): an OFD write lock from
/// [`HOLDING_BYTE`] to the end of every possible file, tried without waiting on a descriptor
/// open for writing (NFSv4 refuses write locks on read-only opens). The server holds it for
/// us, so util-linux flock(1) on any client — a whole-file write lock there — waits for it,
/// and it fails while flock(1) holds the file: the try is the take's atomic test for
/// flock(1). It never covers [`LOCK_BYTE`], so a contender's test for another program's lock
/// there ([`held_by_other`]) never takes a holder's for flock(1)'s. `Ok(false)` when another
/// description holds a conflicting lock.
pub(crate) fn hold_in_place(file: &File) -> io::Result<bool> {
    let fl = span(libc::F_WRLCK as libc::c_short, HOLDING_BYTE, 0);
    match fcntl(file.as_fd(), FcntlArg::F_OFD_SETLK(&fl)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Lets go of [`hold_in_place`]'s lock. Never `flock(LOCK_UN)` on a network file system: an
/// NFS client emulates flock with whole-file byte-range locks of the same owner (the open file
/// description), so that would let go of this lock too, unasked.
pub(crate) fn let_go_in_place(file: &File) -> io::Result<()> {
    let fl = span(libc::F_UNLCK as libc::c_short, HOLDING_BYTE, 0);
    fcntl(file.as_fd(), FcntlArg::F_OFD_SETLK(&fl))
        .map(drop)
        .map_err(io::Error::from)
}

/// Lets go of [`hold_lock_file`]'s locks (the job is over), before the file is closed.
pub(crate) fn let_go_lock_file(file: &File) -> io::Result<()> {
    let r = ofd_at(file, libc::F_UNLCK as libc::c_short, false, HOLDING_BYTE).map(drop);
    flock(file, libc::LOCK_UN)?;
    r
}

/// A queued waiter's hint to the holder that it waits (local file systems): an OFD read lock on
/// the first byte of the LOCK file it last read, through the descriptor it keeps. Not a flock:
/// on a local file system OFD locks and `flock(2)` never meet, so the hint neither conflicts
/// with the holder's [`hold_lock_file`] nor keeps a flock(1) waiting on a file the waiter is
/// about to rename over.
pub(crate) fn hint_waiting(file: &File) -> io::Result<bool> {
    ofd_at(file, libc::F_RDLCK as libc::c_short, false, LOCK_BYTE)
}

/// Whether anyone hints that it waits ([`hint_waiting`]) on `file` — or holds any other
/// byte-range lock on its first byte: a test that takes nothing (`F_OFD_GETLK`).
pub(crate) fn waiting_hinted(file: &File) -> io::Result<bool> {
    held_at(file, LOCK_BYTE)
}

/// Lets go of what [`try_exclusive`] took.
pub(crate) fn unlock(file: &File, at: Where) -> io::Result<()> {
    let r = ofd(file, libc::F_UNLCK as libc::c_short, false).map(drop);
    if !at.network {
        flock(file, libc::LOCK_UN)?;
    }
    r
}

/// Whether anyone else holds `file`'s lock (any host): an OFD or byte-range lock on its first
/// byte (`F_OFD_GETLK`, which takes nothing and works on a read-only descriptor), or — on a
/// local file system — a flock, as [`try_exclusive`] takes with it and as another program
/// (flock(1), an older leasehold) may take alone: tested by taking it for a moment.
pub(crate) fn held_by_other(file: &File, network: bool) -> io::Result<bool> {
    if held_at(file, LOCK_BYTE)? {
        return Ok(true);
    }
    if network {
        return Ok(false);
    }
    if flock(file, libc::LOCK_EX | libc::LOCK_NB)? {
        flock(file, libc::LOCK_UN)?;
        Ok(false)
    } else {
        Ok(true)
    }
}

/// Whether another open file description holds an exclusive `flock(2)` on `file`'s inode
/// right now (util-linux flock(1), a leasehold holder): a shared flock tried without waiting
/// and let go at once. An atomic answer, unlike a read of /proc/locks, which the kernel hands
/// out a page at a time and can skip a lock when others come and go between two pages. `file`
/// must be a description that holds no flock itself (trying would convert its own lock).
/// The try holds a shared lock for a moment: a flock(1) asking then waits until it is let go.
pub(crate) fn flock_held_exclusively(file: &File) -> io::Result<bool> {
    if flock(file, libc::LOCK_SH | libc::LOCK_NB)? {
        flock(file, libc::LOCK_UN)?;
        Ok(false)
    } else {
        Ok(true)
    }
}

/// Whether anyone holds a byte-range write lock (POSIX or OFD) anywhere on `file`'s inode: a
/// test that takes nothing (`F_OFD_GETLK` for a read lock over the whole file, which every
/// write lock conflicts with and no read lock does — not waiters' hints, not a holder's).
pub(crate) fn range_write_locked(file: &File) -> io::Result<bool> {
    held_for(file, libc::F_RDLCK as libc::c_short, 0, 0)
}

fn held_at(file: &File, byte: i64) -> io::Result<bool> {
    held_in(file, byte, 1)
}

fn held_in(file: &File, byte: i64, len: i64) -> io::Result<bool> {
    held_for(file, libc::F_WRLCK as libc::c_short, byte, len)
}

/// Whether a lock of kind `kind` on `len` bytes from `byte` would conflict with one held by
/// another description (`F_OFD_GETLK`, which takes nothing).
fn held_for(file: &File, kind: libc::c_short, byte: i64, len: i64) -> io::Result<bool> {
    let mut fl = span(kind, byte, len);
    fcntl(file.as_fd(), FcntlArg::F_OFD_GETLK(&mut fl)).map_err(io::Error::from)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// The holder's mark in the kernel: a read lock on the mutex file's byte [`MARKS`] + `token`,
/// taken under the mutex before the lease becomes visible and kept (through the holder's
/// descriptor on the mutex file) until just before its release becomes visible, or until the
/// holder's process is gone. Any number of holders may hold marks (shared leases); every host
/// sees them, like the mutex. A contender that finds LOCK missing, emptied or released while
/// someone holds a mark at or above the token LOCK shows knows a holder of this very lock that
/// no later lease superseded still runs ([`mark_held`]). (A frozen holder whose job was stopped
/// and whose lease was taken over keeps its mark below every later token: it never blocks.)
pub(crate) fn hold_mark(file: &File, token: u64) -> io::Result<()> {
    ofd_at(
        file,
        libc::F_RDLCK as libc::c_short,
        false,
        mark_byte(token),
    )
    .and_then(|got| {
        if got {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    })
}

/// Lets go of [`hold_mark`]'s lock (every mark this descriptor holds).
pub(crate) fn drop_mark(file: &File) -> io::Result<()> {
    let fl = span(libc::F_UNLCK as libc::c_short, MARKS, 0);
    fcntl(file.as_fd(), FcntlArg::F_OFD_SETLK(&fl))
        .map(drop)
        .map_err(io::Error::from)
}

/// Whether another open file description (any process, any host) holds a holder's mark of
/// token `from` or above on this mutex file (shared holders' marks apart).
pub(crate) fn mark_held(file: &File, from: u64) -> io::Result<bool> {
    let first = mark_byte(from);
    held_in(file, first, SHARED - first)
}

/// The lock another open file description holds somewhere in `[lo, hi)` (`F_OFD_GETLK`: any
/// one of them, not necessarily the lowest), clipped to the range.
fn other_in(file: &File, lo: i64, hi: i64) -> io::Result<Option<(i64, i64)>> {
    let mut fl = span(libc::F_WRLCK as libc::c_short, lo, hi - lo);
    fcntl(file.as_fd(), FcntlArg::F_OFD_GETLK(&mut fl)).map_err(io::Error::from)?;
    if fl.l_type == libc::F_UNLCK as libc::c_short {
        return Ok(None);
    }
    let from = fl.l_start.clamp(lo, hi - 1);
    let to = if fl.l_len <= 0 {
        hi
    } else {
        fl.l_start.saturating_add(fl.l_len).clamp(from + 1, hi)
    };
    Ok(Some((from, to)))
}

/// The most `F_OFD_GETLK` calls one look at the shared marks makes: a directory writer holding
/// many scattered bytes makes the look give up (as "all held": a denial of service).
const MAX_PROBES: usize = 1 << 16;

/// The lowest byte of `[lo, hi)` no other open file description holds, if any: the ranges are
/// searched below and above each lock found (which is any one of them, not the lowest).
fn lowest_free(file: &File, lo: i64, hi: i64) -> io::Result<Option<i64>> {
    // Ranges still to search, lowest on top.
    let mut todo = vec![(lo, hi)];
    let mut probes = 0;
    while let Some((lo, hi)) = todo.pop() {
        if lo >= hi {
            continue;
        }
        probes += 1;
        if probes > MAX_PROBES {
            return Ok(None);
        }
        match other_in(file, lo, hi)? {
            None => return Ok(Some(lo)),
            Some((a, b)) => {
                todo.push((b, hi));
                todo.push((lo, a));
            }
        }
    }
    Ok(None)
}

/// How many bytes of `[lo, hi)` other open file descriptions hold, counting up to `cap` at
/// most. Every byte of a wider lock counts (a directory writer holding a wide range makes the
/// count larger, never smaller: a denial of service, never a holder hidden); too many scattered
/// locks to look at count as `cap`.
fn count_held(file: &File, lo: i64, hi: i64, cap: usize) -> io::Result<usize> {
    let mut todo = vec![(lo, hi)];
    let (mut n, mut probes) = (0usize, 0);
    while let Some((lo, hi)) = todo.pop() {
        if lo >= hi || n >= cap {
            continue;
        }
        probes += 1;
        if probes > MAX_PROBES {
            return Ok(cap);
        }
        if let Some((a, b)) = other_in(file, lo, hi)? {
            n = n.saturating_add(usize::try_from(b - a).unwrap_or(usize::MAX));
            todo.push((b, hi));
            todo.push((lo, a));
        }
    }
    Ok(n.min(cap))
}

/// A shared or slotted holder's mark (PROTOCOL.md §13): a read lock on the lowest byte of
/// `[lo, hi)` that no other open file description holds, taken inside the section (and,
/// locally, the announcement), so that no two holders share a byte and [`count_held`] counts
/// each once. Unlike an exclusive holder's mark it carries no token: a directory writer can
/// forge every token a record shows, so these marks are counted, never compared with a
/// record. `Ok(false)` when no byte is free.
fn hold_lowest_free(file: &File, lo: i64, hi: i64) -> io::Result<bool> {
    match lowest_free(file, lo, hi)? {
        Some(at) => ofd_at(file, libc::F_RDLCK as libc::c_short, false, at),
        None => Ok(false),
    }
}

/// How many bytes the shared holders' marks may use: one per holder (4096 slots at most; any
/// number of `--shared` holders, which the count then caps).
const SHARED_LEN: i64 = 1 << 20;

/// Takes a shared holder's mark on the mutex file (see [`hold_lowest_free`]).
pub(crate) fn hold_shared_mark(file: &File) -> io::Result<bool> {
    hold_lowest_free(file, SHARED, SHARED + SHARED_LEN)
}

/// How many shared holders' marks others hold on the mutex file (up to `cap`).
pub(crate) fn shared_marks(file: &File, cap: usize) -> io::Result<usize> {
    count_held(file, SHARED, SHARED + SHARED_LEN, cap)
}

/// Whether another open file description holds any holder's mark on the mutex file: a token
/// mark ([`mark_held`] from token 0) or a shared one ([`shared_marks`]) — their ranges are
/// adjacent, so one test covers both. `Ok(false)` answers both at once; `Ok(true)` says to ask
/// them apart.
pub(crate) fn any_mark(file: &File) -> io::Result<bool> {
    let first = mark_byte(0);
    held_in(file, first, SHARED + SHARED_LEN - first)
}

/// Blocks until nobody else holds `file`'s lock (a queue ticket's owner left), through a
/// descriptor open for writing; takes the lock for a moment and lets it go.
pub(crate) fn wait_free(file: &File) -> io::Result<()> {
    ofd(file, libc::F_WRLCK as libc::c_short, true)?;
    ofd(file, libc::F_UNLCK as libc::c_short, false).map(drop)
}

/// The size of one lock's region of its directory's lock space: its first byte announces a
/// section ([`announce`]), the rest holds its holders' marks by token ([`DirRegion::hold_mark`]).
pub(crate) const REGION: i64 = 1 << 24;

/// Where a region's shared holders' marks start: its second half (the first holds the
/// announcement and the exclusive holders' marks by token).
const REGION_SHARED: i64 = REGION / 2;

/// One lock's region of LOCK's directory (`LockPaths::dir_region`), for locks a directory
/// writer cannot take away by deleting a file: the announcement of a section, and the
/// holders' marks again (a mark on the mutex file goes with the mutex file): exclusive holders'
/// by token in its first half, shared and slotted holders' counted in its second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirRegion(pub i64);

impl DirRegion {
    /// The byte of token `t`'s mark: past the announcement; tokens beyond the first half share
    /// its last byte (a frozen superseded holder's mark then blocks like a current one's).
    fn mark(self, t: u64) -> i64 {
        self.0 + 1 + i64::try_from(t).unwrap_or(i64::MAX).min(REGION_SHARED - 2)
    }

    /// Takes a shared holder's mark through `dir` (see [`hold_shared_mark`]).
    pub(crate) fn hold_shared_mark(self, dir: &File) -> io::Result<bool> {
        hold_lowest_free(dir, self.0 + REGION_SHARED, self.0 + REGION)
    }

    /// How many shared holders' marks others hold in this region (up to `cap`).
    pub(crate) fn shared_marks(self, dir: &File, cap: usize) -> io::Result<usize> {
        count_held(dir, self.0 + REGION_SHARED, self.0 + REGION, cap)
    }

    /// Takes the mark of token `token` through `dir` (see [`hold_mark`]).
    pub(crate) fn hold_mark(self, dir: &File, token: u64) -> io::Result<()> {
        let got = ofd_at(dir, libc::F_RDLCK as libc::c_short, false, self.mark(token))?;
        if got {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    /// Lets go of every mark `dir` holds in this region.
    pub(crate) fn drop_marks(self, dir: &File) -> io::Result<()> {
        let fl = span(libc::F_UNLCK as libc::c_short, self.0 + 1, REGION - 1);
        fcntl(dir.as_fd(), FcntlArg::F_OFD_SETLK(&fl))
            .map(drop)
            .map_err(io::Error::from)
    }

    /// Whether anyone else holds a mark of token `from` or above in this region (shared
    /// holders' marks apart).
    pub(crate) fn marked(self, dir: &File, from: u64) -> io::Result<bool> {
        let first = self.mark(from);
        held_in(dir, first, self.0 + REGION_SHARED - first)
    }

    /// As [`any_mark`], through `dir`: any token mark ([`DirRegion::marked`] from token 0) or
    /// shared mark ([`DirRegion::shared_marks`]) of this region, in one test.
    pub(crate) fn any_mark(self, dir: &File) -> io::Result<bool> {
        let first = self.mark(0);
        held_in(dir, first, self.0 + REGION - first)
    }
}

/// Announces a section of one lock on its directory (`dir`, a descriptor of its own on LOCK's
/// directory, read-only) at the first byte of its region (`LockPaths::dir_region`), and checks
/// that nobody else has: a read lock, then a test for anyone else's. `Ok(false)`, with nothing left held, when
/// someone else has announced — a section of the same lock entered through another mutex file,
/// which exists only when the mutex file was deleted while someone was inside.
///
/// Why this closes that gap on one host: the mutex file is a name anyone who may write the
/// directory can unlink, but nobody who may only write the directory can remove the directory
/// itself, or its locks. Two processes that each announce, then check, then read LOCK and only
/// then write it cannot both pass: if A's check found nothing, B announced after it, so B's
/// check finds A — unless A had left already, and then A's write came before B's read of LOCK,
/// which shows A's lease. Read locks, because a directory cannot be opened for writing; a write
/// lock is only ever tested for (`F_OFD_GETLK`), never taken.
pub(crate) fn announce(dir: &File, region: DirRegion) -> io::Result<bool> {
    let byte = region.0;
    if !ofd_at(dir, libc::F_RDLCK as libc::c_short, false, byte)? {
        return Ok(false);
    }
    match held_at(dir, byte) {
        Ok(false) => Ok(true),
        other => {
            let _ = withdraw(dir, region);
            other.map(|_| false)
        }
    }
}

/// Lets go of [`announce`]'s lock.
pub(crate) fn withdraw(dir: &File, region: DirRegion) -> io::Result<()> {
    ofd_at(dir, libc::F_UNLCK as libc::c_short, false, region.0).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    fn open(path: &std::path::Path, write: bool) -> File {
        OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .unwrap()
    }

    /// A file `lock` in a new directory, for the lease probes' tests; `None` (saying so) where
    /// leases are off (`fs.leases-enable` = 0), where no probe can answer.
    fn leased_file() -> Option<(tempfile::TempDir, std::path::PathBuf)> {
        if std::fs::read_to_string("/proc/sys/fs/leases-enable").is_ok_and(|v| v.trim() == "0") {
            eprintln!("skipped: leases are disabled on this host (fs.leases-enable = 0)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        std::fs::write(&path, b"x").unwrap();
        Some((dir, path))
    }

    #[test]
    fn a_file_is_open_only_here_until_another_description_of_it_is_opened() {
        let Some((_dir, path)) = leased_file() else {
            return;
        };
        let ours = open(&path, false);
        assert!(open_only_here(&ours), "nobody else has it open");
        // A duplicate (or a forked child's copy) is the same description.
        let dup = ours.try_clone().unwrap();
        assert!(
            open_only_here(&ours),
            "a duplicate is the same open file description"
        );
        let other = open(&path, false);
        assert!(
            !open_only_here(&ours),
            "another description has it open (read-only)"
        );
        drop(other);
        let writer = open(&path, true);
        assert!(
            !open_only_here(&ours),
            "another description has it open (read-write)"
        );
        drop(writer);
        assert!(
            open_only_here(&ours),
            "alone again once the others are closed"
        );
        drop(dup);
    }

    #[test]
    fn a_replaced_file_stays_reachable_while_it_has_a_name_or_another_opener() {
        let Some((dir, path)) = leased_file() else {
            return;
        };
        let ours = open(&path, false);
        assert!(still_reachable(&ours), "LOCK's name still leads to it");
        let link = dir.path().join("link");
        std::fs::hard_link(&path, &link).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(still_reachable(&ours), "a hard link still leads to it");
        let other = open(&link, false);
        std::fs::remove_file(&link).unwrap();
        assert!(
            still_reachable(&ours),
            "nameless, but another description has it open (and may lock it)"
        );
        drop(other);
        assert!(
            !still_reachable(&ours),
            "nameless and open only here: nobody can ever lock it again"
        );
    }

    /// An empty file in a new directory, and how a local read-only holder locks it.
    fn fixture() -> (tempfile::TempDir, std::path::PathBuf, Where) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m");
        std::fs::write(&p, b"").unwrap();
        let local = Where {
            network: false,
            writable: false,
        };
        (dir, p, local)
    }

    /// The holder's locks on LOCK's own file: its flock keeps util-linux flock(1) out, and its
    /// OFD read lock keeps out a whole-file byte-range write lock — the form an NFS server keeps
    /// a client's flock(1) in on its own path, which a local flock never meets; neither meets a
    /// waiter's hint on the first byte. Both go with `let_go_lock_file`.
    #[test]
    fn a_holder_of_lock_excludes_flock_and_whole_file_write_locks_until_it_lets_go() {
        let (_dir, p, _) = fixture();
        let holder = open(&p, false);
        let waiter = open(&p, false);
        let client = open(&p, true);
        let whole_file_write = |f: &File| {
            let fl = span(libc::F_WRLCK as libc::c_short, 0, 0);
            match fcntl(f.as_fd(), FcntlArg::F_OFD_SETLK(&fl)) {
                Ok(_) => {
                    let un = span(libc::F_UNLCK as libc::c_short, 0, 0);
                    fcntl(f.as_fd(), FcntlArg::F_OFD_SETLK(&un)).unwrap();
                    true
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => false,
                Err(e) => panic!("F_OFD_SETLK: {e}"),
            }
        };
        assert!(whole_file_write(&client));
        assert!(hold_lock_file(&holder).unwrap());
        assert!(
            !flock(&client, libc::LOCK_EX | libc::LOCK_NB).unwrap(),
            "flock(1)'s lock is kept out"
        );
        assert!(
            !whole_file_write(&client),
            "an NFS server's lock for its client is kept out"
        );
        assert!(
            hint_waiting(&waiter).unwrap(),
            "a waiter's hint still goes in"
        );
        assert!(waiting_hinted(&holder).unwrap(), "and the holder sees it");
        let_go_lock_file(&holder).unwrap();
        assert!(flock(&client, libc::LOCK_EX | libc::LOCK_NB).unwrap());
        flock(&client, libc::LOCK_UN).unwrap();
        drop(waiter);
        assert!(whole_file_write(&client), "both locks went");
    }

    /// A read-only holder's lock excludes a second holder (flock), is seen by a tester through
    /// `F_OFD_GETLK`, and excludes a byte-range write lock — the form an NFS server keeps its
    /// clients' locks in — while it is held; all three go with `unlock`.
    /// A holder's mark neither blocks the mutex nor is blocked by it, is seen by others
    /// through `mark_held` until it is dropped (or its descriptor closed), and is never seen by
    /// its own descriptor.
    #[test]
    fn a_holders_mark_is_apart_from_the_mutex_and_shows_until_dropped() {
        let (_dir, p, local) = fixture();
        let holder = open(&p, false);
        let other = open(&p, false);
        assert!(!mark_held(&other, 0).unwrap());
        assert!(try_exclusive(&holder, local).unwrap());
        hold_mark(&holder, 7).unwrap();
        unlock(&holder, local).unwrap();
        assert!(
            mark_held(&other, 7).unwrap(),
            "the mark outlives the mutex section"
        );
        assert!(mark_held(&other, 0).unwrap());
        assert!(
            !mark_held(&other, 8).unwrap(),
            "a later token supersedes it"
        );
        assert!(
            !mark_held(&holder, 0).unwrap(),
            "our own mark is not another's"
        );
        assert!(
            try_exclusive(&other, local).unwrap(),
            "the mark never blocks the mutex"
        );
        unlock(&other, local).unwrap();
        drop_mark(&holder).unwrap();
        assert!(!mark_held(&other, 0).unwrap());
        hold_mark(&holder, u64::MAX).unwrap();
        assert!(
            mark_held(&other, u64::MAX).unwrap(),
            "the largest token has a byte"
        );
        drop(holder);
        // Soon, not at this instant: another test of this binary forking meanwhile holds a
        // duplicate of the descriptor until its child execs (as in `mutex`'s claim test).
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while mark_held(&other, 0).unwrap() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            !mark_held(&other, 0).unwrap(),
            "closing the descriptor drops the mark"
        );
    }

    /// Two sections of one lock announced on its directory through two descriptors: the
    /// second is refused (and holds nothing after), until the first withdraws; another lock's
    /// byte is another section.
    #[test]
    fn only_one_section_of_a_lock_is_announced_on_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let a = File::open(dir.path()).unwrap();
        let b = File::open(dir.path()).unwrap();
        let (one, two) = (DirRegion(REGION), DirRegion(2 * REGION));
        assert!(announce(&a, one).unwrap());
        assert!(!announce(&b, one).unwrap());
        assert!(announce(&b, two).unwrap(), "another lock");
        assert!(
            !held_at(&a, REGION).unwrap(),
            "a refused announcement leaves nothing held"
        );
        withdraw(&a, one).unwrap();
        assert!(announce(&b, one).unwrap());
        assert!(!announce(&a, one).unwrap());
        // Marks in the region neither block nor are blocked by announcements.
        one.hold_mark(&a, 5).unwrap();
        assert!(one.marked(&b, 5).unwrap() && one.marked(&b, 0).unwrap());
        assert!(!one.marked(&b, 6).unwrap(), "a later token supersedes it");
        assert!(!two.marked(&b, 0).unwrap(), "another lock's region");
        one.hold_mark(&a, u64::MAX).unwrap();
        assert!(one.marked(&b, u64::MAX).unwrap());
        one.drop_marks(&a).unwrap();
        assert!(!one.marked(&b, 0).unwrap());
    }

    /// Shared holders' marks are counted, one byte each (the lowest free), through any
    /// descriptor but the holder's own; they are apart from the token marks; a wide lock
    /// someone else holds counts every byte (more, never fewer), and a closed descriptor's
    /// mark frees its byte for the next holder.
    /// One test for any mark says no only when neither a token mark (of any token) nor a
    /// shared mark is held by another description, on the mutex file and in a directory
    /// region; our own marks are not another's.
    #[test]
    fn any_mark_sees_every_token_and_shared_mark_of_others_and_none_of_ours() {
        let (_d, p, _) = fixture();
        let (holder, look) = (open(&p, false), open(&p, false));
        assert!(!any_mark(&look).unwrap());
        for t in [0, 1, 7, u64::MAX] {
            hold_mark(&holder, t).unwrap();
            assert!(any_mark(&look).unwrap(), "token {t}");
            assert!(!any_mark(&holder).unwrap(), "our own mark of token {t}");
            drop_mark(&holder).unwrap();
            assert!(!any_mark(&look).unwrap());
        }
        assert!(hold_shared_mark(&holder).unwrap());
        assert!(any_mark(&look).unwrap(), "a shared mark");
        drop(holder);
        assert!(!any_mark(&look).unwrap());

        let dir = tempfile::tempdir().unwrap();
        let d = || File::open(dir.path()).unwrap();
        let region = DirRegion(3 * REGION);
        let (a, look) = (d(), d());
        // Another lock's region, and this one's announcement, are not marks.
        assert!(DirRegion(2 * REGION).hold_shared_mark(&a).unwrap());
        DirRegion(4 * REGION).hold_mark(&a, 1).unwrap();
        assert!(announce(&a, region).unwrap());
        assert!(!region.any_mark(&look).unwrap());
        for t in [0, 1, u64::MAX] {
            let m = d();
            region.hold_mark(&m, t).unwrap();
            assert!(region.any_mark(&look).unwrap(), "token {t}");
            assert!(!region.any_mark(&m).unwrap(), "our own");
        }
        let m = d();
        assert!(region.hold_shared_mark(&m).unwrap());
        assert!(region.any_mark(&look).unwrap(), "a shared mark");
        drop(m);
        assert!(!region.any_mark(&look).unwrap());
    }

    #[test]
    fn shared_holders_marks_are_counted_one_byte_each_apart_from_token_marks() {
        let dir = tempfile::tempdir().unwrap();
        let d = || File::open(dir.path()).unwrap();
        let region = DirRegion(3 * REGION);
        let (a, b, c, look) = (d(), d(), d(), d());
        assert_eq!(region.shared_marks(&look, 10).unwrap(), 0);
        assert!(region.hold_shared_mark(&a).unwrap());
        assert!(region.hold_shared_mark(&b).unwrap());
        assert!(region.hold_shared_mark(&c).unwrap());
        assert_eq!(region.shared_marks(&look, 10).unwrap(), 3);
        assert_eq!(region.shared_marks(&look, 2).unwrap(), 2, "capped");
        assert_eq!(region.shared_marks(&a, 10).unwrap(), 2, "not our own");
        assert!(!region.marked(&look, 0).unwrap(), "apart from token marks");
        drop(b);
        assert_eq!(region.shared_marks(&look, 10).unwrap(), 2);
        let e = d();
        assert!(region.hold_shared_mark(&e).unwrap());
        assert_eq!(
            region.shared_marks(&look, 10).unwrap(),
            3,
            "b's byte reused, not shared"
        );
        // Someone holding the whole range counts as every byte of it.
        let wide = d();
        let fl = span(
            libc::F_RDLCK as libc::c_short,
            region.0 + REGION_SHARED,
            REGION - REGION_SHARED,
        );
        fcntl(wide.as_fd(), FcntlArg::F_OFD_SETLK(&fl)).unwrap();
        assert_eq!(region.shared_marks(&look, 100).unwrap(), 100);
        region.drop_marks(&a).unwrap();
        region.drop_marks(&c).unwrap();
        region.drop_marks(&e).unwrap();
        drop(wide);
        assert_eq!(region.shared_marks(&look, 10).unwrap(), 0);
        // On the mutex file too, apart from the token marks.
        let (_d2, p, _) = fixture();
        let (f, g) = (open(&p, false), open(&p, false));
        assert!(hold_shared_mark(&f).unwrap());
        assert_eq!(shared_marks(&g, 5).unwrap(), 1);
        assert!(!mark_held(&g, 0).unwrap());
        hold_mark(&f, u64::MAX).unwrap();
        assert!(mark_held(&g, u64::MAX).unwrap());
        assert_eq!(shared_marks(&g, 5).unwrap(), 1);
        drop_mark(&f).unwrap();
        assert_eq!(shared_marks(&g, 5).unwrap(), 0);
    }

    #[test]
    fn a_local_holder_excludes_flock_byte_range_locks_and_shows_to_testers() {
        let (_dir, p, local) = fixture();
        let a = open(&p, false);
        assert!(try_exclusive(&a, local).unwrap());
        let b = open(&p, false);
        assert!(!try_exclusive(&b, local).unwrap(), "flock excludes");
        assert!(held_by_other(&b, false).unwrap());
        let server = open(&p, true);
        assert!(
            !ofd(&server, libc::F_WRLCK as libc::c_short, false).unwrap(),
            "a byte-range write lock (an NFS client's, as the server keeps it) is refused"
        );
        unlock(&a, local).unwrap();
        assert!(!held_by_other(&b, false).unwrap());
        assert!(ofd(&server, libc::F_WRLCK as libc::c_short, false).unwrap());
        assert!(
            !try_exclusive(&b, local).unwrap(),
            "a byte-range lock held for a client keeps local contenders out"
        );
        assert!(
            flock(&b, libc::LOCK_EX | libc::LOCK_NB).unwrap(),
            "and leaves no flock behind when it fails"
        );
    }
}
