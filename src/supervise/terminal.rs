//! The terminal foreground hand-over, done as a job-control shell does it.
//!
//! Owns: finding the controlling terminal when leasehold is its foreground, giving the terminal
//! to the command's process group and taking it back, and the Ctrl-Z dance (take the terminal
//! back, stop our own group, on `fg` hand it over again and SIGCONT the command), and passing a
//! terminal's Ctrl-C or Ctrl-\ on to the caller's group once the command died of it.
//! Must never: take the terminal when leasehold was not in its foreground; or leave SIGTTOU
//! unblocked while changing the foreground group; pass a signal on to the caller's group
//! without having handed the command the terminal (a signal sent to the command alone, with no
//! terminal involved, stays the command's).

use std::os::fd::OwnedFd;

use nix::fcntl::OFlag;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

use super::{Outcome, Supervisor};

/// The controlling terminal, when leasehold runs in its foreground.
#[derive(Debug)]
pub(super) struct Terminal {
    fd: OwnedFd,
    /// Our own process group, which had the terminal when we started.
    pub(super) home: Pid,
}

impl Terminal {
    /// Opens /dev/tty; `None` without a controlling terminal or when we are not its foreground.
    pub(super) fn detect() -> Option<Terminal> {
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
    pub(super) fn give(&self, pgrp: Pid) -> bool {
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

impl Supervisor {
    /// The command stopped while it had the terminal (Ctrl-Z): take the terminal back, stop our
    /// own process group as the shell expects, and on being continued hand the terminal back
    /// (if we are in the foreground again) and continue the command.
    pub(super) fn suspend(&self, child: Pid) {
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
}

impl Supervisor {
    /// After the command, which had the terminal, died of SIGINT or SIGQUIT (the terminal's
    /// Ctrl-C or Ctrl-\\): the terminal is back with our own process group — the caller's —
    /// and that group gets the same signal, with our own disposition set to the default, as if
    /// the command had stayed in the caller's group: a calling script is interrupted rather than
    /// going on to its next step, and leasehold itself dies of the signal (as flock(1) would).
    /// Call it last, after the lease was released and the ending said. Does nothing in any
    /// other case (no terminal, another ending).
    pub fn pass_on_terminal_signal(&self, outcome: &Outcome) {
        let (Some(t), Outcome::Signaled(sig)) = (&self.tty, outcome) else {
            return;
        };
        if !matches!(sig, Signal::SIGINT | Signal::SIGQUIT) {
            return;
        }
        // SAFETY: setting a disposition to SIG_DFL installs no handler.
        let _ = unsafe { nix::sys::signal::signal(*sig, nix::sys::signal::SigHandler::SigDfl) };
        let mut set = SigSet::empty();
        set.add(*sig);
        let _ = set.thread_unblock();
        let _ = killpg(t.home, *sig);
    }
}
