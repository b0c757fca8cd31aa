//! The keeper: a detached process that holds a lease for a script (or for a descriptor's
//! kernel lock: flock's FD form).
//!
//! Owns: detaching (PDEATHSIG, session, stdio, descriptors), taking the lease on the script's
//! behalf, the keeper's half of the hand-over, and then, until the lease ends: releasing it when
//! the script exits (pidfd) or a verified `leasehold unlock` asks (SIGUSR1 read from a
//! signalfd, whose sender the kernel names), and fencing the script when the lease is lost.
//! Bound to a descriptor ([`Bound::Descriptor`]): releasing it when no process of the job holds
//! the kernel lock any more (`super::descriptor`; looked at on the job's exit, a close of the
//! file, a SIGUSR1 nudge from `flock -u`, and every second), rebinding the lease to a process
//! that inherited the descriptor, fencing the job when the lease is lost.
//! Must never: release before the front has said the exports were printed in full or could
//! not be (`p`/`a`) — bound to a descriptor, before the kernel shows the lock gone; signal a
//! script with a controlling terminal; honour an unlock from a process that is not the script,
//! a descendant of it, or a process carrying this lease in its environment; hold a duplicate of
//! a descriptor it watches.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::stat::Mode;
use nix::unistd::{Pid, getppid, pipe2, setsid};

use leasehold::process::{self, JobEvidence};
use leasehold::{Error, LeaseBuilder, LeaseGuard, LockPaths};

use super::descriptor::{self, Holder, Job, Watch};
use super::{Bound, Patience, keep_fds};
use crate::cli::progress::WaitDisplay;
use crate::cli::{exit, report};

/// Everything the keeper starts from, handed over by `fork`.
pub(super) struct Keeper {
    pub builder: LeaseBuilder,
    pub how: Patience,
    pub quiet: bool,
    pub conflict: u8,
    pub front: i32,
    pub script_pid: i32,
    pub script_start: u64,
    pub bound: Bound,
    pub flock: bool,
    pub up: OwnedFd,
    pub down: OwnedFd,
}

/// The eventfd of the acquisition's cancel handle, for the SIGTERM handler (see [`detach`]).
static CANCEL_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// SIGTERM while the keeper waits for the lease (the front died: PDEATHSIG, or a `kill`):
/// cancels the wait, so that the keeper gives up its queue ticket before it exits. Only stores
/// to an eventfd with `write(2)` (async-signal-safe), keeping errno.
extern "C" fn cancel_on_term(_: nix::libc::c_int) {
    let fd = CANCEL_FD.load(std::sync::atomic::Ordering::Acquire);
    if fd < 0 {
        return;
    }
    // SAFETY: errno is thread-local; write(2) of 8 bytes to an eventfd is async-signal-safe.
    unsafe {
        let errno = nix::libc::__errno_location();
        let saved = *errno;
        let one = 1u64.to_ne_bytes();
        let _ = nix::libc::write(fd, one.as_ptr().cast(), one.len());
        *errno = saved;
    }
}

/// Sets SIGTERM's action: the cancelling handler, or the default.
fn on_term(cancelling: bool) -> io::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    let handler = if cancelling {
        SigHandler::Handler(cancel_on_term)
    } else {
        SigHandler::SigDfl
    };
    let act = SigAction::new(handler, SaFlags::SA_RESTART, SigSet::empty());
    // SAFETY: the handler only writes to an eventfd (see `cancel_on_term`).
    unsafe { sigaction(Signal::SIGTERM, &act) }?;
    Ok(())
}

/// The keeper's whole life; never returns.
pub(super) fn run(k: Keeper) -> ! {
    let Ok(cancel) = leasehold::Cancel::new() else {
        std::process::exit(exit::SOFTWARE)
    };
    std::process::exit(match detach(&k, &cancel) {
        Ok(()) => keep(k, cancel),
        Err(_) => exit::SOFTWARE,
    })
}

/// Dies with the front until the hand-over is done — while it waits for the lease, by SIGTERM,
/// which cancels the wait (the queue ticket is given up; see [`take`]), then by SIGKILL; own
/// session; stdin and stdout on /dev/null; every descriptor but stderr, the two pipe ends and
/// the cancel handle closed (the script's own, a cron job's output pipe). SIGUSR1 is blocked
/// before any thread exists, for the signalfd.
fn detach(k: &Keeper, cancel: &leasehold::Cancel) -> io::Result<()> {
    CANCEL_FD.store(cancel.as_raw_fd(), std::sync::atomic::Ordering::Release);
    on_term(true)?;
    if matches!(k.bound, Bound::Script) {
        nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    }
    if getppid().as_raw() != k.front {
        // The front died before PDEATHSIG was set: nobody waits for us.
        std::process::exit(0);
    }
    setsid()?;
    let null = nix::fcntl::open("/dev/null", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())?;
    nix::unistd::dup2_stdin(&null)?;
    nix::unistd::dup2_stdout(&null)?;
    drop(null);
    let watched = match &k.bound {
        Bound::Descriptor(w) => w.closes.as_ref(),
        Bound::Script => None,
    };
    let mut keep = keep_fds(&k.up, &k.down, watched);
    keep.push(cancel.as_raw_fd());
    let open: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open.into_iter().filter(|fd| !keep.contains(fd)) {
        // SAFETY: a descriptor inherited from the front that nothing in this process owns
        // (the front's own pipe ends were dropped before); the directory listing's own
        // descriptor is already closed, and closing a stale number fails harmlessly.
        let _ = nix::unistd::close(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    SigSet::from(Signal::SIGUSR1).thread_block()?;
    Ok(())
}

/// Takes the lease, hands it over, keeps it; the exit status.
fn keep(k: Keeper, cancel: leasehold::Cancel) -> i32 {
    let mut up = File::from(k.up);
    let mut down = File::from(k.down);
    let Some(script) = open_script(k.script_pid, k.script_start) else {
        let _ = up.write_all(b"gone\n");
        return 0;
    };
    let Ok((lost_r, lost_w)) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK) else {
        let _ = up.write_all(format!("fail {}\n", exit::SOFTWARE).as_bytes());
        return exit::SOFTWARE;
    };
    let lost = File::from(lost_r);
    // Bound to a descriptor the keeper does not die with the front; it gives up waiting when
    // the front is gone (nobody will take the kernel lock).
    let orphaned = matches!(k.bound, Bound::Descriptor(_)).then_some(k.front);
    let waited = take(
        &k.builder,
        k.how,
        k.quiet || k.flock,
        lost_w,
        orphaned,
        cancel.clone(),
    );
    // From here on the front's death kills the keeper outright (see the module doc): a lease
    // taken is never released before the front has answered.
    let dies =
        matches!(k.bound, Bound::Script).then(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL));
    let _ = on_term(false);
    let guard = match waited {
        // The front is gone (or we were told to stop): the ticket went with the wait.
        Err(Error::Cancelled { .. }) => return 0,
        Err(e) => return refused((k.flock, k.how, k.quiet, k.conflict), &e, &mut up),
        Ok(g) => g,
    };
    if dies.is_some_and(|r| r.is_err())
        || (matches!(k.bound, Bound::Script) && getppid().as_raw() != k.front)
        || cancel.is_cancelled()
    {
        // The front died as the lease was taken: it printed nothing. Keep the lease
        // unreleased (the module doc's rule); it names this keeper, about to be gone.
        std::process::exit(exit::SOFTWARE);
    }
    if let (Some(v), false) = (guard.broke(), k.quiet || k.flock) {
        say(&report::broke_line(v, false));
    }
    // A lock with no directory (etcd, S3): the badge `leasehold unlock` verifies us by, made
    // before the script can know the lease (it learns it from our `ok`), kept until we return.
    let _badge = if leasehold::is_store_url(guard.path()) && !k.flock {
        match leasehold::KeeperBadge::create(&guard.lease_id()) {
            Ok(b) => Some(b),
            Err(e) => {
                say(&format!(
                    "leasehold: warning: {}; leasehold unlock will refuse (77) as it cannot verify this keeper, and the lock is released when the script exits",
                    leasehold::text::scrub(&e.to_string())
                ));
                None
            }
        }
    } else {
        None
    };
    // From here on nothing is printed: stderr too goes to /dev/null, so a caller reading it to
    // its end (cron) is not kept waiting by us.
    if let Ok(null) = nix::fcntl::open("/dev/null", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
    {
        let _ = nix::unistd::dup2_stderr(&null);
    }
    let path = guard.path().as_os_str().as_encoded_bytes().to_vec();
    let mut msg =
        format!("ok {} {} {}\n", guard.token(), guard.lease_id(), path.len()).into_bytes();
    msg.extend_from_slice(&path);
    if let Bound::Descriptor(w) = &k.bound {
        let job = Job {
            pid: k.script_pid,
            start: k.script_start,
            fd: w.fd,
            pgid: guard.lease().holder.pgid.unwrap_or(0),
        };
        return keep_descriptor(job, w, (up, down), &msg, guard, &lost);
    }
    if up.write_all(&msg).is_err() {
        // The front is gone: PDEATHSIG is on its way. Never release (see the module doc).
        std::process::exit(exit::SOFTWARE);
    }
    let mut answer = [0u8; 1];
    match down.read(&mut answer) {
        Ok(1) if answer[0] == b'p' => {
            if nix::sys::prctl::set_pdeathsig(None).is_err() {
                std::process::exit(exit::SOFTWARE);
            }
            let _ = up.write_all(b"k");
        }
        Ok(1) if answer[0] == b'a' => {
            let _ = guard.release_with("released: leasehold lock could not print the exports");
            let _ = up.write_all(b"r");
            return exit::SOFTWARE;
        }
        // The front died after we wrote `ok`: it may have printed the exports. Keep the lease
        // unreleased; the script, if it lives, is judged as a frozen holder's.
        _ => std::process::exit(exit::SOFTWARE),
    }
    drop(up);
    drop(down);
    let how = watch(&guard, &script, &lost, k.script_pid, k.script_start);
    let _ = guard.release_with(&how);
    0
}

/// The lease could not be taken: tells the front (`fail WHAT` for flock: `busy`, `late` or
/// `none`; `fail CODE` for `leasehold lock`, with its line said unless quiet) and returns the
/// keeper's exit status (the keeper's `flock`, `how`, `quiet` and `conflict` settings).
fn refused(
    (flock, how, quiet, conflict): (bool, Patience, bool, u8),
    e: &Error,
    up: &mut File,
) -> i32 {
    if flock {
        let what = match (e, how) {
            (Error::Timeout { .. }, _) => "late",
            (
                Error::WouldBlock { .. } | Error::Refused { .. } | Error::MutexStuck { .. },
                Patience::NoWait,
            ) => "busy",
            (Error::WouldBlock { .. } | Error::Refused { .. } | Error::MutexStuck { .. }, _) => {
                "late"
            }
            _ => "none",
        };
        let _ = up.write_all(format!("fail {what}\n").as_bytes());
        return 0;
    }
    let code = if crate::cli::exit::is_conflict(e) {
        if !quiet {
            say(&report::error_line(e));
        }
        i32::from(conflict)
    } else {
        say(&report::error_line(e));
        exit::exit_code(e)
    };
    let _ = up.write_all(format!("fail {code}\n").as_bytes());
    code
}

/// The hand-over and the watch of a keeper bound to a descriptor: `msg` is the `ok` line. The
/// front answers `p` once it holds the kernel lock, `a` when it could not take it (release);
/// if it dies instead, what the kernel shows decides, as always afterwards.
fn keep_descriptor(
    job: Job,
    w: &Watch,
    (mut up, mut down): (File, File),
    msg: &[u8],
    guard: LeaseGuard,
    lost: &File,
) -> i32 {
    if up.write_all(msg).is_ok() {
        let mut answer = [0u8; 1];
        match down.read(&mut answer) {
            Ok(1) if answer[0] == b'p' => {
                let _ = up.write_all(b"k");
            }
            Ok(1) if answer[0] == b'a' => {
                let _ = guard.release_with("not started: the kernel lock was not had");
                let _ = up.write_all(b"r");
                return 0;
            }
            _ => {}
        }
    }
    drop(up);
    drop(down);
    let how = watch_descriptor(&guard, w, job, lost);
    let _ = guard.release_with(&how);
    0
}

/// Until no process of the job holds the kernel lock (release), or the lease is lost (fence
/// the job). Looks again when the job exits, the file is closed somewhere, `flock -u` nudges
/// (SIGUSR1, from anyone: it only makes the keeper look), and every second. A process that
/// inherited the descriptor and holds the lock after the job's own descriptor stopped holding
/// it becomes the lease's job (`set_child`). Returns how it ended, for the released record.
fn watch_descriptor(guard: &LeaseGuard, w: &Watch, mut job: Job, lost: &File) -> String {
    let signals = SignalFd::with_flags(
        &SigSet::from(Signal::SIGUSR1),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    )
    .ok();
    let uid = guard.lease().holder.uid;
    let mut pidfd = open_script(job.pid, job.start);
    loop {
        if guard.is_lost() {
            let why = guard
                .loss()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "lease lost".into());
            return stop_or_tell(guard, pidfd.as_ref(), job.pid, &why);
        }
        match descriptor::who_holds(&job, uid, w) {
            Holder::Job => {}
            Holder::Other {
                pid,
                start,
                fd,
                pgid,
            } => {
                if guard.set_child(pid, start, pgid).is_ok() {
                    job = Job {
                        pid,
                        start,
                        fd,
                        pgid,
                    };
                    pidfd = open_script(pid, start);
                    continue;
                }
            }
            Holder::Nobody => {
                return format!(
                    "kernel lock released (descriptor {} of pid {})",
                    job.fd, job.pid
                );
            }
        }
        let mut fds = vec![PollFd::new(lost.as_fd(), PollFlags::POLLIN)];
        if let Some(p) = &pidfd {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        if let Some(s) = &signals {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
        }
        if let Some(c) = &w.closes {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, PollTimeout::from(1000u16));
        drop(fds);
        if let Some(s) = &signals {
            while let Ok(Some(_)) = s.read_signal() {}
        }
        if let Some(c) = &w.closes {
            let mut buf = [0u8; 4096];
            while matches!(nix::unistd::read(c, &mut buf), Ok(n) if n > 0) {}
        }
        if pidfd.as_ref().is_some_and(|p| {
            let mut f = [PollFd::new(p.as_fd(), PollFlags::POLLIN)];
            matches!(poll(&mut f, PollTimeout::ZERO), Ok(n) if n > 0)
        }) {
            pidfd = None;
        }
    }
}

/// A pidfd on the script, checked against its start time (closing the PID-reuse race).
fn open_script(pid: i32, start: u64) -> Option<OwnedFd> {
    let raw = rustix::process::Pid::from_raw(pid)?;
    let fd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).ok()?;
    match process::stat(pid) {
        Ok(Some(s)) if s.start == start && !s.is_dead() => Some(fd),
        _ => None,
    }
}

/// Acquires as asked, showing the wait on stderr; its loss is written to `lost_w`.
/// With `orphaned` (the front's pid), waiting ends — the keeper exits — once the front is gone.
fn take(
    b: &LeaseBuilder,
    how: Patience,
    quiet: bool,
    lost_w: OwnedFd,
    orphaned: Option<i32>,
    cancel: leasehold::Cancel,
) -> leasehold::Result<LeaseGuard> {
    let lost_w = Arc::new(File::from(lost_w));
    let display = WaitDisplay::new(quiet);
    let shown = display.clone();
    let stop = cancel.clone();
    let b = b
        .clone()
        .cancel(cancel)
        .on_lost(move |_| {
            let _ = (&*lost_w).write(b"!");
        })
        .on_wait(move |v| {
            if orphaned.is_some_and(|front| getppid().as_raw() != front) {
                // Nobody will take the kernel lock: stop waiting, giving up the ticket.
                stop.cancel();
                return;
            }
            shown.waiting(v)
        });
    let got = match how {
        Patience::NoWait => b.try_acquire(),
        Patience::Upto(w) => b.acquire_timeout(w),
        Patience::Forever => b.acquire(),
    };
    display.done();
    got
}

/// Until the lease ends: the script exits, a verified unlock, or the lease is lost (fence).
/// Returns how it ended, for the released record.
fn watch(guard: &LeaseGuard, script: &OwnedFd, lost: &File, pid: i32, start: u64) -> String {
    let Ok(signals) = SignalFd::with_flags(
        &SigSet::from(Signal::SIGUSR1),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    ) else {
        return stop_or_tell(
            guard,
            Some(script),
            pid,
            "the keeper cannot receive unlock requests",
        );
    };
    let lease = guard.lease();
    let ev = if leasehold::is_store_url(guard.path()) {
        Ok(JobEvidence::by_environment(
            &guard.lease_id(),
            lease.holder.uid,
            guard.path(),
        ))
    } else {
        LockPaths::new(guard.path())
            .map(|p| JobEvidence::new(&guard.lease_id(), lease.holder.uid, &p.lock, &p.mutex))
    };
    loop {
        let mut fds = [
            PollFd::new(script.as_fd(), PollFlags::POLLIN),
            PollFd::new(lost.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => {
                return stop_or_tell(
                    guard,
                    Some(script),
                    pid,
                    "the keeper cannot watch the script",
                );
            }
        }
        if fds[0].any().unwrap_or(false) {
            let left = stop_leftovers(guard, guard.timing().grace);
            return match left {
                0 => format!("script pid {pid} exited"),
                n => format!("script pid {pid} exited ({n} leftover process(es) stopped)"),
            };
        }
        if fds[1].any().unwrap_or(false) || guard.is_lost() {
            let why = guard
                .loss()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "lease lost".into());
            return stop_or_tell(guard, Some(script), pid, &why);
        }
        while let Ok(Some(si)) = signals.read_signal() {
            let asker = si.ssi_pid as i32;
            let ok = process::descends_from(asker, pid, start)
                || ev.as_ref().is_ok_and(|ev| ev.carried_by(asker));
            let same_user =
                matches!(process::stat(asker), Ok(Some(s)) if s.uid == lease.holder.uid);
            if ok && same_user {
                return format!("unlocked by pid {asker}");
            }
        }
    }
}

/// The lease was lost (or can no longer be watched): stop the script as `run` stops its
/// command — unless it has a controlling terminal, which is told instead. Returns how it ended.
/// `script` is `None` when no pidfd on it could be had (it is gone).
fn stop_or_tell(guard: &LeaseGuard, script: Option<&OwnedFd>, pid: i32, why: &str) -> String {
    let lock = guard.path().to_path_buf();
    let gone = script.is_none_or(|script| {
        let mut fds = [PollFd::new(script.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    });
    if gone {
        format!("script pid {pid} exited; {why}")
    } else if process::controlling_tty(pid).is_some() {
        if let Some(tty) = process::terminal_path(pid) {
            tell(&tty, &report::script_lost_line(&lock, why, pid));
        }
        // Not signalled, so never released either: the lease (held or revoked) keeps naming
        // the live script, and no contender on this host takes over beside it (a takeover
        // refuses to stop a script at a terminal). It frees when the script ends.
        std::process::exit(0)
    } else {
        let grace = guard.timing().grace;
        let left = crate::supervise::fence::stop_job(Pid::from_raw(pid), grace);
        stop_carriers(guard, pid, grace);
        format!("fenced: {why} ({left} process(es) survived)")
    }
}

/// When the script has exited: what it started after the `eval` (processes carrying this
/// lease in their environment) and left running in its recorded process group is stopped
/// before the release, as `run` stops its command's leftovers — SIGTERM, up to `grace`, then
/// the verified SIGKILL. Returns how many there were.
fn stop_leftovers(guard: &LeaseGuard, grace: Duration) -> usize {
    let lease = guard.lease();
    let (Some(pg), Ok(p)) = (lease.holder.pgid, LockPaths::new(guard.path())) else {
        return 0;
    };
    let ev = JobEvidence::new(&lease.lease_id, lease.holder.uid, &p.lock, &p.mutex);
    let left = process::judge_group(pg, &ev).belongs;
    if left.is_empty() {
        return 0;
    }
    for m in &left {
        if matches!(process::stat(m.pid), Ok(Some(s)) if s.start == m.start) {
            let _ = nix::sys::signal::kill(Pid::from_raw(m.pid), Signal::SIGTERM);
        }
    }
    let end = std::time::Instant::now() + grace;
    while !process::judge_group(pg, &ev).belongs.is_empty() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = process::kill_group_verified(pg, &ev, Duration::from_secs(2));
    left.len()
}

/// Script mode's children that carry the lease in their environment and share a process group
/// the script does not lead (so `stop_job` did not reach them): each verified, SIGKILLed.
fn stop_carriers(guard: &LeaseGuard, pid: i32, grace: Duration) {
    let lease = guard.lease();
    let Some(pg) = lease.holder.pgid.filter(|pg| *pg != pid) else {
        return;
    };
    if let Ok(p) = LockPaths::new(guard.path()) {
        let ev = JobEvidence::new(&lease.lease_id, lease.holder.uid, &p.lock, &p.mutex);
        let _ = process::kill_group_verified(pg, &ev, grace.max(Duration::from_secs(1)));
    }
}

/// Writes one line to the script's terminal, without making it ours and without blocking.
fn tell(tty: &std::path::Path, line: &str) {
    let fd = nix::fcntl::open(
        tty,
        OFlag::O_WRONLY | OFlag::O_NOCTTY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    );
    if let Ok(fd) = fd {
        let text = format!("\r\n{}\r\n", leasehold::text::scrub(line));
        let _ = File::from(fd).write_all(text.as_bytes());
    }
}

/// One line on stderr (the front's, while we wait; /dev/null after), as `cli`'s `say!` writes it.
fn say(line: &str) {
    let _ = writeln!(io::stderr(), "{}", leasehold::text::scrub(line));
}
