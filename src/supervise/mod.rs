//! Running the guarded command as a child of the lease holder, and keeping it inside the lease.
//!
//! Owns: starting the command (fork from the main thread, own process group, `PR_SET_PDEATHSIG`
//! = SIGKILL, held at a gate until the lease names it), the terminal hand-over, forwarding
//! INT/TERM/HUP/QUIT, noticing that the guard was lost, fencing (SIGTERM the command's process
//! group, wait the grace, SIGKILL it, wait until no member lives), the guardian that stops the
//! job if this process dies without ending it (`guardian.rs`), and turning how the command
//! ended into an exit status (its own, or 128+N for signal N, or 74 when fenced).
//! Must never: let the command run a single instruction of its own before the lease records its
//! pid, start time and process group; release or report a lease before the command (and its
//! process group, when fenced) is dead; allocate or take a lock between `fork` and `exec`.
//!
//! This file holds the [`Supervisor`] and its public surface ([`Job`], [`Outcome`]) and the
//! supervising loop; `spawn` starts the command, `signals` holds the process-global signal state
//! and forwarding, `terminal` the foreground hand-over, `fence` the fencing, and `guardian` the
//! guardian (forked before the command, armed before its gate opens, dismissed once the job
//! ended through us; PROTOCOL.md §7).
//!
//! # How the command is started
//!
//! The child is forked by the thread that calls [`Supervisor::run`] (the main thread of the
//! `leasehold` binary, which lives as long as the process: `PR_SET_PDEATHSIG` fires when the
//! *thread* that forked exits). Between `fork` and `exec` the child only makes raw system calls:
//! it resets the signal dispositions the wrapper changed, moves into its own process group, sets
//! PDEATHSIG to SIGKILL, checks that its parent is still the wrapper (closing the race with a
//! wrapper that died just before), and then blocks on a pipe. `leasehold run` forks it before
//! taking the lease ([`Supervisor::prepare`]), so that the lease names the child's pid, start
//! time and process group in the write that takes it (`LeaseBuilder::child`); a child forked
//! after the lease was taken is recorded by a second write ([`LeaseGuard::set_child`]). Only
//! then does the wrapper open the gate, with a message carrying the token, lease id and LOCK
//! path into room left in the child's environment; the child `execve`s the command. When the
//! lease is not taken, [`Supervisor::abandon`] closes the gate unopened and the child exits
//! without running anything. An `exec` failure comes back through a second close-on-exec pipe
//! and ends in exit status 127 (not found) or 126 (cannot run).
//!
//! Leasehold is a child subreaper while it supervises (orphans of the command come back to it),
//! so that an ended command's group is known to be empty from its list of children (`fence`).
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
//! command (`-c 'cmd | less'`). A non-interactive script that calls leasehold does not itself
//! receive the terminal's Ctrl-C or Ctrl-\: when the command dies of one, leasehold gives the
//! terminal back, releases the lease, and sends the same signal to its own (the caller's)
//! group, dying of it too (`Supervisor::pass_on_terminal_signal`), so the script stops as it
//! would under flock(1). `trap 'kill 0'` in the command reaches the command's group only.
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

pub(crate) mod fence;
pub mod guardian;
mod signals;
mod spawn;
mod terminal;

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{Pid, pipe2};

use leasehold::{Error, Result};
use leasehold::{LeaseGuard, LossReason, human_duration};

use fence::loss_text;
use guardian::Guardian;
pub use signals::FORWARDED;
use signals::{CANCEL_FD, CREATED, LOST, WAKE_FD, install, wake};
use spawn::{Held, Started};
use terminal::Terminal;

/// How long the wrapper sleeps at most without a wake-up byte: a safety net only (every event
/// it acts on writes to its wake pipe).
const SAFETY_NET: Duration = Duration::from_secs(600);

/// An I/O failure on `path` while doing `op`.
fn io_error(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Error {
    Error::Io {
        path: path.into(),
        op,
        source,
    }
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
    /// It ran for `--max-time` and was fenced (TERM, grace, KILL of its group), as timeout(1)
    /// would end it.
    TimedOut {
        /// The limit it reached.
        limit: Duration,
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
            Outcome::TimedOut { .. } => crate::cli::exit::TIMEOUT,
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
            Outcome::TimedOut { limit, .. } => {
                format!("fenced: --max-time {} reached", human_duration(*limit))
            }
            Outcome::NotStarted(n) => format!("not started: {}", n.why),
        }
    }
}

/// Runs commands under a lease. One per process: it owns the signal handlers and the self-pipe
/// that the guard's loss callback writes to.
///
/// Order of use: [`Supervisor::new`] before taking the lease (so that
/// [`Supervisor::loss_notifier`] can be given to `LeaseBuilder::on_lost`), optionally
/// [`Supervisor::prepare`] (its pid and start time go to `LeaseBuilder::child`), then
/// [`Supervisor::run`] with the guard — or [`Supervisor::abandon`] if the lease was not taken.
#[derive(Debug)]
pub struct Supervisor {
    wake_rx: OwnedFd,
    wake_tx: OwnedFd,
    forwarded: Vec<Signal>,
    tty: Option<Terminal>,
    leftovers: std::cell::Cell<usize>,
    /// Whether leasehold is a child subreaper (see `fence.rs`).
    subreaper: bool,
    /// The command forked by [`Supervisor::prepare`], held at its gate.
    held: Option<Held>,
    /// The guardian that stops the job if this process dies without ending it (`guardian.rs`).
    guardian: Option<Guardian>,
    /// The wait's cancel handle, kept for as long as a signal handler may write to its fd.
    cancel: Option<leasehold::Cancel>,
    /// `--max-time`: the command is fenced once it has run this long.
    max_time: Option<Duration>,
    /// The guardian was armed already (before a `--recover` command: [`Supervisor::arm`]).
    armed: bool,
}

impl Supervisor {
    /// Creates the self-pipe and the SIGCHLD handler. Handlers for INT, TERM, HUP and QUIT are
    /// installed by [`Supervisor::cancel_wait_on_signals`] (a waiting acquisition then gives up
    /// its queue place and leasehold ends by the signal) or by [`Supervisor::run`] (forwarded to
    /// the command). Fails if a supervisor was already created in this process.
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
        // Orphans of the command come back to us, so that an ended command's group is known to
        // be empty without a scan of every process on the host (`fence.rs`).
        let subreaper = nix::sys::prctl::set_child_subreaper(true).is_ok();
        Ok(Supervisor {
            wake_rx: rx,
            wake_tx: tx,
            forwarded: Vec::new(),
            tty: None,
            leftovers: std::cell::Cell::new(0),
            subreaper,
            held: None,
            guardian: None,
            cancel: None,
            max_time: None,
            armed: false,
        })
    }

    /// Fences the command (as for a lost lease) once it has run for `limit` (`--max-time`):
    /// [`Supervisor::run`] then returns [`Outcome::TimedOut`].
    pub fn max_time(&mut self, limit: Duration) {
        self.max_time = Some(limit);
    }

    /// Arms the guardian now, before the command's gate opens, for work run under `guard`'s
    /// lease before the command (`run --recover`): if this process dies, it stops whatever
    /// carries the lease's environment, the recovery command included. A no-op without a
    /// command forked by [`Supervisor::prepare`].
    pub fn arm(&mut self, guard: &LeaseGuard) -> Result<()> {
        if let (Some(g), Some(h), false) = (&self.guardian, &self.held, self.armed) {
            g.arm(guard, h.start)?;
            self.armed = true;
        }
        Ok(())
    }

    /// A callback for `LeaseBuilder::on_lost`: wakes the supervising thread, which fences.
    pub fn loss_notifier(&self) -> impl Fn(&LossReason) + Send + Sync + 'static {
        |_reason: &LossReason| {
            LOST.store(true, Ordering::Release);
            wake();
        }
    }

    /// Forks `job`'s process before the lease is taken, held at a gate where it runs nothing of
    /// its own, and returns its pid and start time: give them to `LeaseBuilder::child` (its
    /// process group is its pid), so that the lease names it in the one write that takes it.
    /// [`Supervisor::run`] then opens the gate; [`Supervisor::abandon`] lets it go when the
    /// lease was not taken. `lock` names the lock in messages.
    pub fn prepare(&mut self, lock: &Path, job: &Job) -> Result<(i32, u64)> {
        if let Some(h) = self.held.take() {
            h.abandon();
        }
        self.start_guardian(lock)?;
        let h = Held::fork(lock, job, &self.forwarded)?;
        let named = (h.child.as_raw(), h.start);
        self.held = Some(h);
        Ok(named)
    }

    /// The lease was not taken: the process forked by [`Supervisor::prepare`] exits at its
    /// gate, without running the command, and is reaped.
    pub fn abandon(&mut self) {
        if let Some(h) = self.held.take() {
            h.abandon();
        }
        if let Some(g) = self.guardian.take() {
            g.dismiss();
        }
    }

    /// Installs the handlers for INT, TERM, HUP and QUIT (once): each is forwarded to the
    /// command's group once it runs.
    fn install_forwarding(&mut self) -> Result<()> {
        for sig in FORWARDED {
            if !self.forwarded.contains(&sig) && install(sig)? {
                self.forwarded.push(sig);
            }
        }
        Ok(())
    }

    /// While the lease is waited for: INT, TERM, HUP and QUIT cancel the wait (the returned
    /// handle goes to `LeaseBuilder::cancel`), so that the acquisition gives up its place in the
    /// queue before leasehold ends; then [`Supervisor::die_of_signal`] ends it by that signal.
    /// A signal leasehold was started with ignored stays ignored.
    pub fn cancel_wait_on_signals(&mut self) -> Result<leasehold::Cancel> {
        let cancel = leasehold::Cancel::new()?;
        CANCEL_FD.store(cancel.as_raw_fd(), Ordering::Release);
        self.cancel = Some(cancel.clone());
        self.install_forwarding()?;
        Ok(cancel)
    }

    /// After a cancelled wait: ends leasehold by the signal that cancelled it (default action),
    /// after stopping the command held at its gate. Returns the signal if the process is still
    /// alive after that (it should not be), `None` if no signal was pending.
    pub fn die_of_signal(&mut self) -> Option<Signal> {
        let sig = signals::take_pending()?;
        self.abandon();
        signals::die_by(sig);
        Some(sig)
    }

    /// Starts the guardian (`guardian.rs`) unless it runs already: before the command is
    /// forked, so that it never holds the command's gate.
    fn start_guardian(&mut self, lock: &Path) -> Result<()> {
        if self.guardian.is_none() {
            self.guardian = Some(Guardian::start(lock)?);
        }
        Ok(())
    }

    /// Runs `job` while `guard` holds the lease and returns how it ended. Call it from the main
    /// thread. The caller releases the guard afterwards (recording [`Outcome::ending`]) and
    /// exits with [`Outcome::exit_code`].
    ///
    /// The command is the process [`Supervisor::prepare`] forked, if any (the lease names it
    /// already: the gate opens at once); otherwise it is forked now and recorded in the lease
    /// ([`LeaseGuard::set_child`]) before its gate opens.
    ///
    /// The command's environment is leasehold's, plus `LEASEHOLD_LOCK` (the absolute LOCK path),
    /// `LEASEHOLD_TOKEN` (the fencing token, decimal) and `LEASEHOLD_LEASE_ID`.
    pub fn run(&mut self, guard: &LeaseGuard, job: &Job) -> Result<Outcome> {
        self.install_forwarding()?;
        self.tty = Terminal::detect();
        let child = self.spawn(guard, job)?;
        let outcome = match child {
            Started::Running(pid) => self.supervise(guard, pid)?,
            Started::Done(o) => o,
        };
        if let Some(t) = &self.tty {
            t.give(t.home);
        }
        // The job has ended through us (its group is empty, or fenced): the guardian goes.
        if let Some(g) = self.guardian.take() {
            g.dismiss();
        }
        Ok(outcome)
    }

    fn supervise(&mut self, guard: &LeaseGuard, child: Pid) -> Result<Outcome> {
        // Peek (WNOWAIT) rather than reap: until we reap it, the command's pid — its process
        // group's id — cannot be reused, so signalling that group stays safe.
        let mut peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        // `--max-time` counts from the gate's opening (the lease's deadline, from its taking,
        // is a little earlier: what `status` shows is never later than the fence).
        let limit = self.max_time.map(|d| (d, Instant::now() + d));
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
            if let Some((d, at)) = limit
                && Instant::now() >= at
            {
                let survivors = fence::stop_job(child, guard.timing().grace);
                let _ = waitpid(child, None);
                fence::reap_adopted();
                return Ok(Outcome::TimedOut {
                    limit: d,
                    survivors,
                });
            }
            self.forward_pending(child);
            // Orphans re-parented to us that have died (never the command).
            fence::reap_adopted_except(Some(child));
            // Signals, the command's end and loss all write to the wake pipe; the timeout is only
            // a safety net, kept long (ten minutes) so that an idle job is woken by its
            // renewals alone — or the `--max-time` deadline.
            let nap = limit.map_or(SAFETY_NET, |(_, at)| {
                at.saturating_duration_since(Instant::now()).min(SAFETY_NET)
            });
            self.sleep(nap);
        }
    }

    /// How many processes the command left running in its process group when it ended by
    /// itself; they were stopped before the lease was released.
    pub fn leftovers_stopped(&self) -> usize {
        self.leftovers.get()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if WAKE_FD.load(Ordering::Acquire) == self.wake_tx.as_raw_fd() {
            WAKE_FD.store(-1, Ordering::Release);
        }
    }
}
