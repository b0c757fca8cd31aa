//! `leasehold run`: take the lease, run the command under it, report how it ended.
//!
//! Owns: the order of a run (resolve the command, fork it held at its gate, check the timing,
//! take the lease naming it — waiting as asked —, say what was broken, supervise, release
//! recording how the job ended) and the choice of exit status. Must never: start the command without the lease, release the lease before the
//! command is dead, or report a conflict with anything but the -E status.

use crate::cli::args::RunArgs;
use crate::cli::ending::{Before, before_command};
use crate::cli::exit;
use crate::cli::progress::WaitDisplay;
use crate::cli::report;
use crate::supervise::{Job, Outcome, Supervisor};
use leasehold::{Error, LeaseBuilder, LeaseGuard, LossReason};
use std::path::Path;

/// Whether an acquisition error means "the lock could not be had" (exit -E, default 75).
pub(crate) fn is_conflict(e: &Error) -> bool {
    matches!(
        e,
        Error::WouldBlock { .. }
            | Error::Timeout { .. }
            | Error::MutexStuck { .. }
            | Error::Refused { .. }
    )
}

/// Runs `leasehold run` and returns the exit status.
pub(super) fn run(a: &RunArgs) -> i32 {
    if let Some(why) = crate::cli::ending::unsupported(a) {
        say!("{why}");
        return exit::USAGE;
    }
    let job = match resolve(a) {
        Ok(j) => j,
        Err(code) => return code,
    };
    let mut sup = match Supervisor::new() {
        Ok(s) => s,
        Err(e) => {
            say!("{}", report::error_line(&e));
            return exit::exit_code(&e);
        }
    };
    // The command's process is forked first, held at its gate, so that the lease names it in
    // the one write that takes it.
    let child = match sup.prepare(&a.lock, &job) {
        Ok(c) => c,
        Err(e) => {
            say!("{}", report::error_line(&e));
            return exit::exit_code(&e);
        }
    };
    // Until the lease is ours, INT/TERM/HUP/QUIT stop the wait: the queue ticket is given up,
    // then leasehold ends by the same signal.
    let cancel = match sup.cancel_wait_on_signals() {
        Ok(c) => c,
        Err(e) => {
            say!("{}", report::error_line(&e));
            sup.abandon();
            return exit::exit_code(&e);
        }
    };
    let guard = match take(a, &job, &sup, child, cancel) {
        Ok(g) => g,
        Err(code) => {
            if let Some(sig) = sup.die_of_signal() {
                return 128 + sig as i32;
            }
            sup.abandon();
            return code;
        }
    };
    if let (Some(v), false) = (guard.broke(), a.quiet) {
        say!("{}", report::broke_line(v, false));
    }
    let lock = guard.path().to_path_buf();
    if a.verbose {
        say!("{}", report::acquired_line(&guard));
    }
    // The lock's memory of the last holding: --once-per, --after-crash, --recover.
    if let Before::Stop { code, why } = before_command(a, &guard, &mut sup) {
        sup.abandon();
        if let Err(e) = guard.release_skipped(&why) {
            say!("{}", report::error_line(&e));
        }
        return code;
    }
    if let Some(d) = a.max_time {
        sup.max_time(d);
    }
    let outcome = match sup.run(&guard, &job) {
        Ok(o) => o,
        Err(e) => {
            say!("{}", report::error_line(&e));
            let _ = guard.release_with(&format!("leasehold failed: {e}"));
            return exit::exit_code(&e);
        }
    };
    let how = outcome.ending();
    let lost = guard.loss();
    let released = guard.release_with(&how);
    report_ending(a, &job, &sup, &outcome, lost, &lock);
    if let Err(e) = released {
        say!("{}", report::error_line(&e));
    } else if a.verbose {
        say!("{}", report::released_line(&lock, &how));
    }
    // A terminal's Ctrl-C or Ctrl-\ that ended the command ends the calling script too.
    sup.pass_on_terminal_signal(&outcome);
    outcome.exit_code()
}

/// The command to run, resolved before any lock is taken; `Err` is the exit status, the
/// problem already said.
fn resolve(a: &RunArgs) -> Result<Job, i32> {
    let argv = a.argv();
    if argv.is_empty() {
        say!(
            "leasehold: no command given: use `run LOCK -- CMD [ARGS...]` or `run LOCK -c 'SHELL COMMAND'`"
        );
        return Err(exit::USAGE);
    }
    Job::new(&argv).map_err(|n| {
        say!("{}", report::not_started_line(&n.why));
        n.code
    })
}

/// Takes the lease as the flags ask (at once, with a time limit, or waiting for ever), showing
/// the wait, naming `child` (pid, start time; held at its gate) as the job's process; `Err` is
/// the exit status (-E for a conflict), the problem already said.
fn take(
    a: &RunArgs,
    job: &Job,
    sup: &Supervisor,
    child: (i32, u64),
    cancel: leasehold::Cancel,
) -> Result<LeaseGuard, i32> {
    let display = WaitDisplay::new(a.quiet);
    let shown = display.clone();
    let mut b = LeaseBuilder::new(&a.lock);
    if let Some(d) = a.max_time {
        b = b.max_time(d);
    }
    let b = a.lease.apply(
        b.command(job.argv_lossy())
            .child(child.0, child.1, child.0)
            .on_lost(sup.loss_notifier())
            .on_wait(move |v| shown.waiting(v))
            .cancel(cancel),
    );
    if let Err(e) = b.timing() {
        say!("{}", report::error_line(&e));
        return Err(exit::exit_code(&e));
    }
    let got = if a.lease.no_wait {
        b.try_acquire()
    } else if let Some(w) = a.lease.wait {
        b.acquire_timeout(w)
    } else {
        b.acquire()
    };
    display.done();
    match got {
        Ok(g) => Ok(g),
        // Stopped by a signal (see `run`): leasehold ends by it, saying nothing more than a
        // killed flock(1) would.
        Err(Error::Cancelled { .. }) => Err(exit::TEMPFAIL),
        Err(e) if is_conflict(&e) => {
            if !a.quiet {
                say!("{}", report::error_line(&e));
            }
            Err(i32::from(a.lease.conflict_exit_code))
        }
        Err(e) => {
            say!("{}", report::error_line(&e));
            Err(exit::exit_code(&e))
        }
    }
}

/// Says how the job ended, after the lease was released: fenced, not started, or (when it ended
/// by itself) what it left running and whether the lease was lost at the very end.
fn report_ending(
    a: &RunArgs,
    job: &Job,
    sup: &Supervisor,
    outcome: &Outcome,
    lost: Option<LossReason>,
    lock: &Path,
) {
    match outcome {
        Outcome::Fenced { reason, survivors } => {
            say!(
                "{}",
                report::fenced_line(&job.display(), reason, lock, *survivors)
            );
        }
        Outcome::TimedOut { limit, survivors } => {
            say!(
                "{}",
                report::timed_out_line(&job.display(), *limit, lock, *survivors)
            );
        }
        Outcome::NotStarted(n) => say!("{}", report::not_started_line(&n.why)),
        Outcome::Exited(_) | Outcome::Signaled(_) => {
            let left = sup.leftovers_stopped();
            if left > 0 && !a.quiet {
                say!("{}", report::leftovers_line(&job.display(), left, lock));
            }
            if let Some(r) = lost {
                say!(
                    "{}",
                    report::lost_at_end_line(lock, &r.to_string(), &job.display())
                );
            }
        }
    }
}
