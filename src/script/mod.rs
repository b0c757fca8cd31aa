//! Script mode: the keeper process that holds a lease for a shell script, and the hand-over from
//! `leasehold lock` to it — also used by the flock front end for `-F` (bound to the exec'd
//! command) and the FD form (bound to the shell's descriptor: [`Bound::Descriptor`],
//! `descriptor.rs`, PROTOCOL.md §12).
//!
//! Owns: forking the keeper and detaching it (own session, stdio on /dev/null, every other
//! inherited descriptor closed, `PR_SET_PDEATHSIG` until the hand-over is done), the two pipes
//! of the hand-over and their messages, and (in `keeper.rs`) what the keeper does afterwards:
//! renew (the library's guard), watch the script through a pidfd, release when it exits or
//! when `leasehold unlock` asks (SIGUSR1 from a verified requester), fence it when the lease is
//! lost. Must never: let the keeper outlive a `leasehold lock` that died before it knew the
//! exports were printed, and keep the lease (it dies with it instead: PROTOCOL.md §11); release
//! a lease whose exports may have reached the script while the script may still run; signal a
//! script that has a controlling terminal; hold a duplicate of a descriptor it is bound to.
//! (Bound to a descriptor, the keeper does not die with the front: the kernel's evidence of the
//! lock, not the hand-over, decides when the lease ends.)
//!
//! # The hand-over
//!
//! `leasehold lock` (the *front*) forks the keeper before starting any thread, so the child may
//! run ordinary code. Up pipe: keeper → front; down pipe: front → keeper.
//!
//! 1. The keeper sets `PR_SET_PDEATHSIG = SIGKILL` (checking its parent is still the front),
//!    calls `setsid`, puts stdin and stdout on /dev/null and closes every other descriptor but
//!    stderr and its two pipe ends; it acquires, showing wait lines on the front's stderr, then
//!    puts stderr on /dev/null too and writes `ok TOKEN LEASE_ID LEN\n` + LOCK's path (or
//!    `fail STATUS\n` after printing why).
//! 2. The front writes the exports to stdout in one `write` and sends `p` (or `a` if the write
//!    failed: nothing was printed in full, so the keeper releases and answers `r`).
//! 3. The keeper clears PDEATHSIG and answers `k`; only then does the front exit 0.
//!
//! If the front dies while the keeper waits, the kernel SIGTERMs it (PDEATHSIG), which cancels
//! the wait: it gives up its queue ticket and exits. If the front dies at any later point
//! before 3, the kernel SIGKILLs the keeper: a lease it held then
//! names a dead keeper and the live script, which a contender treats as a frozen holder
//! (verified, stopped, taken over) — the lease is never *released* while a script that may have
//! read the exports still runs. A keeper that reads end-of-file on the down pipe exits without
//! releasing for the same reason.

pub mod descriptor;
mod keeper;

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::unistd::{ForkResult, fork, pipe2};

use leasehold::LeaseBuilder;

/// How long to wait for the lock.
#[derive(Debug, Clone, Copy)]
pub enum Patience {
    /// `-n`: not at all.
    NoWait,
    /// `-w`: at most this long.
    Upto(Duration),
    /// As long as it takes.
    Forever,
}

/// What the lease is bound to, beside the process it is held for.
#[derive(Debug)]
pub enum Bound {
    /// The process itself (`leasehold lock`, flock's `-F`): released when it exits; the keeper
    /// dies with the front until the hand-over is done.
    Script,
    /// A kernel lock on a descriptor of the process (flock's FD form): released when no
    /// process of its job holds that lock any more ([`descriptor`]). The keeper does not die
    /// with the front: it decides by that evidence whatever the front did.
    Descriptor(descriptor::Watch),
}

/// The script a keeper holds a lease for.
#[derive(Debug)]
pub struct Script {
    /// Its pid.
    pub pid: i32,
    /// Its start time (`/proc/PID/stat` field 22).
    pub start: u64,
    /// A pidfd on it, opened by the front and checked against `start`.
    pub pidfd: OwnedFd,
}

/// What the keeper took, as the front prints it.
#[derive(Debug)]
pub struct Held {
    /// LOCK's absolute path (as `LEASEHOLD_LOCK` must carry it).
    pub lock: PathBuf,
    /// The fencing token.
    pub token: u64,
    /// The lease id.
    pub lease_id: String,
}

/// How the hand-over ended, seen from the front.
#[derive(Debug)]
pub enum Started {
    /// The keeper holds the lease and waits for the exports to be printed.
    Held(Held, Front),
    /// The keeper could not take it; it already said why. The exit status.
    Failed(i32),
    /// For the flock front end (which says nothing itself): a holder kept it — at once (`-n`),
    /// or until the wait ran out (`true`).
    Busy(bool),
    /// For the flock front end: it cannot be had for another reason (flock goes on with the
    /// kernel lock alone).
    Unavailable,
    /// The script ended while the keeper waited for the lock.
    ScriptGone,
    /// The keeper died before answering.
    KeeperDied,
}

/// The front's ends of the two pipes, after the keeper holds the lease.
#[derive(Debug)]
pub struct Front {
    up: std::fs::File,
    down: std::fs::File,
}

/// Forks the keeper and waits for it to take the lease (or fail). Must be called before this
/// process starts any thread.
/// `conflict` is the exit status for a lock that could not be had (`-E`); `flock`: the flock
/// front end's keeper, which prints nothing and answers [`Started::Busy`] or
/// [`Started::Unavailable`] rather than [`Started::Failed`].
pub fn start(
    b: LeaseBuilder,
    how: Patience,
    quiet: bool,
    conflict: u8,
    script: Script,
    bound: Bound,
    flock: bool,
) -> io::Result<Started> {
    let (up_r, up_w) = pipe2(OFlag::O_CLOEXEC)?;
    let (down_r, down_w) = pipe2(OFlag::O_CLOEXEC)?;
    let front = std::process::id() as i32;
    // SAFETY: this process has not started a thread (callers' contract), so the child may run
    // ordinary code: no lock can be held by a thread that does not exist in it.
    match unsafe { fork() }.map_err(io::Error::from)? {
        ForkResult::Child => {
            drop(up_r);
            drop(down_w);
            keeper::run(keeper::Keeper {
                builder: b,
                how,
                quiet,
                conflict,
                front,
                script_pid: script.pid,
                script_start: script.start,
                bound,
                flock,
                up: up_w,
                down: down_r,
            });
        }
        ForkResult::Parent { .. } => {
            drop(up_w);
            drop(down_r);
            wait_held(
                std::fs::File::from(up_r),
                std::fs::File::from(down_w),
                &script,
            )
        }
    }
}

/// The front's wait for the keeper's first message, watching the script meanwhile.
fn wait_held(mut up: std::fs::File, down: std::fs::File, script: &Script) -> io::Result<Started> {
    loop {
        let mut fds = [
            PollFd::new(up.as_fd(), PollFlags::POLLIN),
            PollFd::new(script.pidfd.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let script_gone = fds[1].any().unwrap_or(false);
        let keeper_said = fds[0].any().unwrap_or(false);
        if keeper_said {
            break;
        }
        if script_gone {
            return Ok(Started::ScriptGone);
        }
    }
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 256 {
        match up.read(&mut byte) {
            Ok(0) => return Ok(Started::KeeperDied),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8_lossy(&line).into_owned();
    let words: Vec<&str> = text.split(' ').collect();
    match words.as_slice() {
        ["fail", "busy"] => Ok(Started::Busy(false)),
        ["fail", "late"] => Ok(Started::Busy(true)),
        ["fail", "none"] => Ok(Started::Unavailable),
        ["fail", code] => Ok(Started::Failed(code.parse().unwrap_or(70))),
        ["gone"] => Ok(Started::ScriptGone),
        ["ok", token, id, len] => {
            let (Ok(token), Ok(len)) = (token.parse::<u64>(), len.parse::<usize>()) else {
                return Ok(Started::KeeperDied);
            };
            let mut path = vec![0u8; len];
            if up.read_exact(&mut path).is_err() {
                return Ok(Started::KeeperDied);
            }
            let lock = PathBuf::from(std::ffi::OsString::from(
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&path),
            ));
            let held = Held {
                lock,
                token,
                lease_id: (*id).to_string(),
            };
            Ok(Started::Held(held, Front { up, down }))
        }
        _ => Ok(Started::KeeperDied),
    }
}

impl Front {
    /// The exports were printed: let the keeper keep the lease on its own. True when it
    /// confirmed (it no longer dies with us).
    pub fn printed(mut self) -> bool {
        self.down.write_all(b"p").is_ok() && self.answer() == Some(b'k')
    }

    /// The exports could not be printed: the keeper releases the lease and exits. True when it
    /// confirmed the release.
    pub fn abort(mut self) -> bool {
        self.down.write_all(b"a").is_ok() && self.answer() == Some(b'r')
    }

    fn answer(&mut self) -> Option<u8> {
        let mut b = [0u8; 1];
        loop {
            match self.up.read(&mut b) {
                Ok(1) => return Some(b[0]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => return None,
            }
        }
    }
}

/// The raw descriptor numbers a detached keeper keeps: stdio, its two pipe ends, and what it
/// watches (`extra`).
fn keep_fds(a: &OwnedFd, b: &OwnedFd, extra: Option<&OwnedFd>) -> Vec<i32> {
    let mut v = vec![0, 1, 2, a.as_raw_fd(), b.as_raw_fd()];
    v.extend(extra.map(|e| e.as_raw_fd()));
    v
}
