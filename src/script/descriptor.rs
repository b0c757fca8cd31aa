//! The kernel evidence that a descriptor's lock is still held, for a keeper bound to a
//! descriptor (the flock front end's FD form, PROTOCOL.md §12) — without holding that
//! descriptor: a duplicate in the keeper would keep the lock alive for ever.
//!
//! Owns: reading `/proc/PID/fdinfo/FD` (its `lock:` lines list the flock(2) and OFD locks owned
//! by that open file description), `/proc/PID/fd/FD` (which file it is), and finding the
//! processes that still hold the lock after the job's own descriptor stopped holding it (the
//! job on another descriptor, a process it started, a process of its group: they inherited the
//! descriptor). Must never: open, duplicate or lock the user's file; answer "held" on a /proc
//! entry it could not read; look at processes of another uid.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

use leasehold::process;

/// What a keeper bound to a descriptor watches: the file (device and inode, as `fstat` gives
/// them), which kind of kernel lock, and close events on the file.
#[derive(Debug)]
pub struct Watch {
    /// The descriptor number in the job at the start.
    pub fd: i32,
    /// `st_dev` and `st_ino` of the locked file.
    pub file: (u64, u64),
    /// An open-file-description `fcntl` lock (`OFDLCK`) rather than `flock(2)` (`FLOCK`).
    pub ofd: bool,
    /// An inotify descriptor watching the file for `IN_CLOSE_*` (any open of it closed), when
    /// one could be had; a periodic look covers the rest.
    pub closes: Option<OwnedFd>,
}

/// Who holds the lock now, as far as the kernel shows.
#[derive(Debug, PartialEq, Eq)]
pub enum Holder {
    /// The job, on its descriptor.
    Job,
    /// Another process, inheriting the open file description: pid, start, descriptor, group.
    Other {
        pid: i32,
        start: u64,
        fd: i32,
        pgid: i32,
    },
    /// Nobody of this job: the lock was released (or passed on to someone else's descriptor).
    Nobody,
}

/// The process a keeper bound to a descriptor watches.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub pid: i32,
    pub start: u64,
    pub fd: i32,
    pub pgid: i32,
}

/// Whether descriptor `fd` of `pid` is on the watched file and its open file description owns
/// a lock of the watched kind.
pub fn holds(pid: i32, fd: i32, w: &Watch) -> bool {
    let on_file =
        fs::metadata(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|m| (m.dev(), m.ino()) == w.file);
    on_file
        && fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
            .is_ok_and(|info| info.lines().any(|l| lock_line(l, w.ofd)))
}

/// Whether a `/proc/PID/fdinfo` line is a `lock:` line of the kind watched, e.g.
/// `lock:\t1: FLOCK  ADVISORY  WRITE 4242 00:2b:1234 0 EOF` (the kernel lists only the locks
/// owned by that open file description, so its device and inode need no check).
fn lock_line(line: &str, ofd: bool) -> bool {
    let mut words = line.split_whitespace();
    words.next() == Some("lock:") && words.nth(1) == Some(if ofd { "OFDLCK" } else { "FLOCK" })
}

/// Who holds the watched lock for `job`: the job on its own descriptor; else a process that
/// inherited the open file description — the job itself on another descriptor, a process
/// descending from it, or a member of its process group (where a background job of a shell
/// without job control stays after the shell exited) — of user `uid`, found by its
/// descriptors on the file whose open file description owns a lock of the kind; else nobody.
pub fn who_holds(job: &Job, uid: u32, w: &Watch) -> Holder {
    let alive =
        matches!(process::stat(job.pid), Ok(Some(s)) if s.start == job.start && !s.is_dead());
    if alive && holds(job.pid, job.fd, w) {
        return Holder::Job;
    }
    let Ok(dir) = fs::read_dir("/proc") else {
        return Holder::Nobody;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(Some(s)) = process::stat(pid) else {
            continue;
        };
        if s.uid != uid || s.is_dead() || pid == std::process::id() as i32 {
            continue;
        }
        let related = (pid == job.pid && s.start == job.start)
            || s.pgrp == job.pgid
            || (alive && process::descends_from(pid, job.pid, job.start));
        if !related {
            continue;
        }
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for f in fds.flatten() {
            let Some(fd) = f.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if holds(pid, fd, w) {
                return Holder::Other {
                    pid,
                    start: s.start,
                    fd,
                    pgid: s.pgrp,
                };
            }
        }
    }
    Holder::Nobody
}

#[cfg(test)]
mod tests {
    use super::lock_line;

    #[test]
    fn lock_lines_are_told_by_kind() {
        let flock = "lock:\t1: FLOCK  ADVISORY  WRITE 4242 00:2b:1234 0 EOF";
        let ofd = "lock:\t1: OFDLCK ADVISORY  READ -1 08:02:99 0 EOF";
        assert!(lock_line(flock, false));
        assert!(!lock_line(flock, true));
        assert!(lock_line(ofd, true));
        assert!(!lock_line(ofd, false));
        assert!(!lock_line("pos:\t0", false));
        assert!(!lock_line("flags:\t0100001", false));
    }
}
