//! The FIFO wait queue: one ticket file per waiter in `.NAME.leasehold-queue/`.
//!
//! Owns: taking a ticket (under the mutex: the next sequence number after the highest present,
//! created exclusively and flocked by its owner for as long as it waits), finding the live
//! tickets ahead of ours (a ticket whose flock is free belongs to a waiter that is gone; one
//! whose heartbeat has not moved for a TTL belongs to a frozen waiter and is skipped), the
//! ticket's in-place heartbeat, the head's prepared lease (`q-N.lease`, written while it waits
//! and renamed over LOCK when it takes the lease), and leaving the queue. Must never: delete a
//! ticket whose flock is held by a live, beating waiter; delete any file by path without
//! checking it is the inode it judged — except, under the mutex, the prepared lease of a ticket
//! being removed or of a number just taken anew: a name only that ticket's owner creates, and
//! uses only under the mutex with its ticket verified; let a later ticket number be served
//! before an earlier live one.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};

use crate::clock::{Clock, format_rfc3339};
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::paths::LockPaths;

const PREFIX: &str = "q-";
const BEAT_W: usize = 20;
const TAIL: &str = "}\n";

/// What a ticket file says about its waiter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// Position: smaller is served first.
    #[serde(default)]
    pub seq: u64,
    /// The waiter's PID (in its own pid namespace).
    pub pid: i32,
    /// Host name of the waiter.
    pub host: String,
    /// User name of the waiter.
    pub user: String,
    /// Waiter's wall clock when it joined the queue.
    pub since: String,
    /// What it wants to run.
    #[serde(default)]
    pub command: Vec<String>,
    /// Incremented in place while the waiter lives.
    #[serde(default)]
    pub beat: u64,
}

/// Our own ticket: its file stays open and flocked until we leave the queue.
#[derive(Debug)]
pub(crate) struct Ticket {
    pub seq: u64,
    path: PathBuf,
    file: File,
    /// Device and inode of our ticket file.
    id: (u64, u64),
    /// Its name is gone already.
    unlinked: bool,
    bytes: Vec<u8>,
    beat: u64,
    /// Our lease, written ahead of the wake-up (see [`Ticket::prepare`]).
    prepared: Option<Prepared>,
    /// On a network file system: our writes are flushed to the server at once.
    network: bool,
}

/// Our lease written ahead of time into `q-<seq>.lease` beside our ticket, open, so that taking
/// the lease is a write into a page that exists and one rename (no file to create).
#[derive(Debug)]
struct Prepared {
    path: PathBuf,
    file: File,
    /// The same file, read-only: what the holder keeps for its release (see `guard`).
    ro: File,
    id: (u64, u64),
    len: usize,
}

/// Creates `path` read-write, exclusively (mode 644 before the umask), following no symlink.
fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(path)
}

/// The name of the prepared lease of the ticket at `ticket`.
fn prepared_path(ticket: &Path) -> PathBuf {
    ticket.with_extension("lease")
}

/// Per-waiter memory of other tickets' heartbeats, to tell a frozen waiter.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    seen: HashMap<u64, (u64, Instant)>,
}

/// A live ticket ahead of ours, opened while it was judged live (under the mutex), so that
/// waiting on it can never wait on another file that took its name since.
#[derive(Debug)]
pub(crate) struct Ahead {
    pub file: File,
    /// Device and inode of the ticket.
    pub id: (u64, u64),
}

fn ticket_name(seq: u64) -> String {
    format!("{PREFIX}{seq:020}")
}

fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The tickets present, in queue order. Missing queue directory: none.
fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, "list the wait queue", e)),
    };
    let mut out: Vec<(u64, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let seq = parse_name(e.file_name().to_str()?)?;
            Some((seq, e.path()))
        })
        .collect();
    out.sort_unstable_by_key(|(s, _)| *s);
    Ok(out)
}

fn open_ticket(path: &Path) -> io::Result<File> {
    // Read-write, because NFSv4 refuses exclusive locks on read-only descriptors.
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
}

fn read_info(file: &File) -> Option<Waiting> {
    let mut buf = vec![0u8; 8192];
    let n = file.read_at(&mut buf, 0).ok()?;
    serde_json::from_slice(&buf[..n]).ok()
}

/// Unlinks `path` only if it is still the inode `file` has open.
fn unlink_if_same(path: &Path, file: &File) {
    if let Ok(ours) = file.metadata() {
        unlink_if_id(path, (ours.dev(), ours.ino()));
    }
}

/// Unlinks `path` only if it is still the inode `id` (device, inode).
fn unlink_if_id(path: &Path, id: (u64, u64)) {
    if let Ok(now) = std::fs::symlink_metadata(path)
        && (now.dev(), now.ino()) == id
    {
        let _ = std::fs::remove_file(path);
    }
}

/// Called under the mutex: the live tickets ahead of `mine`, pruning tickets of waiters that
/// are gone (their flock is free) and, when `observed` is given, skipping those whose heartbeat
/// has not moved for `ttl` (frozen waiters). Also how many tickets that leaves ahead.
///
/// Without a ticket (`mine` None: a newcomer, or a one-shot caller) only the last live ticket
/// is wanted — whether anyone waits, and whom a newcomer queues behind — so the queue is judged
/// from its end and the judging stops at the first live ticket: a newcomer's look is then one
/// ticket, not all of them, and it holds the mutex that much less. Tickets further ahead are
/// judged by their own successors (a dead waiter's successor is woken by its freed lock).
pub(crate) fn live_ahead(
    paths: &LockPaths,
    mine: Option<u64>,
    mut observed: Option<&mut Observed>,
    ttl: Duration,
) -> Result<(Vec<Ahead>, usize)> {
    let mut out = Vec::new();
    let mut tickets = list(&paths.queue)?;
    let newcomer = mine.is_none();
    if newcomer {
        tickets.reverse();
    }
    let mut count = tickets
        .iter()
        .filter(|(s, _)| mine.is_none_or(|m| *s < m))
        .count();
    for (seq, path) in tickets {
        if mine.is_some_and(|m| seq >= m) {
            break;
        }
        if newcomer && !out.is_empty() {
            break;
        }
        count -= 1; // counted again below if it is live
        let file = match open_ticket(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&path, "open a queue ticket", e)),
        };
        match file.try_lock() {
            Ok(()) => {
                // Nobody holds it: its waiter is gone. We hold its lock while we remove it, and
                // any lease it prepared (only a ticket's owner creates that name, and using it
                // takes the mutex we hold).
                unlink_if_same(&path, &file);
                let _ = std::fs::remove_file(prepared_path(&path));
                continue;
            }
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::io(&path, "test a queue ticket's lock", e));
            }
        }
        if let (Some(obs), Some(w)) = (observed.as_deref_mut(), read_info(&file)) {
            let now = Instant::now();
            let entry = obs.seen.entry(seq).or_insert((w.beat, now));
            if entry.0 != w.beat {
                *entry = (w.beat, now);
            } else if now.duration_since(entry.1) >= ttl {
                // Frozen for a TTL: skip it. When it resumes it finds its ticket gone and queues
                // again at the back.
                unlink_if_same(&path, &file);
                let _ = std::fs::remove_file(prepared_path(&path));
                obs.seen.remove(&seq);
                continue;
            }
        }
        let id = file
            .metadata()
            .map(|m| (m.dev(), m.ino()))
            .unwrap_or((0, 0));
        out.push(Ahead { file, id });
        count += 1;
    }
    Ok((out, count))
}

/// Everyone waiting, in order (for `status`). Does not prune.
pub(crate) fn snapshot(paths: &LockPaths) -> Vec<Waiting> {
    let Ok(tickets) = list(&paths.queue) else {
        return Vec::new();
    };
    tickets
        .into_iter()
        .filter_map(|(seq, path)| {
            let f = open_ticket(&path).ok()?;
            // A ticket whose lock is free belongs to a waiter that is gone.
            if f.try_lock().is_ok() {
                return None;
            }
            let mut w = read_info(&f)?;
            w.seq = seq;
            Some(w)
        })
        .collect()
}

impl Ticket {
    /// Called under the mutex: joins the queue behind every ticket present.
    pub(crate) fn take(
        paths: &LockPaths,
        me: &Identity,
        clock: &dyn Clock,
        command: &[String],
        network: bool,
    ) -> Result<Ticket> {
        match std::fs::create_dir(&paths.queue) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(&paths.queue, "create the wait queue", e)),
        }
        let meta = std::fs::symlink_metadata(&paths.queue)
            .map_err(|e| Error::io(&paths.queue, "stat the wait queue", e))?;
        if !meta.is_dir() {
            return Err(Error::NotALease {
                path: paths.queue.clone(),
                what: "the wait queue's name is taken by something that is not a directory".into(),
            });
        }
        let seq = list(&paths.queue)?.last().map_or(1, |(s, _)| s + 1);
        let path = paths.queue.join(ticket_name(seq));
        let file = create_new(&path).map_err(|e| Error::io(&path, "create a queue ticket", e))?;
        // A lease prepared under this number earlier belongs to a waiter that is gone or was
        // skipped (we just created the ticket's name): it is never used without its ticket,
        // checked under the mutex we hold.
        let _ = std::fs::remove_file(prepared_path(&path));
        // Only a momentary `status` look can hold it: retry try-locks for a moment rather than
        // issue a blocking lock, which an NFS client retries with a backoff of seconds.
        let mut tries = 0;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if tries < 1000 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(e) => {
                    return Err(Error::io(
                        &path,
                        "lock our queue ticket",
                        io::Error::other(e.to_string()),
                    ));
                }
            }
        }
        let info = Waiting {
            seq,
            pid: std::process::id() as i32,
            host: me.host.clone(),
            user: me.user.clone(),
            since: format_rfc3339(clock.wall()),
            command: command.iter().take(64).cloned().collect(),
            beat: 0,
        };
        let mut text = serde_json::to_string(&info).unwrap_or_else(|_| "{}".into());
        // Rewrite the trailing `"beat":0}` as a fixed-width field so beats are in-place writes.
        if let Some(cut) = text.rfind("\"beat\":") {
            text.truncate(cut);
        }
        text.push_str(&format!("\"beat\":{:>BEAT_W$}{TAIL}", 0));
        let bytes = text.into_bytes();
        let id = file
            .metadata()
            .map(|m| (m.dev(), m.ino()))
            .map_err(|e| Error::io(&path, "stat our queue ticket", e))?;
        let t = Ticket {
            seq,
            path,
            file,
            id,
            unlinked: false,
            bytes,
            beat: 0,
            prepared: None,
            network,
        };
        t.file
            .write_all_at(&t.bytes, 0)
            .map_err(|e| Error::io(&t.path, "write a queue ticket", e))?;
        t.flush();
        Ok(t)
    }

    /// Moves our heartbeat (in place: no new blocks).
    pub(crate) fn beat(&mut self) {
        self.beat = self.beat.wrapping_add(1);
        let off = self.bytes.len() - TAIL.len() - BEAT_W;
        let field = format!("{:>BEAT_W$}", self.beat);
        self.bytes[off..off + BEAT_W].copy_from_slice(field.as_bytes());
        let _ = self.file.write_all_at(field.as_bytes(), off as u64);
        self.flush();
    }

    /// On a network file system, sends what we wrote to the server: the ticket stays open while
    /// we wait, so close-to-open never flushes it, and another host would otherwise read no
    /// beat (or none at all) and judge a live waiter frozen — or a frozen one never.
    fn flush(&self) {
        if self.network {
            let _ = self.file.sync_data();
        }
    }

    /// False when someone removed our ticket (we were judged frozen): queue again. On a local
    /// file system the link count of our open ticket says it (a ticket has one name, made
    /// exclusively, and is only ever unlinked); elsewhere the name is looked up, since a
    /// network client may serve a stale link count from its attribute cache.
    pub(crate) fn still_queued(&self, local: bool) -> bool {
        if local {
            return self.file.metadata().is_ok_and(|m| m.nlink() > 0);
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(now) => (now.dev(), now.ino()) == self.id,
            _ => false,
        }
    }
}

impl Ticket {
    /// Writes our lease (`bytes`, the exact length it will have when taken) into
    /// `q-<seq>.lease`, created exclusively, and keeps it open. Local file systems only (the
    /// caller's check): on NFS a descriptor kept open across a rename is not what we want.
    /// Best effort: without it, taking the lease writes a new file as usual.
    pub(crate) fn prepare(&mut self, bytes: &[u8]) {
        if self.prepared.is_some() || self.unlinked {
            return;
        }
        let path = prepared_path(&self.path);
        let Ok(file) = create_new(&path) else {
            return; // e.g. a skipped waiter's late file has the name: do without
        };
        let Ok(meta) = file.metadata() else {
            let _ = std::fs::remove_file(&path); // just created, exclusively: ours
            return;
        };
        let id = (meta.dev(), meta.ino());
        let made = crate::fsio::ensure_lease_mode(&file, &meta).is_ok()
            && file.write_all_at(bytes, 0).is_ok();
        // The very inode, read-only, through our own descriptor.
        let ro = OpenOptions::new()
            .read(true)
            .custom_flags(OFlag::O_CLOEXEC.bits())
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let (true, Ok(ro)) = (made, ro) else {
            unlink_if_id(&path, id);
            return;
        };
        self.prepared = Some(Prepared {
            path,
            file,
            ro,
            id,
            len: bytes.len(),
        });
    }

    /// Takes the lease through the prepared file: writes `bytes` into it, optionally fsyncs it,
    /// renames it over `target`, and optionally fsyncs `dir` (LOCK's directory, open, and its
    /// path). Under the mutex, with our ticket still queued. `None` (nothing renamed) when there
    /// is no prepared file, `bytes` has another length, or the name is not our file any more:
    /// the caller then writes the lease the usual way.
    pub(crate) fn install(
        &mut self,
        bytes: &[u8],
        durable: bool,
        target: &Path,
        dir: Option<(&File, &Path)>,
    ) -> Option<Result<crate::fsio::Written>> {
        let p = self.prepared.take_if(|p| p.len == bytes.len())?;
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
            if durable {
                p.file
                    .sync_data()
                    .map_err(|e| Error::io(&p.path, "fsync our prepared lease", e))?;
            }
            std::fs::rename(&p.path, target)
                .map_err(|e| Error::io(target, "rename into place", e))?;
            if durable && let Some((d, dp)) = dir {
                crate::fsio::sync_open_dir(d, dp)?;
            }
            Ok(crate::fsio::Written {
                id: p.id,
                kept: Some(p.ro),
            })
        })();
        if done.is_err() {
            unlink_if_id(&p.path, p.id);
        }
        Some(done)
    }

    /// Called under the mutex, when our ticket was found still queued under it: removes its
    /// name without another check (nobody else touches the queue while we hold the mutex). Its
    /// lock goes when the ticket is dropped.
    pub(crate) fn unlink_held(mut self) -> Ticket {
        let _ = std::fs::remove_file(&self.path);
        self.unlinked = true;
        self
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(p) = self.prepared.take() {
            unlink_if_id(&p.path, p.id);
        }
        if self.unlinked {
            return;
        }
        // Unlink first, then the lock goes with the descriptor: the successor wakes to a queue
        // that no longer holds us.
        unlink_if_id(&self.path, self.id);
    }
}
