//! Durability per mount epoch: the record that lets lease records go unsynced on a local disk
//! (PROTOCOL.md §8, *Durable per mount epoch*).
//!
//! Owns: the epoch file `.NAME.leasehold-epoch` beside LOCK — which attachment of which device
//! LOCK's file system was on (device number and the kernel's `diskseq`), in which boot, and the
//! longest TTL granted there — reading it, trusting it, and rewriting it (synced, under the
//! mutex) when it no longer vouches for an acquisition; and the grace a contender keeps when it
//! names another attachment of the disk in this boot (the disk dropped off and came back).
//! Must never: let a lease go unsynced on a record that another user could have written, that
//! names another lock, device, attachment or boot, or a shorter TTL than the lease's; let a
//! record skip a wait (a record only ever adds one); write it except by renaming a complete,
//! synced record over it through LOCK's directory descriptor.

use std::ffi::OsString;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::fsinfo::Storage;
use crate::paths::{LockPaths, helper_name};

/// The epoch file's suffix (see [`crate::paths::helper_name`]).
const SUFFIX: &str = ".leasehold-epoch";

/// The most a record can be: a few short lines and LOCK's path.
const MAX_BYTES: u64 = 8192;

/// The first line of every record (format version 1).
const MAGIC: &str = "leasehold-epoch 1";

/// Whether epochs apply to storage like this: a local file system that keeps data across a
/// detach (not tmpfs, where nothing comes back; not NFS, where a sync is what makes a write
/// visible to other clients, so leases stay synced there).
pub(crate) fn applies(storage: Storage) -> bool {
    !storage.network && !storage.memory_backed
}

/// The epoch file's name for LOCK (a holder file of a shared lock uses LOCK's).
pub(crate) fn name(paths: &LockPaths) -> OsString {
    helper_name(paths.mutex_of(), SUFFIX)
}

/// LOCK's absolute path as records name it (LOCK's own for a holder file of a shared lock).
fn lock_of(paths: &LockPaths) -> String {
    paths
        .handle()
        .join(paths.mutex_of())
        .to_string_lossy()
        .into_owned()
}

/// One epoch record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    /// LOCK, absolute: a record renamed here from another lock is not this lock's.
    lock: String,
    /// The boot it was written in (`/proc/sys/kernel/random/boot_id`).
    boot: String,
    /// The device number LOCK's file system had then.
    dev: u64,
    /// The block device's `diskseq` (a number the kernel never gives twice in a boot, new at
    /// every attachment of a disk); 0 where there is none.
    seq: u64,
    /// The longest TTL any lease was granted with under this record, in milliseconds.
    ttl_ms: u64,
    /// CLOCK_BOOTTIME (ns) before which nothing may be granted: set by the contender that
    /// found the record naming another attachment, to when the longest TTL has passed since.
    settle_until_ns: u64,
}

impl Record {
    fn to_text(&self) -> String {
        format!(
            "{MAGIC}\nlock {}\nboot {}\ndevice {} {}\nttl_ms {}\nsettle_until_ns {}\n",
            self.lock, self.boot, self.dev, self.seq, self.ttl_ms, self.settle_until_ns
        )
    }

    /// Parses a record; `None` for anything else (never trusted, never a reason to wait).
    fn parse(bytes: &[u8]) -> Option<Record> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.split('\n');
        if lines.next()? != MAGIC {
            return None;
        }
        let mut field = |key: &str| -> Option<String> {
            lines
                .next()?
                .strip_prefix(key)?
                .strip_prefix(' ')
                .map(str::to_string)
        };
        let lock = field("lock")?;
        let boot = field("boot")?;
        let device = field("device")?;
        let (dev, seq) = device.split_once(' ')?;
        let ttl_ms = field("ttl_ms")?.parse().ok()?;
        let settle_until_ns = field("settle_until_ns")?.parse().ok()?;
        let boot_ok = !boot.is_empty() && boot.len() <= 64 && !boot.contains(char::is_whitespace);
        boot_ok.then_some(Record {
            lock,
            boot,
            dev: dev.parse().ok()?,
            seq: seq.parse().ok()?,
            ttl_ms,
            settle_until_ns,
        })
    }

    /// Whether this record was written on the attachment `here` (in its boot).
    fn names(&self, here: &Here) -> bool {
        self.boot == here.boot && self.dev == here.dev && self.seq == here.seq
    }
}

/// The attachment of the file system LOCK is on, now.
#[derive(Debug)]
struct Here {
    boot: &'static str,
    dev: u64,
    seq: u64,
}

/// This boot's id, read once (a process never crosses a boot); `None` if unreadable, and then
/// no epoch vouches for anything (every lease is synced, as without epochs).
fn boot_id() -> Option<&'static str> {
    static BOOT: OnceLock<String> = OnceLock::new();
    let b = BOOT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    });
    (!b.is_empty()).then_some(b.as_str())
}

/// The `diskseq` of the block device `dev` (of its disk, for a partition), 0 if there is none
/// (not a block device, a kernel before 5.15, no sysfs).
fn diskseq(dev: u64) -> u64 {
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    if major == 0 {
        return 0;
    }
    let base = format!("/sys/dev/block/{major}:{minor}");
    ["diskseq", "../diskseq"]
        .iter()
        .find_map(|f| std::fs::read_to_string(format!("{base}/{f}")).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn here(paths: &LockPaths) -> Option<Here> {
    let dir = paths.handle();
    Some(Here {
        boot: boot_id()?,
        dev: dir.meta.dev,
        seq: dir.diskseq(diskseq),
    })
}

/// CLOCK_BOOTTIME now, in nanoseconds (suspend included, like every other leasehold clock).
fn now_ns() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_BOOTTIME)
        .or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC))
        .map(|t| (t.tv_sec().max(0) as u64) * 1_000_000_000 + t.tv_nsec().max(0) as u64)
        .unwrap_or(0)
}

/// The record at the epoch name, and whether it can only have been written by us or root: a
/// regular file with one link, owned by our uid or root, writable by nobody else. Anything
/// that is not a record reads as none.
fn read(paths: &LockPaths) -> (Option<Record>, Option<(u64, u64)>) {
    // The same file as at our last read (its inode, size, times, and what it is trusted by:
    // owner, mode, links; leasehold only ever renames a new record over it, and any write or
    // chmod moves its change time) reads the same: one stat instead of an open and reads
    // (`settling` and `vouches` both read it in one acquisition).
    let key = match paths.handle().stat(&name(paths)) {
        Ok(Some(m)) => Key {
            id: m.id(),
            size: m.size,
            times: (m.ctime, m.mtime),
            trust: (m.uid, m.mode, m.nlink),
        },
        _ => return read_now(paths),
    };
    let lock = lock_of(paths);
    let mut memo = READ.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((l, k, rec, trusted)) = memo.as_ref()
        && *l == lock
        && *k == key
    {
        return (rec.clone(), *trusted);
    }
    let (rec, trusted) = read_now(paths);
    if rec.is_some() && trusted.is_some_and(|id| id == key.id) {
        *memo = Some((lock, key, rec.clone(), trusted));
    }
    (rec, trusted)
}

/// What a `stat` of the epoch file says of it, as far as a [`read`] depends on it.
#[derive(PartialEq, Eq)]
struct Key {
    id: (u64, u64),
    size: u64,
    times: ((i64, i64), (i64, i64)),
    trust: (u32, u32, u64),
}

/// LOCK's path, the epoch file as at the last [`read`] of a trusted record, and what was read.
type Memo = (String, Key, Option<Record>, Option<(u64, u64)>);
static READ: Mutex<Option<Memo>> = Mutex::new(None);

/// [`read`], from the file.
fn read_now(paths: &LockPaths) -> (Option<Record>, Option<(u64, u64)>) {
    let trusted = std::cell::Cell::new(None);
    let euid = rustix::process::geteuid().as_raw();
    let bytes = crate::fsio::read_small(paths, &name(paths), MAX_BYTES, |m| {
        let ok = (m.uid == euid || m.uid == 0) && m.mode & 0o022 == 0 && m.nlink == 1;
        trusted.set(ok.then(|| m.id()));
        m.is_file()
    });
    match bytes {
        Ok(Some(b)) => (Record::parse(&b), trusted.get()),
        _ => (None, None),
    }
}

/// Whether the epoch file is still the record `id` (device, inode) a lease went unsynced on:
/// a holder looks at each renewal, and syncs its lease when it is not (the record removed by
/// a cleanup, replaced by a directory writer or raised by another shared holder).
pub(crate) fn still(paths: &LockPaths, id: (u64, u64)) -> bool {
    matches!(paths.handle().stat(&name(paths)), Ok(Some(m)) if m.id() == id)
}

/// Writes `rec` at the epoch name: a temp file created exclusively, synced, renamed over it,
/// the directory synced (`fsio::replace`). Under the mutex.
fn write(paths: &LockPaths, rec: &Record) -> crate::error::Result<()> {
    let target = paths.handle().join(&name(paths));
    crate::fsio::replace(paths, &target, rec.to_text().as_bytes(), true)
}

/// Graces this process keeps itself, for records it found naming another attachment and could
/// not rewrite (another user's, in a sticky directory): the record's bytes, LOCK, and when the
/// grace ends. Every process that cannot rewrite such a record keeps its own grace.
static REMEMBERED: Mutex<Vec<(String, Record, u64)>> = Mutex::new(Vec::new());

fn remembered(lock: &str, rec: &Record, until: u64) -> u64 {
    let mut m = REMEMBERED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, _, u)) = m.iter().find(|(l, r, _)| l == lock && r == rec) {
        return *u;
    }
    m.push((lock.to_string(), rec.clone(), until));
    until
}

/// Inside the section, before anything is granted: how long nothing may be granted yet, and
/// the longest TTL that wait is for, because LOCK's file system is another attachment of the
/// disk than the one its epoch record names, in this boot — a disk that dropped off and came
/// back, where a lease that was never synced may be missing while its holder runs on (until
/// its renewals fail and it fences, within its TTL). The grace is the longest TTL ever granted
/// there, counted from the first time a contender saw the mismatch: that contender rewrites the
/// record for this attachment with the end of the grace in it (synced), so every later
/// contender keeps the same grace; one that cannot rewrite it counts from its own first look.
/// Any record counts here, whoever wrote it: at worst a forged one makes us wait.
///
/// `first`, called once when this contender is the first to see the mismatch and before it
/// rewrites the record, does what must precede that (the token floor, `FileStore::settling`);
/// when it fails the record is left as it is, and the next look tries again.
pub(crate) fn settling(
    paths: &LockPaths,
    storage: Storage,
    first: impl FnOnce() -> bool,
) -> Option<(Duration, Duration)> {
    if !applies(storage) {
        return None;
    }
    let here = here(paths)?;
    let (rec, _) = read(paths);
    let rec = rec?;
    if rec.boot != here.boot {
        // Written in another boot: every holder of that boot is dead.
        return None;
    }
    let now = now_ns();
    let ttl = Duration::from_millis(rec.ttl_ms);
    let until = if rec.names(&here) {
        rec.settle_until_ns
    } else {
        let until = now.saturating_add(u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX));
        let lock = lock_of(paths);
        let fresh = Record {
            lock: lock.to_string(),
            boot: here.boot.to_string(),
            dev: here.dev,
            seq: here.seq,
            ttl_ms: rec.ttl_ms,
            settle_until_ns: until,
        };
        match first().then(|| write(paths, &fresh)) {
            Some(Ok(())) => until,
            _ => remembered(&lock, &rec, until),
        }
    };
    (until > now).then(|| (Duration::from_nanos(until - now), ttl))
}

/// Inside the section, just before a lease with `ttl` is put in place (after [`settling`]
/// said nothing stands in the way): whether that lease may go unsynced. Yes when our own (or
/// root's) record for this LOCK names this attachment in this boot, with a longest TTL of at
/// least `ttl` and no grace running. Otherwise the record is rewritten for this attachment,
/// raised to `ttl` (synced, before the lease is put in place), and this one lease is still
/// synced; the next ones need not be. A record we may not replace (another user's, in a
/// sticky directory) leaves every lease of ours synced. When it vouches, says which file
/// (device, inode) the record is, for [`still`].
pub(crate) fn vouches(paths: &LockPaths, storage: Storage, ttl: Duration) -> Option<(u64, u64)> {
    if !applies(storage) {
        return None;
    }
    let here = here(paths)?;
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let lock = lock_of(paths);
    let (rec, trusted) = read(paths);
    let now = now_ns();
    if let Some(r) = &rec
        && let Some(id) = trusted
        && r.lock == lock
        && r.names(&here)
        && r.ttl_ms >= ttl_ms
        && r.settle_until_ns <= now
    {
        return Some(id);
    }
    // Keep the longest TTL of any record of this boot (a forged one only makes waits longer).
    let kept = rec
        .as_ref()
        .filter(|r| r.boot == here.boot)
        .map_or(0, |r| r.ttl_ms);
    // And a grace running on this attachment (never cut short here).
    let grace = rec
        .as_ref()
        .filter(|r| r.names(&here))
        .map_or(0, |r| r.settle_until_ns);
    let fresh = Record {
        lock: lock.to_string(),
        boot: here.boot.to_string(),
        dev: here.dev,
        seq: here.seq,
        ttl_ms: kept.max(ttl_ms),
        settle_until_ns: grace,
    };
    let _ = write(paths, &fresh);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        Record {
            lock: "/srv/a b/deploy.lock".into(),
            boot: "0f1e2d3c-aaaa-bbbb-cccc-111122223333".into(),
            dev: 2049,
            seq: 62,
            ttl_ms: 30_000,
            settle_until_ns: 0,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = rec();
        assert_eq!(Record::parse(r.to_text().as_bytes()), Some(r));
    }

    #[test]
    fn anything_but_a_whole_record_reads_as_none() {
        let text = rec().to_text();
        assert_eq!(Record::parse(b""), None);
        assert_eq!(
            Record::parse(text.replace("epoch 1", "epoch 2").as_bytes()),
            None
        );
        assert_eq!(
            Record::parse(text.replace("ttl_ms 30000", "ttl_ms x").as_bytes()),
            None
        );
        let cut = &text.as_bytes()[..text.len() - 4];
        assert_eq!(Record::parse(cut), None);
    }

    fn disk() -> Option<(tempfile::TempDir, LockPaths, Storage)> {
        let d = tempfile::tempdir().ok()?;
        let paths = LockPaths::new(d.path().join("L")).ok()?;
        let storage = crate::fsinfo::inspect(&paths.dir).storage();
        if !applies(storage) {
            eprintln!("SKIPPED: the temp directory is not on a local disk");
            return None;
        }
        Some((d, paths, storage))
    }

    fn at(paths: &LockPaths) -> std::path::PathBuf {
        paths.handle().join(&name(paths))
    }

    #[test]
    fn a_record_vouches_once_written_for_this_attachment_and_at_least_this_ttl() {
        let Some((_d, p, st)) = disk() else { return };
        let s30 = Duration::from_secs(30);
        let v = |ttl| vouches(&p, st, ttl).is_some();
        assert!(!v(s30), "no record yet: this lease is synced");
        assert!(v(s30), "the record written for it vouches");
        assert!(!v(s30 * 2), "a longer TTL raises the record first");
        assert!(v(s30 * 2) && v(s30));
        let id = vouches(&p, st, s30).unwrap();
        assert!(still(&p, id));
        std::fs::remove_file(at(&p)).unwrap();
        assert!(!still(&p, id), "a holder sees its record gone");
        assert!(
            settling(&p, st, || true).is_none(),
            "same attachment: no grace"
        );
    }

    #[test]
    fn a_record_others_could_write_or_of_another_lock_never_vouches() {
        use std::os::unix::fs::PermissionsExt;
        let Some((_d, p, st)) = disk() else { return };
        let s1 = Duration::from_secs(1);
        let v = |p: &LockPaths| vouches(p, st, s1).is_some();
        v(&p);
        assert!(v(&p));
        let f = at(&p);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!v(&p), "writable by others: not trusted");
        // Another lock's record, renamed to this lock's name.
        let other = LockPaths::new(p.dir.join("M")).unwrap();
        v(&other);
        std::fs::rename(at(&other), &f).unwrap();
        assert!(!v(&p), "another lock's record: not this lock's");
    }

    #[test]
    fn a_record_naming_another_attachment_in_this_boot_holds_contenders_for_its_ttl() {
        let Some((_d, p, st)) = disk() else { return };
        let Some(h) = here(&p) else { return };
        let mut r = Record {
            lock: lock_of(&p),
            boot: h.boot.to_string(),
            dev: h.dev,
            seq: h.seq.wrapping_add(1),
            ttl_ms: 60_000,
            settle_until_ns: 0,
        };
        std::fs::write(at(&p), r.to_text()).unwrap();
        let (left, ttl) = settling(&p, st, || true).expect("a grace");
        assert_eq!(ttl, Duration::from_secs(60));
        assert!(left > Duration::from_secs(59) && left <= ttl, "{left:?}");
        // Rewritten for this attachment with the grace's end: the next look keeps it.
        let (again, _) = settling(&p, st, || true).expect("the same grace");
        assert!(again <= left);
        assert!(
            vouches(&p, st, Duration::from_secs(1)).is_none(),
            "no unsynced lease in a grace"
        );
        assert!(
            settling(&p, st, || true).is_some(),
            "and the grace is not cut short"
        );
        // One of another boot holds nobody.
        r.boot = "another-boot".into();
        std::fs::write(at(&p), r.to_text()).unwrap();
        assert!(settling(&p, st, || true).is_none());
        // A first look that cannot do what must come first leaves the record as it was.
        r.boot = h.boot.to_string();
        std::fs::write(at(&p), r.to_text()).unwrap();
        assert!(settling(&p, st, || false).is_some());
        assert_eq!(std::fs::read_to_string(at(&p)).unwrap(), r.to_text());
    }

    #[test]
    fn a_record_names_only_its_own_attachment_and_boot() {
        let r = rec();
        let here = |boot: &'static str, dev, seq| Here { boot, dev, seq };
        assert!(r.names(&here("0f1e2d3c-aaaa-bbbb-cccc-111122223333", 2049, 62)));
        assert!(!r.names(&here("0f1e2d3c-aaaa-bbbb-cccc-111122223333", 2049, 63)));
        assert!(!r.names(&here("0f1e2d3c-aaaa-bbbb-cccc-111122223333", 1793, 62)));
        assert!(!r.names(&here("another-boot", 2049, 62)));
    }
}
