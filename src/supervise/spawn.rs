//! Starting the command: fork from the supervising thread, the child held back at a gate until
//! the lease names it, PDEATHSIG, and exec.
//!
//! Owns: everything the child needs built before the fork (program, argv, environment with
//! `LEASEHOLD_LOCK`/`LEASEHOLD_TOKEN`/`LEASEHOLD_LEASE_ID`, signals to reset), the fork itself,
//! the child's side between fork and exec (own process group, `PR_SET_PDEATHSIG` = SIGKILL,
//! parent check, the gate), recording the child in the lease before opening the gate, and
//! reading back a failed exec (127 not found, 126 cannot run).
//! Must never: let the command run a single instruction of its own before the lease records its
//! pid, start time and process group; or allocate or take a lock between `fork` and `exec`.

use std::ffi::{CString, OsStr, OsString};
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
struct Held {
    child: Pid,
    /// Writing one byte opens the gate; closing it unopened makes the child exit.
    go_tx: OwnedFd,
    /// EOF once exec succeeded; four bytes (an errno) when it failed.
    err_rx: OwnedFd,
}

impl Supervisor {
    /// Forks the command, records it in the lease, and only then lets it exec.
    pub(super) fn spawn(&mut self, guard: &LeaseGuard, p: &Prepared) -> Result<Started> {
        let lock = guard.path();
        let held = fork_held(lock, p)?;
        let child = held.child;
        let abort = |why: Error| -> Result<Started> {
            let _ = kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            Err(why)
        };
        let start = match start_time(lock, child) {
            Ok(s) => s,
            Err(e) => return abort(e),
        };
        if let Err(e) = guard.set_child(child.as_raw(), start, child.as_raw()) {
            if let Error::Lost { why, .. } = &e {
                return Ok(Started::Done(fence_unstarted(child, why)));
            }
            return abort(e);
        }
        if guard.is_lost() || LOST.load(Ordering::Acquire) {
            return Ok(Started::Done(fence_unstarted(child, loss_text(guard))));
        }
        if let Some(t) = &self.tty
            && !t.give(child)
        {
            self.tty = None;
        }
        // Open the gate.
        let opened = nix::unistd::write(&held.go_tx, &[1u8]);
        drop(held.go_tx);
        if let Err(e) = opened {
            return abort(io_error(lock, "start the command", e.into()));
        }
        match exec_failure(&held.err_rx) {
            Some(errno) => {
                let _ = waitpid(child, None);
                Ok(Started::Done(Outcome::NotStarted(cannot_run(p, errno))))
            }
            None => Ok(Started::Running(child)),
        }
    }
}

/// Creates the gate and exec-status pipes and forks, all signals blocked across the fork; the
/// child goes to [`child_after_fork`] and never returns here.
fn fork_held(lock: &Path, p: &Prepared) -> Result<Held> {
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
    Ok(Held {
        child,
        go_tx,
        err_rx,
    })
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
fn cannot_run(p: &Prepared, errno: Errno) -> NotStarted {
    let code = if errno == Errno::ENOENT { 127 } else { 126 };
    NotStarted {
        code,
        why: format!(
            "cannot run {}: {}",
            leasehold::text::escape_path(&p.program),
            errno.desc()
        ),
    }
}

/// Everything the child needs between fork and exec, built beforehand: the child must not
/// allocate.
pub(super) struct Prepared {
    program: PathBuf,
    c_program: CString,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    reset: Vec<libc::c_int>,
}

impl Prepared {
    pub(super) fn new(guard: &LeaseGuard, job: &Job, forwarded: &[Signal]) -> Result<Prepared> {
        let nul = |what: &str| {
            io_error(
                guard.path(),
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
        let ours = [
            ("LEASEHOLD_LOCK", guard.path().as_os_str().to_os_string()),
            ("LEASEHOLD_TOKEN", guard.token().to_string().into()),
            ("LEASEHOLD_LEASE_ID", guard.lease_id().into()),
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
        for (k, v) in &ours {
            let mut kv = OsString::from(k);
            kv.push("=");
            kv.push(v);
            envp.push(cstr(&kv, "LEASEHOLD_LOCK")?);
        }
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let mut reset: Vec<libc::c_int> = forwarded.iter().map(|s| *s as libc::c_int).collect();
        reset.push(libc::SIGCHLD);
        reset.push(libc::SIGPIPE);
        Ok(Prepared {
            program: job.program.clone(),
            argv_ptrs: ptrs(&argv),
            envp_ptrs: ptrs(&envp),
            c_program,
            _argv: argv,
            _envp: envp,
            reset,
        })
    }
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
        // The gate: one byte once the lease names us; EOF if the wrapper gave up or died.
        let mut b = 0u8;
        loop {
            let n = libc::read(go_rx, (&raw mut b).cast(), 1);
            if n == 1 {
                break;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            libc::_exit(1);
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
