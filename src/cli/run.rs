//! `leasehold run`: take the lease, run the command under it, report how it ended.
//!
//! Owns: the order of a run (resolve the command, fork it held at its gate, check the timing,
//! take the lease naming it — waiting as asked —, say what was broken, supervise, release
//! recording how the job ended) and the choice of exit status. Must never: start the command without the lease, release the lease before the
//! command is dead, report a conflict with anything but the -E status, or print: everything it
//! tells goes through `events` (human lines or `--json`).

use crate::cli::args::RunArgs;
use crate::cli::ending::{Before, before_command};
use crate::cli::events::{self, Event, Renderer};
use crate::cli::exit;
use crate::supervise::{Job, Outcome, Supervisor};
use leasehold::{Error, LeaseBuilder, LeaseGuard, LossReason};
use std::path::Path;
use std::sync::Arc;

/// Runs `leasehold run` and returns the exit status.
pub(super) fn run(a: &RunArgs) -> i32 {
    let ev = events::for_run(a);
    let lock = a.lock.as_path();
    let failed = |e: &Error| {
        ev.emit(&Event::Failed { lock, error: e });
        exit::exit_code(e)
    };
    if let Some(why) = crate::cli::ending::unsupported(a) {
        ev.emit(&Event::Usage {
            lock,
            message: &why,
        });
        return exit::USAGE;
    }
    let job = match resolve(a, &*ev) {
        Ok(j) => j,
        Err(code) => return code,
    };
    let mut sup = match Supervisor::new() {
        Ok(s) => s,
        Err(e) => return failed(&e),
    };
    // The command's process is forked first, held at its gate, so that the lease names it in
    // the one write that takes it.
    let child = match sup.prepare(&a.lock, &job) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    // Until the lease is ours, INT/TERM/HUP/QUIT stop the wait: the queue ticket is given up,
    // then leasehold ends by the same signal.
    let cancel = match sup.cancel_wait_on_signals() {
        Ok(c) => c,
        Err(e) => {
            sup.abandon();
            return failed(&e);
        }
    };
    let guard = match take(a, &job, &sup, child, cancel, &ev) {
        Ok(g) => g,
        Err(code) => {
            if let Some(sig) = sup.die_of_signal() {
                return 128 + sig as i32;
            }
            sup.abandon();
            return code;
        }
    };
    if let Some(v) = guard.broke() {
        ev.emit(&Event::Broke(v));
    }
    let lock = guard.path().to_path_buf();
    let failed = |e: &Error| {
        ev.emit(&Event::Failed {
            lock: &lock,
            error: e,
        });
        exit::exit_code(e)
    };
    ev.emit(&Event::Acquired(&guard));
    // The lock's memory of the last holding: --once-per, --after-crash, --recover.
    if let Before::Stop { code, why } = before_command(a, &guard, &mut sup, &*ev) {
        sup.abandon();
        match guard.release_skipped(&why) {
            Err(e) => {
                failed(&e);
            }
            Ok(()) => ev.emit(&Event::Released {
                lock: &lock,
                how: &why,
                exit: code,
                skipped: true,
            }),
        }
        return code;
    }
    if let Some(d) = a.max_time {
        sup.max_time(d);
    }
    let outcome = match sup.run(&guard, &job) {
        Ok(o) => o,
        Err(e) => {
            let code = failed(&e);
            let _ = guard.release_with(&format!("leasehold failed: {e}"));
            return code;
        }
    };
    let how = outcome.ending();
    let lost = guard.loss();
    let released = guard.release_with(&how);
    report_ending(&a.argv(), &sup, &outcome, lost, &lock, &*ev);
    match released {
        Err(e) => {
            failed(&e);
        }
        Ok(()) => ev.emit(&Event::Released {
            lock: &lock,
            how: &how,
            exit: outcome.exit_code(),
            skipped: false,
        }),
    }
    // A terminal's Ctrl-C or Ctrl-\ that ended the command ends the calling script too.
    sup.pass_on_terminal_signal(&outcome);
    outcome.exit_code()
}

/// The command to run, resolved before any lock is taken; `Err` is the exit status, the
/// problem already said.
fn resolve(a: &RunArgs, ev: &dyn Renderer) -> Result<Job, i32> {
    let argv = a.argv();
    if argv.is_empty() {
        ev.emit(&Event::Usage {
            lock: &a.lock,
            message: "leasehold: no command given: use `run LOCK -- CMD [ARGS...]` or `run LOCK -c 'SHELL COMMAND'`",
        });
        return Err(exit::USAGE);
    }
    Job::new(&argv).map_err(|n| {
        ev.emit(&Event::NotStarted {
            lock: &a.lock,
            why: &n.why,
            exit: n.code,
        });
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
    ev: &Arc<dyn Renderer>,
) -> Result<LeaseGuard, i32> {
    let shown = Arc::clone(ev);
    let told = Arc::clone(ev);
    let lock = a.lock.as_path();
    let mut b = LeaseBuilder::new(&a.lock);
    if let Some(d) = a.max_time {
        b = b.max_time(d);
    }
    let b = a.lease.apply(
        b.command(job.argv_lossy())
            .child(child.0, child.1, child.0)
            .on_lost(sup.loss_notifier())
            .on_wait(move |v| shown.emit(&Event::Waiting(v)))
            .on_serve(move |s| told.emit(&Event::Serving(s)))
            .cancel(cancel),
    );
    if let Err(e) = b.timing() {
        ev.emit(&Event::Failed { lock, error: &e });
        return Err(exit::exit_code(&e));
    }
    let got = if a.lease.no_wait {
        b.try_acquire()
    } else if let Some(w) = a.lease.wait {
        b.acquire_timeout(w)
    } else {
        b.acquire()
    };
    ev.wait_over();
    match got {
        Ok(g) => Ok(g),
        // Stopped by a signal (see `run`): leasehold ends by it, saying nothing more than a
        // killed flock(1) would.
        Err(Error::Cancelled { .. }) => Err(exit::TEMPFAIL),
        Err(e) if exit::is_conflict(&e) => {
            let code = i32::from(a.lease.conflict_exit_code);
            ev.emit(&Event::Refused {
                lock,
                error: &e,
                exit: code,
            });
            Err(code)
        }
        Err(e) => {
            ev.emit(&Event::Failed { lock, error: &e });
            Err(exit::exit_code(&e))
        }
    }
}

/// Says how the job ended, after the lease was released: fenced, not started, or (when it ended
/// by itself) what it left running and whether the lease was lost at the very end.
fn report_ending(
    command: &[std::ffi::OsString],
    sup: &Supervisor,
    outcome: &Outcome,
    lost: Option<LossReason>,
    lock: &Path,
    ev: &dyn Renderer,
) {
    match outcome {
        Outcome::Fenced { reason, survivors } => ev.emit(&Event::Fenced {
            lock,
            command,
            reason,
            survivors: *survivors,
        }),
        Outcome::TimedOut { limit, survivors } => ev.emit(&Event::TimedOut {
            lock,
            command,
            limit: *limit,
            survivors: *survivors,
        }),
        Outcome::NotStarted(n) => ev.emit(&Event::NotStarted {
            lock,
            why: &n.why,
            exit: n.code,
        }),
        Outcome::Exited(_) | Outcome::Signaled(_) => {
            let stopped = sup.leftovers_stopped();
            if stopped > 0 {
                ev.emit(&Event::LeftoversStopped {
                    lock,
                    command,
                    stopped,
                });
            }
            if let Some(r) = lost {
                ev.emit(&Event::Lost {
                    lock,
                    command,
                    reason: &r.to_string(),
                });
            }
        }
    }
}
