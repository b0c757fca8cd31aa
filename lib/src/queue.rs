//! The FIFO wait queue: one ticket file per waiter in `.NAME.leasehold-queue/`.
//!
//! Owns: taking a ticket (under the mutex: the next sequence number after the highest present,
//! created exclusively and locked by its owner for as long as it waits — `klock.rs`'s lock,
//! which every host sees), finding the live
//! tickets ahead of ours (a ticket whose lock is free belongs to a waiter that is gone; one
//! whose heartbeat has not moved for a TTL belongs to a frozen waiter and is skipped), the
//! ticket's in-place heartbeat, keeping the head's prepared lease with its ticket (`q-N.lease`:
//! written and installed by `handover.rs`, removed with the ticket), and leaving the queue. Everything goes
//! through the queue directory opened without following a link ([`LockDir`]).
//! Must never: delete a ticket whose flock is held by a live, beating waiter; lock or delete a
//! name that is not a regular file with one link (not a ticket leasehold could have made);
//! delete any name without checking it is the inode it judged — except, under the mutex, the
//! prepared lease of a ticket being removed or of a number just taken anew (a name only that
//! ticket's owner creates, and uses only under the mutex with its ticket verified), and then
//! only if it passes the trust check; let a later ticket number be served before an earlier
//! live one; name a waiter by what its ticket claims rather than by who holds its flock.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{Clock, format_rfc3339};
use crate::error::{Error, Result};
use crate::handover::{Prepared, prepared_name};
use crate::identity::Identity;
use crate::klock;
use crate::lockdir::{LockDir, Meta};
use crate::paths::LockPaths;
use crate::verdict::Waiting;

const PREFIX: &str = "q-";
const BEAT_W: usize = 20;
const TAIL: &str = "}\n";

/// Our own ticket: its file stays open and flocked until we leave the queue.
#[derive(Debug)]
pub(crate) struct Ticket {
    pub seq: u64,
    /// Its path, for messages; every operation goes through `qdir` by `name`.
    path: PathBuf,
    name: OsString,
    /// The queue directory, open.
    qdir: Arc<LockDir>,
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

/// Opens the queue directory of `paths` without following a symlink at its name. `Ok(None)`
/// when there is none; something else at the name (a symlink, a file) is refused, untouched.
fn open_queue(paths: &LockPaths) -> Result<Option<Arc<LockDir>>> {
    let dir = paths.handle();
    let name = paths.queue_name();
    match dir.open_subdir(name) {
        // Whoever owns it can only disturb the queue (deny service); every ticket in it is
        // checked before it is locked or removed, so its owner need not be trusted.
        Ok(q) => Ok(q.map(Arc::new)),
        Err(e) => {
            if let Ok(Some(m)) = dir.stat(name)
                && !m.is_dir()
            {
                return Err(Error::Squatted {
                    path: paths.queue.clone(),
                    why: format!(
                        "{} owned by {} has the name of leasehold's wait queue directory; \
                         leasehold left it untouched: remove it",
                        m.kind(),
                        crate::lockdir::user_name(m.uid)
                    ),
                });
            }
            Err(Error::io(&paths.queue, "open the wait queue", e))
        }
    }
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
    /// Its sequence number.
    pub seq: u64,
}

impl Ahead {
    /// Who waits there, by the kernel's word (the holder of the ticket's flock in
    /// `/proc/locks`), not by what the ticket says: `pid 812 (user bob, state S)`.
    pub(crate) fn who(&self) -> String {
        match crate::mutex::holder_pid(&self.file) {
            Some(_) => crate::mutex::describe_holder(&self.file),
            // Another host's waiter (NFS): only its ticket can say, and it says so.
            None => match read_info(&self.file) {
                Some(w) => format!(
                    "a process this host cannot see; its ticket says pid {} of {} on {}",
                    w.pid, w.user, w.host
                ),
                None => crate::mutex::describe_holder(&self.file),
            },
        }
    }
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

/// The tickets present in the queue directory `q`, in queue order.
fn list(q: &LockDir) -> Result<Vec<(u64, OsString)>> {
    let names = q
        .names()
        .map_err(|e| Error::io(q.path(), "list the wait queue", e))?;
    let mut out: Vec<(u64, OsString)> = names
        .into_iter()
        .filter_map(|n| Some((parse_name(n.to_str()?)?, n)))
        .collect();
    out.sort_unstable_by_key(|(s, _)| *s);
    Ok(out)
}

/// Opens another waiter's ticket to test its lock: read-only on a local file system (flock needs
/// no write access), read-write on a network one (NFSv4 refuses exclusive locks on read-only
/// descriptors). `Ok(None)` when the name is gone, or is not a ticket leasehold could have made
/// (not a regular file, or hard-linked to another file): that is never locked nor removed.
fn open_ticket(q: &LockDir, name: &OsStr, network: bool) -> io::Result<Option<File>> {
    let file = match q.open_existing(name, network) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(crate::error::libc_consts::ELOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let m = Meta::of(&file.metadata()?);
    Ok((m.is_file() && m.nlink == 1).then_some(file))
}

fn read_info(file: &File) -> Option<Waiting> {
    let mut buf = vec![0u8; 8192];
    let n = file.read_at(&mut buf, 0).ok()?;
    serde_json::from_slice(&buf[..n]).ok()
}

/// Unlinks `name` only if it is still the inode `file` has open.
fn unlink_if_same(q: &LockDir, name: &OsStr, file: &File) {
    if let Ok(ours) = file.metadata() {
        q.unlink_if(name, (ours.dev(), ours.ino()));
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
    network: bool,
) -> Result<(Vec<Ahead>, usize)> {
    let mut out = Vec::new();
    let Some(q) = open_queue(paths)? else {
        return Ok((out, 0));
    };
    let mut tickets = list(&q)?;
    let newcomer = mine.is_none();
    if newcomer {
        tickets.reverse();
    }
    let mut count = tickets
        .iter()
        .filter(|(s, _)| mine.is_none_or(|m| *s < m))
        .count();
    for (seq, name) in tickets {
        if mine.is_some_and(|m| seq >= m) {
            break;
        }
        if newcomer && !out.is_empty() {
            break;
        }
        count -= 1; // counted again below if it is live
        let path = q.join(&name);
        let file = match open_ticket(&q, &name, network) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Err(Error::io(&path, "open a queue ticket", e)),
        };
        match klock::held_by_other(&file, network) {
            Ok(false) => {
                // Nobody holds it: its waiter is gone (a ticket is created and locked under the
                // mutex we hold, so none is between the two). We remove it, and any lease it
                // prepared (only a ticket's owner creates that name, and using it takes the
                // mutex we hold).
                unlink_if_same(&q, &name, &file);
                q.unlink_leftover(&prepared_name(&name));
                continue;
            }
            Ok(true) => {}
            Err(e) => return Err(Error::io(&path, "test a queue ticket's lock", e)),
        }
        if let (Some(obs), Some(w)) = (observed.as_deref_mut(), read_info(&file)) {
            let now = Instant::now();
            let entry = obs.seen.entry(seq).or_insert((w.beat, now));
            if entry.0 != w.beat {
                *entry = (w.beat, now);
            } else if now.duration_since(entry.1) >= ttl {
                // Frozen for a TTL: skip it. When it resumes it finds its ticket gone and queues
                // again at the back.
                unlink_if_same(&q, &name, &file);
                q.unlink_leftover(&prepared_name(&name));
                obs.seen.remove(&seq);
                continue;
            }
        }
        let id = file
            .metadata()
            .map(|m| (m.dev(), m.ino()))
            .unwrap_or((0, 0));
        out.push(Ahead { file, id, seq });
        count += 1;
    }
    Ok((out, count))
}

/// Whether any ticket is present, live or not (an error says yes): whether anyone may wait.
pub(crate) fn any_ticket(paths: &LockPaths) -> bool {
    match open_queue(paths) {
        Ok(Some(q)) => list(&q).map_or(true, |t| !t.is_empty()),
        Ok(None) => false,
        Err(_) => true,
    }
}

/// Everyone waiting, in order (for `status`). Does not prune.
pub(crate) fn snapshot(paths: &LockPaths) -> Vec<Waiting> {
    let Ok(Some(q)) = open_queue(paths) else {
        return Vec::new();
    };
    let Ok(tickets) = list(&q) else {
        return Vec::new();
    };
    tickets
        .into_iter()
        .filter_map(|(seq, name)| {
            let f = open_ticket(&q, &name, false).ok()??;
            // A ticket whose lock is free belongs to a waiter that is gone.
            if !klock::held_by_other(&f, false).unwrap_or(true) {
                return None;
            }
            let mut w = read_info(&f)?;
            w.seq = seq;
            Some(w)
        })
        .collect()
}

/// Locks our new ticket (created read-write by us, under the mutex). Nobody else locks a
/// ticket for more than a moment (a successor that waits for it takes it and lets go at once):
/// retry try-locks for a moment rather than issue a blocking lock, which an NFS client retries
/// with a backoff of seconds.
fn lock_own(file: &File, path: &std::path::Path, network: bool) -> Result<()> {
    let at = klock::Where {
        network,
        writable: true,
    };
    let mut tries = 0;
    loop {
        match klock::try_exclusive(file, at) {
            Ok(true) => return Ok(()),
            Ok(false) if tries < 1000 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(false) => {
                return Err(Error::io(
                    path,
                    "lock our queue ticket",
                    io::ErrorKind::WouldBlock.into(),
                ));
            }
            Err(e) => return Err(Error::io(path, "lock our queue ticket", e)),
        }
    }
}

/// A ticket's bytes: its JSON, with the trailing `"beat":0}` rewritten as a fixed-width field
/// so that beats are in-place writes.
fn ticket_bytes(info: &Waiting) -> Vec<u8> {
    let mut text = serde_json::to_string(info).unwrap_or_else(|_| "{}".into());
    if let Some(cut) = text.rfind("\"beat\":") {
        text.truncate(cut);
    }
    text.push_str(&format!("\"beat\":{:>BEAT_W$}{TAIL}", 0));
    text.into_bytes()
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
        let dir = paths.handle();
        dir.mkdir(paths.queue_name(), dir.shared_mode(0o755))
            .map_err(|e| Error::io(&paths.queue, "create the wait queue", e))?;
        let Some(q) = open_queue(paths)? else {
            return Err(Error::io(
                &paths.queue,
                "open the wait queue",
                io::ErrorKind::NotFound.into(),
            ));
        };
        let seq = list(&q)?.last().map_or(1, |(s, _)| s + 1);
        let name = OsString::from(ticket_name(seq));
        let path = q.join(&name);
        let (file, id) = q
            .create_new(&name, q.shared_mode(0o644))
            .map_err(|e| Error::io(&path, "create a queue ticket", e))?;
        // A lease prepared under this number earlier belongs to a waiter that is gone or was
        // skipped (we just created the ticket's name): it is never used without its ticket,
        // checked under the mutex we hold.
        q.unlink_leftover(&prepared_name(&name));
        lock_own(&file, &path, network)?;
        let info = Waiting {
            seq,
            pid: std::process::id() as i32,
            host: me.host.clone(),
            user: me.user.clone(),
            since: format_rfc3339(clock.wall()),
            command: command.iter().take(64).cloned().collect(),
            beat: 0,
        };
        let bytes = ticket_bytes(&info);
        let t = Ticket {
            seq,
            path,
            name,
            qdir: q,
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
    pub(crate) fn still_queued(&self, network: bool) -> bool {
        if !network {
            return self.file.metadata().is_ok_and(|m| m.nlink() > 0);
        }
        match self.qdir.stat(&self.name) {
            Ok(Some(now)) => now.id() == self.id,
            _ => false,
        }
    }
}

impl Ticket {
    /// Writes our lease ahead of the wake-up into a file of its own beside our ticket (see
    /// [`Prepared`]). Local file systems only (the caller's check). Best effort.
    pub(crate) fn prepare(&mut self, bytes: &[u8]) {
        if self.prepared.is_none() && !self.unlinked {
            self.prepared = Prepared::write(&self.qdir, &self.name, bytes);
        }
    }

    /// Takes the lease through our prepared file, if we have one (see
    /// [`Prepared::install`]). Under the mutex, with our ticket still queued.
    pub(crate) fn install(
        &mut self,
        bytes: &[u8],
        durable: bool,
        paths: &LockPaths,
    ) -> Option<Result<crate::fsio::Written>> {
        let p = self.prepared.take_if(|p| p.fits(bytes))?;
        p.install(&self.qdir, bytes, durable, paths)
    }

    /// Called under the mutex, when our ticket was found still queued under it: removes its
    /// name without another check (nobody else touches the queue while we hold the mutex). Its
    /// lock goes when the ticket is dropped.
    pub(crate) fn unlink_held(mut self) -> Ticket {
        self.qdir.unlink_if(&self.name, self.id);
        self.unlinked = true;
        self
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(p) = self.prepared.take() {
            p.discard(&self.qdir);
        }
        if self.unlinked {
            return;
        }
        // Unlink first, then the lock goes with the descriptor: the successor wakes to a queue
        // that no longer holds us.
        self.qdir.unlink_if(&self.name, self.id);
    }
}
