//! The guardian: a small process that stops the command's job when the wrapper dies without
//! ending it — SIGKILLed alone, or with its caller's whole process group (a CI runner's cancel:
//! `kill -KILL -- -PGID`), where PDEATHSIG reaches only the command itself and the wrapper's own
//! fence cannot run.
//!
//! Owns: starting the guardian before the command, in a process group of its own (no signal to
//! the wrapper's process group or terminal reaches it) — dormant (`dormant.rs`: a
//! `clone(CLONE_VM)` that copies nothing and execs the guardian proper from /proc/self/exe only
//! once the wrapper's end of the socket closes or a second has passed), or, where that cannot
//! run, forked (and re-executed when the wrapper has more than one thread) —; arming it once
//! the lease is taken (lease id,
//! LOCK, uid, the command's start time, the grace, the wrapper's pid) through a socket whose
//! other end only the wrapper holds, with a duplicate of the descriptor on which the wrapper
//! holds its kernel lock on LOCK's file ([`LeaseGuard::lock_file_descriptor`], passed as
//! `SCM_RIGHTS`): kept until the job is stopped, so that util-linux flock(1) blocked on LOCK
//! does not start beside what a SIGKILLed wrapper's command left running (PROTOCOL.md §10);
//! dismissing it (SIGKILL: it has done nothing, and the release lets go of that lock for every
//! duplicate) once the job has ended through the wrapper; and, in the guardian, the stop on
//! EOF: SIGTERM (and SIGCONT) every process carrying this lease's environment, wait the grace
//! while any lives, SIGKILL them, one line on stderr, then exit (closing the lock's duplicate).
//! Also passed: duplicates of the descriptors on which the wrapper keeps the lock of files
//! that are no longer LOCK (`LeaseGuard::old_file_descriptors`: the file its lease replaced,
//! claimed); once the job is stopped, a flock(1) blocked on one of them is served
//! (`leasehold::serve_blocked`) before the guardian exits and lets go of LOCK's, so it never
//! runs beside the next holder (PROTOCOL.md §4); those nobody can lock any more (nameless, open
//! nowhere else) are closed once a second meanwhile, not to stop a read-only remount.
//! Must never: hold a descriptor but its socket, stderr and those duplicates (no lease file, no
//! mutex, not the caller's stdout); lock or unlock anything itself but in that serving; signal
//! a process not verified by `leasehold::process` (this lock's path and this lease id in its
//! environment, the lease's uid, started no earlier than the command, re-read just before each
//! signal); act before it is armed or on anything but EOF; survive a wrapper that ended its job
//! itself.

use std::ffi::CString;
use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use leasehold::process::{self, JobEvidence};
use leasehold::{LeaseGuard, Result};

use super::io_error;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod dormant;

/// The hidden first argument of an exec'd guardian (`leasehold --leasehold-guardian`): its end
/// of the socket is descriptor 3.
pub const ARG: &str = "--leasehold-guardian";

/// The descriptor the guardian reads its socket on.
const PIPE_FD: RawFd = 3;

/// How long the guardian waits, at most, for SIGKILLed processes to be gone.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// How often the guardian looks whether the job is gone during the grace.
const LOOK: Duration = Duration::from_millis(10);

/// The wrapper's side: the guardian's pid (our child, unreaped while we hold this) and our
/// end of its socket.
#[derive(Debug)]
pub(super) struct Guardian {
    pid: Pid,
    tx: OwnedFd,
}

/// What a re-executed guardian needs, built before the fork (the child must not allocate).
struct Exec {
    path: CString,
    argv: [CString; 2],
}

impl Guardian {
    /// Starts the guardian ([`begin`]), in its own process group, holding only its socket's
    /// end and stderr. `lock` names the lock in messages.
    pub(super) fn start(lock: &Path) -> Result<Guardian> {
        let (rx, tx) =
            socket_pair().map_err(|e| io_error(lock, "create the guardian's socket", e))?;
        let old_mask = SigSet::all()
            .thread_swap_mask(SigmaskHow::SIG_SETMASK)
            .map_err(|e| io_error(lock, "block signals", e.into()))?;
        let started = begin(&rx, &tx);
        let _ = old_mask.thread_set_mask();
        let pid = started.map_err(|e| io_error(lock, "start the guardian", e))?;
        drop(rx);
        // Both sides set the group (as for the command), so that it is out of ours, whichever
        // runs first, before `start` returns: no wait for the child to be scheduled.
        if let Err(e) = nix::unistd::setpgid(pid, pid)
            && nix::unistd::getpgid(Some(pid)) != Ok(pid)
        {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
            return Err(io_error(
                lock,
                "move the guardian to its own process group",
                e.into(),
            ));
        }
        Ok(Guardian { pid, tx })
    }

    /// The guardian's pid (a child of ours, to be told from the command's leftovers).
    pub(super) fn pid(&self) -> Pid {
        self.pid
    }

    /// Arms the guardian for `guard`'s lease and the command started at `since` (its start
    /// time), once it is out of our process group and session. Call before the command's gate
    /// opens.
    pub(super) fn arm(&self, guard: &LeaseGuard, since: u64) -> Result<()> {
        let lock = guard.path();
        let fail = |why: &str| {
            io_error(
                lock,
                "start the guardian",
                std::io::Error::other(why.to_string()),
            )
        };
        // `start` moved it into a process group of its own; a signal to ours cannot reach it.
        if nix::unistd::getpgid(Some(self.pid)) != Ok(self.pid) {
            return Err(fail("the guardian is not in a process group of its own"));
        }
        let l = guard.lease();
        let msg = encode(&Armed {
            since,
            grace: guard.timing().grace,
            uid: l.holder.uid,
            wrapper: std::process::id() as i32,
            lease_id: guard.lease_id(),
            lock: lock.to_path_buf(),
        });
        let mut buf = &msg[..];
        while !buf.is_empty() {
            match nix::unistd::write(&self.tx, buf) {
                Ok(n) => buf = &buf[n..],
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(io_error(lock, "arm the guardian", e.into())),
            }
        }
        let held = guard.lock_file_descriptor();
        let send = |fd: Option<RawFd>| {
            send_descriptor(&self.tx, fd).map_err(|e| io_error(lock, "arm the guardian", e))
        };
        send(held.as_ref().map(AsRawFd::as_raw_fd))?;
        // Then the files we keep locked that are no longer LOCK, one a message, and an end.
        for old in guard.old_file_descriptors() {
            send(Some(old.as_raw_fd()))?;
        }
        send(None)
    }

    /// The job ended through the wrapper: the guardian goes without doing anything. It holds
    /// nothing of its own (its duplicate of the lock's descriptor loses the lock when the
    /// release lets go of it), so a SIGKILL is all it takes, and once `kill` has returned it never runs another
    /// instruction of its own (a pending SIGKILL ends a task before it returns to user mode):
    /// not waiting for its teardown keeps a short job's run short. Only the supervising thread
    /// reaps, so an unreaped child's pid cannot have been reused when it is signalled.
    pub(super) fn dismiss(self) {
        if let Ok(WaitStatus::StillAlive) = waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
            let _ = kill(self.pid, Signal::SIGKILL);
        }
    }
}

/// A connected pair of Unix stream sockets, close-on-exec: the guardian's end, the wrapper's.
/// A socket rather than a pipe, to pass the lock's descriptor; EOF is the same.
fn socket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors the call fills in.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one byte on `sock`, with `fd` attached (`SCM_RIGHTS`) when there is one: `l` (the
/// lock's descriptor follows) or `n` (the holder holds no lock on LOCK's file).
fn send_descriptor(sock: &OwnedFd, fd: Option<RawFd>) -> std::io::Result<()> {
    let mut byte = [if fd.is_some() { b'l' } else { b'n' }];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one descriptor's control message, aligned for `cmsghdr`.
    let mut space = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; every pointer set below lives through the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_* compute within `space`, which CMSG_SPACE(sizeof int) fits.
        unsafe {
            let len = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = len;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    loop {
        // SAFETY: `msg` and what it points to are valid for the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n == 1 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The guardian's side of [`send_descriptor`]: `None` on EOF or an error (the wrapper is gone);
/// else the descriptor received, if one was sent.
fn receive_descriptor(sock: RawFd) -> Option<Option<OwnedFd>> {
    use std::os::fd::FromRawFd;
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut space = [0u64; 8];
    loop {
        // SAFETY: a zeroed msghdr is valid; every pointer set below lives through the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&space);
        // SAFETY: as above.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && Errno::last() == Errno::EINTR {
            continue;
        }
        if n != 1 {
            return None;
        }
        // SAFETY: the kernel filled the control buffer and set `msg_controllen`; a
        // SCM_RIGHTS message carries descriptors now ours.
        let fd = unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (!c.is_null()
                && (*c).cmsg_level == libc::SOL_SOCKET
                && (*c).cmsg_type == libc::SCM_RIGHTS)
                .then(|| {
                    OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                        libc::CMSG_DATA(c).cast::<RawFd>(),
                    ))
                })
        };
        return Some(fd);
    }
}

/// Starts the guardian, every signal blocked: dormant (`dormant.rs`: a `clone(CLONE_VM)`,
/// exec'd only once the wrapper's end of the socket closes or a second has passed) on x86_64
/// and aarch64, else [`forked`].
fn begin(rx: &OwnedFd, tx: &OwnedFd) -> std::io::Result<Pid> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if !under_valgrind() {
        return dormant::clone(rx.as_raw_fd(), tx.as_raw_fd());
    }
    let _ = tx;
    forked(rx)
}

/// Whether this process runs under valgrind, which cannot run a `clone(CLONE_VM)` child that is
/// not a thread (it stops the whole program): it preloads its `vgpreload_*.so` into every
/// program it runs. `benches/compare/instructions.sh` counts a run's instructions under it.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn under_valgrind() -> bool {
    std::env::var_os("LD_PRELOAD").is_some_and(|p| {
        p.as_bytes()
            .windows(b"/vgpreload_".len())
            .any(|w| w == b"/vgpreload_")
    })
}

/// The guardian forked, and re-executed from /proc/self/exe when this process has other
/// threads: where `dormant.rs` cannot run (other architectures, valgrind).
fn forked(rx: &OwnedFd) -> std::io::Result<Pid> {
    let exec = (!single_threaded()).then(|| Exec {
        path: c"/proc/self/exe".to_owned(),
        argv: [c"leasehold".to_owned(), c"--leasehold-guardian".to_owned()],
    });
    // SAFETY: with other threads, the child only makes async-signal-safe system calls on
    // memory prepared before the fork, then execs; alone, it may run any code.
    match unsafe { fork() } {
        // SAFETY: we are the freshly forked child.
        Ok(ForkResult::Child) => unsafe { after_fork(rx.as_raw_fd(), exec.as_ref()) },
        Ok(ForkResult::Parent { child }) => Ok(child),
        Err(e) => Err(e.into()),
    }
}

/// The guardian's signals: default dispositions, but nothing from the terminal (the caller's
/// session is ours; we are never in its foreground) nor a closed stderr ends it; then none
/// blocked. Async-signal-safe.
fn settle_signals() {
    // SAFETY: setting dispositions to SIG_DFL or SIG_IGN installs no handler.
    unsafe {
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        for sig in [
            libc::SIGPIPE,
            libc::SIGHUP,
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
}

/// Whether this process has a single thread (then a forked child may run any code).
fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.count() == 1)
}

/// The guardian between fork and its loop: its own process group, its signals settled, the
/// socket on descriptor 3, /dev/null on 0 and 1, nothing else open but stderr; then exec (with
/// other threads in the wrapper) or serve.
///
/// # Safety
/// Must be called only in the child of a `fork`, with `exec` built before the fork.
unsafe fn after_fork(rx: RawFd, exec: Option<&Exec>) -> ! {
    // SAFETY: raw system calls on values prepared before the fork.
    unsafe {
        libc::setpgid(0, 0);
        settle_signals();
        if rx == PIPE_FD {
            libc::fcntl(PIPE_FD, libc::F_SETFD, 0);
        } else if libc::dup2(rx, PIPE_FD) < 0 {
            libc::_exit(1);
        }
        if libc::syscall(libc::SYS_close_range, PIPE_FD + 1, u32::MAX, 0) != 0 {
            for fd in PIPE_FD + 1..4096 {
                libc::close(fd);
            }
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if null > PIPE_FD {
                libc::close(null);
            }
        }
        if let Some(e) = exec {
            let argv = [e.argv[0].as_ptr(), e.argv[1].as_ptr(), std::ptr::null()];
            libc::execv(e.path.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
        libc::_exit(serve(PIPE_FD))
    }
}

/// An exec'd guardian (`leasehold --leasehold-guardian`): settles its signals (blocked until
/// now when it was dormant) and serves its socket on descriptor 3.
pub fn main() -> i32 {
    settle_signals();
    serve(PIPE_FD)
}

/// What the wrapper tells its guardian once the lease is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Armed {
    /// The command's start time: its descendants are no older.
    since: u64,
    grace: Duration,
    uid: u32,
    wrapper: i32,
    lease_id: String,
    lock: PathBuf,
}

/// `LEN (u32, native) since grace_ms uid wrapper lease_id lock`, NUL-separated after the length.
fn encode(a: &Armed) -> Vec<u8> {
    let mut body = format!(
        "{}\0{}\0{}\0{}\0{}\0",
        a.since,
        a.grace.as_millis(),
        a.uid,
        a.wrapper,
        a.lease_id
    )
    .into_bytes();
    body.extend_from_slice(a.lock.as_os_str().as_bytes());
    let mut msg = (body.len() as u32).to_ne_bytes().to_vec();
    msg.extend_from_slice(&body);
    msg
}

fn decode(body: &[u8]) -> Option<Armed> {
    let mut f = body.splitn(6, |b| *b == 0);
    let mut num = || -> Option<u64> { std::str::from_utf8(f.next()?).ok()?.parse().ok() };
    let since = num()?;
    let grace = Duration::from_millis(num()?);
    let uid = u32::try_from(num()?).ok()?;
    let wrapper = i32::try_from(num()?).ok()?;
    let lease_id = String::from_utf8(f.next()?.to_vec()).ok()?;
    let lock = PathBuf::from(std::ffi::OsStr::from_bytes(f.next()?));
    Some(Armed {
        since,
        grace,
        uid,
        wrapper,
        lease_id,
        lock,
    })
}

/// Reads exactly `buf.len()` bytes; false on EOF or an error.
fn read_exact(fd: RawFd, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: within `buf`.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n < 0 && Errno::last() == Errno::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

/// The guardian's life: wait to be armed (EOF first: the lease was never taken, or the wrapper
/// died before the command could start — it dies by PDEATHSIG at its gate), then for EOF (the
/// wrapper is gone: a wrapper that ended its job dismisses us first), then stop the job.
fn serve(fd: RawFd) -> i32 {
    // SAFETY: PR_SET_NAME with a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"lh-guardian".as_ptr(), 0, 0, 0) };
    let mut len = [0u8; 4];
    if !read_exact(fd, &mut len) {
        return 0;
    }
    let mut body = vec![0u8; u32::from_ne_bytes(len) as usize];
    if !read_exact(fd, &mut body) {
        return 0;
    }
    let Some(armed) = decode(&body) else {
        return 1;
    };
    // The holder's lock on LOCK's file, kept until the job is stopped (dropped when we exit).
    let Some(_held) = receive_descriptor(fd) else {
        stop(&armed);
        return 0;
    };
    // The locks it keeps on files that are no longer LOCK (`LeaseGuard::old_file_descriptors`):
    // served, once the job is stopped, before we let go of LOCK's.
    let mut old: Vec<std::fs::File> = Vec::new();
    loop {
        match receive_descriptor(fd) {
            Some(Some(f)) => old.push(f.into()),
            Some(None) => break,
            None => {
                stop(&armed);
                serve_old(&armed, &old);
                return 0;
            }
        }
    }
    let mut byte = [0u8; 64];
    loop {
        // While we keep old files, once a second those nobody can lock any more are closed
        // (nameless, open nowhere else: `leasehold::drop_unreachable`), so that they do not
        // stop the file system from being remounted read-only under the job (PROTOCOL.md §3).
        if !old.is_empty() {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, ours.
            let r = unsafe { libc::poll(&mut p, 1, 1000) };
            if r == 0 {
                leasehold::drop_unreachable(&mut old);
                continue;
            }
            if r < 0 && Errno::last() == Errno::EINTR {
                continue;
            }
        }
        // SAFETY: within `byte`.
        let n = unsafe { libc::read(fd, byte.as_mut_ptr().cast(), byte.len()) };
        if n == 0 || (n < 0 && Errno::last() != Errno::EINTR) {
            break;
        }
    }
    stop(&armed);
    serve_old(&armed, &old);
    0
}

/// Serves programs blocked on the wrapper's old files (`leasehold::serve_blocked`), saying so.
fn serve_old(a: &Armed, old: &[std::fs::File]) {
    leasehold::serve_blocked(&a.lock, old, |s| {
        let _ = writeln!(
            std::io::stderr(),
            "{}",
            crate::cli::report::served_line(s, true)
        );
    });
}

/// The wrapper is gone without ending the job: SIGTERM (and SIGCONT) every process carrying
/// this lease's environment, wait up to the grace while any lives, SIGKILL what is left, and
/// say so when anything was there.
fn stop(a: &Armed) {
    let ev = JobEvidence::by_environment(&a.lease_id, a.uid, &a.lock);
    let termed = process::signal_carriers(&ev, a.since, Signal::SIGTERM);
    if termed.is_empty() {
        return;
    }
    process::signal_carriers(&ev, a.since, Signal::SIGCONT);
    let end = Instant::now() + a.grace;
    let mut left = process::job_carriers(&ev, a.since).len();
    while left > 0 && Instant::now() < end {
        std::thread::sleep(LOOK.min(end - Instant::now()));
        left = process::job_carriers(&ev, a.since).len();
    }
    let stuck = process::kill_carriers_verified(&ev, a.since, KILL_WAIT).err();
    let line =
        crate::cli::report::guardian_line(&a.lock, a.wrapper, termed.len(), left, stuck.as_deref());
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arming_message_round_trips() {
        let a = Armed {
            since: 123,
            grace: Duration::from_millis(1500),
            uid: 1000,
            wrapper: 42,
            lease_id: "abc".into(),
            lock: PathBuf::from("/tmp/x\u{1}y"),
        };
        let m = encode(&a);
        assert_eq!(decode(&m[4..]), Some(a));
        assert_eq!(decode(b"1\0x"), None);
    }
}
