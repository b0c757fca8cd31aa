//! The one child-process wrapper: [`Proc`].
//!
//! A `Proc` is SIGCONTed, SIGKILLed and reaped when dropped unless it already exited (PID 1 on
//! these machines does not reap orphans, and a failed test must leave nothing behind). Its piped
//! stdout and stderr are read on demand: [`Proc::line`] and [`Proc::wait_line`] start a reader
//! thread for the stream they need; [`Proc::take_stderr`] hands the raw pipe to a test that reads
//! it itself; [`Proc::stdout`] / [`Proc::stderr`] return everything until the stream ends.

use std::borrow::BorrowMut;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Exit status as a shell reports it: the code, or 128 + the signal.
pub fn code(st: ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// How a process ended, with everything it printed.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub code: i32,
    pub stderr: String,
    pub stdout: String,
    pub took: Duration,
}

/// Lines read from one stream by a reader thread (each with its line end), and whether it ended.
#[derive(Default)]
struct Stream {
    lines: Mutex<(Vec<String>, bool)>,
    cv: Condvar,
}

impl Stream {
    fn start(self: &Arc<Self>, pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<()> {
        let me = self.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                // Lines may end in \r (a spinner) or \n; split on \n only.
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        lock(&me.lines)
                            .0
                            .push(String::from_utf8_lossy(&buf).into_owned());
                        me.cv.notify_all();
                    }
                }
            }
            lock(&me.lines).1 = true;
            me.cv.notify_all();
        })
    }

    fn text(&self) -> String {
        lock(&self.lines).0.concat()
    }

    /// Waits until the stream ends, at most `limit`.
    fn wait_eof(&self, limit: Duration) {
        let end = Instant::now() + limit;
        let mut g = lock(&self.lines);
        while !g.1 {
            let now = Instant::now();
            if now >= end {
                return;
            }
            g = self
                .cv
                .wait_timeout(g, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Starts `stream`'s reader thread on `pipe`, once (`started`); without a pipe (not captured)
/// the stream has ended.
fn start_reading<R: Read + Send + 'static>(
    started: &Mutex<bool>,
    pipe: &Mutex<Option<R>>,
    stream: &Arc<Stream>,
) {
    let mut s = lock(started);
    if !*s {
        *s = true;
        match lock(pipe).take() {
            Some(pipe) => {
                stream.start(pipe);
            }
            None => lock(&stream.lines).1 = true,
        }
    }
}

/// A spawned child process, killed and reaped on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
    started: Instant,
    stdout_pipe: Mutex<Option<ChildStdout>>,
    stderr_pipe: Mutex<Option<ChildStderr>>,
    out: Arc<Stream>,
    err: Arc<Stream>,
    out_started: Mutex<bool>,
    err_started: Mutex<bool>,
    /// Stdout lines already returned by [`Proc::line`].
    out_seen: Mutex<usize>,
    /// Set once the child is reaped: its PID may name another process from then on.
    reaped: bool,
}

impl Proc {
    /// Spawns `cmd` with the stdio it was given.
    pub fn spawn(mut cmd: impl BorrowMut<Command>, name: &str) -> Proc {
        let mut child = cmd
            .borrow_mut()
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdout_pipe = Mutex::new(child.stdout.take());
        let stderr_pipe = Mutex::new(child.stderr.take());
        Proc {
            child,
            name: name.to_string(),
            started: Instant::now(),
            stdout_pipe,
            stderr_pipe,
            out: Arc::default(),
            err: Arc::default(),
            out_started: Mutex::new(false),
            err_started: Mutex::new(false),
            out_seen: Mutex::new(0),
            reaped: false,
        }
    }

    /// Spawns `cmd` with stdin and stdout piped (stderr as given): the worker protocol's way,
    /// where a worker reports facts as stdout lines and ends on stdin EOF.
    pub fn spawn_piped(mut cmd: impl BorrowMut<Command>, name: &str) -> Proc {
        cmd.borrow_mut()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let p = Proc::spawn(cmd, name);
        p.read_stdout();
        p
    }

    /// Spawns `cmd` in its own process group with stdout and stderr piped and read from the
    /// start (a chatty process never blocks on a full pipe): a signal sent to the test's group
    /// never reaches it by accident, and one sent to a wrong group never reaches the test.
    pub fn spawn_collecting(mut cmd: impl BorrowMut<Command>, name: &str) -> Proc {
        cmd.borrow_mut()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let p = Proc::spawn(cmd, name);
        p.read_stdout();
        p.read_stderr();
        p
    }

    fn read_stdout(&self) {
        start_reading(&self.out_started, &self.stdout_pipe, &self.out);
    }

    fn read_stderr(&self) {
        start_reading(&self.err_started, &self.stderr_pipe, &self.err);
    }

    /// The raw stderr pipe, for a test that reads it itself (None if not piped or already read).
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        if *lock(&self.err_started) {
            return None;
        }
        lock(&self.stderr_pipe).take()
    }

    /// The child's PID.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next stdout line starting with `prefix` (the rest of the line, trimmed), waiting at
    /// most `timeout`. Panics, naming the child, on timeout or end of output.
    #[track_caller]
    pub fn line(&self, prefix: &str, timeout: Duration) -> String {
        match self.try_line(prefix, timeout) {
            Ok(s) => s,
            Err(why) => panic!("{}: no `{prefix}` line: {why}", self.name),
        }
    }

    /// Like [`Proc::line`] but returns the failure instead of panicking. Lines that do not
    /// start with `prefix` are passed over.
    pub fn try_line(&self, prefix: &str, timeout: Duration) -> Result<String, String> {
        self.read_stdout();
        let end = Instant::now() + timeout;
        let mut seen = lock(&self.out_seen);
        let mut g = lock(&self.out.lines);
        loop {
            while *seen < g.0.len() {
                let l = g.0[*seen].clone();
                *seen += 1;
                if let Some(rest) = l.trim_end_matches(['\n', '\r']).strip_prefix(prefix) {
                    return Ok(rest.trim().to_string());
                }
            }
            if g.1 {
                return Err("output ended".into());
            }
            let now = Instant::now();
            if now >= end {
                return Err(format!("timed out after {timeout:?}"));
            }
            g = self
                .out
                .cv
                .wait_timeout(g, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits until stderr has a line for which `pred` holds (any line so far counts); returns
    /// it and how long after the start it was found, or None after `limit` or at end of output.
    pub fn wait_line(
        &self,
        limit: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<(String, Duration)> {
        self.read_stderr();
        let end = Instant::now() + limit;
        let mut g = lock(&self.err.lines);
        loop {
            if let Some(l) = g.0.iter().find(|l| pred(l)) {
                return Some((l.clone(), self.started.elapsed()));
            }
            if g.1 {
                return None;
            }
            let now = Instant::now();
            if now >= end {
                return None;
            }
            g = self
                .err
                .cv
                .wait_timeout(g, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Everything read from stderr so far (starts reading it if nobody did).
    pub fn stderr_so_far(&self) -> String {
        self.read_stderr();
        self.err.text()
    }

    /// Its whole stderr: waits (at most 10 s) for the stream to end, e.g. after the exit.
    pub fn stderr(&self) -> String {
        self.read_stderr();
        self.err.wait_eof(Duration::from_secs(10));
        self.err.text()
    }

    /// Its whole stdout (lines already taken by [`Proc::line`] included), as for stderr.
    pub fn stdout(&self) -> String {
        self.read_stdout();
        self.out.wait_eof(Duration::from_secs(10));
        self.out.text()
    }

    /// Closes the child's stdin (a holder worker releases and exits on that).
    pub fn close_stdin(&mut self) {
        self.child.stdin.take();
    }

    /// The exit status if it has exited (and been reaped by this call or an earlier one).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let st = self.child.try_wait().expect("try_wait");
        self.reaped |= st.is_some();
        st
    }

    /// Sends a signal, unless the child was already reaped (its PID may name another process).
    pub fn signal(&self, sig: Signal) {
        if !self.reaped {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)
                .unwrap_or_else(|e| panic!("{}: kill {sig}: {e}", self.name));
        }
    }

    /// SIGKILLs the child (and SIGCONTs it, in case it is stopped), reaps it and returns its
    /// status (its own, if it had exited before).
    pub fn kill(&mut self) -> ExitStatus {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), Signal::SIGCONT);
        }
        let st = self.child.wait().expect("wait for a killed child");
        self.reaped = true;
        st
    }

    /// The exit status if it exits within `limit`, else None (it keeps running).
    pub fn wait_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits for it to exit by itself, at most `limit`; kills it and panics, naming it and
    /// showing its stderr so far, if it does not.
    #[track_caller]
    pub fn wait_timeout(&mut self, limit: Duration) -> ExitStatus {
        match self.wait_within(limit) {
            Some(st) => st,
            None => {
                self.kill();
                let err = if *lock(&self.err_started) {
                    self.err.text()
                } else {
                    String::new()
                };
                panic!(
                    "{} did not exit within {limit:?}; stderr:\n{err}",
                    self.name
                );
            }
        }
    }

    /// Waits for the exit within `limit` (else kills it and fails) and returns how it ended. The
    /// pipes end when every holder of them is gone; a process the job left behind keeps them
    /// open, so that is waited for only briefly.
    #[track_caller]
    pub fn finish(&mut self, limit: Duration) -> Outcome {
        let st = self.wait_timeout(limit);
        let took = self.started.elapsed();
        self.read_stdout();
        self.read_stderr();
        self.out.wait_eof(Duration::from_secs(2));
        self.err.wait_eof(Duration::from_secs(2));
        Outcome {
            code: code(st),
            stderr: self.err.text(),
            stdout: self.out.text(),
            took,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
