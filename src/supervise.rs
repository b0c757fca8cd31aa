//! Running the guarded command as a child of the lease holder, and keeping it inside the lease.
//!
//! Owns: starting the command (fork from the main thread, own process group, `PR_SET_PDEATHSIG`
//! = SIGKILL, held at a gate until the lease names it), the terminal hand-over, forwarding
//! INT/TERM/HUP/QUIT, noticing that the guard was lost, fencing (SIGTERM the command's process
//! group, wait the grace, SIGKILL it, wait until no member lives), and turning how the command
//! ended into an exit status (its own, or 128+N for signal N, or 74 when fenced).
//! Must never: let the command run a single instruction of its own before the lease records its
//! pid, start time and process group; release or report a lease before the command (and its
//! process group, when fenced) is dead; allocate or take a lock between `fork` and `exec`.
//!
//! # How the command is started
//!
//! The child is forked by the thread that calls [`Supervisor::run`] (the main thread of the
//! `leasehold` binary, which lives as long as the process: `PR_SET_PDEATHSIG` fires when the
//! *thread* that forked exits). Between `fork` and `exec` the child only makes raw system calls:
//! it resets the signal dispositions the wrapper changed, moves into its own process group, sets
//! PDEATHSIG to SIGKILL, checks that its parent is still the wrapper (closing the race with a
//! wrapper that died just before), and then blocks on a pipe. The wrapper meanwhile records the
//! child's pid, start time and process group in the lease ([`LeaseGuard::set_child`]) and only
//! then opens the gate; the child `execve`s the command. An `exec` failure comes back through a
//! second close-on-exec pipe and ends in exit status 127 (not found) or 126 (cannot run).
//!
//! # The terminal
//!
//! Without a terminal (cron, CI, or when leasehold is not in the terminal's foreground) the
//! command simply runs in its own process group; signals sent to leasehold are forwarded to that
//! group. With a controlling terminal of which leasehold is in the foreground, leasehold does
//! what a job-control shell does: the command's process group becomes the terminal's foreground
//! group, so the terminal's Ctrl-C, Ctrl-\ and Ctrl-Z, and reads from the terminal (an
//! interactive prompt) reach the command exactly as they would without leasehold. When the
//! command is stopped (Ctrl-Z), leasehold takes the terminal back for its own process group and
//! stops that group with SIGSTOP, so the calling shell sees the job stopped; when it is continued
//! (`fg`), leasehold gives the terminal back to the command if it is itself in the foreground
//! again and sends the command SIGCONT. When the command ends, the terminal is returned to
//! leasehold's process group.
//!
//! Known differences: a process piped *with* leasehold (`leasehold run L -- cmd | less`) is no
//! longer in the terminal's foreground while the command runs, so put such a pipeline inside the
//! command (`-c 'cmd | less'`); a non-interactive script that calls leasehold does not itself
//! receive the terminal's Ctrl-C (leasehold exits 130, which `set -e` or a status check sees).
//! While the whole job is suspended its heartbeat stops too: a job suspended for longer than its
//! renew window is fenced when it is continued, and may be taken over once it has been silent
//! for a TTL.
//!
//! # Fencing
//!
//! The guard's loss callback (from its background thread) only sets a flag and writes a byte to a
//! self-pipe; the supervising thread then SIGTERMs (and SIGCONTs) the command's process group,
//! waits up to the grace, SIGKILLs the group and the command, and waits until no live (non-zombie)
//! process is left in the group. The command is reaped only after that, so its pid — the group's
//! id — cannot be reused while the group is being signalled. The renew deadline leaves room for
//! the grace, so the command is dead before any contender may judge the lease stale. A command
//! killed from outside while the lease was taken (a contender stopping a frozen wrapper's job, a
//! forced break) also counts as fenced.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// How long the wrapper sleeps at most without a wake-up byte: a safety net only (every event
/// it acts on writes to its wake pipe).
const SAFETY_NET: Duration = Duration::from_secs(600);

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{
    SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal, kill, killpg, sigaction,
};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpgrp, getpid, pipe2, setpgid, tcgetpgrp, tcsetpgrp};

use leasehold::process;
use leasehold::{Error, Result};
use leasehold::{LeaseGuard, LossReason};

/// An I/O failure on `path` while doing `op`.
fn io_error(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Error {
    Error::Io {
        path: path.into(),
        op,
        source,
    }
}

/// Signals sent to leasehold that are forwarded to the command's process group.
pub const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// How long, at most, to wait for a SIGKILLed process group to empty before giving up on it.
const KILL_WAIT: Duration = Duration::from_secs(10);

// State shared with the signal handler and the loss callback. There is one supervisor per
// process (see `Supervisor::new`).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
static PENDING: [AtomicBool; 5] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];
const CHLD_SLOT: usize = 4;
static LOST: AtomicBool = AtomicBool::new(false);
static CREATED: AtomicBool = AtomicBool::new(false);

fn slot(sig: libc::c_int) -> Option<usize> {
    if sig == libc::SIGCHLD {
        return Some(CHLD_SLOT);
    }
    FORWARDED.iter().position(|s| *s as libc::c_int == sig)
}

/// Writes one byte to the self-pipe; async-signal-safe, keeps errno.
fn wake() {
    let fd = WAKE_FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    // SAFETY: errno is thread-local; write(2) on a non-blocking pipe is async-signal-safe. A full
    // pipe (EAGAIN) already holds a wake-up, so the result does not matter.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let byte = 1u8;
        let _ = libc::write(fd, (&raw const byte).cast(), 1);
        *errno = saved;
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    if let Some(i) = slot(sig) {
        PENDING[i].store(true, Ordering::Release);
    }
    wake();
}

/// The command to run: its argv and the program file it resolves to.
#[derive(Debug, Clone)]
pub struct Job {
    argv: Vec<OsString>,
    program: PathBuf,
}

/// Why the command was never started: an exit status (127 not found, 126 cannot run, 64 empty)
/// and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotStarted {
    /// The exit status to report.
    pub code: i32,
    /// What went wrong, naming the command.
    pub why: String,
}

impl Job {
    /// Resolves `argv[0]` the way `execvp` does (a name with a `/` is used as is; otherwise the
    /// directories of `PATH` are searched), so that a missing command is reported before any
    /// lock is taken.
    ///
    /// ```
    /// let job = leasehold_cli::supervise::Job::new(&["sh".into(), "-c".into(), "true".into()]).unwrap();
    /// assert!(job.program().is_absolute());
    /// assert_eq!(leasehold_cli::supervise::Job::new(&["no-such-command-x".into()]).unwrap_err().code, 127);
    /// ```
    pub fn new(argv: &[OsString]) -> std::result::Result<Job, NotStarted> {
        let Some(name) = argv.first() else {
            return Err(NotStarted {
                code: crate::cli::exit::USAGE,
                why: "no command given".into(),
            });
        };
        // For messages, which a terminal shows: escaped.
        let shown = leasehold::text::escape_os(name).into_owned();
        if name.is_empty() {
            return Err(NotStarted {
                code: 127,
                why: "empty command name".into(),
            });
        }
        if name.as_bytes().contains(&b'/') {
            return Ok(Job {
                argv: argv.to_vec(),
                program: PathBuf::from(name),
            });
        }
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        let mut denied = None;
        for dir in std::env::split_paths(&path) {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            let cand = dir.join(name);
            match std::fs::metadata(&cand) {
                Ok(m) if m.is_file() => {
                    if nix::unistd::access(&cand, nix::unistd::AccessFlags::X_OK).is_ok() {
                        return Ok(Job {
                            argv: argv.to_vec(),
                            program: cand,
                        });
                    }
                    denied.get_or_insert(cand);
                }
                _ => {}
            }
        }
        Err(match denied {
            Some(p) => NotStarted {
                code: 126,
                why: format!(
                    "{shown}: {}: permission denied",
                    leasehold::text::escape_path(&p)
                ),
            },
            None => NotStarted {
                code: 127,
                why: format!("{shown}: command not found"),
            },
        })
    }

    /// The program file that will be executed.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The command line, for messages: shell-quoted as typed (`sh -c 'sleep 1'`), control
    /// characters in `$'…'` form ([`leasehold::text::quote_argv`]), so safe to show.
    pub fn display(&self) -> String {
        leasehold::text::quote_argv(&self.argv)
    }

    /// The argv as strings, for recording in the lease.
    pub fn argv_lossy(&self) -> Vec<String> {
        self.argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It exited with this status.
    Exited(i32),
    /// It died of this signal.
    Signaled(Signal),
    /// The lease was lost and the command fenced.
    Fenced {
        /// Why the lease was lost, in words.
        reason: String,
        /// Processes of its group still alive after SIGKILL and the wait (normally 0).
        survivors: usize,
    },
    /// It never ran.
    NotStarted(NotStarted),
}

impl Outcome {
    /// The exit status `leasehold run` reports: the command's own, 128+N for signal N, 74 when
    /// fenced, 126/127 when it could not be started.
    ///
    /// ```
    /// use leasehold_cli::supervise::Outcome;
    /// use nix::sys::signal::Signal;
    /// assert_eq!(Outcome::Exited(3).exit_code(), 3);
    /// assert_eq!(Outcome::Signaled(Signal::SIGKILL).exit_code(), 137);
    /// ```
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Exited(c) => *c,
            Outcome::Signaled(s) => 128 + *s as i32,
            Outcome::Fenced { .. } => crate::cli::exit::IOERR_FENCED,
            Outcome::NotStarted(n) => n.code,
        }
    }

    /// How the job ended, as recorded in the released lease: `exit 0`, `signal 9 (SIGKILL)`,
    /// `fenced: ...`, `not started: ...`.
    pub fn ending(&self) -> String {
        match self {
            Outcome::Exited(c) => format!("exit {c}"),
            Outcome::Signaled(s) => format!("signal {} ({})", *s as i32, s.as_str()),
            Outcome::Fenced { reason, .. } => format!("fenced: {reason}"),
            Outcome::NotStarted(n) => format!("not started: {}", n.why),
        }
    }
}

/// The controlling terminal, when leasehold runs in its foreground.
#[derive(Debug)]
struct Terminal {
    fd: OwnedFd,
    /// Our own process group, which had the terminal when we started.
    home: Pid,
}

impl Terminal {
    /// Opens /dev/tty; `None` without a controlling terminal or when we are not its foreground.
    fn detect() -> Option<Terminal> {
        let fd = nix::fcntl::open(
            "/dev/tty",
            OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
            nix::sys::stat::Mode::empty(),
        )
        .ok()?;
        let home = getpgrp();
        match tcgetpgrp(&fd) {
            Ok(fg) if fg == home => Some(Terminal { fd, home }),
            _ => None,
        }
    }

    /// Makes `pgrp` the terminal's foreground process group (SIGTTOU blocked meanwhile, as a
    /// shell does, since we may be in the background when we call it).
    fn give(&self, pgrp: Pid) -> bool {
        let mut ttou = SigSet::empty();
        ttou.add(Signal::SIGTTOU);
        let old = ttou.thread_swap_mask(SigmaskHow::SIG_BLOCK).ok();
        let ok = tcsetpgrp(&self.fd, pgrp).is_ok();
        if let Some(old) = old {
            let _ = old.thread_set_mask();
        }
        ok
    }

    fn foreground(&self) -> Option<Pid> {
        tcgetpgrp(&self.fd).ok()
    }
}

/// Runs commands under a lease. One per process: it owns the signal handlers and the self-pipe
/// that the guard's loss callback writes to.
///
/// Order of use: [`Supervisor::new`] before taking the lease (so that
/// [`Supervisor::loss_notifier`] can be given to `LeaseBuilder::on_lost`), then
/// [`Supervisor::run`] with the guard.
#[derive(Debug)]
pub struct Supervisor {
    wake_rx: OwnedFd,
    wake_tx: OwnedFd,
    forwarded: Vec<Signal>,
    tty: Option<Terminal>,
    leftovers: std::cell::Cell<usize>,
}

impl Supervisor {
    /// Creates the self-pipe and the SIGCHLD handler. Forwarding handlers for INT, TERM, HUP and
    /// QUIT are installed by [`Supervisor::run`], so that until the lease is held these signals
    /// still simply end leasehold. Fails if a supervisor was already created in this process.
    pub fn new() -> Result<Supervisor> {
        if CREATED.swap(true, Ordering::AcqRel) {
            return Err(Error::Settings(
                "internal: only one supervisor per process".into(),
            ));
        }
        let (rx, tx) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| io_error("pipe", "create the wake-up pipe", e.into()))?;
        WAKE_FD.store(tx.as_raw_fd(), Ordering::Release);
        LOST.store(false, Ordering::Release);
        install(Signal::SIGCHLD)?;
        Ok(Supervisor {
            wake_rx: rx,
            wake_tx: tx,
            forwarded: Vec::new(),
            tty: None,
            leftovers: std::cell::Cell::new(0),
        })
    }

    /// A callback for `LeaseBuilder::on_lost`: wakes the supervising thread, which fences.
    pub fn loss_notifier(&self) -> impl Fn(&LossReason) + Send + Sync + 'static {
        |_reason: &LossReason| {
            LOST.store(true, Ordering::Release);
            wake();
        }
    }

    /// Runs `job` while `guard` holds the lease and returns how it ended. Call it from the main
    /// thread. The caller releases the guard afterwards (recording [`Outcome::ending`]) and
    /// exits with [`Outcome::exit_code`].
    ///
    /// The command's environment is leasehold's, plus `LEASEHOLD_LOCK` (the absolute LOCK path),
    /// `LEASEHOLD_TOKEN` (the fencing token, decimal) and `LEASEHOLD_LEASE_ID`.
    pub fn run(&mut self, guard: &LeaseGuard, job: &Job) -> Result<Outcome> {
        for sig in FORWARDED {
            if install(sig)? {
                self.forwarded.push(sig);
            }
        }
        self.tty = Terminal::detect();
        let prepared = Prepared::new(guard, job, &self.forwarded)?;
        let child = self.spawn(guard, &prepared)?;
        let outcome = match child {
            Started::Running(pid) => self.supervise(guard, pid)?,
            Started::Done(o) => o,
        };
        if let Some(t) = &self.tty {
            t.give(t.home);
        }
        Ok(outcome)
    }

    fn spawn(&mut self, guard: &LeaseGuard, p: &Prepared) -> Result<Started> {
        let lock = guard.path();
        let (go_rx, go_tx) = pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| io_error(lock, "create the start gate pipe", e.into()))?;
        let (err_rx, err_tx) = pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| io_error(lock, "create the exec status pipe", e.into()))?;
        let parent = getpid();
        let old_mask = SigSet::all()
            .thread_swap_mask(SigmaskHow::SIG_SETMASK)
            .map_err(|e| io_error(lock, "block signals", e.into()))?;
        // SAFETY: the child only makes async-signal-safe system calls on memory prepared before
        // the fork, then execs or _exits (see `child_after_fork`).
        let forked = unsafe { fork() };
        let child = match forked {
            Ok(ForkResult::Child) => {
                // SAFETY: we are the freshly forked child.
                unsafe {
                    child_after_fork(
                        p,
                        parent,
                        go_rx.as_raw_fd(),
                        go_tx.as_raw_fd(),
                        err_rx.as_raw_fd(),
                        err_tx.as_raw_fd(),
                    )
                }
            }
            Ok(ForkResult::Parent { child }) => {
                let _ = old_mask.thread_set_mask();
                child
            }
            Err(e) => {
                let _ = old_mask.thread_set_mask();
                return Err(io_error(lock, "fork the command", e.into()));
            }
        };
        drop(go_rx);
        drop(err_tx);
        // Both sides set the group, so it is in place whichever runs first.
        let _ = setpgid(child, child);
        let abort = |why: Error| -> Result<Started> {
            let _ = kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            Err(why)
        };
        let start = match process::stat(child.as_raw()) {
            Ok(Some(s)) => s.start,
            Ok(None) => {
                return abort(io_error(
                    lock,
                    "read the command's start time",
                    io::Error::from(io::ErrorKind::NotFound),
                ));
            }
            Err(e) => return abort(io_error(lock, "read the command's start time", e)),
        };
        if let Err(e) = guard.set_child(child.as_raw(), start, child.as_raw()) {
            if let Error::Lost { why, .. } = &e {
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Ok(Started::Done(Outcome::Fenced {
                    reason: format!("lease lost before the command started: {why}"),
                    survivors: 0,
                }));
            }
            return abort(e);
        }
        if guard.is_lost() || LOST.load(Ordering::Acquire) {
            let _ = kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            return Ok(Started::Done(Outcome::Fenced {
                reason: format!(
                    "lease lost before the command started: {}",
                    loss_text(guard)
                ),
                survivors: 0,
            }));
        }
        if let Some(t) = &self.tty
            && !t.give(child)
        {
            self.tty = None;
        }
        // Open the gate.
        let opened = nix::unistd::write(&go_tx, &[1u8]);
        drop(go_tx);
        if let Err(e) = opened {
            return abort(io_error(lock, "start the command", e.into()));
        }
        // EOF means exec succeeded; four bytes are the errno of a failed exec.
        let mut buf = [0u8; 4];
        let mut got = 0;
        while got < buf.len() {
            match nix::unistd::read(&err_rx, &mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        if got == buf.len() {
            let errno = Errno::from_raw(i32::from_ne_bytes(buf));
            let _ = waitpid(child, None);
            let code = if errno == Errno::ENOENT { 127 } else { 126 };
            return Ok(Started::Done(Outcome::NotStarted(NotStarted {
                code,
                why: format!(
                    "cannot run {}: {}",
                    leasehold::text::escape_path(&p.program),
                    errno.desc()
                ),
            })));
        }
        Ok(Started::Running(child))
    }

    fn supervise(&mut self, guard: &LeaseGuard, child: Pid) -> Result<Outcome> {
        // Peek (WNOWAIT) rather than reap: until we reap it, the command's pid — its process
        // group's id — cannot be reused, so signalling that group stays safe.
        let mut peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        if self.tty.is_some() {
            peek |= WaitPidFlag::WSTOPPED;
        }
        loop {
            match waitid(Id::Pid(child), peek) {
                Ok(WaitStatus::Exited(_, code)) => {
                    return Ok(self.ended(guard, child, Outcome::Exited(code)));
                }
                Ok(WaitStatus::Signaled(_, sig, _)) => {
                    return Ok(self.ended(guard, child, Outcome::Signaled(sig)));
                }
                Ok(WaitStatus::Stopped(..)) => {
                    // Consume the stop report, then act on it.
                    let _ = waitpid(child, Some(WaitPidFlag::WUNTRACED | WaitPidFlag::WNOHANG));
                    self.suspend(child);
                }
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    return Err(io_error(guard.path(), "wait for the command", e.into()));
                }
            }
            if LOST.load(Ordering::Acquire) || guard.is_lost() {
                let reason = loss_text(guard);
                return Ok(self.fence(child, guard.timing().grace, reason));
            }
            for sig in &self.forwarded {
                if let Some(i) = slot(*sig as libc::c_int)
                    && PENDING[i].swap(false, Ordering::AcqRel)
                {
                    let _ = killpg(child, *sig);
                }
            }
            // Signals, the command's end and loss all write to the wake pipe; the timeout is only
            // a safety net, kept long (ten minutes) so that an idle job is woken by its
            // renewals alone.
            self.sleep(SAFETY_NET);
        }
    }

    /// Waits for a wake-up byte (a signal, or the loss callback) or `timeout`, then drains the
    /// pipe. Flags are checked by the caller after this returns, so no wake-up is lost.
    fn sleep(&self, timeout: Duration) {
        let t = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.wake_rx.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, t);
        let mut buf = [0u8; 64];
        while let Ok(n) = nix::unistd::read(&self.wake_rx, &mut buf) {
            if n < buf.len() {
                break;
            }
        }
        PENDING[CHLD_SLOT].store(false, Ordering::Release);
    }

    /// The command stopped while it had the terminal (Ctrl-Z): take the terminal back, stop our
    /// own process group as the shell expects, and on being continued hand the terminal back
    /// (if we are in the foreground again) and continue the command.
    fn suspend(&self, child: Pid) {
        let Some(t) = &self.tty else {
            return;
        };
        t.give(t.home);
        let _ = killpg(t.home, Signal::SIGSTOP);
        // Continued.
        if t.foreground() == Some(t.home) {
            t.give(child);
        }
        let _ = killpg(child, Signal::SIGCONT);
    }

    /// The command ended by itself (or was killed from outside). If it died of a signal while
    /// the lease was no longer ours, that was a fence from outside: finish it and report 74.
    /// The command has exited (reported, not yet reaped).
    fn ended(&self, guard: &LeaseGuard, child: Pid, o: Outcome) -> Outcome {
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

    /// How many processes the command left running in its process group when it ended by
    /// itself; they were stopped before the lease was released.
    pub fn leftovers_stopped(&self) -> usize {
        self.leftovers.get()
    }

    /// Fences: SIGTERM (and SIGCONT) the command's group, wait up to `grace`, SIGKILL the group
    /// and the command, wait until nothing in the group lives, and only then reap the command.
    fn fence(&self, child: Pid, grace: Duration, reason: String) -> Outcome {
        let _ = killpg(child, Signal::SIGTERM);
        let _ = kill(child, Signal::SIGTERM);
        let _ = killpg(child, Signal::SIGCONT);
        let end = Instant::now() + grace;
        while job_alive(child) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(2).min(end - Instant::now()));
        }
        let survivors = kill_group_and_wait(child, Some(child), KILL_WAIT);
        let _ = waitpid(child, None);
        Outcome::Fenced { reason, survivors }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if WAKE_FD.load(Ordering::Acquire) == self.wake_tx.as_raw_fd() {
            WAKE_FD.store(-1, Ordering::Release);
        }
    }
}

enum Started {
    Running(Pid),
    Done(Outcome),
}

fn loss_text(guard: &LeaseGuard) -> String {
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

/// Installs the wake-up handler for `sig`. Returns false (and leaves the signal ignored) when it
/// was ignored: a command started with a signal ignored inherits that, as it would without us.
fn install(sig: Signal) -> Result<bool> {
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only touches atomics and write(2).
    let old = unsafe { sigaction(sig, &act) }
        .map_err(|e| io_error("signal", "install a signal handler", e.into()))?;
    if sig != Signal::SIGCHLD && matches!(old.handler(), SigHandler::SigIgn) {
        // SAFETY: restoring the previous disposition.
        unsafe { sigaction(sig, &old) }
            .map_err(|e| io_error("signal", "restore a signal handler", e.into()))?;
        return Ok(false);
    }
    Ok(true)
}

/// Everything the child needs between fork and exec, built beforehand: the child must not
/// allocate.
struct Prepared {
    program: PathBuf,
    c_program: CString,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    reset: Vec<libc::c_int>,
}

impl Prepared {
    fn new(guard: &LeaseGuard, job: &Job, forwarded: &[Signal]) -> Result<Prepared> {
        let nul = |what: &str| {
            io_error(
                guard.path(),
                "prepare the command",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} contains a NUL byte"),
                ),
            )
        };
        let cstr = |s: &OsStr, what: &str| CString::new(s.as_bytes()).map_err(|_| nul(what));
        let c_program = cstr(job.program.as_os_str(), "the program path")?;
        let argv = job
            .argv
            .iter()
            .map(|a| cstr(a, "an argument"))
            .collect::<Result<Vec<_>>>()?;
        let ours = [
            ("LEASEHOLD_LOCK", guard.path().as_os_str().to_os_string()),
            ("LEASEHOLD_TOKEN", guard.token().to_string().into()),
            ("LEASEHOLD_LEASE_ID", guard.lease_id().into()),
        ];
        let mut envp = Vec::new();
        for (k, v) in std::env::vars_os() {
            if ours.iter().any(|(n, _)| OsStr::new(n) == k) {
                continue;
            }
            let mut kv = k.clone();
            kv.push("=");
            kv.push(&v);
            envp.push(cstr(&kv, "an environment variable")?);
        }
        for (k, v) in &ours {
            let mut kv = OsString::from(k);
            kv.push("=");
            kv.push(v);
            envp.push(cstr(&kv, "LEASEHOLD_LOCK")?);
        }
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let mut reset: Vec<libc::c_int> = forwarded.iter().map(|s| *s as libc::c_int).collect();
        reset.push(libc::SIGCHLD);
        reset.push(libc::SIGPIPE);
        Ok(Prepared {
            program: job.program.clone(),
            argv_ptrs: ptrs(&argv),
            envp_ptrs: ptrs(&envp),
            c_program,
            _argv: argv,
            _envp: envp,
            reset,
        })
    }
}

/// The child between fork and exec. Only async-signal-safe system calls; never returns.
///
/// # Safety
/// Must be called only in the child of a `fork`, with `p` fully built before the fork.
unsafe fn child_after_fork(
    p: &Prepared,
    parent: Pid,
    go_rx: libc::c_int,
    go_tx: libc::c_int,
    err_rx: libc::c_int,
    err_tx: libc::c_int,
) -> ! {
    // SAFETY: raw system calls on values prepared before the fork.
    unsafe {
        for &sig in &p.reset {
            libc::signal(sig, libc::SIG_DFL);
        }
        libc::setpgid(0, 0);
        libc::close(go_tx);
        libc::close(err_rx);
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            || libc::getppid() != parent.as_raw()
        {
            libc::_exit(1);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // The gate: one byte once the lease names us; EOF if the wrapper gave up or died.
        let mut b = 0u8;
        loop {
            let n = libc::read(go_rx, (&raw mut b).cast(), 1);
            if n == 1 {
                break;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            libc::_exit(1);
        }
        libc::close(go_rx);
        libc::execve(
            p.c_program.as_ptr(),
            p.argv_ptrs.as_ptr(),
            p.envp_ptrs.as_ptr(),
        );
        let e = (*libc::__errno_location()).to_ne_bytes();
        libc::write(err_tx, e.as_ptr().cast(), e.len());
        libc::_exit(127)
    }
}
