//! Stopping a verified old job before a takeover or a break.
//!
//! Owns: what is done to the processes of a stale or hung same-host lease before anyone else
//! may have it — the command's process group of a hung holder, the leftovers a dead holder's job
//! left in its group, and the processes of the job that left its group but carry its
//! environment — for both the acquirer (`builder.rs`) and the operator's break
//! (`status.rs`).
//! Must never: signal a process without the evidence checks of `process.rs` (bound to this lock
//! and this lease, re-verified just before the signal); signal anything of a foreign or free
//! lease; let a takeover go ahead while a live process of the old job cannot be checked.

use std::time::Duration;

use crate::process;
use crate::record::Lease;
use crate::store::binding::Binding;
use crate::verdict::{State, Verdict};

/// Before a stale or hung same-host lease is taken over or broken: stops what is left of its
/// job, every process verified first — the command's group of a hung holder (see
/// [`stop_hung`]), or the leftover processes a dead holder's job left in its group. Returns how
/// many were stopped; nothing to do for foreign or free leases. Refuses (with the line to show)
/// when a live process of the old job's group cannot be checked: taking over would leave it
/// running beside the new job, and it must not be signalled unverified either.
pub(crate) fn stop_old_job(
    v: &Verdict,
    binding: &dyn Binding,
) -> std::result::Result<usize, String> {
    let Some(l) = &v.lease else {
        return Ok(0);
    };
    match (v.state, l.holder.pgid) {
        (State::Hung, _) if v.same_host => stop_hung(l, binding),
        (State::Stale, _) if v.same_host && v.unchecked.is_some() => {
            Err(v.unchecked.clone().unwrap_or_default())
        }
        (State::Stale, Some(pg)) if v.same_host => {
            let ev = binding.evidence(l);
            let mut n = 0;
            if !v.remnants.is_empty() {
                n = process::kill_group_verified(pg, &ev, Duration::from_secs(2))?;
            }
            Ok(n + stop_escaped(l, &ev)?)
        }
        _ => Ok(0),
    }
}

/// Stops what the old job left running outside its process group (a `setsid` daemon, a
/// descendant that made its own group): every process carrying this lock's path and the old
/// lease id in its environment, started no earlier than the recorded command, verified just
/// before the SIGKILL. A cancelled job (its wrapper SIGKILLed with its caller's group) is
/// stopped by its guardian within the grace; a same-host contender must not start beside what
/// the guardian has not stopped yet.
fn stop_escaped(l: &Lease, ev: &process::JobEvidence) -> std::result::Result<usize, String> {
    match l.holder.child_start {
        Some(since) => process::kill_carriers_verified(ev, since, Duration::from_secs(2)),
        None => Ok(0),
    }
}

/// Stops the processes of a hung same-host holder, each verified against /proc first (see
/// [`JobEvidence`]): the members of its command's process group that carry this lock's path
/// and its lease id, or the holder itself (which keeps its holder's mark on this lock's mutex
/// file) when it recorded no command. The frozen wrapper is left alone: when resumed it finds
/// its lease gone and fences itself. Refuses when the recorded command lives but is not
/// provably this lock's, or when a member of the group cannot be checked.
pub(crate) fn stop_hung(l: &Lease, binding: &dyn Binding) -> std::result::Result<usize, String> {
    let h = &l.holder;
    let ev = binding.evidence(l);
    let wait = Duration::from_secs(2);
    match h.pgid {
        Some(pg) => {
            // The recorded command, if it still runs, must provably be this job's, in its group.
            if let (Some(c), Some(cs)) = (h.child_pid, h.child_start)
                && let Ok(Some(s)) = process::stat(c)
                && s.start == cs
                && !s.is_dead()
            {
                match ev.check(&s) {
                    process::Evidence::Belongs => {}
                    process::Evidence::NotOurs(why) => {
                        return Err(format!(
                            "{why}: not this lock's job (a forged or copied lease?); not signalling anything; a forced break replaces such a lease"
                        ));
                    }
                    process::Evidence::Unknown(why) => {
                        return Err(format!(
                            "pid {c} cannot be checked: {why}; not signalling anything; check it as root or as {}, stop it, or break the lease by force",
                            h.user
                        ));
                    }
                }
                if s.pgrp != pg {
                    return Err(format!(
                        "pid {c} has left process group {pg}; not signalling"
                    ));
                }
            }
            // Only verified members are signalled; others in a reused group are not this job.
            let n = process::kill_group_verified(pg, &ev, wait)?;
            Ok(n + stop_escaped(l, &ev)?)
        }
        None => process::kill_verified(h.pid, h.pid_start, &ev, wait).map(|_| 1),
    }
}
