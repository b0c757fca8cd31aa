//! What `run` does with the lock's memory of the last holding, and `leasehold ack LOCK`.
//!
//! Owns: the checks between taking the lease and opening the command's gate (`--once-per`,
//! `--after-crash`, `--recover`), running the recovery command under the lease (fenced like
//! the command if the lease is lost), and `ack`'s exit status. The library keeps and classifies
//! the endings (`lib/src/ending.rs`); the `LEASEHOLD_PREVIOUS*` values are `previous.rs`'s; what
//! `run` tells goes through `events.rs`. Must never: start the command when a check refuses, or
//! let a refused or failed start count as an ending of its own (those holdings are released as
//! skipped, keeping the last ending and the last start).

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use leasehold::{LastEnding, LeaseGuard, format_rfc3339, human_duration, too_soon};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::cli::args::{AckArgs, AfterCrash, RunArgs};
use crate::cli::events::{Event, Renderer};
use crate::cli::{exit, report};
use crate::supervise::Supervisor;

pub(crate) use super::previous::previous_env;

/// What to do once the lease is held, before the command's gate opens.
pub(crate) enum Before {
    /// Run the command.
    Go,
    /// Do not: release the lease as skipped (`why`) and exit with `code` (already said).
    Stop { code: i32, why: String },
}

/// Why `a`'s ending flags cannot be honoured for its LOCK, if they cannot: a shared or counted
/// lock keeps no ending record yet (a file, etcd or S3 lock does), and a check that silently
/// never refused would be worse than a refusal.
pub(crate) fn unsupported(a: &RunArgs) -> Option<String> {
    let wants = a.once_per.is_some() || a.after_crash == AfterCrash::Fail || a.recover.is_some();
    let shared = a.lease.shared || a.lease.slots.is_some();
    (wants && shared).then(|| {
        "leasehold: --once-per, --after-crash fail and --recover need the lock's ending record, which shared and counted locks do not keep yet".to_string()
    })
}

/// `--once-per`, `--after-crash` and `--recover`, in that order, for the lease `guard` holds
/// (`sup`'s guardian is armed before a recovery command runs), told through `ev`.
pub(crate) fn before_command(
    a: &RunArgs,
    guard: &LeaseGuard,
    sup: &mut Supervisor,
    ev: &dyn Renderer,
) -> Before {
    let lock = guard.path().to_path_buf();
    if let Some(period) = a.once_per {
        let last = guard.last_start();
        if let Some(next) = too_soon(last.as_deref(), period, SystemTime::now()) {
            ev.emit(&Event::TooSoon {
                lock: &lock,
                last: last.as_deref().unwrap_or("?"),
                period,
                next: &format_rfc3339(next),
                exit: i32::from(a.lease.conflict_exit_code),
            });
            return Before::Stop {
                code: i32::from(a.lease.conflict_exit_code),
                why: format!("--once-per {}: started too soon", human_duration(period)),
            };
        }
    }
    let Some(prev) = guard.previous().filter(LastEnding::needs_attention) else {
        return Before::Go;
    };
    let acquired = guard.lease().acquired_at;
    if a.after_crash == AfterCrash::Fail {
        ev.emit(&Event::AfterCrash {
            lock: &lock,
            ending: &prev,
            acquired: &acquired,
            exit: exit::AFTER_CRASH,
        });
        return Before::Stop {
            code: exit::AFTER_CRASH,
            why: format!("--after-crash fail: the last holding {}", prev.end.word()),
        };
    }
    if let Some(cmd) = &a.recover {
        if let Err(e) = sup.arm(guard) {
            ev.emit(&Event::Failed {
                lock: &lock,
                error: &e,
            });
            return Before::Stop {
                code: exit::exit_code(&e),
                why: "--recover: the guardian could not be armed".into(),
            };
        }
        let code = recover(guard, cmd, ev);
        if code != 0 {
            ev.emit(&Event::RecoverFailed {
                lock: &lock,
                command: cmd,
                exit: code,
            });
            return Before::Stop {
                code,
                why: format!("--recover failed with status {code}"),
            };
        }
    }
    Before::Go
}

/// Runs `cmd` with `/bin/sh -c` under the lease, in a process group of its own, with the
/// command's environment (LEASEHOLD_LOCK, _TOKEN, _LEASE_ID and the PREVIOUS values); fences it
/// (TERM, grace, KILL of its group) if the lease is lost meanwhile. Its exit status (128+N for
/// a signal, 74 when fenced, 127 when it could not be started).
fn recover(guard: &LeaseGuard, cmd: &str, ev: &dyn Renderer) -> i32 {
    ev.emit(&Event::Recovering {
        lock: guard.path(),
        command: cmd,
    });
    let mut c = Command::new("/bin/sh");
    c.arg("-c").arg(cmd).process_group(0);
    c.env("LEASEHOLD_LOCK", guard.path())
        .env("LEASEHOLD_TOKEN", guard.token().to_string())
        .env("LEASEHOLD_LEASE_ID", guard.lease_id());
    for (k, v) in previous_env(guard) {
        c.env(k, v);
    }
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            ev.emit(&Event::NotStarted {
                lock: guard.path(),
                why: &format!("cannot start the recovery command: {e}"),
                exit: 127,
            });
            return 127;
        }
    };
    let pgid = Pid::from_raw(child.id() as i32);
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                use std::os::unix::process::ExitStatusExt;
                return st.code().or(st.signal().map(|s| 128 + s)).unwrap_or(70);
            }
            Ok(None) => {}
            Err(_) => return exit::SOFTWARE,
        }
        // The lease's loss wakes this at once; otherwise it looks at the child every 20 ms.
        if guard.wait_lost(Duration::from_millis(20)).is_some() {
            let _ = killpg(pgid, Signal::SIGTERM);
            let until = Instant::now() + guard.timing().grace;
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = child.wait();
            return exit::IOERR_FENCED;
        }
    }
}

/// Runs `leasehold ack LOCK` and returns the exit status (75 when refused).
pub(super) fn ack(a: &AckArgs) -> i32 {
    match leasehold::ack(&a.lock) {
        Ok(done) => {
            if !a.quiet {
                say!("{}", report::acked_line(&a.lock, &done));
            }
            0
        }
        Err(e) => {
            say!("{}", report::error_line(&e));
            exit::exit_code(&e)
        }
    }
}
