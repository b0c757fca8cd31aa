//! What this host has seen of another holder's heartbeat, kept beside LOCK so that it outlives
//! the observing process.
//!
//! Owns: the `.NAME.leasehold-seen-<uid>` file of the calling user — per observing host and
//! boot, the (lease id, heartbeat sequence) last seen and the CLOCK_BOOTTIME reading when it was
//! first seen so — and the observer-side heartbeat age computed from it. One-shot callers (`run
//! -n` from cron, `status`) each look once; together they still see a dead foreign holder go
//! stale after a TTL.
//! Must never: compare boottime readings of another host or another boot; trust the holder's
//! wall clock; trust an observation file that someone other than the caller's uid (or root)
//! wrote or could write — a forged first-seen time would make a live holder look dead — nor one
//! written for another lock or another observer (a file renamed here from another lock's name
//! is a replay: its lease id may be this lock's, copied into a decoy).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::fsio;
use crate::identity::Identity;
use crate::lockdir::Meta;
use crate::paths::LockPaths;

#[derive(Debug, Default, Serialize, Deserialize)]
struct SeenFile {
    leasehold_seen: u32,
    /// The lock observed: its absolute LOCK path, bytes in lowercase hex (a path need not be
    /// UTF-8). A file without it (older versions) or naming another lock is not believed.
    #[serde(default)]
    lock: String,
    /// The observer: the uid whose processes wrote it.
    #[serde(default)]
    observer: Option<u32>,
    entries: Vec<Entry>,
}

/// The `lock` field of `paths`' observation file.
fn lock_field(paths: &LockPaths) -> String {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for b in paths.lock.as_os_str().as_bytes() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Entry {
    host: String,
    boot_id: String,
    lease_id: String,
    /// The heartbeat sequence (or, for a damaged record, a fingerprint of its bytes).
    key: u64,
    /// CLOCK_BOOTTIME of the observing host when it first saw this (lease_id, key), in ms.
    since_boottime_ms: u64,
}

/// An in-process memory of one observation: used alongside the file, and alone when the file
/// cannot be written (a full or read-only file system).
#[derive(Debug, Clone, Default)]
pub(crate) struct Memory {
    seen: Option<(String, u64, Duration)>,
}

/// Records that this host sees `(lease_id, key)` now and returns how long it has seen exactly
/// that, on this host's CLOCK_BOOTTIME. Writes the file only when the observation changes;
/// without `paths` (a store that keeps no observation files) only `mem` remembers.
/// Failures to read or write the file are not errors: the in-process memory still counts.
pub(crate) fn observe(
    paths: Option<&LockPaths>,
    me: &Identity,
    clock: &dyn Clock,
    lease_id: &str,
    key: u64,
    mem: &mut Memory,
    persist: bool,
) -> Duration {
    let now = clock.boottime();
    // Seen already in this process: the file was read then, and its first-seen time merged.
    if let Some((id, k, s)) = &mem.seen
        && id == lease_id
        && *k == key
        && *s <= now
    {
        return now - *s;
    }
    let mut since = now;
    let Some(paths) = paths else {
        mem.seen = Some((lease_id.to_string(), key, since));
        return Duration::ZERO;
    };
    let lock = lock_field(paths);
    let observer = rustix::process::geteuid().as_raw();
    let mut file: SeenFile = fsio::read_small(paths, paths.seen_name(), 64 * 1024, trusted)
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice::<SeenFile>(&b).ok())
        .filter(|f| f.lock == lock && f.observer == Some(observer))
        .unwrap_or_default();
    let mine = |e: &Entry| e.host == me.host && e.boot_id == me.boot_id;
    let current = file
        .entries
        .iter()
        .find(|e| mine(e) && e.lease_id == lease_id && e.key == key)
        .map(|e| Duration::from_millis(e.since_boottime_ms));
    match current {
        Some(s) if s <= now => since = s,
        _ if persist => {
            file.leasehold_seen = 1;
            (file.lock, file.observer) = (lock, Some(observer));
            file.entries
                .retain(|e| !mine(e) && e.lease_id == lease_id && !e.host.is_empty());
            file.entries.truncate(64);
            file.entries.push(Entry {
                host: me.host.clone(),
                boot_id: me.boot_id.clone(),
                lease_id: lease_id.to_string(),
                key,
                since_boottime_ms: now.as_millis() as u64,
            });
            if let Ok(bytes) = serde_json::to_vec_pretty(&file)
                && replaceable(paths)
            {
                // Not durable on purpose: after a crash of this host, its boot id changes anyway.
                let _ = fsio::replace(paths, &paths.seen, &bytes, false);
            }
        }
        _ => {}
    }
    mem.seen = Some((lease_id.to_string(), key, since));
    now.saturating_sub(since)
}

/// Whether an observation file may be believed: a regular file with one link, written by the
/// caller's own uid or by root, and writable by nobody else.
fn trusted(m: &Meta) -> bool {
    let me = rustix::process::geteuid().as_raw();
    m.is_file() && m.nlink == 1 && (m.uid == me || m.uid == 0) && m.mode & 0o022 == 0
}

/// Whether our observation file's name may be replaced: it is missing, or a regular file with
/// one link — ours, or one another user planted at our name to keep us from recording (it is
/// never believed, see [`trusted`], and replacing the name changes no other file's bytes).
/// Anything else there (a hard link to some other file, a directory, a FIFO) is left alone, and
/// the process's own memory of the observation still counts.
fn replaceable(paths: &LockPaths) -> bool {
    match paths.handle().stat(paths.seen_name()) {
        Ok(None) => true,
        Ok(Some(m)) => m.is_file() && m.nlink == 1,
        Err(_) => false,
    }
}
