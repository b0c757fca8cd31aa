//! `leasehold lock`: take a lease for the calling script and print the exports for `eval`.
//!
//! Owns: choosing the process the lease is for (the parent, or `--pid`) and checking it may be
//! (same user, alive, not pid 1), mapping the flags onto a builder, starting the keeper
//! (`crate::script`), printing exactly the `export` line on stdout — in one `write` — and the
//! exit status. Must never: print anything else on stdout; exit 0 before the keeper has
//! confirmed it keeps the lease on its own; start a thread before the keeper is forked.

use std::os::fd::AsFd;

use leasehold::process;
use leasehold::{LeaseBuilder, text};

use crate::cli::args::LockArgs;
use crate::cli::{exit, report};
use crate::script::{self, Bound, Held, Patience, Script, Started};

/// Runs `leasehold lock` and returns the exit status.
pub(super) fn lock(a: &LockArgs) -> i32 {
    let pid = a.pid.unwrap_or_else(|| nix::unistd::getppid().as_raw());
    let (script, pgid) = match target(pid) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut cmd = process::cmdline(pid);
    if cmd.is_empty() {
        cmd = vec![format!("pid {pid}")];
    }
    let b = a
        .lease
        .apply(
            LeaseBuilder::new(&a.lock)
                .command(cmd)
                .on_behalf_of(pid, script.start, pgid),
        );
    if let Err(e) = b.timing() {
        say!("{}", report::error_line(&e));
        return exit::exit_code(&e);
    }
    let how = match (a.lease.no_wait, a.lease.wait) {
        (true, _) => Patience::NoWait,
        (false, Some(w)) => Patience::Upto(w),
        (false, None) => Patience::Forever,
    };
    let conflict = a.lease.conflict_exit_code;
    match script::start(b, how, a.quiet, conflict, script, Bound::Script, false) {
        Ok(Started::Held(h, front)) => {
            if !print_all(&exports(&h)) {
                let released = front.abort();
                say!(
                    "leasehold: cannot write the exports to stdout; the lease {}",
                    if released {
                        "was released"
                    } else {
                        "is left to its keeper"
                    }
                );
                return exit::SOFTWARE;
            }
            if front.printed() {
                0
            } else {
                say!(
                    "leasehold: the keeper died during the hand-over; the lock is judged as a frozen holder's"
                );
                exit::SOFTWARE
            }
        }
        Ok(Started::Failed(code)) => code,
        // Only the flock front end's keeper answers these.
        Ok(Started::Busy(_) | Started::Unavailable) => exit::SOFTWARE,
        Ok(Started::ScriptGone) => {
            say!(
                "{}",
                report::lock_target_refused(pid, "it exited while the lock was being taken")
            );
            exit::TEMPFAIL
        }
        Ok(Started::KeeperDied) => {
            say!("leasehold: the keeper process died before it could take the lock");
            exit::SOFTWARE
        }
        Err(e) => {
            say!("leasehold: cannot start the keeper process: {e}");
            exit::SOFTWARE
        }
    }
}

/// The process to hold the lease for: alive, this user's, not pid 1 or ourselves; with a
/// pidfd checked against its start time. `Err` is the exit status, the reason already said.
fn target(pid: i32) -> Result<(Script, i32), i32> {
    let refuse = |why: &str, code: i32| {
        say!("{}", report::lock_target_refused(pid, why));
        Err(code)
    };
    if pid <= 1 || pid == std::process::id() as i32 {
        return refuse("not a process a lease can be held for", exit::USAGE);
    }
    let s = match process::stat(pid) {
        Ok(Some(s)) if !s.is_dead() => s,
        _ => return refuse("no such process", exit::USAGE),
    };
    let me = nix::unistd::geteuid().as_raw();
    if s.uid != me {
        return refuse(
            &format!(
                "it runs as uid {}, not as uid {me}: a lease is held only for one's own processes",
                s.uid
            ),
            exit::NOPERM,
        );
    }
    let Some(raw) = rustix::process::Pid::from_raw(pid) else {
        return refuse("not a process id", exit::USAGE);
    };
    let pidfd = match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(e) => return refuse(&format!("pidfd_open: {e}"), exit::SOFTWARE),
    };
    match process::stat(pid) {
        Ok(Some(now)) if now.start == s.start => {}
        _ => return refuse("it exited", exit::USAGE),
    }
    let script = Script {
        pid,
        start: s.start,
        pidfd,
    };
    Ok((script, s.pgrp))
}

/// `export LEASEHOLD_LOCK='…' LEASEHOLD_TOKEN='…' LEASEHOLD_LEASE_ID='…'` and the
/// `LEASEHOLD_PREVIOUS*` values, quoted so that
/// POSIX `eval` gives back exactly these bytes (quotes, spaces, newlines in LOCK included).
fn exports(h: &Held) -> Vec<u8> {
    let mut out = b"export LEASEHOLD_LOCK=".to_vec();
    out.extend(text::sh_word(h.lock.as_os_str().as_encoded_bytes()));
    out.extend(b" LEASEHOLD_TOKEN=");
    out.extend(text::sh_word(h.token.to_string().as_bytes()));
    out.extend(b" LEASEHOLD_LEASE_ID=");
    out.extend(text::sh_word(h.lease_id.as_bytes()));
    for (k, v) in previous(h) {
        out.extend(format!(" {k}=").as_bytes());
        out.extend(text::sh_word(v.as_bytes()));
    }
    out.push(b'\n');
    out
}

/// `LEASEHOLD_PREVIOUS*` for the script (`cli/ending.rs`), from the keeper's record in LOCK —
/// the lease `h` names (`none` if LOCK shows another, or cannot be read).
fn previous(h: &Held) -> Vec<(&'static str, String)> {
    let lease = leasehold::status(&h.lock)
        .ok()
        .and_then(|v| v.lease)
        .filter(|l| l.lease_id == h.lease_id);
    let last = lease.as_ref().and_then(|l| l.history.last.clone());
    let acquired = lease.map(|l| l.acquired_at).unwrap_or_default();
    crate::cli::previous::previous_values(last.as_ref(), &acquired)
}

/// Writes all of `bytes` to stdout, unbuffered (one `write` for anything up to a pipe's
/// PIPE_BUF, so a reader never sees half of it unless we die mid-way). True when all went.
fn print_all(bytes: &[u8]) -> bool {
    let out = std::io::stdout();
    let fd = out.as_fd();
    let mut at = 0;
    while at < bytes.len() {
        match nix::unistd::write(fd, &bytes[at..]) {
            Ok(0) => return false,
            Ok(n) => at += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
    true
}
