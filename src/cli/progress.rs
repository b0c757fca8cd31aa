//! The contention display while `leasehold run` waits for a held lock.
//!
//! Owns: printing the one cargo-style `Blocking waiting for lock ...` line when (and only when)
//! the lock is contended — kept live with a spinner on a terminal, its heartbeat age and "held"
//! advancing between looks at the lock from the latest look; a new plain line otherwise, only
//! when the holder, its state or what we queue behind changes — and clearing the spinner once
//! the wait ends. Must never: print anything when the lock is free at once, or under `-q`.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::report;
use leasehold::{State, Verdict};

/// The latest verdict and when it arrived: what the spinner's line is rendered from.
type Latest = Arc<Mutex<Option<(Verdict, Instant)>>>;

/// What makes a plain (non-terminal) line worth printing again: the lease, its state, and what
/// we wait behind.
type Key = (Option<String>, State, Option<String>);

/// Shows the wait; cloned into the builder's `on_wait` callback.
#[derive(Debug, Clone)]
pub struct WaitDisplay {
    quiet: bool,
    tty: bool,
    latest: Latest,
    spinner: Arc<Mutex<Option<ProgressBar>>>,
    printed: Arc<Mutex<Option<Key>>>,
}

impl WaitDisplay {
    /// A display writing to stderr; silent when `quiet`.
    pub fn new(quiet: bool) -> WaitDisplay {
        WaitDisplay {
            quiet,
            tty: std::io::stderr().is_terminal(),
            latest: Arc::new(Mutex::new(None)),
            spinner: Arc::new(Mutex::new(None)),
            printed: Arc::new(Mutex::new(None)),
        }
    }

    /// Called by the builder when we must wait, and after every later look at the lock.
    pub fn waiting(&self, v: &Verdict) {
        if self.quiet {
            return;
        }
        *lock(&self.latest) = Some((v.clone(), Instant::now()));
        if !self.tty {
            let key = (
                v.lease.as_ref().map(|l| l.lease_id.clone()),
                v.state,
                v.behind.clone(),
            );
            let mut printed = lock(&self.printed);
            if printed.as_ref() != Some(&key) {
                // Escaped by `blocking_line`.
                say!("{}", report::blocking_line(v));
                *printed = Some(key);
            }
            return;
        }
        let mut s = lock(&self.spinner);
        match s.as_ref() {
            Some(pb) => pb.set_message(current_line(&self.latest)),
            None => {
                let pb = ProgressBar::new_spinner();
                if let Ok(style) = ProgressStyle::with_template("{spinner} ({elapsed}) {msg}") {
                    pb.set_style(style);
                }
                pb.set_message(current_line(&self.latest));
                pb.enable_steady_tick(Duration::from_millis(120));
                keep_current(pb.clone(), Arc::clone(&self.latest));
                *s = Some(pb);
            }
        }
    }

    /// The wait is over (lock taken or given up): replace the spinner by its last line.
    pub fn done(&self) {
        let pb = lock(&self.spinner).take();
        if let Some(pb) = pb {
            pb.finish_and_clear();
            say!("{}", current_line(&self.latest));
        }
    }
}

/// Keeps the spinner's line current (heartbeat age, "held") until the spinner is finished:
/// the builder reports a new verdict only when it looks at the lock again.
fn keep_current(pb: ProgressBar, latest: Latest) {
    let _ = std::thread::Builder::new()
        .name("wait-line".into())
        .spawn(move || {
            while !pb.is_finished() {
                std::thread::sleep(Duration::from_millis(250));
                pb.set_message(current_line(&latest));
            }
        });
}

/// The wait line as of now: the latest verdict, aged by the time since it arrived. Escaped by
/// `report`.
fn current_line(latest: &Latest) -> String {
    match lock(latest).as_ref() {
        Some((v, at)) => report::blocking_line_after(v, at.elapsed()),
        None => String::new(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
