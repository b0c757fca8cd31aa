//! The contention display while `leasehold run` waits for a held lock.
//!
//! Owns: printing the one cargo-style `Blocking waiting for lock ...` line when (and only when)
//! the lock is contended — kept live with a spinner on a terminal, a new plain line only when the
//! holder or its state changes otherwise — and clearing the spinner once the wait ends.
//! Must never: print anything when the lock is free at once, or under `-q`.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::report;
use leasehold::Verdict;

/// Shows the wait; cloned into the builder's `on_wait` callback.
#[derive(Debug, Clone)]
pub struct WaitDisplay {
    quiet: bool,
    tty: bool,
    spinner: Arc<Mutex<Option<(ProgressBar, String)>>>,
}

impl WaitDisplay {
    /// A display writing to stderr; silent when `quiet`.
    pub fn new(quiet: bool) -> WaitDisplay {
        WaitDisplay {
            quiet,
            tty: std::io::stderr().is_terminal(),
            spinner: Arc::new(Mutex::new(None)),
        }
    }

    /// Called by the builder when we must wait, and whenever the holder or its state changes.
    pub fn waiting(&self, v: &Verdict) {
        if self.quiet {
            return;
        }
        // Escaped by `blocking_line`: safe for the spinner's message as for a plain line.
        let line = report::blocking_line(v);
        if !self.tty {
            say!("{line}");
            return;
        }
        let mut s = self.spinner.lock().unwrap_or_else(PoisonError::into_inner);
        let (pb, last) = s.get_or_insert_with(|| {
            let pb = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} {wide_msg} ({elapsed})") {
                pb.set_style(style);
            }
            pb.enable_steady_tick(Duration::from_millis(120));
            (pb, String::new())
        });
        pb.set_message(line.clone());
        *last = line;
    }

    /// The wait is over (lock taken or given up): replace the spinner by its last line.
    pub fn done(&self) {
        let mut s = self.spinner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((pb, last)) = s.take() {
            pb.finish_and_clear();
            say!("{last}");
        }
    }
}
