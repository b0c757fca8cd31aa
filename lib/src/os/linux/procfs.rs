//! Reading /proc: what the kernel says of a process (`/proc/PID/stat`) and of the kernel locks
//! on an inode (`/proc/locks`), parsed into plain values.
//!
//! Owns: opening and parsing those files, and telling "no such process" from "cannot read".
//! Must never: judge what it reads (whether a process is a lock's job, whether a lock is stuck:
//! `process.rs` and `mutex.rs` do), signal anyone, or fail on any text the kernel gives.

use std::fs;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

/// What /proc says of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: i32,
    /// State letter: R, S, D, T (stopped), Z (zombie), ...
    pub state: char,
    /// Parent process id.
    pub ppid: i32,
    /// Process group id.
    pub pgrp: i32,
    /// Start time in clock ticks after boot.
    pub start: u64,
    /// Effective uid (owner of /proc/PID).
    pub uid: u32,
}

impl ProcStat {
    /// True for a zombie or a dead task: it will never run again.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Reads /proc/PID/stat. `Ok(None)` when there is no such process.
///
/// ```
/// let me = leasehold::process::stat(std::process::id() as i32).unwrap().unwrap();
/// assert_eq!(me.pid, std::process::id() as i32);
/// ```
pub fn stat(pid: i32) -> io::Result<Option<ProcStat>> {
    if pid <= 0 {
        return Ok(None);
    }
    let gone = |e: &io::Error| {
        e.kind() == io::ErrorKind::NotFound
            || e.raw_os_error() == Some(nix::errno::Errno::ESRCH as i32)
    };
    let f = match fs::File::open(format!("/proc/{pid}/stat")) {
        Ok(f) => f,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    // The file belongs to the process's owner, like its /proc directory.
    let uid = match f.metadata() {
        Ok(m) => m.uid(),
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    // One read takes the whole line (a few hundred bytes); std's read_to_string would grow its
    // buffer from 32 bytes, a system call each time.
    let mut buf = vec![0u8; 1024];
    let mut n = 0;
    loop {
        match std::io::Read::read(&mut (&f), &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                if buf[..n].ends_with(b"\n") {
                    break;
                }
                if n == buf.len() {
                    buf.resize(n * 2, 0);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8_lossy(&buf[..n]);
    Ok(parse_stat(pid, &text, uid))
}

/// Parses the text of /proc/PID/stat; `None` when it is not one.
pub(crate) fn parse_stat(pid: i32, text: &str, uid: u32) -> Option<ProcStat> {
    // comm may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] = state (field 3), f[1] = ppid, f[2] = pgrp, f[19] = starttime (field 22)
    Some(ProcStat {
        pid,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
        uid,
    })
}

/// The start time of this process (clock ticks after boot), for writing into our own lease.
pub fn own_start_time() -> u64 {
    // (pid, start): cached, and read again in a forked child.
    static CACHE: std::sync::Mutex<(u32, u64)> = std::sync::Mutex::new((0, 0));
    let pid = std::process::id();
    if let Ok(c) = CACHE.lock()
        && c.0 == pid
    {
        return c.1;
    }
    let start = stat(pid as i32)
        .ok()
        .flatten()
        .map(|s| s.start)
        .unwrap_or(0);
    if let Ok(mut c) = CACHE.lock() {
        *c = (pid, start);
    }
    start
}

/// One lock on a file's inode as /proc/locks lists it: granted, or a request blocked for it.
pub(crate) struct ProcLock {
    /// `FLOCK`, `POSIX` or `OFDLCK`.
    pub(crate) kind: String,
    /// `WRITE` (exclusive) or `READ`.
    pub(crate) exclusive: bool,
    /// The owning process; OFD locks show -1 (no process owns them).
    pub(crate) pid: i32,
    /// A request still waiting for the lock (a `->` line), not a lock held.
    pub(crate) blocked: bool,
}

/// Every lock held on, and every request blocked for, `file`'s inode, by /proc/locks (this
/// host's locks only).
pub(crate) fn proc_locks(file: &File) -> Vec<ProcLock> {
    proc_locks_read(file).unwrap_or_default()
}

/// As [`proc_locks`], `None` when /proc/locks (or `file`) cannot be read at all. One read of
/// /proc/locks is not a snapshot: the kernel hands it out a page at a time and locks that come
/// and go between two pages shift the rest, so a lock can be skipped. Callers that must not
/// miss one test it another way, or check that the read shows a lock they know is held.
pub(crate) fn proc_locks_read(file: &File) -> Option<Vec<ProcLock>> {
    proc_locks_of(&[file])?.pop()
}

/// A /proc text file, whole, in as few reads as it allows: from a 16 KiB buffer, where std's
/// `read_to_string` starts at 32 bytes for a file whose size says 0 and grows it a system call
/// at a time (six reads for a short /proc/locks, each a walk of the kernel's lock list).
/// (Not `read_to_end` either: it first asks `statx` and `lseek` for a size /proc does not
/// know.)
/// Read into the buffer's spare capacity, never zeroed first.
fn read_whole(path: impl AsRef<std::path::Path>) -> io::Result<String> {
    let f = File::open(path)?;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity());
        }
        match rustix::io::read(&f, rustix::buffer::spare_capacity(&mut buf)) {
            Ok(0) => break,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// [`proc_locks_read`] for each of `files`, from one read of /proc/locks.
pub(crate) fn proc_locks_of(files: &[&File]) -> Option<Vec<Vec<ProcLock>>> {
    let ids = files
        .iter()
        .map(|f| {
            f.metadata().ok().map(|m| {
                (
                    nix::sys::stat::major(m.dev()),
                    nix::sys::stat::minor(m.dev()),
                    m.ino(),
                )
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let text = read_whole("/proc/locks").ok()?;
    // Most lines are other files' locks: skip them before splitting (a release looks here).
    let needles: Vec<String> = ids.iter().map(|(_, _, ino)| format!(":{ino} ")).collect();
    let mut out: Vec<Vec<ProcLock>> = ids.iter().map(|_| Vec::new()).collect();
    for line in text.lines() {
        if !needles.iter().any(|n| line.contains(n.as_str())) {
            continue;
        }
        // "1: FLOCK  ADVISORY  WRITE 1234 00:1f:5678 0 EOF", and for a request blocked
        // behind it "1: -> FLOCK  ADVISORY  WRITE 1240 00:1f:5678 0 EOF".
        let all: Vec<&str> = line.split_whitespace().collect();
        let blocked = all.get(1) == Some(&"->");
        let f = if blocked { &all[1..] } else { &all[..] };
        if f.len() < 6 {
            continue;
        }
        let mut dev = f[5].split(':');
        let (Some(a), Some(b), Some(i)) = (dev.next(), dev.next(), dev.next()) else {
            continue;
        };
        let id = (
            u64::from_str_radix(a, 16).ok(),
            u64::from_str_radix(b, 16).ok(),
            i.parse::<u64>().ok(),
        );
        for (k, (maj, min, ino)) in ids.iter().enumerate() {
            if id == (Some(*maj), Some(*min), Some(*ino)) {
                out[k].push(ProcLock {
                    kind: f[1].to_lowercase(),
                    exclusive: f[3] == "WRITE",
                    pid: f[4].parse().unwrap_or(-1),
                    blocked,
                });
            }
        }
    }
    Some(out)
}

/// Whether the open file description `file` itself holds an exclusive `flock(2)` (its
/// `/proc/self/fdinfo` entry lists the locks held through it: one small read, not the whole
/// of /proc/locks). `None` when it cannot be read.
pub(crate) fn holds_exclusive_flock(file: &File) -> Option<bool> {
    use std::os::fd::AsRawFd;
    let text = read_whole(format!("/proc/self/fdinfo/{}", file.as_raw_fd())).ok()?;
    Some(lists_exclusive_flock(&text))
}

/// Whether an fdinfo text lists an exclusive flock held through its description.
fn lists_exclusive_flock(fdinfo: &str) -> bool {
    fdinfo.lines().any(|l| {
        let mut w = l.split_whitespace();
        w.next() == Some("lock:") && {
            let rest: Vec<&str> = w.collect();
            rest.get(1) == Some(&"FLOCK") && rest.get(3) == Some(&"WRITE")
        }
    })
}

/// The processes (other than this one) that hold, through a descriptor of theirs, the
/// exclusive flock on `file`'s inode — whoever keeps a lock whose locker has exited (a process
/// it passed the descriptor to, or a child that inherited it; /proc/locks names only the
/// locker). Walks every readable `/proc/PID/fd`: only for naming someone in a message, never on
/// a path that decides anything.
pub(crate) fn exclusive_flock_keepers(file: &File) -> Vec<i32> {
    let Ok(m) = file.metadata() else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    let pids = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me);
    let mut out = Vec::new();
    for pid in pids {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let keeps = fds.flatten().any(|fd| {
            fs::metadata(fd.path()).is_ok_and(|f| (f.dev(), f.ino()) == (m.dev(), m.ino()))
                && read_whole(format!(
                    "/proc/{pid}/fdinfo/{}",
                    fd.file_name().to_string_lossy()
                ))
                .is_ok_and(|t| lists_exclusive_flock(&t))
        });
        if keeps {
            out.push(pid);
        }
    }
    out
}
