//! Starting the command: fork from the supervising thread, the child held back at a gate until
//! the lease names it, PDEATHSIG, and exec.
//!
//! Owns: everything the child needs built before the fork (program, argv, environment with
//! room for `LEASEHOLD_LOCK`/`LEASEHOLD_TOKEN`/`LEASEHOLD_LEASE_ID`, which the gate message
//! fills in, signals to reset), the fork itself, the child's side between fork and exec (own
//! process group, `PR_SET_PDEATHSIG` = SIGKILL, parent check, the gate), opening the gate only
//! once the lease names the child, and reading back a failed exec (127 not found, 126 cannot
//! run).
//! Must never: let the command run a single instruction of its own before the lease records its
//! pid, start time and process group; or allocate or take a lock between `fork` and `exec`.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::libc;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid, fork, getpid, pipe2, setpgid};

use leasehold::process;
use leasehold::{Error, LeaseGuard, Result};

use super::fence::{fence_unstarted, loss_text};
use super::signals::LOST;
use super::{Job, NotStarted, Outcome, Supervisor, io_error};

/// What [`Supervisor::spawn`] left: a running command, or how it ended without running.
pub(super) enum Started {
    Running(Pid),
    Done(Outcome),
}

/// The forked child, held at the gate, with the wrapper's ends of its two pipes.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) child: Pid,
    /// Its start time (/proc/PID/stat), as the lease records it.
    pub(super) start: u64,
    /// Writing the gate message opens the gate; closing it unwritten makes the child exit.
    go_tx: OwnedFd,
    /// EOF once exec succeeded; four bytes (an errno) when it failed.
    err_rx: OwnedFd,
    /// The program, for messages.
    program: PathBuf,
}

impl Held {
    /// Forks `job` held at its gate, and reads its start time. `forwarded`: the signals whose
    /// handlers are installed now (the child resets them). `lock` names the lock in messages.
    pub(super) fn fork(lock: &Path, job: &Job, forwarded: &[Signal]) -> Result<Held> {
        let p = Prepared::new(lock, job, forwarded)?;
        let (child, go_tx, err_rx) = fork_held(lock, &p)?;
        let start = match start_time(lock, child) {
            Ok(s) => s,
            Err(e) => {
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Err(e);
            }
        };
        Ok(Held {
            child,
            start,
            go_tx,
            err_rx,
            program: p.program,
        })
    }

    /// Lets the child go without running the command: it reads EOF at its gate and exits; then
    /// it is reaped.
    pub(super) fn abandon(self) {
        let child = self.child;
        drop(self);
        let _ = waitpid(child, None);
    }
}

impl Supervisor {
    /// Starts the command held at its gate — forked by [`Supervisor::prepare`] before the lease
    /// was taken (the lease names it already), or now, recorded with a second write
    /// ([`LeaseGuard::set_child`]) — and lets it exec.
    pub(super) fn spawn(&mut self, guard: &LeaseGuard, job: &Job) -> Result<Started> {
        let lock = guard.path();
        let held = match self.held.take() {
            Some(h) => h,
            None => {
                self.start_guardian(lock)?;
                Held::fork(lock, job, &self.forwarded)?
            }
        };
        let child = held.child;
        let abort = |why: Error| -> Result<Started> {
            let _ = kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            Err(why)
        };
        let h = guard.lease().holder;
        let named = h.child_pid == Some(child.as_raw())
            && h.child_start == Some(held.start)
            && h.pgid == Some(child.as_raw());
        if !named && let Err(e) = guard.set_child(child.as_raw(), held.start, child.as_raw()) {
            if let Error::Lost { why, .. } = &e {
                return Ok(Started::Done(fence_unstarted(child, why)));
            }
            return abort(e);
        }
        if guard.is_lost() || LOST.load(Ordering::Acquire) {
            return Ok(Started::Done(fence_unstarted(child, loss_text(guard))));
        }
        // The guardian stops the job if we die without ending it: armed before the gate opens.
        if let (Some(g), false) = (&self.guardian, self.armed)
            && let Err(e) = g.arm(guard, held.start)
        {
            return abort(e);
        }
        if let Some(t) = &self.tty
            && !t.give(child)
        {
            self.tty = None;
        }
        // Open the gate: the message carries what the child's environment lacked.
        let msg = match gate_message(guard) {
            Ok(m) => m,
            Err(e) => return abort(e),
        };
        let opened = write_all(&held.go_tx, &msg);
        drop(held.go_tx);
        if let Err(e) = opened {
            return abort(io_error(lock, "start the command", e.into()));
        }
        match exec_failure(&held.err_rx) {
            Some(errno) => {
                let _ = waitpid(child, None);
                Ok(Started::Done(Outcome::NotStarted(cannot_run(
                    &held.program,
                    errno,
                ))))
            }
            None => Ok(Started::Running(child)),
        }
    }
}

/// Room for `LEASEHOLD_TOKEN`'s value (a u64 in decimal) and its NUL.
const TOKEN_ROOM: usize = 21;
/// Room for `LEASEHOLD_LEASE_ID`'s value (32 hex digits today) and its NUL.
const ID_ROOM: usize = 65;
/// Room for `LEASEHOLD_LOCK`'s value (an absolute path) and its NUL.
const LOCK_ROOM: usize = libc::PATH_MAX as usize;
/// Room for each `LEASEHOLD_PREVIOUS*` value (`crate::cli::previous::PREVIOUS`), in order.
const PREVIOUS_ROOMS: [usize; 5] = [16, 12, 256, 21, 40];
/// The gate message: the values, each NUL-padded to its room, in this order.
const GATE_LEN: usize = TOKEN_ROOM
    + ID_ROOM
    + LOCK_ROOM
    + PREVIOUS_ROOMS[0]
    + PREVIOUS_ROOMS[1]
    + PREVIOUS_ROOMS[2]
    + PREVIOUS_ROOMS[3]
    + PREVIOUS_ROOMS[4];
/// How many variables the gate fills in.
const GATED: usize = 3 + PREVIOUS_ROOMS.len();

/// The gate message for `guard`'s lease: token, lease id and LOCK path, then how the holding
/// before ended (`LEASEHOLD_PREVIOUS*`), each NUL-padded (a value longer than its room is cut:
/// a host name is at most 255 bytes, the others are short).
fn gate_message(guard: &LeaseGuard) -> Result<Vec<u8>> {
    let mut msg = vec![0u8; GATE_LEN];
    let mut at = TOKEN_ROOM + ID_ROOM + LOCK_ROOM;
    for ((_, v), room) in crate::cli::previous::previous_env(guard)
        .iter()
        .zip(PREVIOUS_ROOMS)
    {
        let v: Vec<u8> = v.bytes().filter(|b| *b != 0).take(room - 1).collect();
        msg[at..at + v.len()].copy_from_slice(&v);
        at += room;
    }
    let token = guard.token().to_string();
    let id = guard.lease_id();
    let lock = guard.path().as_os_str().as_bytes();
    let fits = |v: &[u8], room: usize| v.len() < room && !v.contains(&0);
    if !fits(id.as_bytes(), ID_ROOM) || !fits(lock, LOCK_ROOM) {
        return Err(io_error(
            guard.path(),
            "start the command",
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the lock's path or lease id is too long for the command's environment",
            ),
        ));
    }
    msg[..token.len()].copy_from_slice(token.as_bytes());
    msg[TOKEN_ROOM..TOKEN_ROOM + id.len()].copy_from_slice(id.as_bytes());
    msg[TOKEN_ROOM + ID_ROOM..TOKEN_ROOM + ID_ROOM + lock.len()].copy_from_slice(lock);
    Ok(msg)
}

/// Writes all of `buf` to `fd`.
fn write_all(fd: &OwnedFd, mut buf: &[u8]) -> nix::Result<()> {
    while !buf.is_empty() {
        match nix::unistd::write(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates the gate and exec-status pipes and forks, all signals blocked across the fork; the
/// child goes to [`child_after_fork`] and never returns here.
fn fork_held(lock: &Path, p: &Prepared) -> Result<(Pid, OwnedFd, OwnedFd)> {
    let (go_rx, go_tx) = pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| io_error(lock, "create the start gate pipe", e.into()))?;
    let (err_rx, err_tx) = pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| io_error(lock, "create the exec status pipe", e.into()))?;
    let parent = getpid();
    let old_mask = SigSet::all()
        .thread_swap_mask(SigmaskHow::SIG_SETMASK)
        .map_err(|e| io_error(lock, "block signals", e.into()))?;
    // SAFETY: the child only makes async-signal-safe system calls on memory prepared before
    // the fork, then execs or _exits (see `child_after_fork`).
    let forked = unsafe { fork() };
    let child = match forked {
        Ok(ForkResult::Child) => {
            // SAFETY: we are the freshly forked child.
            unsafe {
                child_after_fork(
                    p,
                    parent,
                    go_rx.as_raw_fd(),
                    go_tx.as_raw_fd(),
                    err_rx.as_raw_fd(),
                    err_tx.as_raw_fd(),
                )
            }
        }
        Ok(ForkResult::Parent { child }) => {
            let _ = old_mask.thread_set_mask();
            child
        }
        Err(e) => {
            let _ = old_mask.thread_set_mask();
            return Err(io_error(lock, "fork the command", e.into()));
        }
    };
    drop(go_rx);
    drop(err_tx);
    // Both sides set the group, so it is in place whichever runs first.
    let _ = setpgid(child, child);
    Ok((child, go_tx, err_rx))
}

/// The held child's start time, as recorded in the lease.
fn start_time(lock: &Path, child: Pid) -> Result<u64> {
    match process::stat(child.as_raw()) {
        Ok(Some(s)) => Ok(s.start),
        Ok(None) => Err(io_error(
            lock,
            "read the command's start time",
            io::Error::from(io::ErrorKind::NotFound),
        )),
        Err(e) => Err(io_error(lock, "read the command's start time", e)),
    }
}

/// Reads the exec-status pipe: EOF means exec succeeded (`None`); four bytes are the errno of a
/// failed exec.
fn exec_failure(err_rx: &OwnedFd) -> Option<Errno> {
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < buf.len() {
        match nix::unistd::read(err_rx, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    (got == buf.len()).then(|| Errno::from_raw(i32::from_ne_bytes(buf)))
}

/// Why a failed exec did not start the command: 127 when the program is gone, 126 otherwise.
fn cannot_run(program: &Path, errno: Errno) -> NotStarted {
    let code = if errno == Errno::ENOENT { 127 } else { 126 };
    NotStarted {
        code,
        why: format!(
            "cannot run {}: {}",
            leasehold::text::escape_path(program),
            errno.desc()
        ),
    }
}

/// Everything the child needs between fork and exec, built beforehand: the child must not
/// allocate. `LEASEHOLD_TOKEN`, `LEASEHOLD_LEASE_ID` and `LEASEHOLD_LOCK` are known only once
/// the lease is taken: their values are zero-filled room that the child fills in from the gate
/// message (its own copy of this memory).
pub(super) struct Prepared {
    program: PathBuf,
    c_program: CString,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    /// `KEY=` followed by zeroed room for the value (and one more NUL), for the three.
    _ours: Vec<Vec<u8>>,
    /// Where each gated value goes, and its room, in gate-message order.
    slots: [(*mut u8, usize); GATED],
    envp_ptrs: Vec<*const libc::c_char>,
    reset: Vec<libc::c_int>,
}

impl Prepared {
    pub(super) fn new(lock: &Path, job: &Job, forwarded: &[Signal]) -> Result<Prepared> {
        let nul = |what: &str| {
            io_error(
                lock,
                "prepare the command",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} contains a NUL byte"),
                ),
            )
        };
        let cstr = |s: &OsStr, what: &str| CString::new(s.as_bytes()).map_err(|_| nul(what));
        let c_program = cstr(job.program.as_os_str(), "the program path")?;
        let argv = job
            .argv
            .iter()
            .map(|a| cstr(a, "an argument"))
            .collect::<Result<Vec<_>>>()?;
        // In gate-message order.
        let [p0, p1, p2, p3, p4] = crate::cli::previous::PREVIOUS;
        let [r0, r1, r2, r3, r4] = PREVIOUS_ROOMS;
        let ours = [
            ("LEASEHOLD_TOKEN", TOKEN_ROOM),
            ("LEASEHOLD_LEASE_ID", ID_ROOM),
            ("LEASEHOLD_LOCK", LOCK_ROOM),
            (p0, r0),
            (p1, r1),
            (p2, r2),
            (p3, r3),
            (p4, r4),
        ];
        let mut envp = Vec::new();
        for (k, v) in std::env::vars_os() {
            if ours.iter().any(|(n, _)| OsStr::new(n) == k) {
                continue;
            }
            let mut kv = k.clone();
            kv.push("=");
            kv.push(&v);
            envp.push(cstr(&kv, "an environment variable")?);
        }
        let mut own: Vec<Vec<u8>> = ours
            .iter()
            .map(|(k, room)| {
                let mut kv = format!("{k}=").into_bytes();
                kv.resize(kv.len() + room + 1, 0);
                kv
            })
            .collect();
        let mut slots = [(std::ptr::null_mut(), 0); GATED];
        for (i, ((k, room), kv)) in ours.iter().zip(own.iter_mut()).enumerate() {
            // SAFETY: `k.len() + 1` is within `kv`, which has `room + 1` bytes after it.
            slots[i] = (unsafe { kv.as_mut_ptr().add(k.len() + 1) }, *room);
        }
        let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|c| c.as_ptr()).collect();
        envp_ptrs.extend(
            own.iter_mut()
                .map(|kv| kv.as_mut_ptr() as *const libc::c_char),
        );
        envp_ptrs.push(std::ptr::null());
        let argv_ptrs = argv
            .iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect::<Vec<_>>();
        let mut reset: Vec<libc::c_int> = forwarded.iter().map(|s| *s as libc::c_int).collect();
        reset.push(libc::SIGCHLD);
        reset.push(libc::SIGPIPE);
        Ok(Prepared {
            program: job.program.clone(),
            argv_ptrs,
            envp_ptrs,
            c_program,
            _argv: argv,
            _envp: envp,
            _ours: own,
            slots,
            reset,
        })
    }
}

/// Reads exactly `len` bytes from `fd` into `at`, with raw system calls only (between fork and
/// exec). False on EOF or an error.
///
/// # Safety
/// `at` must be valid for `len` bytes of writes.
unsafe fn read_exact_raw(fd: libc::c_int, at: *mut u8, len: usize) -> bool {
    let mut got = 0;
    while got < len {
        // SAFETY: within the `len` bytes at `at`.
        let n = unsafe { libc::read(fd, at.add(got).cast(), len - got) };
        if n > 0 {
            got += n as usize;
        } else if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

/// The child between fork and exec. Only async-signal-safe system calls; never returns.
///
/// # Safety
/// Must be called only in the child of a `fork`, with `p` fully built before the fork.
unsafe fn child_after_fork(
    p: &Prepared,
    parent: Pid,
    go_rx: libc::c_int,
    go_tx: libc::c_int,
    err_rx: libc::c_int,
    err_tx: libc::c_int,
) -> ! {
    // SAFETY: raw system calls on values prepared before the fork.
    unsafe {
        for &sig in &p.reset {
            libc::signal(sig, libc::SIG_DFL);
        }
        libc::setpgid(0, 0);
        libc::close(go_tx);
        libc::close(err_rx);
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            || libc::getppid() != parent.as_raw()
        {
            libc::_exit(1);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // The gate: the message (token, lease id, LOCK path) comes once the lease names us,
        // durably; EOF if the wrapper gave up or died.
        for &(at, room) in &p.slots {
            if !read_exact_raw(go_rx, at, room) {
                libc::_exit(1);
            }
        }
        libc::close(go_rx);
        libc::execve(
            p.c_program.as_ptr(),
            p.argv_ptrs.as_ptr(),
            p.envp_ptrs.as_ptr(),
        );
        let e = (*libc::__errno_location()).to_ne_bytes();
        libc::write(err_tx, e.as_ptr().cast(), e.len());
        libc::_exit(127)
    }
}
