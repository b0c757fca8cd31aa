//! Processes on this host, as /proc tells them: is a recorded holder still the process it was,
//! who is left in its process group, and stopping a verified group.
//!
//! Owns: reading /proc/PID/stat (state, process group, start time), scanning for group members,
//! and the one place that sends SIGKILL to another job's processes. Must never: signal a process
//! that has not been verified against this host's /proc (PID, start time, owner, and kernel-held
//! evidence that it belongs to the job: see [`JobEvidence`]) — never on the word of a lease file
//! alone.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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

fn parse_stat(pid: i32, text: &str, uid: u32) -> Option<ProcStat> {
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

/// Whether a recorded process is still the one that was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// It exists with the recorded start time and is not a zombie.
    Alive,
    /// It is gone, a zombie, or its PID now belongs to another process; the reason says which.
    Dead(&'static str),
}

/// Checks a recorded (pid, start time) against /proc.
pub fn liveness(pid: i32, start: u64) -> Liveness {
    match stat(pid) {
        Ok(None) => Liveness::Dead("process gone"),
        Ok(Some(s)) if s.start != start => Liveness::Dead("PID reused by another process"),
        Ok(Some(s)) if s.is_dead() => Liveness::Dead("process is a zombie"),
        Ok(Some(_)) => Liveness::Alive,
        // /proc hidden from us: fall back to kill(0), where EPERM means it exists.
        Err(_) => match kill(Pid::from_raw(pid), None) {
            Err(nix::errno::Errno::ESRCH) => Liveness::Dead("process gone"),
            _ => Liveness::Alive,
        },
    }
}

/// The live (non-zombie) members of process group `pgid`, found by scanning /proc.
pub fn group_members(pgid: i32) -> Vec<ProcStat> {
    let mut out = Vec::new();
    if pgid <= 1 {
        return out;
    }
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(Some(s)) = stat(pid)
            && s.pgrp == pgid
            && !s.is_dead()
        {
            out.push(s);
        }
    }
    out
}

/// What /proc must show before leasehold signals a process on behalf of a lease: never the
/// word of the lease file alone.
///
/// A process belongs to the job of a lease when it runs under the lease's uid AND either
/// - its initial environment (`/proc/PID/environ`) holds `LEASEHOLD_LEASE_ID=<the lease id>`,
///   which `leasehold run` gives the command and every process it starts inherits; or
/// - it has the lock's mutex file open (`/proc/PID/fd`), as every lease holder keeps it open
///   for as long as it holds the lease (the kernel's word that it is a leasehold holder of this
///   very lock).
///
/// A forged or stale lease naming pid 1, or another user's process, fails both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEvidence {
    /// The lease id the job's processes carry in their environment.
    pub lease_id: String,
    /// The uid the lease was taken under.
    pub uid: u32,
    /// Device and inode of the lock's mutex file.
    pub mutex: Option<(u64, u64)>,
}

impl JobEvidence {
    /// Evidence for the lease `lease_id`/`uid` of the lock whose mutex file is `mutex`.
    pub fn new(lease_id: &str, uid: u32, mutex: &std::path::Path) -> JobEvidence {
        JobEvidence {
            lease_id: lease_id.to_string(),
            uid,
            mutex: fs::metadata(mutex).ok().map(|m| (m.dev(), m.ino())),
        }
    }

    /// `Ok` when `p` provably belongs to the job; otherwise why not.
    pub fn check(&self, p: &ProcStat) -> Result<(), String> {
        if p.uid != self.uid {
            return Err(format!(
                "pid {} runs as uid {}, not the lease's uid {}",
                p.pid, p.uid, self.uid
            ));
        }
        if self.carries_lease_id(p.pid) || self.holds_mutex_open(p.pid) {
            return Ok(());
        }
        Err(format!(
            "pid {} carries neither LEASEHOLD_LEASE_ID={} nor an open lock file: not this job's",
            p.pid, self.lease_id
        ))
    }

    fn carries_lease_id(&self, pid: i32) -> bool {
        let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
            return false;
        };
        let want = format!("LEASEHOLD_LEASE_ID={}", self.lease_id);
        env.split(|b| *b == 0).any(|v| v == want.as_bytes())
    }

    fn holds_mutex_open(&self, pid: i32) -> bool {
        let Some((dev, ino)) = self.mutex else {
            return false;
        };
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.flatten()
            .any(|fd| fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino))
    }
}

/// The live members of process group `pgid` that provably belong to the job.
pub fn job_members(pgid: i32, ev: &JobEvidence) -> Vec<ProcStat> {
    group_members(pgid)
        .into_iter()
        .filter(|m| ev.check(m).is_ok())
        .collect()
}

/// SIGKILLs, one by one, every live member of process group `pgid` that provably belongs to the
/// job (see [`JobEvidence`]), until none is left or `wait` passes. Members that do not belong
/// to it are never signalled. Returns how many processes were stopped.
pub fn kill_group_verified(pgid: i32, ev: &JobEvidence, wait: Duration) -> Result<usize, String> {
    let deadline = Instant::now() + wait;
    let mut killed = std::collections::HashSet::new();
    loop {
        let members = job_members(pgid, ev);
        if members.is_empty() {
            return Ok(killed.len());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "process group {pgid} still has {} live process(es) {wait:?} after SIGKILL",
                members.len()
            ));
        }
        for m in &members {
            // Re-read right before signalling: same pid, same start time, still in the group.
            if let Ok(Some(now)) = stat(m.pid)
                && now.start == m.start
                && now.pgrp == pgid
                && !now.is_dead()
            {
                match kill(Pid::from_raw(m.pid), Signal::SIGKILL) {
                    Ok(()) | Err(nix::errno::Errno::ESRCH) => {
                        killed.insert((m.pid, m.start));
                    }
                    Err(e) => return Err(format!("cannot signal pid {}: {e}", m.pid)),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// SIGKILLs one process that provably belongs to the job (pid and start time as recorded, and
/// [`JobEvidence::check`]) and waits for it to be gone or a zombie.
pub fn kill_verified(pid: i32, start: u64, ev: &JobEvidence, wait: Duration) -> Result<(), String> {
    match stat(pid) {
        Ok(Some(s)) if s.start == start && !s.is_dead() => ev.check(&s)?,
        Ok(_) => return Ok(()),
        Err(e) => return Err(format!("cannot inspect pid {pid}: {e}")),
    }
    kill_checked(pid, start, wait)
}

/// SIGKILLs `pid` if it still has start time `start`, and waits for it to be gone or a zombie.
/// Callers must have verified it first.
pub(crate) fn kill_checked(pid: i32, start: u64, wait: Duration) -> Result<(), String> {
    match stat(pid) {
        Ok(Some(s)) if s.start == start && !s.is_dead() => {}
        Ok(_) => return Ok(()),
        Err(e) => return Err(format!("cannot inspect pid {pid}: {e}")),
    }
    match kill(Pid::from_raw(pid), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => return Err(format!("cannot signal pid {pid}: {e}")),
    }
    let deadline = Instant::now() + wait;
    while liveness(pid, start) == Liveness::Alive {
        if Instant::now() >= deadline {
            return Err(format!("pid {pid} still alive {wait:?} after SIGKILL"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comm_with_parens_and_spaces() {
        let t = "42 (a) b (c) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
        let s = parse_stat(42, t, 0).unwrap();
        assert_eq!((s.state, s.ppid, s.pgrp, s.start), ('S', 1, 42, 12345));
        assert_eq!(parse_stat(1, "garbage", 0), None);
    }

    #[test]
    fn own_process_is_alive_and_reuse_is_detected() {
        let me = std::process::id() as i32;
        let start = own_start_time();
        assert_eq!(liveness(me, start), Liveness::Alive);
        assert!(matches!(liveness(me, start + 1), Liveness::Dead(_)));
    }
}
