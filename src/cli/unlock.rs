//! `leasehold unlock LOCK`: ask the keeper of a script-mode lease to release it now.
//!
//! Owns: deciding whether the caller may (the script itself or a process it started: a
//! descendant, or one whose environment carries this lock's path and lease id — and the same
//! user), finding the keeper (the lease's `holder.pid`, verified by its start time and its
//! holder's mark on this lock, PROTOCOL.md §7 — for an etcd or S3 lock, its badge in our
//! runtime directory, §11), the request (SIGUSR1 through a pidfd), waiting
//! for the keeper to exit, and the exit status. Must never: signal a process the lease names
//! before it is verified; change LOCK itself (the keeper releases; `break` is for anyone else).

use std::os::fd::AsFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use leasehold::process::{self, Evidence, JobEvidence};
use leasehold::{LeaseState, LockPaths};

use crate::cli::args::UnlockArgs;
use crate::cli::{exit, report};

/// How long the keeper may take to release (it may wait for the lease mutex) and exit.
const KEEPER_WAIT: Duration = Duration::from_secs(10);

/// Runs `leasehold unlock` and returns the exit status.
pub(super) fn unlock(a: &UnlockArgs) -> i32 {
    let say_line = |what: &str| say!("{}", report::unlock_line(&a.lock, what));
    let v = match leasehold::status(&a.lock) {
        Ok(v) => v,
        Err(e) => {
            say!("{}", report::error_line(&e));
            return exit::exit_code(&e);
        }
    };
    let Some((v, l)) = pick(&v) else {
        if !a.quiet {
            say_line("not held: nothing to unlock");
        }
        return 0;
    };
    let h = &l.holder;
    let (Some(script), Some(start), true) = (h.child_pid, h.child_start, h.on_behalf) else {
        say_line(&format!(
            "held by {}, not taken by leasehold lock: refused (leasehold break is for that)",
            h.describe()
        ));
        return exit::NOPERM;
    };
    if !v.same_host {
        say_line("held by a script on another host: refused (leasehold break is for that)");
        return exit::NOPERM;
    }
    let ev = if leasehold::is_store_url(&a.lock) {
        // An etcd or S3 lock: no mutex file; its jobs carry the URL in their environment, and
        // its keeper holds its badge in our runtime directory (`leasehold::KeeperBadge`).
        let ev = JobEvidence::by_environment(&l.lease_id, h.uid, &a.lock);
        match leasehold::keeper_badge(&l.lease_id) {
            Some(id) => ev.with_holder_mark(id),
            None => ev,
        }
    } else {
        let paths = match LockPaths::new(&a.lock) {
            Ok(p) => p,
            Err(e) => {
                say!("{}", report::error_line(&e));
                return exit::exit_code(&e);
            }
        };
        JobEvidence::new(&l.lease_id, h.uid, &paths.lock, &paths.mutex)
    };
    let me = std::process::id() as i32;
    let mine = process::descends_from(me, script, start) || ev.carried_by(me);
    if !mine || nix::unistd::geteuid().as_raw() != h.uid {
        say_line(&format!(
            "held by script pid {script} of {}; this process is neither it nor started by it: refused (leasehold break --lease-id {} is for that)",
            h.user, l.lease_id
        ));
        return exit::NOPERM;
    }
    ask_keeper(h.pid, h.pid_start, &ev, &say_line)
}

/// The lease to unlock, with the verdict on it: LOCK's own, or — for a shared or counted lock
/// (`lock --shared`/`--slots`) — the holder whose lease id this process carries
/// (`LEASEHOLD_LEASE_ID`, exported by the script's `eval`) or whose script it descends from,
/// else the first live holder (whose checks below then refuse a stranger).
fn pick(v: &leasehold::Verdict) -> Option<(&leasehold::Verdict, &leasehold::Lease)> {
    fn live(hv: &leasehold::Verdict) -> Option<(&leasehold::Verdict, &leasehold::Lease)> {
        hv.lease
            .as_ref()
            .filter(|l| l.state != LeaseState::Released)
            .map(|l| (hv, l))
    }
    if v.holders.is_empty() {
        return live(v);
    }
    let me = std::process::id() as i32;
    let carried = std::env::var("LEASEHOLD_LEASE_ID").ok();
    let held: Vec<_> = v.holders.iter().filter_map(live).collect();
    let ours = held.iter().find(|(_, l)| {
        carried.as_deref() == Some(l.lease_id.as_str())
            || l.holder.on_behalf
                && l.holder
                    .child_pid
                    .zip(l.holder.child_start)
                    .is_some_and(|(p, st)| process::descends_from(me, p, st))
    });
    ours.or(held.first()).copied()
}

/// Verifies the keeper, sends it SIGUSR1 through a pidfd, and waits for it to exit.
fn ask_keeper(pid: i32, start: u64, ev: &JobEvidence, say_line: &dyn Fn(&str)) -> i32 {
    let gone = || {
        say_line(&format!(
            "its keeper pid {pid} is gone: the lease is judged as a frozen holder's (leasehold break --force frees it)"
        ));
        exit::TEMPFAIL
    };
    let Ok(Some(s)) = process::stat(pid) else {
        return gone();
    };
    if s.start != start || s.is_dead() {
        return gone();
    }
    if let Evidence::NotOurs(why) | Evidence::Unknown(why) = ev.check_holder(&s) {
        say_line(&format!(
            "its keeper pid {pid} cannot be verified ({why}): refused"
        ));
        return exit::NOPERM;
    }
    let Some(raw) = rustix::process::Pid::from_raw(pid) else {
        return gone();
    };
    let Ok(fd) = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) else {
        return gone();
    };
    // The pidfd names the process we verified, unless the pid was reused in between.
    if !matches!(process::stat(pid), Ok(Some(now)) if now.start == start) {
        return gone();
    }
    if let Err(e) = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::USR1) {
        say_line(&format!("cannot signal its keeper pid {pid}: {e}"));
        return exit::NOPERM;
    }
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let ms = u16::try_from(KEEPER_WAIT.as_millis()).unwrap_or(u16::MAX);
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(n) if n > 0 => 0,
        _ => {
            say_line(&format!(
                "its keeper pid {pid} did not release within {}s",
                KEEPER_WAIT.as_secs()
            ));
            exit::TEMPFAIL
        }
    }
}
