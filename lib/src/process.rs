//! Processes on this host, as /proc tells them: is a recorded holder still the process it was,
//! who is left in its process group, and stopping a verified group.
//!
//! Owns: judging what /proc/PID/stat says (read and parsed in `os/linux/procfs.rs`, re-exported
//! here as [`stat`] and [`ProcStat`]), scanning for group members
//! and for the processes carrying a job's environment anywhere, the evidence that a process
//! belongs to one lock's job (belongs / does not / cannot tell), and the one place that signals
//! another job's processes (SIGKILL; SIGTERM and SIGCONT for the guardian's grace). Must never: signal a process
//! that has not been verified against this host's /proc (PID, start time, owner, and kernel-held
//! evidence bound to this very lock that it belongs to the job: see [`JobEvidence`]) — never on
//! the word of a lease file alone; signal this process, its ancestors or its own process group;
//! call a process "not this job's" when its /proc entries could not be read.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::sys::signal::kill;
use nix::unistd::Pid;

#[cfg(test)]
use crate::os::linux::procfs::parse_stat;
pub use crate::os::linux::procfs::{ProcStat, own_start_time, stat};

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

/// Bits of the `flags:` line of /proc/PID/fdinfo/N (octal) that mark an `O_PATH` descriptor.
const O_PATH_FLAG: u32 = 0o10_000_000;

/// What /proc says about whether one process belongs to the job of a lease on one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// The kernel says it belongs to this lock's job (and it may be signalled, once its start
    /// time and process group have been checked against the lease).
    Belongs,
    /// The kernel says it does not: why. Never signalled, never waited for.
    NotOurs(String),
    /// It cannot be told (its /proc entries are unreadable to us), or it belongs but must never
    /// be signalled by us (ourselves, an ancestor of ours, our own process group, another uid):
    /// why. Never signalled; a takeover that would leave it running is refused.
    Unknown(String),
}

/// What /proc must show before leasehold signals a process on behalf of a lease: never the
/// word of the lease file alone, and only evidence bound to *this* lock.
///
/// A process belongs to the job of a lease when
/// - its initial environment (`/proc/PID/environ`) holds both `LEASEHOLD_LOCK=<this lock's
///   absolute path>` and `LEASEHOLD_LEASE_ID=<the lease id>`, which `leasehold run` gives the
///   command and every process it starts inherits (a lease copied from another lock names that
///   lock's id, but its job carries the other lock's path); or
/// - it holds an `O_PATH` descriptor on this lock's mutex file (`/proc/PID/fd` on the mutex's
///   device and inode, `/proc/PID/fdinfo` flags with `O_PATH`), which a lease holder keeps for
///   exactly as long as it holds the lease, and nothing else opens (waiters keep the mutex
///   open too, but never `O_PATH`), closed on exec.
///
/// and it runs under the lease's uid. Even then it is never signalled when it is the calling
/// process or one of its ancestors ([`Evidence::Unknown`]), nor as a member of the caller's
/// own process group ([`judge_group`]).
/// When /proc cannot be read (another user's process, as non-root), the answer is
/// [`Evidence::Unknown`], never "not this job's". A forged lease naming pid 1, or another
/// user's process, or a copied lease, gets [`Evidence::NotOurs`] or [`Evidence::Unknown`]:
/// a refusal at most, never a signal.
///
/// Callers check the rest against the lease before signalling: a recorded process's start
/// time, a group member's process group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEvidence {
    /// The lease id the job's processes carry in their environment.
    pub lease_id: String,
    /// The uid the lease was taken under.
    pub uid: u32,
    /// The lock's absolute path, as the job's processes carry it in `LEASEHOLD_LOCK`.
    pub lock: std::path::PathBuf,
    /// Device and inode of the lock's mutex file (or of a keeper's badge:
    /// [`JobEvidence::with_holder_mark`]), on which a holder keeps its `O_PATH` mark.
    pub mutex: Option<(u64, u64)>,
    /// Processes never signalled: this one and its ancestors.
    protected: Vec<i32>,
    /// This process's own process group, never signalled.
    own_group: Option<i32>,
    /// Script mode: the job's process named by a lease file its own uid (or root) wrote.
    trusted_child: Option<(i32, u64)>,
}

impl JobEvidence {
    /// Evidence for the lease `lease_id`/`uid` of the lock `lock`, whose mutex file is `mutex`.
    /// The mutex file counts only if it is `lock`'s own (its identity line names LOCK: a mutex
    /// file renamed here from another lock is no evidence for this one).
    pub fn new(lease_id: &str, uid: u32, lock: &Path, mutex: &Path) -> JobEvidence {
        use std::os::unix::fs::OpenOptionsExt;
        let id = fs::OpenOptions::new()
            .read(true)
            .custom_flags(
                nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits(),
            )
            .open(mutex)
            .ok()
            .zip(lock.file_name())
            .and_then(|(f, name)| crate::mutex::bound_file_id(&f, name));
        JobEvidence::with_mutex(lease_id, uid, lock.to_path_buf(), id)
    }

    /// Evidence for the lease `lease_id`/`uid` of the lock of `paths`, its mutex file stated
    /// through LOCK's directory descriptor.
    pub(crate) fn for_lock(
        lease_id: &str,
        uid: u32,
        paths: &crate::paths::LockPaths,
    ) -> JobEvidence {
        let id = crate::mutex::bound_id(paths);
        JobEvidence::with_mutex(lease_id, uid, paths.lock.clone(), id)
    }

    /// Evidence for the lease `lease_id`/`uid` of a lock whose mutex file is not consulted (an
    /// etcd lock, named by its URL; `leasehold run`'s guardian, which stops only the job's
    /// processes): only the environment binds a process to its job.
    pub fn by_environment(lease_id: &str, uid: u32, lock: &Path) -> JobEvidence {
        JobEvidence::with_mutex(lease_id, uid, lock.to_path_buf(), None)
    }

    /// The one constructor: the caller's own process, ancestors and group are never signalled.
    fn with_mutex(
        lease_id: &str,
        uid: u32,
        lock: std::path::PathBuf,
        mutex: Option<(u64, u64)>,
    ) -> JobEvidence {
        let me = std::process::id() as i32;
        JobEvidence {
            lease_id: lease_id.to_string(),
            uid,
            lock,
            mutex,
            protected: self_and_ancestors(),
            own_group: stat(me).ok().flatten().map(|s| s.pgrp),
            trusted_child: None,
        }
    }

    /// The holder's mark is an `O_PATH` descriptor on the file `(dev, ino)` rather than on the
    /// lock's mutex file: a script-mode keeper's badge ([`crate::keeper_badge`]), for a lock
    /// with no directory of its own (etcd, S3), whose holder is verified by it as a lock file's
    /// is by its mark ([`JobEvidence::check_holder`]).
    ///
    /// ```
    /// use leasehold::process::JobEvidence;
    /// let ev = JobEvidence::by_environment("ab12", 1000, "s3://bucket/key".as_ref())
    ///     .with_holder_mark((1, 2));
    /// assert_eq!(ev.mutex, Some((1, 2)));
    /// ```
    pub fn with_holder_mark(mut self, id: (u64, u64)) -> JobEvidence {
        self.mutex = Some(id);
        self
    }

    /// Script mode: the process `pid` with start time `start` belongs to the job too, though
    /// its environment carries nothing (a script that took the lease with `leasehold lock`).
    /// Only for a lease read from a file that the lease's uid (or root) wrote and nobody else
    /// may write (PROTOCOL.md §10); it still must run under the lease's uid, and a process with
    /// a controlling terminal is never signalled ([`Evidence::Unknown`]).
    pub fn with_trusted_child(mut self, pid: i32, start: u64) -> JobEvidence {
        self.trusted_child = Some((pid, start));
        self
    }

    /// Whether `p` belongs to the job (see [`JobEvidence`]).
    pub fn check(&self, p: &ProcStat) -> Evidence {
        if self.trusted_child == Some((p.pid, p.start)) {
            return self.check_trusted_child(p);
        }
        let env = self.carries_lease(p.pid);
        let fd = self.holds_holder_fd(p.pid);
        if matches!(env, Ok(true)) || matches!(fd, Ok(true)) {
            if p.uid != self.uid {
                return Evidence::Unknown(format!(
                    "pid {} carries this lease's evidence but runs as uid {}, not the lease's uid {}",
                    p.pid, p.uid, self.uid
                ));
            }
            if self.protected.contains(&p.pid) {
                return Evidence::Unknown(format!(
                    "pid {} is this process or one of its ancestors: never signalled",
                    p.pid
                ));
            }
            return Evidence::Belongs;
        }
        if p.uid != self.uid {
            return Evidence::NotOurs(format!(
                "pid {} runs as uid {}, not the lease's uid {}",
                p.pid, p.uid, self.uid
            ));
        }
        if let Err(why) = env.and(fd) {
            return Evidence::Unknown(why);
        }
        Evidence::NotOurs(format!(
            "pid {} carries neither LEASEHOLD_LOCK={} with LEASEHOLD_LEASE_ID={} nor a holder's descriptor on this lock",
            p.pid,
            self.lock.display(),
            self.lease_id
        ))
    }

    /// The script named by a trusted script-mode lease: ours if it runs under the lease's uid,
    /// is not us or an ancestor, and has no controlling terminal.
    fn check_trusted_child(&self, p: &ProcStat) -> Evidence {
        if p.uid != self.uid {
            return Evidence::NotOurs(format!(
                "pid {} runs as uid {}, not the lease's uid {}",
                p.pid, p.uid, self.uid
            ));
        }
        if self.protected.contains(&p.pid) {
            return Evidence::Unknown(format!(
                "pid {} is this process or one of its ancestors: never signalled",
                p.pid
            ));
        }
        match controlling_tty(p.pid) {
            None => Evidence::Belongs,
            Some(_) => Evidence::Unknown(format!(
                "pid {} holds the lock in script mode from a terminal, and leasehold never signals a shell at a terminal: run leasehold unlock in it, or end it",
                p.pid
            )),
        }
    }

    /// Whether `pid`'s initial environment (`/proc/PID/environ`) carries this lock's path and
    /// the lease id: a process the job started (script mode's `unlock` asks this of whoever asks
    /// the keeper to release). False when it cannot be read.
    pub fn carried_by(&self, pid: i32) -> bool {
        matches!(self.carries_lease(pid), Ok(true))
    }

    /// Whether /proc/PID/environ holds this lock's path and the lease id.
    fn carries_lease(&self, pid: i32) -> Result<bool, String> {
        let path = format!("/proc/{pid}/environ");
        let env = fs::read(&path).map_err(|e| unreadable(&path, &e))?;
        if env.is_empty() {
            // A process in the middle of execve shows an empty environment for a moment (the
            // kernel sets up the new one after it shows the new executable), and so does one
            // started with `env -i`: neither is proof that it is not the job's.
            return Err(format!(
                "{path} is empty (the process is starting a program, or cleared its environment)"
            ));
        }
        let mut want_lock = b"LEASEHOLD_LOCK=".to_vec();
        want_lock.extend_from_slice(self.lock.as_os_str().as_bytes());
        let want_id = format!("LEASEHOLD_LEASE_ID={}", self.lease_id);
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        Ok(vars.contains(&want_lock.as_slice()) && vars.contains(&want_id.as_bytes()))
    }

    /// Whether the process holds an `O_PATH` descriptor on this lock's mutex file.
    fn holds_holder_fd(&self, pid: i32) -> Result<bool, String> {
        self.mutex_fds(pid).map(|f| f.mark)
    }

    /// Which descriptors on this lock's mutex file the process holds.
    fn mutex_fds(&self, pid: i32) -> Result<MutexFds, String> {
        let mut out = MutexFds::default();
        let Some((dev, ino)) = self.mutex else {
            return Ok(out);
        };
        let dir = format!("/proc/{pid}/fd");
        let fds = fs::read_dir(&dir).map_err(|e| unreadable(&dir, &e))?;
        for fd in fds {
            let fd = fd.map_err(|e| unreadable(&dir, &e))?;
            let Ok(m) = fs::metadata(fd.path()) else {
                continue; // closed meanwhile, or a descriptor stat cannot follow
            };
            if (m.dev(), m.ino()) != (dev, ino) {
                continue;
            }
            let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
            let text = fs::read_to_string(&info).map_err(|e| unreadable(&info, &e))?;
            let flags = text
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok());
            match flags {
                Some(f) if f & O_PATH_FLAG != 0 => out.mark = true,
                _ => out.plain = true,
            }
        }
        Ok(out)
    }

    /// Whether `p`, named as a lease's *holder* (`holder.pid`: the `leasehold run` wrapper or
    /// the library user), is a holder of this lock. Its evidence is its holder's mark: a holder
    /// keeps it from before its lease is visible until after its release, so when its
    /// descriptors can be read and none is on this lock's mutex file, it is not this lock's
    /// holder — whether or not its environment can be read (pid 1's often cannot, even by
    /// root in a container). A process with the mutex file open but no mark (a waiting
    /// contender, or a holder of an older leasehold) cannot be told.
    pub fn check_holder(&self, p: &ProcStat) -> Evidence {
        let fds = match self.mutex_fds(p.pid) {
            Ok(f) => f,
            Err(_) => return self.check(p),
        };
        if fds.mark {
            return self.check(p);
        }
        match self.check(p) {
            Evidence::Belongs => Evidence::Belongs,
            // It carries the lease, but must not be signalled by us (ourselves, another uid).
            Evidence::Unknown(why) if self.carries_lease(p.pid).is_ok() => Evidence::Unknown(why),
            _ if fds.plain => Evidence::Unknown(format!(
                "pid {} has this lock's mutex file open but holds no holder's mark on it: a waiting contender, or a holder of an older leasehold",
                p.pid
            )),
            e @ Evidence::NotOurs(_) => e,
            Evidence::Unknown(_) => Evidence::NotOurs(format!(
                "pid {} holds no descriptor on this lock's mutex file",
                p.pid
            )),
        }
    }
}

/// The descriptors one process holds on a lock's mutex file.
#[derive(Debug, Default, Clone, Copy)]
struct MutexFds {
    /// An `O_PATH` one: a holder's mark.
    mark: bool,
    /// Any other (a waiter's kept mutex file, or an older leasehold's holder).
    plain: bool,
}

/// Why a /proc file could not be read, as a person needs it.
fn unreadable(path: &str, e: &io::Error) -> String {
    let uid = nix::unistd::geteuid().as_raw();
    if e.kind() == io::ErrorKind::PermissionDenied {
        format!("{path} is not readable as uid {uid}")
    } else {
        format!("{path} cannot be read as uid {uid}: {e}")
    }
}

/// This process and its ancestors (walking ppid up to pid 1), which leasehold never signals.
fn self_and_ancestors() -> Vec<i32> {
    let mut out = vec![std::process::id() as i32];
    let mut pid = out[0];
    // Bounded: a pid chain cannot be longer than the pid space, but /proc could change under us.
    for _ in 0..4096 {
        match stat(pid) {
            Ok(Some(s)) if s.ppid > 0 && !out.contains(&s.ppid) => {
                out.push(s.ppid);
                pid = s.ppid;
            }
            _ => break,
        }
    }
    out
}

/// Whether `pid` is this process or one of its ancestors.
pub fn is_self_or_ancestor(pid: i32) -> bool {
    self_and_ancestors().contains(&pid)
}

/// The live members of one process group, sorted by what /proc says of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupEvidence {
    /// Members that provably belong to the job.
    pub belongs: Vec<ProcStat>,
    /// Members that cannot be checked (or must never be signalled by us), with why.
    pub unknown: Vec<(ProcStat, String)>,
    /// How many members provably do not belong to it.
    pub not_ours: usize,
}

impl GroupEvidence {
    /// One line on the members that cannot be checked, for a refusal: who they are, why, and
    /// what the operator can do. `None` when every member could be checked.
    pub fn unknown_line(&self, pgid: i32, user_of_lease: &str) -> Option<String> {
        let (p, why) = self.unknown.first()?;
        let me = nix::unistd::geteuid().as_raw();
        let more = match self.unknown.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        Some(format!(
            "pid {} (uid {} {user_of_lease}) in the old job's process group {pgid} cannot be checked{more}: {why}; check it as root{}, stop it, or break the lease by force",
            p.pid,
            p.uid,
            if me == p.uid {
                String::new()
            } else {
                format!(" or as {user_of_lease}")
            }
        ))
    }
}

/// The live members of process group `pgid`, judged by `ev`.
///
/// Our own process group is never signalled as a group: a lease naming it (forged, or our own
/// job's, when a job contends for its own lock) gets its members judged "cannot be checked"
/// at best. (One recorded holder that happens to share our group, verified by its holder's
/// mark, may still be stopped on its own: see [`kill_verified`].)
pub fn judge_group(pgid: i32, ev: &JobEvidence) -> GroupEvidence {
    let mut out = GroupEvidence::default();
    for m in group_members(pgid) {
        match ev.check(&m) {
            Evidence::Belongs if Some(m.pgrp) == ev.own_group => {
                let why = format!(
                    "pid {} is in this process's own process group {}: never signalled",
                    m.pid, m.pgrp
                );
                out.unknown.push((m, why));
            }
            Evidence::Belongs => out.belongs.push(m),
            Evidence::NotOurs(_) => out.not_ours += 1,
            // A member that exited while it was being checked (its /proc files vanished:
            // ESRCH) is gone, not unknown; only one still there, same start time, is. One in the
            // middle of its exit has lost its environment (ESRCH) while /proc/PID/stat still
            // shows it running for a moment: it is given that moment to become a zombie.
            Evidence::Unknown(_) if !still_there_after_exit(&m) => {}
            Evidence::Unknown(why) => out.unknown.push((m, why)),
        }
    }
    out
}

/// Whether `m` is still the live process it was when listed.
fn still_there(m: &ProcStat) -> bool {
    matches!(stat(m.pid), Ok(Some(s)) if s.start == m.start && !s.is_dead())
}

/// Whether `m` is still there once a process in the middle of its exit would have finished it
/// (at most [`EXIT_SETTLES`]): asked only of a member that could not be checked, so a member
/// that stays unchecked costs that wait once, on a refusal's way.
fn still_there_after_exit(m: &ProcStat) -> bool {
    let until = std::time::Instant::now() + EXIT_SETTLES;
    loop {
        if !still_there(m) {
            return false;
        }
        if std::time::Instant::now() >= until {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// How long a process that has lost its address space (its environment reads ESRCH) may take to
/// become a zombie; measured in microseconds, bounded generously for a loaded host.
const EXIT_SETTLES: std::time::Duration = std::time::Duration::from_millis(100);

/// The live processes anywhere on this host, in any process group, that carry the job's
/// environment ([`JobEvidence::carried_by`]: this lock's path and this lease id) and were
/// started at or after `since` (the recorded command's start time: its descendants cannot be
/// older), run under the lease's uid, and may be signalled by us (not this process, an ancestor
/// or our own process group). What a command left running outside its group (`setsid`, a
/// daemon) is found here; only the environment counts, never a holder's mark, which any holder
/// of the lock (not only this lease's) keeps.
pub fn job_carriers(ev: &JobEvidence, since: u64) -> Vec<ProcStat> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(Some(s)) = stat(pid) else { continue };
        // Cheap filters first: the environment is read only for the lease's uid's processes
        // younger than the command.
        if s.is_dead() || s.start < since || s.uid != ev.uid || Some(s.pgrp) == ev.own_group {
            continue;
        }
        if ev.carried_by(pid) && ev.check(&s) == Evidence::Belongs {
            out.push(s);
        }
    }
    out
}

/// The live members of process group `pgid` that provably belong to the job.
pub fn job_members(pgid: i32, ev: &JobEvidence) -> Vec<ProcStat> {
    judge_group(pgid, ev).belongs
}

mod kill;
mod script;

pub(crate) use kill::kill_checked;
pub use kill::{kill_carriers_verified, kill_group_verified, kill_verified, signal_carriers};
pub use script::{cmdline, controlling_tty, descends_from, terminal_path, tty_name};

#[cfg(test)]
mod tests;
