//! The fast hand-over on a local file system: a holder releasing to a waiting head in place,
//! and the head taking the lease with its lease prepared ahead of time.
//!
//! Owns: the waiter's hint that it waits (an OFD read lock on the LOCK file it last read); the
//! holder's release in place (its released bit set on the file it renamed into place, when a
//! waiter's hint is there — or util-linux flock(1) waits blocked for the holder's flock on it
//! — and the file holds exactly its bytes) and what is done with the files
//! let go of then (made durable, closed later by `grave.rs`); the head's prepared lease
//! (`q-N.lease` beside its ticket: written while it waits, renamed over LOCK when it takes the
//! lease). `builder.rs`, `queue.rs` and `guard.rs` call these; nothing else does a hand-over.
//! Must never: write LOCK's bytes (the release in place is one `fchmod` through a read-only
//! descriptor); mark a file that is not exactly the record we last wrote; rename a prepared file
//! that is not ours (it must still have its one name); keep a descriptor open for writing past
//! the take; be used on a network file system (the callers check).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::fsio::{self, Seen, Written};
use crate::grave;
use crate::lockdir::LockDir;
use crate::paths::LockPaths;

/// A contender's hint to the holder that it looks at LOCK's file, and waits if it must: an OFD
/// read lock on the LOCK file it read (placed as soon as it has read it, kept while it waits
/// between its looks, local file systems only; `klock::hint_waiting`). It goes when that file
/// is closed. Only a hint: both answers a holder gets are safe (a release in place, or a look
/// for a program blocked on the file). Not a flock, which
/// would meet the holder's own exclusive flock on that file (`klock::hold_lock_file`) and keep
/// util-linux flock(1) waiting on a file this waiter is about to rename a new lease over.
pub(crate) fn announce_waiting(seen: &Seen) {
    let _ = crate::klock::hint_waiting(&seen.file);
}

/// The release of a lease someone may wait for. When LOCK is still the file we renamed into
/// place (`w`), a contender hints that it looks at it (see [`announce_waiting`]; `decided`: the
/// caller found that hint, which is not asked again), and it holds exactly `bytes` (our lease
/// as we last wrote it: held, intact): lets go of our flock on it (the job is over), then sets
/// its released bit ([`fsio::RELEASED_BIT`]) through a read-only descriptor, and returns the
/// file, still open. In that order, so that the head our mark wakes never finds our own flock
/// on a released record; a flock(1) that takes the lock in between is found by the head, which
/// waits for it. `Err(w)` otherwise, with `w` (and our flock) as they were: nobody hints (the
/// caller writes the full released record), or LOCK is not simply ours, or we may not chmod it
/// (the caller goes the long way, which reports what happened). Not made durable here (see
/// [`settle`]).
pub(crate) fn release_in_place(
    paths: &LockPaths,
    bytes: &[u8],
    w: Written,
    decided: bool,
) -> std::result::Result<File, Written> {
    let Written { id, kept } = w;
    // The file we renamed into place, kept open since; if it is not LOCK any more, nobody
    // reads it by name and marking it released changes nothing.
    let f = match kept.or_else(|| fsio::open_lock_if(paths, id)) {
        Some(f) => f,
        None => return Err(Written { id, kept: None }),
    };
    if !decided && !crate::klock::waiting_hinted(&f).unwrap_or(false) {
        return Err(Written { id, kept: Some(f) });
    }
    let _ = crate::klock::let_go_lock_file(&f);
    if !holds_exactly(&f, bytes) || fsio::mark_released(&f, &paths.lock).is_err() {
        return Err(Written { id, kept: Some(f) });
    }
    Ok(f)
}

/// Whether `f` holds exactly `bytes`: one byte more is read, to notice a file that grew.
pub(crate) fn holds_exactly(f: &File, bytes: &[u8]) -> bool {
    let mut now = vec![0u8; bytes.len() + 1];
    matches!(f.read_at(&mut now, 0), Ok(n) if now[..n] == bytes[..])
}

/// Whether a program may be about to lock `f` without being blocked on it: another open file
/// description has it open for writing (`klock::open_for_writing_elsewhere`) — on an NFS
/// server, a client's flock(1), whose blocking lock is a poll the server never lists as
/// blocked, and for which the server holds the file open read-write. leasehold's own opens of
/// LOCK's files (looks, waiters' hints, `status`, descriptors put aside) are read-only and
/// never count. `false` when nobody does or it cannot be told (a file another user owns).
pub(crate) fn opened_for_writing(f: &File) -> bool {
    crate::klock::open_for_writing_elsewhere(f) == Some(true)
}

/// How long a releasing holder waits for a program blocked on its lock file (util-linux
/// flock(1)) to take the lock once it lets go, before it marks its record released anyway.
const BLOCKED_TAKES_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The release of a lease whose file (`f`, LOCK as we renamed it into place, holding `bytes`)
/// another program waits on, blocked for our flock: util-linux flock(1) on LOCK. Lets go of the
/// flock, waits (at most [`BLOCKED_TAKES_WITHIN`]) until another process holds an exclusive
/// lock on the file (`mutex::exclusively_locked`, tested atomically: a look at /proc/locks
/// can skip it) — the kernel woke the blocked one, which then takes it —, and only then sets the
/// released bit in place: the file stays LOCK, so the program runs on the file every contender
/// looks at, and a contender that reads the released record finds its lock and waits for it
/// (`mutex::exclusive_locker`). A full released record renamed over the file instead would
/// leave the program holding a file nobody looks at. Says how the job ended nowhere (as a
/// release in place never does). `Err(f)` when the file does not hold exactly `bytes` or may
/// not be chmodded: the caller marks its header instead.
pub(crate) fn release_to_blocked(
    paths: &LockPaths,
    bytes: &[u8],
    f: File,
) -> std::result::Result<File, File> {
    let _ = crate::klock::let_go_lock_file(&f);
    nap_until(
        BLOCKED_TAKES_WITHIN,
        std::time::Duration::from_millis(10),
        || crate::mutex::exclusively_locked(&f),
    );
    if !holds_exactly(&f, bytes) || fsio::mark_released(&f, &paths.lock).is_err() {
        return Err(f);
    }
    Ok(f)
}

/// A program a releasing holder lets run before its release: it blocked on a file LOCK named
/// before a lease replaced it (util-linux flock(1) that opened LOCK just before the rename), or
/// it has such a file open for writing without being blocked on it (util-linux flock(1) on an
/// NFS client of the server whose own path we use: the client's blocking lock is a poll the
/// server never lists as blocked). Running it later, beside the next holder, would be two jobs at once
/// (PROTOCOL.md §4, §10). The release waits until it has let go (or, for one that only has the
/// file open, until it has locked it or closed it, at most [`OPEN_TAKES_WITHIN`]);
/// [`LeaseBuilder::on_serve`](crate::LeaseBuilder::on_serve) and
/// [`serve_blocked`](crate::serve_blocked) report each one, so that the wait is not silent.
///
/// ```
/// let s = leasehold::Served {
///     lock: "/var/lock/deploy.lock".into(),
///     pid: Some(4242),
///     user: Some("deploy".into()),
///     blocked: true,
/// };
/// assert_eq!(s.who(), "pid 4242 (user deploy)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// LOCK, as the holder took it.
    pub lock: PathBuf,
    /// The blocked program's process id, when this host's /proc/locks names it.
    pub pid: Option<i32>,
    /// Its user, when its process can still be read.
    pub user: Option<String>,
    /// `true`: /proc/locks shows it blocked for our lock. `false`: another open file
    /// description has the file open for writing and nothing is blocked on it — on an NFS
    /// server, a client whose lock request polls (this host cannot name it); the release gives
    /// it the chance to lock the file before it goes on.
    pub blocked: bool,
}

impl Served {
    /// The program as `pid N (user U)`, or what is known of it.
    pub fn who(&self) -> String {
        match (self.pid, &self.user) {
            (Some(p), Some(u)) => format!("pid {p} (user {})", crate::text::escape(u)),
            (Some(p), None) => format!("pid {p}"),
            _ => "a program this host cannot name".into(),
        }
    }
}

/// Reports one program served (the builder's `on_serve`, or `serve_blocked`'s caller).
pub(crate) type ServeCallback = std::sync::Arc<dyn Fn(&Served) + Send + Sync>;

/// Who is blocked for our flock on `f`, as /proc/locks names the first request waiting for it.
fn blocked_one(f: &File, lock: &std::path::Path) -> Served {
    let pid = crate::os::linux::procfs::proc_locks(f)
        .into_iter()
        .find(|l| l.blocked && l.pid > 0)
        .map(|l| l.pid);
    let user = pid
        .and_then(|p| crate::process::stat(p).ok().flatten())
        .map(|s| crate::lockdir::user_name(s.uid));
    Served {
        lock: lock.to_path_buf(),
        pid,
        user,
        blocked: true,
    }
}

/// How long a releasing holder keeps a file it replaced unlocked for a program that has it open
/// but is not blocked on it, waiting for that program to lock it or close it. A Linux NFS
/// client retries a blocking lock the server refused after 1, 2, 4 … seconds, at most 30
/// (`NFS4_LOCK_MAXTIMEOUT`): one retry at least falls within this.
pub const OPEN_TAKES_WITHIN: std::time::Duration = std::time::Duration::from_secs(35);

/// Naps from 100 µs doubling to `max` until `done` or `within` has passed; whether `done`.
fn nap_until(
    within: std::time::Duration,
    max: std::time::Duration,
    done: impl Fn() -> bool,
) -> bool {
    let until = std::time::Instant::now() + within;
    let mut nap = std::time::Duration::from_micros(100);
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(max);
    }
}

/// Before a holder's release becomes visible: programs that may lock a file that is no longer
/// LOCK but that we hold the lock of (`files`: the one our lease replaced, claimed before the
/// rename, and our own earlier files a rewrite replaced) get that lock now, one after the
/// other, while our lease still keeps every leasehold contender out, and we wait until they
/// have let go. Let go of at once, they would run on a file nobody looks at, beside the next
/// holder. Two kinds (PROTOCOL.md §4, §10):
/// - blocked for our flock, as /proc/locks shows (util-linux flock(1) that opened LOCK before a
///   rename over it): we let go, wait until it holds the lock (at most a second), and take it
///   again, waiting until its job is over;
/// - having the file open for writing, not blocked (an NFS client's flock(1) when we are on
///   the server's own path: its blocking lock is a poll, and the server holds the file open
///   read-write for it): we let go and wait until it locks the file (then as above) or nobody
///   has it open for writing any more, at most [`OPEN_TAKES_WITHIN`].
///
/// Waits as long as their jobs run (the guard keeps renewing meanwhile); nothing to do, and no
/// wait, when nobody is blocked on the files or has them open for writing. `tell` hears of each program before it runs
/// (LOCK is `lock`).
pub(crate) fn serve_old_waiters<'a>(
    files: impl IntoIterator<Item = &'a File>,
    lock: &std::path::Path,
    tell: Option<&(dyn Fn(&Served) + Send + Sync)>,
) {
    use crate::klock;
    use crate::mutex::exclusively_locked;
    let ms = std::time::Duration::from_millis;
    // Only a file whose flock we hold: a program blocked behind anyone else's (a frozen
    // holder's, whose job was stopped) is not ours to serve.
    for f in files {
        // At most a few rounds: each is a program that had the file open when we looked.
        for _ in 0..64 {
            // Blocked behind our flock (/proc/locks says so), or not blocked but with the file
            // open for writing (a polling NFS client's flock(1), seen from the server's path).
            let blocked = match crate::mutex::blocked_behind_ours(f) {
                None => break,
                Some(b) => b,
            };
            if !blocked && !opened_for_writing(f) {
                break;
            }
            if let Some(tell) = tell {
                tell(&if blocked {
                    blocked_one(f, lock)
                } else {
                    Served {
                        lock: lock.to_path_buf(),
                        pid: None,
                        user: None,
                        blocked: false,
                    }
                });
            }
            let _ = klock::let_go_lock_file(f);
            let taken = if blocked {
                nap_until(BLOCKED_TAKES_WITHIN, ms(10), || exclusively_locked(f))
            } else {
                // Taken, or nobody left who could take it.
                nap_until(OPEN_TAKES_WITHIN, ms(50), || {
                    exclusively_locked(f) || !opened_for_writing(f)
                }) && exclusively_locked(f)
            };
            if !blocked && !taken {
                // Nobody left, or the time is up: the file stays let go of.
                break;
            }
            // Ours again once it has let go (waiting, as the program did).
            if klock::wait_exclusive(f).is_err() {
                break;
            }
        }
    }
}

/// Finishes a release in place: makes the mark durable (with `sync`), then puts the files let
/// go of — the marked file, the one our lease replaced, and the holder's mark, all read-only or
/// `O_PATH`, none locked by us — aside, to be closed off the waiter's way.
pub(crate) fn settle(
    paths: &LockPaths,
    marked: File,
    sync: bool,
    replaced: Option<File>,
    mark: Option<OwnedFd>,
) -> Result<()> {
    // The waiter replaces the record straight away, so a full released record saying how the
    // job ended would be read by nobody.
    if sync {
        marked
            .sync_all()
            .map_err(|e| Error::io(&paths.lock, "fsync the released mark", e))?;
    }
    grave::bury(
        [Some(marked), replaced]
            .into_iter()
            .flatten()
            .map(OwnedFd::from)
            .chain(mark),
    );
    Ok(())
}

/// The name of the prepared lease of the ticket named `ticket`.
pub(crate) fn prepared_name(ticket: &OsStr) -> OsString {
    let mut n = ticket.to_os_string();
    n.push(".lease");
    n
}

/// Our lease written ahead of time into `q-<seq>.lease` beside our ticket, open, so that taking
/// the lease is a write into a page that exists and one rename (no file to create).
#[derive(Debug)]
pub(crate) struct Prepared {
    path: PathBuf,
    name: OsString,
    file: File,
    /// The same file, read-only, with the holder's flock on it: what the holder keeps for its
    /// whole holding and its release.
    ro: File,
    id: (u64, u64),
    len: usize,
}

impl Prepared {
    /// Writes `bytes` (the exact length our lease will have when taken) into the prepared lease
    /// of the ticket named `ticket` in the queue directory `q`, created exclusively, and keeps
    /// it open. Local file systems only: on NFS a descriptor kept open across a rename is not
    /// what we want. `None` when it cannot be made (e.g. a skipped waiter's late file has the
    /// name): taking the lease then writes a new file as usual.
    pub(crate) fn write(q: &LockDir, ticket: &OsStr, bytes: &[u8]) -> Option<Prepared> {
        let name = prepared_name(ticket);
        let path = q.join(&name);
        let (file, id) = q.create_new(&name, fsio::LEASE_MODE).ok()?;
        // Its blocks now, while we wait, so that the rename over LOCK at the take has nothing
        // to write back on ext4 (`fsinfo::preallocate`).
        q.preallocate(&file, bytes.len());
        let made = file.write_all_at(bytes, 0).is_ok();
        // The very inode, read-only, through our own descriptor, with the holder's flock on it
        // already (`klock::hold_lock_file`): taken now, while nobody can know the file, so
        // that it is there before the file becomes LOCK.
        let ro = fsio::held_copy(&file, &path);
        let (true, Ok(ro)) = (made, ro) else {
            q.unlink_if(&name, id);
            return None;
        };
        Some(Prepared {
            path,
            name,
            file,
            ro,
            id,
            len: bytes.len(),
        })
    }

    /// Whether `bytes` can be written over it: any lease (the same length as drafted needs no
    /// new blocks; another length — a record whose history came out otherwise than drafted,
    /// `ending.rs` — is written and the file cut to it, which still beats a temp file: no file
    /// to create, and nothing left beside LOCK if we are killed mid-way, since whoever removes
    /// our dead ticket removes this file with it).
    pub(crate) fn fits(&self, bytes: &[u8]) -> bool {
        bytes.len() as u64 <= crate::record::MAX_LEASE_BYTES
    }

    /// Takes the lease through the prepared file: writes `bytes` into it, optionally fsyncs it,
    /// renames it over LOCK, and optionally fsyncs LOCK's directory. Under the mutex, with our
    /// ticket still queued. `None` (nothing renamed) when the name is not our file any more:
    /// the caller then writes the lease the usual way.
    pub(crate) fn install(
        self,
        q: &LockDir,
        bytes: &[u8],
        durable: bool,
        paths: &LockPaths,
    ) -> Option<Result<Written>> {
        let p = self;
        // Our file still has its one name (made exclusively, never linked elsewhere: a link
        // count of one is that name), and removing it takes the mutex we hold: it is ours at
        // the rename.
        if !p.file.metadata().is_ok_and(|m| m.nlink() == 1) {
            return None;
        }
        let done = (|| {
            p.file
                .write_all_at(bytes, 0)
                .map_err(|e| Error::io(&p.path, "write our prepared lease", e))?;
            if bytes.len() < p.len {
                p.file
                    .set_len(bytes.len() as u64)
                    .map_err(|e| Error::io(&p.path, "cut our prepared lease", e))?;
            }
            if durable {
                p.file
                    .sync_data()
                    .map_err(|e| Error::io(&p.path, "fsync our prepared lease", e))?;
            }
            q.rename_to(&p.name, paths.handle(), paths.lock_name())
                .map_err(|e| Error::io(&paths.lock, "rename into place", e))?;
            if durable {
                paths.handle().sync()?;
            }
            Ok(Written {
                id: p.id,
                kept: Some(p.ro),
            })
        })();
        if done.is_err() {
            q.unlink_if(&p.name, p.id);
        }
        Some(done)
    }

    /// Removes it (leaving the queue without the lease), if the name is still our file.
    pub(crate) fn discard(self, q: &LockDir) {
        q.unlink_if(&self.name, self.id);
    }
}
