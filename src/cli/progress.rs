//! The contention display while `leasehold run` waits for a held lock.
//!
//! Owns: printing the one cargo-style `Blocking waiting for lock ...` line when (and only when)
//! the lock is contended — kept live with a spinner on a terminal, its heartbeat age and "held"
//! advancing between looks at the lock from the latest look; a new plain line otherwise, only
//! when the holder, its state or what we queue behind changes — and clearing the spinner once
//! the wait ends. Must never: print anything when the lock is free at once, or under `-q`.

use std::io::{IsTerminal, Write as _};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::report;
use leasehold::{State, Verdict};

/// The latest verdict and when it arrived: what the spinner's line is rendered from.
type Latest = Arc<Mutex<Option<(Verdict, Instant)>>>;

/// What makes a plain (non-terminal) line worth printing again: the lease, its state, and what
/// we wait behind (`run --json`'s `waiting` event too).
pub(crate) type Key = (Option<String>, State, Option<String>);

/// `v`'s [`Key`].
pub(crate) fn key(v: &Verdict) -> Key {
    (
        v.lease.as_ref().map(|l| l.lease_id.clone()),
        v.state,
        v.behind.clone(),
    )
}

/// Shows the wait; cloned into the builder's `on_wait` callback.
#[derive(Debug, Clone)]
pub struct WaitDisplay {
    quiet: bool,
    tty: bool,
    latest: Latest,
    spinner: Arc<Mutex<Option<Spinner>>>,
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
            let key = key(v);
            let mut printed = lock(&self.printed);
            if printed.as_ref() != Some(&key) {
                // Escaped by `blocking_line`.
                say!("{}", report::blocking_line(v));
                *printed = Some(key);
            }
            return;
        }
        let mut s = lock(&self.spinner);
        if s.is_none() {
            *s = Spinner::start(Arc::clone(&self.latest));
        }
    }

    /// The wait is over (lock taken or given up): replace the spinner by its last line.
    pub fn done(&self) {
        let sp = lock(&self.spinner).take();
        if let Some(sp) = sp {
            sp.finish();
            say!("{}", current_line(&self.latest));
        }
    }
}

/// The live wait line on a terminal: a thread that redraws `⠁ (3s) Blocking …` in place every
/// 120 ms from the latest verdict, aged to now (the builder reports a new verdict only when it
/// looks at the lock again). A line longer than the terminal is wide wraps, and is redrawn from
/// its first row.
///
/// Our own rather than a progress-bar crate's: it is one line, and the crate we used linked
/// `libm` into every run (for an ETA this line never shows), ~80 µs of start-up per process.
#[derive(Debug)]
struct Spinner {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

/// The spinner's frames (the braille dots a cargo user knows from indicatif's default).
const FRAMES: [char; 8] = ['⠁', '⠂', '⠄', '⡀', '⢀', '⠠', '⠐', '⠈'];

impl Spinner {
    /// Starts redrawing; `None` (no live line, the final line still printed) when no thread can
    /// be started.
    fn start(latest: Latest) -> Option<Spinner> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = Arc::clone(&stop);
        let began = Instant::now();
        let thread = std::thread::Builder::new()
            .name("wait-line".into())
            .spawn(move || {
                let (m, cv) = &*flag;
                let mut stopped = lock(m);
                let mut frame = 0usize;
                let mut rows = 0;
                while !*stopped {
                    let text = format!(
                        "{} ({}) {}",
                        FRAMES[frame % FRAMES.len()],
                        elapsed(began.elapsed()),
                        leasehold::text::scrub(&current_line(&latest))
                    );
                    rows = redraw(rows, &text);
                    frame += 1;
                    stopped = cv
                        .wait_timeout(stopped, Duration::from_millis(120))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                redraw(rows, "");
            })
            .ok()?;
        Some(Spinner {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the redraws; the thread clears the line before it ends.
    fn finish(mut self) {
        let (m, cv) = &*self.stop;
        *lock(m) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Replaces the `rows` terminal rows drawn last by `text` (escaped by `report`, scrubbed), and
/// returns how many rows `text` takes.
fn redraw(rows: usize, text: &str) -> usize {
    let mut out = String::from("\r");
    for _ in 1..rows {
        out.push_str("\x1b[1A");
    }
    out.push_str("\x1b[J");
    out.push_str(text);
    let _ = write!(std::io::stderr(), "{out}");
    match terminal_width() {
        Some(w) => text.chars().count().max(1).div_ceil(w),
        None => 1,
    }
}

/// The time waited, in whole seconds, in the form of leasehold's other lines (`0s`, `7s`,
/// `2m05s`, `1h03m`).
fn elapsed(d: Duration) -> String {
    match d.as_secs() {
        0 => "0s".into(),
        s => leasehold::human_duration(Duration::from_secs(s)),
    }
}

/// The width of the terminal on stderr, when it says.
fn terminal_width() -> Option<usize> {
    let mut ws = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct passed, which lives on our stack.
    let r = unsafe { nix::libc::ioctl(2, nix::libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
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
