//! The file form, `flock [opts] FILE|DIR CMD [ARGS]` / `-c CMD`: open the user's file, take the
//! lease (only when asked for, `LEASEHOLD_FLOCK_FENCE=1`; where `leasehold::flock_lease_path`
//! puts it) and then the kernel lock, run the command, release.
//!
//! Owns: the plan (lease and kernel lock, or kernel lock only, and why), the order (lease first,
//! then the kernel lock, within one deadline; released in the reverse order: lease, then the
//! kernel lock as flock exits), running the command (supervised under a lease, or forked and
//! waited for as flock(1) does, or exec'd for `-F`), and flock's exit statuses for all of it.
//! Must never: run the command without the kernel lock, or without the lease when one was
//! taken; release the lease while the command lives; write to the user's file.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasehold::{Error, LeaseBuilder, LeaseGuard};
use nix::errno::Errno;
use nix::sys::signal::SigHandler;
use nix::sys::stat::{SFlag, fstat};

use super::args::{Mode, Options, Wait};
use super::{KernelOnly, lock, warn};
use crate::script::{self, Bound, Front, Held, Patience, Script, Started};
use crate::supervise::{Job, Outcome, Supervisor};

/// How this lock is taken.
enum Plan {
    /// The lease at this path, then the kernel lock.
    Lease(PathBuf),
    /// The kernel lock only, as flock(1).
    Kernel(KernelOnly),
}

/// How long a lock call may wait: `None` for ever, zero not at all; `deadline` is when a `-w`
/// wait that started earlier (for the lease) runs out.
pub(super) fn wait_for(w: Wait, deadline: Option<Instant>) -> Option<Duration> {
    match (w, deadline) {
        (Wait::Forever, _) => None,
        (Wait::No, _) => Some(Duration::ZERO),
        (Wait::For(_), Some(d)) => Some(d.saturating_duration_since(Instant::now())),
        (Wait::For(d), None) => Some(d),
    }
}

/// Whether this lock gets a lease, from the options and the opened file.
fn plan(o: &Options, path: &OsStr, fd: &OwnedFd) -> Plan {
    if !super::fence_asked() {
        return Plan::Kernel(KernelOnly::NotAsked);
    }
    if o.api == super::args::Api::Ofd {
        return Plan::Kernel(KernelOnly::Fcntl);
    }
    match o.mode {
        Mode::Unlock => return Plan::Kernel(KernelOnly::Unlock),
        // A shared kernel lock takes a shared lease (`LeaseBuilder::shared`): shared holders
        // together, an exclusive one alone, first come first served (PROTOCOL.md §13).
        Mode::Shared | Mode::Exclusive => {}
    }
    match fstat(fd) {
        Ok(st) => {
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if kind != SFlag::S_IFREG && kind != SFlag::S_IFDIR {
                return Plan::Kernel(KernelOnly::NotAFile);
            }
            // In the runtime directory on a local file system, beside the file on NFS.
            match leasehold::flock_lease_path(Path::new(path), (st.st_dev, st.st_ino), true) {
                Some(lease) => Plan::Lease(lease),
                None => Plan::Kernel(KernelOnly::NoPlaceBeside),
            }
        }
        Err(_) => Plan::Kernel(KernelOnly::NotAFile),
    }
}

/// Runs the file form and returns the exit status.
pub(super) fn file(prog: &str, o: &Options, path: &OsStr, command: &[OsString]) -> i32 {
    let ttl = match lease_ttl() {
        Ok(t) => t,
        Err(why) => {
            warn(prog, &why);
            return 64;
        }
    };
    let mut fd = match lock::open(path, o.api, o.mode, false, o.close) {
        Ok(fd) => fd,
        Err(e) => {
            let (code, msg) = lock::open_failure(path, e);
            warn(prog, &msg);
            return code;
        }
    };
    let started = Instant::now();
    let deadline = match o.wait {
        Wait::For(d) => Some(started + d),
        _ => None,
    };
    let mut held = None;
    let mut kept = None;
    let mut only = None;
    let planned = plan(o, path, &fd);
    if let (Plan::Lease(lease), Wait::No, Ok(st)) = (&planned, o.wait, fstat(&fd)) {
        super::descriptor::settle(lease, (st.st_dev, st.st_ino));
    }
    match planned {
        Plan::Kernel(why) => only = Some(why),
        Plan::Lease(lease) if o.no_fork => match keep_for_exec(o, &lease, ttl, command) {
            Ok(k) => kept = Some(k),
            Err(Some(f)) => return super::conflict_or_failure(prog, o, f, ""),
            Err(None) => only = Some(KernelOnly::LeaseUnavailable),
        },
        Plan::Lease(lease) => match take_lease(o, &lease, ttl, command) {
            Ok(h) => held = Some(h),
            Err(Some(f)) => return super::conflict_or_failure(prog, o, f, ""),
            Err(None) => only = Some(KernelOnly::LeaseUnavailable),
        },
    }
    super::say_kernel_only(prog, o, only);
    if let Err(code) = kernel_lock(prog, o, path, &mut fd, deadline) {
        if let Some((_, guard)) = held {
            let _ = guard.release_with("not started: the kernel lock was not had");
        }
        if let Some((front, _)) = kept {
            front.abort();
        }
        return code;
    }
    if o.verbose {
        super::took(prog, started);
        let cmd = command
            .first()
            .map(|c| c.to_string_lossy())
            .unwrap_or_default();
        super::print_out(&format!("{prog}: executing {cmd}\n"));
    }
    match held {
        Some((mut sup, guard)) => supervised(prog, &mut sup, guard, command),
        None if o.no_fork => exec(prog, command, kept),
        None => forked(prog, command),
    }
    // The kernel lock is dropped with `fd`, after the lease was released: a converted waiter
    // woken by the release is already blocked in the kernel when the lock goes.
}

/// Takes the lease at `lease` as the options ask. `Err(Some(_))`: a holder kept it (conflict
/// or timeout); `Err(None)`: it cannot be had for another reason (then flock goes on with the
/// kernel lock alone, which is what excludes every user of the file anyway).
fn take_lease(
    o: &Options,
    lease: &Path,
    ttl: Option<Duration>,
    command: &[OsString],
) -> Result<(Supervisor, LeaseGuard), Option<lock::Fail>> {
    let sup = Supervisor::new().map_err(|_| None)?;
    let argv = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let b = lease_builder(o, lease, ttl, argv).on_lost(sup.loss_notifier());
    let got = match o.wait {
        Wait::No => b.try_acquire(),
        Wait::For(d) => b.acquire_timeout(d),
        Wait::Forever => b.acquire(),
    };
    match got {
        Ok(g) => Ok((sup, g)),
        Err(Error::WouldBlock { .. } | Error::Refused { .. } | Error::MutexStuck { .. }) => {
            Err(Some(if matches!(o.wait, Wait::No) {
                lock::Fail::Conflict
            } else {
                lock::Fail::Timeout
            }))
        }
        Err(Error::Timeout { .. }) => Err(Some(lock::Fail::Timeout)),
        Err(_) => Err(None),
    }
}

/// The lease's settings for a flock lock on `lease`: the command recorded, shared for `-s`, the
/// TTL of [`TTL_VAR`] if set.
pub(super) fn lease_builder(
    o: &Options,
    lease: &Path,
    ttl: Option<Duration>,
    command: Vec<String>,
) -> LeaseBuilder {
    let b = LeaseBuilder::new(lease)
        .command(command)
        .shared(o.mode == Mode::Shared);
    match ttl {
        Some(t) => b.ttl(t),
        None => b,
    }
}

/// How long a keeper may wait for the lease: flock's `-n`, `-w` or neither.
pub(super) fn patience(wait: Wait) -> Patience {
    match wait {
        Wait::No => Patience::NoWait,
        Wait::For(d) => Patience::Upto(d),
        Wait::Forever => Patience::Forever,
    }
}

/// `-F`'s lease: taken by a keeper (script mode's) on behalf of this process, which the command
/// replaces by `exec` keeping its pid, so the keeper releases it when the command exits and
/// fences the command if it is lost. `Err` as [`take_lease`].
fn keep_for_exec(
    o: &Options,
    lease: &Path,
    ttl: Option<Duration>,
    command: &[OsString],
) -> Result<(Front, Held), Option<lock::Fail>> {
    let me = std::process::id() as i32;
    let Ok(Some(s)) = leasehold::process::stat(me) else {
        return Err(None);
    };
    let raw = rustix::process::Pid::from_raw(me).ok_or(None)?;
    let pidfd =
        rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).map_err(|_| None)?;
    let argv = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let b = lease_builder(o, lease, ttl, argv).on_behalf_of(me, s.start, s.pgrp);
    let how = patience(o.wait);
    let me = Script {
        pid: me,
        start: s.start,
        pidfd,
    };
    match script::start(b, how, true, o.conflict, me, Bound::Script, true) {
        Ok(Started::Held(h, front)) => Ok((front, h)),
        Ok(Started::Busy(false)) => Err(Some(lock::Fail::Conflict)),
        Ok(Started::Busy(true)) => Err(Some(lock::Fail::Timeout)),
        _ => Err(None),
    }
}

/// The environment variable that sets the lease's TTL (flock(1)'s command line has no room
/// for it): a leasehold DURATION, e.g. `10s`; the library's default when unset.
pub const TTL_VAR: &str = "LEASEHOLD_FLOCK_TTL";

/// The TTL asked for in [`TTL_VAR`], checked the way `leasehold run --ttl` checks it; `Err` says
/// what is wrong.
pub(super) fn lease_ttl() -> Result<Option<Duration>, String> {
    let Some(v) = std::env::var_os(TTL_VAR) else {
        return Ok(None);
    };
    let text = v.to_string_lossy();
    let d = crate::cli::duration::parse_duration(&text)
        .map_err(|e| format!("{TTL_VAR}={}: {e}", leasehold::text::escape(&text)))?;
    LeaseBuilder::new("/")
        .ttl(d)
        .timing()
        .map_err(|e| format!("{TTL_VAR}={}: {e}", leasehold::text::escape(&text)))?;
    Ok(Some(d))
}

/// Takes the kernel lock on `fd` within the deadline, reopening read-write once where NFS
/// wants it (as flock(1) does); `Err` is the exit status, the problem said.
fn kernel_lock(
    prog: &str,
    o: &Options,
    path: &OsStr,
    fd: &mut OwnedFd,
    deadline: Option<Instant>,
) -> Result<(), i32> {
    let mut reopened = false;
    loop {
        match lock::lock(fd.as_raw_fd(), o.api, o.mode, wait_for(o.wait, deadline)) {
            Ok(()) => return Ok(()),
            Err(lock::Fail::Os(e))
                if lock::wants_rdwr(e)
                    && !reopened
                    && o.mode != Mode::Shared
                    && nix::unistd::access(
                        path,
                        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
                    )
                    .is_ok() =>
            {
                reopened = true;
                *fd = lock::open(path, o.api, o.mode, true, o.close).map_err(|e| {
                    let (code, msg) = lock::open_failure(path, e);
                    warn(prog, &msg);
                    code
                })?;
            }
            Err(f) => {
                // A -w wait whose time the lease used up ends in a last attempt: a timeout.
                let f = match (f, o.wait) {
                    (lock::Fail::Conflict, Wait::For(_)) => lock::Fail::Timeout,
                    (f, _) => f,
                };
                let shown = leasehold::text::escape_os(path).into_owned();
                return Err(super::conflict_or_failure(prog, o, f, &shown));
            }
        }
    }
}

/// "failed to execute CMD: WHY", and flock's status for it (71 for ENOMEM, else 69).
fn exec_failed(prog: &str, command: &[OsString], e: Errno) -> i32 {
    let cmd = command
        .first()
        .map(|c| c.to_string_lossy())
        .unwrap_or_default();
    warn(
        prog,
        &format!("failed to execute {cmd}: {}", super::strerror(e)),
    );
    if e == Errno::ENOMEM { 71 } else { 69 }
}

/// The command under the lease, supervised (fenced if the lease is lost); the lease released
/// after it ended, recording how.
fn supervised(prog: &str, sup: &mut Supervisor, guard: LeaseGuard, command: &[OsString]) -> i32 {
    let job = match Job::new(command) {
        Ok(j) => j,
        Err(n) => {
            let _ = guard.release_with(&format!("not started: {}", n.why));
            let e = if n.code == 126 {
                Errno::EACCES
            } else {
                Errno::ENOENT
            };
            return exec_failed(prog, command, e);
        }
    };
    let outcome = sup.run(&guard, &job);
    let how = match &outcome {
        Ok(o) => o.ending(),
        Err(e) => format!("leasehold failed: {e}"),
    };
    let _ = guard.release_with(&how);
    if let Ok(o) = &outcome {
        // A terminal's Ctrl-C or Ctrl-\ that ended the command ends the calling script too.
        sup.pass_on_terminal_signal(o);
    }
    match outcome {
        Ok(Outcome::NotStarted(n)) => {
            let e = if n.code == 126 {
                Errno::EACCES
            } else {
                Errno::ENOENT
            };
            exec_failed(prog, command, e)
        }
        Ok(Outcome::Fenced { reason, .. }) => {
            warn(
                prog,
                &format!("lease lost ({reason}): the command was stopped"),
            );
            crate::cli::exit::IOERR_FENCED
        }
        Ok(o) => o.exit_code(),
        Err(e) => {
            warn(prog, &e.to_string());
            71
        }
    }
}

/// The command forked and waited for, as flock(1) runs it (kernel lock only).
fn forked(prog: &str, command: &[OsString]) -> i32 {
    let Some((first, rest)) = command.split_first() else {
        return 64;
    };
    let mut cmd = std::process::Command::new(first);
    cmd.args(rest);
    // The caller's signal mask, which std clears in the child before the hook runs: flock(1)'s
    // command inherits it.
    let mask = nix::sys::signal::SigSet::thread_get_mask().ok();
    // SAFETY: the hook only calls pthread_sigmask (async-signal-safe). Its presence also makes
    // std fork and exec rather than use posix_spawn, whose child leaves glibc's internal
    // real-time signals ignored across the exec: the command starts with the dispositions and
    // the mask flock(1)'s does.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if let Some(m) = mask {
                let _ = m.thread_set_mask();
            }
            Ok(())
        });
    }
    match cmd.status() {
        Ok(st) => match (st.code(), st.signal()) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            _ => 71,
        },
        Err(e) => exec_failed(
            prog,
            command,
            Errno::from_raw(e.raw_os_error().unwrap_or(0)),
        ),
    }
}

/// `-F`: flock becomes the command, keeping the locked descriptor — and, with a keeper, the
/// lease, whose `LEASEHOLD_LOCK`, `LEASEHOLD_TOKEN` and `LEASEHOLD_LEASE_ID` it carries in its
/// environment (the evidence binding what it starts to this lease, as under `leasehold run`).
fn exec(prog: &str, command: &[OsString], kept: Option<(Front, Held)>) -> i32 {
    let argv: Vec<CString> = command
        .iter()
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    let Some(first) = argv.first() else {
        return 64;
    };
    if let Some((front, h)) = kept {
        // SAFETY: this process runs one thread (the keeper was forked, no thread was started),
        // so nothing reads the environment while it changes.
        unsafe {
            std::env::set_var("LEASEHOLD_LOCK", &h.lock);
            std::env::set_var("LEASEHOLD_TOKEN", h.token.to_string());
            std::env::set_var("LEASEHOLD_LEASE_ID", &h.lease_id);
        }
        if !front.printed() {
            // Its lease names this process and a dead keeper: judged as a frozen holder's.
            warn(prog, "the lease's keeper died: the command was not started");
            return 71;
        }
    }
    // Rust ignores SIGPIPE in its own processes; the command must start with the default, as
    // it does under flock(1). SAFETY: setting a disposition to SIG_DFL installs no handler.
    let _ =
        unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, SigHandler::SigDfl) };
    let e = match nix::unistd::execvp(first, &argv) {
        Err(e) => e,
        Ok(never) => match never {},
    };
    exec_failed(prog, command, e)
}
