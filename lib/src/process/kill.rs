//! Sending SIGKILL to another job's processes: the verified group kill, the verified holder
//! kill, the checked single kill under both, and the verified signals to every process carrying
//! a job's environment (`leasehold run`'s guardian, and a takeover's stop of what a dead
//! holder's job left outside its group).
//!
//! Owns: the signal itself and the wait for the process (or group) to be gone. Must never:
//! signal a process not verified by [`JobEvidence`] (re-read just before the signal), this
//! process or one of its ancestors.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{
    Evidence, JobEvidence, Liveness, ProcStat, is_self_or_ancestor, job_carriers, judge_group,
    liveness, stat,
};

/// SIGKILLs, one by one, every live member of process group `pgid` that provably belongs to the
/// job (see [`JobEvidence`]), until none is left or `wait` passes. Members that do not belong
/// to it are never signalled; a member that cannot be checked makes it give up (before
/// signalling anything, when it is there from the start). Returns how many were stopped.
pub fn kill_group_verified(pgid: i32, ev: &JobEvidence, wait: Duration) -> Result<usize, String> {
    let deadline = Instant::now() + wait;
    let mut killed = std::collections::HashSet::new();
    loop {
        let judged = judge_group(pgid, ev);
        if let Some((p, why)) = judged.unknown.first() {
            return Err(format!(
                "pid {} in process group {pgid} cannot be checked: {why}; not signalling it",
                p.pid
            ));
        }
        let members = judged.belongs;
        if members.is_empty() {
            return Ok(killed.len());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "process group {pgid} still has {} live process(es) {} after SIGKILL",
                members.len(),
                crate::clock::human_duration(wait)
            ));
        }
        for m in &members {
            // Re-read right before signalling: same pid, same start time, still in the group.
            if let Ok(Some(now)) = stat(m.pid)
                && now.start == m.start
                && now.pgrp == pgid
                && !now.is_dead()
                && !is_self_or_ancestor(m.pid)
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

/// SIGKILLs a lease's recorded holder (pid and start time as recorded) once it provably is a
/// holder of this lock ([`JobEvidence::check_holder`]), and waits for it to be gone or a zombie.
pub fn kill_verified(pid: i32, start: u64, ev: &JobEvidence, wait: Duration) -> Result<(), String> {
    match stat(pid) {
        Ok(Some(s)) if s.start == start && !s.is_dead() => match ev.check_holder(&s) {
            Evidence::Belongs => {}
            Evidence::NotOurs(why) => {
                return Err(format!(
                    "{why}: not a holder of this lock (a forged or copied lease?); not signalling it"
                ));
            }
            Evidence::Unknown(why) => {
                return Err(format!(
                    "pid {pid} cannot be checked: {why}; not signalling it"
                ));
            }
        },
        Ok(_) => return Ok(()),
        Err(e) => return Err(format!("cannot inspect pid {pid}: {e}")),
    }
    kill_checked(pid, start, wait)
}

/// SIGKILLs `pid` if it still has start time `start`, and waits for it to be gone or a zombie.
/// Callers must have verified it first. Never this process or one of its ancestors.
pub(crate) fn kill_checked(pid: i32, start: u64, wait: Duration) -> Result<(), String> {
    match stat(pid) {
        Ok(Some(s)) if s.start == start && !s.is_dead() => {}
        Ok(_) => return Ok(()),
        Err(e) => return Err(format!("cannot inspect pid {pid}: {e}")),
    }
    if is_self_or_ancestor(pid) {
        return Err(format!(
            "pid {pid} is this process or one of its ancestors: never signalled"
        ));
    }
    match kill(Pid::from_raw(pid), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => return Err(format!("cannot signal pid {pid}: {e}")),
    }
    let deadline = Instant::now() + wait;
    while liveness(pid, start) == Liveness::Alive {
        if Instant::now() >= deadline {
            let w = crate::clock::human_duration(wait);
            return Err(format!("pid {pid} still alive {w} after SIGKILL"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Sends `sig` once to every process carrying the job's environment, started at or after
/// `since` ([`job_carriers`]), each re-read just before the signal (same pid, same start time,
/// still alive). Returns the processes signalled.
pub fn signal_carriers(ev: &JobEvidence, since: u64, sig: Signal) -> Vec<ProcStat> {
    let mut sent = Vec::new();
    for p in job_carriers(ev, since) {
        if signal_same(&p, sig) {
            sent.push(p);
        }
    }
    sent
}

/// SIGKILLs every process carrying the job's environment, started at or after `since`
/// ([`job_carriers`]), until none is left or `wait` passes. Returns how many were stopped.
pub fn kill_carriers_verified(
    ev: &JobEvidence,
    since: u64,
    wait: Duration,
) -> Result<usize, String> {
    let deadline = Instant::now() + wait;
    let mut killed = std::collections::HashSet::new();
    loop {
        let left = job_carriers(ev, since);
        if left.is_empty() {
            return Ok(killed.len());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} process(es) carrying this lease's environment still alive {} after SIGKILL (pid {} first)",
                left.len(),
                crate::clock::human_duration(wait),
                left[0].pid
            ));
        }
        for p in &left {
            if signal_same(p, Signal::SIGKILL) {
                killed.insert((p.pid, p.start));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends `sig` to `p` if it is still the live process it was when verified (same start time),
/// and never to this process or an ancestor. True when it was sent (or the process was gone).
fn signal_same(p: &ProcStat, sig: Signal) -> bool {
    match stat(p.pid) {
        Ok(Some(now)) if now.start == p.start && !now.is_dead() && !is_self_or_ancestor(p.pid) => {
            matches!(
                kill(Pid::from_raw(p.pid), sig),
                Ok(()) | Err(nix::errno::Errno::ESRCH)
            )
        }
        _ => false,
    }
}
