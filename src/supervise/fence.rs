//! Fencing: stopping the command's process group once the lease is lost, and stopping what the
//! command left running when it ended by itself.
//!
//! Owns: the one fence sequence ([`stop_job`]: SIGTERM (and SIGCONT) of the command's group, the
//! grace wait, SIGKILL of the group and the command, waiting until no live member is left,
//! counting the survivors), used both for a lost lease and for what a command left running;
//! knowing cheaply that a group is empty (leasehold is a child subreaper); reaping the command
//! last and orphans re-parented to leasehold; and telling a command that was killed from outside
//! while the lease was taken (a fence too) from one that simply ended.
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
                // with the fence sequence before the lease is released.
                if !self.group_surely_empty(child) {
                    let left = process::group_members(child.as_raw());
                    if !left.is_empty() {
                        stop_job(child, guard.timing().grace);
                        self.leftovers.set(left.len());
                    }
                }
                other
            }
        };
        let _ = waitpid(child, None);
        reap_adopted();
        o
    }

    /// Fences: [`stop_job`], and only then reap the command.
    pub(super) fn fence(&self, child: Pid, grace: Duration, reason: String) -> Outcome {
        let survivors = stop_job(child, grace);
        let _ = waitpid(child, None);
        reap_adopted();
        Outcome::Fenced { reason, survivors }
    }

    /// Whether the command's process group (the command itself has ended, reported but not
    /// reaped) surely has no live member, known without reading every process of the host.
    ///
    /// Leasehold is a child subreaper (`PR_SET_CHILD_SUBREAPER`, set by [`Supervisor::new`]):
    /// every orphan among the command's descendants is re-parented to it, so when its only
    /// children are the ended command and the guardian (`guardian.rs`, forked before the
    /// command: no descendant of it), no descendant of the command lives. A process that is no
    /// descendant can be in the group only by having moved itself (or its child) in with
    /// `setpgid` from the same session: nothing the command left running. False (the caller
    /// scans /proc, as it always did) whenever there is any other child — an orphan left
    /// running, a daemon that left the group, a zombie not yet reaped — or the lists cannot be
    /// read.
    pub(super) fn group_surely_empty(&self, child: Pid) -> bool {
        if !self.subreaper {
            return false;
        }
        let me = nix::unistd::getpid();
        let tid = nix::unistd::gettid();
        let guardian = self.guardian.as_ref().map(|g| g.pid().as_raw().to_string());
        // Orphans go to the first live thread (the main one); the command is a child of the
        // thread that forked it (this one).
        let threads = if tid == me { vec![me] } else { vec![me, tid] };
        threads.iter().all(|t| {
            match std::fs::read_to_string(format!("/proc/self/task/{t}/children")) {
                Ok(text) => text
                    .split_ascii_whitespace()
                    .all(|p| p == child.as_raw().to_string() || Some(p) == guardian.as_deref()),
                Err(_) => false,
            }
        })
    }
}

/// The one fence sequence, for a lost lease and for what a command left running: SIGTERM (and
/// SIGCONT) the command's group and the command, wait up to `grace` while any of it lives,
/// SIGKILL the group and the command, and wait until nothing of it lives. Does not reap the
/// command (its pid is the group's id). Returns how many processes still lived at the end
/// (normally 0). Script mode's keeper (`crate::script`) fences a script with it too.
pub(crate) fn stop_job(child: Pid, grace: Duration) -> usize {
    let _ = killpg(child, Signal::SIGTERM);
    let _ = kill(child, Signal::SIGTERM);
    let _ = killpg(child, Signal::SIGCONT);
    let end = Instant::now() + grace;
    while job_alive(child) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2).min(end - Instant::now()));
    }
    kill_group_and_wait(child, Some(child), KILL_WAIT)
}

/// Reaps every ended child other than the command: orphans re-parented to leasehold (a child
/// subreaper) that have died. Call only once the command itself is reaped, or with `keep` =
/// the command, which is never reaped here.
pub(super) fn reap_adopted_except(keep: Option<Pid>) {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    loop {
        let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        let pid = match waitid(Id::All, peek) {
            Ok(st) => match st.pid() {
                Some(p) => p,
                None => return,
            },
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        };
        if Some(pid) == keep {
            return;
        }
        let _ = waitpid(pid, None);
    }
}

/// [`reap_adopted_except`] with nothing to keep.
pub(super) fn reap_adopted() {
    reap_adopted_except(None);
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
