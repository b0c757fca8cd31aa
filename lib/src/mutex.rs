//! The short kernel-lock mutex around reading and changing a lease, and the fencing-token
//! high-water mark kept in the same file: a durable ceiling, raised a block of tokens at a
//! time, and the last token handed out below it (PROTOCOL.md §3).
//!
//! Owns: taking and leaving the mutex (through `klock.rs`, the one home of kernel lock calls:
//! flock(2) and an OFD byte-range lock on a local disk, the OFD lock on NFS), the
//! inode re-check after locking, bounded waiting by polling try-lock (a blocking flock can hang
//! for tens of seconds on NFS), detecting a process that sits on the mutex, and the mutex
//! file's lock-identity line (which LOCK it belongs to: PROTOCOL.md §1).
//! Must never: hand out a token above the durable ceiling; rename, replace or delete the mutex
//! file; write to or chmod a file at the mutex name before its identity line names this LOCK
//! (or shows an older leasehold's file); hold the mutex while a job runs; wait
//! past the caller's deadline.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;

use crate::error::{Error, Result};
use crate::klock::{self, Where};
use crate::lockdir::{Meta, user_name};
use crate::os::linux::procfs::proc_locks;
use crate::paths::LockPaths;
use crate::process;
use crate::store::StuckPolicy;

const HWM_PREFIX: &str = "leasehold-mutex 1 token ";
const HWM_LEN: usize = HWM_PREFIX.len() + 20 + 1;
const LAST_PREFIX: &str = "last ";
/// Room for a boot id (a UUID: 36 characters).
const BOOT_ROOM: usize = 36;
const LAST_LEN: usize = LAST_PREFIX.len() + 20 + " of ".len() + 20 + " boot ".len() + BOOT_ROOM + 1;

/// Where the lock-identity line starts: after the two token lines, which every version writes
/// at their fixed offsets and never past, so the line survives an older leasehold's writes.
const IDENTITY_AT: u64 = (HWM_LEN + LAST_LEN) as u64;
/// The lock-identity line: `lock ` and LOCK's file name in lowercase hex (a name may hold any
/// byte but `/` and NUL), then a newline. Written once, when the file is created.
const IDENTITY_PREFIX: &str = "lock ";
/// The longest identity line: a 255-byte name.
const IDENTITY_MAX: u64 = (IDENTITY_PREFIX.len() + 2 * crate::paths::NAME_MAX + 1) as u64;
/// How long a contender that finds an empty mutex file waits for its creator to write the
/// identity line (written right after the exclusive create) before refusing it: long enough
/// for another NFS host's write to reach the server and this client.
const EMPTY_PATIENCE: Duration = Duration::from_millis(1000);

/// The mutex file, open (not necessarily locked), with the identity of the inode it names and
/// the process that opened it. Kept across acquisitions by a builder, and by a guard as its
/// witness, so that taking the mutex again costs a flock and one stat, not an open.
///
/// Kept descriptors are read-only on local file systems (flock and an OFD read lock need no
/// write access there, see `klock.rs`):
/// a descriptor open for writing, held for as long as a lease, would keep the file system from
/// being remounted read-only. The high-water mark is then written through a short-lived
/// write descriptor. NFSv4 refuses exclusive locks on read-only descriptors, so on network file
/// systems the descriptor is read-write.
#[derive(Debug)]
pub(crate) struct MutexFile {
    file: File,
    dev: u64,
    ino: u64,
    pid: u32,
    /// How it is locked: read-write or read-only, on a network file system or not.
    at: Where,
    /// On a local file system: LOCK's directory, opened again for this file's sections to be
    /// announced on (`klock::announce`) and its holders' marks, in the lock's region `region`.
    dir: Option<File>,
    region: klock::DirRegion,
}

impl MutexFile {
    /// Opens (creating if need be) the mutex file of `paths`, read-write or read-only as
    /// `at.writable` says.
    pub(crate) fn open(paths: &LockPaths, at: Where) -> Result<MutexFile> {
        let (file, meta) = open(paths, at.writable)?;
        // A directory lock is no lock on NFS (and the server's own path announces locally).
        let dir = if at.network {
            None
        } else {
            Some(
                paths
                    .handle()
                    .reopen()
                    .map_err(|e| Error::io(&paths.dir, "open the lock's directory", e))?,
            )
        };
        Ok(MutexFile {
            file,
            dev: meta.dev,
            ino: meta.ino,
            pid: std::process::id(),
            at,
            dir,
            region: paths.dir_region(),
        })
    }

    /// Announces our section on LOCK's directory (`klock::announce`); true when nobody else
    /// has (always on NFS, where there is no announcement). An error says yes: the mutex alone
    /// then keeps the section, as before announcements.
    fn announce(&self) -> bool {
        self.dir
            .as_ref()
            .is_none_or(|d| klock::announce(d, self.region).unwrap_or(true))
    }

    fn withdraw(&self) {
        if let Some(d) = &self.dir {
            let _ = klock::withdraw(d, self.region);
        }
    }

    /// Device and inode of the mutex file.
    pub(crate) fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// Lets go of the holder's mark (see [`MutexGuard::hold_mark`]), just before a release
    /// becomes visible.
    pub(crate) fn drop_mark(&self) {
        let _ = klock::drop_mark(&self.file);
        if let Some(d) = &self.dir {
            let _ = self.region.drop_marks(d);
        }
    }

    /// Whether this process opened it. A forked child shares the parent's open file
    /// description, and with it the parent's flock: it must never lock through it.
    fn ours(&self) -> bool {
        self.pid == std::process::id()
    }
}

/// The mutex, held. Dropping it closes the file, which releases the kernel lock;
/// [`MutexGuard::unlock`] releases it and keeps the file open for the next time.
#[derive(Debug)]
pub(crate) struct MutexGuard {
    file: MutexFile,
    path: PathBuf,
    /// LOCK's file as this section found it free, claimed (`klock::claim_lock_file`) by the
    /// look that found no other program on it ([`claim_lock_file`]): handed to the holding by
    /// the take, let go of if the section ends without one.
    claimed: std::sync::Mutex<Option<File>>,
}

/// Takes the mutex of `path`, polling try-lock with backoff, never past `deadline`. After
/// `stuck_after` of waiting, the holder named by /proc/locks is judged (see [`StuckPolicy`]).
pub(crate) fn lock(
    paths: &LockPaths,
    deadline: Option<Instant>,
    stuck_after: Duration,
    policy: StuckPolicy,
    network: bool,
) -> Result<MutexGuard> {
    let at = Where {
        network,
        writable: true,
    };
    lock_with(None, paths, deadline, stuck_after, policy, None, at)
}

/// What a caller waiting for the mutex is told now and then.
#[derive(Debug)]
pub(crate) enum MutexWait<'a> {
    /// Time to move a queued waiter's ticket heartbeat, so that waiting behind a stuck mutex
    /// is never taken for being frozen.
    Beat,
    /// The mutex has been held by someone else for longer than any transition takes (about a
    /// second): who holds it, as far as the kernel tells (`/proc/locks`). Said again when the
    /// holder changes.
    Blocked(&'a str),
}

/// The callback of a caller waiting for the mutex (see [`MutexWait`]).
pub(crate) type Waiting<'a> = Option<&'a mut dyn FnMut(MutexWait<'_>)>;

/// How long the mutex may be busy before the waiter is told who holds it.
const TELL_AFTER: Duration = Duration::from_millis(800);

/// The longest nap between two try-locks of a busy mutex while the wait is young. Short, so
/// that a process waiting to join the queue is not overtaken round after round by one that has
/// just released and re-enters at once: with a 5 ms nap a process that missed once slept through
/// several hand-overs while the releaser took the lease again (four workers, empty critical
/// section: 850 of 3,800 acquisitions went to the worker that had the one before, FIFO fairness
/// max/min 1.1–1.3 on tmpfs and 1.5–1.7 on ext4; with this nap 1.02–1.04 on both).
const NAP_YOUNG: Duration = Duration::from_micros(200);

/// How long a wait for the mutex is young: mutex sections last microseconds (milliseconds with
/// an fsync), so a mutex still busy after this is stuck, and polling it fast would only burn
/// CPU; the nap then grows to [`NAP_OLD`].
const YOUNG_FOR: Duration = Duration::from_millis(100);

/// The longest nap once the wait is no longer young.
const NAP_OLD: Duration = Duration::from_millis(5);

/// The clocks of one wait for a busy mutex: when to judge a holder that sits on it, when to
/// move a queued waiter's beat, and when to say who holds it.
struct Patience {
    stuck_after: Duration,
    next_judgement: Option<Instant>,
    beat_every: Duration,
    next_beat: Option<Instant>,
    next_tell: Option<Instant>,
    /// Who we last said holds it.
    told: String,
}

impl Patience {
    fn new(start: Instant, stuck_after: Duration) -> Patience {
        let beat_every = (stuck_after / 8).max(Duration::from_millis(1));
        Patience {
            stuck_after,
            next_judgement: start.checked_add(stuck_after),
            beat_every,
            next_beat: start.checked_add(beat_every),
            next_tell: start.checked_add(TELL_AFTER),
            told: String::new(),
        }
    }

    /// Between two try-locks of `file` at `now`: whatever is due.
    fn between(
        &mut self,
        file: &File,
        now: Instant,
        policy: StuckPolicy,
        waiting: &mut Waiting<'_>,
    ) {
        if self.next_judgement.is_some_and(|j| now >= j) {
            judge_stuck(file, policy);
            self.next_judgement = now.checked_add(self.stuck_after);
        }
        if let Some(f) = waiting.as_deref_mut()
            && self.next_beat.is_some_and(|b| now >= b)
        {
            f(MutexWait::Beat);
            self.next_beat = now.checked_add(self.beat_every);
        }
        if let Some(f) = waiting.as_deref_mut()
            && self.next_tell.is_some_and(|t| now >= t)
        {
            let who = describe_holder(file);
            if who != self.told {
                f(MutexWait::Blocked(&who));
                self.told = who;
            }
            self.next_tell = now.checked_add(Duration::from_secs(1));
        }
    }
}

/// As [`lock`], through `reuse` when it is given, still names the mutex file at `path`, and was
/// opened by this process; through a fresh open otherwise.
pub(crate) fn lock_with(
    reuse: Option<MutexFile>,
    paths: &LockPaths,
    deadline: Option<Instant>,
    stuck_after: Duration,
    policy: StuckPolicy,
    mut waiting: Waiting<'_>,
    at: Where,
) -> Result<MutexGuard> {
    let path = &paths.mutex;
    let start = Instant::now();
    let mut patience = Patience::new(start, stuck_after);
    let mut backoff = Duration::from_micros(20);
    let mut reuse = reuse.filter(MutexFile::ours);
    loop {
        let mf = match reuse.take() {
            Some(mf) => mf,
            None => MutexFile::open(paths, at)?,
        };
        loop {
            match klock::try_exclusive(&mf.file, mf.at) {
                Ok(true) if mf.announce() => break,
                // Someone is inside through another mutex file (this one was deleted under
                // them): wait, as for a busy mutex.
                Ok(true) => {
                    let _ = klock::unlock(&mf.file, mf.at);
                }
                Ok(false) => {}
                Err(e) => return Err(Error::io(path, "lock the mutex", e)),
            }
            let now = Instant::now();
            if let Some(d) = deadline
                && now >= d
            {
                return Err(Error::MutexStuck {
                    path: path.to_path_buf(),
                    waited: now - start,
                    holder: describe_holder(&mf.file),
                });
            }
            patience.between(&mf.file, now, policy, &mut waiting);
            let mut nap = backoff;
            if let Some(d) = deadline {
                nap = nap.min(d.saturating_duration_since(now));
            }
            std::thread::sleep(nap);
            let cap = if now - start < YOUNG_FOR {
                NAP_YOUNG
            } else {
                NAP_OLD
            };
            backoff = (backoff * 2).min(cap);
        }
        // The lock is on the inode we opened; make sure that inode is still the one at its name.
        match paths.handle().stat(paths.mutex_name()) {
            Ok(Some(m)) if m.id() == mf.id() => {
                return Ok(MutexGuard {
                    file: mf,
                    path: path.to_path_buf(),
                    claimed: std::sync::Mutex::new(None),
                });
            }
            Ok(_) => {}
            Err(e) => return Err(Error::io(path, "stat the mutex", e)),
        }
        // Replaced or deleted under us: drop this lock and start over on the new file.
    }
}

/// Opens the mutex file, or creates it exclusively (never `O_CREAT` on an existing name: with
/// `protected_regular` that fails even for root in a sticky directory, and it is no way to open
/// a file that may not be ours). Checked after opening ([`LockDir::check`]).
fn open(paths: &LockPaths, write: bool) -> Result<(File, Meta)> {
    let path = &paths.mutex;
    let dir = paths.handle();
    let name = paths.mutex_name();
    let squatted = |e: &io::Error| -> Option<Error> {
        // Refuse what is not a file, naming it, rather than failing with a bare errno.
        let m = dir.stat(name).ok().flatten()?;
        (!m.is_file() || e.raw_os_error() == Some(crate::error::libc_consts::ELOOP))
            .then(|| dir.check(name, &m, "mutex file").err())
            .flatten()
    };
    let (mut tries, mut gone) = (0, 0);
    let (file, meta) = loop {
        let file =
            loop {
                match dir.open_existing(name, write) {
                    Ok(f) => break f,
                    Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 10 => {}
                    Err(e) => {
                        return Err(squatted(&e)
                            .unwrap_or_else(|| Error::io(path, "open the mutex file", e)));
                    }
                }
                match dir.create_new(name, dir.shared_mode(0o644)) {
                    Ok((f, id)) => {
                        // Ours from the start: the identity line goes in before any other use (a
                        // contender that opens it meanwhile waits for it: see [`identify`]). A
                        // file that could not get it (a full disk) is removed: empty, it would be
                        // refused.
                        if let Err(e) = f.write_all_at(&identity_line(paths), IDENTITY_AT) {
                            dir.unlink_if(name, id);
                            return Err(Error::io(path, "write the mutex file's lock identity", e));
                        }
                        if write {
                            break f;
                        }
                        // Created read-write; reopen read-only as asked (the kept descriptor must
                        // not be open for writing: see [`MutexFile`]) — the very file created, not
                        // whatever its name leads to by now (a directory writer may have removed
                        // it already: the inode re-check after locking then sends us round again).
                        if let Ok(ro) = File::open(format!("/proc/self/fd/{}", f.as_raw_fd())) {
                            break ro;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(squatted(&e)
                            .unwrap_or_else(|| Error::io(path, "create the mutex file", e)));
                    }
                }
                tries += 1;
            };
        let meta = file
            .metadata()
            .map(|m| Meta::of(&m))
            .map_err(|e| Error::io(path, "stat the mutex", e))?;
        // Removed since we opened it (a directory writer deleting it as it appears): no planted
        // link, just gone; open or create it again.
        if meta.nlink == 0 && gone < 200 {
            gone += 1;
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        break (file, meta);
    };
    dir.check(name, &meta, "mutex file")?;
    // Never written or chmodded unless it is this lock's mutex file (a file renamed to its name
    // is someone else's, whoever owns it).
    let meta = match identify_patiently(paths, &file, meta)? {
        (Identity::Ours, meta) => meta,
        (Identity::Legacy, meta) => {
            // An older leasehold's mutex file of this name: from now on it says whose it is
            // (best effort: a read-only file system or descriptor leaves it as it is).
            if let Ok(opened) = write_through(&file, write, path) {
                let f = opened.as_ref().unwrap_or(&file);
                let _ = f.write_all_at(&identity_line(paths), IDENTITY_AT);
            }
            meta
        }
        (Identity::Foreign(what), meta) => {
            return Err(Error::Squatted {
                path: path.clone(),
                why: format!(
                    "{what} (owner {}, {} bytes) has the name of this lock's mutex file; \
                     leasehold writes only the mutex file it created for this lock, and left \
                     this one untouched: remove it (or rename it back) if it is not in use",
                    user_name(meta.uid),
                    meta.size
                ),
            });
        }
    };
    // Ours, in a group-shared directory, but not group-writable (made by an older leasehold, or
    // by hand): give it the group write bit so that every member can use it.
    let shared = dir.shared_mode(0o644);
    if meta.uid == rustix::process::geteuid().as_raw() && meta.mode & shared != shared {
        let _ = rustix::fs::fchmod(
            &file,
            rustix::fs::Mode::from_raw_mode(meta.mode & 0o7777 | shared),
        );
    }
    Ok((file, meta))
}

impl MutexGuard {
    /// LOCK's file as claimed in this section (see [`claim_lock_file`]), for the take.
    pub(crate) fn take_claimed(&self) -> Option<File> {
        self.claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Releases the kernel lock and hands back the open file for the next time. If the unlock
    /// itself fails, the file is closed instead (which releases the lock) and `None` returned.
    pub(crate) fn unlock(self) -> Option<MutexFile> {
        let MutexGuard { file, .. } = self;
        // The announcement goes first: a thread of this process that enters next through the
        // same file must not have its own announcement withdrawn.
        file.withdraw();
        klock::unlock(&file.file, file.at).ok().map(|()| file)
    }

    /// Takes the holder's mark on the mutex file (`klock::hold_mark`), kept through this
    /// descriptor after the section ends (it becomes the holding's witness). Best effort: a
    /// holder without it is judged by its record, as before marks existed.
    pub(crate) fn hold_mark(&self, token: u64) {
        let _ = klock::hold_mark(&self.file.file, token);
        if let Some(d) = &self.file.dir {
            // Again in LOCK's directory, which a directory writer cannot delete with the file.
            let _ = self.file.region.hold_mark(d, token);
        }
    }

    /// Takes a shared or slotted holder's mark (`klock::hold_shared_mark`) on the mutex file
    /// and, locally, in LOCK's directory, kept as [`MutexGuard::hold_mark`]'s is. Best effort,
    /// as that one.
    pub(crate) fn hold_shared_mark(&self) {
        let _ = klock::hold_shared_mark(&self.file.file);
        if let Some(d) = &self.file.dir {
            let _ = self.file.region.hold_shared_mark(d);
        }
    }

    /// How many shared or slotted holders of this lock hold their marks (counted up to
    /// `cap`): the greater of the counts on the mutex file and, locally, in LOCK's directory,
    /// which a directory writer can neither delete nor lower. An error counts as `cap` (the
    /// contender waits: a denial of service, never an overlap).
    pub(crate) fn shared_holders(&self, cap: usize) -> usize {
        let file = klock::shared_marks(&self.file.file, cap).unwrap_or(cap);
        let dir = (self.file.dir.as_ref())
            .map_or(0, |d| self.file.region.shared_marks(d, cap).unwrap_or(cap));
        file.max(dir)
    }

    /// Whether the kernel says that no other description holds a mark of any kind — token or
    /// shared — on this mutex file nor, locally, in LOCK's directory (`klock::any_mark`: one
    /// test per file). An error, or any mark, says `false`: then [`Self::holder_marked`] and
    /// [`Self::shared_holders`] are asked as ever.
    pub(crate) fn no_marks(&self) -> bool {
        matches!(klock::any_mark(&self.file.file), Ok(false))
            && (self.file.dir.as_ref())
                .is_none_or(|d| matches!(self.file.region.any_mark(d), Ok(false)))
    }

    /// Whether another holder's mark of token `from` or above is held on this mutex file
    /// (`klock::mark_held`), or in LOCK's directory; an error says no (the record decides, as
    /// before marks existed).
    pub(crate) fn holder_marked(&self, from: u64) -> bool {
        klock::mark_held(&self.file.file, from).unwrap_or(false)
            || (self.file.dir.as_ref())
                .is_some_and(|d| self.file.region.marked(d, from).unwrap_or(false))
    }

    /// What the mutex file says about fencing tokens (see [`Tokens`]).
    pub(crate) fn tokens(&self) -> Result<Tokens> {
        let mut buf = [0u8; HWM_LEN + LAST_LEN];
        let mut n = 0;
        while n < buf.len() {
            match self.file.file.read_at(&mut buf[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(&self.path, "read the mutex file", e)),
            }
        }
        let ceiling = std::str::from_utf8(&buf[..n.min(HWM_LEN)])
            .ok()
            .and_then(|s| s.strip_prefix(HWM_PREFIX))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let boot = crate::identity::boot_id();
        let last = (n == buf.len())
            .then(|| parse_last(&buf[HWM_LEN..], ceiling, boot))
            .flatten();
        Ok(Tokens { ceiling, last })
    }

    /// Records token `t` (from [`Tokens::floor`] of `seen`, read under this same lock) as handed
    /// out or reserved. Within the ceiling: the second line only, never synced. Above it: a new
    /// ceiling `t + block − 1` and the second line in one write, made durable (when `durable`)
    /// before `t` is used. Through a short-lived write descriptor on the very inode locked when
    /// ours is read-only.
    pub(crate) fn record_token(
        &self,
        t: u64,
        seen: &Tokens,
        block: u64,
        durable: bool,
    ) -> Result<()> {
        let boot = crate::identity::boot_id();
        let (at, text, sync) = if t > seen.ceiling {
            let ceiling = t.saturating_add(block.max(1) - 1);
            let mut text = String::with_capacity(HWM_LEN + LAST_LEN);
            text.push_str(HWM_PREFIX);
            push_020(&mut text, ceiling);
            text.push('\n');
            text.push_str(&last_line(t, ceiling, boot));
            (0, text, durable)
        } else {
            (HWM_LEN as u64, last_line(t, seen.ceiling, boot), false)
        };
        let opened = write_through(&self.file.file, self.file.at.writable, &self.path)?;
        let f = opened.as_ref().unwrap_or(&self.file.file);
        f.write_all_at(text.as_bytes(), at)
            .map_err(|e| Error::io(&self.path, "write the token high-water mark", e))?;
        if sync {
            f.sync_data()
                .map_err(|e| Error::io(&self.path, "fsync the token high-water mark", e))?;
        }
        Ok(())
    }
}

/// `None` when `file` is open for writing (use it), else a short-lived write descriptor on the
/// very same inode (through /proc/self/fd, so no name is looked up again).
fn write_through(file: &File, write: bool, path: &std::path::Path) -> Result<Option<File>> {
    if write {
        return Ok(None);
    }
    OpenOptions::new()
        .write(true)
        .custom_flags(OFlag::O_CLOEXEC.bits())
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map(Some)
        .map_err(|e| Error::io(path, "open the mutex file for writing", e))
}

/// The identity line of the mutex file of `paths`' lock.
fn identity_line(paths: &LockPaths) -> Vec<u8> {
    identity_line_of(paths.mutex_of())
}

fn identity_line_of(lock_name: &std::ffi::OsStr) -> Vec<u8> {
    use std::fmt::Write;
    let mut line = String::from(IDENTITY_PREFIX);
    for b in lock_name.as_encoded_bytes() {
        let _ = write!(line, "{b:02x}");
    }
    line.push('\n');
    line.into_bytes()
}

/// Whose a file at a mutex file's name is.
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    /// This lock's: its identity line names LOCK.
    Ours,
    /// An older leasehold's mutex file (the two token lines and nothing after them): adopted.
    Legacy,
    /// Not this lock's mutex file, in words: another lock's, or not leasehold's at all.
    Foreign(String),
}

/// Reads what the file (of `meta`'s size) says about whose mutex file it is. An empty file is
/// foreign here ([`identify_patiently`] gives its creator time first).
fn identify(file: &File, meta: &Meta, lock_name: &std::ffi::OsStr) -> io::Result<Identity> {
    let not_ours = || Identity::Foreign("a file that is not a leasehold mutex file".into());
    if meta.size == 0 {
        return Ok(Identity::Foreign("an empty file".into()));
    }
    if meta.size < IDENTITY_AT || meta.size > IDENTITY_AT + IDENTITY_MAX {
        return Ok(not_ours());
    }
    let mut buf = vec![0u8; meta.size as usize];
    file.read_exact_at(&mut buf, 0)?;
    let (tokens, ident) = buf.split_at(IDENTITY_AT as usize);
    if ident.is_empty() {
        // The token lines alone: an older leasehold's file, if its first line is one.
        let first = std::str::from_utf8(&tokens[..HWM_LEN]).ok();
        let digits = first
            .and_then(|s| s.strip_prefix(HWM_PREFIX))
            .and_then(|s| s.strip_suffix('\n'));
        return Ok(match digits {
            Some(d) if d.len() == 20 && d.bytes().all(|b| b.is_ascii_digit()) => Identity::Legacy,
            _ => not_ours(),
        });
    }
    if ident == identity_line_of(lock_name).as_slice() {
        return Ok(Identity::Ours);
    }
    let named = ident
        .strip_prefix(IDENTITY_PREFIX.as_bytes())
        .and_then(|h| h.strip_suffix(b"\n"))
        .and_then(unhex);
    Ok(match named {
        Some(other) => Identity::Foreign(format!(
            "the mutex file of another lock ({})",
            crate::text::escape_os(std::ffi::OsStr::from_bytes(&other))
        )),
        None => not_ours(),
    })
}

/// Lowercase hex back to bytes; `None` if it is not that.
fn unhex(h: &[u8]) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    h.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
        .collect()
}

/// As [`identify`], waiting up to [`EMPTY_PATIENCE`] while the file is empty (its creator
/// writes the identity line right after creating it exclusively). Returns the file's last stat.
///
/// Each look after the first opens the name again: on NFS an open descriptor's size and bytes
/// come from the client's caches, which may keep showing the empty file another host has
/// written since (seen in the NFS lab: two hosts' first runs at once, one refused with 65); an
/// open revalidates them (close-to-open). While the name leads elsewhere (deleted, replaced),
/// the descriptor we hold is watched instead.
fn identify_patiently(paths: &LockPaths, file: &File, meta: Meta) -> Result<(Identity, Meta)> {
    let path = &paths.mutex;
    let start = Instant::now();
    let mut meta = meta;
    let mut fresh: Option<File> = None;
    loop {
        let id = identify(fresh.as_ref().unwrap_or(file), &meta, paths.mutex_of())
            .map_err(|e| Error::io(path, "read the mutex file", e))?;
        if meta.size != 0 || start.elapsed() >= EMPTY_PATIENCE {
            return Ok((id, meta));
        }
        std::thread::sleep(Duration::from_millis(2));
        // The same inode opened again by name; if the name is gone or leads elsewhere now, the
        // descriptor we hold is watched as before (its creator may still write its identity
        // line; the caller's checks after locking — link count, inode — see the change).
        let again = paths
            .handle()
            .open_existing(paths.mutex_name(), false)
            .ok()
            .and_then(|f| Some((Meta::of(&f.metadata().ok()?), f)))
            .filter(|(m, _)| m.id() == meta.id());
        match again {
            Some((now, f)) => {
                meta = now;
                fresh = Some(f);
            }
            None => {
                meta = file
                    .metadata()
                    .map(|m| Meta::of(&m))
                    .map_err(|e| Error::io(path, "stat the mutex", e))?;
                fresh = None;
            }
        }
    }
}

/// Device and inode of `paths`' mutex file if it is this lock's (a regular file with one link
/// whose identity line names LOCK: see [`Identity`]), else `None`. A file renamed to the name
/// from another lock, or a legacy file not yet marked, is not evidence for this lock.
pub(crate) fn bound_id(paths: &LockPaths) -> Option<(u64, u64)> {
    let f = paths
        .handle()
        .open_existing(paths.mutex_name(), false)
        .ok()?;
    bound_file_id(&f, paths.mutex_of())
}

/// As [`bound_id`], for a mutex file already open, of the lock named `lock_name`.
pub(crate) fn bound_file_id(f: &File, lock_name: &std::ffi::OsStr) -> Option<(u64, u64)> {
    let meta = Meta::of(&f.metadata().ok()?);
    if !meta.is_file() || meta.nlink != 1 {
        return None;
    }
    (identify(f, &meta, lock_name).ok()? == Identity::Ours).then_some(meta.id())
}

/// The fencing-token state of a mutex file (PROTOCOL.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    /// The first line: the durable ceiling — no token above it was ever handed out.
    pub(crate) ceiling: u64,
    /// The second line: the last token handed out or reserved, when it vouches for it — it
    /// names the current ceiling and this boot (so no power loss, and no writer that knows
    /// only the first line, came between).
    pub(crate) last: Option<u64>,
}

impl Tokens {
    /// What the next token must exceed (besides the token in LOCK): the last one handed out
    /// when the second line vouches for it, else the ceiling (skipping what a crash may have
    /// handed out unrecorded).
    pub(crate) fn floor(&self) -> u64 {
        self.last.unwrap_or(self.ceiling)
    }
}

/// The second line of the mutex file: `last N of C boot ID` (fixed width).
fn last_line(last: u64, ceiling: u64, boot: &str) -> String {
    // A boot id that does not fit is recorded empty: such a line never vouches.
    let boot = if boot.len() <= BOOT_ROOM { boot } else { "" };
    // Pushed rather than formatted: it is written at every take.
    let mut s = String::with_capacity(LAST_LEN);
    s.push_str(LAST_PREFIX);
    push_020(&mut s, last);
    s.push_str(" of ");
    push_020(&mut s, ceiling);
    s.push_str(" boot ");
    s.push_str(boot);
    s.extend(std::iter::repeat_n(
        ' ',
        BOOT_ROOM.saturating_sub(boot.chars().count()),
    ));
    s.push('\n');
    s
}

/// Appends `v` as `format!("{v:020}")` would.
fn push_020(s: &mut String, v: u64) {
    let mut d = [b'0'; 20];
    let mut v = v;
    for c in d.iter_mut().rev() {
        *c = b'0' + (v % 10) as u8;
        v /= 10;
    }
    // ASCII digits: always UTF-8.
    if let Ok(t) = std::str::from_utf8(&d) {
        s.push_str(t);
    }
}

/// The last token a second line vouches for: well formed, naming `ceiling` and the non-empty
/// `boot`, and not above the ceiling.
fn parse_last(line: &[u8], ceiling: u64, boot: &str) -> Option<u64> {
    let s = std::str::from_utf8(line).ok()?.strip_suffix('\n')?;
    let rest = s.strip_prefix(LAST_PREFIX)?;
    let (last, rest) = rest.split_once(" of ")?;
    let (of, id) = rest.split_once(" boot ")?;
    let (last, of): (u64, u64) = (last.parse().ok()?, of.parse().ok()?);
    let id = id.trim_end();
    (of == ceiling && !boot.is_empty() && id == boot && last <= ceiling).then_some(last)
}

/// Whether a holder's mark (`klock::hold_mark`, or a shared holder's) is held on the mutex file
/// of `paths`, if that file exists, or in LOCK's directory: a look that creates nothing.
pub(crate) fn marked_if_present(paths: &LockPaths) -> bool {
    let dir = paths.handle();
    let region = paths.dir_region();
    dir.open_existing(paths.mutex_name(), false).is_ok_and(|f| {
        klock::mark_held(&f, 0).unwrap_or(false) || klock::shared_marks(&f, 1).is_ok_and(|n| n > 0)
    }) || dir.reopen().is_ok_and(|d| {
        region.marked(&d, 0).unwrap_or(false) || region.shared_marks(&d, 1).is_ok_and(|n| n > 0)
    })
}

/// Whether some process waits, blocked, for a kernel lock on `file`'s inode (a `->` line in
/// /proc/locks): e.g. util-linux flock(1) waiting for a holder's flock on LOCK's own file. A
/// read of /proc/locks can skip a lock (`procfs::proc_locks_read`), and a blocked request is
/// listed with the lock it waits for: when `file` itself holds the exclusive flock (its fdinfo
/// says so), a read that shows that flock shows its waiters too, so the file is read again (a
/// few times) until it does; if it never does, yes — someone may wait (the caller then lets go
/// and waits a moment for a taker, which is safe). /proc/locks unreadable: no.
pub(crate) fn someone_blocked(file: &File) -> bool {
    if klock::open_only_here(file) {
        return false;
    }
    let ours = crate::os::linux::procfs::holds_exclusive_flock(file).unwrap_or(false);
    blocked_reading(file, ours)
}

/// [`someone_blocked`] behind the exclusive flock `file` itself holds: `None` when it holds
/// none (nobody can be blocked behind us), one look at its fdinfo and /proc/locks otherwise.
pub(crate) fn blocked_behind_ours(file: &File) -> Option<bool> {
    if klock::open_only_here(file) {
        return Some(false);
    }
    crate::os::linux::procfs::holds_exclusive_flock(file)
        .filter(|&held| held)
        .map(|_| blocked_reading(file, true))
}

fn blocked_reading(file: &File, ours: bool) -> bool {
    for _ in 0..4 {
        let Some(locks) = crate::os::linux::procfs::proc_locks_read(file) else {
            return false;
        };
        // Only one exclusive flock can be held on an inode: ours, when we hold it.
        if !ours
            || locks
                .iter()
                .any(|l| l.kind == "flock" && l.exclusive && !l.blocked)
        {
            return locks.iter().any(|l| l.blocked);
        }
    }
    true
}

/// For each of `files` (descriptors that normally hold the exclusive flock on their file: a
/// holder's): `Some(false)` — nobody is blocked behind it — when nobody else has it open, or
/// nobody else has it open for writing and one read of /proc/locks shows an exclusive flock on
/// the file and no request blocked for it (a blocked request is listed with the lock it waits
/// for, so the read that shows the lock shows them); `None` otherwise (someone may be blocked,
/// or may lock it without blocking: it has the file open for writing, an NFS client's polling
/// flock(1) as its server sees it;
/// or the read does not show a flock: we hold none, or it skipped it), for the caller to ask [`someone_blocked`] or [`blocked_behind_ours`]. One read for all:
/// a release looks at its own file and the one its lease replaced.
pub(crate) fn nobody_blocked_at_a_glance(files: &[&File]) -> Vec<Option<bool>> {
    // A file nobody else has open has nobody blocked on it (`klock::open_only_here`, a few
    // microseconds): /proc/locks is read only for the others, and not at all when there are
    // none (its first read in a while waits for an RCU grace period: milliseconds).
    let mut out: Vec<Option<bool>> = (files.iter())
        .map(|f| klock::open_only_here(f).then_some(false))
        .collect();
    // Others' files: one that another description has open for writing may be locked by a
    // program that is not blocked (an NFS client's polling flock(1), as its server sees it:
    // `klock::open_for_writing_elsewhere`), so it stays `None` whatever /proc/locks says.
    let rest: Vec<usize> = (0..files.len())
        .filter(|&i| out[i].is_none() && klock::open_for_writing_elsewhere(files[i]) != Some(true))
        .collect();
    if rest.is_empty() {
        return out;
    }
    let of: Vec<&File> = rest.iter().map(|&i| files[i]).collect();
    let looked = crate::os::linux::procfs::proc_locks_of(&of).map(|all| {
        all.iter()
            .map(|locks| {
                let held = locks
                    .iter()
                    .any(|l| l.kind == "flock" && l.exclusive && !l.blocked);
                (held && !locks.iter().any(|l| l.blocked)).then_some(false)
            })
            .collect::<Vec<_>>()
    });
    // Unread (no /proc/locks): those stay `None`.
    for (&i, l) in rest.iter().zip(looked.unwrap_or_default()) {
        out[i] = l;
    }
    out
}

/// Whether another open file description holds an exclusive lock on `file`'s inode now — a
/// flock (util-linux flock(1) that took it) or a byte-range write lock —, tested atomically
/// (`klock::flock_held_exclusively`, `klock::range_write_locked`), not by a read of
/// /proc/locks, which can skip a lock. `file` must hold no flock itself. An error says yes.
pub(crate) fn exclusively_locked(file: &File) -> bool {
    klock::flock_held_exclusively(file).unwrap_or(true)
        || klock::range_write_locked(file).unwrap_or(true)
}

/// A pid seen holding the kernel lock on `file`'s inode in /proc/locks. OFD locks name no
/// process; a holder on this host also holds the flock, which names it. Never a pid below 1:
/// it would name no process, or all of them.
pub(crate) fn holder_pid(file: &File) -> Option<i32> {
    proc_locks(file)
        .into_iter()
        .filter(|l| !l.blocked)
        .map(|l| l.pid)
        .find(|&p| p > 0)
}

/// Who holds an exclusive (`WRITE`) kernel lock of any kind on `file`'s inode, in words —
/// `pid 812 (user bob, state S, flock lock)` — if anyone does (this host's locks only). Shared
/// locks are not counted. A leasehold holder holds one on the file its lease is in for the
/// whole holding (`klock::hold_lock_file`), and lets go of it before its record says released;
/// so a contender asking when LOCK's record would let it in (released, emptied, or a holder
/// gone) counts every such lock as another program's — conservatively, a leasehold holder
/// whose record was emptied under it too: it is still running (PROTOCOL.md §10).
/// A flock whose pid `own` says is a leasehold holder of this lock (checked on the kernel's
/// evidence by the caller) is not counted.
///
/// Whether one is held is tested atomically ([`exclusively_locked`]); /proc/locks only names
/// it. A lock /proc/locks does not show (a skipped line, another pid namespace) is still
/// counted, as held by someone this host cannot name. `file` must hold no flock itself.
pub(crate) fn exclusive_locker(file: &File, own: impl Fn(i32) -> bool) -> Option<String> {
    let flock = klock::flock_held_exclusively(file).unwrap_or(true);
    let range = klock::range_write_locked(file).unwrap_or(true);
    if !flock && !range {
        return None;
    }
    // Two reads: a lock one of them skipped is seen in the other.
    let seen: Vec<_> = (0..2)
        .flat_map(|_| proc_locks(file))
        .filter(|l| l.exclusive && !l.blocked)
        .collect();
    let by_flock = |l: &&crate::os::linux::procfs::ProcLock| l.kind == "flock";
    // Only one exclusive flock can be held on an inode at a time: if it is `own`'s, the flock
    // is no other program's.
    let flock_foreign = flock
        && !seen
            .iter()
            .filter(by_flock)
            .any(|l| l.pid > 0 && own(l.pid));
    if !flock_foreign && !range {
        return None;
    }
    let l = seen
        .iter()
        .find(|l| if by_flock(l) { flock_foreign } else { range });
    let Some(l) = l else {
        let kind = if flock_foreign { "flock" } else { "byte-range" };
        return Some(format!(
            "a process this host cannot name ({kind} lock; /proc/locks does not show it)"
        ));
    };
    let kind = &l.kind;
    let proc = (l.pid > 0)
        .then(|| process::stat(l.pid).ok().flatten())
        .flatten();
    Some(match proc {
        // A zombie holds nothing: someone it passed the descriptor to keeps the lock.
        Some(s) if s.is_dead() && by_flock(&l) => kept_after(file, s.pid),
        Some(s) => format!(
            "pid {} (user {}, state {}, {kind} lock)",
            s.pid,
            user_name(s.uid),
            s.state
        ),
        None if l.pid > 0 && by_flock(&l) => kept_after(file, l.pid),
        None if l.pid > 0 => format!("pid {} ({kind} lock)", l.pid),
        // OFD locks name no process.
        None => format!("an open file description ({kind} lock; no pid to name)"),
    })
}

/// How [`kept_after`] names a dead run's guardian (and how a verdict tells it from another
/// program).
pub(crate) const GUARDIAN_WORDS: &str = "the guardian";

/// Who keeps the exclusive flock on `file` that pid `locker`, now gone, took: the process it
/// passed its descriptor to — `leasehold run`'s guardian, when its wrapper was killed, until it
/// has stopped what the command left running — or a child that inherited it.
fn kept_after(file: &File, locker: i32) -> String {
    let keeper = crate::os::linux::procfs::exclusive_flock_keepers(file)
        .into_iter()
        .find_map(|p| process::stat(p).ok().flatten());
    let Some(s) = keeper else {
        return format!("pid {locker} (gone; flock lock, kept by a process this host cannot name)");
    };
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", s.pid)).unwrap_or_default();
    if comm.trim() == "lh-guardian" {
        format!(
            "{GUARDIAN_WORDS} (pid {}) of leasehold run pid {locker}, which is gone: it keeps \
             the lock until it has stopped what that run's command left running",
            s.pid
        )
    } else {
        format!(
            "pid {} (user {}, state {}; flock lock taken by pid {locker}, which is gone)",
            s.pid,
            user_name(s.uid),
            s.state
        )
    }
}

/// [`exclusive_locker`] for a contender inside `section` that may take over LOCK's file `file`
/// (local file systems): when no other program holds it, the contender claims it
/// (`klock::claim_lock_file`) in the same step, and the section keeps the claim for the take —
/// a test and a hold in one, so that a flock(1) cannot slip in before the rename. When the only
/// flock on it is `own`'s (a frozen holder's, see [`exclusive_locker`]), nothing is claimed and
/// nothing is foreign.
pub(crate) fn claim_lock_file(
    section: &MutexGuard,
    file: File,
    own: impl Fn(i32) -> bool,
) -> Option<String> {
    match claim_with(section, file, |f| {
        klock::claim_lock_file(f).unwrap_or(false)
    }) {
        Ok(()) => None,
        Err(file) => exclusive_locker(&file, own),
    }
}

/// A contender's claim on LOCK's file `rw` (open read-write) on a network file system, inside
/// `section`, where the take writes its lease in place (PROTOCOL.md §9, "In place"): the
/// holding's byte-range lock (`klock::hold_in_place`), tried without waiting, kept by the
/// section for the take. `true` when it is claimed (now, or already by this section);
/// `false`, claiming nothing, when another program or holder holds a lock there.
pub(crate) fn claim_in_place(section: &MutexGuard, rw: File) -> bool {
    claim_with(section, rw, |f| klock::hold_in_place(f).unwrap_or(false)).is_ok()
}

/// The one home of the section's claim: `file` claimed by `take` (its lock tried without
/// waiting) and kept by the section for the take — or already claimed by this section (looked
/// at again in the same section: a claim of ours on this very file is no other program's
/// lock, and trying again on another description would meet it). `Err(file)`, claiming
/// nothing, when the try fails.
fn claim_with(section: &MutexGuard, file: File, take: impl Fn(&File) -> bool) -> Result<(), File> {
    use std::os::unix::fs::MetadataExt;
    let id = |f: &File| f.metadata().ok().map(|m| (m.dev(), m.ino()));
    let mut claimed = section
        .claimed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if claimed
        .as_ref()
        .is_some_and(|c| id(c).is_some() && id(c) == id(&file))
    {
        return Ok(());
    }
    *claimed = None;
    if take(&file) {
        *claimed = Some(file);
        return Ok(());
    }
    Err(file)
}

/// Who holds the kernel lock on `file`'s inode, in words: `pid 812 (user bob, state S)`.
pub(crate) fn describe_holder(file: &File) -> String {
    match holder_pid(file).and_then(|p| process::stat(p).ok().flatten()) {
        Some(s) => format!(
            "pid {} (user {}, state {})",
            s.pid,
            user_name(s.uid),
            s.state
        ),
        None => "a process this host cannot see (another host, or another pid namespace)".into(),
    }
}

/// A process has held the mutex for longer than a TTL. If the kernel names it as the holder,
/// it runs under our uid and it is stopped (SIGSTOP, a frozen cgroup shows as `T` too), it is
/// judged like a hung lease holder and SIGKILLed (verified by start time). Anything else — a
/// process blocked in I/O, another host's process — is waited for, within the caller's deadline.
fn judge_stuck(file: &File, policy: StuckPolicy) {
    if policy != StuckPolicy::KillStopped {
        return;
    }
    let Some(pid) = holder_pid(file) else {
        return;
    };
    let Ok(Some(s)) = process::stat(pid) else {
        return;
    };
    let ours = nix::unistd::geteuid().as_raw();
    if matches!(s.state, 'T' | 't') && s.uid == ours && pid != std::process::id() as i32 {
        // The kernel's word (/proc/locks) that it holds our mutex is the evidence here.
        let _ = process::kill_checked(pid, s.start, Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_pushed_last_line_is_the_formatted_one() {
        for (last, ceiling) in [(0, 0), (7, 63), (u64::MAX, u64::MAX), (1, 10_000_000_000)] {
            for boot in [
                "",
                "b",
                "0123456789abcdef0123456789abcdef0123",
                "\u{e9}t\u{e9}",
                &"x".repeat(37),
            ] {
                let b = if boot.len() <= BOOT_ROOM { boot } else { "" };
                let want =
                    format!("{LAST_PREFIX}{last:020} of {ceiling:020} boot {b:<BOOT_ROOM$}\n");
                assert_eq!(last_line(last, ceiling, boot), want);
            }
            let mut s = String::new();
            push_020(&mut s, ceiling);
            assert_eq!(s, format!("{ceiling:020}"));
        }
    }

    /// Other locks on this host coming and going all the time (a busy host): threads that
    /// flock and let go of their own files until `stop`, enough of them that /proc/locks spans
    /// several pages.
    fn churn(dir: &std::path::Path, stop: &std::sync::atomic::AtomicBool) {
        use std::sync::atomic::Ordering;
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    let files: Vec<File> = (0..40)
                        .map(|i| File::create(dir.join(format!("churn-{t}-{i}"))).unwrap())
                        .collect();
                    while !stop.load(Ordering::Relaxed) {
                        for f in &files {
                            klock::flock_held_exclusively(f).unwrap();
                        }
                    }
                });
            }
        });
    }

    /// A flock held by another description on LOCK's file is found by every look while other
    /// locks on the host come and go — and so is a program blocked behind the holder's flock.
    /// (When these looks read /proc/locks alone, a lock skipped between two of its pages let a
    /// waiter take over beside util-linux flock(1), about once in four test runs under load.)
    #[test]
    fn a_held_flock_and_its_waiter_are_never_missed_while_other_locks_churn() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let d = tempfile::tempdir().unwrap();
        let lock = d.path().join("job.lock");
        std::fs::write(&lock, "").unwrap();
        let held = File::open(&lock).unwrap();
        assert!(klock::hold_lock_file(&held).unwrap());
        let mut flock1 = std::process::Command::new("flock")
            .arg(&lock)
            .arg("true")
            .spawn()
            .unwrap();
        let look = File::open(&lock).unwrap();
        while !someone_blocked(&held) {
            std::thread::yield_now();
        }
        let stop = AtomicBool::new(false);
        let mut missed = (0, 0);
        std::thread::scope(|s| {
            s.spawn(|| churn(d.path(), &stop));
            for _ in 0..300 {
                missed.0 += usize::from(exclusive_locker(&look, |_| false).is_none());
                missed.1 += usize::from(!someone_blocked(&held));
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(missed, (0, 0), "(held flock, blocked waiter) missed");
        // The holder's own flock is not counted when `own` names it, and nothing is once the
        // holder lets go and the waiter has run.
        assert!(exclusive_locker(&look, |p| p == std::process::id() as i32).is_none());
        klock::let_go_lock_file(&held).unwrap();
        assert!(flock1.wait().unwrap().success());
        assert!(exclusive_locker(&look, |_| false).is_none());
        assert!(!someone_blocked(&held));
    }

    /// A contender's claim on LOCK's file: held while its section lasts (another description's
    /// flock is refused), looked at again in the same section without meeting itself, and let
    /// go of with the section when no take used it.
    #[test]
    fn a_claim_is_kept_by_the_section_and_a_second_look_does_not_meet_it() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(d.path()).unwrap();
        let paths = LockPaths::new(dir.join("a.lock")).unwrap();
        std::fs::write(&paths.lock, "").unwrap();
        let other = File::open(&paths.lock).unwrap();
        let section = lock(
            &paths,
            None,
            Duration::from_secs(1),
            StuckPolicy::Report,
            false,
        )
        .unwrap();
        let look = || File::open(&paths.lock).unwrap();
        assert_eq!(claim_lock_file(&section, look(), |_| false), None);
        assert!(klock::flock_held_exclusively(&other).unwrap(), "claimed");
        assert_eq!(
            claim_lock_file(&section, look(), |_| false),
            None,
            "again, same section"
        );
        drop(section);
        // Closed with the section. Another test of this binary forking at that moment holds a
        // duplicate of the claimed descriptor until its child execs (CI saw the lock still
        // held right after the drop), so the lock must be gone soon, not at this instant; a
        // section that kept the claim keeps it for the whole test.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while klock::flock_held_exclusively(&other).unwrap() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !klock::flock_held_exclusively(&other).unwrap(),
            "let go with the section"
        );
    }

    /// The atomic tests of LOCK's file: an exclusive flock or a byte-range write lock held by
    /// another description counts; a shared flock, a read lock (a waiter's hint, a holder's
    /// byte) and our own description's flock do not.
    #[test]
    fn only_another_descriptions_exclusive_lock_counts_as_held() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        let a = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let b = File::open(&path).unwrap();
        assert!(!exclusively_locked(&b));
        assert!(klock::hint_waiting(&a).unwrap());
        assert!(!exclusively_locked(&b), "a read lock does not count");
        // SAFETY: flock(2) on a descriptor we own.
        assert_eq!(
            unsafe { nix::libc::flock(a.as_raw_fd(), nix::libc::LOCK_SH) },
            0
        );
        assert!(!exclusively_locked(&b), "a shared flock does not count");
        assert_eq!(
            unsafe { nix::libc::flock(a.as_raw_fd(), nix::libc::LOCK_EX) },
            0
        );
        assert!(exclusively_locked(&b), "an exclusive flock counts");
        assert!(crate::os::linux::procfs::holds_exclusive_flock(&a).unwrap());
        assert!(!crate::os::linux::procfs::holds_exclusive_flock(&b).unwrap());
        assert_eq!(
            unsafe { nix::libc::flock(a.as_raw_fd(), nix::libc::LOCK_UN) },
            0
        );
        assert!(!exclusively_locked(&b));
        let mut fl: nix::libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = nix::libc::F_WRLCK as nix::libc::c_short;
        fl.l_whence = nix::libc::SEEK_SET as nix::libc::c_short;
        fl.l_start = 5;
        fl.l_len = 1;
        nix::fcntl::fcntl(&a, nix::fcntl::FcntlArg::F_OFD_SETLK(&fl)).unwrap();
        assert!(exclusively_locked(&b), "a write lock anywhere counts");
    }

    /// A new mutex file names its lock; an older leasehold's file (two token lines) is adopted
    /// and then names it too; another lock's mutex file and any other file are refused with 65,
    /// their bytes and mode unchanged.
    #[test]
    fn only_this_locks_mutex_file_or_an_older_one_is_used() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(d.path()).unwrap();
        let a = LockPaths::new(dir.join("a.lock")).unwrap();
        let (f, _) = open(&a, true).unwrap();
        assert!(bound_file_id(&f, OsStr::new("a.lock")).is_some());
        assert!(bound_file_id(&f, OsStr::new("b.lock")).is_none());

        let b = LockPaths::new(dir.join("b.lock")).unwrap();
        let legacy = format!("{HWM_PREFIX}{:020}\n{}", 7, last_line(7, 7, "boot"));
        std::fs::write(&b.mutex, &legacy).unwrap();
        let (f, _) = open(&b, false).unwrap();
        assert!(bound_file_id(&f, OsStr::new("b.lock")).is_some(), "adopted");

        let c = LockPaths::new(dir.join("c.lock")).unwrap();
        std::fs::rename(&a.mutex, &c.mutex).unwrap();
        let before = std::fs::read(&c.mutex).unwrap();
        let e = open(&c, true).unwrap_err();
        assert!(
            matches!(e, Error::Squatted { .. }) && e.to_string().contains("a.lock"),
            "{e}"
        );
        assert_eq!(std::fs::read(&c.mutex).unwrap(), before);

        let d2 = LockPaths::new(dir.join("d.lock")).unwrap();
        std::fs::write(&d2.mutex, "somebody's notes\n".repeat(20)).unwrap();
        let e = open(&d2, true).unwrap_err();
        assert!(matches!(e, Error::Squatted { .. }), "{e}");
        assert_eq!(
            std::fs::read(&d2.mutex).unwrap(),
            "somebody's notes\n".repeat(20).as_bytes()
        );
    }
}
