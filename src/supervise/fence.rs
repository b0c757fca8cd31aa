//! Fencing: stopping the command's process group once the lease is lost, and stopping what the
//! command left running when it ended by itself.
//!
//! Owns: SIGTERM (and SIGCONT) of the command's group, the grace wait, SIGKILL of the group and
//! the command, waiting until no live member is left (counting the survivors), reaping the
//! command last, and telling a command that was killed from outside while the lease was taken
//! (a fence too) from one that simply ended.
//! Must never: reap the command before its group is dead (its pid is the group's id, and must
//! not be reused while the group is signalled); or report a fenced job as an ordinary exit.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use leasehold::LeaseGuard;
use leasehold::process;

use super::signals::LOST;
use super::{Outcome, Supervisor};
use std::sync::atomic::Ordering;

/// How long, at most, to wait for a SIGKILLed process group to empty before giving up on it.
const KILL_WAIT: Duration = Duration::from_secs(10);

impl Supervisor {
    /// The command ended by itself (or was killed from outside). If it died of a signal while
    /// the lease was no longer ours, that was a fence from outside: finish it and report 74.
    /// The command has exited (reported, not yet reaped).
    pub(super) fn ended(&self, guard: &LeaseGuard, child: Pid, o: Outcome) -> Outcome {
        let o = match o {
            Outcome::Signaled(_)
                if guard.is_lost() || LOST.load(Ordering::Acquire) || !guard.still_ours() =>
            {
                // Whatever is left of its group goes too, while its id is still reserved.
                let survivors = kill_group_and_wait(child, None, KILL_WAIT);
                let reason = match guard.loss() {
                    Some(r) => r.to_string(),
                    None => "lease taken while the command was stopped or frozen".into(),
                };
                Outcome::Fenced { reason, survivors }
            }
            other => {
                // The command ended while the lease was ours, but processes it started may
                // still run in its group: the job is not over until they are, so stop them
                // (SIGTERM, grace, SIGKILL) before the lease is released.
                let left = process::group_members(child.as_raw());
                if !left.is_empty() {
                    let _ = killpg(child, Signal::SIGTERM);
                    let _ = killpg(child, Signal::SIGCONT);
                    let end = Instant::now() + guard.timing().grace;
                    while !process::group_members(child.as_raw()).is_empty() && Instant::now() < end
                    {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    kill_group_and_wait(child, None, KILL_WAIT);
                    self.leftovers.set(left.len());
                }
                other
            }
        };
        let _ = waitpid(child, None);
        o
    }

    /// Fences: SIGTERM (and SIGCONT) the command's group, wait up to `grace`, SIGKILL the group
    /// and the command, wait until nothing in the group lives, and only then reap the command.
    pub(super) fn fence(&self, child: Pid, grace: Duration, reason: String) -> Outcome {
        let survivors = stop_job(child, grace);
        let _ = waitpid(child, None);
        Outcome::Fenced { reason, survivors }
    }
}

/// The fence sequence, shared with script mode's keeper (`crate::script`): SIGTERM (and
/// SIGCONT) the process group `leader` leads and `leader` itself, wait up to `grace` for them
/// to end, SIGKILL the group and `leader`, and wait until nothing of it lives. Reaps nothing.
/// Returns how many processes were still alive at the end.
pub(crate) fn stop_job(leader: Pid, grace: Duration) -> usize {
    let _ = killpg(leader, Signal::SIGTERM);
    let _ = kill(leader, Signal::SIGTERM);
    let _ = killpg(leader, Signal::SIGCONT);
    let end = Instant::now() + grace;
    while job_alive(leader) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2).min(end - Instant::now()));
    }
    kill_group_and_wait(leader, Some(leader), KILL_WAIT)
}

/// Why the lease was lost, in words.
pub(super) fn loss_text(guard: &LeaseGuard) -> String {
    match guard.loss() {
        Some(r) => r.to_string(),
        None => "lease lost".into(),
    }
}

/// True while the command or any live member of its process group (= its pid) remains.
fn job_alive(child: Pid) -> bool {
    let me = match process::stat(child.as_raw()) {
        Ok(Some(s)) => !s.is_dead(),
        _ => false,
    };
    me || !process::group_members(child.as_raw()).is_empty()
}

/// SIGKILLs the process group `pgid` (and `also`, in case it left the group) and waits up to
/// `limit` for all of it to die. Returns how many processes were still alive at the end.
fn kill_group_and_wait(pgid: Pid, also: Option<Pid>, limit: Duration) -> usize {
    let end = Instant::now() + limit;
    loop {
        let members = process::group_members(pgid.as_raw());
        let also_alive =
            also.is_some_and(|p| matches!(process::stat(p.as_raw()), Ok(Some(s)) if !s.is_dead()));
        if members.is_empty() && !also_alive {
            return 0;
        }
        if Instant::now() >= end {
            return members.len() + usize::from(also_alive);
        }
        let _ = killpg(pgid, Signal::SIGKILL);
        if let Some(p) = also {
            let _ = kill(p, Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The lease was lost after the fork but before the gate opened: the command has not run an
/// instruction of its own, so it is SIGKILLed and reaped (its group holds nothing else yet).
pub(super) fn fence_unstarted(child: Pid, why: impl std::fmt::Display) -> Outcome {
    let _ = kill(child, Signal::SIGKILL);
    let _ = waitpid(child, None);
    Outcome::Fenced {
        reason: format!("lease lost before the command started: {why}"),
        survivors: 0,
    }
}
