//! The FD form, `flock [opts] N` on a descriptor the calling shell holds: the lease of the
//! descriptor's file, kept by a keeper bound to the shell and its descriptor (script mode's,
//! `crate::script`), then the kernel lock on the inherited descriptor; `flock -u N` drops the
//! kernel lock and nudges that keeper. PROTOCOL.md §12.
//!
//! Owns: the plan (which file, whose descriptor, the lease's name, or kernel lock only and
//! why), the order (lease, then kernel lock within one deadline; the lease given back when the
//! kernel lock is not had), the hand-over to the keeper, `-u`'s nudge, and `-n`'s settle (a
//! keeper whose job the kernel shows without the lock is nudged and waited for, so `-n` is
//! refused only by a lock the kernel shows held; the file form uses it too). Must never: hand the
//! keeper a duplicate of the user's descriptor (the lock would outlive its holders); take the
//! lease for a process whose descriptor is not the one being locked; exit 0 without the kernel
//! lock.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use leasehold::process::{self, Evidence, JobEvidence};
use leasehold::{LeaseState, LockPaths};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::stat::SFlag;

use super::args::{Mode, Options, Wait};
use super::{KernelOnly, lock, run, warn};
use crate::script::descriptor::Watch;
use crate::script::{self, Bound, Front, Script, Started};

/// The lease's note: which descriptor of its job it stands for, and the kind of kernel lock
/// (`flock -u N` and a `-n` contender read it).
fn note(fd: i32, ofd: bool) -> String {
    if ofd {
        format!("flock --fcntl descriptor {fd}")
    } else {
        format!("flock descriptor {fd}")
    }
}

/// The descriptor and kind a note written by [`note`] names.
fn parse_note(n: &str) -> Option<(i32, bool)> {
    if let Some(fd) = n.strip_prefix("flock --fcntl descriptor ") {
        return Some((fd.parse().ok()?, true));
    }
    Some((n.strip_prefix("flock descriptor ")?.parse().ok()?, false))
}

/// How long `flock -u` waits for the keeper of the lease it released to exit.
const KEEPER_WAIT: Duration = Duration::from_secs(10);

/// A lease to take for the calling process's descriptor.
struct Plan {
    lease: PathBuf,
    shell: Script,
    pgid: i32,
    watch: Watch,
}

/// Runs the FD form and returns the exit status.
pub(super) fn descriptor(prog: &str, o: &Options, fd: i32) -> i32 {
    if o.mode == Mode::Unlock {
        return unlock(prog, o, fd);
    }
    let ttl = match run::lease_ttl() {
        Ok(t) => t,
        Err(why) => {
            warn(prog, &why);
            return 64;
        }
    };
    let started = Instant::now();
    let deadline = match o.wait {
        Wait::For(d) => Some(started + d),
        _ => None,
    };
    let mut front = None;
    // A descriptor that is not open: the lock call says so, as flock(1)'s does.
    let open = fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_ok();
    let only = match plan(o, fd) {
        Err(_) if !open => None,
        Err(why) => Some(why),
        Ok(p) => match take(o, fd, p, ttl) {
            Ok(f) => {
                front = Some(f);
                None
            }
            Err(Some(f)) => return super::conflict_or_failure(prog, o, f, ""),
            Err(None) => Some(KernelOnly::LeaseUnavailable),
        },
    };
    super::say_kernel_only(prog, o, only);
    match lock::lock(fd, o.api, o.mode, run::wait_for(o.wait, deadline)) {
        Ok(()) => {
            if let Some(f) = front
                && !f.printed()
            {
                // Its lease names the shell and a dead keeper: judged as a frozen holder's. The
                // lock is not kept without it.
                let _ = lock::lock(fd, o.api, Mode::Unlock, Some(Duration::ZERO));
                warn(prog, "the lease's keeper died: the lock was not kept");
                return 71;
            }
            if o.verbose {
                super::took(prog, started);
            }
            0
        }
        Err(f) => {
            if let Some(front) = front {
                front.abort();
            }
            // A -w wait whose time the lease used up ends in a last attempt: a timeout.
            let f = match (f, o.wait) {
                (lock::Fail::Conflict, Wait::For(_)) => lock::Fail::Timeout,
                (f, _) => f,
            };
            super::conflict_or_failure(prog, o, f, &fd.to_string())
        }
    }
}

/// The descriptor's file by name: its path (from `/proc/self/fd`), checked to still name the
/// same file; `None` for a deleted or unnamed one.
fn named(fd: i32) -> Option<(PathBuf, (u64, u64))> {
    let path = fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let by_fd = fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
    let by_name = fs::metadata(&path).ok()?;
    let id = (by_fd.dev(), by_fd.ino());
    (path.is_absolute() && (by_name.dev(), by_name.ino()) == id).then_some((path, id))
}

/// Whether this lock gets a lease, and for whom: the parent (the shell running `flock N`) when
/// its descriptor N is on the same file; else why not.
fn plan(o: &Options, fd: i32) -> Result<Plan, KernelOnly> {
    if !super::fence_asked() {
        return Err(KernelOnly::NotAsked);
    }
    if o.api == super::args::Api::Ofd {
        return Err(KernelOnly::Fcntl);
    }
    let Ok(st) = fs::metadata(format!("/proc/self/fd/{fd}")) else {
        return Err(KernelOnly::NotAFile);
    };
    let kind = SFlag::from_bits_truncate(st.mode()) & SFlag::S_IFMT;
    if kind != SFlag::S_IFREG && kind != SFlag::S_IFDIR {
        return Err(KernelOnly::NotAFile);
    }
    let (path, id) = named(fd).ok_or(KernelOnly::NoPlaceBeside)?;
    let lease = leasehold::flock_lease_path(&path, id, true).ok_or(KernelOnly::NoPlaceBeside)?;
    let ppid = nix::unistd::getppid().as_raw();
    let me = nix::unistd::geteuid().as_raw();
    let s = match process::stat(ppid) {
        Ok(Some(s)) if ppid > 1 && s.uid == me && !s.is_dead() => s,
        _ => return Err(KernelOnly::Descriptor),
    };
    let theirs = fs::metadata(format!("/proc/{ppid}/fd/{fd}")).ok();
    if theirs.is_none_or(|m| (m.dev(), m.ino()) != id) {
        return Err(KernelOnly::Descriptor);
    }
    let raw = rustix::process::Pid::from_raw(ppid).ok_or(KernelOnly::Descriptor)?;
    let pidfd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())
        .map_err(|_| KernelOnly::Descriptor)?;
    if !matches!(process::stat(ppid), Ok(Some(now)) if now.start == s.start) {
        return Err(KernelOnly::Descriptor);
    }
    if o.wait == Wait::No {
        settle(&lease, id);
    }
    if !leased_for(&lease, ppid, s.start).is_empty() {
        return Err(KernelOnly::Relock);
    }
    // Close events on the file (any open of it closed), watched through the descriptor itself
    // (no path race); the watch holds the inode, never an open file description.
    let closes = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
        .ok()
        .filter(|i| {
            i.add_watch(
                format!("/proc/self/fd/{fd}").as_str(),
                AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_CLOSE_NOWRITE,
            )
            .is_ok()
        })
        .map(OwnedFd::from);
    Ok(Plan {
        lease,
        shell: Script {
            pid: ppid,
            start: s.start,
            pidfd,
        },
        pgid: s.pgrp,
        watch: Watch {
            fd,
            file: id,
            ofd: o.api == super::args::Api::Ofd,
            closes,
        },
    })
}

/// The live leases at `lease` (LOCK's own, or a shared lock's holders') held on this host on
/// behalf of process `pid` (started at `start`).
fn leased_for(lease: &std::path::Path, pid: i32, start: u64) -> Vec<leasehold::Lease> {
    let Ok(v) = leasehold::status(lease) else {
        return Vec::new();
    };
    std::iter::once(&v)
        .chain(v.holders.iter())
        .filter(|hv| hv.same_host)
        .filter_map(|hv| hv.lease.as_ref())
        .filter(|l| {
            l.state != LeaseState::Released
                && l.holder.on_behalf
                && l.holder.child_pid == Some(pid)
                && l.holder.child_start == Some(start)
        })
        .cloned()
        .collect()
}

/// Starts the keeper and waits for it to hold the lease. `Err(Some(_))`: a holder kept it;
/// `Err(None)`: it cannot be had for another reason (flock goes on with the kernel lock alone).
fn take(o: &Options, fd: i32, p: Plan, ttl: Option<Duration>) -> Result<Front, Option<lock::Fail>> {
    let mut cmd = process::cmdline(p.shell.pid);
    if cmd.is_empty() {
        cmd = vec![format!("pid {}", p.shell.pid)];
    }
    let b = run::lease_builder(o, &p.lease, ttl, cmd)
        .note(note(fd, o.api == super::args::Api::Ofd))
        .on_behalf_of(p.shell.pid, p.shell.start, p.pgid);
    let how = run::patience(o.wait);
    let bound = Bound::Descriptor(p.watch);
    match script::start(b, how, true, o.conflict, p.shell, bound, true) {
        Ok(Started::Held(_, front)) => Ok(front),
        Ok(Started::Busy(false)) => Err(Some(lock::Fail::Conflict)),
        Ok(Started::Busy(true)) => Err(Some(lock::Fail::Timeout)),
        _ => Err(None),
    }
}

/// `flock -u N`: drops the kernel lock, then nudges the keeper of a lease the FD form took for
/// the calling process, and waits for it to exit if the lease stands for descriptor N.
fn unlock(prog: &str, o: &Options, fd: i32) -> i32 {
    let started = Instant::now();
    let shared = held_shared(fd);
    match lock::lock(fd, o.api, o.mode, run::wait_for(o.wait, None)) {
        Ok(()) => {
            nudge(fd, !shared);
            if o.verbose {
                super::took(prog, started);
            }
            0
        }
        Err(f) => super::conflict_or_failure(prog, o, f, &fd.to_string()),
    }
}

/// Whether descriptor `fd`'s open file description holds a shared (read) lock, by the kernel's
/// `lock:` lines in `/proc/self/fdinfo/FD`.
fn held_shared(fd: i32) -> bool {
    fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).is_ok_and(|t| {
        t.lines()
            .any(|l| l.starts_with("lock:") && l.contains(" READ "))
    })
}

/// Tells the keepers of the leases of descriptor `fd`'s file, taken for our parent, to look
/// again (SIGUSR1: a keeper bound to a descriptor only looks at what the kernel shows), and
/// with `wait` waits for the one that stands for descriptor `fd` to release and exit. A shared
/// lock is never waited for: another holder of the job (a sibling's shared lock) may keep its
/// keeper, and `flock -u` of a shared lock returns at once, as flock(1)'s does.
fn nudge(fd: i32, wait: bool) {
    let Some((path, _)) = named(fd) else {
        return;
    };
    let Some(lease) = leasehold::existing_flock_lease(&path) else {
        return;
    };
    let ppid = nix::unistd::getppid().as_raw();
    let Ok(Some(parent)) = process::stat(ppid) else {
        return;
    };
    for l in leased_for(&lease, ppid, parent.start) {
        let ours = l.holder.note.as_deref().and_then(parse_note);
        ask_keeper(&lease, &l, wait && ours.is_some_and(|(k, _)| k == fd));
    }
}

/// Before a `-n` attempt on the lease `lease` of the file `file` (device, inode): a lease
/// the FD form holds on this host for a job of this user that, by the kernel, no longer holds
/// its lock — its keeper has not looked yet (the job closed the descriptor a moment ago) — is
/// given the time to be released: its keeper is nudged and waited for. So `-n` is refused only
/// by a lock the kernel shows held.
pub(crate) fn settle(lease: &std::path::Path, file: (u64, u64)) {
    if fs::symlink_metadata(lease).is_err() {
        return;
    }
    let Ok(v) = leasehold::status(lease) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    let held: Vec<_> = std::iter::once(&v)
        .chain(v.holders.iter())
        .filter(|hv| hv.same_host)
        .filter_map(|hv| hv.lease.as_ref())
        .filter(|l| l.state != LeaseState::Released && l.holder.on_behalf && l.holder.uid == me)
        .cloned()
        .collect();
    for l in held {
        let h = &l.holder;
        let (Some((fd, ofd)), Some(pid), Some(start)) = (
            h.note.as_deref().and_then(parse_note),
            h.child_pid,
            h.child_start,
        ) else {
            continue;
        };
        let job = crate::script::descriptor::Job {
            pid,
            start,
            fd,
            pgid: h.pgid.unwrap_or(0),
        };
        let watch = Watch {
            fd,
            file,
            ofd,
            closes: None,
        };
        if crate::script::descriptor::who_holds(&job, me, &watch)
            == crate::script::descriptor::Holder::Nobody
        {
            ask_keeper(lease, &l, true);
        }
    }
}

/// Verifies the keeper of lease `l` at `lease` (its start time and its holder's mark on this
/// lock), sends it SIGUSR1 through a pidfd, and with `wait` waits (at most [`KEEPER_WAIT`])
/// for it to exit.
fn ask_keeper(lease: &std::path::Path, l: &leasehold::Lease, wait: bool) {
    let h = &l.holder;
    let Ok(paths) = LockPaths::new(lease) else {
        return;
    };
    let Ok(Some(s)) = process::stat(h.pid) else {
        return;
    };
    let ev = JobEvidence::new(&l.lease_id, h.uid, &paths.lock, &paths.mutex);
    if s.start != h.pid_start || s.is_dead() || !matches!(ev.check_holder(&s), Evidence::Belongs) {
        return;
    }
    let Some(raw) = rustix::process::Pid::from_raw(h.pid) else {
        return;
    };
    let Ok(keeper) = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    // The pidfd names the process verified, unless the pid was reused in between.
    if !matches!(process::stat(h.pid), Ok(Some(now)) if now.start == h.pid_start) {
        return;
    }
    if rustix::process::pidfd_send_signal(&keeper, rustix::process::Signal::USR1).is_err() {
        return;
    }
    if wait {
        let mut fds = [PollFd::new(keeper.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(KEEPER_WAIT.as_millis()).unwrap_or(u16::MAX);
        let _ = poll(&mut fds, PollTimeout::from(ms));
    }
}
